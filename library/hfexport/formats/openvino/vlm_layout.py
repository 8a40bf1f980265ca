"""A vision-language OpenVINO generation export in optimum-intel's layout, the one OpenVINO GenAI's `VLMPipeline`
opens, written beside hfexport's own components.

OpenVINO GenAI 2026.4.1 (`VLMPipeline(folder, "CPU")`, src/cpp/src/visual_language/) reads the model type from
`config.json` (`vlm_config.cpp`: an unknown one throws "Unsupported '<type>' VLM model type"), the image processor's
settings from a flat `preprocessor_config.json` (`processor_config.cpp`: LLaVA's `size.shortest_edge`, `crop_size`,
`image_mean`, `image_std`), the tokenizer from `openvino_tokenizer.xml` / `openvino_detokenizer.xml`, and three models:

- `openvino_vision_embeddings_model.xml`: `pixel_values` (one image, preprocessed by VLMPipeline itself) ->
  the image's features `[1, tokens, hidden]` (LLaVA: `llava/classes.cpp`, the tokens are the output's dim 1);
- `openvino_text_embeddings_model.xml`: `input_ids` -> the token embeddings (`embedding_model.cpp`); VLMPipeline
  writes the image features over them at the image tokens (`utils::merge_text_and_image_embeddings_llava`);
- `openvino_language_model.xml`: one stateful graph, `inputs_embeds`, `attention_mask`, `position_ids`, `beam_idx`
  -> `logits`, the KV cache in its states (`lm_encoding.cpp`).

`to_layout` makes them from hfexport's components (`hfexport.generate.vision_language`): the image encoder with its
features given a batch axis, the token-embedding lookup cut out of `embed`, and the stateful `decode` fed
`inputs_embeds` where it looked its `input_ids` up. hfexport's own `language_model` (the prefill, not stateful) moves
to `PREFILL_FILE`, as its manifest records; the other components keep their files.

Written for LLaVA (`WRITTEN_TYPES`): Idefics3/SmolVLM is no VLMPipeline model type, and Qwen2-VL-class models need
VLMPipeline's own vision split (a merger model and three-axis rope positions), which hfexport's components are not.
"""

from __future__ import annotations

from pathlib import Path

from hfexport.files import read_json_object
from hfexport.formats.backend import IMAGE_TEXT_COMPONENTS as COMPONENTS
from hfexport.formats.openvino.genai_layout import read_manifest, rename_component

LANGUAGE_MODEL_FILE = "openvino_language_model.xml"  # optimum-intel's, VLMPipeline's
TEXT_EMBEDDINGS_FILE = "openvino_text_embeddings_model.xml"
VISION_EMBEDDINGS_FILE = "openvino_vision_embeddings_model.xml"
FILES = (LANGUAGE_MODEL_FILE, TEXT_EMBEDDINGS_FILE, VISION_EMBEDDINGS_FILE)
#: hfexport's `language_model` (inputs_embeds -> hidden states and a cache, no states) under a name of its own: the
#: layout's `openvino_language_model.xml` is the stateful graph VLMPipeline runs.
PREFILL_FILE = "openvino_prefill_language_model.xml"
#: The model types whose layout hfexport writes: VLMPipeline's LLaVA (`VLMModelType::LLAVA`, vlm_config.cpp).
WRITTEN_TYPES = ("llava",)
#: OpenVINO GenAI 2026.4.1's VLM model types (`to_vlm_model_type`, src/cpp/src/visual_language/vlm_config.cpp).
VLM_MODEL_TYPES = (
    "minicpmv", "minicpmo", "llava", "llava-qwen2", "llava_next", "llava_next_video", "internvl_chat", "phi3_v",
    "phi4mm", "qwen2_vl", "qwen2_5_vl", "qwen3_vl", "qwen3_5", "qwen3_5_moe", "gemma3", "gemma3n", "gemma4",
    "gemma4_unified", "videochat_flash_qwen", "qwen3_omni", "qwen3_omni_moe", "muse_glimmer")

_QWEN2_VL_SPLIT = ("qwen2vl/classes.cpp: openvino_vision_embeddings_model.xml on the patches' `hidden_states`, then "
                   "openvino_vision_embeddings_merger_model.xml on `hidden_states`, `rotary_pos_emb` and `cu_seq_lens` "
                   "or `attention_mask`, which VLMPipeline computes from the image grid itself")
#: What VLMPipeline feeds the model types whose split hfexport's components are not.
OWN_SPLITS = {"qwen2_vl": _QWEN2_VL_SPLIT, "qwen2_5_vl": _QWEN2_VL_SPLIT.replace("qwen2vl/", "qwen2_5_vl/")}


def limitation(model_type: str | None) -> str | None:
    """Why VLMPipeline does not run an export of this model type (config.json's) from hfexport's files (None: it
    does), decided before VLMPipeline runs."""
    if model_type in WRITTEN_TYPES:
        return None
    if model_type not in VLM_MODEL_TYPES:
        return (f"OpenVINO GenAI 2026.4.1's VLMPipeline throws \"Unsupported '{model_type}' VLM model type\" "
                "(to_vlm_model_type, src/cpp/src/visual_language/vlm_config.cpp)")
    return (f"VLMPipeline runs {model_type!r} on a vision split of its own "
            f"({OWN_SPLITS.get(model_type, 'src/cpp/src/visual_language/')}), which hfexport's one image-encoder "
            "graph is not: hfexport writes VLMPipeline's layout for LLaVA only (hfexport.formats.openvino.vlm_layout)")


def applies(manifest: dict, model_type: str | None) -> bool:
    """Whether a saved export is an OpenVINO VLM generation (`COMPONENTS`) of a `WRITTEN_TYPES` model, its image
    encoder on `pixel_values` alone, its decode one stateful graph on `input_ids`."""
    components = manifest.get("components") or {}
    if manifest.get("export_format") != "openvino" or set(components) != set(COMPONENTS) or \
            model_type not in WRITTEN_TYPES:
        return False

    def metadata(name):
        return components[name].get("metadata") or {}

    return set(metadata("image_encoder").get("kwargs") or {}) == {"pixel_values"} \
        and "input_ids" in (metadata("decode").get("kwargs") or {}) \
        and bool((metadata("decode").get("export_config") or {}).get("stateful"))


def to_layout(folder: str | Path) -> list[str]:
    """Write `FILES` (+ `.bin`) into `folder` from its VLM components (see the module docstring); the names written,
    none when the export is not one it applies to or a graph lacks the token-embedding lookup it cuts."""
    import openvino as ov

    folder = Path(folder)
    manifest = read_manifest(folder)
    if manifest is None or not applies(manifest, read_json_object(folder / "config.json").get("model_type")):
        return []
    components = manifest["components"]
    core = ov.Core()
    read = {name: core.read_model(str(folder / components[name]["file"])) for name in ("image_encoder", "embed",
                                                                                        "decode")}
    if embedding_lookup(read["embed"]) is None or embedding_lookup(read["decode"]) is None:
        return []
    rename_component(folder, manifest, "language_model", PREFILL_FILE)
    models = {VISION_EMBEDDINGS_FILE: (vision_embeddings(read["image_encoder"]), read["image_encoder"]),
              TEXT_EMBEDDINGS_FILE: (text_embeddings(read["embed"]), read["embed"]),
              LANGUAGE_MODEL_FILE: (language_model(read["decode"]), read["decode"])}
    for name, (model, source) in models.items():
        keep_runtime_options(source, model)
        ov.save_model(model, str(folder / name), compress_to_fp16=False)
    return list(models)


def keep_runtime_options(source, model) -> None:
    """`source`'s `rt_info/runtime_options` (the engine writes `INFERENCE_PRECISION_HINT` and `KV_CACHE_PRECISION`
    f32 into every component) onto `model`, made from it as a new `ov.Model`, which starts without rt_info: the
    layout's files run at the precision the components were verified at, not at the CPU's default. Not
    `KV_CACHE_PRECISION`: with it in the language model's file, VLMPipeline 2026.4.1 ends in a segmentation fault
    (measured on tiny LLaVA; the precision hint alone runs)."""
    if not source.has_rt_info("runtime_options"):
        return
    for option, value in source.get_rt_info("runtime_options").astype(dict).items():
        if option != "KV_CACHE_PRECISION":
            model.set_rt_info(value.astype(str), ["runtime_options", option])


def embedding_lookup(model):
    """The `Gather` of a constant `[vocab, hidden]` table on the model's `input_ids` (through a `Convert`), or None."""
    ids = next((parameter for parameter in model.get_parameters() if "input_ids" in parameter.output(0).get_names()),
               None)
    if ids is None:
        return None
    for target in _users(ids):
        node = target.get_node()
        if node.get_type_name() == "Convert":
            node = next((user.get_node() for user in _users(node) if user.get_node().get_type_name() == "Gather"),
                        None)
        if node is not None and node.get_type_name() == "Gather" and \
                node.input_value(0).get_node().get_type_name() == "Constant" and \
                len(node.input_value(0).get_partial_shape()) == 2:
            return node
    return None


def _users(node):
    return node.output(0).get_target_inputs()


def vision_embeddings(encoder):
    """hfexport's image encoder (traced on one prompt's image: `[tokens, hidden]`) with a batch axis on its output,
    the `[1, tokens, hidden]` VLMPipeline counts the image's tokens in."""
    import openvino as ov
    from openvino import opset13 as ops

    (result,) = encoder.get_results()
    features = result.input_value(0)
    if len(features.get_partial_shape()) == 3:
        return encoder
    batched = ops.unsqueeze(features, ops.constant([0], dtype=ov.Type.i64))
    output = ops.result(batched)
    output.output(0).set_names({"last_hidden_state"})
    return ov.Model([output], encoder.get_parameters(), "vision_embeddings")


def text_embeddings(embed):
    """`embed` cut to its token-embedding lookup: `input_ids` -> `inputs_embeds`."""
    import openvino as ov
    from openvino import opset13 as ops

    lookup = embedding_lookup(embed)
    output = ops.result(lookup.output(0))
    output.output(0).set_names({"inputs_embeds"})
    ids = [parameter for parameter in embed.get_parameters() if "input_ids" in parameter.output(0).get_names()]
    return ov.Model([output], ids, "text_embeddings")


def language_model(decode):
    """The stateful `decode` taking `inputs_embeds` where it looked its `input_ids` up (the lookup's output and the
    ids' shape, read from the embeddings' first two dims, now come from that input)."""
    import openvino as ov
    from openvino import opset13 as ops

    lookup = embedding_lookup(decode)
    ids = next(parameter for parameter in decode.get_parameters() if "input_ids" in parameter.output(0).get_names())
    hidden = lookup.output(0).get_partial_shape()[-1]
    embeds = ops.parameter(ov.PartialShape([-1, -1, hidden]), lookup.output(0).get_element_type(),
                           name="inputs_embeds")
    embeds.output(0).set_names({"inputs_embeds"})
    for target in list(lookup.output(0).get_target_inputs()):
        target.replace_source_output(embeds.output(0))
    for target in list(_users(ids)):
        node = target.get_node()
        if node.get_type_name() == "ShapeOf":  # the batch and sequence of the ids: those of the embeddings
            shape = ops.shape_of(embeds, output_type=node.get_output_element_type(0))
            first_two = ops.gather(shape, ops.constant([0, 1], dtype=ov.Type.i64), ops.constant(0, dtype=ov.Type.i64))
            for user in list(node.output(0).get_target_inputs()):
                user.replace_source_output(first_two.output(0))
    parameters = [parameter for parameter in decode.get_parameters() if parameter is not ids]
    model = ov.Model(decode.get_results(), decode.get_sinks(), [embeds, *parameters], "language_model")
    model.validate_nodes_and_infer_types()
    return model
