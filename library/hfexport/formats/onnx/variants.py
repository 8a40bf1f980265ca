"""transformers.js' dtype variants of an ONNX generation export, made from its float32 `model.onnx` (no re-export).

- `q4`: ONNX Runtime's `MatMulNBitsQuantizer` (every MatMul with a constant weight becomes a `MatMulNBits` of 4-bit
  blocks; the ops it does not handle stay float32), blocks of 32, symmetric, as transformers.js' scripts/quantize.py
  makes `model_q4.onnx`, but the head (`head_nodes`: the MatMul writing `logits`) in `head_bits` (8 by default: a
  4-bit head fails SmolLM2's runtime gate, docs/quantization.md); `q4f16`: that graph converted to float16. A head
  tied to the embedding reaches its MatMul through a `Transpose` of the embedding's weight, which the quantizer does
  not take for a constant: it is given its own transposed copy first (`untied_head`); with `tied_embedding` (the
  default) the embedding then reads the head's blocks (`tie_embedding`, a `GatherBlockQuantized`, as
  onnxruntime-genai's model builder ties them), so the table is stored once, quantized.
- `q8`: with `weights_only` (the default) the same `MatMulNBits` form at 8 bits, head and tied embedding included,
  float activations, in blocks of `block_size` (default: `block_size_for` the graph); else `quantize_dynamic` over
  ONNX Runtime's `IntegerOpsRegistry` ops with `MatMulConstBOnly` and `EnableSubgraph` as transformers.js' script
  makes q8 (int8 activations; its embedding `Gather` 8-bit per tensor, which a tied head then reads dequantized),
  the weight type by transformers.js' rule (`uint8_ops`: uint8 where the graph has Conv, GroupQueryAttention or
  MultiHeadAttention, whose int8 kernels the WebAssembly backend lacks; int8 otherwise). On SmolLM2 that dynamic form fails q8's gate (the down projections' activations, the
  per-tensor 8-bit table: docs/quantization.md).
- `fp16` and the float16 half of `q4f16`: hfexport's float16 conversion (`hfexport.formats.onnx.float16`: float16
  inputs and outputs, the KV cache included, where transformers.js' script keeps float32 ones; its
  `transformers.js_config` then says `kv_cache_dtype` float16 for them).

`write(folder, variant, stage)` lays the variant out in `stage` as the contract folder the runtimes open (the
variant's graph as `model.onnx` + `model.onnx_data`, without the exporter's node metadata, every other file
linked); `keep` moves it into the target's folder under its published name; `next_token_scores` runs a graph of
the contract on token rows with an empty cache.
"""

from __future__ import annotations

import os
import tempfile
from pathlib import Path

from hfexport.formats.onnx.attention_fusion import fuse_attention
from hfexport.formats.onnx.decoder_contract import DATA_FILE, MODEL_FILE, PAST, relocated
from hfexport.formats.onnx.float16 import float16_model
from hfexport.quantization.shapes import dividing_group_size

#: the variants whose graph has each layer's attention fused (`attention_fusion`): those made for decode speed
QUANTIZED = ("q4", "q4f16", "q8")
#: transformers.js' QUINT8_OPS (scripts/quantize.py): a graph with one of them gets uint8 weights at q8
UINT8_OPS = ("Conv", "GroupQueryAttention", "MultiHeadAttention")


def write(folder: Path, variant: dict, stage: Path) -> dict:
    """The variant `variant` (its full settings) of the contract graph in `folder`, laid out in `stage`; the
    settings it resolved from the graph (q8's `block_size` when left unset)."""
    import onnx_ir

    folder, stage = Path(folder), Path(stage)
    stage.mkdir(parents=True, exist_ok=True)
    for path in folder.iterdir():
        if path.name not in (MODEL_FILE, DATA_FILE) and not path.name.startswith("."):
            (stage / path.name).symlink_to(path.resolve())
    name, resolved = variant["name"], {}
    if variant.get("block_size", 0) is None:
        resolved["block_size"] = block_size_for(folder / MODEL_FILE)
        variant = {**variant, **resolved}
    with tempfile.TemporaryDirectory(prefix=".variant-", dir=stage) as scratch:
        source = folder / MODEL_FILE
        if name in QUANTIZED and variant.get("fused_attention", True):
            source = fuse_attention(source, Path(scratch) / "fused.onnx")
        if name in ("q4", "q4f16"):
            source = _weight_only(source, Path(scratch) / "q4.onnx", variant, bits=4)
        elif name == "q8" and variant["weights_only"]:
            source = _weight_only(source, Path(scratch) / "q8.onnx", variant, bits=8)
        elif name == "q8":
            source = _eight_bit(source, Path(scratch) / "q8.onnx", variant)
        if name in ("fp16", "q4f16"):
            model = onnx_ir.from_proto(float16_model(source))
        else:
            model = onnx_ir.load(str(source))
        for node in onnx_ir.traversal.RecursiveGraphIterator(model.graph):
            node.metadata_props.clear()  # the exporter's stack traces: 3.4 of SmolLM2's graph's 3.6 MB, no computation
        onnx_ir.save(model, str(stage / MODEL_FILE), external_data=DATA_FILE)
    return resolved


def block_size_for(source: Path, at_most: int = 128) -> int:
    """The largest power of two up to `at_most` (at least 16) that divides the input size of every MatMul of
    `source` with a constant weight (a tied head's through its `Transpose`: the embedding's width), or 32 where none
    does (MatMulNBits pads the last block then). So a block's float32 scale costs at most 1/16 of its 8-bit bytes, no
    row is padded to whole blocks and a tied embedding can read the head's. SmolLM2-135M (576 and 1536): 64."""
    import onnx

    graph = onnx.load(str(source), load_external_data=False).graph
    weights = {tensor.name: list(tensor.dims) for tensor in graph.initializer}
    transposed = {node.output[0]: weights[node.input[0]][::-1] for node in graph.node
                  if node.op_type == "Transpose" and node.input[0] in weights}
    sizes = [shape[0] for node in graph.node if node.op_type == "MatMul" and len(node.input) == 2
             for shape in [weights.get(node.input[1]) or transposed.get(node.input[1])] if shape and len(shape) == 2]
    return dividing_group_size(sizes, at_most) or 32


def _weight_only(source: Path, output: Path, variant: dict, bits: int) -> Path:
    """`source` with every MatMul of a constant weight a `MatMulNBits` of `bits`-bit blocks, the head's at
    `variant["head_bits"]` (a second quantizer pass on it alone); the tied embedding reading the head's blocks with
    `tied_embedding`."""
    from onnxruntime.quantization.matmul_nbits_quantizer import MatMulNBitsQuantizer

    source = untied_head(source, output.with_name("untied.onnx"))
    head_bits = variant.get("head_bits") or bits
    heads = head_nodes(source) if head_bits != bits else []
    options = {"block_size": variant["block_size"], "is_symmetric": variant.get("symmetric", True),
               "accuracy_level": variant["accuracy_level"]}
    quantizer = MatMulNBitsQuantizer(str(source), bits=bits, nodes_to_exclude=heads, **options)
    quantizer.process()
    if heads:
        quantizer = MatMulNBitsQuantizer(quantizer.model.model, bits=head_bits, nodes_to_include=heads, **options)
        quantizer.process()
    quantizer.model.save_model_to_file(str(output), use_external_data_format=True)
    if variant["tied_embedding"] and options["is_symmetric"]:
        return tie_embedding(output, output.with_name("tied.onnx"))
    return output


def head_nodes(source: Path) -> list[str]:
    """The names of the MatMul nodes of `source` that write a graph output (a decoder's head: `logits`)."""
    import onnx

    graph = onnx.load(str(source), load_external_data=False).graph
    outputs = {value.name for value in graph.output}
    return [node.name for node in graph.node if node.op_type == "MatMul" and node.output[0] in outputs]


def tie_embedding(source: Path, output: Path) -> Path:
    """The quantized graph `source` where each embedding `Gather` of a float table whose tied head
    (`untied_head`'s transposed copy) became a `MatMulNBits` reads that head's blocks instead, through a `Reshape`
    and a `GatherBlockQuantized` (the head's bits, 4 or 8, and block size, symmetric: no zero points), as
    onnxruntime-genai's model builder ties them, and the float table is dropped; saved as `output` (+ `.data`), or
    `source` itself where none is tied. Without it the float32 table is most of a tied model's q4 file (SmolLM2-135M:
    113 of 215 MB with the head 8-bit). A head whose rows are not whole blocks (K % block_size) is left as
    it is (the builder slices padded rows off instead)."""
    import numpy as np
    import onnx_ir

    model = onnx_ir.load(str(source))
    heads = {node.inputs[1].name.rsplit("_Q", 1)[0]: node for node in model.graph
             if node.op_type == "MatMulNBits" and node.domain == "com.microsoft" and len(node.inputs) == 3}
    tied = 0
    for node in list(model.graph):
        table = node.inputs[0] if node.op_type == "Gather" and node.domain == "" else None
        if table is None or table.const_value is None or table.shape is None or len(table.shape) != 2 \
                or node.attributes.get_int("axis", 0) != 0:
            continue
        head = heads.get(f"{table.name}.transposed")
        if head is None:
            continue
        rows, hidden = table.shape
        block_size, bits = head.attributes.get_int("block_size"), head.attributes.get_int("bits")
        if bits not in (4, 8) or head.attributes.get_int("N") != rows \
                or head.attributes.get_int("K") != hidden or hidden % block_size:
            continue
        flat = onnx_ir.Value(name=f"{table.name}.tied_shape", const_value=onnx_ir.tensor(
            np.asarray([rows, hidden * bits // 8], dtype=np.int64), name=f"{table.name}.tied_shape"))
        model.graph.register_initializer(flat)
        reshape = onnx_ir.node("Reshape", [head.inputs[1], flat], name=f"{node.name}.tied_table")
        gather = onnx_ir.node("GatherBlockQuantized", [reshape.outputs[0], node.inputs[1], head.inputs[2]],
                              domain="com.microsoft", name=f"{node.name}_Q{bits}",
                              attributes={"bits": bits, "block_size": block_size, "gather_axis": 0, "quantize_axis": 1})
        model.graph.insert_before(node, [reshape, gather])
        original = node.outputs[0]
        gather.outputs[0].type, gather.outputs[0].shape = original.type, original.shape
        original.replace_all_uses_with(gather.outputs[0], replace_graph_outputs=True)
        model.graph.remove(node, safe=True)
        gather.outputs[0].name = original.name
        if not table.uses():
            model.graph.initializers.pop(table.name)
        tied += 1
    if not tied:
        return source
    model.opset_imports.setdefault("com.microsoft", 1)
    onnx_ir.save(model, str(output), external_data=output.name + ".data")
    return output


def untied_head(source: Path, output: Path) -> Path:
    """`source` with each MatMul whose weight is a `Transpose` of an initializer (a head tied to the embedding) reading
    its own transposed copy instead, saved as `output` (+ `.data`); `source` itself where there is none. Without it
    the quantizer leaves that MatMul float32: on SmolLM2 the head is the largest weight a decode step reads (measured,
    benchmarks/variant_speed.py)."""
    import onnx_ir

    model = onnx_ir.load(str(source))
    untied = 0
    for node in list(model.graph):
        weight = node.inputs[1] if node.op_type == "MatMul" and len(node.inputs) == 2 else None
        transpose = weight.producer() if weight is not None else None
        if transpose is None or transpose.op_type != "Transpose":
            continue
        tied = transpose.inputs[0]
        perm = transpose.attributes.get("perm")
        if tied is None or tied.const_value is None or tied.shape is None or len(tied.shape) != 2 \
                or (perm is not None and list(perm.as_ints()) != [1, 0]):
            continue
        copy = onnx_ir.Value(name=f"{tied.name}.transposed", type=tied.type,
                             const_value=onnx_ir.tensor(tied.const_value.numpy().T.copy(),
                                                        name=f"{tied.name}.transposed"))
        copy.shape = onnx_ir.Shape(list(copy.const_value.shape))
        model.graph.register_initializer(copy)
        node.replace_input_with(1, copy)
        if not transpose.outputs[0].uses():
            model.graph.remove(transpose, safe=True)
        untied += 1
    if not untied:
        return source
    onnx_ir.save(model, str(output), external_data=output.name + ".data")
    return output


def _eight_bit(source: Path, output: Path, variant: dict) -> Path:
    import onnx
    from onnxruntime.quantization import QuantType, quantize_dynamic
    from onnxruntime.quantization.registry import IntegerOpsRegistry

    graph = onnx.load(str(source), load_external_data=False)
    weight_type = QuantType.QUInt8 if uint8_ops(graph) else QuantType.QInt8
    quantize_dynamic(str(source), str(output), op_types_to_quantize=sorted(IntegerOpsRegistry),
                     per_channel=variant["per_channel"], reduce_range=variant["reduce_range"], weight_type=weight_type,
                     use_external_data_format=True, extra_options={"EnableSubgraph": True, "MatMulConstBOnly": True})
    return output


def uint8_ops(model) -> list[str]:
    """The ops of `model` (an ONNX proto, subgraphs included) for which transformers.js quantizes q8 weights to uint8."""
    found, graphs = set(), [model.graph]
    while graphs:
        graph = graphs.pop()
        for node in graph.node:
            found.add(node.op_type)
            for attribute in node.attribute:
                if attribute.HasField("g"):
                    graphs.append(attribute.g)
                graphs.extend(attribute.graphs)
    return [op for op in UINT8_OPS if op in found]


def keep(stage: Path, folder: Path, file_name: str) -> list[str]:
    """Move the variant's graph in `stage` into `folder` as `file_name` + `file_name_data` (the graph naming it);
    the names written. Each file is written aside and renamed, so `folder` never holds half of one."""
    stage, folder = Path(stage), Path(folder)
    data_name = file_name + "_data"
    names = [file_name]
    if (stage / DATA_FILE).is_file():
        os.replace(stage / DATA_FILE, folder / data_name)
        names.append(data_name)
        graph = relocated(stage / MODEL_FILE, DATA_FILE, data_name)
    else:
        (folder / data_name).unlink(missing_ok=True)
        graph = (stage / MODEL_FILE).read_bytes()
    partial = folder / f".{file_name}.partial"
    partial.write_bytes(graph)
    os.replace(partial, folder / file_name)
    return names


def next_token_scores(stage: Path, rows: list[list[int]]) -> list[tuple[list[float], list[int]]]:
    """Per token row (batch 1, an empty cache): the log-likelihood of each next token of the row (len - 1 values)
    and the argmax next token at each position (len values), computed in float64 from the graph's logits."""
    import numpy as np
    import onnxruntime

    session = onnxruntime.InferenceSession(str(Path(stage) / MODEL_FILE), providers=["CPUExecutionProvider"])
    types = {"tensor(float)": np.float32, "tensor(float16)": np.float16}
    results = []
    for row in rows:
        ids = np.asarray([row], dtype=np.int64)
        feed = {}
        for value in session.get_inputs():
            if value.name == "input_ids":
                feed[value.name] = ids
            elif value.name == "attention_mask":
                feed[value.name] = np.ones_like(ids)
            elif value.name == "position_ids":
                feed[value.name] = np.arange(ids.shape[1], dtype=np.int64)[None]
            elif value.name.startswith("past_key_values."):
                shape = [1 if axis == 0 else 0 if axis == 2 else value.shape[axis] for axis in range(len(value.shape))]
                if any(not isinstance(size, int) for size in shape):
                    raise ValueError(f"{value.name}: a cache axis other than {PAST} is not static: {value.shape}")
                feed[value.name] = np.zeros(shape, dtype=types[value.type])
            else:
                raise ValueError(f"the graph takes {value.name!r}, which a decoder's contract does not feed")
        logits = session.run(["logits"], feed)[0][0].astype(np.float64)
        shifted = logits - logits.max(axis=-1, keepdims=True)
        log_probs = shifted - np.log(np.exp(shifted).sum(axis=-1, keepdims=True))
        chosen = [float(log_probs[position, token]) for position, token in enumerate(row[1:])]
        results.append((chosen, [int(token) for token in logits.argmax(axis=-1)]))
    return results
