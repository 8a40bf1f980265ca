"""The runtime a verdict holds for: the CPU (model and the ISA features that change numerics), each backend's
device, and the precision the backend really computes at, read back from it rather than assumed.

Why this is a concept of its own: the same OpenVINO IR computes in float32 on a CPU without bf16 and in bfloat16 by
default on one with AVX512-BF16/AMX (the CPU plugin's `INFERENCE_PRECISION_HINT`), and ONNX Runtime's int8 kernels
saturate on AVX2/AVX512 CPUs without VNNI. A parity verdict therefore names where it was reached (docs/parity.md).

A recipe target may pin the precision its artifacts run at (`runtime.precision`, schema-validated); `hfexport.load`
applies that pin by default and verification checks exactly what the user will get.
"""

from __future__ import annotations

import functools
import os
import platform
from pathlib import Path

from hfexport.formats import find_format, format_traits, formats

# Precisions a recipe may pin (OpenVINO's: hfexport.formats.openvino.backend.PRECISIONS); "auto" is the device's own default (bf16 on OpenVINO's CPU
# plugin where the CPU has it). Per format, its `runtime_precisions`: the others run the graph's own element types.
PRECISION_FORMATS = {backend.name: backend.runtime_precisions for backend in formats()}


# /proc/cpuinfo flag -> the name reports use. Only features that change what a kernel computes (or whether it can).
NUMERIC_FEATURES = {
    "avx2": "AVX2",
    "fma": "FMA",
    "avx512f": "AVX512F",
    "avx512_vnni": "AVX512-VNNI",
    "avx_vnni": "AVX-VNNI",
    "avx512_bf16": "AVX512-BF16",
    "avx512_fp16": "AVX512-FP16",
    "amx_bf16": "AMX-BF16",
    "amx_int8": "AMX-INT8",
    "amx_fp16": "AMX-FP16",
    "asimd": "NEON",
    "sve": "SVE",
    "bf16": "BF16",
    "i8mm": "I8MM",
}


@functools.cache
def cpu_info() -> dict:
    """`{"model", "machine", "logical_cpus", "features", "bf16", "fp16", "vnni", "amx", "int8_path"}` of this CPU.

    Read from /proc/cpuinfo (Linux); elsewhere the model is `platform.processor()` and the features are unknown
    (an empty list, and `int8_path` says so)."""
    model, flags = read_cpuinfo(Path("/proc/cpuinfo"))
    features = [name for flag, name in NUMERIC_FEATURES.items() if flag in flags]
    known = bool(flags)
    return {
        "model": model or platform.processor() or platform.machine() or "unknown",
        "machine": platform.machine(),
        "logical_cpus": os.cpu_count() or 1,
        "features": features,
        "features_known": known,
        "bf16": any(name in features for name in ("AVX512-BF16", "AMX-BF16", "BF16")),
        "fp16": any(name in features for name in ("AVX512-FP16", "AMX-FP16")),
        "vnni": any(name in features for name in ("AVX512-VNNI", "AVX-VNNI", "AMX-INT8")),
        "amx": any(name.startswith("AMX") for name in features),
        "int8_path": int8_kernel_path(features, known),
    }


def read_cpuinfo(path: Path) -> tuple[str | None, set[str]]:
    try:
        text = path.read_text(errors="replace")
    except OSError:
        return None, set()
    model, flags = None, set()
    for line in text.splitlines():
        key, _, value = line.partition(":")
        key = key.strip().lower()
        if key == "model name" and model is None:
            model = value.strip()
        elif key in ("flags", "features") and not flags:  # x86 "flags", arm64 "Features"
            flags = set(value.split())
    return model, flags


def int8_kernel_path(features: list[str], known: bool = True) -> str:
    """The int8 matmul path x86 kernels (ONNX Runtime's MLAS, oneDNN) take on a CPU with `features`. ONNX Runtime does
    not report its kernel choice, so this is derived from the CPU's features; without VNNI, u8*s8 products are summed
    in 16 bits (VPMADDUBSW) and can saturate (ONNX Runtime's quantization docs)."""
    if not known:
        return "unknown (CPU features not readable)"
    if "AMX-INT8" in features:
        return "AMX-INT8 (no saturation)"
    if "AVX512-VNNI" in features or "AVX-VNNI" in features:
        return "VNNI (no saturation)"
    if "AVX512F" in features or "AVX2" in features:
        return "AVX2/AVX512 without VNNI (u8s8 can saturate; u8u8 and reduce_range do not)"
    if "NEON" in features:
        return "NEON"
    return "generic"


def summary_line(cpu: dict | None = None) -> str:
    """`Intel(R) Xeon(R) ... (AVX2, AVX512F, AVX512-VNNI, AMX-INT8, ...)`: the CPU as one line for reports."""
    cpu = cpu or cpu_info()
    features = ", ".join(cpu.get("features") or []) or "features unknown"
    return f"{cpu.get('model', 'unknown')} ({features})"


# ── Load options: the recipe's pin -> the backend's runner arguments ─────────


def has_runtime_precision(export_format: str) -> bool:
    """Whether the format's runtime can compute at another precision than the graph's (OpenVINO)."""
    return len(format_traits(export_format).runtime_precisions) > 2


def pinned_precision(runtime_section: dict | None) -> str:
    """The precision a target's `runtime` section pins ("auto" when it pins none)."""
    return (runtime_section or {}).get("precision", "auto")


def load_options(export_format: str, precision: str | None) -> dict:
    """Runner arguments for `ExportedModel.from_pretrained` that make `export_format` run at `precision`.

    OpenVINO: `INFERENCE_PRECISION_HINT` ("auto" leaves the device default). The other formats run the graph's own
    element types on CPU, so they take no option (the recipe schema allows them only "auto"/"f32")."""
    backend = find_format(export_format)
    return backend.load_options(precision) if backend else {}


# ── Reading back what a loaded export runs at ────────────────────────────────


_OV_TYPES = {"f32": "f32", "float32": "f32", "bf16": "bf16", "bfloat16": "bf16", "f16": "f16", "float16": "f16"}


def _openvino_precision(compiled) -> str | None:
    """`INFERENCE_PRECISION_HINT` of a compiled OpenVINO model, as `f32`/`bf16`/`f16` (None where the device does
    not expose it, e.g. AUTO)."""
    try:
        value = compiled.get_property("INFERENCE_PRECISION_HINT")
    except Exception:  # noqa: BLE001 - AUTO and some plugins do not expose the property
        return None
    text = str(getattr(value, "get_type_name", lambda: value)()).lower()
    for key, name in _OV_TYPES.items():
        if key in text:
            return name
    # `dynamic` (EXECUTION_MODE_HINT=ACCURACY): the graph's own types, f32 for hfexport's float32 exports.
    return "f32" if "dynamic" in text else text


def _openvino_devices(compiled) -> list[str]:
    try:
        return [str(device) for device in compiled.get_property("EXECUTION_DEVICES")]
    except Exception:  # noqa: BLE001 - informational
        return []


def read_back(exported) -> dict:
    """What the loaded `exported` model runs on, per component: backend, device(s) and precision, read from the
    runtime objects (OpenVINO's compiled model, ONNX Runtime's session providers)."""
    components = {name: _read_runner(runner, exported.components[name].program)
                  for name, runner in (getattr(exported, "runners", None) or {}).items()}
    return {"backend": _backend_name(exported), "components": components, "precision": joined_precision(components)}


def joined_precision(components: dict) -> str | None:
    """One precision for a read-back's `components` (`read_back`): theirs where they agree, else "+"-joined."""
    precisions = sorted({entry["precision"] for entry in components.values() if entry.get("precision")})
    return precisions[0] if len(precisions) == 1 else "+".join(precisions) or None


def read_openvino(compiled) -> dict:
    """A compiled OpenVINO model's device(s) and precision, as `read_back` reports a component (the gate's artifact
    process reads its own with it, `hfexport.formats.openvino.gate_process`)."""
    return {"device": ",".join(_openvino_devices(compiled)) or "unknown",
            "precision": _openvino_precision(compiled) or "unknown"}


def _backend_name(exported) -> str:
    export_format = getattr(exported.export_format, "value", exported.export_format)
    backend = find_format(export_format)
    return backend.runtime_package if backend else "unknown"


def _read_runner(runner, program) -> dict:
    compiled = getattr(runner, "compiled_model", None)
    if compiled is not None:  # OpenVINO
        return read_openvino(compiled)
    session = getattr(runner, "session", None)
    if session is not None and hasattr(session, "get_providers"):  # ONNX Runtime
        entry = {"device": "cpu" if session.get_providers() == ["CPUExecutionProvider"] else "accelerator",
                 "providers": list(session.get_providers()),
                 "precision": "f16" if _metadata_dtype(runner) == "f16" else "f32"}  # a float16 graph computes in it
        if _onnx_is_int8(program):
            entry["precision"] = "int8"
            entry["int8_path"] = cpu_info()["int8_path"]
            options = session.get_session_options() if hasattr(session, "get_session_options") else None
            entry["x64quantprecision"] = _session_config(options, "session.x64quantprecision")
        return entry
    dtype = _metadata_dtype(runner)
    return {"device": "cpu", "precision": dtype}


def _metadata_dtype(runner) -> str:
    dtype = getattr(getattr(runner, "metadata", None), "export_dtype", None) or "float32"
    return _OV_TYPES.get(str(dtype).removeprefix("torch."), str(dtype))


_INT8_OPS = {"MatMulInteger", "DynamicQuantizeLinear", "QLinearMatMul", "QGemm", "QAttention", "DynamicQuantizeMatMul",
             "MatMulIntegerToFloat", "QuantizeLinear"}


def _onnx_is_int8(program) -> bool:
    """Whether the loaded ONNX graph (the onnx_ir model the session was opened from) holds integer matmuls: ONNX
    Runtime's dynamic or static int8 quantization."""
    graph = getattr(program, "graph", None)
    return graph is not None and any(node.op_type in _INT8_OPS for node in graph)


def _session_config(options, key: str) -> str | None:
    try:
        return options.get_session_config_entry(key) or None
    except Exception:  # noqa: BLE001 - not set
        return None
