"""Quantization from recipes: a target's plain-JSON `quantization` section becomes the engine's quantizer.

- `section_problems`: the static checks run when a recipe is loaded (method x format, PT2E preset x format,
  every parameter name and value, calibration source and whether the method needs data), each with its JSON path.
  Pure data: no backend is imported, so `hfexport validate` stays cheap.
- `build_quantizer`: the engine's quantizer (`OnnxRuntimeQuantizer`, `NNCFOpenVINOQuantizer`, `NNCFOnnxQuantizer`,
  `PT2EQuantizer`) with every parameter converted to the library's enums and objects (raw strings fail inside the
  engine). PT2E takes a named preset from `PT2E_PRESETS`, never a class path.
- `attach`: gives each planned component its quantizer and calibration set. The engine captures per-component
  calibration only for a single generation config; a plan always has one config per component, so the capture
  (`capture_calibration_inputs`, the engine's own function) is done here.
- `default_parity`: the gate thresholds for quantized targets (the parity gate merges the recipe's over them).
- `compare_to_reference`: size and latency of a quantized target against the same target unquantized.
"""

from __future__ import annotations

import copy
import enum
import functools
import json
import math
import shutil
import statistics
import time
import uuid
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from .errors import PlanError, Problem, RecipeError

METHODS = ("ort_dynamic", "ort_static", "nncf_weights", "nncf_quantize", "pt2e")

# Which method runs on which export format (the engine's quantizer classes, see docs/quantization.md).
METHOD_FORMATS = {
    "ort_dynamic": ("onnx",),  # OnnxRuntimeQuantizer + OnnxRuntimeDynamicConfig, on the converted ONNX model
    "ort_static": ("onnx",),  # OnnxRuntimeQuantizer + OnnxRuntimeStaticConfig
    "nncf_weights": ("openvino", "onnx"),  # NNCFOpenVINOQuantizer / NNCFOnnxQuantizer + NNCFWeightCompressionConfig
    "nncf_quantize": ("openvino", "onnx"),  # NNCFOpenVINOQuantizer / NNCFOnnxQuantizer + NNCFQuantizationConfig
    "pt2e": ("dynamo", "onnx", "executorch", "openvino"),  # PT2EQuantizer on the FX graph; the preset narrows it
}

# ExecuTorch keeps only what its XNNPACK delegate lowers: the XNNPACK PT2E presets, on the xnnpack backend.
EXECUTORCH_BACKENDS = ("xnnpack",)


@dataclass(frozen=True)
class Pt2ePreset:
    """A named PT2E quantizer set-up: which torchao/ExecuTorch quantizer, how, and where its ops lower."""

    backend: str  # "xnnpack" | "x86_inductor"
    formats: tuple[str, ...]
    dynamic: bool
    per_channel: bool
    description: str

    def build(self):
        if self.backend == "xnnpack":
            from executorch.backends.xnnpack.quantizer.xnnpack_quantizer import get_symmetric_quantization_config

            config = get_symmetric_quantization_config(is_per_channel=self.per_channel, is_dynamic=self.dynamic)
            return _xnnpack_quantizer_class()().set_global(config)
        from torchao.quantization.pt2e.quantizer.x86_inductor_quantizer import (
            X86InductorQuantizer,
            get_default_x86_inductor_quantization_config,
        )

        return X86InductorQuantizer().set_global(get_default_x86_inductor_quantization_config(is_dynamic=self.dynamic))


PT2E_PRESETS = {
    "xnnpack_int8_dynamic_per_channel": Pt2ePreset(
        "xnnpack", ("executorch", "dynamo"), dynamic=True, per_channel=True,
        description="int8 weights per output channel, activations quantized at run time (XNNPACK); data-free",
    ),
    "xnnpack_int8_static_per_channel": Pt2ePreset(
        "xnnpack", ("executorch", "dynamo"), dynamic=False, per_channel=True,
        description="int8 weights per output channel and int8 activations with calibrated ranges (XNNPACK)",
    ),
    "xnnpack_int8_static_per_tensor": Pt2ePreset(
        "xnnpack", ("executorch", "dynamo"), dynamic=False, per_channel=False,
        description="int8 weights per tensor and int8 activations with calibrated ranges (XNNPACK)",
    ),
    "x86_inductor_int8_static": Pt2ePreset(
        "x86_inductor", ("dynamo", "onnx", "openvino"), dynamic=False, per_channel=True,
        description="int8 weights per channel and int8 activations with calibrated ranges (X86 Inductor; QDQ in ONNX, "
        "FakeQuantize in OpenVINO)",
    ),
    "x86_inductor_int8_dynamic": Pt2ePreset(
        "x86_inductor", ("dynamo",), dynamic=True, per_channel=True,
        description="int8 weights per channel, activations quantized at run time (X86 Inductor); data-free",
    ),
}


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


# ── Parameters: JSON in, library objects out ─────────────────────────────────


class _Param:
    """One method parameter: what JSON it takes (`problem`) and the library value it becomes (`convert`)."""

    expected = ""

    def problem(self, value: Any) -> str | None:
        raise NotImplementedError

    def convert(self, value: Any) -> Any:
        return value


class _Bool(_Param):
    expected = "true or false"

    def problem(self, value):
        return None if isinstance(value, bool) else f"expected true or false, got {_show(value)}"


class _Number(_Param):
    def __init__(self, low: float, high: float, integer: bool = False, low_open: bool = False, also: tuple = ()):
        self.low, self.high, self.integer, self.low_open, self.also = low, high, integer, low_open, also
        kind = "an integer" if integer else "a number"
        bracket = "(" if low_open else "["
        self.expected = f"{kind} in {bracket}{low}, {high}]" + (f" or {', '.join(map(str, also))}" if also else "")

    def problem(self, value):
        if isinstance(value, bool) or not isinstance(value, (int, float)) or (self.integer and not isinstance(value, int)):
            return f"expected {self.expected}, got {_show(value)}"
        if value in self.also:
            return None
        if value < self.low or value > self.high or (self.low_open and value == self.low):
            return f"expected {self.expected}, got {value}"
        return None


class _Names(_Param):
    """A list of node, op or layer names (strings)."""

    expected = "a list of names"

    def problem(self, value):
        if not isinstance(value, list) or not all(isinstance(item, str) and 0 < len(item) <= 512 for item in value):
            return f"expected a list of names (strings), got {_show(value)}"
        if len(value) > 10000:
            return "at most 10000 names"
        return None

    def convert(self, value):
        return list(value)


class _Choice(_Param):
    """A string naming a member of a library enum: `values` maps the JSON string to the member's attribute name."""

    def __init__(self, module: str, cls: str, values: dict[str, str]):
        self.module, self.cls, self.values = module, cls, values
        self.expected = "one of " + ", ".join(repr(name) for name in values)

    def problem(self, value):
        if value in self.values if isinstance(value, str) else False:
            return None
        return f"expected {self.expected}; got {_show(value)}"

    def enum(self):
        import importlib

        return getattr(importlib.import_module(self.module), self.cls)

    def convert(self, value):
        return getattr(self.enum(), self.values[value])


class _ScalarMap(_Param):
    """ONNX Runtime's `extra_options`: option names to plain values (bool, number, string)."""

    expected = "an object of option names to true/false, numbers or strings"

    def problem(self, value):
        if not isinstance(value, dict):
            return f"expected {self.expected}, got {_show(value)}"
        for key, item in value.items():
            if not isinstance(item, (bool, int, float, str)) or (isinstance(item, float) and not math.isfinite(item)):
                return f"{key!r}: expected true/false, a number or a string, got {_show(item)}"
        return None

    def convert(self, value):
        return dict(value)


class _IgnoredScope(_Param):
    """`nncf.IgnoredScope`: layers NNCF leaves alone, by `names`, regex `patterns` or op `types`."""

    keys = ("names", "patterns", "types", "validate")
    expected = "an object with names, patterns, types (lists of strings) and validate (true/false)"

    def problem(self, value):
        if not isinstance(value, dict):
            return f"expected {self.expected}, got {_show(value)}"
        for key, item in value.items():
            if key not in self.keys:
                return f"unknown key {key!r}; expected one of: {', '.join(self.keys)}"
            if key == "validate":
                if not isinstance(item, bool):
                    return f"validate: expected true or false, got {_show(item)}"
            elif _Names().problem(item):
                return f"{key}: expected a list of strings, got {_show(item)}"
        return None

    def convert(self, value):
        import nncf

        return nncf.IgnoredScope(**value)


def _show(value: Any) -> str:
    text = json.dumps(value) if not isinstance(value, str) else repr(value)
    return text if len(text) <= 60 else text[:57] + "..."


_ORT_TYPES = {"int8": "QInt8", "uint8": "QUInt8", "int16": "QInt16", "uint16": "QUInt16", "int4": "QInt4",
              "uint4": "QUInt4"}
_ORT = "onnxruntime.quantization"
_NNCF_WEIGHT_MODES = ("int8_sym", "int8_asym", "int4_sym", "int4_asym", "nf4", "mxfp4", "mxfp8_e4m3", "fp8_e4m3",
                      "fp4")
_NNCF_ONNX_WEIGHT_MODES = ("int8_sym", "int8_asym", "int4_sym", "int4_asym", "fp8_e4m3")
_NNCF_METRICS = ("weight_quantization_error", "hessian_input_activation", "mean_activation_variance",
                 "max_activation_variance", "mean_activation_magnitude")


def _upper(*values: str) -> dict[str, str]:
    return {value: value.upper() for value in values}


_ORT_COMMON = {
    "per_channel": _Bool(),
    "reduce_range": _Bool(),
    "op_types_to_quantize": _Names(),
    "nodes_to_quantize": _Names(),
    "nodes_to_exclude": _Names(),
    "extra_options": _ScalarMap(),
}
PARAMS: dict[str, dict[str, _Param]] = {
    "ort_dynamic": {
        "weight_type": _Choice(_ORT, "QuantType", {"int8": "QInt8", "uint8": "QUInt8"}),
        **_ORT_COMMON,
    },
    "ort_static": {
        "quant_format": _Choice(_ORT, "QuantFormat", {"qdq": "QDQ", "qoperator": "QOperator"}),
        "activation_type": _Choice(_ORT, "QuantType", {k: v for k, v in _ORT_TYPES.items() if "4" not in k}),
        "weight_type": _Choice(_ORT, "QuantType", _ORT_TYPES),
        "calibrate_method": _Choice(
            _ORT, "CalibrationMethod",
            {"minmax": "MinMax", "entropy": "Entropy", "percentile": "Percentile", "distribution": "Distribution"},
        ),
        **_ORT_COMMON,
    },
    "nncf_weights": {
        "mode": _Choice("nncf", "CompressWeightsMode", _upper(*_NNCF_WEIGHT_MODES)),
        "ratio": _Number(0, 1, low_open=True),
        "group_size": _Number(1, 1 << 20, integer=True, also=(-1,)),
        "all_layers": _Bool(),
        "sensitivity_metric": _Choice("nncf", "SensitivityMetric", _upper(*_NNCF_METRICS)),
        "subset_size": _Number(1, 100000, integer=True),
        "awq": _Bool(),
        "scale_estimation": _Bool(),
        "gptq": _Bool(),
        "lora_correction": _Bool(),
        "backup_mode": _Choice("nncf", "BackupMode", _upper("none", "int8_sym", "int8_asym")),
        "ignored_scope": _IgnoredScope(),
    },
    "nncf_quantize": {
        "mode": _Choice("nncf", "QuantizationMode", _upper("fp8_e4m3", "fp8_e5m2")),
        "preset": _Choice("nncf", "QuantizationPreset", _upper("performance", "mixed")),
        "target_device": _Choice("nncf", "TargetDevice", _upper("any", "cpu", "gpu", "npu", "cpu_spr")),
        "subset_size": _Number(1, 100000, integer=True),
        "fast_bias_correction": _Bool(),
        "model_type": _Choice("nncf", "ModelType", _upper("transformer")),
        "ignored_scope": _IgnoredScope(),
    },
    "pt2e": {},
}
# What a method's omitted params default to, where ONNX Runtime's own defaults fail hfexport's gate or depend on the CPU.
# ort_dynamic: ONNX Runtime's default (per-tensor int8 weights) fails the 8-bit gate on all-MiniLM-L6-v2 on real text
# (embedding cosine 0.953 on an AMX Xeon), and its u8s8 kernels saturate on AVX2/AVX512 CPUs without VNNI (16-bit
# pair sums). Per-channel weights with reduce_range (7-bit weights: a u8 x s7 pair sum fits in 16 bits, ONNX Runtime's
# documented remedy) give 0.986 and keep the fast u8s8 kernels (0.62x fp32 latency there; per-channel u8u8 1.01x).
# benchmarks/ort_dynamic_params.py, docs/quantization.md.
DEFAULT_PARAMS: dict[str, dict[str, Any]] = {"ort_dynamic": {"per_channel": True, "reduce_range": True}}


def effective_params(method: str, params: dict | None) -> dict:
    """A section's params over hfexport's defaults for its method (`DEFAULT_PARAMS`): what the quantizer gets."""
    return {**DEFAULT_PARAMS.get(method, {}), **(params or {})}


_DATA_AWARE_WEIGHTS = ("awq", "scale_estimation", "gptq", "lora_correction")


def data_need(section: dict) -> str:
    """Whether a quantization section's method reads calibration data: "none" or "required" (as NNCF and the
    engine decide: e.g. int4 weight compression reads data only for AWQ, scale estimation, GPTQ, LoRA correction
    or an activation-ranked mixed precision)."""
    method, params = section.get("method"), section.get("params") or {}
    if method == "ort_dynamic":
        return "none"
    if method in ("ort_static", "nncf_quantize"):
        return "required"
    if method == "pt2e":
        preset = PT2E_PRESETS.get(section.get("preset"))
        return "none" if preset is None or preset.dynamic else "required"
    if method == "nncf_weights":
        if params.get("mode", "int8_asym") in ("int8_sym", "int8_asym"):
            return "none"  # data-free: the engine passes no dataset to NNCF for the int8 modes
        if any(params.get(name) for name in _DATA_AWARE_WEIGHTS):
            return "required"
        ratio, metric = params.get("ratio", 1), params.get("sensitivity_metric")
        if isinstance(ratio, (int, float)) and ratio < 1 and metric != "weight_quantization_error":
            return "required"  # mixed precision ranks layers by their activations
        return "none"  # NNCF collects no statistics then: a dataset would be ignored
    return "none"


def _sample_text_count(sample_inputs: dict, task: str | None) -> int:
    from .calibration import sample_texts

    return len(sample_texts(sample_inputs, task) or [None])


def section_problems(section: dict, export_format: str, options: dict | None, target_path: list,
                     sample_inputs: dict | None = None, calibration: bool = True,
                     task: str | None = None) -> list[Problem]:
    """Every problem of a target's `quantization` section, with JSON paths (the schema has already passed).
    `calibration=False` leaves the calibration section out (it needs the recipe's sample inputs)."""
    base = ".".join(map(str, [*target_path, "quantization"]))
    problems: list[Problem] = []
    method = section.get("method")
    if method not in METHOD_FORMATS:
        return [Problem(f"{base}.method", f"{_show(method)} is not a method; methods: {', '.join(METHODS)}")]
    if export_format not in METHOD_FORMATS[method]:
        combos = "; ".join(f"{name}: {', '.join(formats)}" for name, formats in METHOD_FORMATS.items())
        problems.append(Problem(
            f"{base}.method", f"{method!r} does not run on {export_format}; allowed combinations: {combos}"
        ))
        return problems

    preset_name = section.get("preset")
    if method == "pt2e":
        listing = "; ".join(f"{name} ({', '.join(preset.formats)})" for name, preset in PT2E_PRESETS.items())
        if preset_name is None:
            problems.append(Problem(f"{base}.preset", f"pt2e needs a preset; presets (formats): {listing}"))
        elif preset_name not in PT2E_PRESETS:
            problems.append(Problem(f"{base}.preset", f"{preset_name!r} is not a PT2E preset; presets (formats): {listing}"))
        elif export_format not in PT2E_PRESETS[preset_name].formats:
            fitting = [name for name, preset in PT2E_PRESETS.items() if export_format in preset.formats]
            problems.append(Problem(
                f"{base}.preset",
                f"{preset_name!r} does not lower to {export_format}; presets for {export_format}: {', '.join(fitting)}",
            ))
    elif preset_name is not None:
        problems.append(Problem(f"{base}.preset", f"preset names a PT2E set-up and applies to method pt2e only"
                                                  f"{'; NNCF presets go under params.preset' if method == 'nncf_quantize' else ''}"))
    if export_format == "executorch":
        backend = (options or {}).get("backend", "xnnpack")
        if backend not in EXECUTORCH_BACKENDS:
            problems.append(Problem(
                ".".join(map(str, [*target_path, "options", "backend"])),
                f"a quantized ExecuTorch target lowers through XNNPACK only (the delegate that takes the quantized "
                f"ops); got backend {backend!r}",
            ))

    table = PARAMS[method]
    params = section.get("params") or {}
    for name, value in params.items():
        path = f"{base}.params.{name}"
        if name not in table:
            takes = f"it takes: {', '.join(table)}" if table else "its preset decides everything"
            problems.append(Problem(path, f"not a parameter of {method}; {takes}"))
            continue
        message = table[name].problem(value)
        if message:
            problems.append(Problem(path, message))
    if method == "nncf_weights" and export_format == "onnx":
        for name in ("gptq", "lora_correction"):
            if params.get(name):
                problems.append(Problem(f"{base}.params.{name}", f"{name} runs on openvino only (NNCF's ONNX backend has none)"))
        mode = params.get("mode")
        if isinstance(mode, str) and mode in _NNCF_WEIGHT_MODES and mode not in _NNCF_ONNX_WEIGHT_MODES:
            problems.append(Problem(
                f"{base}.params.mode", f"{mode!r} is not available on onnx; onnx takes: {', '.join(_NNCF_ONNX_WEIGHT_MODES)}"
            ))
    if method == "nncf_weights" and params.get("gptq") and params.get("lora_correction"):
        problems.append(Problem(f"{base}.params.gptq", "gptq and lora_correction cannot be combined; choose one"))

    if calibration:
        problems.extend(_calibration_problems(section, method, f"{base}.calibration", sample_inputs or {}, task))
    return problems


def _calibration_problems(section: dict, method: str, path: str, sample_inputs: dict,
                          task: str | None = None) -> list[Problem]:
    calibration = section.get("calibration")
    need = data_need(section)
    what = f"{method} ({section['preset']})" if section.get("preset") else method
    if calibration is None:
        if need == "required":
            return [Problem(path, f"{what} calibrates on data and has none: add a calibration section (source: "
                                  "sample_inputs, texts, repo_file or dataset)")]
        return []
    if need == "none":
        return [Problem(path, f"{what} is data-free and reads no calibration data; remove the calibration section")]
    problems = []
    source = calibration["source"]
    allowed = {
        "sample_inputs": (),
        "texts": ("texts",),
        "repo_file": ("path", "field"),
        "dataset": ("repo", "revision", "path", "field"),
    }[source]
    required = {"texts": ("texts",), "repo_file": ("path",), "dataset": ("repo", "path")}.get(source, ())
    for key in ("texts", "repo", "revision", "path", "field"):
        if key in calibration and key not in allowed:
            problems.append(Problem(f"{path}.{key}", f"does not apply to source {source!r}"))
    for key in required:
        if key not in calibration:
            problems.append(Problem(path, f"source {source!r} needs {key!r}"))
    file_path = calibration.get("path")
    if file_path and "path" in allowed:
        suffix = Path(file_path).suffix.lower()
        from .calibration import FIELD_SUFFIXES, FILE_SUFFIXES

        if suffix not in FILE_SUFFIXES:
            problems.append(Problem(f"{path}.path", f"expected a {', '.join(FILE_SUFFIXES)} file, got {file_path!r}"))
        elif suffix in FIELD_SUFFIXES and "field" not in calibration and suffix != ".json":
            problems.append(Problem(f"{path}.field", f"a {suffix} file needs the field (column) holding the text"))
        elif suffix == ".txt" and "field" in calibration:
            problems.append(Problem(f"{path}.field", "a .txt file holds one sample per line and has no fields"))
    if need == "required" and not calibration.get("allow_single_sample", False):
        count = None
        if source == "texts" and "texts" in calibration:
            count = len(calibration["texts"])
        elif source == "sample_inputs":
            count = _sample_text_count(sample_inputs, task)
        if calibration.get("num_samples") == 1 or count == 1:
            where = f"{path}.num_samples" if calibration.get("num_samples") == 1 else (
                f"{path}.texts" if source == "texts" else f"{path}.source"
            )
            problems.append(Problem(
                where,
                f"{what} would calibrate on a single sample, which gives poor ranges; add samples or set "
                "allow_single_sample: true",
            ))
    return problems


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
        quantizer_class = exporters.NNCFOpenVINOQuantizer if target.export_format == "openvino" else exporters.NNCFOnnxQuantizer
        return quantizer_class(config_class(**kwargs))
    try:
        quantizer = PT2E_PRESETS[section["preset"]].build()
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
        raise PlanError(f"targets.{target.name}.quantization: {str(error).splitlines()[0]}") from None
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

    from .calibration import build_calibration

    if processor is None and source is not None:
        from .models import load_processor

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
        from transformers.exporters.quantizers.utils import capture_calibration_inputs

        try:
            captured = capture_calibration_inputs(
                model, calibration.batches, generation_config=plan.generation_config,
                multi_token_decode=plan.multi_token_decode,
            )
        except Exception as error:  # noqa: BLE001 - the engine's own message, one line
            raise PlanError(
                f"targets.{target.name}.quantization.calibration: capturing the components' calibration inputs failed: "
                f"{str(error).splitlines()[0] if str(error) else type(error).__name__}"
            ) from None
        missing = [name for name in plan.components if not captured.get(name)]
        if missing:
            raise PlanError(f"targets.{target.name}.quantization.calibration: no calibration inputs captured for "
                            f"{', '.join(missing)}")
        for name, component in plan.components.items():
            component.config.quantizer = quantizer.with_calibration(captured[name])
        described["per_component"] = {name: len(captured[name]) for name in plan.components}
    record["calibration"] = described
    return record


# ── The quality gate ─────────────────────────────────────────────────────────

_LOW_BIT = ("int4", "uint4", "nf4", "mxfp4", "fp4", "int3", "int2")


def default_parity(method: str, mode: str, params: dict | None = None) -> dict:
    """Parity thresholds for a quantized target, in the recipe's `parity` vocabulary (the recipe's own win).

    Quantization moves every value a little, so absolute tolerances are off (`atol`/`rtol` None) and outputs are
    judged by direction and decisions: cosine similarity per output, top-1 agreement of logits, and for generation
    the fraction of greedy tokens that agree with the eager model over `max_new_tokens`.
    """
    params = params or {}
    low_bit = any(str(params.get(key, "")).startswith(_LOW_BIT) for key in ("mode", "weight_type"))
    thresholds: dict[str, Any] = {
        "atol": None,
        "rtol": None,
        "min_cosine": 0.95 if low_bit else 0.98,
        "min_top1": 0.8 if low_bit else 0.9,
    }
    if mode == "generation":
        thresholds["generate"] = {"max_new_tokens": 16, "min_token_agreement": 0.5 if low_bit else 0.75}
    return thresholds


def parity_for(target) -> dict:
    """The thresholds a target's parity gate uses: the quantization defaults under the recipe's own `parity`."""
    parity = copy.deepcopy(target.parity or {})
    if not target.quantization:
        return parity
    merged = default_parity(target.quantization["method"], target.mode, target.quantization.get("params"))
    generate = {**merged.get("generate", {}), **parity.pop("generate", {})}
    merged.update(parity)
    if target.mode == "generation":
        merged["generate"] = generate
    return merged


# ── Size and latency against the unquantized target ──────────────────────────

CHEAP_REFERENCE_PARAMETERS = 50_000_000
LATENCY_ROUNDS = 10
WARMUP_ROUNDS = 2


def program_bytes(folder: Path) -> int:
    """Bytes of an export's programs (the files its manifest names, external weights included)."""
    from transformers.exporters.auto import get_exporter_class

    manifest = json.loads((folder / "export.json").read_text(encoding="utf-8"))
    exporter = get_exporter_class(manifest["export_format"])
    files = {file for entry in manifest["components"].values() for file in exporter.program_files(entry["file"])}
    return sum((folder / file).stat().st_size for file in files if (folder / file).is_file())


def sibling_reference(recipe, name: str, candidates) -> str | None:
    """An unquantized target of the same format and mode (the closest one: same options and shapes first)."""
    target = recipe.target(name)
    matches = []
    for other in candidates:
        if other == name:
            continue
        candidate = recipe.target(other)
        if candidate.quantization or candidate.export_format != target.export_format or candidate.mode != target.mode:
            continue
        same = (candidate.options == target.options) + (candidate.dynamic_shapes == target.dynamic_shapes)
        matches.append((-same, other))
    return min(matches)[1] if matches else None


def unquantized_recipe(recipe, name: str):
    """A copy of `recipe` whose target `name` has no quantization (the fp32 reference)."""
    from .recipe import Recipe, validate_document

    data = copy.deepcopy(recipe.data)
    data["targets"][name].pop("quantization", None)
    return Recipe(validate_document(data, recipe.source), recipe.source, recipe.document)


def _latency_inputs(plan, model) -> dict[str, dict]:
    """What to time per component: the forward inputs (forward mode), or the prefill's captured inputs."""
    if plan.mode == "forward":
        return {"model": dict(plan.inputs)}
    from transformers.exporters.utils import decompose_for_generation

    stages = decompose_for_generation(model, dict(plan.inputs), generation_config=plan.generation_config,
                                      multi_token_decode=plan.multi_token_decode)
    first = next(iter(stages))
    return {first: stages[first][1]}


def measure_latency(folders: dict[str, Path], inputs: dict[str, dict], rounds: int = LATENCY_ROUNDS) -> dict[str, float]:
    """Median seconds per call of each export on the same inputs, runs interleaved so load changes hit both alike."""
    from .exported import ExportedModel

    loaded = {key: ExportedModel.from_pretrained(folder) for key, folder in folders.items()}
    (component, sample), = inputs.items()

    def call(exported):
        runner = exported.runners[component]
        traced = runner.metadata.kwargs  # what the graph was traced with (flags such as use_cache are not inputs)
        return runner(**{key: value for key, value in copy.deepcopy(sample).items() if key in traced})

    for _ in range(WARMUP_ROUNDS):
        for exported in loaded.values():
            call(exported)
    times: dict[str, list[float]] = {key: [] for key in loaded}
    for _ in range(rounds):
        for key, exported in loaded.items():
            start = time.perf_counter()
            call(exported)
            times[key].append(time.perf_counter() - start)
    return {key: statistics.median(values) for key, values in times.items()}


def _shapes(sample: dict) -> dict:
    import torch

    return {key: list(value.shape) for key, value in sample.items() if isinstance(value, torch.Tensor)}


def compare_to_reference(recipe, name: str, folder: Path, model, plan, reference_folder: Path | None = None,
                         reference_name: str | None = None, processor=None, inputs=None) -> dict:
    """Size and latency of the quantized export in `folder` against an unquantized one.

    The reference is an unquantized target of the same format and mode exported in the same job
    (`reference_folder`). Without one, a throwaway fp32 reference is exported when that is cheap (a model of at most
    `CHEAP_REFERENCE_PARAMETERS` parameters) and deleted afterwards; otherwise the comparison says why it is absent.
    """
    result: dict[str, Any] = {"reference": None, "bytes": program_bytes(folder)}
    temporary = None
    try:
        if reference_folder is None:
            parameters = sum(parameter.numel() for parameter in model.parameters())
            if parameters > CHEAP_REFERENCE_PARAMETERS:
                result["reason"] = (
                    f"no unquantized {plan.target.export_format}/{plan.mode} target in this job, and the model "
                    f"({parameters / 1e6:.0f}M parameters) is too large for a throwaway fp32 export; add one to compare"
                )
                return result
            from .exporter import run_plan
            from .plan import build_plan

            reference_plan = build_plan(unquantized_recipe(recipe, name), name, model, inputs, processor)
            exported = run_plan(reference_plan, model)
            temporary = folder.parent / f".{name}.reference-{uuid.uuid4().hex[:8]}"
            exported.save_pretrained(temporary)
            reference_folder, reference_name = temporary, None
        result["reference"] = reference_name or "fp32 export of this target without quantization (made for this comparison, not kept)"
        result["reference_bytes"] = program_bytes(reference_folder)
        result["size_ratio"] = round(result["bytes"] / max(result["reference_bytes"], 1), 4)
        try:
            samples = _latency_inputs(plan, model)
            latency = measure_latency({"quantized": folder, "reference": reference_folder}, samples)
        except Exception as error:  # noqa: BLE001 - a runtime that cannot time this component: say so, keep sizes
            result["latency_error"] = str(error).splitlines()[0][:300] if str(error) else type(error).__name__
            return result
        (component, sample), = samples.items()
        result.update({
            "latency_component": component,
            "latency_inputs": _shapes(sample),
            "latency_rounds": LATENCY_ROUNDS,
            "latency_ms": round(latency["quantized"] * 1000, 3),
            "reference_latency_ms": round(latency["reference"] * 1000, 3),
            "latency_ratio": round(latency["quantized"] / max(latency["reference"], 1e-9), 4),
        })
        return result
    finally:
        if temporary is not None:
            shutil.rmtree(temporary, ignore_errors=True)


def compare_job_targets(report, recipe, output: Path, model, plans: dict, processor=None, inputs=None,
                        progress=None) -> list[str]:
    """Compare every quantized target a job saved with its reference; return the targets whose report changed.

    The reference is an unquantized target of the same format and mode saved by the same job, else a throwaway
    fp32 export when that is cheap (see `compare_to_reference`). The result goes to `TargetReport.quantization`
    under `comparison`; a comparison that cannot run says why there and never changes the target's status.
    """
    from .errors import redact
    from .job import Step

    progress = progress or (lambda step: None)
    saved = [name for name, entry in report.targets.items() if entry.status in ("ok", "failed")]
    updated = []
    for name, plan in plans.items():
        target_report = report.targets[name]
        if target_report.status not in ("ok", "failed") or target_report.quantization is None:
            continue
        reference = sibling_reference(recipe, name, saved)
        progress(Step("compare", "start", name, f"size and latency against {reference or 'an fp32 export'}"))
        started = time.perf_counter()
        try:
            comparison = compare_to_reference(recipe, name, output / name, model, plan,
                                              output / reference if reference else None, reference, processor, inputs)
        except Exception as error:  # noqa: BLE001 - a comparison that cannot run is reported, not fatal
            comparison = {"error": redact(str(error).splitlines()[0] if str(error) else type(error).__name__)[:500]}
        seconds = time.perf_counter() - started
        target_report.quantization["comparison"] = json.loads(json.dumps(comparison, default=str))
        target_report.timings["compare_s"] = round(seconds, 4)
        progress(Step("compare", "error" if "error" in comparison else "done", name, comparison_summary(comparison),
                      seconds))
        updated.append(name)
    return updated


def comparison_summary(comparison: dict | None) -> str:
    """One line: `size 0.26x, latency 0.61x vs onnx` (or why there is no comparison)."""
    if not comparison:
        return "not compared"
    if "error" in comparison:
        return f"comparison failed: {comparison['error']}"
    if comparison.get("size_ratio") is None:
        return comparison.get("reason", "no reference")
    text = f"size {comparison['size_ratio']:.2f}x"
    if comparison.get("latency_ratio") is not None:
        text += f", latency {comparison['latency_ratio']:.2f}x"
    reference = comparison.get("reference") or ""
    return text + (f" vs {reference}" if not reference.startswith("fp32 export") else " vs fp32 (throwaway export)")
