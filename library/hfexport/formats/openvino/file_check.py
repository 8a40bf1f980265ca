"""What an OpenVINO IR's files must be before OpenVINO opens them (`OpenvinoProgram.check_files`): the `.xml` in
standard opsets only, without DTDs or entities or runtime options beyond precisions, every `Const` inside its `.bin`
(docs/security.md)."""

from __future__ import annotations

import os
import re
from functools import lru_cache
from pathlib import Path

from hfexport.errors import CorruptExportError, UnsafeExportError
from hfexport.formats.openvino.backend import OpenvinoFormat
from hfexport.safety.artifacts import ALIGNMENT_SLACK, read_checked
from hfexport.safety.treespec import PYTHON_IDENTIFIER


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

    text = read_checked(xml, label, OpenvinoFormat.max_program_bytes)
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
    if weights_size > end + ALIGNMENT_SLACK:
        raise CorruptExportError(f"{label}: {Path(weights).name} has {weights_size} bytes, the graph declares {end}")
    for options in root.iter("runtime_options"):
        for option in options:
            value = option.get("value") or ""
            if option.tag not in OPENVINO_RUNTIME_OPTIONS or not _OPENVINO_OPTION_VALUE.match(value):
                raise UnsafeExportError(f"{label}: rt_info.runtime_options.{option.tag[:60]}={value[:40]!r}: only "
                                        "precision options are accepted (OpenVINO applies these when compiling)")
