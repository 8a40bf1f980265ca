"""torch.export as the layers see it (the engine's "dynamo" format): `torch-export/model.pt2`, run in torch itself."""

from __future__ import annotations

from hfexport.formats.backend import COMMON_OPTIONS, FormatBackend, register_format


@register_format
class TorchExportFormat(FormatBackend):
    name = "dynamo"
    label = "torch.export"
    aliases = ("pt2", "torch.export", "torch-export", "torch_export")
    runtime_label = "torch.export"
    runtime_package = "torch"
    folder = "torch-export"
    default_file = "model.pt2"
    hub_tag = "torch-export"
    target_name = "pt2"
    options = COMMON_OPTIONS
    fp32_tolerance = (1e-5, 1e-4, 0.99999, 0.99)
    memory_factor = 3.0
    export_cost = 0.25
    runs_in_torch = True
    checks_input_spec = True
