"""The deployment runtimes of ONNX exports: transformers.js, optimum, onnxruntime-genai; what they share."""

from __future__ import annotations

from pathlib import Path

from hfexport.deployment import GenerationRequest
from hfexport.files import read_json_object
from hfexport.formats.onnx.backend import transformers_js_dtype

#: Why a runtime does not check a folder without `model.onnx` + `genai_config.json` (hfexport.formats.onnx.decoder_contract).
NOT_IN_CONTRACT = ("not in the ONNX runtimes' layout (model.onnx with past_key_values.{i}.key inputs, "
                   "genai_config.json): the export keeps the engine's graphs (an encoder-decoder, a VLM, a state-space "
                   "decode, a prefill/decode pair, or a graph with inputs the runtimes do not feed)")

#: Why a runtime does not check an encoder-decoder folder without `decoder_model_merged.onnx` (hfexport.formats.onnx.seq2seq_contract).
NOT_IN_SEQ2SEQ_CONTRACT = ("not in the seq2seq runtimes' layout (encoder_model.onnx + decoder_model_merged.onnx): an "
                           "export saved before hfexport wrote it, or in another format's graphs")


def variant_dtype(request: GenerationRequest) -> str:
    """The precision a runtime's record names: transformers.js' dtype of the file the target is published under
    (`fp32`, `q8`, `fp16`, ...; `hfexport.formats.onnx.backend.transformers_js_dtype`), else the file name."""
    return transformers_js_dtype(request.file_name) or request.file_name


def exported_config(folder: Path) -> dict:
    """An export's config.json (beside its graph), which a runtime's `limitation(config)` reads at the gate as the
    plan read the model's before the export; {} where it cannot be read."""
    return read_json_object(Path(folder) / "config.json")
