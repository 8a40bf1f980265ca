"""What an ONNX component's files must be before ONNX Runtime or onnx_ir opens them (`OnnxProgram.check_files`): the
`.onnx` protobuf parsed here, every tensor kept outside it inside its own weights file, at the offsets its shape and
type need (docs/security.md)."""

from __future__ import annotations

import math
import os
import re
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from hfexport.errors import CorruptExportError, UnsafeExportError, first_line
from hfexport.formats.onnx.backend import OnnxFormat
from hfexport.formats.onnx.proto import EXTERNAL, ITEMSIZE, PACKED, model_proto
from hfexport.safety.artifacts import ALIGNMENT_SLACK, read_checked


def check_onnx_file(model: Path, data: Path | None, label: str, data_alt: Path | None = None) -> None:
    """Parse the `.onnx` protobuf here (never letting ONNX Runtime or onnx_ir open anything first) and check every
    tensor kept outside it: its location must be the component's own `<file>.data` (what the engine writes) or
    `<file>_data` (what a publication names it, for optimum and transformers.js), one of them for the whole graph;
    anything else, absolute or `..` above all, is refused. Its offset and length must lie inside that file and match
    the tensor's shape and type. The weights file may be no larger than what the graph declares."""
    from google.protobuf.message import DecodeError

    proto = model_proto()()  # onnx's ModelProto for the fields read here, without importing onnx (formats.onnx.proto)
    try:
        proto.ParseFromString(read_checked(model, label, OnnxFormat.max_program_bytes))
    except (DecodeError, ValueError, RuntimeError) as error:
        raise CorruptExportError(f"{label}: not an ONNX model (protobuf: {first_line(error, 160)})") from None
    if not proto.HasField("graph"):
        raise CorruptExportError(f"{label}: not an ONNX model (no graph)")
    own = f"{Path(model).name}.data"
    first = next((tensor for tensor, _ in onnx_tensors(proto) if tensor.data_location == EXTERNAL), None)
    if first is not None and {e.key: e.value for e in first.external_data}.get("location") == f"{Path(model).name}_data":
        own, data = f"{Path(model).name}_data", data_alt
    data_size = os.stat(Path(data).resolve()).st_size if data is not None else None
    end = 0
    for tensor, where in onnx_tensors(proto):
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
        offset, length = _byte_count(fields.get("offset", "0"), label, where, "offset"), \
            _byte_count(fields.get("length"), label, where, "length")
        expected = _nbytes(tensor)
        if expected is not None and length != expected:
            raise CorruptExportError(f"{label}: {where}.external_data.length: {length} bytes, but the tensor's shape "
                                     f"and type need {expected}")
        if offset + length > data_size:
            raise CorruptExportError(f"{label}: {where}.external_data: bytes {offset}..{offset + length} are past the "
                                     f"end of {own} ({data_size} bytes): truncated?")
        end = max(end, offset + length)
    if data_size is not None and data_size > end + ALIGNMENT_SLACK:
        raise CorruptExportError(f"{label}: {own} has {data_size} bytes, the graph declares {end}: refused")


def _byte_count(value, label: str, where: str, field: str) -> int:
    if value is None or not re.fullmatch(r"[0-9]{1,19}", value):
        raise CorruptExportError(f"{label}: {where}.external_data.{field}: {str(value)[:40]!r} is not a byte count")
    return int(value)


def _nbytes(tensor) -> int | None:
    """What a tensor's shape and element type take in bytes; None for types without a fixed size (strings)."""
    itemsize = ITEMSIZE.get(tensor.data_type)
    if itemsize is None:
        return None
    if tensor.data_type in PACKED:  # packed sub-byte types
        return -(-math.prod(tensor.dims) // PACKED[tensor.data_type])
    return math.prod(tensor.dims) * itemsize


def onnx_tensors(proto) -> Iterator[tuple[Any, str]]:
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
