"""A decoder's attention in ONNX Runtime's fused CPU kernels, for the quantized variants (`fuse_attention`).

The export writes each layer's attention as some 35 plain ops (q, k and v projected apart, rotary as slices and
products, the cache concatenated, the scores, mask and softmax as matmuls): in a decode step on SmolLM2-135M that is
1553 nodes run where onnxruntime-genai's model builder runs 309, and per-node overhead, not arithmetic, is most of
the gap (measured, docs/quantization.md "Variants"). `fuse_attention` rewrites each layer as: one MatMul over the q,
k and v weights concatenated (as the builder packs them), a `Split`, a `com.microsoft::RotaryEmbedding` each for q
and k at the graph's `position_ids` (cos/sin tables evaluated from the export's own rotary subgraph), and one
`com.microsoft::GroupQueryAttention` over the cache under the contract's names, with the export's mask as its
`attention_bias` (`_bias`: recomputed from `attention_mask` and `input_ids` alone, 12 nodes where the export's reads
the cache's length off a past input's shape) and every row's `seqlens_k` the mask's width - 1: so a left-padded batch
(transformers.js, optimum) computes what the export computes, where the builder's form (rotary inside, `seqlens_k` =
the mask's ones - 1) reads padding as right padding; and onnxruntime-genai may share past and present buffers. The RMSNorms become `SkipSimplifiedLayerNormalization`. onnxscript's rotary rule finds the
rotary products; its SDPA and GQA rules do not match the export (docs/quantization.md). All or nothing: a graph where
one layer does not match stays as it was.
"""

from __future__ import annotations

import json
from pathlib import Path

from hfexport.errors import HfExportError
from hfexport.formats.onnx import lazy_tensors

ROTARY_DOMAIN = "ai.onnxruntime._fusion"  # onnxscript's rotary rule's intermediate op
#: rotary types whose cos/sin depend on the position alone (a table indexed by position is exact)
STATIC_ROPE = ("default", "linear", "llama3")


class _NoMatch(HfExportError):  # noqa: N818 - internal control flow, never leaves this module
    """A layer's graph is not the form `fuse_attention` rewrites (caught there: the graph is kept as it is)."""


def fusable(config: dict) -> bool:
    """Whether a decoder of `config` (config.json) has the attention `fuse_attention` writes: full causal attention
    (no sliding window, no logit soft-capping) with a position-only rotary."""
    text = config.get("text_config") or config
    rope = text.get("rope_parameters") or text.get("rope_scaling") or {}
    rope_type = rope.get("rope_type", rope.get("type", "default")) if isinstance(rope, dict) else None
    layer_types = text.get("layer_types") or []
    return (rope_type in STATIC_ROPE and not text.get("sliding_window")
            and not text.get("attn_logit_softcapping")
            and all(kind == "full_attention" for kind in layer_types))


def fuse_attention(source: Path, output: Path) -> Path:
    """`source` (a decoder in the loaders' contract, its config.json beside it) with every layer's attention one
    `GroupQueryAttention` over a packed q/k/v projection, saved as `output` (+ `.data`); `source` itself where the
    model is not `fusable` or any layer does not match."""
    import onnx_ir as ir

    config_file = Path(source).with_name("config.json")
    config = json.loads(config_file.read_text()) if config_file.is_file() else {}
    if not fusable(config):
        return source
    model = ir.load(str(source))
    try:
        fused = _fuse(model, _positions(config))
    except _NoMatch:
        return source
    if not fused:
        return source
    ir.save(model, str(output), external_data=Path(output).name + ".data")
    return output


def _positions(config: dict) -> int:
    text = config.get("text_config") or config
    return int(text.get("max_position_embeddings") or 4096)


def _fuse(model, positions: int) -> int:
    """Rewrite `model` in place; the number of layers fused. Raises `_NoMatch` before any layer is rewritten where
    one does not match (the rotary products may be fused by then: the caller keeps the source file)."""
    import numpy as np
    import onnx_ir as ir
    from onnx_ir.passes.common import RemoveUnusedFunctionsPass, RemoveUnusedNodesPass, RemoveUnusedOpsetsPass
    from onnxscript.rewriter.ort_fusions.rotary_embedding import fuse_rotary_embedding

    inputs = {value.name: value for value in model.graph.inputs}
    if not {"input_ids", "attention_mask", "position_ids"} <= set(inputs):
        raise _NoMatch("no input_ids, attention_mask or position_ids")
    outputs = {value.name: value for value in model.graph.outputs}
    layers = []
    for name, value in outputs.items():
        if name.startswith("present.") and name.endswith(".key"):
            index = name[len("present."):-len(".key")]
            layers.append((index, value, outputs.get(f"present.{index}.value")))
    if not layers:
        return 0
    if not fuse_rotary_embedding(model):
        raise _NoMatch("no rotary")
    matched = [_match(model, index, key, value, inputs) for index, key, value in layers]
    cos, sin = _tables(model, matched[0]["cos"], matched[0]["sin"], positions, matched[0]["head_size"])
    if any(layer["cos"] is not matched[0]["cos"] or layer["sin"] is not matched[0]["sin"] for layer in matched):
        raise _NoMatch("layers read different rotary tables")
    # -- from here the graph changes --
    cos_cache, sin_cache = (_initializer(model, f"attention.{name}_cache", table) for name, table in
                            (("cos", cos), ("sin", sin)))
    seqlens_k, total_length, width = _lengths(model, inputs["attention_mask"])
    bias = _bias(model, inputs["attention_mask"], inputs["input_ids"], width, matched[0]["mask"].type)
    position_ids = inputs["position_ids"]
    for layer in matched:
        packed = _packed_projection(model, layer)
        prefix, size = f"layer.{layer['index']}", layer["head_size"]
        widths = _initializer(model, f"{prefix}.qkv_widths", np.asarray(
            [layer["heads"] * size, layer["kv_heads"] * size, layer["kv_heads"] * size], dtype=np.int64))
        split = ir.node("Split", [packed, widths], attributes={"axis": -1}, num_outputs=3, name=f"{prefix}.qkv_split")
        rotated = [ir.node("RotaryEmbedding", [part, position_ids, cos_cache, sin_cache],
                           attributes={"interleaved": 0, "num_heads": heads}, domain="com.microsoft",
                           name=f"{prefix}.{which}_rotary")
                   for part, heads, which in ((split.outputs[0], layer["heads"], "q"),
                                              (split.outputs[1], layer["kv_heads"], "k"))]
        gqa = ir.node("GroupQueryAttention", [rotated[0].outputs[0], rotated[1].outputs[0], split.outputs[2],
                                              layer["past_key"], layer["past_value"], seqlens_k, total_length,
                                              None, None, None, bias],
                      attributes={"num_heads": layer["heads"], "kv_num_heads": layer["kv_heads"], "do_rotary": 0,
                                  "scale": layer["scale"]},
                      domain="com.microsoft", num_outputs=3, name=f"{prefix}.GroupQueryAttention")
        model.graph.insert_after(packed.producer(), [split, *rotated, gqa])
        for old, new in zip((layer["output"], layer["present_key"], layer["present_value"]), gqa.outputs,
                            strict=True):
            new.type, new.shape = old.type, old.shape
            name = old.name
            old.replace_all_uses_with(new, replace_graph_outputs=True)
            old.name = None
            new.name = name
    _fuse_norms(model)
    RemoveUnusedNodesPass()(model)
    RemoveUnusedFunctionsPass()(model)
    if any(node.domain == ROTARY_DOMAIN for node in model.graph):
        raise RuntimeError("a rotary product was fused but not taken into GroupQueryAttention")
    model.opset_imports.pop(ROTARY_DOMAIN, None)
    model.opset_imports.setdefault("com.microsoft", 1)
    RemoveUnusedOpsetsPass()(model)
    return len(matched)


def _producer(value, op_type: str, domain: str = ""):
    node = value.producer() if value is not None else None
    if node is None or node.op_type != op_type or node.domain != domain:
        raise _NoMatch(f"{value.name if value is not None else None}: not a {op_type}")
    return node


def _only_consumer(value, op_types: tuple[str, ...]):
    consumers = [use.node for use in value.uses()]
    if len(consumers) != 1 or consumers[0].op_type not in op_types or consumers[0].domain != "":
        raise _NoMatch(f"{value.name}: not read by one {op_types}")
    return consumers[0]


def _scalar(value) -> float:
    import onnx_ir as ir

    constant = ir.convenience.get_const_tensor(value)
    if constant is None or constant.numpy().size != 1:
        raise _NoMatch(f"{value.name}: not a scalar constant")
    return float(constant.numpy().reshape(-1)[0])


def _heads_view(value):
    """The [B, S, heads * size] projection a [B, heads, S, size] value is a `Transpose(Reshape(.))` of."""
    transpose = _producer(value, "Transpose")
    if list(transpose.attributes.get_ints("perm", [])) != [0, 2, 1, 3]:
        raise _NoMatch("not a heads transpose")
    projection = _producer(transpose.inputs[0], "Reshape").inputs[0]
    if projection.shape is None or len(projection.shape) != 3:
        raise _NoMatch("the projection is not 3-d")
    return projection


def _rotary(value):
    node = _producer(value, "RotaryEmbedding", ROTARY_DOMAIN)
    if node.attributes.get_int("interleaved", 0) != 0:
        raise _NoMatch("interleaved rotary")
    return node


def _match(model, index: str, present_key, present_value, inputs: dict) -> dict:
    """One layer's attention, from its two cache outputs back to the projections and forward to its [B, S, D]
    output: the values the fused layer reads and replaces, its head counts and scale."""
    if present_value is None:
        raise _NoMatch("no present value")
    key_concat, value_concat = _producer(present_key, "Concat"), _producer(present_value, "Concat")
    for concat in (key_concat, value_concat):
        if len(concat.inputs) != 2 or concat.attributes.get_int("axis") not in (2, -2) \
                or concat.inputs[0] not in model.graph.inputs:
            raise _NoMatch("the cache is not the past concatenated")
    key_rotary = _rotary(key_concat.inputs[1])
    key, value = _heads_view(key_rotary.inputs[0]), _heads_view(value_concat.inputs[1])
    # scores: present key -> Unsqueeze / Transpose / Mul ... -> MatMul(query side, key side)
    node, scale = _only_consumer_of_cache(present_key), 1.0
    while node.op_type != "MatMul":
        if node.op_type == "Mul":
            scale *= _scalar(node.inputs[1])
        node = _only_consumer(node.outputs[0], ("Unsqueeze", "Transpose", "Mul", "MatMul"))
    scores, query_side = node, node.inputs[0]
    while query_side.producer() is not None and query_side.producer().op_type in ("Mul", "Reshape"):
        producer = query_side.producer()
        if producer.op_type == "Mul":
            scale *= _scalar(producer.inputs[1])
        query_side = producer.inputs[0]
    query_rotary = _rotary(query_side)
    if (query_rotary.inputs[1], query_rotary.inputs[2]) != (key_rotary.inputs[1], key_rotary.inputs[2]):
        raise _NoMatch("query and key rotate by different tables")
    query = _heads_view(query_rotary.inputs[0])
    # scores -> [Reshape] -> Add(mask) -> Softmax -> [Reshape] -> MatMul(., value side)
    node = _only_consumer(scores.outputs[0], ("Reshape", "Add"))
    if node.op_type == "Reshape":
        node = _only_consumer(node.outputs[0], ("Add",))
    mask = node.inputs[1]
    if not _reads(mask, inputs["attention_mask"]) or mask.shape is None or len(mask.shape) != 4:
        raise _NoMatch("the mask is not a 4-d one from attention_mask")
    node = _only_consumer(node.outputs[0], ("Softmax",))
    if node.attributes.get_int("axis", -1) not in (-1, 3):
        raise _NoMatch("softmax over another axis")
    node = _only_consumer(node.outputs[0], ("Reshape", "MatMul"))
    if node.op_type == "Reshape":
        node = _only_consumer(node.outputs[0], ("MatMul",))
    value_side = node.inputs[1]
    while value_side.producer() is not None and value_side.producer().op_type in ("Unsqueeze", "Reshape", "Expand"):
        value_side = value_side.producer().inputs[0]
    if value_side is not present_value:
        raise _NoMatch("the probabilities do not read the value cache")
    # -> [Reshape] -> [Where (fully masked rows)] -> Transpose -> Reshape: [B, S, D]
    node = _only_consumer(node.outputs[0], ("Reshape", "Where", "Transpose"))
    while node.op_type != "Transpose":
        node = _only_consumer(node.outputs[0], ("Reshape", "Where", "Transpose"))
    if list(node.attributes.get_ints("perm", [])) != [0, 2, 1, 3]:
        raise _NoMatch("not a heads transpose back")
    output = _only_consumer(node.outputs[0], ("Reshape",)).outputs[0]
    heads, kv_heads = query_rotary.attributes.get_int("num_heads"), key_rotary.attributes.get_int("num_heads")
    head_size = query_rotary.inputs[0].shape[3]
    if isinstance(head_size, int) and abs(scale * head_size**0.5 - 1) < 1e-6:  # two float32 roots' product
        scale = head_size**-0.5
    if not all(isinstance(n, int) for n in (heads, kv_heads, head_size)) or heads % kv_heads or head_size % 2:
        raise _NoMatch("head counts")
    if output.shape is None or len(output.shape) != 3:
        raise _NoMatch("the output is not 3-d")
    return {"index": index, "query": query, "key": key, "value": value, "past_key": key_concat.inputs[0],
            "past_value": value_concat.inputs[0], "present_key": present_key, "present_value": present_value,
            "output": output, "heads": heads, "kv_heads": kv_heads, "head_size": head_size, "scale": scale,
            "cos": query_rotary.inputs[1], "sin": query_rotary.inputs[2], "mask": mask}


def _only_consumer_of_cache(present):
    """The one node reading the cache output other than `Shape`s (the scores' reshape reads its length)."""
    consumers = [use.node for use in present.uses() if use.node.op_type != "Shape"]
    if len(consumers) != 1:
        raise _NoMatch(f"{present.name}: read more than once")
    return consumers[0]


def _ancestors(value) -> tuple[list, set]:
    """The nodes `value` is computed by (graph order unknown: a set) and the graph inputs it reads."""
    nodes, inputs, stack, seen = [], set(), [value], set()
    while stack:
        current = stack.pop()
        if current is None or id(current) in seen:
            continue
        seen.add(id(current))
        producer = current.producer()
        if producer is None:
            if current.is_graph_input():
                inputs.add(current.name)
            continue
        nodes.append(producer)
        stack.extend(producer.inputs)
    return nodes, inputs


def _reads(value, graph_input) -> bool:
    return graph_input.name in _ancestors(value)[1]


def _tables(model, cos, sin, positions: int, head_size: int):
    """The [positions, head_size / 2] cos and sin tables RotaryEmbedding takes, evaluated by ONNX Runtime from
    the export's own subgraph from `position_ids` to `cos` and `sin` ([B, 1, S, head_size], halves repeated)."""
    import numpy as np
    import onnx
    import onnx_ir as ir
    import onnxruntime

    nodes, read = _ancestors(cos)
    more, read_too = _ancestors(sin)
    if read | read_too != {"position_ids"}:
        raise _NoMatch(f"the rotary tables read {sorted(read | read_too)}, not position_ids alone")
    chosen = {id(node) for node in nodes + more}
    ordered = [node for node in model.graph if id(node) in chosen]
    initializers, names = [], set()
    for node in ordered:
        for value in node.inputs:
            if value is not None and value.is_initializer() and value.name not in names:
                names.add(value.name)
                initializers.append(ir.serde.serialize_tensor(value.const_value))
                initializers[-1].name = value.name
    graph = onnx.helper.make_graph(
        [ir.serde.serialize_node(node) for node in ordered], "rotary_tables",
        [onnx.helper.make_tensor_value_info("position_ids", onnx.TensorProto.INT64, [1, None])],
        [onnx.helper.make_tensor_value_info(value.name, onnx.TensorProto.FLOAT, None) for value in (cos, sin)],
        initializers)
    proto = onnx.helper.make_model(graph, opset_imports=[onnx.helper.make_opsetid(domain, version) for domain, version
                                                         in model.opset_imports.items()])
    session = onnxruntime.InferenceSession(proto.SerializeToString(), providers=["CPUExecutionProvider"])
    full = session.run([cos.name, sin.name], {"position_ids": np.arange(positions, dtype=np.int64)[None]})
    tables = []
    for table in full:
        table = np.asarray(table, dtype=np.float32).reshape(positions, head_size)
        half = head_size // 2
        if not np.array_equal(table[:, :half], table[:, half:]):
            raise _NoMatch("the rotary table's halves differ")
        tables.append(np.ascontiguousarray(table[:, :half]))
    return tables


def _initializer(model, name: str, array):
    import onnx_ir as ir

    value = ir.Value(name=name, const_value=ir.tensor(array, name=name))
    value.shape = ir.Shape(list(array.shape))
    value.type = ir.TensorType(value.const_value.dtype)
    model.graph.register_initializer(value)
    return value


def _lengths(model, attention_mask):
    """`seqlens_k` (int32 [B]: the mask's width - 1 on every row) and `total_sequence_length` (int32 scalar: the
    mask's width) from `attention_mask`, inserted at the graph's start. Every row's cache is the mask's width: a
    left-padded row's padding stays in its slots, masked by the export's own mask (`attention_bias`), as in the
    export (the builder's `ReduceSum(mask) - 1` counts a padded row's tokens, which GroupQueryAttention reads as its
    first slots: right padding)."""
    import numpy as np
    import onnx_ir as ir

    one = _initializer(model, "attention.one", np.asarray(1, dtype=np.int64))
    batch = ir.node("Shape", [attention_mask], attributes={"start": 0, "end": 1}, name="attention.batch")
    shape = ir.node("Shape", [attention_mask], attributes={"start": 1, "end": 2}, name="attention.mask_width")
    width = ir.node("Squeeze", [shape.outputs[0]], name="attention.total_length_int64")
    minus_one = ir.node("Sub", [width.outputs[0], one], name="attention.last_slot")
    rows = ir.node("Expand", [minus_one.outputs[0], batch.outputs[0]], name="attention.seqlens_k_int64")
    seqlens = ir.node("Cast", [rows.outputs[0]], attributes={"to": ir.DataType.INT32},
                      name="attention.seqlens_k")
    length = ir.node("Cast", [width.outputs[0]], attributes={"to": ir.DataType.INT32},
                     name="attention.total_sequence_length")
    nodes = [batch, shape, width, minus_one, rows, seqlens, length]
    seqlens.outputs[0].name, length.outputs[0].name = "attention.seqlens_k", "attention.total_sequence_length"
    model.graph.insert_before(next(iter(model.graph)), nodes)
    return seqlens.outputs[0], length.outputs[0], width.outputs[0]


def _bias(model, attention_mask, input_ids, width, dtype):
    """`attention_bias` ([B, 1, S, W] of `dtype`: 0 where query i of the S new tokens may read key slot j of the
    mask's W, the type's lowest value elsewhere), what the export's mask computes (slot j read where the mask has a
    1 and j <= W - S + i), from `attention_mask` and `input_ids` alone, inserted after `_lengths`' nodes: 12 nodes
    where the export's reads the cache's length from a past input's shape (35 on SmolLM2), which a runtime sharing
    past and present buffers (onnxruntime-genai's `past_present_share_buffer`) sizes to its maximum length."""
    import numpy as np
    import onnx_ir as ir

    numpy_type = dtype.dtype.numpy()
    zero = _initializer(model, "attention.bias_zero", np.asarray(0, dtype=numpy_type))
    lowest = _initializer(model, "attention.bias_lowest", np.asarray(np.finfo(numpy_type).min, dtype=numpy_type))
    start, step = (_initializer(model, f"attention.{name}", np.asarray(value, dtype=np.int64))
                   for name, value in (("range_start", 0), ("range_step", 1)))
    axes = {name: _initializer(model, f"attention.axes_{name}", np.asarray(value, dtype=np.int64))
            for name, value in (("0", [0]), ("1", [1]), ("1_2", [1, 2]))}
    new = ir.node("Shape", [input_ids], attributes={"start": 1, "end": 2}, name="attention.new_tokens_shape")
    count = ir.node("Squeeze", [new.outputs[0]], name="attention.new_tokens")
    first = ir.node("Sub", [width, count.outputs[0]], name="attention.first_query_slot")
    keys = ir.node("Range", [start, width, step], name="attention.key_slots")
    queries = ir.node("Range", [first.outputs[0], width, step], name="attention.query_slots")
    key_row = ir.node("Unsqueeze", [keys.outputs[0], axes["0"]], name="attention.key_row")
    query_column = ir.node("Unsqueeze", [queries.outputs[0], axes["1"]], name="attention.query_column")
    causal = ir.node("LessOrEqual", [key_row.outputs[0], query_column.outputs[0]], name="attention.causal")
    present = ir.node("Cast", [attention_mask], attributes={"to": ir.DataType.BOOL}, name="attention.mask_bool")
    rows = ir.node("Unsqueeze", [present.outputs[0], axes["1_2"]], name="attention.mask_rows")
    allowed = ir.node("And", [causal.outputs[0], rows.outputs[0]], name="attention.allowed")
    bias = ir.node("Where", [allowed.outputs[0], zero, lowest], name="attention.bias")
    nodes = [new, count, first, keys, queries, key_row, query_column, causal, present, rows, allowed, bias]
    model.graph.insert_after(width.producer(), nodes)
    bias.outputs[0].name = "attention.bias"
    return bias.outputs[0]


def _packed_projection(model, layer: dict):
    """One MatMul over the q, k and v weights concatenated (as the builder packs them) where the three projections
    are MatMuls of one input by constant [D, n] weights; else a Concat of the three [B, S, .] projections."""
    import numpy as np
    import onnx_ir as ir

    producers = [value.producer() for value in (layer["query"], layer["key"], layer["value"])]
    weights = [node.inputs[1] if node is not None and node.op_type == "MatMul" and node.domain == "" else None
               for node in producers]
    same_input = len({id(node.inputs[0]) for node in producers if node is not None}) == 1
    if same_input and all(w is not None and w.const_value is not None and w.shape is not None and len(w.shape) == 2
                          for w in weights):
        tensors, name = [w.const_value for w in weights], f"layer.{layer['index']}.qkv_proj.weight"
        shape = [tensors[0].shape[0], sum(tensor.shape[1] for tensor in tensors)]
        packed = lazy_tensors.lazy(name, lambda: np.concatenate([lazy_tensors.read(t) for t in tensors], axis=1),
                                   tensors[0].dtype, shape)  # made when it is written: one layer's q/k/v at a time
        weight = ir.Value(name=name, const_value=packed, type=ir.TensorType(packed.dtype), shape=ir.Shape(shape))
        model.graph.register_initializer(weight)
        matmul = ir.node("MatMul", [producers[0].inputs[0], weight], name=f"layer.{layer['index']}.qkv_proj")
        model.graph.insert_after(producers[-1], [matmul])
        return matmul.outputs[0]
    concat = ir.node("Concat", [layer["query"], layer["key"], layer["value"]], attributes={"axis": -1},
                     name=f"layer.{layer['index']}.qkv")
    last = max(producers, key=lambda node: list(model.graph).index(node))
    model.graph.insert_after(last, [concat])
    return concat.outputs[0]


def _quotient_rms_rules():
    """onnxscript's RMSNorm rules (`RmsNormFusion`: its checks, its `SimplifiedLayerNormalization`) over the form
    the export is left in for ONNX Runtime's own fusion, `x / Sqrt(v)` (`fuse_ready_rms_norms`), where onnxscript's
    pattern is `x * Reciprocal(Sqrt(v))`."""
    from onnxscript.rewriter import pattern
    from onnxscript.rewriter.ort_fusions.rms_normalization import RmsNormFusion

    class QuotientRmsNormFusion(RmsNormFusion):
        def pattern(self, op, x, scale, epsilon, compute_dtype, target_dtype):
            x = pattern.OrValue([op.Cast(x, to=compute_dtype), x])
            mean_square = op.ReduceMean(op.Pow(x, 2.0), [-1], keepdims=1, noop_with_empty_axes=0)
            normalized = op.Div(x, op.Sqrt(op.Add(mean_square, epsilon)))
            normalized = pattern.OrValue([op.Cast(normalized, to=target_dtype), normalized])
            scale = pattern.OrValue([op.Cast(scale, to=compute_dtype), scale])
            return op.Mul(normalized, scale) if self._mul_order else op.Mul(scale, normalized)

    return pattern.RewriteRuleSet([QuotientRmsNormFusion.rule("QuotientRmsNorm1", _mul_order=False),
                                   QuotientRmsNormFusion.rule("QuotientRmsNorm2", _mul_order=True)])


def _fuse_norms(model) -> tuple[int, int]:
    """Each RMSNorm one `SimplifiedLayerNormalization`, and each residual sum feeding one a
    `SkipSimplifiedLayerNormalization` (onnxscript's rule), as the builder writes them: ONNX Runtime's session
    fuses the first but not the second (the sum is read again by the next residual); the counts."""
    from onnxscript.rewriter.ort_fusions.skip_normalization import fuse_skip_rms_normalization

    norms = _quotient_rms_rules().apply_to_model(model)
    skips = fuse_skip_rms_normalization(model) if norms else 0
    for node in model.graph:  # mean and inverse std (training outputs) left unwritten, as the builder leaves them
        if node.op_type == "SkipSimplifiedLayerNormalization" and node.domain == "com.microsoft":
            for value in node.outputs[1:3]:
                if not value.uses() and not value.is_graph_output():
                    value.name = ""
    return norms, skips
