"""Refusing unsafe or corrupt exports before any backend reads them.

An export is a folder (`export.json` and the files it names) that may come from a stranger. Three things are
checked here, each before the engine or a backend sees the file:
- every file hfexport or a backend opens resolves inside the export folder (for a Hub download: inside that
  revision's snapshot folder and the repo's blob store the cache links to), is a regular file (no device, FIFO or
  directory) and is no larger than its kind allows (`checked_file`);
- `export.json` is strict JSON (no duplicate keys, NaN or infinities, bounded size), valid against
  `schemas/export_manifest.schema.json`, and names only allowlisted classes: the engine's manifest stores pytree
  specs (`in_spec`/`out_spec`, written by `treespec_dumps`) whose node types it imports and registers, and cache
  contexts (`{"_t": "seq"|"map"|"obj"|"type", "p": "module:Class", ...}`) whose classes it imports and *calls*
  when it rebuilds outputs (transformers 5.23, `exporters.exporter_dynamo`): a crafted
  `{"_t": "seq", "p": "os:system", "v": ["..."]}` runs a shell command on the first call of a loaded export;
- each program file is what its exporter writes (`check_onnx_file`, `check_openvino_files`, `check_pte_file` and
  `check_ptd_file` for an ExecuTorch program's weights beside it, and `pt2_safety.check_pt2_archive` for `.pt2`),
  each called by its format's program (`hfexport.formats.programs.check_program_files`).

What would run code or read outside the folder raises `UnsafeExportError`; what is merely broken raises
`CorruptExportError`. Both name the file and the field. See docs/security.md.
"""

from __future__ import annotations

import json
import math
import mmap
import os
import re
import stat
from collections.abc import Iterator
from functools import lru_cache
from pathlib import Path
from typing import Any

from hfexport.errors import CorruptExportError, UnsafeExportError, first_line
from hfexport.files import MANIFEST_FILE
from hfexport.formats.onnx.proto import EXTERNAL, ITEMSIZE, PACKED, model_proto
from hfexport.formats.executorch.ptd import read_flat_tensor
from hfexport.safety.treespec import (
    PYTHON_IDENTIFIER,
    TREESPEC_FIELDS,
    check_file_name,
    check_treespec,
    loads_checked,
)
from hfexport.schema import schema_validator

MAX_MANIFEST_BYTES = 16 << 20
MAX_JSON_BYTES = 64 << 20  # configs, tokenizer files, the recipe copy
MAX_ONNX_BYTES = 2 << 30  # protobuf's own limit for one message: larger models keep weights in `.data`
MAX_XML_BYTES = 1 << 30
MAX_ARTIFACT_BYTES = 1 << 40  # weights (`.data`, `.bin`, `.pt2`, `.pte`, `.ptd`): 1 TiB, then bounded by the file's own index


# ── files: inside the folder, regular, bounded ───────────────────────────────


def size_bound(name: str) -> int:
    """The largest file of this kind hfexport opens: JSON documents are small, weights are bounded later by the index
    their program keeps (ONNX external data, OpenVINO `Const` layers, the `.pt2` zip directory)."""
    if name.endswith(".json"):
        return MAX_MANIFEST_BYTES if name.rsplit("/", 1)[-1] == MANIFEST_FILE else MAX_JSON_BYTES
    if name.endswith(".onnx"):
        return MAX_ONNX_BYTES
    if name.endswith(".xml"):
        return MAX_XML_BYTES
    return MAX_ARTIFACT_BYTES


def checked_file(folder: Path, name: str, *, source: str, roots: tuple[Path, ...] = (), required: bool = True,
                 max_bytes: int | None = None) -> Path | None:
    """`folder/name` once it is proven to be a regular file inside `folder` (or inside one of `roots`, e.g. the Hub
    cache's blob store), no larger than `max_bytes` (default: `size_bound(name)`); None for a missing optional file.

    Links are followed only to check where they lead: one that leaves the folder (the file, or any folder on the
    way) raises `UnsafeExportError`, as do device files, FIFOs, sockets and directories."""
    label = f"{source}/{name}"
    check_file_name(name, source)
    path = Path(folder) / name
    try:
        real = path.resolve(strict=True)
    except FileNotFoundError:
        if os.path.lexists(path):  # a dangling link: where it points is outside anything we checked
            raise UnsafeExportError(f"{label}: a link to a missing file: refused") from None
        if required:
            raise CorruptExportError(f"{label}: missing (named by {MANIFEST_FILE})") from None
        return None
    except (OSError, RuntimeError) as error:  # a link loop, a permission error
        raise CorruptExportError(f"{label}: cannot be resolved ({getattr(error, 'strerror', None) or error})") from None
    allowed = [Path(folder).resolve(), *(Path(root).resolve() for root in roots)]
    if not any(real == root or real.is_relative_to(root) for root in allowed):
        raise UnsafeExportError(f"{label}: resolves to {real}, outside the export folder: refused (a link leaving "
                                "the folder could make a loader read any file)")
    mode = os.stat(real).st_mode
    if not stat.S_ISREG(mode):
        kind = "a directory" if stat.S_ISDIR(mode) else "a FIFO" if stat.S_ISFIFO(mode) else \
            "a device" if stat.S_ISCHR(mode) or stat.S_ISBLK(mode) else "a socket" if stat.S_ISSOCK(mode) else \
            "not a regular file"
        raise UnsafeExportError(f"{label}: {kind}, not a regular file: refused")
    bound = size_bound(name) if max_bytes is None else max_bytes
    size = os.stat(real).st_size
    if size > bound:
        raise CorruptExportError(f"{label}: {size} bytes, more than the {bound} a {Path(name).suffix or 'such'} file "
                                 "of an export may have: refused")
    return path


def read_checked(path: Path, label: str, max_bytes: int) -> bytes:
    """The bytes of a file `checked_file` returned, read without following a link swapped in meanwhile at the last
    step (`O_NOFOLLOW` on the resolved path) and never more than `max_bytes`."""
    try:
        fd = os.open(Path(path).resolve(strict=True), os.O_RDONLY | getattr(os, "O_NOFOLLOW", 0)
                     | getattr(os, "O_NONBLOCK", 0))
    except OSError as error:
        raise CorruptExportError(f"{label}: cannot be read ({error.strerror or error})") from None
    with os.fdopen(fd, "rb") as file:
        info = os.fstat(file.fileno())
        if not stat.S_ISREG(info.st_mode):
            raise UnsafeExportError(f"{label}: not a regular file: refused")
        data = file.read(max_bytes + 1)
    if len(data) > max_bytes:
        raise CorruptExportError(f"{label}: more than {max_bytes} bytes: refused")
    return data


def read_json(path: Path, label: str, max_bytes: int = MAX_JSON_BYTES) -> Any:
    """A small JSON file of an export (a config, the recipe copy), strictly parsed: for loaders that take a dict."""
    return loads_checked(read_checked(path, label, max_bytes), label, "$")


# ── export.json ──────────────────────────────────────────────────────────────


def _manifest_validator():
    return schema_validator("export_manifest")  # the formats registered, a test's stub included


def check_manifest(manifest: Any, source: str = MANIFEST_FILE) -> None:
    """Refuse a manifest that is not valid against `export_manifest.schema.json` (`CorruptExportError`), or that names
    anything but allowlisted classes or files outside its folder (`UnsafeExportError`)."""
    errors = sorted(_manifest_validator().iter_errors(manifest), key=lambda e: (len(e.absolute_path), e.json_path))
    if errors:
        raise CorruptExportError(f"{source}: {_schema_message(errors[0])}")
    for name, entry in manifest["components"].items():
        where = f"components.{name}"
        check_file_name(entry["file"], source, f"{where}.file")
        metadata = entry["metadata"]
        for field in TREESPEC_FIELDS:
            if metadata.get(field) is not None:
                check_treespec(metadata[field], source, f"{where}.metadata.{field}")


def _schema_message(error) -> str:
    """One line for a schema error: its JSON path and what was expected (inside a `oneOf`, the branch that got
    furthest)."""
    if error.validator in ("oneOf", "anyOf") and error.context:
        deepest = max(error.context, key=lambda sub: len(sub.absolute_path))
        if len(deepest.absolute_path) > len(error.absolute_path):
            return _schema_message(deepest)
    path = "$" + "".join(f"[{part}]" if isinstance(part, int) else f".{part}" for part in error.absolute_path)
    value = json.dumps(error.instance, default=str)
    value = value if len(value) <= 60 else value[:57] + "..."
    if error.validator == "enum":
        expected = ", ".join(json.dumps(option) for option in error.validator_value[:8])
        more = ", ..." if len(error.validator_value) > 8 else ""
        return f"{path}: {value} is not allowed (expected one of {expected}{more})"
    if error.validator in ("oneOf", "anyOf"):
        return f"{path}: {value} is not valid here" + (f" ({error.schema['description']})"
                                                        if "description" in error.schema else "")
    return f"{path}: {error.message if len(error.message) <= 160 else error.message[:157] + '...'}"


def check_manifest_file(path: str | Path, source: str | None = None) -> dict:
    """Read an `export.json` (a regular file, bounded size, strict JSON), check it, and return it."""
    path = Path(path)
    source = source or str(path)
    manifest = loads_checked(read_checked(path, source, MAX_MANIFEST_BYTES), source, "$")
    check_manifest(manifest, source)
    return manifest


_ALIGNMENT_SLACK = 4096  # a writer may pad the weights file to a page


def check_onnx_file(model: Path, data: Path | None, label: str, data_alt: Path | None = None) -> None:
    """Parse the `.onnx` protobuf here (never letting ONNX Runtime or onnx_ir open anything first) and check every
    tensor kept outside it: its location must be the component's own `<file>.data` (what the engine writes) or
    `<file>_data` (what a publication names it, for optimum and transformers.js), one of them for the whole graph;
    anything else, absolute or `..` above all, is refused. Its offset and length must lie inside that file and match
    the tensor's shape and type. The weights file may be no larger than what the graph declares."""
    from google.protobuf.message import DecodeError

    proto = model_proto()()  # onnx's ModelProto for the fields read here, without importing onnx (formats.onnx.proto)
    try:
        proto.ParseFromString(read_checked(model, label, MAX_ONNX_BYTES))
    except (DecodeError, ValueError, RuntimeError) as error:
        raise CorruptExportError(f"{label}: not an ONNX model (protobuf: {first_line(error, 160)})") from None
    if not proto.HasField("graph"):
        raise CorruptExportError(f"{label}: not an ONNX model (no graph)")
    own = f"{Path(model).name}.data"
    first = next((tensor for tensor, _ in _onnx_tensors(proto) if tensor.data_location == EXTERNAL), None)
    if first is not None and {e.key: e.value for e in first.external_data}.get("location") == f"{Path(model).name}_data":
        own, data = f"{Path(model).name}_data", data_alt
    data_size = os.stat(Path(data).resolve()).st_size if data is not None else None
    end = 0
    for tensor, where in _onnx_tensors(proto):
        if tensor.data_location != EXTERNAL:
            if tensor.external_data:
                raise CorruptExportError(f"{label}: {where}: external_data on a tensor stored inline")
            continue
        fields = {entry.key: entry.value for entry in tensor.external_data}
        location = fields.get("location", "")
        if location != own:
            kind = UnsafeExportError if (location.startswith(("/", "\\")) or ".." in re.split(r"[/\\]", location)
                                          or ":" in location) else CorruptExportError
            raise kind(f"{label}: {where}.external_data.location: {location[:120]!r}, not this component's weights "
                       f"file {own!r}: refused")
        if data_size is None:
            raise CorruptExportError(f"{label}: {where}: its weights file {own} is missing")
        offset, length = _onnx_int(fields.get("offset", "0"), label, where, "offset"), \
            _onnx_int(fields.get("length"), label, where, "length")
        expected = _onnx_nbytes(tensor)
        if expected is not None and length != expected:
            raise CorruptExportError(f"{label}: {where}.external_data.length: {length} bytes, but the tensor's shape "
                                     f"and type need {expected}")
        if offset + length > data_size:
            raise CorruptExportError(f"{label}: {where}.external_data: bytes {offset}..{offset + length} are past the "
                                     f"end of {own} ({data_size} bytes): truncated?")
        end = max(end, offset + length)
    if data_size is not None and data_size > end + _ALIGNMENT_SLACK:
        raise CorruptExportError(f"{label}: {own} has {data_size} bytes, the graph declares {end}: refused")


def _onnx_int(value, label: str, where: str, field: str) -> int:
    if value is None or not re.fullmatch(r"[0-9]{1,19}", value):
        raise CorruptExportError(f"{label}: {where}.external_data.{field}: {str(value)[:40]!r} is not a byte count")
    return int(value)


def _onnx_nbytes(tensor) -> int | None:
    """What a tensor's shape and element type take in bytes; None for types without a fixed size (strings)."""
    itemsize = ITEMSIZE.get(tensor.data_type)
    if itemsize is None:
        return None
    if tensor.data_type in PACKED:  # packed sub-byte types
        return -(-math.prod(tensor.dims) // PACKED[tensor.data_type])
    return math.prod(tensor.dims) * itemsize


def _onnx_tensors(proto) -> Iterator[tuple[Any, str]]:
    """Every TensorProto of a model with its path: initializers, sparse initializers, and tensors in node
    attributes, through subgraphs and local functions, without recursion."""
    stack = [(proto.graph, "graph")]
    for index, function in enumerate(proto.functions):
        stack.extend((node, f"functions[{index}].node[{n}]") for n, node in enumerate(function.node))
    while stack:
        item, where = stack.pop()
        if hasattr(item, "initializer"):  # a graph
            for index, tensor in enumerate(item.initializer):
                yield tensor, f"{where}.initializer[{index}] ({tensor.name[:60]})"
            for index, sparse in enumerate(item.sparse_initializer):
                yield sparse.values, f"{where}.sparse_initializer[{index}].values"
                yield sparse.indices, f"{where}.sparse_initializer[{index}].indices"
            stack.extend((node, f"{where}.node[{index}]") for index, node in enumerate(item.node))
            continue
        for attribute in item.attribute:  # a node
            at = f"{where}.attribute.{attribute.name[:40]}"
            if attribute.HasField("t"):
                yield attribute.t, f"{at}.t"
            for index, tensor in enumerate(attribute.tensors):
                yield tensor, f"{at}.tensors[{index}]"
            if attribute.HasField("sparse_tensor"):
                yield attribute.sparse_tensor.values, f"{at}.sparse_tensor.values"
                yield attribute.sparse_tensor.indices, f"{at}.sparse_tensor.indices"
            for index, sparse in enumerate(attribute.sparse_tensors):
                yield sparse.values, f"{at}.sparse_tensors[{index}].values"
                yield sparse.indices, f"{at}.sparse_tensors[{index}].indices"
            if attribute.HasField("g"):
                stack.append((attribute.g, f"{at}.g"))
            stack.extend((graph, f"{at}.graphs[{index}]") for index, graph in enumerate(attribute.graphs))


# OpenVINO runtime options an IR may carry in `rt_info/runtime_options`, which OpenVINO applies when it compiles the
# model: precisions and cache layout only (a `CACHE_DIR` there would make OpenVINO write outside the folder).
OPENVINO_RUNTIME_OPTIONS = frozenset({
    "INFERENCE_PRECISION_HINT", "KV_CACHE_PRECISION", "KEY_CACHE_PRECISION", "VALUE_CACHE_PRECISION",
    "KEY_CACHE_GROUP_SIZE", "VALUE_CACHE_GROUP_SIZE", "DYNAMIC_QUANTIZATION_GROUP_SIZE", "ACTIVATIONS_SCALE_FACTOR",
})


_OPENVINO_OPTION_VALUE = re.compile(r"^[A-Za-z0-9_.]{1,32}$")


@lru_cache(maxsize=1)
def openvino_standard_opsets() -> frozenset[str]:
    """The opsets the installed OpenVINO defines (`opset1` ... `opset16` for 2026.4): only their operations run without
    an extension."""
    import openvino

    return frozenset(name for name in dir(openvino) if re.fullmatch(r"opset[0-9]+", name))


def check_openvino_files(xml: Path, weights: Path, label: str) -> None:
    """The `.xml` graph may use only standard opsets (a custom operation needs an extension, i.e. native code the
    caller loaded), carry no DTD or entity (pugixml and expat would expand them), set no runtime option beyond
    precisions, and every `Const` layer's bytes must lie inside its `.bin`, which may be no larger than they declare."""
    import xml.etree.ElementTree as ElementTree

    text = read_checked(xml, label, MAX_XML_BYTES)
    if re.search(rb"<!(DOCTYPE|ENTITY)", text, re.IGNORECASE):
        raise UnsafeExportError(f"{label}: a DTD or entity declaration (entities can read files or expand without "
                                "bound): refused")
    try:
        root = ElementTree.fromstring(text)
    except ElementTree.ParseError as error:
        raise CorruptExportError(f"{label}: not XML ({error})") from None
    if root.tag != "net" or root.get("version") not in ("10", "11"):
        raise CorruptExportError(f"{label}: not an OpenVINO IR (<net version=\"10|11\"> expected)")
    opsets, weights_size, end = openvino_standard_opsets(), os.stat(Path(weights).resolve()).st_size, 0
    for layer in root.iter("layer"):
        where = f"layer {layer.get('id')!r} ({str(layer.get('name'))[:60]})"
        kind, version = layer.get("type") or "", layer.get("version") or ""
        if version not in opsets or not PYTHON_IDENTIFIER.match(kind):
            raise UnsafeExportError(f"{label}: {where}: operation {kind[:40]!r} of {version[:40]!r}: only standard "
                                    "OpenVINO opsets are accepted (a custom operation runs extension code)")
        if kind == "Const":
            data = layer.find("data")
            offset, size = (data.get("offset"), data.get("size")) if data is not None else (None, None)
            if not (offset and size and offset.isdigit() and size.isdigit()):
                raise CorruptExportError(f"{label}: {where}: data.offset/size: expected byte counts")
            if int(offset) + int(size) > weights_size:
                raise CorruptExportError(f"{label}: {where}: bytes {offset}..{int(offset) + int(size)} are past the "
                                         f"end of {Path(weights).name} ({weights_size} bytes): truncated?")
            end = max(end, int(offset) + int(size))
    if weights_size > end + _ALIGNMENT_SLACK:
        raise CorruptExportError(f"{label}: {Path(weights).name} has {weights_size} bytes, the graph declares {end}")
    for options in root.iter("runtime_options"):
        for option in options:
            value = option.get("value") or ""
            if option.tag not in OPENVINO_RUNTIME_OPTIONS or not _OPENVINO_OPTION_VALUE.match(value):
                raise UnsafeExportError(f"{label}: rt_info.runtime_options.{option.tag[:60]}={value[:40]!r}: only "
                                        "precision options are accepted (OpenVINO applies these when compiling)")


def check_pte_file(path: Path, label: str) -> None:
    """An ExecuTorch program: the flatbuffer's `ET` file identifier; the runtime then verifies the whole flatbuffer
    (`Verification.InternalConsistency`, the engine's default) before it runs anything."""
    head = read_checked_prefix(path, label, 8)
    if len(head) < 8 or head[4:6] != b"ET":
        raise CorruptExportError(f"{label}: not an ExecuTorch program (no ET file identifier)")


def check_ptd_file(path: Path, label: str) -> None:
    """An ExecuTorch data file (`.ptd`, beside its `.pte`): plain data, a FlatTensor whose index
    (`formats.executorch.ptd.read_flat_tensor`) is well-formed and places every named entry inside the file. It names no other
    file: the loader passes it to the runtime as the program's data map, and nothing in it runs."""
    try:
        with open(Path(path).resolve(strict=True), "rb") as file:
            data = mmap.mmap(file.fileno(), 0, access=mmap.ACCESS_READ) if os.fstat(file.fileno()).st_size else b""
    except OSError as error:
        raise CorruptExportError(f"{label}: cannot be read ({error.strerror or error})") from None
    read_flat_tensor(memoryview(data), label)  # the map closes when collected (a refusal's traceback holds views)


def read_checked_prefix(path: Path, label: str, count: int) -> bytes:
    try:
        with open(Path(path).resolve(strict=True), "rb") as file:
            return file.read(count)
    except OSError as error:
        raise CorruptExportError(f"{label}: cannot be read ({error.strerror or error})") from None
