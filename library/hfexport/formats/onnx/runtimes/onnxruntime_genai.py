"""onnxruntime-genai on an ONNX generation export: `og.Model(folder)` reads the `genai_config.json` hfexport writes
beside `model.onnx` (`hfexport.formats.onnx.decoder_contract`), then greedy `og.Generator` runs on each prompt's token ids. A quantized
or fp16 variant (`model_quantized.onnx` beside `model.onnx` in `onnx/`, whose `genai_config.json` names `model.onnx`)
is opened as its users select it: `og.Config(folder)` with `config.overlay('{"model": {"decoder": {"filename":
"model_quantized.onnx"}}}')` (and `"search": {"past_present_share_buffer": true}` for a variant whose attention is
fused: `decoder_contract.genai_overlay`), and judged by the target's token agreement floor.

Batch 1 only: onnxruntime-genai gives the real tokens of a left-padded row their absolute column as position
(src/models/position_inputs.cpp, "iterate backwards as to not misinterpret any right pad tokens"), where
`model.generate` counts from each row's first real token, so its padded batch computes another (rotary-equivalent,
not bit-equal) function and is not a token-exact check. Its sequence stops before the EOS token that ended it (where
`model.generate` keeps it), so a final EOS is left out of both sides of the comparison.
"""

from __future__ import annotations

import tempfile
from pathlib import Path

from hfexport.deployment import FAILED, NOT_CHECKED, GenerationRequest, RuntimeCheck, RuntimeClientError, judge_tokens
from hfexport.deployment._python import interpreter, request_payload, run_python_client
from hfexport.formats.onnx.decoder_contract import genai_overlay, stage_as
from hfexport.formats.onnx.runtimes import NOT_IN_CONTRACT, variant_dtype

RUNTIME = "onnxruntime-genai"
#: Why an encoder-decoder is not checked (onnxruntime-genai 0.18's model types: src/models/model_type.h; its Whisper
#: layout: models/builders/whisper.py).
SEQ2SEQ_REASON = {"whisper": (
    "not built: onnxruntime-genai 0.18's whisper model takes an encoder that also outputs each layer's cross-attention "
    "cache (present_key_cross_{i}, present_value_cross_{i}) and a decoder fed it as past_key_cross_{i}, without "
    "encoder_hidden_states (its model builder's layout); hfexport's decoder_model_merged.onnx (optimum's and "
    "transformers.js' layout) computes that cache in its first step")}
SEQ2SEQ_OTHER = ("not a model type of onnxruntime-genai 0.18 (its encoder-decoders are whisper and marian-ssru, "
                 "each in its model builder's own layout)")
CLIENT = Path(__file__).resolve().parent / "clients" / "onnxruntime_genai_generate.py"


def check_generation(folder: Path, request: GenerationRequest) -> RuntimeCheck:
    if request.is_encoder_decoder:
        return RuntimeCheck(RUNTIME, NOT_CHECKED, reason=SEQ2SEQ_REASON.get(request.model_type, SEQ2SEQ_OTHER))
    if not (Path(folder) / "genai_config.json").is_file():
        return RuntimeCheck(RUNTIME, NOT_CHECKED, reason=NOT_IN_CONTRACT)
    python = interpreter(RUNTIME, "onnxruntime_genai")
    if python is None:
        return RuntimeCheck(RUNTIME, NOT_CHECKED, reason="not installed (pip install onnxruntime-genai, or set "
                            "HFEXPORT_RUNTIME_ONNXRUNTIME_GENAI to its python)")
    precision = variant_dtype(request)
    payload = request_payload(request, padded=False)
    with tempfile.TemporaryDirectory(prefix="hfexport-genai-") as scratch:
        staged = stage_as(Path(folder), Path(scratch) / "onnx", request.file_name)
        payload["overlay"] = genai_overlay(staged / request.file_name)  # as the README's snippet overlays it
        try:
            result = run_python_client(python, CLIENT, staged, payload, request.timeout_s)
        except RuntimeClientError as error:
            return RuntimeCheck(RUNTIME, FAILED, reason=str(error), batch_sizes=[1], precision=precision)
    # Its sequence ends before the EOS token it stopped at: compared without a final EOS on both sides.
    got = [_without_eos(request.cut(tokens), request) for tokens in result["batch1"]]
    expected = [_without_eos(tokens, request) for tokens in request.expected]
    return judge_tokens(RUNTIME, request, expected, got, version=result.get("version"), batch_sizes=[1],
                        precision=precision)


def _without_eos(tokens: list[int], request: GenerationRequest) -> list[int]:
    return tokens[:-1] if tokens and tokens[-1] in request.eos_token_id else tokens
