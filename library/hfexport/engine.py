"""The `transformers.exporters` internals hfexport relies on, named in one place.

docs/architecture.md: hfexport uses the engine's public constructors and methods. A few things it needs are not part of that
surface (the backend table, per-format exporter and runner classes, the dynamo exporter's automatic dynamic shapes
and cache pytree registration, calibration capture, OpenVINO feed and output helpers, the treespec type registry).
Each is reached through this module only, imported when first used (the engine imports torch), and `INTERNALS`
(`hfexport.workarounds.transformers_exporters`, beside every other upstream workaround) lists them with the engine
version they were checked against; tests/test_architecture.py fails when the engine drops one, so a move in the
engine is one file to fix here, not many.
"""

from __future__ import annotations

import contextlib
import importlib
from collections.abc import Iterator
from typing import Any

from hfexport.workarounds import workaround
from hfexport.workarounds.transformers_exporters import (
    CHECKED_WITH,  # noqa: F401 - the version INTERNALS were checked with, named beside them
    EXPORTED_MODEL_RUNNERS,
    INTERNALS,
    SLIDING_WINDOW_METHODS,
)


def internal(name: str) -> Any:
    """The engine object `INTERNALS[name]` names, imported on first use."""
    module, attribute = INTERNALS[name]
    return getattr(importlib.import_module(module), attribute)


def export_backends() -> dict:
    """The engine's table of export formats to exporter classes (`transformers.exporters.auto.EXPORT_BACKENDS`)."""
    return internal("EXPORT_BACKENDS")


def engine_format(name: str):
    """The engine's value for a format name: its `ExportFormat` member, or the name itself for a format registered
    with the engine under a name `ExportFormat` lacks (`register_backend` takes any string)."""
    from transformers.exporters import ExportFormat

    name = str(getattr(name, "value", name))
    return ExportFormat(name) if name in {member.value for member in ExportFormat} else name


def exporter_class(export_format: str):
    """The engine's exporter class for a format (its `program_files`, `load_program`, ...)."""
    return internal("get_exporter_class")(export_format)


def runner_class(export_format: str):
    """The engine's runner class for a format (its `from_program` and the options it takes)."""
    return internal("get_runner_class")(export_format)


def auto_dynamic_shapes(*args, **kwargs):
    """The dynamo exporter's dynamic shapes for `dynamic=True` without explicit shapes."""
    return internal("get_auto_dynamic_shapes")(*args, **kwargs)


def onnx_inputs(input_names: list[str], kwargs: dict) -> dict:
    """The traced forward's tensor leaves in `kwargs` by ONNX input name, as the engine's ONNX runner binds them."""
    return internal("onnx_inputs")(input_names, kwargs)


def set_runners(exported, runners: dict) -> None:
    """Give an engine `ExportedModel` its runners, as its `to` does (`.runners`, `__call__` and `device` read them)."""
    setattr(exported, EXPORTED_MODEL_RUNNERS, runners)


def register_cache_pytrees(model) -> None:
    """Register the model's cache classes as pytree nodes, as the dynamo exporter does before tracing."""
    internal("register_cache_pytrees_for_model")(model)


def register_treespec_types(*args, **kwargs):
    """Register the types a loaded program's treespecs name (the engine's metadata registry)."""
    return internal("register_treespec_types")(*args, **kwargs)


def capture_calibration_inputs(*args, **kwargs):
    """Per-component calibration inputs captured from generate-style batches (what `export_for_generation` does
    for a single config)."""
    return internal("capture_calibration_inputs")(*args, **kwargs)


@workaround(
    "transformers-sliding-window-trace",
    upstream="transformers 5.23.0 (exporters; huggingface/transformers#49542)",
    works_around="the dynamo exporter traces sliding-window cache layers as full DynamicLayers while eager cuts "
                 "them to the window, so the engine's eager capture traced a decode the prefill cannot feed",
    applied="engine.traced_cache_layout around the generation capture and the probes",
    canary="tests/test_sliding_window.py::test_eager_cuts_the_sliding_layer_to_its_window")
@contextlib.contextmanager
def traced_cache_layout() -> Iterator[None]:
    """Within the block, sliding-window cache layers behave as the engine traces them: as a full `DynamicLayer`.

    transformers 5.23's dynamo exporter (every format traces through it) swaps `DynamicSlidingWindowLayer`'s
    `update`/`get_mask_sizes`/`get_seq_length` for `DynamicLayer`'s while tracing (`_patch_sliding_window_layer`,
    "temporary: it goes once huggingface/transformers#49542 keeps sliding-window decode on one graph"): an exported
    prefill returns, and an exported decode takes, the whole sliding layer's keys and values (the sliding mask still
    applies the window), where eager keeps the last `window - 1`. The engine's capture (`decompose_for_generation`)
    runs eagerly, outside the patch, so it traced the decode from the eager cut cache: a `.pt2` decode then took only
    a cache with the capture's token counter (`cumulative_length`, Python pytree context: "Trying to flatten user
    inputs with exported input tree spec") and the cut cache's strides ("Guard failed:
    past_key_values[0].stride()[1] != ..."), never the full one its own prefill returns. hfexport runs the capture,
    and each generation probe's capture and eager reference, inside this block: the decode is traced from the cache
    the exported prefill returns, and a probe compares the caches the export holds.
    """
    from transformers.cache_utils import DynamicSlidingWindowLayer

    factory = internal("sliding_window_patch")
    originals = {name: DynamicSlidingWindowLayer.__dict__[name] for name in SLIDING_WINDOW_METHODS
                 if name in DynamicSlidingWindowLayer.__dict__}
    for name, original in originals.items():
        setattr(DynamicSlidingWindowLayer, name, factory(original))
    try:
        yield
    finally:
        for name, original in originals.items():
            setattr(DynamicSlidingWindowLayer, name, original)


def openvino_request(runner):
    """The OpenVINO runner's infer request (stateful programs are reset and read through it)."""
    return runner.request


def openvino_infer(runner, kwargs: dict):
    """Run an OpenVINO runner's compiled model on `kwargs` with the engine's own feed; the raw results by port."""
    return runner.request.infer(internal("openvino_feed")(runner.compiled_model, kwargs))


def openvino_output_tensor(*args, **kwargs):
    """An OpenVINO result as a torch tensor, as the engine's runner converts it."""
    return internal("openvino_output_tensor")(*args, **kwargs)
