"""Refusing unsafe `export.json` manifests before the engine parses them.

The engine's manifest stores pytree specs (`in_spec`/`out_spec`, written by `treespec_dumps`) whose node types it
imports and registers, and cache contexts (`{"_t": "seq"|"map"|"obj"|"type", "p": "module:Class", ...}`) whose
classes it imports and *calls* when it rebuilds outputs (transformers 5.23, `exporters.exporter_dynamo`): a
crafted `{"_t": "seq", "p": "os:system", "v": ["..."]}` runs a shell command on the first call of a loaded export.
Every class a manifest names must therefore be a builtin container or one of transformers' output/cache classes;
the check resolves names without importing anything outside `transformers.` and raises `UnsafeExportError`
(naming the class and its JSON path) before the engine sees the file.
"""

from __future__ import annotations

import importlib
import inspect
import json
import re
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from .errors import UnsafeExportError

MANIFEST_FILE = "export.json"
MAX_MANIFEST_BYTES = 16 << 20

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
_IDENTIFIER = re.compile(r"^[A-Za-z_]\w*$")
_SPEC_FIELDS = ("in_spec", "out_spec")


def check_manifest(manifest: Any, source: str = MANIFEST_FILE) -> None:
    """Raise `UnsafeExportError` if the manifest names anything but allowlisted classes or escapes its folder."""
    if not isinstance(manifest, dict) or not isinstance(manifest.get("components"), dict):
        raise UnsafeExportError(f"{source}: not an export manifest (expected an object with `components`)")
    if not isinstance(manifest.get("export_format"), str):
        raise UnsafeExportError(f"{source}: export_format: expected a string")
    for name, entry in manifest["components"].items():
        where = f"components.{name}"
        if not isinstance(entry, dict):
            raise UnsafeExportError(f"{source}: {where}: expected an object")
        _check_file_name(entry.get("file"), source, f"{where}.file")
        metadata = entry.get("metadata") or {}
        if not isinstance(metadata, dict):
            raise UnsafeExportError(f"{source}: {where}.metadata: expected an object")
        for field in _SPEC_FIELDS:
            spec = metadata.get(field)
            if spec is None:
                continue
            if not isinstance(spec, str):
                raise UnsafeExportError(f"{source}: {where}.metadata.{field}: expected a treespec string")
            check_treespec(spec, source, f"{where}.metadata.{field}")


def check_manifest_file(path: str | Path, source: str | None = None) -> dict:
    """Read an `export.json` (bounded size, strict JSON), check it, and return it."""
    path = Path(path)
    source = source or str(path)
    try:
        size = path.stat().st_size
        if size > MAX_MANIFEST_BYTES:
            raise UnsafeExportError(f"{source}: {size} bytes; a manifest is at most {MAX_MANIFEST_BYTES}")
        manifest = _loads(path.read_bytes(), source, "$")
    except OSError as error:
        raise UnsafeExportError(f"cannot read {source}: {error.strerror or error}") from None
    check_manifest(manifest, source)
    return manifest


def check_export_folder(folder: str | Path) -> dict:
    """Check `folder/export.json` of a local export."""
    return check_manifest_file(Path(folder) / MANIFEST_FILE)


def pt2_unpickling_allowlist() -> list[type]:
    """The classes a `.pt2` of a transformers export pickles besides tensors: the cache classes its traced kwargs
    hold (`transformers.cache_utils`), for `torch.serialization.safe_globals`."""
    from transformers import cache_utils

    bases = (cache_utils.Cache, cache_utils.CacheLayerMixin)
    return [cls for cls in vars(cache_utils).values()
            if isinstance(cls, type) and issubclass(cls, bases) and cls.__module__ == cache_utils.__name__]


def check_pt2_archive(path: str | Path, source: str | None = None) -> None:
    """Refuse a `.pt2` whose loading would unpickle anything but tensors and transformers' cache classes.

    torch 2.13's `torch.export.load` unpickles with `weights_only=False`: the sample inputs when a weights-only load
    of them fails (a transformers export's do: they hold a `DynamicCache`), weights and constants flagged
    `use_pickle`, custom and opaque objects, a legacy constants file or archive; and it loads an AOTInductor
    package's native code. Each pickle in the archive must load with
    `weights_only=True` under `pt2_unpickling_allowlist()` (which the loader then uses too, so torch's first attempt
    succeeds), tensor payloads must be raw or such pickles, and objects are refused.
    """
    import io
    import zipfile

    import torch

    source = source or str(path)
    try:
        archive = zipfile.ZipFile(path)
    except (OSError, zipfile.BadZipFile) as error:
        raise UnsafeExportError(f"{source}: not a .pt2 archive ({error})") from None

    def weights_only(member: str) -> Any:
        try:
            with torch.serialization.safe_globals(pt2_unpickling_allowlist()):
                return torch.load(io.BytesIO(archive.read(member)), weights_only=True)
        except Exception as error:  # noqa: BLE001 - whatever a weights-only load refuses, the loader would run
            raise UnsafeExportError(f"{source}: {member}: refused, it holds more than tensors and transformers "
                                    f"caches ({str(error).splitlines()[0][:200]})") from None

    with archive:
        names = archive.namelist()
        if not any(name.split("/")[-1] == "archive_format" for name in names):
            raise UnsafeExportError(f"{source}: not a current .pt2 archive (torch's legacy loader unpickles): refused")
        for member in names:
            parts = member.split("/")
            if "aotinductor" in parts:
                raise UnsafeExportError(f"{source}: {member}: an AOTInductor package loads native code: refused")
            if "sample_inputs" in parts and member.endswith(".pt"):
                weights_only(member)
            elif len(parts) >= 2 and parts[-2] == "constants" and member.endswith(".pt"):
                raise UnsafeExportError(f"{source}: {member}: a legacy pickled constants file is refused")
            elif member.endswith(".json") and len(parts) >= 2 and parts[-2] == "models":
                from .pt2_safety import check_pt2_program

                check_pt2_program(_loads(archive.read(member), source, member), source, member)
            elif member.endswith("_config.json") and len(parts) >= 2 and parts[-2] in ("weights", "constants"):
                config = _loads(archive.read(member), source, member).get("config", {})
                for fqn, payload in (config.items() if isinstance(config, dict) else []):
                    name = str(payload.get("path_name", "")) if isinstance(payload, dict) else ""
                    where = "/".join([*parts[:-1], name])
                    if parts[-2] == "constants" and not name.startswith("tensor_"):
                        raise UnsafeExportError(f"{source}: {member}: {fqn} is a pickled object ({name}): refused")
                    if payload.get("use_pickle") and not isinstance(weights_only(where), torch.Tensor):
                        raise UnsafeExportError(f"{source}: {where}: {fqn} is not a tensor: refused")


# ── internals ────────────────────────────────────────────────────────────────


def _loads(text: str | bytes, source: str, where: str) -> Any:
    try:
        return json.loads(text, parse_constant=_no_constant)
    except (ValueError, RecursionError) as error:
        message = "nested too deeply" if isinstance(error, RecursionError) else str(error).splitlines()[0]
        raise UnsafeExportError(f"{source}: {where}: not valid JSON ({message})") from None


def _no_constant(name: str):
    raise ValueError(f"{name} is not valid JSON")


def _check_file_name(value: Any, source: str, where: str) -> None:
    """A component file is a plain name inside the export's folder: no absolute path, no `..`, no backslash."""
    if not isinstance(value, str) or not value or value.startswith("/") or "\\" in value or \
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
    spec = _loads(dumped, source, where)
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
            _check_context(_loads(context, source, f"{path}.context"), source, f"{path}.context")
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
    if not (isinstance(name, str) and _IDENTIFIER.match(name) and isinstance(getattr(torch, name, None), kind)):
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
    if parts[0] != "transformers" or len(parts) < 2 or not all(_IDENTIFIER.match(part) for part in parts):
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
