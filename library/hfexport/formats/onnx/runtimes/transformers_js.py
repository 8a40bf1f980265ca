"""transformers.js (`@huggingface/transformers` on Node) on an ONNX generation export: `AutoModelForCausalLM`
opens the export laid out as its users' Hub repo (config.json at the root with the `transformers.js_config` the
publication writes, the graph in `onnx/model{suffix}.onnx` + its `_data`, a quantized or fp16 target under its dtype's
suffix) with the `dtype` alone, then greedy `generate` on each prompt's token ids (batch 1) and on all prompts in one
left-padded batch. A quantized target is judged by its token agreement floor, as the gate judges it. transformers.js
builds the first step's empty past from the graph's input metadata (`batch_size` is the batch, every other symbol 0),
which `hfexport.formats.onnx.decoder_contract` writes. An encoder-decoder (`onnx/encoder_model.onnx` +
`onnx/decoder_model_merged.onnx`, `hfexport.formats.onnx.seq2seq_contract`) runs in `AutoModelForSeq2SeqLM` on its encoder's token ids
(batch 1 and one right-padded batch), Whisper in `AutoModelForSpeechSeq2Seq` on its `input_features`. A LLaVA-class
vision-language export (`onnx/vision_encoder.onnx` + `onnx/embed_tokens.onnx` + `onnx/decoder_model_merged.onnx`,
`hfexport.formats.onnx.image_text_contract`) runs in `AutoModelForImageTextToText` on each prompt's token ids and
`pixel_values` (batch 1: the image encoder is traced on one prompt's images)."""

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
    judge_tokens,
    run_client,
    runtime_environment,
)
from hfexport.deployment._python import judge, request_payload
from hfexport.formats.onnx.backend import transformers_js_config, transformers_js_dtype
from hfexport.formats.onnx.decoder_contract import MODEL_FILE, stage_as
from hfexport.formats.onnx.runtimes import NOT_IN_CONTRACT, NOT_IN_SEQ2SEQ_CONTRACT, exported_config
from hfexport.formats.onnx.image_text_contract import FILES as IMAGE_TEXT_FILES
from hfexport.formats.onnx.image_text_contract import BOOL_INPUTS, IMAGE_INPUTS
from hfexport.formats.onnx.seq2seq_contract import DECODER_FILE

RUNTIME = "transformers.js"
CLIENT = Path(__file__).resolve().parent / "clients" / "transformers_js_generate.mjs"
PACKAGE = Path("node_modules") / "@huggingface" / "transformers"
#: The files of an export transformers.js reads from the repo's root (the graph it reads from `onnx/`).
ROOT_FILES = ("config.json", "generation_config.json", "tokenizer.json", "tokenizer_config.json",
              "preprocessor_config.json")


#: transformers.js 4.3.2's decoders: the model types of its MODEL_FOR_CAUSAL_LM_MAPPING_NAMES (src/models/registry.js).
CAUSAL_LM_TYPES = (
    "bloom", "gpt2", "gpt_oss", "jais", "gptj", "gpt_bigcode", "gpt_neo", "gpt_neox", "codegen", "llama", "nanochat",
    "apertus", "llama4_text", "arcee", "afmoe", "lfm2", "lfm2_moe", "lfm3", "smollm3", "exaone", "olmo", "olmo2",
    "olmo3", "olmo_hybrid", "mobilellm", "granite", "granitemoehybrid", "cohere", "cohere2", "gemma", "gemma2",
    "vaultgemma", "gemma3_text", "gemma3", "helium", "glm", "glm_moe_dsa", "openelm", "qwen2", "qwen2_moe", "qwen3",
    "qwen3_moe", "qwen3_next", "qwen2_vl", "qwen2_5_vl", "qwen3_vl", "qwen3_vl_moe", "qwen3_5", "qwen3_5_text",
    "qwen3_5_moe", "gemma3n", "gemma4", "phi", "phi3", "mpt", "opt", "mbart", "mistral", "mistral4", "ministral",
    "ministral3", "ernie4_5", "starcoder2", "deepseek_v3", "deepseek_v4", "falcon", "falcon_h1", "nemotron_h", "trocr",
    "solar_open", "stablelm", "modernbert-decoder", "hunyuan_v1_dense", "youtu", "zaya", "hrm_text", "phi3_v")
#: transformers.js 4.3.2's vision-language models: the model types of its MODEL_FOR_IMAGE_TEXT_TO_TEXT_MAPPING_NAMES
#: (src/models/registry.js), opened by `AutoModelForImageTextToText`.
IMAGE_TEXT_TO_TEXT_TYPES = (
    "llava", "llava_onevision", "moondream1", "florence2", "qwen2_vl", "qwen2_5_vl", "qwen3_vl", "qwen3_vl_moe",
    "qwen3_5", "qwen3_5_moe", "lfm2_vl", "lfm3_vl", "idefics3", "smolvlm", "paligemma", "llava_qwen2", "gemma3",
    "gemma3n", "gemma4", "mistral3", "lighton_ocr", "glm_ocr")
#: Why transformers.js does not check a VLM export without the image-text-to-text layout.
NOT_IN_IMAGE_TEXT_CONTRACT = (
    "not in transformers.js' image-text-to-text layout (vision_encoder.onnx + embed_tokens.onnx + "
    "decoder_model_merged.onnx): hfexport writes it for an image encoder on pixel_values (and pixel_attention_mask) "
    "and one position per token (LLaVA, Idefics3/SmolVLM), or on packed patches with image_grid_thw and three-axis "
    "rope positions (Qwen2-VL; hfexport.formats.onnx.image_text_contract), not for image sizes")


def limitation(config: dict) -> str | None:
    """Why transformers.js cannot generate with a decoder of this `config.json`, known before the export (None:
    nothing known): a model type its AutoModelForCausalLM does not map, which it refuses by name (a vision-language
    config, one with a `vision_config`: its AutoModelForImageTextToText), or a `multi_query` config, whose past it feeds
    as one fused tensor per layer."""
    model_type = config.get("model_type")
    if config.get("is_encoder_decoder") or not model_type or model_type in IMAGE_TEXT_TO_TEXT_TYPES:
        return None  # an image-text-to-text model: its layout is known at the gate (`NOT_IN_IMAGE_TEXT_CONTRACT`)
    if isinstance(config.get("vision_config"), dict):
        return "refused before export: " + unsupported_image_text(model_type)
    if model_type not in CAUSAL_LM_TYPES:
        return (f"refused before export: transformers.js 4.3.2's AutoModelForCausalLM throws \"Unsupported model "
                f"type: {model_type}\" (src/models/auto/modeling_auto.js): {model_type!r} is not in its "
                "MODEL_FOR_CAUSAL_LM_MAPPING_NAMES (src/models/registry.js)")
    if config.get("multi_query"):
        return ("refused before export: config.json says multi_query, and transformers.js 4.3.2 then feeds the past "
                "as one fused `past_key_values.{i}.key_value` tensor per layer (gpt_bigcode's layout; getKeyValueNames, "
                "src/configs.js), where the graph takes `past_key_values.{i}.key` and `.value` (\"Missing the "
                "following inputs: past_key_values.0.key, ...\")")
    return None


def check_generation(folder: Path, request: GenerationRequest) -> RuntimeCheck:
    folder = Path(folder).resolve()
    if IMAGE_INPUTS & set(request.extra):
        return _check_image_text(folder, request)
    seq2seq = request.is_encoder_decoder
    graph = DECODER_FILE if seq2seq else MODEL_FILE
    if not (folder / graph).is_file():
        return RuntimeCheck(RUNTIME, NOT_CHECKED, reason=NOT_IN_SEQ2SEQ_CONTRACT if seq2seq else NOT_IN_CONTRACT)
    refused = limitation(exported_config(folder))
    if refused:
        return RuntimeCheck(RUNTIME, NOT_CHECKED, reason=refused)
    dtype = "fp32" if seq2seq else transformers_js_dtype(request.file_name)
    if dtype is None:
        return RuntimeCheck(RUNTIME, NOT_CHECKED, reason=f"published as {request.file_name}, a name transformers.js "
                            "opens by no dtype (it opens onnx/model{suffix}.onnx: _fp16, _quantized, _q4, ...)")
    node, modules = _installed()
    if node is None:
        return RuntimeCheck(RUNTIME, NOT_CHECKED, reason=NOT_INSTALLED)
    # Whisper at batch 1 only: transformers.js 4.3's Whisper generate starts one decoder row (a batch of features:
    # "The encoder outputs have a different batch size (2) than the decoder inputs (1)"), and refuses decoder_input_ids
    # of more rows ("Unable to decode tensor with `batch size !== 1`").
    batched = request.padded_expected is not None and "input_features" not in request.extra
    batches = [1, len(request.prompts)] if batched else [1]
    payload = {**request_payload(request, padded=batched), "dtype": dtype,
               "external_data": seq2seq and (folder / (graph + "_data")).is_file()}
    with tempfile.TemporaryDirectory(prefix="hfexport-transformers-js-") as scratch:
        stage = Path(scratch)
        repo = stage / "models" / "model"
        if seq2seq:  # the two graphs as they are
            repo.mkdir(parents=True)
            os.symlink(folder, repo / "onnx", target_is_directory=True)
        else:  # the graph under the name it is published under
            stage_as(folder, repo / "onnx", request.file_name)
        for name in ROOT_FILES:
            if (folder / name).is_file():
                shutil.copyfile(folder / name, repo / name)
        # config.json as the publication writes it: `transformers.js_config` names a decoder graph's external data, so
        # the client asks for nothing but the dtype (hfexport.formats.onnx.backend.transformers_js_config).
        if not seq2seq and (repo / "config.json").is_file():
            config = json.loads((repo / "config.json").read_text(encoding="utf-8"))
            names = [path.name for path in (repo / "onnx").iterdir()]
            (repo / "config.json").write_text(json.dumps(transformers_js_config(config, names)), encoding="utf-8")
        try:
            result = _run(node, modules, stage, payload, request)
        except RuntimeClientError as error:
            return RuntimeCheck(RUNTIME, FAILED, reason=str(error), batch_sizes=batches, precision=dtype)
    if not batched:
        return judge_tokens(RUNTIME, request, request.expected, [request.cut(tokens) for tokens in result["batch1"]],
                            version=result.get("version"), batch_sizes=batches, precision=dtype)
    return judge(RUNTIME, request, result, batches, precision=dtype)


NOT_INSTALLED = ("not installed (Node.js and `npm install @huggingface/transformers` in a folder named by "
                 "HFEXPORT_RUNTIME_TRANSFORMERS_JS)")


def _installed() -> tuple[str | None, str | None]:
    """(node, the folder holding node_modules/@huggingface/transformers), or (None, None) where either is missing."""
    modules = runtime_environment(RUNTIME)
    node = shutil.which("node")
    if not modules or not (Path(modules) / PACKAGE / "package.json").is_file() or node is None:
        return None, None
    return node, modules


def _run(node: str, modules: str, stage: Path, payload: dict, request: GenerationRequest) -> dict:
    """The client on `stage/models/model` (laid out as a Hub repo), with `payload` as its request."""
    os.symlink(Path(modules).resolve() / "node_modules", stage / "node_modules", target_is_directory=True)
    shutil.copyfile(CLIENT, stage / CLIENT.name)  # ESM resolves packages beside the script
    (stage / "request.json").write_text(json.dumps(payload), encoding="utf-8")
    return run_client([node, str(stage / CLIENT.name), str(stage / "models"), "model", str(stage / "request.json")],
                      timeout=request.timeout_s, cwd=stage)


def _tensor_type(array) -> str:
    """transformers.js' `Tensor` type of a processor output (float32 pixels, Idefics3's int64 or bool mask)."""
    kind = array.dtype.kind
    return "bool" if kind == "b" else "int64" if kind in "iu" else "float32"


def unsupported_image_text(model_type: str) -> str:
    """transformers.js' own refusal of a vision-language model type it does not map."""
    return (f"transformers.js 4.3.2's AutoModelForImageTextToText throws \"Unsupported model type: {model_type}\" "
            f"(src/models/auto/modeling_auto.js): {model_type!r} is not in its MODEL_FOR_IMAGE_TEXT_TO_TEXT_MAPPING_NAMES "
            "(src/models/registry.js)")


def prompt_images(images: dict, prompts: int) -> list[dict] | None:
    """Each prompt's image inputs, as its processor makes them for that prompt alone: a slice of the batch axis, or,
    for packed patches with image grids (Qwen2-VL-class: `pixel_values` `[patches, features]`, `image_grid_thw`
    `[images, 3]`), the prompt's grid and its patches (one image per prompt; None where the grids are not so)."""
    import numpy as np

    grids = images.get("image_grid_thw")
    if grids is None:
        return [{name: value[row : row + 1] for name, value in images.items()} for row in range(prompts)]
    if len(grids) != prompts:
        return None
    ends = np.cumsum(np.prod(grids, axis=-1))
    starts = np.concatenate([[0], ends[:-1]])
    return [{"pixel_values": images["pixel_values"][start:end], "image_grid_thw": grids[row : row + 1]}
            for row, (start, end) in enumerate(zip(starts, ends, strict=True))]


def _check_image_text(folder: Path, request: GenerationRequest) -> RuntimeCheck:
    """A vision-language export in `AutoModelForImageTextToText` (fp32), each prompt with its own images (batch 1)."""
    config = exported_config(folder)
    refused = limitation(config)  # a vision-language type it does not map: as the plan said before the export
    if refused:
        return RuntimeCheck(RUNTIME, NOT_CHECKED, reason=refused)
    if not all((folder / name).is_file() for name in IMAGE_TEXT_FILES):
        return RuntimeCheck(RUNTIME, NOT_CHECKED, reason=NOT_IN_IMAGE_TEXT_CONTRACT)
    node, modules = _installed()
    if node is None:
        return RuntimeCheck(RUNTIME, NOT_CHECKED, reason=NOT_INSTALLED)
    rows = prompt_images({name: request.extra[name] for name in sorted(IMAGE_INPUTS & set(request.extra))},
                         len(request.prompts))
    if rows is None:
        return RuntimeCheck(RUNTIME, NOT_CHECKED, reason="the sample prompts do not hold one image grid each "
                            "(`image_grid_thw` rows), so their packed patches cannot be handed over per prompt")
    payload = {**request_payload(request, padded=False), "dtype": "fp32", "image_text": True,
               "images": [{name: {"dims": list(value.shape),
                                  "dtype": "bool" if name in BOOL_INPUTS else _tensor_type(value),
                                  "data": value.ravel().tolist()}
                           for name, value in row.items()} for row in rows]}
    with tempfile.TemporaryDirectory(prefix="hfexport-transformers-js-") as scratch:
        stage = Path(scratch)
        repo = stage / "models" / "model"
        repo.mkdir(parents=True)
        os.symlink(folder, repo / "onnx", target_is_directory=True)
        for name in ROOT_FILES:
            if (folder / name).is_file():
                shutil.copyfile(folder / name, repo / name)
        # config.json as the publication writes it: `transformers.js_config` names each graph's external data
        (repo / "config.json").write_text(json.dumps(transformers_js_config(
            config, [path.name for path in folder.iterdir()])), encoding="utf-8")
        try:
            result = _run(node, modules, stage, payload, request)
        except RuntimeClientError as error:
            return RuntimeCheck(RUNTIME, FAILED, reason=str(error), batch_sizes=[1], precision="fp32")
    return judge_tokens(RUNTIME, request, request.expected, [request.cut(tokens) for tokens in result["batch1"]],
                        version=result.get("version"), batch_sizes=[1], precision="fp32")
