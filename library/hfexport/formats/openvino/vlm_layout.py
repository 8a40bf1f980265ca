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

Qwen2-VL runs on VLMPipeline's own vision split (`hfexport.formats.openvino.vision_split`) and `position_ids`
`[3, batch, sequence]`. Written for LLaVA and Qwen2-VL (`WRITTEN_TYPES`); Idefics3/SmolVLM is no VLMPipeline model
type; Qwen2.5-VL's split adds window attention, not made here. docs/generation.md, "VLMPipeline layout".
"""

from __future__ import annotations

from pathlib import Path

from hfexport.files import read_json_object
from hfexport.formats.backend import IMAGE_TEXT_COMPONENTS as COMPONENTS
from hfexport.formats.openvino import vision_split as split_graphs
from hfexport.formats.openvino.genai_layout import read_manifest, rename_component

LANGUAGE_MODEL_FILE = "openvino_language_model.xml"  # optimum-intel's, VLMPipeline's
TEXT_EMBEDDINGS_FILE = "openvino_text_embeddings_model.xml"
VISION_EMBEDDINGS_FILE = "openvino_vision_embeddings_model.xml"
FILES = (LANGUAGE_MODEL_FILE, TEXT_EMBEDDINGS_FILE, VISION_EMBEDDINGS_FILE)
#: hfexport's `language_model` (inputs_embeds -> hidden states and a cache, no states) under a name of its own: the
#: layout's `openvino_language_model.xml` is the stateful graph VLMPipeline runs.
PREFILL_FILE = "openvino_prefill_language_model.xml"
#: The model types whose layout hfexport writes: VLMPipeline's LLaVA and Qwen2-VL (`VLMModelType::LLAVA`,
#: `QWEN2_VL`, vlm_config.cpp), the latter on its own vision split (`SPLIT_TYPES`).
SPLIT_TYPES = split_graphs.SPLIT_TYPES
WRITTEN_TYPES = ("llava", *SPLIT_TYPES)
SPLIT_FILES = (split_graphs.VISION_EMBEDDINGS_FILE, split_graphs.VISION_MERGER_FILE)
#: The rope axes VLMPipeline feeds a `qwen2_vl` language model (`position_ids` `[3, batch, sequence]`).
ROPE_AXES = 3
#: OpenVINO GenAI 2026.4.1's VLM model types (`to_vlm_model_type`, src/cpp/src/visual_language/vlm_config.cpp).
VLM_MODEL_TYPES = (
    "minicpmv", "minicpmo", "llava", "llava-qwen2", "llava_next", "llava_next_video", "internvl_chat", "phi3_v",
    "phi4mm", "qwen2_vl", "qwen2_5_vl", "qwen3_vl", "qwen3_5", "qwen3_5_moe", "gemma3", "gemma3n", "gemma4",
    "gemma4_unified", "videochat_flash_qwen", "qwen3_omni", "qwen3_omni_moe", "muse_glimmer")

#: What VLMPipeline feeds the model types whose split hfexport does not write.
OWN_SPLITS = {"qwen2_5_vl": "qwen2_5_vl/classes.cpp: openvino_vision_embeddings_model.xml on the patches' "
                            "`hidden_states`, then openvino_vision_embeddings_merger_model.xml on `hidden_states`, "
                            "`attention_mask`, `window_attention_mask`, `window_index` and `rotary_pos_emb`, which "
                            "VLMPipeline computes from the image grid itself"}


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
            "graph is not: hfexport writes VLMPipeline's layout for LLaVA and Qwen2-VL only "
            "(hfexport.formats.openvino.vlm_layout)")


def applies(manifest: dict, model_type: str | None) -> bool:
    """Whether a saved export is an OpenVINO VLM generation (`COMPONENTS`) of a `WRITTEN_TYPES` model, its image
    encoder on `pixel_values` alone (on its image grid too: `SPLIT_TYPES`), its decode one stateful graph on
    `input_ids`."""
    components = manifest.get("components") or {}
    if manifest.get("export_format") != "openvino" or set(components) != set(COMPONENTS) or \
            model_type not in WRITTEN_TYPES:
        return False

    def metadata(name):
        return components[name].get("metadata") or {}

    encoder_inputs = {"pixel_values", "image_grid_thw"} if model_type in SPLIT_TYPES else {"pixel_values"}
    return set(metadata("image_encoder").get("kwargs") or {}) == encoder_inputs \
        and (model_type not in SPLIT_TYPES or takes_the_prompt(manifest)) \
        and "input_ids" in (metadata("decode").get("kwargs") or {}) \
        and bool((metadata("decode").get("export_config") or {}).get("stateful"))


def takes_the_prompt(manifest: dict) -> bool:
    """Whether the export's decode was traced on several new tokens (`generation.multi_token_decode`, the default
    for a `SPLIT_TYPES` model's OpenVINO target): VLMPipeline runs the prompt through it, and Qwen2-VL's decode traced
    on one token keeps that length."""
    decode = ((manifest.get("components") or {}).get("decode") or {}).get("metadata") or {}
    shape = ((decode.get("kwargs") or {}).get("input_ids") or {}).get("shape") or []
    return len(shape) == 2 and shape[1] > 1


def to_layout(folder: str | Path, model=None) -> list[str]:
    """Write `FILES` (+ `.bin`) into `folder` from its VLM components (see the module docstring), and for a
    `SPLIT_TYPES` model the vision split made from `model` (the model the components were exported from or rebound
    to); the names written, none when the export is not one it applies to, a graph lacks the token-embedding lookup
    it cuts, or a split type's `model` is not given (a split left from before is removed: its weights would be
    stale)."""
    import openvino as ov

    folder = Path(folder)
    manifest = read_manifest(folder)
    model_type = read_json_object(folder / "config.json").get("model_type")
    if manifest is None or not applies(manifest, model_type):
        return []
    split = split_graphs.vision_split(model) if model_type in SPLIT_TYPES and model is not None else {}
    if model_type in SPLIT_TYPES and not split:
        moved = manifest["components"]["language_model"]["file"] == PREFILL_FILE  # else the name is the component's
        for name in (*SPLIT_FILES, TEXT_EMBEDDINGS_FILE, *([LANGUAGE_MODEL_FILE] if moved else [])):
            (folder / name).unlink(missing_ok=True)
            (folder / name.replace(".xml", ".bin")).unlink(missing_ok=True)
        return []
    components = manifest["components"]
    core = ov.Core()
    read = {name: core.read_model(str(folder / components[name]["file"])) for name in ("image_encoder", "embed",
                                                                                        "decode")}
    if embedding_lookup(read["embed"]) is None or embedding_lookup(read["decode"]) is None:
        return []
    rename_component(folder, manifest, "language_model", PREFILL_FILE)
    positions = ((components["decode"].get("metadata") or {}).get("kwargs") or {}).get("position_ids") or {}
    vision = {name: (graph, read["image_encoder"]) for name, graph in split.items()} if split else \
        {VISION_EMBEDDINGS_FILE: (vision_embeddings(read["image_encoder"]), read["image_encoder"])}
    models = {**vision,
              TEXT_EMBEDDINGS_FILE: (text_embeddings(read["embed"]), read["embed"]),
              LANGUAGE_MODEL_FILE: (language_model(read["decode"], (positions.get("shape") or [None])[0]),
                                    read["decode"])}
    for name, (graph, source) in models.items():
        keep_runtime_options(source, graph)
        ov.save_model(graph, str(folder / name), compress_to_fp16=False)
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


def language_model(decode, rope_axes: int | None = None):
    """The stateful `decode` taking `inputs_embeds` where it looked its `input_ids` up (the lookup's output and the
    ids' shape, read from the embeddings' first two dims, now come from that input); a decode traced on
    `rope_axes` = `ROPE_AXES` + 1 position rows (transformers 5.23's Qwen2-VL: the text row, then three rope axes)
    taking the `ROPE_AXES` VLMPipeline feeds, its text row made in the graph (`text_positions`); its
    `mm_token_type_ids`, where it takes them, 0 (text)."""
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
    first_two = ops.gather(ops.shape_of(embeds, output_type="i64"), ops.constant([0, 1], dtype=ov.Type.i64),
                           ops.constant(0, dtype=ov.Type.i64))
    for index, parameter in enumerate(parameters):
        names = parameter.output(0).get_names()
        if "mm_token_type_ids" in names:  # the new tokens are text: their images are in inputs_embeds already
            zeros = ops.broadcast(ops.constant(0, dtype=parameter.get_element_type()), first_two)
            parameter.output(0).replace(zeros.output(0))
            parameters[index] = None
        elif "position_ids" in names and rope_axes == ROPE_AXES + 1:
            mask = next(p for p in parameters if p is not None and "attention_mask" in p.output(0).get_names())
            rope = ops.parameter(ov.PartialShape([ROPE_AXES, -1, -1]), parameter.get_element_type(),
                                 name="position_ids")
            rope.output(0).set_names({"position_ids"})
            both = ops.concat([text_positions(mask, rope), rope], 0)
            parameter.output(0).replace(both.output(0))
            parameters[index] = rope
    parameters = [parameter for parameter in parameters if parameter is not None]
    model = ov.Model(decode.get_results(), decode.get_sinks(), [embeds, *parameters], "language_model")
    model.validate_nodes_and_infer_types()
    return model


def text_positions(attention_mask, rope):
    """`[1, batch, sequence]`: the new tokens' text positions, the past length (the mask's length less theirs) plus
    each one's index, `model.generate`'s for a prompt without padding (VLMPipeline runs one prompt at a time)."""
    import openvino as ov
    from openvino import opset13 as ops

    def axis(node, index):
        return ops.gather(ops.shape_of(node, output_type="i64"), ops.constant([index], dtype=ov.Type.i64),
                          ops.constant(0, dtype=ov.Type.i64))

    total, length = axis(attention_mask, 1), axis(rope, 2)
    start = ops.squeeze(ops.subtract(total, length), ops.constant([0], dtype=ov.Type.i64))
    row = ops.range(start, ops.squeeze(total, ops.constant([0], dtype=ov.Type.i64)), ops.constant(1, dtype=ov.Type.i64),
                    output_type=rope.get_element_type())
    shape = ops.concat([ops.constant([1], dtype=ov.Type.i64), axis(rope, 1), length], 0)
    return ops.broadcast(ops.unsqueeze(row, ops.constant([0, 1], dtype=ov.Type.i64)), shape)
