"""ONNX as the layers see it: `onnx/model.onnx` (+ `model.onnx_data`), run by ONNX Runtime, deployed by transformers.js,
optimum and onnxruntime-genai; variants under transformers.js' dtype names (`model_quantized.onnx`, ...)."""

from __future__ import annotations

from hfexport.formats.backend import COMMON_OPTIONS, FormatBackend, register_format

#: The external data file name the loaders download next to `model.onnx` (optimum, transformers.js: `<file>_data`).
ONNX_DATA_SUFFIX = "_data"
EIGHT_BIT_WEIGHTS = ("int8_sym", "int8_asym")
FOUR_BIT_WEIGHTS = ("int4_sym", "int4_asym")


def onnx_data_name(model_file: str) -> str:
    """`model.onnx` -> `model.onnx_data`: the external data name optimum and transformers.js download."""
    return model_file + ONNX_DATA_SUFFIX


@register_format
class OnnxFormat(FormatBackend):
    name = "onnx"
    label = "ONNX"
    runtime_label = "ONNX Runtime"
    runtime_package = "onnxruntime"
    folder = "onnx"
    default_file = "model.onnx"
    companion_files = (onnx_data_name("model.onnx"),)
    hub_tag = "onnx"
    extra = "onnx"
    packages = ("onnx", "onnxscript", "onnxruntime")
    target_name = "onnx"
    options = (*COMMON_OPTIONS, "opset_version", "optimize", "ort_fusions")
    memory_factor = 4.0
    export_cost = 1.5
    runtimes = ("hfexport.formats.onnx.runtimes.transformers_js", "hfexport.formats.onnx.runtimes.optimum",
                "hfexport.formats.onnx.runtimes.onnxruntime_genai")
    one_decoder_graph = True
    converts_to_float16 = True
    generation_variants = True
    nncf_onnx_limits = True

    def program_files(self, file: str) -> list[tuple[str, bool]]:
        # external data: `.data` as the engine writes it, `_data` as publications name it
        return [(file, True), (f"{file}.data", False), (f"{file}_data", False)]

    def published_file(self, relative: str) -> str:
        # the engine's external data `X.onnx.data` is published as `X.onnx_data`
        return onnx_data_name(relative.removesuffix(".data")) if relative.endswith(".onnx.data") else relative

    def artifact_name(self, quantization: dict | None = None, dtype: str | None = None) -> str | None:
        if not quantization:
            return "model_fp16.onnx" if dtype in ("float16", "torch.float16") else self.default_file
        method, params = quantization.get("method"), quantization.get("params") or {}
        if method == "ort_dynamic" or method == "ort_static" and params.get("weight_type", "int8") in ("int8", "uint8") \
                and params.get("activation_type", "uint8") in ("int8", "uint8"):
            return "model_quantized.onnx"
        if method == "ort_static" and params.get("weight_type") in ("int4", "uint4"):
            return "model_q4.onnx"
        if method == "nncf_weights":
            mode = params.get("mode", "int8_asym")
            return "model_quantized.onnx" if mode in EIGHT_BIT_WEIGHTS else \
                "model_q4.onnx" if mode in FOUR_BIT_WEIGHTS else None
        if method == "nncf_quantize" and not params.get("mode") or \
                method == "pt2e" and quantization.get("preset") == "x86_inductor_int8_static":
            return "model_quantized.onnx"
        return None
