"""transformers.js' dtype variants of an ONNX generation export, made from its float32 `model.onnx` (no re-export).

- `q4`: what ONNX Runtime's `MatMulNBitsQuantizer` writes, made one weight at a time (`weight_only`: every MatMul with
  a constant weight becomes a `MatMulNBits` of 4-bit blocks; the ops it does not handle stay float32), blocks of
  32, symmetric, as transformers.js' scripts/quantize.py makes `model_q4.onnx`, but the head (`head_nodes`: the MatMul writing `logits`) in `head_bits` (8 by default: a
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
  `transformers.js_config` then says `kv_cache_dtype` float16 for them), each weight converted as it is written.

`write(folder, variant, stage)` lays the variant out in `stage` as the contract folder the runtimes open (the
variant's graph as `model.onnx` + `model.onnx_data`, without the exporter's node metadata, every other file
linked); `keep` moves it into the target's folder under its published name; `next_token_scores` runs a graph of
the contract on token rows with an empty cache.
"""

from __future__ import annotations

import os
import tempfile
from pathlib import Path

from hfexport.formats.onnx import lazy_tensors
from hfexport.formats.onnx.attention_fusion import fuse_attention
from hfexport.formats.onnx.decoder_contract import DATA_FILE, MODEL_FILE, PAST, relocated
from hfexport.formats.onnx.float16 import streamed_float16_model
from hfexport.quantization.shapes import dividing_group_size

#: the variants whose graph has each layer's attention fused (`attention_fusion`): those made for decode speed
QUANTIZED = ("q4", "q4f16", "q8")
#: transformers.js' QUINT8_OPS (scripts/quantize.py): a graph with one of them gets uint8 weights at q8
UINT8_OPS = ("Conv", "GroupQueryAttention", "MultiHeadAttention")
#: a weight is read and quantized this much at a time (`quantized_matmul`): a 128k-token vocabulary's float32 table
#: (1 GB at Llama-3.2-1B's width) is never whole in memory, only its blocks
SLAB_BYTES = 32 << 20


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
            source = weight_only(source, Path(scratch) / "q4.onnx", variant, bits=4)
        elif name == "q8" and variant["weights_only"]:
            source = weight_only(source, Path(scratch) / "q8.onnx", variant, bits=8)
        elif name == "q8":
            source = _eight_bit(source, Path(scratch) / "q8.onnx", variant)
        if name in ("fp16", "q4f16"):
            model = streamed_float16_model(source)  # its weights converted as they are written
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


def weight_only(source: Path, output: Path, variant: dict, bits: int) -> Path:
    """`source` with every MatMul of a constant 2-D weight a `MatMulNBits` of `bits`-bit blocks, the head's at
    `variant["head_bits"]`, the tied embedding reading the head's blocks with `tied_embedding`; saved as `output`
    (+ `.data`). The nodes and initializers are those ONNX Runtime's `MatMulNBitsQuantizer` writes (its
    `DefaultWeightOnlyQuantizer.qbits_block_quant` quantizes each weight, `quantized_matmul` names them as it does),
    but each weight is read, quantized and written when the graph is saved (`lazy_tensors`), one at a time: the
    quantizer loads the whole float32 graph (tests/test_dtype_variants.py checks the files are its own)."""
    import onnx_ir

    model = onnx_ir.load(str(source))
    tables = untied_head(model)
    head_bits = variant.get("head_bits") or bits
    heads = set(head_nodes(model)) if head_bits != bits else set()
    options = {"block_size": variant["block_size"], "symmetric": variant.get("symmetric", True),
               "accuracy_level": variant["accuracy_level"]}
    for node in _matmuls(model):
        if node.name not in heads:
            quantized_matmul(node, bits, **options, table=tables.get(node.inputs[1].name))
    for node in _matmuls(model):  # the quantizer's second pass: the head alone
        if node.name in heads:
            quantized_matmul(node, head_bits, **options, table=tables.get(node.inputs[1].name))
    model.opset_imports["com.microsoft"] = 1
    graph = model.graph
    for name, value in list(graph.initializers.items()):  # as the quantizer's clean_initializers drops them
        if not value.uses() and not value.is_graph_output():
            graph.initializers.pop(name)
    quantizer_order(graph)
    if variant["tied_embedding"] and options["symmetric"]:
        tie_embedding(model)
    onnx_ir.save(model, str(output), external_data=output.name + ".data")
    return output


def quantizer_order(graph) -> None:
    """Put `graph`'s nodes (onnx_ir) in the order ONNX Runtime's quantizer saves them (`ONNXModel.topological_sort`:
    the nodes without inputs, then those the sorted initializer and input names complete, then breadth first), so
    that `weight_only`'s graph is byte for byte the quantizer's."""
    nodes = list(graph)
    waiting, readers, ready = [0] * len(nodes), {}, []
    for index, node in enumerate(nodes):
        names = [value.name for value in node.inputs if value is not None and value.name]
        waiting[index] = len(names)
        if not names:
            ready.append(index)
        for name in names:
            readers.setdefault(name, []).append(index)

    def done(name):
        for index in readers.get(name, ()):
            waiting[index] -= 1
            if not waiting[index]:
                ready.append(index)

    for name in sorted(set(graph.initializers) | {value.name for value in graph.inputs}):
        done(name)
    start = 0
    while start < len(ready):
        for value in nodes[ready[start]].outputs:
            if value.name:
                done(value.name)
        start += 1
    if len(ready) != len(nodes):
        raise RuntimeError(f"the quantized graph is not acyclic: {len(nodes) - len(ready)} nodes unreached")
    graph.remove(nodes)
    graph.extend(nodes[index] for index in ready)


def _matmuls(model) -> list:
    import onnx_ir

    return [node for node in onnx_ir.traversal.RecursiveGraphIterator(model.graph)
            if node.op_type == "MatMul" and node.domain == "" and len(node.inputs) == 2]


def quantized_matmul(node, bits: int, block_size: int, symmetric: bool, accuracy_level: int | None,
                     table=None) -> bool:
    """Replace the MatMul `node` by the `MatMulNBits` ONNX Runtime's quantizer makes of it (its
    `DefaultWeightOnlyQuantizer.quantize_matmul`: `<weight>_Q<bits>` blocks, `<weight>_scales`, `<weight>_zero_points`
    where asymmetric, `<node>_Q<bits>`), the blocks computed when they are written, `SLAB_BYTES` of the weight read
    and quantized at a time (its blocks are independent: rows in whole pairs of blocks, or columns, are quantized
    apart); `table`: the [N, K] tensor the weight is the transpose of (`untied_head`), read a block of rows at a time
    (columns of the weight). False where the weight is not a 2-D initializer (the quantizer's N-D weights with unit
    leading axes do not occur in an export's graph)."""
    import numpy as np
    import onnx_ir
    from onnxruntime.quantization.matmul_nbits_quantizer import (DefaultWeightOnlyQuantConfig,
                                                                 DefaultWeightOnlyQuantizer)

    weight = node.inputs[1]
    if weight is None or not weight.is_initializer() or weight.const_value is None \
            or len(weight.const_value.shape) != 2:
        return False
    tensor = weight.const_value
    rows, cols = (int(size) for size in tensor.shape.numpy())
    config = DefaultWeightOnlyQuantConfig(block_size=block_size, is_symmetric=symmetric,
                                          accuracy_level=accuracy_level, bits=bits)
    quantizer = DefaultWeightOnlyQuantizer(config)

    def quantized(values):  # as quantize_matmul: a bfloat16 weight quantized from float32, its scales bfloat16
        if values.dtype.name != "bfloat16":
            return quantizer.qbits_block_quant(np.ascontiguousarray(values))
        packed, scales, zero_points = quantizer.qbits_block_quant(values.astype(np.float32))
        return packed, scales.astype(values.dtype), zero_points

    def blocks():
        outputs = [np.zeros(shape, dtype.numpy()) for dtype, shape in shapes.values()]
        if table is None:  # rows: whole pairs of blocks (two 4-bit zero points a byte)
            step = max(1, SLAB_BYTES // (cols * int(tensor.dtype.itemsize) * 2 * block_size)) * 2 * block_size
            for start in range(0, rows, step):
                first = start // block_size
                for output, part, at in zip(outputs, quantized(lazy_tensors.rows(tensor, start, min(start + step, rows))),
                                            (first, first, first // kpack), strict=True):
                    output[:, at:at + part.shape[1]] = part
        else:  # columns: rows of the table
            step = max(1, SLAB_BYTES // (rows * int(table.dtype.itemsize)))
            for start in range(0, cols, step):
                for output, part in zip(outputs, quantized(lazy_tensors.rows(table, start, min(start + step, cols)).T),
                                        strict=True):
                    output[start:start + step] = part
        return outputs

    kpack, k_blocks = 8 // bits, -(-rows // block_size)
    parts = lazy_tensors.Parts(blocks, (0, 1) if symmetric else (0, 1, 2))
    shapes = {f"_Q{bits}": (onnx_ir.DataType.UINT8, (cols, k_blocks, -(-block_size // kpack))),
              "_scales": (tensor.dtype, (cols, k_blocks)),
              "_zero_points": (onnx_ir.DataType.UINT8, (cols, -(-k_blocks // kpack)))}
    inputs = [node.inputs[0]]
    for index, (suffix, (dtype, shape)) in enumerate(list(shapes.items())[:len(parts.wanted)]):
        name = weight.name + suffix
        if name in weight.graph.initializers:  # a weight two MatMuls read: its blocks made once
            inputs.append(weight.graph.initializers[name])
            continue
        value = onnx_ir.Value(name=name, const_value=lazy_tensors.lazy(name, parts.part(index), dtype, shape))
        value.type, value.shape = onnx_ir.TensorType(dtype), onnx_ir.Shape(list(shape))
        weight.graph.register_initializer(value)
        inputs.append(value)
    attributes = {"K": int(rows), "N": int(cols), "bits": bits, "block_size": block_size}
    if accuracy_level:  # as the quantizer writes it: not at all where 0
        attributes["accuracy_level"] = accuracy_level
    replacement = onnx_ir.node("MatMulNBits", inputs, attributes=dict(sorted(attributes.items())),
                               domain="com.microsoft", name=f"{node.name}_Q{bits}" if node.name else None,
                               outputs=[onnx_ir.Value(name=node.outputs[0].name)])  # named: no val_N number used
    _replace(node, replacement)
    return True


def _replace(node, replacement) -> None:
    """`replacement` (one output) in `node`'s place, its output under the same name, type, shape and metadata."""
    graph, original = node.graph, node.outputs[0]
    graph.insert_before(node, [replacement])
    output = replacement.outputs[0]
    output.type, output.shape, output.doc_string = original.type, original.shape, original.doc_string
    output.metadata_props.update(original.metadata_props)  # a graph output's, kept by the quantizer's proto
    original.replace_all_uses_with(output, replace_graph_outputs=True)
    graph.remove(node, safe=True)
    output.name = original.name


def head_nodes(model) -> list[str]:
    """The names of the MatMul nodes of `model` (onnx_ir) that write a graph output (a decoder's head: `logits`)."""
    outputs = {value.name for value in model.graph.outputs}
    return [node.name for node in model.graph if node.op_type == "MatMul" and node.outputs[0].name in outputs]


def tie_embedding(model) -> int:
    """In the quantized graph `model` (onnx_ir), each embedding `Gather` of a float table whose tied head
    (`untied_head`'s transposed copy) became a `MatMulNBits` reads that head's blocks instead, through a `Reshape`
    and a `GatherBlockQuantized` (the head's bits, 4 or 8, and block size, symmetric: no zero points), as
    onnxruntime-genai's model builder ties them, and the float table is dropped; the number tied. Without it the
    float32 table is most of a tied model's q4 file (SmolLM2-135M: 113 of 215 MB with the head 8-bit). A head whose
    rows are not whole blocks (K % block_size) is left as it is (the builder slices padded rows off instead)."""
    import numpy as np
    import onnx_ir

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
    if tied:
        model.opset_imports.setdefault("com.microsoft", 1)
    return tied


def untied_head(model) -> dict:
    """In `model` (onnx_ir), each MatMul whose weight is a `Transpose` of an initializer (a head tied to the
    embedding) reads its own transposed copy instead (`<table>.transposed`, made when it is read: `lazy_tensors`);
    each copy's name -> the table's tensor (which `quantized_matmul` reads a block of rows at a time). Without it
    the quantizer leaves that MatMul float32: on SmolLM2 the head is the largest weight a decode step reads
    (measured, benchmarks/variant_speed.py)."""
    import numpy as np
    import onnx_ir

    untied = {}
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
        table, name = tied.const_value, f"{tied.name}.transposed"
        shape = list(table.shape.numpy())[::-1]
        copy = onnx_ir.Value(name=name, type=tied.type, shape=onnx_ir.Shape(shape), const_value=lazy_tensors.lazy(
            name, lambda table=table: np.ascontiguousarray(lazy_tensors.read(table).T), table.dtype, shape))
        model.graph.register_initializer(copy)
        node.replace_input_with(1, copy)
        if not transpose.outputs[0].uses():
            model.graph.remove(transpose, safe=True)
        untied[name] = table
    return untied


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
