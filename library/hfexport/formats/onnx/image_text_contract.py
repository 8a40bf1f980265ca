"""A vision-language ONNX generation export in transformers.js' image-text-to-text layout: `vision_encoder.onnx`,
`embed_tokens.onnx` and `decoder_model_merged.onnx` (each + `_data`), written beside hfexport's own components.

transformers.js 4.3.2 opens an image-text-to-text model (`MODEL_TYPES.ImageTextToText`, src/models/session_config.js)
as three sessions and runs them as `generic_text_to_text_forward` does (src/models/modeling_utils.js):

- `vision_encoder`: the processor's `pixel_values` (inputs picked by the session's input names) -> `image_features`,
  which LLaVA's `_merge_input_ids_with_image_features` views as `[-1, hidden]` and writes, row by row, over the token
  embeddings at the `config.image_token_index` positions (`default_merge_input_ids_with_features`);
- `embed_tokens`: `input_ids` -> `inputs_embeds`, the token embeddings alone (on the prompt, and on every new token);
- `decoder_model_merged`: `inputs_embeds`, `attention_mask`, `position_ids` (the mask's cumulative sum, made by
  transformers.js), `past_key_values.{i}.key|value` (an empty past at the prompt, built from the graph's input
  metadata: `batch_size` is the batch, every other symbol 0) and `use_cache_branch` -> `logits`, `present.{i}.key|value`.

`to_contract` writes hfexport's `image_encoder` under transformers.js' names, cuts the token embeddings out of
`embed`, and merges the prompt graphs and the decode (fed `inputs_embeds`) into one `If(use_cache_branch)` graph as
`seq2seq_contract` merges an encoder-decoder's; hfexport's own components stay (docs/generation.md).

Written for the models whose image encoder takes `pixel_values` (Idefics3/SmolVLM: and `pixel_attention_mask`) and
whose language model takes one position per token (LLaVA-class), or whose encoder takes packed patches with
`image_grid_thw` and whose language model takes three-axis rope positions (Qwen2-VL-class: transformers.js feeds the
encoder `grid_thw` and the decoder `position_ids` `[3, batch, sequence]` from its own `get_rope_index`; the merged
graph adds the text-position row transformers 5.23's graphs take first), at float32 (transformers.js' `dtype: "fp32"`
names); not for LLaVA-NeXT (`image_sizes`).
"""

from __future__ import annotations

import json
from pathlib import Path

from hfexport.files import MANIFEST_FILE, read_json_object
from hfexport.formats.onnx import decoder_contract
from hfexport.formats.backend import IMAGE_TEXT_COMPONENTS
from hfexport.formats.onnx.backend import IMAGE_TEXT_FILES
from hfexport.processors import save_flat_preprocessor_config
from hfexport.formats.onnx.seq2seq_contract import (
    USE_CACHE_BRANCH, Seq2SeqContractError, branch, static_dim, static_int, use_cache_if,
)

FILES = IMAGE_TEXT_FILES
VISION_ENCODER_FILE, EMBED_TOKENS_FILE, DECODER_FILE = FILES
COMPONENTS = IMAGE_TEXT_COMPONENTS
#: The image inputs transformers.js feeds its vision encoder (picked from the processor's outputs by the session's
#: input names): LLaVA's `pixel_values`, Idefics3/SmolVLM's `pixel_attention_mask` beside them.
IMAGE_INPUTS = {"pixel_values", "pixel_attention_mask", "image_grid_thw"}
#: The image inputs transformers.js feeds its vision encoder under another name: Qwen2-VL-class models'
#: `encode_image` feeds the processor's `image_grid_thw` as `grid_thw` (`image_grid_thw_name`,
#: src/models/qwen2_vl/modeling_qwen2_vl.js).
ENCODER_INPUT_NAMES = {"image_grid_thw": "grid_thw"}
#: The rope positions of a Qwen2-VL-class language model: `[3, batch, sequence]` (temporal, height, width), which
#: transformers.js computes with its own `get_rope_index` from `input_ids`, `image_grid_thw` and the mask, and on each
#: new token as the past length plus the prompt's `rope_deltas` on all three axes.
ROPE_AXES = 3
#: The model types of image-grid exports the layout is written for: transformers.js 4.3.2 maps them to
#: `Qwen2VLForConditionalGeneration` (its `get_rope_index`), checked on tiny Qwen2-VL; not PaddleOCR-VL (no
#: transformers.js model type) nor Qwen2.5-VL (another vision encoder in transformers.js, not checked here).
GRID_MODEL_TYPES = ("qwen2_vl",)
#: The image inputs transformers.js makes as bool tensors, whatever the Python processor made: Idefics3's image
#: processor (src/models/idefics3/image_processing_idefics3.js) returns `pixel_attention_mask` as `Tensor('bool', ...)`,
#: and onnxruntime refused the int64 input the export was traced on ("Unexpected input data type. Actual:
#: (tensor(bool)) , expected: (tensor(int64))", the README's snippet on tiny Idefics3's pull request). The layout's
#: encoder takes them as bool and casts them back inside.
BOOL_INPUTS = {"pixel_attention_mask"}
BATCH, SEQUENCE, PAST, TOTAL = (decoder_contract.BATCH, decoder_contract.SEQUENCE, decoder_contract.PAST,
                                decoder_contract.TOTAL)


def applies(manifest: dict) -> bool:
    """Whether a saved export is an ONNX LLaVA-class VLM generation (`COMPONENTS`, an image encoder on `pixel_values`
    (and Idefics3's `pixel_attention_mask`), a language model on one position per token, a decode on `input_ids` and
    a `DynamicCache`) at float32: the files are transformers.js' fp32 names (a float16 export's are not)."""
    components = manifest.get("components") or {}
    if manifest.get("export_format") != "onnx" or set(components) != set(COMPONENTS):
        return False
    if any("float16" in str((entry.get("metadata") or {}).get("export_dtype")) for entry in components.values()):
        return False

    def kwargs(name):
        return (components[name].get("metadata") or {}).get("kwargs") or {}

    positions = (kwargs("language_model").get("position_ids") or {}).get("shape") or []
    cache = kwargs("decode").get("past_key_values") or {}
    gridded = "image_grid_thw" in kwargs("image_encoder")  # a Qwen2-VL-class encoder: three-axis rope positions
    return "pixel_values" in kwargs("image_encoder") and set(kwargs("image_encoder")) <= IMAGE_INPUTS \
        and (len(positions) == 2 or (gridded and len(positions) == 3 and positions[0] in (ROPE_AXES, ROPE_AXES + 1))) \
        and "input_ids" in kwargs("decode") and cache.get("container") == "DynamicCache"


def to_contract(folder: Path) -> bool:
    """Write `FILES` (+ `_data`) into `folder` from its VLM components; False (nothing written) when the export is not
    one it applies to, or its graphs do not have the token-embedding lookup it cuts (`embedding_lookup`). Raises
    `Seq2SeqContractError` when the cache's heads or head size are dynamic."""
    import onnx_ir

    folder = Path(folder)
    manifest = json.loads((folder / MANIFEST_FILE).read_text(encoding="utf-8"))
    if not applies(manifest):
        return False
    gridded = "image_grid_thw" in ((manifest["components"]["image_encoder"].get("metadata") or {}).get("kwargs") or {})
    if gridded and read_json_object(folder / "config.json").get("model_type") not in GRID_MODEL_TYPES:
        return False
    files = {name: folder / manifest["components"][name]["file"] for name in COMPONENTS}
    embed, decode = onnx_ir.load(str(files["embed"])), onnx_ir.load(str(files["decode"]))
    if embedding_lookup(embed.graph) is None or embedding_lookup(decode.graph) is None:
        return False
    encoder = onnx_ir.load(str(files["image_encoder"]))
    (features,) = encoder.graph.outputs
    features.name = "image_features"
    for value in [*encoder.graph.inputs, features]:  # the engine writes some static dims as symbols ("3", "32")
        if value.shape is not None:
            value.shape = onnx_ir.Shape([static_int(dim) for dim in value.shape])
    for value in [value for value in encoder.graph.inputs if value.name in BOOL_INPUTS]:
        take_as_bool(encoder.graph, value)
    for value in encoder.graph.inputs:
        value.name = ENCODER_INPUT_NAMES.get(value.name, value.name)
    embed_tokens = token_embeddings(embed)
    merged = merge_decoder(onnx_ir.load(str(files["language_model"])), onnx_ir.load(str(files["lm_head"])), decode)
    for model, name in ((encoder, VISION_ENCODER_FILE), (embed_tokens, EMBED_TOKENS_FILE), (merged, DECODER_FILE)):
        onnx_ir.save(model, str(folder / name), external_data=name + "_data")
    return True


def take_as_bool(graph, value) -> None:
    """Make graph input `value` a bool tensor, cast inside the graph to the type its nodes took (see BOOL_INPUTS)."""
    import onnx_ir

    if value.dtype == onnx_ir.DataType.BOOL:
        return
    uses = list(value.uses())
    cast = onnx_ir.node("Cast", [value], attributes={"to": value.dtype}, name=f"{value.name}/to_{value.dtype.name}")
    cast.outputs[0].name = f"{value.name}_{value.dtype.name.lower()}"
    for node, index in uses:
        node.replace_input_with(index, cast.outputs[0])
    graph.insert_before(graph.node(0), cast)
    value.dtype = onnx_ir.DataType.BOOL


def embedding_lookup(graph):
    """The graph's `Gather` of a constant table on its `input_ids` input (the token embeddings), or None."""
    ids = next((value for value in graph.inputs if value.name == "input_ids"), None)
    for node, index in ids.uses() if ids is not None else ():
        if node.op_type == "Gather" and index == 1 and node.inputs[0] is not None and \
                node.inputs[0].const_value is not None and len(node.inputs[0].shape or ()) == 2:
            return node
    return None


def token_embeddings(embed):
    """`embed` (token embeddings with the image features scattered in) cut to its token embeddings: `input_ids` ->
    `inputs_embeds`, `[batch_size, sequence_length, hidden]`."""
    import onnx_ir
    from onnx_ir.passes.common import RemoveUnusedNodesPass

    graph = embed.graph
    lookup = embedding_lookup(graph)
    output = lookup.outputs[0]
    graph.outputs.clear()
    graph.outputs.append(output)
    RemoveUnusedNodesPass()(embed)
    for value in [value for value in graph.inputs if value.name != "input_ids"]:
        graph.inputs.remove(value)
    (ids,) = graph.inputs
    ids.shape = onnx_ir.Shape([BATCH, SEQUENCE])
    output.name = "inputs_embeds"
    output.shape = onnx_ir.Shape([BATCH, SEQUENCE, lookup.inputs[0].shape[1]])
    graph.name = "embed_tokens"
    return embed


def merge_decoder(language_model, lm_head, decode):
    """One graph `If(use_cache_branch, then=decode, else=language_model then lm_head)` on `inputs_embeds`, in
    transformers.js' names (module docstring)."""
    import onnx_ir

    prompt = _prompt_graph(language_model, lm_head)
    step = _decode_on_embeddings(decode)
    pasts = [value for value in step.graph.inputs if decoder_contract.ENGINE_CACHE.match(value.name)]
    if not pasts:
        raise Seq2SeqContractError("the decode graph takes no past_key_values.layers.{i} input")
    embeds = next(value for value in step.graph.inputs if value.name == "inputs_embeds")
    outer: dict[str, onnx_ir.Value] = {}

    def add(name, dtype, dims):
        outer[name] = onnx_ir.Value(name=name, type=onnx_ir.TensorType(dtype), shape=onnx_ir.Shape(dims))

    add("inputs_embeds", embeds.dtype, [BATCH, SEQUENCE, static_dim(embeds, 2)])
    add("attention_mask", onnx_ir.DataType.INT64, [BATCH, TOTAL])
    positions = next(value for value in prompt.graph.inputs if value.name == "position_ids")
    add("position_ids", onnx_ir.DataType.INT64,
        [BATCH, SEQUENCE] if len(positions.shape) == 2 else [ROPE_AXES, BATCH, SEQUENCE])
    layers = sorted({int(decoder_contract.ENGINE_CACHE.match(value.name)[1]) for value in pasts})
    by_name = {decoder_contract.contract_name(value.name, is_output=False): value for value in pasts}
    for layer in layers:
        for part in ("key", "value"):
            source = by_name[f"past_key_values.{layer}.{part}"]
            add(f"past_key_values.{layer}.{part}", source.dtype,
                [BATCH, static_dim(source, 1), PAST, static_dim(source, 3)])
    add(USE_CACHE_BRANCH, onnx_ir.DataType.BOOL, [1])
    output_names = ["logits", *(f"present.{layer}.{part}" for layer in layers for part in ("key", "value"))]
    template = {_output_name(value.name): value for value in step.graph.outputs}
    vocabulary = static_dim(template["logits"], 2)

    def outer_input(name: str) -> str:
        return decoder_contract.contract_name(name.removeprefix("input."), is_output=False)

    initializers: dict = {}
    derived_nodes, derived = _derived_inputs(outer, positions, step)
    fed = {**outer, **derived}
    branches = {use_cache: branch(model, fed, initializers, output_names, "decode" if use_cache else "prefill",
                                  outer_input=outer_input, output_name=_output_name)
                for use_cache, model in ((True, step), (False, prompt))}
    node = use_cache_if(outer, branches, len(output_names))
    for value, name in zip(node.outputs, output_names, strict=True):
        value.name, value.type = name, template[name].type
        value.shape = onnx_ir.Shape([BATCH, SEQUENCE, vocabulary] if name == "logits" else
                                    [BATCH, outer["past_key_values." + name.removeprefix("present.")].shape[1],
                                     "total_sequence_length", outer["past_key_values." + name.removeprefix(
                                         "present.")].shape[3]])
    graph = onnx_ir.Graph(list(outer.values()), list(node.outputs), nodes=[*derived_nodes, node],
                          initializers=list(initializers.values()), opset_imports=dict(decode.graph.opset_imports),
                          name="decoder_model_merged")
    return onnx_ir.Model(graph, ir_version=decode.ir_version, producer_name="hfexport")


def _derived_inputs(outer: dict, positions, step) -> tuple[list, dict]:
    """What the engine's graphs take beyond transformers.js' inputs, computed from them in the merged graph: (nodes,
    {input name: value}). transformers 5.23's Qwen2-VL takes `position_ids` `[4, batch, sequence]`, its text
    positions before the three rope axes transformers.js feeds: the row is the past length plus the token's index
    (`model.generate`'s for a prompt without padding: transformers.js generates one prompt at a time here); its
    decode takes the new tokens' `mm_token_type_ids`, 0 (text)."""
    import numpy as np
    import onnx_ir

    nodes: list = []

    def op(kind, *inputs, **attributes):
        nodes.append(onnx_ir.node(kind, list(inputs), attributes=attributes))
        return nodes[-1].outputs[0]

    def constant(values):
        return op("Constant", value=onnx_ir.tensor(np.asarray(values, dtype=np.int64)))

    derived = {}
    rope = outer["position_ids"]
    if len(rope.shape) == 3 and static_int(positions.shape[0]) == ROPE_AXES + 1:
        shape = op("Shape", rope)
        batch, length = op("Gather", shape, constant([1])), op("Gather", shape, constant([2]))
        total = op("Gather", op("Shape", outer["attention_mask"]), constant(1))
        start = op("Sub", total, op("Squeeze", length, constant([0])))
        text = op("Unsqueeze", op("Range", start, total, constant(1)), constant([0, 1]))
        text = op("Expand", text, op("Concat", constant([1]), batch, length, axis=0))
        derived["position_ids"] = op("Concat", text, rope, axis=0)
        derived["position_ids"].name = "position_ids_with_text_row"
    if any(value.name == "mm_token_type_ids" for value in step.graph.inputs):
        shape = op("Slice", op("Shape", outer["inputs_embeds"]), constant([0]), constant([2]))
        derived["mm_token_type_ids"] = op("ConstantOfShape", shape,
                                          value=onnx_ir.tensor(np.zeros(1, dtype=np.int64)))
        derived["mm_token_type_ids"].name = "mm_token_type_ids_text"
    return nodes, derived


def _output_name(engine_name: str) -> str:
    return decoder_contract.contract_name(engine_name, is_output=True)


def _prompt_graph(language_model, lm_head):
    """The engine's `language_model` (inputs_embeds -> last_hidden_state, cache) with `lm_head` after it: `logits`
    and the cache, as the decode's outputs."""
    graph, head = language_model.graph, lm_head.graph
    hidden = next(value for value in graph.outputs if value.name == "last_hidden_state")
    (head_input,), (logits,) = head.inputs, head.outputs
    head.outputs.clear()
    head_input.replace_all_uses_with(hidden)
    for name, value in list(head.initializers.items()):
        head.initializers.pop(name)
        value.name = f"lm_head/{name}"
        graph.register_initializer(value)
    nodes = list(head)
    head.remove(nodes, safe=False)
    for node in nodes:
        node.name = f"lm_head/{node.name}"
        for value in node.outputs:
            value.name = f"lm_head/{value.name}"
    graph.extend(nodes)
    logits.name = "logits"
    outputs = [logits, *(value for value in graph.outputs if value is not hidden)]
    graph.outputs.clear()
    graph.outputs.extend(outputs)
    return language_model


def _decode_on_embeddings(decode):
    """The engine's `decode` taking `inputs_embeds` where it looked its `input_ids` up in the embedding table."""
    import onnx_ir

    graph = decode.graph
    lookup = embedding_lookup(graph)
    ids, table = lookup.inputs[1], lookup.inputs[0]
    embeddings = lookup.outputs[0]
    embeds = onnx_ir.Value(name="inputs_embeds", type=embeddings.type,
                           shape=onnx_ir.Shape([ids.shape[0], ids.shape[1], table.shape[1]]))
    embeddings.replace_all_uses_with(embeds)
    graph.remove(lookup, safe=True)
    if not ids.uses():
        graph.inputs.remove(ids)
    if not table.uses() and table.name in graph.initializers:
        graph.initializers.pop(table.name)
    graph.inputs.append(embeds)
    return decode


def save_processor_files(folder: Path, processor) -> None:
    """Beside an image-text-to-text layout (`FILES` in `folder`), after `processor.save_pretrained`: the image
    processor's settings flat in `preprocessor_config.json` (transformers.js' `AutoImageProcessor` reads that file;
    transformers 5 nests them in `processor_config.json`), and the processor's chat template in
    `tokenizer_config.json` (transformers.js' tokenizer reads `chat_template` there; transformers 5 writes
    `chat_template.jinja`). Owner files already there are kept."""
    folder = Path(folder)
    if not all((folder / name).is_file() for name in FILES):
        return
    save_flat_preprocessor_config(folder)
    template = getattr(processor, "chat_template", None)
    tokenizer_config = folder / "tokenizer_config.json"
    tokenizer_settings = read_json_object(tokenizer_config)
    if isinstance(template, str) and tokenizer_settings and "chat_template" not in tokenizer_settings:
        tokenizer_config.write_text(json.dumps({**tokenizer_settings, "chat_template": template}, indent=2) + "\n",
                                    encoding="utf-8")


