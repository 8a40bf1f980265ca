"""The `transformers.exporters` internals hfexport relies on (names outside the engine's public API), with the engine
version they were checked against. `hfexport.engine` reads them (`internal(name)`), and no other module does;
tests/test_architecture.py checks each still exists in the installed engine.
"""

from __future__ import annotations

from hfexport.workarounds import Workaround, register_workaround

CHECKED_WITH = "transformers 5.23.0"

# name -> (module, attribute): everything below reads through `internal`.
INTERNALS = {
    "EXPORT_BACKENDS": ("transformers.exporters.auto", "EXPORT_BACKENDS"),
    "get_exporter_class": ("transformers.exporters.auto", "get_exporter_class"),
    "get_runner_class": ("transformers.exporters.auto", "get_runner_class"),
    "get_auto_dynamic_shapes": ("transformers.exporters.exporter_dynamo", "get_auto_dynamic_shapes"),
    "register_cache_pytrees_for_model": ("transformers.exporters.exporter_dynamo", "register_cache_pytrees_for_model"),
    "register_treespec_types": ("transformers.exporters.metadata", "register_treespec_types"),
    "capture_calibration_inputs": ("transformers.exporters.quantizers.utils", "capture_calibration_inputs"),
    "openvino_output_tensor": ("transformers.exporters.runners.runner_openvino", "openvino_output_tensor"),
    "openvino_feed": ("transformers.exporters.utils", "openvino_feed"),
    "onnx_inputs": ("transformers.exporters.utils", "onnx_inputs"),
    "sliding_window_patch": ("transformers.exporters.exporter_dynamo", "_patch_sliding_window_layer"),
}
register_workaround(Workaround(
    name="transformers-exporters-internals",
    upstream="transformers 5.23.0 (exporters)",
    works_around="names hfexport needs that are not the engine's public API (backend table, runner classes, "
                 "feeds, treespec registry, ...), each listed with the version it was checked against",
    module=__name__.removeprefix("hfexport."), applied="read through hfexport.engine only",
    canary="tests/test_architecture.py::test_engine_internals_are_named_once_and_still_exist"))

# The cache-layer methods the dynamo exporter swaps while tracing (its `_patch_sliding_window_layer`).
SLIDING_WINDOW_METHODS = ("update", "get_mask_sizes", "get_seq_length")

# Attributes of engine objects hfexport reads (checked by the same test on a loaded OpenVINO runner).
OPENVINO_RUNNER_ATTRIBUTES = ("compiled_model", "request")

# The attribute `ExportedModel.to` fills with the runners, which `.runners` returns (set by `set_runners`).
EXPORTED_MODEL_RUNNERS = "_runners"
