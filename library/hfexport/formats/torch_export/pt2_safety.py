"""Accepting a `.pt2` only when it is provably what `torch.export.save` writes for one program.

`check_pt2_archive` (the zip structure, every member by name and role, weights-only pickles) and
`check_pt2_program` (every string torch turns into code parsed into the grammar torch.export writes); why each:
docs/security.md, "What `formats/torch_export/pt2_safety` accepts".
"""

from __future__ import annotations

import ast
import contextlib
import io
import os
import re
import struct
import zipfile
from pathlib import Path
from typing import Any

from hfexport.errors import CorruptExportError, UnsafeExportError, first_line
from hfexport.safety.treespec import check_treespec, loads_checked

# Every member `torch.export.save` writes for one program named `model` (torch 2.13, `pt2_archive/_package.py`),
# relative to the archive's root folder: name -> required. The payloads `data/weights/weight_<n>` and
# `data/constants/tensor_<n>` are allowed only as named by the two configs.
ALLOWED_MEMBERS = {
    "archive_format": True,
    "archive_version": True,
    "byteorder": False,
    ".data/version": False,
    ".data/serialization_id": False,
    "models/model.json": True,
    "data/sample_inputs/model.pt": True,
    "data/weights/model_weights_config.json": True,
    "data/constants/model_constants_config.json": True,
}


_SMALL_MEMBERS = {"archive_format": {b"pt2"}, "archive_version": {b"0"}, "byteorder": {b"little", b"big"}}
_PAYLOAD = {"data/weights/": re.compile(r"^weight_[0-9]{1,9}$"), "data/constants/": re.compile(r"^tensor_[0-9]{1,9}$")}
_ROOT = re.compile(r"^[A-Za-z0-9_][A-Za-z0-9_.-]{0,127}$")
_MAX_JSON_MEMBER = 256 << 20  # models/model.json of a large model is tens of MB
_MAX_PICKLE_MEMBER = 256 << 20

_IDENT = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*$")
_SYMBOL = re.compile(r"^[a-z]+[0-9]+$")  # s0, u12, ...
_OPERATOR = {"getitem", "add", "sub", "mul", "floordiv", "truediv", "mod", "neg", "pos", "pow", "abs", "eq", "ne",
             "lt", "le", "gt", "ge", "and_", "or_", "not_", "xor", "invert", "lshift", "rshift"}


_MATH = {"floor", "ceil", "trunc", "sqrt", "log2", "exp", "log"}


# torch.utils._sympy.functions that the deserializer offers to sympify, plus sympy's own constructors.
_SYMPY_NAMES = {
    "Symbol", "Integer", "Rational", "Float", "Add", "Mul", "Pow", "Max", "Min", "Abs", "Eq", "Ne", "Lt", "Le", "Gt",
    "Ge", "And", "Or", "Not", "Piecewise", "ExprCondPair", "true", "false", "oo", "zoo", "nan", "floor", "ceiling",
    "sqrt", "FloorDiv", "ModularIndexing", "Where", "PythonMod", "Mod", "CleanDiv", "CeilToInt", "FloorToInt",
    "CeilDiv", "LShift", "RShift", "PowByNatural", "FloatPow", "FloatTrueDiv", "IntTrueDiv",
    "IsNonOverlappingAndDenseIndicator", "TruncToFloat", "TruncToInt", "RoundToInt", "RoundDecimal", "ToFloat",
    "Identity", "BitwiseFn_bitwise_and", "BitwiseFn_bitwise_or", "BitwiseFn_bitwise_xor",
    # sympy's relational classes, which `Eq`/`Ne`/`Lt`/... construct: torch 2.13 writes a relation between unbacked
    # sizes by class name (Idefics3's boolean image index: "Equality(Symbol('u1', integer=True), Symbol('u0', ...))").
    "Equality", "Unequality", "StrictLessThan", "LessThan", "StrictGreaterThan", "GreaterThan",
}


_SYMPY_KEYWORDS = {"positive", "integer", "real", "nonnegative", "negative", "finite", "evaluate"}
_GUARD_NAMES = {"L", "inf", "min", "max", "abs", "Max", "Min", "Eq", "Ne", "Mod", "FloorDiv", "PythonMod", "CeilDiv",
                "CleanDiv", "IntTrueDiv", "FloatTrueDiv", "ToFloat", "TruncToInt", "sym_max", "sym_min"}


_TENSOR_METHODS = {"size", "stride", "storage_offset", "dim", "numel"}
_BIN_OPS = (ast.Add, ast.Sub, ast.Mult, ast.Div, ast.FloorDiv, ast.Mod, ast.Pow, ast.LShift, ast.RShift,
            ast.BitAnd, ast.BitOr, ast.BitXor)


_NAMESPACE = re.compile(r"^[a-z][a-z0-9_]*$")
_OP = re.compile(r"^(?!__)[A-Za-z_][A-Za-z0-9_]*$")
_DUNDER_OPS = {f"__{name}__" for name in ("and", "or", "xor", "lshift", "rshift", "iand", "ior", "ixor", "ilshift",
                                           "irshift", "rand", "ror", "rxor", "rlshift", "rrshift")}


def pt2_unpickling_allowlist() -> list[type]:
    """The classes a `.pt2` of a transformers export pickles besides tensors: the cache classes its traced kwargs
    hold (`transformers.cache_utils`), for `torch.serialization.safe_globals`."""
    from transformers import cache_utils

    # LinearAttentionLayer (a state-space model's conv and SSM states, Mamba's `cache_params`) subclasses neither
    # Cache nor CacheLayerMixin.
    bases = (cache_utils.Cache, cache_utils.CacheLayerMixin, cache_utils.LinearAttentionCacheLayerMixin)
    return [cls for cls in vars(cache_utils).values()
            if isinstance(cls, type) and issubclass(cls, bases) and cls.__module__ == cache_utils.__name__]


def _walk(value: Any, path: str):
    """Every (key, value, path) of a JSON document, without recursion."""
    stack = [(value, path)]
    while stack:
        current, where = stack.pop()
        if isinstance(current, dict):
            for key, item in current.items():
                yield key, item, f"{where}.{key}"
                stack.append((item, f"{where}.{key}"))
        elif isinstance(current, list):
            stack.extend((item, f"{where}[{index}]") for index, item in enumerate(current))


def check_pt2_program(document: Any, source: str, name: str) -> None:
    """Check one serialized program (`name` is its archive member) for code-like strings outside the grammar."""
    where = f"{source}: {name}"
    for key, value, path in _walk(document, "$"):
        if key == "target" and isinstance(value, str):
            _check_target(value, f"{where}: {path}")
        elif key == "expr_str" and isinstance(value, str):
            _check_sympy(value, f"{where}: {path}")
        elif key in ("in_spec", "out_spec") and isinstance(value, str):
            check_treespec(value, f"{source}: {name}", path)
        elif key == "guards_code":
            for index, code in enumerate(value if isinstance(value, list) else [value]):
                _check_guard(code, f"{where}: {path}[{index}]")
        elif key == "range_constraints" and isinstance(value, dict):
            for symbol in value:
                _check_sympy(symbol, f"{where}: {path}.{symbol}")


def _check_target(target: str, where: str) -> None:
    """Graph call targets: torch operators (`torch.ops.<namespace>.<op>[.<overload>]`, an op named like a Python
    operator allowed: `aten.__and__`), and a few pure Python operators. The deserializer resolves a target by
    attribute lookups from `torch`, so any other path could reach a Python callable."""
    parts = target.split(".")
    ok = (
        (target.startswith("torch.ops.") and len(parts) in (4, 5) and _NAMESPACE.match(parts[2])
         and (_OP.match(parts[3]) or parts[3] in _DUNDER_OPS) and (len(parts) == 4 or _OP.match(parts[4])))
        or (len(parts) == 2 and parts[0] == "_operator" and parts[1] in _OPERATOR)
        or (len(parts) == 2 and parts[0] == "math" and parts[1] in _MATH)
        or (len(parts) == 2 and parts[0] == "torch" and re.fullmatch(r"_?sym_[a-z_]+", parts[1]) is not None)
    )
    if not ok:
        raise UnsafeExportError(f"{where}: refusing the graph call target {target!r}: only torch operators "
                                "(torch.ops.*) and arithmetic may be called by a downloaded program")


def _parse(text: Any, where: str, what: str) -> ast.Expression:
    if not isinstance(text, str) or len(text) > 10_000:
        raise UnsafeExportError(f"{where}: {what}: expected a short expression string")
    try:
        return ast.parse(text, mode="eval")
    except (SyntaxError, ValueError, RecursionError):
        raise UnsafeExportError(f"{where}: {what} {text[:80]!r} is not an expression") from None


def _check_sympy(text: Any, where: str) -> None:
    """`sympy.sympify` evaluates its input: only sympy constructors, numbers, symbols and arithmetic may appear."""
    tree = _parse(text, where, "symbolic expression")
    for node in ast.walk(tree):
        if isinstance(node, ast.Call):
            if not (isinstance(node.func, ast.Name) and node.func.id in _SYMPY_NAMES):
                return _refuse(where, "symbolic expression", text)
            for keyword in node.keywords:
                if keyword.arg not in _SYMPY_KEYWORDS or not isinstance(keyword.value, ast.Constant):
                    return _refuse(where, "symbolic expression", text)
        elif isinstance(node, ast.Name):
            if node.id not in _SYMPY_NAMES and not _SYMBOL.match(node.id):
                return _refuse(where, "symbolic expression", text)
        elif isinstance(node, ast.Constant):
            if isinstance(node.value, str) and not _SYMBOL.match(node.value):
                return _refuse(where, "symbolic expression", text)
            if not isinstance(node.value, (int, float, bool, str)):
                return _refuse(where, "symbolic expression", text)
        elif not isinstance(node, (ast.Expression, ast.BinOp, ast.UnaryOp, ast.Compare, ast.BoolOp, ast.keyword,
                                   ast.Load, ast.USub, ast.UAdd, ast.Not, ast.And, ast.Or, ast.cmpop, *_BIN_OPS)):
            return _refuse(where, "symbolic expression", text)
    return None


def _check_guard(code: Any, where: str) -> None:
    """`guards_code` is compiled with `exec`: only comparisons over `L['input'].size()[i]`-style reads and numbers."""
    tree = _parse(code, where, "guard")
    for node in ast.walk(tree):
        if isinstance(node, ast.Name):
            if node.id not in _GUARD_NAMES:
                return _refuse(where, "guard", code)
        elif isinstance(node, ast.Attribute):
            if node.attr not in _TENSOR_METHODS:
                return _refuse(where, "guard", code)
        elif isinstance(node, ast.Call):
            func = node.func
            named = isinstance(func, ast.Name) and func.id in _GUARD_NAMES - {"L"}
            method = isinstance(func, ast.Attribute) and func.attr in _TENSOR_METHODS
            if not (named or method) or node.keywords:
                return _refuse(where, "guard", code)
        elif isinstance(node, ast.Constant):
            # Strings are input names inside L[...]; torch pastes the guard into a string literal of generated code.
            if isinstance(node.value, str) and not _IDENT.match(node.value):
                return _refuse(where, "guard", code)
            if not isinstance(node.value, (int, float, bool, str)):
                return _refuse(where, "guard", code)
        elif not isinstance(node, (ast.Expression, ast.Compare, ast.BoolOp, ast.BinOp, ast.UnaryOp, ast.Subscript,
                                   ast.Load, ast.USub, ast.UAdd, ast.Not, ast.And, ast.Or, ast.cmpop, *_BIN_OPS)):
            return _refuse(where, "guard", code)
    return None


def _refuse(where: str, what: str, text: str) -> None:
    raise UnsafeExportError(f"{where}: refusing the {what} {text[:120]!r}: it is compiled or evaluated as Python when "
                            "the program loads or runs, and this one is not the kind torch.export writes")


# ── the archive ──────────────────────────────────────────────────────────────


def check_pt2_archive(path: str | Path, source: str | None = None) -> None:
    """Refuse a `.pt2` that is not exactly what `torch.export.save` writes for one program (see the module's
    docstring): `UnsafeExportError` for what torch would turn into code or read twice, `CorruptExportError` for a
    broken archive. Each message names the archive and the member."""
    import torch


    source = source or str(path)
    infos = _check_zip_structure(Path(path), source)
    root = infos[0].filename.split("/", 1)[0]
    members = {}
    for info in infos:
        head, _, relative = info.filename.partition("/")
        if not relative:
            raise UnsafeExportError(f"{source}: {info.filename}: a member outside any root folder "
                                    f"({_role_hint(info.filename)}): refused (torch.export.save writes every member "
                                    "under one root folder)")
        if head != root or not _ROOT.match(root):
            raise UnsafeExportError(f"{source}: {info.filename}: outside the archive's single root folder "
                                    f"{root!r}: refused (torch.export.save writes one)")
        members[relative] = info

    with zipfile.ZipFile(path) as archive:
        def read(relative: str, bound: int) -> bytes:
            info = members[relative]
            if info.file_size > bound:
                raise CorruptExportError(f"{source}: {info.filename}: {info.file_size} bytes, more than {bound}")
            return archive.read(info)

        def weights_only(relative: str) -> Any:
            try:
                with torch.serialization.safe_globals(pt2_unpickling_allowlist()):
                    return torch.load(io.BytesIO(read(relative, _MAX_PICKLE_MEMBER)), weights_only=True)
            except (UnsafeExportError, CorruptExportError):
                raise
            except Exception as error:  # noqa: BLE001 - whatever a weights-only load refuses, the loader would run
                raise UnsafeExportError(f"{source}: {root}/{relative}: refused, it holds more than tensors and "
                                        f"transformers caches ({first_line(error, 200)})") from None

        payloads: dict[str, set[str]] = {folder: set() for folder in _PAYLOAD}
        pickled: list[str] = []
        for folder, kind in (("data/weights/", "weights"), ("data/constants/", "constants")):
            config_name = f"{folder}model_{kind}_config.json"
            if config_name not in members:
                continue  # reported below, with the other missing members
            where = f"{root}/{config_name}"
            config = loads_checked(read(config_name, _MAX_JSON_MEMBER), source, where)
            entries = config.get("config") if isinstance(config, dict) and set(config) == {"config"} else None
            if not isinstance(entries, dict):
                raise CorruptExportError(f"{source}: {where}: $.config: expected an object of payloads")
            for fqn, payload in entries.items():
                at = f"{source}: {where}: $.config.{fqn}"
                if not isinstance(payload, dict) or not isinstance(payload.get("path_name"), str):
                    raise CorruptExportError(f"{at}: expected an object with a path_name")
                name = payload["path_name"]
                if not _PAYLOAD[folder].match(name):
                    raise UnsafeExportError(f"{at}.path_name: {name[:80]!r} is not a tensor payload "
                                            f"({_PAYLOAD[folder].pattern}): pickled objects are refused")
                if not isinstance(payload.get("use_pickle", False), bool):
                    raise CorruptExportError(f"{at}.use_pickle: expected a boolean")
                if payload.get("use_pickle"):
                    pickled.append(folder + name)
                elif not isinstance(payload.get("tensor_meta"), dict):
                    raise CorruptExportError(f"{at}.tensor_meta: expected an object")
                payloads[folder].add(name)

        expected = {name for name, required in ALLOWED_MEMBERS.items()}
        expected |= {folder + name for folder, names in payloads.items() for name in names}
        for relative, info in members.items():
            if relative not in expected:
                raise UnsafeExportError(f"{source}: {info.filename}: not a member torch.export.save writes for one "
                                        f"program ({_role_hint(relative)}): refused")
        missing = [name for name, required in ALLOWED_MEMBERS.items() if required and name not in members]
        missing += sorted(name for name in expected - set(ALLOWED_MEMBERS) if name not in members)
        if missing:
            raise CorruptExportError(f"{source}: {root}/{missing[0]}: missing from the archive")
        for relative, allowed in _SMALL_MEMBERS.items():
            if relative in members and read(relative, 16).strip() not in allowed:
                raise CorruptExportError(f"{source}: {root}/{relative}: not a torch.export archive "
                                         f"(expected {sorted(allowed)[0].decode()!r})")

        if members["data/sample_inputs/model.pt"].file_size:  # empty: saved without example inputs (torch 2.13)
            weights_only("data/sample_inputs/model.pt")
        for relative in pickled:
            if not isinstance(weights_only(relative), torch.Tensor):
                raise UnsafeExportError(f"{source}: {root}/{relative}: a pickled payload that is not a tensor: refused")
        program_name = f"{root}/models/model.json"
        program = loads_checked(read("models/model.json", _MAX_JSON_MEMBER), source, program_name)
        if not isinstance(program, dict):
            raise CorruptExportError(f"{source}: {program_name}: $: expected a serialized program object")
        check_pt2_program(program, source, program_name)


def _role_hint(relative: str) -> str:
    if relative.startswith("data/aotinductor/"):
        return "an AOTInductor package loads native code"
    if relative.startswith("models/"):
        return "a second program"
    if relative in ("data/weights/model.pt", "data/constants/model.pt") or relative.endswith(".pt"):
        return "a legacy pickled file, which torch unpickles with weights_only=False"
    if relative.startswith(("serialized_", "version")):
        return "the pre-2.7 format, which torch unpickles"
    if relative.startswith(("data/weights/", "data/constants/")):
        return "a payload its config does not name"
    return "unknown member"


def _check_zip_structure(path: Path, source: str) -> list[zipfile.ZipInfo]:
    """The archive's entries, in file order, once proven to be laid out as torch's writer lays them out: stored
    entries whose local headers match the central directory (name, method, flags), tiling the file from byte 0 to
    the central directory, unique names, no comment. Two readers of such a file cannot see different members."""
    try:
        archive = zipfile.ZipFile(path)
    except (OSError, zipfile.BadZipFile, ValueError, EOFError) as error:
        raise CorruptExportError(f"{source}: not a .pt2 archive ({str(error)[:200]})") from None
    with archive:
        infos = sorted(archive.infolist(), key=lambda info: info.header_offset)
        start_dir, comment = archive.start_dir, archive.comment
    if not infos:
        raise CorruptExportError(f"{source}: an empty archive")
    if comment:
        raise UnsafeExportError(f"{source}: the zip comment is not empty: torch.export.save writes none")
    seen: set[str] = set()
    for info in infos:
        if info.filename in seen:
            raise UnsafeExportError(f"{source}: {info.filename}: a duplicate zip entry (zip readers disagree on "
                                    "which one they read): refused")
        seen.add(info.filename)
    position = 0
    with open(path, "rb") as file:
        for index, info in enumerate(infos):
            where = f"{source}: {info.filename}"
            if info.header_offset != position:
                raise UnsafeExportError(f"{where}: starts at byte {info.header_offset}, expected {position}: bytes "
                                        "outside any entry (a hidden entry?) are refused")
            file.seek(position)
            header = file.read(30)
            if len(header) < 30:
                raise CorruptExportError(f"{where}: truncated local header")
            signature, _, flags, method, _, _, _, _, _, name_length, extra_length = struct.unpack("<4s5H3L2H", header)
            name = file.read(name_length)
            if signature != b"PK\x03\x04" or name != info.orig_filename.encode("utf-8"):
                raise UnsafeExportError(f"{where}: the local header names {name[:80]!r}, the central directory "
                                        f"{info.filename!r}: refused (zip readers would disagree)")
            if method != zipfile.ZIP_STORED or info.compress_type != zipfile.ZIP_STORED or \
                    info.compress_size != info.file_size or flags != info.flag_bits:
                raise UnsafeExportError(f"{where}: compressed, or local and central headers disagree: torch's writer "
                                        "stores every entry as it is")
            position += 30 + name_length + extra_length + info.compress_size
            if flags & 0x08:  # a data descriptor follows: signature, crc, then 32-bit or (zip64) 64-bit sizes
                file.seek(position)
                descriptor = file.read(24)
                following = infos[index + 1].header_offset if index + 1 < len(infos) else start_dir
                sizes = [size for size, layout in ((16, "<LL"), (24, "<QQ")) if len(descriptor) >= size
                         and position + size == following
                         and struct.unpack(layout, descriptor[8:size]) == (info.compress_size, info.file_size)]
                if descriptor[:4] != b"PK\x07\x08" or not sizes or \
                        struct.unpack("<L", descriptor[4:8])[0] != info.CRC:
                    raise UnsafeExportError(f"{where}: its data descriptor is missing or disagrees with the central "
                                            "directory: refused")
                position += sizes[0]
            if index + 1 < len(infos) and position > infos[index + 1].header_offset:
                raise UnsafeExportError(f"{where}: overlaps the next entry: refused")
    if position != start_dir:
        raise UnsafeExportError(f"{source}: {start_dir - position} bytes between the last entry and the central "
                                "directory: refused")
    return infos


@contextlib.contextmanager
def weights_only_unpickling():
    """Within it, every `torch.load` is weights-only whatever its caller asks (`TORCH_FORCE_WEIGHTS_ONLY_LOAD`, read by
    torch 2.13 on each call), with transformers' cache classes allowed: a payload that slipped past
    `check_pt2_archive` still cannot run. (The variable is process-wide while a `.pt2` loads.)"""
    import torch


    saved = {name: os.environ.get(name) for name in ("TORCH_FORCE_WEIGHTS_ONLY_LOAD",
                                                     "TORCH_FORCE_NO_WEIGHTS_ONLY_LOAD")}
    os.environ["TORCH_FORCE_WEIGHTS_ONLY_LOAD"] = "1"
    os.environ.pop("TORCH_FORCE_NO_WEIGHTS_ONLY_LOAD", None)
    try:
        with torch.serialization.safe_globals(pt2_unpickling_allowlist()):
            yield
    finally:
        for name, value in saved.items():
            if value is None:
                os.environ.pop(name, None)
            else:
                os.environ[name] = value
