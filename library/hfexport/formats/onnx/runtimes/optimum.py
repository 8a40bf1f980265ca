"""optimum's `ORTModelForCausalLM` on an ONNX generation export, in optimum's own environment (transformers 4.57):
`from_pretrained(folder, file_name=...)` opens the graph by the name it is published under (`model.onnx`, or a
quantized/fp16 variant's `model_quantized.onnx`, `model_fp16.onnx`, each with its `_data`), then greedy `generate` on
each prompt's token ids (batch 1) and on all prompts in one left-padded batch; a quantized target is judged by its
token agreement floor, as the gate judges it. An encoder-decoder (`encoder_model.onnx` + `decoder_model_merged.onnx`,
`hfexport.formats.onnx.seq2seq_contract`) runs in `ORTModelForSeq2SeqLM` on its encoder's token ids (batch 1, and one right-padded
batch), Whisper in `ORTModelForSpeechSeq2Seq` on its `input_features`."""

from __future__ import annotations

import tempfile
from pathlib import Path

from hfexport.deployment import (
    FAILED,
    NOT_CHECKED,
    GenerationRequest,
    RuntimeCheck,
    RuntimeClientError,
)
from hfexport.deployment._python import interpreter, judge, request_payload, run_python_client
from hfexport.formats.onnx.decoder_contract import stage_as
from hfexport.formats.onnx.runtimes import NOT_IN_CONTRACT, NOT_IN_SEQ2SEQ_CONTRACT, exported_config, variant_dtype
from hfexport.formats.onnx.seq2seq_contract import DECODER_FILE

RUNTIME = "optimum"
CLIENT = Path(__file__).resolve().parent / "clients" / "optimum_generate.py"
#: The decoders whose empty past optimum-onnx 0.1.0 makes `config.head_dim` wide (ORTModelForCausalLM.__init__,
#: optimum/onnxruntime/modeling_decoder.py); every other decoder's past is `hidden_size // num_attention_heads` wide.
READS_HEAD_DIM = ("gemma", "gemma3_text", "gpt_oss", "nemotron")
DERIVED_HEAD_DIM = (
    "optimum-onnx 0.1.0 makes the empty past's head size `self.config.hidden_size // self.config.num_attention_heads` "
    "for every decoder but gemma, gemma3_text, gpt_oss and nemotron (ORTModelForCausalLM.__init__, "
    "optimum/onnxruntime/modeling_decoder.py), so its first decode step would feed the graph a past of the wrong size")
#: The decoders whose empty past optimum-onnx 0.1.0 gives `config.num_key_value_heads` heads (the same __init__; falcon
#: and gpt_bigcode by their multi-query flags); every other decoder's past has `num_attention_heads`.
READS_KV_HEADS = ("arcee", "deepseek_v3", "cohere", "gemma", "gemma3_text", "glm", "granite", "gpt_oss", "helium",
                  "mistral", "llama", "nemotron", "qwen2", "qwen3", "qwen3_moe", "smollm3", "stablelm", "falcon",
                  "gpt_bigcode")
DERIVED_KV_HEADS = (
    "optimum-onnx 0.1.0 gives the empty past `self.config.num_attention_heads` heads (`self.num_key_value_heads = "
    "self.config.num_attention_heads`) for every decoder but {types} (ORTModelForCausalLM.__init__, "
    "optimum/onnxruntime/modeling_decoder.py), so its first decode step would feed the graph a past of the wrong size")


def limitation(config: dict) -> str | None:
    """Why optimum cannot generate with a decoder of this `config.json`, known from the config alone before the
    export starts (None: nothing known). General rules, not a list of models: fewer key-value heads than heads, or a
    head size that is not hidden/heads, in a decoder whose count or size optimum derives (its own type lists)."""
    model_type = config.get("model_type")
    if config.get("is_encoder_decoder"):
        return None
    head_dim, hidden, heads = config.get("head_dim"), config.get("hidden_size"), config.get("num_attention_heads")
    kv_heads = config.get("num_key_value_heads")
    if (model_type not in READS_KV_HEADS and isinstance(kv_heads, int) and isinstance(heads, int)
            and kv_heads != heads):
        return (f"refused before export: config.json has {kv_heads} key-value heads for {heads} attention heads, "
                f"and {DERIVED_KV_HEADS.format(types=', '.join(READS_KV_HEADS))}")
    if model_type in READS_HEAD_DIM or not all(isinstance(value, int) and value > 0
                                                for value in (head_dim, hidden, heads)):
        return None
    if hidden // heads == head_dim:
        return None
    return (f"refused before export: config.json's head_dim is {head_dim}, hidden_size / num_attention_heads is "
            f"{hidden} / {heads} = {hidden // heads}, and {DERIVED_HEAD_DIM}")


def check_generation(folder: Path, request: GenerationRequest) -> RuntimeCheck:
    if request.is_encoder_decoder and not (Path(folder) / DECODER_FILE).is_file():
        return RuntimeCheck(RUNTIME, NOT_CHECKED, reason=NOT_IN_SEQ2SEQ_CONTRACT)
    if not request.is_encoder_decoder and not (Path(folder) / "model.onnx").is_file():
        return RuntimeCheck(RUNTIME, NOT_CHECKED, reason=NOT_IN_CONTRACT)
    refused = limitation(exported_config(folder))
    if refused:
        return RuntimeCheck(RUNTIME, NOT_CHECKED, reason=refused)
    python = interpreter(RUNTIME, "optimum.onnxruntime")
    if python is None:
        return RuntimeCheck(RUNTIME, NOT_CHECKED, reason="not installed (pip install optimum-onnx[onnxruntime], or set "
                            "HFEXPORT_RUNTIME_OPTIMUM to its python)")
    batches = [1, len(request.prompts)] if request.padded_expected is not None else [1]
    payload = {**request_payload(request, padded=True), "file_name": request.file_name}
    precision = variant_dtype(request)
    with tempfile.TemporaryDirectory(prefix="hfexport-optimum-") as scratch:
        # An encoder-decoder's files are read as they are; a decoder's graph under the name it is published under.
        staged = Path(folder) if request.is_encoder_decoder else stage_as(Path(folder), Path(scratch) / "onnx",
                                                                           request.file_name)
        try:
            result = run_python_client(python, CLIENT, staged, payload, request.timeout_s)
        except RuntimeClientError as error:
            return RuntimeCheck(RUNTIME, FAILED, reason=str(error), batch_sizes=batches, precision=precision)
    return judge(RUNTIME, request, result, batches, precision=precision)
