"""transformers.js (`@huggingface/transformers` on Node) on an ONNX generation export: `AutoModelForCausalLM`
opens the export laid out as its users' Hub repo (config.json at the root, the graph in `onnx/model.onnx` +
`model.onnx_data`), then greedy `generate` on each prompt's token ids (batch 1) and on all prompts in one
left-padded batch. transformers.js builds the first step's empty past from the graph's input metadata (`batch_size`
is the batch, every other symbol 0), which `hfexport.onnx_contract` writes. An encoder-decoder
(`onnx/encoder_model.onnx` + `onnx/decoder_model_merged.onnx`, `hfexport.onnx_seq2seq`) runs in
`AutoModelForSeq2SeqLM` on its encoder's token ids (batch 1 and one right-padded batch), Whisper in
`AutoModelForSpeechSeq2Seq` on its `input_features`."""

from __future__ import annotations

import json
import os
import shutil
import tempfile
from pathlib import Path

from hfexport.deployment import (
    FAILED,
    NOT_CHECKED,
    GenerationRequest,
    RuntimeCheck,
    RuntimeClientError,
    compare_tokens,
    run_client,
    runtime_environment,
)
from hfexport.deployment._python import CLIENTS, NOT_IN_CONTRACT, NOT_IN_SEQ2SEQ_CONTRACT, judge, request_payload
from hfexport.onnx_seq2seq import DECODER_FILE

RUNTIME = "transformers.js"
CLIENT = "transformers_js_generate.mjs"
PACKAGE = Path("node_modules") / "@huggingface" / "transformers"
#: The files of an export transformers.js reads from the repo's root (the graph it reads from `onnx/`).
ROOT_FILES = ("config.json", "generation_config.json", "tokenizer.json", "tokenizer_config.json",
              "preprocessor_config.json")


def check(folder: Path, request: GenerationRequest) -> RuntimeCheck:
    folder = Path(folder).resolve()
    graph = DECODER_FILE if request.is_encoder_decoder else "model.onnx"
    if request.is_encoder_decoder and not (folder / graph).is_file():
        return RuntimeCheck(RUNTIME, NOT_CHECKED, reason=NOT_IN_SEQ2SEQ_CONTRACT)
    if not (folder / graph).is_file():
        return RuntimeCheck(RUNTIME, NOT_CHECKED, reason=NOT_IN_CONTRACT)
    modules = runtime_environment(RUNTIME)
    node = shutil.which("node")
    if not modules or not (Path(modules) / PACKAGE / "package.json").is_file() or node is None:
        return RuntimeCheck(RUNTIME, NOT_CHECKED, reason="not installed (Node.js and `npm install "
                            "@huggingface/transformers` in a folder named by HFEXPORT_RUNTIME_TRANSFORMERS_JS)")
    # Whisper at batch 1 only: transformers.js 4.3's Whisper generate starts one decoder row (a batch of features:
    # "The encoder outputs have a different batch size (2) than the decoder inputs (1)"), and refuses decoder_input_ids
    # of more rows ("Unable to decode tensor with `batch size !== 1`").
    batched = request.padded_expected is not None and "input_features" not in request.extra
    batches = [1, len(request.prompts)] if batched else [1]
    payload = {**request_payload(request, padded=batched), "dtype": "fp32",
               "external_data": (folder / (graph + "_data")).is_file()}
    with tempfile.TemporaryDirectory(prefix="hfexport-transformers-js-") as scratch:
        stage = Path(scratch)
        repo = stage / "models" / "model"
        repo.mkdir(parents=True)
        for name in ROOT_FILES:
            if (folder / name).is_file():
                shutil.copyfile(folder / name, repo / name)
        os.symlink(folder, repo / "onnx", target_is_directory=True)
        os.symlink(Path(modules).resolve() / "node_modules", stage / "node_modules", target_is_directory=True)
        shutil.copyfile(CLIENTS / CLIENT, stage / CLIENT)  # ESM resolves packages beside the script
        (stage / "request.json").write_text(json.dumps(payload), encoding="utf-8")
        try:
            result = run_client([node, str(stage / CLIENT), str(stage / "models"), "model", str(stage / "request.json")],
                                timeout=request.timeout_s, cwd=stage)
        except RuntimeClientError as error:
            return RuntimeCheck(RUNTIME, FAILED, reason=str(error), batch_sizes=batches)
    if not batched:
        return compare_tokens(RUNTIME, request.expected, [request.cut(tokens) for tokens in result["batch1"]],
                              version=result.get("version"), batch_sizes=batches)
    return judge(RUNTIME, request, result, batches)
