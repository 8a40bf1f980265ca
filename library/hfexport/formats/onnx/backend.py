"""ONNX as the layers see it: `onnx/model.onnx` (+ `model.onnx_data`), run by ONNX Runtime, deployed by transformers.js,
optimum and onnxruntime-genai; variants under transformers.js' dtype names (`model_quantized.onnx`, ...)."""

from __future__ import annotations

import re

from hfexport.formats.backend import (
    COMMON_OPTIONS,
    EMBEDDING_TASKS,
    IMAGE_TEXT_TASK,
    CardTarget,
    FormatBackend,
    register_format,
)

#: The external data file name the loaders download next to `model.onnx` (optimum, transformers.js: `<file>_data`).
ONNX_DATA_SUFFIX = "_data"
EIGHT_BIT_WEIGHTS = ("int8_sym", "int8_asym")
FOUR_BIT_WEIGHTS = ("int4_sym", "int4_asym")
#: transformers.js' `dtype` -> the suffix of the ONNX file it opens (`onnx/model{suffix}.onnx`), as
#: `DEFAULT_DTYPE_SUFFIX_MAPPING` in @huggingface/transformers 4.3.2's src/utils/dtypes.js (q8 is `_quantized`).
TRANSFORMERS_JS_SUFFIXES = {"fp32": "", "fp16": "_fp16", "int8": "_int8", "uint8": "_uint8", "q8": "_quantized",
                            "q4": "_q4", "q2": "_q2", "q1": "_q1", "q4f16": "_q4f16", "q2f16": "_q2f16",
                            "q1f16": "_q1f16", "bnb4": "_bnb4"}

#: transformers.js' `dtype` for each ONNX file name it knows (`onnx/model<suffix>.onnx`), by the name's stem.
TRANSFORMERS_JS_DTYPES = {None: "fp32", **{f"model{suffix}": dtype for dtype, suffix in TRANSFORMERS_JS_SUFFIXES.items()
                                            if suffix}}
#: The graphs transformers.js opens for an image-text-to-text model at dtype fp32 (its `MODEL_TYPES.ImageTextToText`
#: sessions, src/models/session_config.js; hfexport.formats.onnx.image_text_contract writes them).
IMAGE_TEXT_FILES = ("vision_encoder.onnx", "embed_tokens.onnx", "decoder_model_merged.onnx")
#: An encoder-decoder generation target's task -> transformers.js' pipeline and optimum's class that load its
#: `encoder_model.onnx` + `decoder_model_merged.onnx` (hfexport.formats.onnx.seq2seq_contract); other tasks: a
#: decoder-only LLM's.
SEQ2SEQ_LOADERS = {"text2text-generation": ("text2text-generation", "ORTModelForSeq2SeqLM"),
                   "translation": ("translation", "ORTModelForSeq2SeqLM"),
                   "summarization": ("summarization", "ORTModelForSeq2SeqLM"),
                   "automatic-speech-recognition": ("automatic-speech-recognition", "ORTModelForSpeechSeq2Seq")}


def onnx_data_name(model_file: str) -> str:
    """`model.onnx` -> `model.onnx_data`: the external data name optimum and transformers.js download."""
    return model_file + ONNX_DATA_SUFFIX


def transformers_js_dtype(file_name: str) -> str | None:
    """The transformers.js `dtype` that opens `file_name` (`model_quantized.onnx` -> "q8", `model.onnx` -> "fp32"),
    None for a name transformers.js never asks for."""
    for dtype, suffix in TRANSFORMERS_JS_SUFFIXES.items():
        if file_name == f"model{suffix}.onnx":
            return dtype
    return None


def transformers_js_config(config: dict, onnx_files) -> dict:
    """`config` (a repo's config.json) with the `transformers.js_config` that lets transformers.js open every graph
    among `onnx_files` (names in `onnx/`) by `dtype` alone: `use_external_data_format` per file name, 1 (one chunk,
    `<file>_data`) for each `X.onnx` whose `X.onnx_data` is there (transformers.js 4.3.2, src/utils/model-loader.js:
    `resolveExternalDataFormat` looks the full file name up first), the image-text-to-text graphs' (`IMAGE_TEXT_FILES`)
    too; `kv_cache_dtype` "float16" for the fp16 dtypes
    (transformers.js 3.x reads it to make an fp16 empty cache; 4.x reads the cache's type off the graph's inputs).
    The owner's other keys, and entries for files not among `onnx_files`, are kept."""
    names = set(onnx_files)
    own = dict(config.get("transformers.js_config") or {}) if isinstance(config.get("transformers.js_config"),
                                                                        dict) else {}
    external = own.get("use_external_data_format")
    external = dict(external) if isinstance(external, dict) else {}
    half = dict(own.get("kv_cache_dtype")) if isinstance(own.get("kv_cache_dtype"), dict) else {}
    for name in sorted(names):
        dtype = transformers_js_dtype(name) or ("fp32" if name in IMAGE_TEXT_FILES else None)
        if dtype is None:
            continue
        if onnx_data_name(name) in names:
            external[name] = 1
        if dtype in ("fp16", "q4f16", "q2f16", "q1f16"):
            half[dtype] = "float16"
    if external:
        own["use_external_data_format"] = dict(sorted(external.items()))
    if half and not isinstance(own.get("kv_cache_dtype"), str):
        own["kv_cache_dtype"] = dict(sorted(half.items()))
    config = with_flat_text_settings(config, names)
    return {**config, "transformers.js_config": own} if own else dict(config)


#: Model types whose text settings transformers.js 4.3.2 reads at the config's top level (getNormalizedConfig,
#: src/configs.js: `qwen2_vl` is among the flat decoders, `qwen2_5_vl` among the sub-configs read from `text_config`),
#: where transformers 5 saves them in `text_config` only: it then builds no empty past and the decoder stops at
#: "Missing the following inputs: past_key_values.0.key, ..." (tiny Qwen2-VL's export). The keys it reads there.
FLAT_TEXT_CONFIG_TYPES = ("qwen2_vl",)
FLAT_TEXT_KEYS = ("num_key_value_heads", "num_hidden_layers", "hidden_size", "num_attention_heads", "head_dim")


def with_flat_text_settings(config: dict, onnx_files) -> dict:
    """`config` with its `text_config`'s settings that transformers.js reads at the top level (FLAT_TEXT_KEYS) copied
    there, for a FLAT_TEXT_CONFIG_TYPES model whose image-text-to-text graphs are among `onnx_files`; keys the config
    has are kept (transformers 5 reads `text_config` and keeps the copies as plain attributes)."""
    text = config.get("text_config")
    if config.get("model_type") not in FLAT_TEXT_CONFIG_TYPES or not isinstance(text, dict) \
            or not set(IMAGE_TEXT_FILES) <= set(onnx_files):
        return dict(config)
    return {**config, **{key: text[key] for key in FLAT_TEXT_KEYS if key in text and key not in config}}


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
    max_program_bytes = 2 << 30  # protobuf's own limit for one message: larger models keep weights in `.data`
    memory_factor = 4.0
    export_cost = 1.5
    runtimes = ("hfexport.formats.onnx.runtimes.transformers_js", "hfexport.formats.onnx.runtimes.optimum",
                "hfexport.formats.onnx.runtimes.onnxruntime_genai")
    one_decoder_graph = True
    gate_in_own_process = True
    converts_to_float16 = True
    generation_variants = True
    nncf_onnx_limits = True
    # the runtimes' contracts (hfexport.formats.onnx.decoder_contract, seq2seq_contract)
    contract_files = ("genai_config.json", "decoder_model_merged.onnx")
    sentence_transformers = True
    optimum_classes = ("optimum.onnxruntime", "ORTModel")
    variants = ("fp16", "q8", "q4", "q4f16")  # transformers.js' dtypes (hfexport.formats.onnx.variants)

    def variant_file(self, name: str) -> str:
        if name not in self.variants:
            return super().variant_file(name)
        return f"model{TRANSFORMERS_JS_SUFFIXES[name]}.onnx"

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

    def loading_snippets(self, loader: str, repo_id: str, targets: list[CardTarget]) -> list[str]:
        if loader == "transformers.js":
            return self._transformers_js_lines(repo_id, [target for target in targets if target.task in EMBEDDING_TASKS])
        if loader == "plain" and targets:
            path = targets[0].path
            return ["import onnxruntime as ort", "from huggingface_hub import snapshot_download", "",
                    f'local = snapshot_download("{repo_id}", allow_patterns=["{path.rsplit(".", 1)[0]}.*"])',
                    f'session = ort.InferenceSession(f"{{local}}/{path}")']
        return super().loading_snippets(loader, repo_id, targets)

    def _transformers_js_lines(self, repo_id: str, targets: list[CardTarget]) -> list[str]:
        """A feature-extraction `pipeline` per embedding target: `dtype` picks its file (or `model_file_name`)."""
        js: list[str] = []
        for target in targets:
            options = []
            if target.stem in TRANSFORMERS_JS_DTYPES or not target.stem:
                options.append(f'dtype: "{TRANSFORMERS_JS_DTYPES[target.stem]}"')
            else:
                options += ['dtype: "fp32"', f'model_file_name: "{target.stem}"']
            if any(path.endswith((".onnx.data", ".onnx_data")) for path in target.files):
                options.append("use_external_data_format: true")
            if target.folder != self.folder:
                options.append(f'subfolder: "{target.folder}"')
            variable = "extractor" if not js else "extractor_" + re.sub(r"[^A-Za-z0-9_]", "_", target.name)
            js.append(f'const {variable} = await pipeline("feature-extraction", "{repo_id}", {{ {", ".join(options)} }});'
                      f"  // {target.name}")
        return js

    def runtime_snippets(self, repo_id: str, target: CardTarget, passed: list[str]) -> list[str]:
        folder, stem, task, lines = target.folder, target.stem, str(target.task or ""), []
        if task == IMAGE_TEXT_TASK:  # transformers.js' image-text-to-text layout (IMAGE_TEXT_FILES), its sessions' data
            sub = "" if folder == self.folder else f', subfolder: "{folder}"'
            return ["```js", 'import { AutoModelForImageTextToText } from "@huggingface/transformers";', "",
                    f'const model = await AutoModelForImageTextToText.from_pretrained("{repo_id}", '
                    f'{{ dtype: "fp32", use_external_data_format: true{sub} }});',
                    "// model.generate({ input_ids, attention_mask, pixel_values, max_new_tokens }): the processor's "
                    "outputs", "```", ""] if "transformers.js" in passed else []
        pipeline_task, ort_class = SEQ2SEQ_LOADERS.get(task, ("text-generation", "ORTModelForCausalLM"))
        seq2seq = task in SEQ2SEQ_LOADERS
        if "transformers.js" in passed:
            # A decoder's external data is named by config.json's transformers.js_config (the publication writes it);
            # an encoder-decoder's two graphs are opened with use_external_data_format.
            sub = "" if folder == self.folder else f', subfolder: "{folder}"'
            dtype = TRANSFORMERS_JS_DTYPES.get(stem, "fp32")
            lines += ["```js", 'import { pipeline } from "@huggingface/transformers";', "",
                      f'const generator = await pipeline("{pipeline_task}", "{repo_id}", '
                      f'{{ dtype: "{dtype}"{", use_external_data_format: true" if seq2seq else ""}{sub} }});', "```",
                      ""]
        if "optimum" in passed:
            file_name = f', file_name="{stem}.onnx"' if stem and not seq2seq else ""
            lines += ["```python", f"from optimum.onnxruntime import {ort_class}", "",
                      f'model = {ort_class}.from_pretrained("{repo_id}", subfolder="{folder}"{file_name})', "```", ""]
        if "onnxruntime-genai" in passed:
            code = ["import onnxruntime_genai as og", "from huggingface_hub import snapshot_download", "",
                    f'folder = snapshot_download("{repo_id}", allow_patterns=["{folder}/*"])']
            if stem:  # the folder's genai_config.json names model.onnx: the variant is picked by an overlay
                code += [f'config = og.Config(f"{{folder}}/{folder}")',
                         f'config.overlay(\'{{"model": {{"decoder": {{"filename": "{stem}.onnx"}}}}}}\')',
                         "model = og.Model(config)"]
            else:
                code += [f'model = og.Model(f"{{folder}}/{folder}")']
            lines += ["```python", *code, "```", ""]
        return lines
