"""One package per export format (torch.export, ONNX, OpenVINO, ExecuTorch), each holding all of that format, behind
one registry: `format_backend("onnx")` is what the layers ask instead of comparing a format's name
(`hfexport.formats.backend`; a format's programs: `hfexport.formats.programs`)."""

from hfexport.formats.backend import (
    FormatBackend,
    find_format,
    format_backend,
    format_traits,
    formats,
    register_format,
    unregister_format,
)

# The built-in formats register themselves as their backends are imported, in this order.
from hfexport.formats.onnx.backend import OnnxFormat  # noqa: E402
from hfexport.formats.openvino.backend import OpenvinoFormat  # noqa: E402
from hfexport.formats.executorch.backend import ExecutorchFormat  # noqa: E402
from hfexport.formats.torch_export.backend import TorchExportFormat  # noqa: E402

__all__ = ["ExecutorchFormat", "FormatBackend", "OnnxFormat", "OpenvinoFormat", "TorchExportFormat", "find_format",
           "format_backend", "format_traits", "formats", "register_format", "unregister_format"]
