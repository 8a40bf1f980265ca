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

import json
import math
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from hfexport.errors import Problem
from hfexport.formats import format_traits
from hfexport.inputs import default_sample_spec

FILE_SUFFIXES = (".txt", ".jsonl", ".json", ".csv")  # calibration files the recipe may name
FIELD_SUFFIXES = (".jsonl", ".json", ".csv")  # ... of which these hold records with a text `field`

METHODS = ("ort_dynamic", "ort_static", "nncf_weights", "nncf_quantize", "pt2e")


# Which method runs on which export format (the engine's quantizer classes, see docs/quantization.md).
METHOD_FORMATS = {
    "ort_dynamic": ("onnx",),  # OnnxRuntimeQuantizer + OnnxRuntimeDynamicConfig, on the converted ONNX model
    "ort_static": ("onnx",),  # OnnxRuntimeQuantizer + OnnxRuntimeStaticConfig
    "nncf_weights": ("openvino", "onnx"),  # NNCFOpenVINOQuantizer / NNCFOnnxQuantizer + NNCFWeightCompressionConfig
    "nncf_quantize": ("openvino", "onnx"),  # NNCFOpenVINOQuantizer / NNCFOnnxQuantizer + NNCFQuantizationConfig
    "pt2e": ("dynamo", "onnx", "executorch", "openvino"),  # PT2EQuantizer on the FX graph; the preset narrows it
}



@dataclass(frozen=True)
class Pt2ePreset:
    """A named PT2E quantizer set-up: which torchao/ExecuTorch quantizer, how, and where its ops lower."""

    backend: str  # "xnnpack" | "x86_inductor"
    formats: tuple[str, ...]
    dynamic: bool
    per_channel: bool
    description: str


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


# ── Parameters: JSON in, library objects out ─────────────────────────────────


class Param:
    """One method parameter: what JSON it takes (`problem`) and the library value it becomes (`convert`)."""

    expected = ""

    def problem(self, value: Any) -> str | None:
        raise NotImplementedError

    def convert(self, value: Any) -> Any:
        return value


class Bool(Param):
    expected = "true or false"

    def problem(self, value):
        return None if isinstance(value, bool) else f"expected true or false, got {_show(value)}"


class Number(Param):
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


class Names(Param):
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


class Choice(Param):
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


class ScalarMap(Param):
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


class IgnoredScope(Param):
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
            elif Names().problem(item):
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
    "per_channel": Bool(),
    "reduce_range": Bool(),
    "op_types_to_quantize": Names(),
    "nodes_to_quantize": Names(),
    "nodes_to_exclude": Names(),
    "extra_options": ScalarMap(),
}


PARAMS: dict[str, dict[str, Param]] = {
    "ort_dynamic": {
        "weight_type": Choice(_ORT, "QuantType", {"int8": "QInt8", "uint8": "QUInt8"}),
        **_ORT_COMMON,
    },
    "ort_static": {
        "quant_format": Choice(_ORT, "QuantFormat", {"qdq": "QDQ", "qoperator": "QOperator"}),
        "activation_type": Choice(_ORT, "QuantType", {k: v for k, v in _ORT_TYPES.items() if "4" not in k}),
        "weight_type": Choice(_ORT, "QuantType", _ORT_TYPES),
        "calibrate_method": Choice(
            _ORT, "CalibrationMethod",
            {"minmax": "MinMax", "entropy": "Entropy", "percentile": "Percentile", "distribution": "Distribution"},
        ),
        **_ORT_COMMON,
    },
    "nncf_weights": {
        "mode": Choice("nncf", "CompressWeightsMode", _upper(*_NNCF_WEIGHT_MODES)),
        "ratio": Number(0, 1, low_open=True),
        "group_size": Number(1, 1 << 20, integer=True, also=(-1,)),
        "all_layers": Bool(),
        "sensitivity_metric": Choice("nncf", "SensitivityMetric", _upper(*_NNCF_METRICS)),
        "subset_size": Number(1, 100000, integer=True),
        "awq": Bool(),
        "scale_estimation": Bool(),
        "gptq": Bool(),
        "lora_correction": Bool(),
        "backup_mode": Choice("nncf", "BackupMode", _upper("none", "int8_sym", "int8_asym")),
        "ignored_scope": IgnoredScope(),
    },
    "nncf_quantize": {
        "mode": Choice("nncf", "QuantizationMode", _upper("fp8_e4m3", "fp8_e5m2")),
        "preset": Choice("nncf", "QuantizationPreset", _upper("performance", "mixed")),
        "target_device": Choice("nncf", "TargetDevice", _upper("any", "cpu", "gpu", "npu", "cpu_spr")),
        "subset_size": Number(1, 100000, integer=True),
        "fast_bias_correction": Bool(),
        "model_type": Choice("nncf", "ModelType", _upper("transformer")),
        "ignored_scope": IgnoredScope(),
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
    lowerings = format_traits(export_format).quantized_lowerings  # ExecuTorch's: XNNPACK
    if lowerings is not None:
        backend = (options or {}).get("backend", "xnnpack")
        if backend not in lowerings:
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
    if method == "nncf_weights" and format_traits(export_format).nncf_onnx_limits:
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


def sample_texts(sample_inputs: dict, task: str | None = None) -> list[str] | None:
    """The recipe's sample texts (the task's default ones when it has no sample inputs) when texts are all its sample
    inputs are; else None: calibrate on the one input batch."""
    sample_inputs = sample_inputs or default_sample_spec(task)
    texts = sample_inputs.get("text")
    return list(texts) if texts and set(sample_inputs) <= {"text", "max_length"} else None
