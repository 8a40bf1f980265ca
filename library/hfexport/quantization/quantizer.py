"""The engine's quantizer for a target's `quantization` section (`build_quantizer`), attached with its
calibration set to every component of a plan (`attach`). PT2E presets build torchao/ExecuTorch quantizers.
"""

from __future__ import annotations

import copy
import enum
import functools
from typing import Any

from hfexport.engine import capture_calibration_inputs
from hfexport.errors import PlanError, RecipeError, first_line
from hfexport.formats import format_traits
from hfexport.models import load_processor, on_empty_cache
from hfexport.quantization.calibration import build_calibration
from hfexport.quantization.spec import (
    DEFAULT_PARAMS,
    PARAMS,
    PT2E_PRESETS,
    Pt2ePreset,
    data_need,
    effective_params,
    section_problems,
)


def build_pt2e_preset(preset: Pt2ePreset):
    """The torchao/ExecuTorch PT2E quantizer a named preset stands for (imports its backend)."""
    if preset.backend == "xnnpack":
        from executorch.backends.xnnpack.quantizer.xnnpack_quantizer import (
            get_symmetric_quantization_config,
        )

        config = get_symmetric_quantization_config(is_per_channel=preset.per_channel, is_dynamic=preset.dynamic)
        return _xnnpack_quantizer_class()().set_global(config)
    from torchao.quantization.pt2e.quantizer.x86_inductor_quantizer import (
        X86InductorQuantizer,
        get_default_x86_inductor_quantization_config,
    )

    return X86InductorQuantizer().set_global(get_default_x86_inductor_quantization_config(is_dynamic=preset.dynamic))


@functools.cache
def _xnnpack_quantizer_class():
    """ExecuTorch's `XNNPACKQuantizer`, with its scalar-to-tensor pass kept off integer arithmetic.

    ExecuTorch 1.5.1 (the XNNPACK quantizer transformers 5.23's `PT2EQuantizer` documents) turns every scalar operand of
    `add`/`mul` into a float32 tensor before annotating, integer ones included: `arange(n) + 0` in the attention-mask
    code becomes float, and the calibration forward fails with "tensors used as indices must be long, int, byte or
    bool tensors" (BERT and Llama alike). Only nodes whose result is floating point need the conversion (they are the
    ones it can quantize), so integer nodes get their scalars back after the pass.
    """
    import torch
    from executorch.backends.xnnpack.quantizer.xnnpack_quantizer import XNNPACKQuantizer

    class IntegerSafeXNNPACKQuantizer(XNNPACKQuantizer):
        def transform_for_annotation(self, model):
            integer_nodes = {
                node: node.args
                for node in model.graph.nodes
                if node.op == "call_function"
                and node.target in (torch.ops.aten.add.Tensor, torch.ops.aten.mul.Tensor)
                and getattr(node.meta.get("val"), "dtype", torch.float32).is_floating_point is False
            }
            model = super().transform_for_annotation(model)
            for node, args in integer_nodes.items():
                added = [arg for arg in node.args if isinstance(arg, torch.fx.Node) and arg not in args]
                node.args = args
                for constant in added:
                    if constant.op == "get_attr" and not constant.users:
                        model.graph.erase_node(constant)
                        if hasattr(model, constant.target):
                            delattr(model, constant.target)
            model.recompile()
            return model

    return IntegerSafeXNNPACKQuantizer


# ── Engine objects ───────────────────────────────────────────────────────────


def convert_params(method: str, params: dict) -> dict[str, Any]:
    """The section's params as the engine config's keyword arguments (library enums and objects)."""
    table = PARAMS[method]
    return {name: table[name].convert(value) for name, value in (params or {}).items()}


def build_quantizer(target) -> Any:
    """The engine quantizer a target's `quantization` section stands for (no calibration set yet)."""
    section = target.quantization
    problems = section_problems(section, target.export_format, target.options, ["targets", target.name],
                                calibration=False)
    if problems:
        raise RecipeError(problems)
    method = section["method"]
    try:
        kwargs = convert_params(method, effective_params(method, section.get("params")))
    except ImportError as error:
        raise PlanError(f"targets.{target.name}.quantization: {method} needs {error.name or error}; install it with "
                        "`pip install 'hfexport[quantization]'`") from None
    from transformers import exporters

    if method in ("ort_dynamic", "ort_static"):
        config_class = exporters.OnnxRuntimeDynamicConfig if method == "ort_dynamic" else exporters.OnnxRuntimeStaticConfig
        return exporters.OnnxRuntimeQuantizer(config_class(**kwargs))
    if method in ("nncf_weights", "nncf_quantize"):
        config_class = exporters.NNCFWeightCompressionConfig if method == "nncf_weights" else exporters.NNCFQuantizationConfig
        quantizer_class = getattr(exporters, format_traits(target.export_format).nncf_quantizer)
        return quantizer_class(config_class(**kwargs))
    try:
        quantizer = build_pt2e_preset(PT2E_PRESETS[section["preset"]])
    except ImportError as error:
        raise PlanError(f"targets.{target.name}.quantization.preset: {section['preset']} needs {error.name or error}; "
                        "install it with `pip install 'hfexport[quantization]'`") from None
    return _pt2e_quantizer_class()(quantizer)


@functools.cache
def _pt2e_quantizer_class():
    """The engine's `PT2EQuantizer`, giving each dynamically quantized op its own quantize chain for ExecuTorch.

    transformers 5.23's `PT2EQuantizer` hands `convert_pt2e`'s graph to the backend as is. With dynamic activation
    quantization, linears that read the same activation (q/k/v projections) share one choose_qparams/quantize/
    dequantize chain, and ExecuTorch's XNNPACK partitioner then fails on the shared chain ("Invalid partition, found
    dependency cycles"). ExecuTorch's own LLM export runs its `DuplicateDynamicQuantChainPass` at that point; so does
    this subclass, for ExecuTorch exports only.
    """
    from transformers.exporters import ExportFormat, PT2EQuantizer

    class ExecutorchReadyPT2EQuantizer(PT2EQuantizer):
        def quantize(self, model, sample_inputs, export_format):
            quantized = super().quantize(model, sample_inputs, export_format)
            if export_format == ExportFormat.EXECUTORCH:
                from executorch.backends.transforms.duplicate_dynamic_quant_chain import (
                    DuplicateDynamicQuantChainPass,
                )

                quantized = DuplicateDynamicQuantChainPass()(quantized).graph_module
            return quantized

    return ExecutorchReadyPT2EQuantizer


def engine_arguments(quantizer) -> dict:
    """The engine objects a quantizer was built with, as readable JSON (for plans and reports)."""
    described: dict[str, Any] = {"quantizer": type(quantizer).__name__}
    config = getattr(quantizer, "config", None)
    if config is not None:
        described["config"] = type(config).__name__
        described["arguments"] = {name: _readable(value) for name, value in config.to_kwargs().items()}
    inner = getattr(quantizer, "quantizer", None)
    if inner is not None:
        described["pt2e_quantizer"] = type(inner).__name__
    return described


def _readable(value: Any) -> Any:
    if isinstance(value, enum.Enum):  # before str: NNCF's modes are string enums
        return f"{type(value).__name__}.{value.name}"
    if isinstance(value, (bool, int, float, str)) or value is None:
        return value
    if isinstance(value, (list, tuple)):
        return [_readable(item) for item in value]
    if isinstance(value, dict):
        return {str(key): _readable(item) for key, item in value.items()}
    name = getattr(value, "name", None)
    return f"{type(value).__name__}.{name}" if isinstance(name, str) else repr(value)


def attach(plan, model, processor=None, source=None, revision=None, token=None) -> dict | None:
    """Give every component of `plan` its quantizer and calibration set; return the plan's quantization record.

    Generation targets: calibration batches are generate kwargs, and each component calibrates on its own forward
    inputs captured from them with the engine's `capture_calibration_inputs` (what `export_for_generation` does for a
    single config, and skips for the per-component configs a plan always has).
    """
    target = plan.target
    section = target.quantization
    if not section:
        return None
    quantizer = build_quantizer(target)
    from transformers.exporters import ExportFormat

    try:
        quantizer.validate_environment(ExportFormat(target.export_format))
    except (ImportError, ValueError) as error:
        raise PlanError(f"targets.{target.name}.quantization: {first_line(error)}") from None
    need = data_need(section)
    record: dict[str, Any] = {
        "method": section["method"],
        "preset": section.get("preset"),
        "params": effective_params(section["method"], copy.deepcopy(section.get("params") or {})),
        "defaults": {key: value for key, value in DEFAULT_PARAMS.get(section["method"], {}).items()
                     if key not in (section.get("params") or {})},
        "data": need,
        "engine": engine_arguments(quantizer),
        "calibration": None,
    }
    calibration_section = section.get("calibration")
    if calibration_section is None or need == "none":
        for component in plan.components.values():
            component.config.quantizer = quantizer
        return record


    if processor is None and source is not None:
        processor = load_processor(source, revision, token)
    calibration = build_calibration(calibration_section, plan, processor, model.config, source, revision, token)
    described = calibration.describe()
    if calibration.count < 2 and need == "required" and not calibration_section.get("allow_single_sample", False):
        raise PlanError(
            f"targets.{target.name}.quantization.calibration: {section['method']} would calibrate on "
            f"{calibration.count} sample from {calibration.origin}; add samples or set allow_single_sample: true"
        )
    if plan.mode == "forward":
        for component in plan.components.values():
            component.config.quantizer = quantizer.with_calibration(calibration.batches)
        described["per_component"] = {name: len(calibration.batches) for name in plan.components}
    else:
        try:
            captured = capture_calibration_inputs(
                model, calibration.batches, generation_config=plan.generation_config,
                multi_token_decode=plan.multi_token_decode,
            )
        except Exception as error:  # noqa: BLE001 - the engine's own message, one line
            raise PlanError(
                f"targets.{target.name}.quantization.calibration: capturing the components' calibration inputs failed: "
                f"{first_line(error)}"
            ) from None
        if plan.single_graph:
            captured = {"decode": [_with_empty_cache(inputs, model) for inputs in captured.get("decode", [])]}
        missing = [name for name in plan.components if not captured.get(name)]
        if missing:
            raise PlanError(f"targets.{target.name}.quantization.calibration: no calibration inputs captured for "
                            f"{', '.join(missing)}")
        for name, component in plan.components.items():
            component.config.quantizer = quantizer.with_calibration(captured[name])
        described["per_component"] = {name: len(captured[name]) for name in plan.components}
    record["calibration"] = described
    return record


def _with_empty_cache(inputs: dict, model) -> dict:
    """A captured multi-token decode call: the engine's capture holds the prompt's call too, on a `DynamicCache`
    whose layers are not initialized yet (no tensors to feed). A single graph runs prompts on
    `hfexport.models.empty_cache` (zero-length tensors), so that is what it is calibrated on."""
    cache = inputs.get("past_key_values")
    layers = getattr(cache, "layers", None)
    if not layers or all(getattr(layer, "keys", None) is not None for layer in layers):
        return inputs
    return on_empty_cache(inputs, model)
