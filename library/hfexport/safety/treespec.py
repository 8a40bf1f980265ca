"""Pytree specs and class names from untrusted files: strict JSON, bounded depth, and only the allowlisted torch
node types and container classes (never an import of a name a file asks for).
"""

from __future__ import annotations

import importlib
import inspect
import re
from collections.abc import Iterator
from typing import Any

from hfexport import strict_json
from hfexport.errors import CorruptExportError, UnsafeExportError, first_line

MAX_JSON_DEPTH = 64


# Pytree node types torch registers itself (`treespec_dumps` names): looked up, never imported.
TORCH_NODE_TYPES = frozenset({
    "builtins.tuple", "builtins.list", "builtins.dict", "collections.OrderedDict", "collections.defaultdict",
    "collections.deque", "collections.namedtuple", "torch.Size", "torch.fx.immutable_collections.immutable_list",
    "torch.fx.immutable_collections.immutable_dict",
})


# Builtin containers an engine context may name (`module:Class`, or the engine's dotted form of it).
CONTAINER_CLASSES = frozenset({
    "builtins.tuple", "builtins.list", "builtins.dict", "builtins.set", "builtins.frozenset",
    "collections.OrderedDict", "collections.defaultdict", "collections.deque",
})


# The engine context tags and the keys each may carry.
CONTEXT_TAGS = {
    "tensor": {"i"}, "sym": {"i"}, "layout": {"n"}, "dtype": {"n"}, "device": {"s"}, "size": {"v"},
    "items": {"v"}, "type": {"p"}, "map": {"p", "v"}, "seq": {"p", "v"}, "obj": {"p", "s"},
}


PYTHON_IDENTIFIER = re.compile(r"^[A-Za-z_]\w*$")
TREESPEC_FIELDS = ("in_spec", "out_spec")


# ── internals ────────────────────────────────────────────────────────────────


def loads_checked(text: str | bytes, source: str, where: str) -> Any:
    """Strict JSON: no duplicate keys (the last would win, and be the one checked), no NaN or infinities (`1e400`
    too), bounded nesting."""
    try:
        value = strict_json.loads(text, finite=True)
    except strict_json.DuplicateKeyError as error:
        raise CorruptExportError(f"{source}: {where}: duplicate key {error.key!r}: refused") from None
    except (ValueError, RecursionError, UnicodeDecodeError) as error:
        message = "nested too deeply" if isinstance(error, RecursionError) else first_line(error)
        raise CorruptExportError(f"{source}: {where}: not valid JSON ({message[:200]})") from None
    if _depth(value) > MAX_JSON_DEPTH:
        raise CorruptExportError(f"{source}: {where}: nested deeper than {MAX_JSON_DEPTH} levels: refused")
    return value


def _depth(value: Any) -> int:
    deepest, stack = 0, [(value, 1)]
    while stack:
        current, depth = stack.pop()
        deepest = max(deepest, depth)
        if depth > MAX_JSON_DEPTH:
            break
        children = current.values() if isinstance(current, dict) else current if isinstance(current, list) else ()
        stack.extend((child, depth + 1) for child in children)
    return deepest


def check_file_name(value: Any, source: str, where: str = "file") -> None:
    """Refuse a file name (the field `where` of `source`) that is not a plain relative name inside the export's folder
    (`UnsafeExportError`): no absolute path, no `..`, no backslash, and no NUL or other control character (Python's
    path functions raise a bare `ValueError` on a NUL)."""
    if not isinstance(value, str) or not value or value.startswith("/") or "\\" in value or \
            any(ord(char) < 32 or ord(char) == 127 for char in value) or \
            any(part in ("", ".", "..") for part in value.split("/")):
        raise UnsafeExportError(f"{source}: {where}: {value!r} is not a file name inside the export's folder")


def _nodes(spec: Any, where: str) -> Iterator[tuple[dict, str]]:
    """Every node of a dumped treespec (`[protocol, node]`) with its JSON path, without recursion."""
    stack = [(spec[1], f"{where}[1]")] if isinstance(spec, list) and len(spec) == 2 else [(spec, where)]
    while stack:
        node, path = stack.pop()
        yield node, path
        children = node.get("children_spec") if isinstance(node, dict) else None
        for index, child in enumerate(children or []):
            stack.append((child, f"{path}.children_spec[{index}]"))


def check_treespec(dumped: str, source: str, where: str) -> None:
    """Check one dumped treespec: node types and engine contexts (`where` is its JSON path, for messages)."""
    spec = loads_checked(dumped, source, where)
    if not (isinstance(spec, list) and len(spec) == 2 and isinstance(spec[1], dict)):
        raise UnsafeExportError(f"{source}: {where}: not a dumped treespec ([protocol, node])")
    for node, path in _nodes(spec, where):
        if not isinstance(node, dict):
            raise UnsafeExportError(f"{source}: {path}: expected a treespec node object")
        node_type = node.get("type")
        if node_type is not None:
            if not isinstance(node_type, str):
                raise UnsafeExportError(f"{source}: {path}.type: expected a string")
            if node_type not in TORCH_NODE_TYPES:
                _check_class(node_type, source, f"{path}.type")
        context = node.get("context")
        if isinstance(context, str) and context not in ("null", ""):
            _check_context(loads_checked(context, source, f"{path}.context"), source, f"{path}.context")
        elif context is not None and not isinstance(context, str):
            raise UnsafeExportError(f"{source}: {path}.context: expected a JSON string")


def _check_context(context: Any, source: str, where: str) -> None:
    """Walk an engine context: every `{"_t": ...}` entry must be a known tag naming only allowlisted classes."""
    stack = [(context, where)]
    while stack:
        value, path = stack.pop()
        if isinstance(value, list):
            stack.extend((item, f"{path}[{index}]") for index, item in enumerate(value))
            continue
        if not isinstance(value, dict):
            continue
        if "_t" not in value:
            stack.extend((item, f"{path}.{key}") for key, item in value.items())
            continue
        tag = value["_t"]
        if tag not in CONTEXT_TAGS:
            raise UnsafeExportError(f"{source}: {path}._t: unknown context tag {tag!r}")
        if "p" in value or tag in ("type", "map", "seq", "obj"):
            name = value.get("p")
            if not isinstance(name, str):
                raise UnsafeExportError(f"{source}: {path}.p: expected a class path string")
            if name.replace(":", ".") not in CONTAINER_CLASSES:
                _check_class(name, source, f"{path}.p")
        if tag in ("dtype", "layout"):
            _check_torch_name(value.get("n"), tag, source, f"{path}.n")
        for key in ("v", "s"):
            if key in value:
                stack.append((value[key], f"{path}.{key}"))


def _check_torch_name(name: Any, tag: str, source: str, where: str) -> None:
    import torch

    kind = torch.dtype if tag == "dtype" else torch.layout
    if not (isinstance(name, str) and PYTHON_IDENTIFIER.match(name) and isinstance(getattr(torch, name, None), kind)):
        raise UnsafeExportError(f"{source}: {where}: {name!r} is not a torch {tag}")


def _check_class(name: str, source: str, where: str) -> None:
    """`name` (`transformers.x.y:Class` or `transformers.x.y.Class`) must be a transformers output or cache class."""
    cls = _resolve_transformers_class(name)
    if cls is None or not _allowed(cls):
        raise UnsafeExportError(
            f"{source}: {where}: refusing to load an export that names {name!r}: only transformers' output and "
            "cache classes and builtin containers may appear in an export manifest (it may be crafted to run code)"
        )


def _resolve_transformers_class(name: str) -> type | None:
    """What the engine would resolve `name` to, importing only modules under `transformers.`; None otherwise."""
    parts = name.replace(":", ".").split(".")
    if parts[0] != "transformers" or len(parts) < 2 or not all(PYTHON_IDENTIFIER.match(part) for part in parts):
        return None
    if any(part.startswith("__") for part in parts):
        return None
    try:
        obj: Any = importlib.import_module("transformers")
        for part in parts[1:]:
            if inspect.ismodule(obj):
                child = f"{obj.__name__}.{part}"
                if not child.startswith("transformers."):
                    return None
                try:
                    obj = importlib.import_module(child)
                    continue
                except ModuleNotFoundError as error:
                    if error.name != child:
                        return None
            obj = inspect.getattr_static(obj, part) if not inspect.ismodule(obj) else getattr(obj, part)
    except Exception:  # noqa: BLE001 - anything that does not resolve cleanly is refused
        return None
    return obj if isinstance(obj, type) else None


def _allowed(cls: type) -> bool:
    from transformers.utils import ModelOutput

    module = getattr(cls, "__module__", "") or ""
    if not module.startswith("transformers."):
        return False
    from transformers import cache_utils

    bases = (ModelOutput, cache_utils.Cache, cache_utils.CacheLayerMixin, cache_utils.LinearAttentionCacheLayerMixin)
    if issubclass(cls, bases) or module == cache_utils.__name__:
        return True
    # Model-specific caches that do not subclass `Cache` (the engine's own naming rule, e.g. MimiConv1dPaddingCache).
    return module.startswith("transformers.models.") and cls.__name__.endswith("Cache")
