"""An exported RMSNorm must reach onnxruntime in the form its fusion matches (hfexport.formats.onnx.onnxruntime_workarounds).

torch's ONNX exporter writes `x * rsqrt(v)` as `Mul(x, Reciprocal(Sqrt(v)))`; onnxruntime 1.32 fuses an RMSNorm into
one `SimplifiedLayerNormalization` only from `Div(x, Sqrt(v))`. The canary shows the exporter's form still runs
unfused; the others that the rewrite fuses it, computes the same, and is in every ONNX program hfexport exports."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import onnx
import onnx_ir
import onnxruntime as ort
import pytest
import torch

from hfexport.formats.onnx.onnxruntime_workarounds import (
    broadcast_grouped_query_caches,
    fuse_ready_key_transposes,
    fuse_ready_rms_norms,
)

FUSED = "SimplifiedLayerNormalization"


class _RMSNorm(torch.nn.Module):
    """transformers' LlamaRMSNorm, the form Llama, Qwen, Mistral and SmolLM share."""

    def __init__(self, size: int = 16):
        super().__init__()
        self.weight = torch.nn.Parameter(torch.linspace(0.5, 1.5, size))

    def forward(self, x):
        variance = x.pow(2).mean(-1, keepdim=True)
        return self.weight * (x * torch.rsqrt(variance + 1e-6))


@pytest.fixture(scope="module")
def exported() -> onnx_ir.Model:
    """The RMSNorm as the engine's exporter writes it (torch.onnx dynamo, onnxscript's optimizer)."""
    program = torch.onnx.export(_RMSNorm(), (torch.randn(2, 3, 16),), dynamo=True, optimize=True, verbose=False)
    return program.model


def _optimized_ops(model: onnx_ir.Model | Path, folder: Path) -> list[str]:
    """The op types of the graph onnxruntime runs (of `model`, or of the saved graph at that path), after its graph
    optimizations (CPU); a norm fused with the residual add before it (`SkipSimplifiedLayerNormalization`) counts
    as fused."""
    source, optimized = folder / "model.onnx", folder / "optimized.onnx"
    if isinstance(model, Path):
        source = model
    else:
        onnx_ir.save(model, source)
    options = ort.SessionOptions()
    options.graph_optimization_level = ort.GraphOptimizationLevel.ORT_ENABLE_ALL
    options.optimized_model_filepath = str(optimized)
    ort.InferenceSession(str(source), options, providers=["CPUExecutionProvider"])
    graph = onnx.load(str(optimized), load_external_data=False).graph
    return [FUSED if node.op_type.endswith(FUSED) else node.op_type for node in graph.node]


def _run(model: onnx_ir.Model, x: np.ndarray) -> np.ndarray:
    session = ort.InferenceSession(onnx_ir.to_proto(model).SerializeToString(), providers=["CPUExecutionProvider"])
    return session.run(None, {session.get_inputs()[0].name: x})[0]


def test_without_the_fix_onnxruntime_leaves_the_rms_norm_unfused(exported, tmp_path):
    ops = [node.op_type for node in exported.graph]
    assert "Reciprocal" in ops, f"the exporter no longer writes rsqrt as Reciprocal(Sqrt): {ops}"
    assert FUSED not in _optimized_ops(exported, tmp_path), "onnxruntime now fuses the exporter's form: drop the fix"


def test_the_rewritten_norm_is_fused_and_computes_the_same(exported, tmp_path):
    x = np.random.default_rng(0).standard_normal((2, 3, 16)).astype(np.float32)
    before = _run(exported, x)
    model = onnx_ir.from_proto(onnx_ir.to_proto(exported))
    assert fuse_ready_rms_norms(model) == 1
    assert [node.op_type for node in model.graph if node.op_type in ("Reciprocal", "Div")] == ["Div"]
    assert _optimized_ops(model, tmp_path).count(FUSED) == 1
    np.testing.assert_allclose(_run(model, x), before, rtol=1e-6, atol=1e-6)
    with torch.no_grad():
        np.testing.assert_allclose(_run(model, x), _RMSNorm()(torch.from_numpy(x)).numpy(), rtol=1e-5, atol=1e-6)


def test_a_reciprocal_with_another_use_is_left_alone():
    """The rewrite replaces a reciprocal only where the product is its one use (else it would compute it twice)."""
    graph = onnx.helper.make_graph(
        [onnx.helper.make_node("Sqrt", ["v"], ["s"]), onnx.helper.make_node("Reciprocal", ["s"], ["r"]),
         onnx.helper.make_node("Mul", ["x", "r"], ["y"])],
        "shared", [onnx.helper.make_tensor_value_info(name, onnx.TensorProto.FLOAT, [4]) for name in ("x", "v")],
        [onnx.helper.make_tensor_value_info(name, onnx.TensorProto.FLOAT, [4]) for name in ("y", "r")])
    model = onnx_ir.from_proto(onnx.helper.make_model(graph, opset_imports=[onnx.helper.make_opsetid("", 18)]))
    assert fuse_ready_rms_norms(model) == 0
    assert [node.op_type for node in model.graph] == ["Sqrt", "Reciprocal", "Mul"]


def test_every_norm_of_an_exported_decoder_is_fused(exported_llama, tmp_path):
    """tiny-llama's ONNX generation export, as published: each layer's two norms and the final one fused."""
    import json

    output, report = exported_llama
    folder = output / "onnx-generation"
    assert report.targets["onnx-generation"].status == "ok"
    layers = json.loads((folder / "config.json").read_text())["num_hidden_layers"]
    model = onnx_ir.load(folder / "model.onnx")
    assert not [node for node in model.graph if node.op_type == "Reciprocal"]
    assert _optimized_ops(folder / "model.onnx", tmp_path).count(FUSED) == 2 * layers + 1


class _Attention(torch.nn.Module):
    """Attention as transformers' sdpa layers call it (a mask, a grouped-query key and value broadcast to the heads)."""

    def forward(self, query, key, value, mask):
        return torch.nn.functional.scaled_dot_product_attention(query, key, value, attn_mask=mask)


def _attention_inputs(rng: np.random.Generator, batch: int = 2, length: int = 5) -> list[np.ndarray]:
    query, key, value = (rng.standard_normal((batch, 4, length, 8)).astype(np.float32) for _ in range(3))
    mask = np.tril(np.ones((length, length), dtype=bool))[None, None].repeat(batch, axis=0)
    return [query, key, value, mask]


@pytest.fixture(scope="module")
def exported_attention() -> onnx_ir.Model:
    """SDPA as the engine's exporter writes it, with a dynamic batch and length."""
    batch, length = torch.export.Dim("batch"), torch.export.Dim("length")
    inputs = tuple(torch.from_numpy(array) for array in _attention_inputs(np.random.default_rng(0)))
    shapes = [{0: batch, 2: length}] * 3 + [{0: batch, 2: length, 3: length}]
    program = torch.onnx.export(_Attention(), inputs, dynamo=True, optimize=True, verbose=False,
                                dynamic_shapes=shapes)
    return program.model


def _run_all(model: onnx_ir.Model, inputs: list[np.ndarray]) -> np.ndarray:
    session = ort.InferenceSession(onnx_ir.to_proto(model).SerializeToString(), providers=["CPUExecutionProvider"])
    return session.run(None, dict(zip([i.name for i in session.get_inputs()], inputs)))[0]


def test_without_the_fix_onnxruntime_copies_the_key_transposed(exported_attention, tmp_path):
    assert "Transpose" in _optimized_ops(exported_attention, tmp_path), (
        "onnxruntime now folds torchlib's key transpose into the matmul (or torchlib no longer writes it through a "
        "3-d view): drop fuse_ready_key_transposes")


def test_the_rewritten_key_transpose_is_folded_and_computes_the_same(exported_attention, tmp_path):
    inputs = _attention_inputs(np.random.default_rng(1), batch=3, length=7)  # other sizes than the trace's
    before = _run_all(exported_attention, inputs)
    model = onnx_ir.from_proto(onnx_ir.to_proto(exported_attention))
    assert fuse_ready_key_transposes(model) == 1
    transposes = [node for node in model.graph if node.op_type == "Transpose"]
    assert [list(node.attributes.get_ints("perm")) for node in transposes] == [[0, 1, 3, 2]]
    assert "Transpose" not in _optimized_ops(model, tmp_path)
    np.testing.assert_array_equal(_run_all(model, inputs), before)


def test_a_reshape_that_is_not_the_key_swap_is_left_alone():
    """Reshape -> Transpose([0, 2, 1]) -> Reshape to any other shape than the swapped one is not a transpose of the
    last two axes, and stays."""
    shape = onnx.helper.make_node("Shape", ["x"], ["shape"])
    parts = [onnx.helper.make_node("Constant", [], [f"c{i}"], value_ints=values)
             for i, values in enumerate(([-1], [-2], [-1], [2**63 - 1], [-(2**63)]))]
    slices = [onnx.helper.make_node("Slice", ["shape", start, end], [name])
              for name, start, end in (("last", "c2", "c3"), ("second", "c1", "c2"), ("first", "c4", "c1"))]
    graph = onnx.helper.make_graph(
        [shape, *parts, *slices,
         onnx.helper.make_node("Concat", ["c0", "second", "last"], ["squeezed_shape"], axis=0),
         onnx.helper.make_node("Reshape", ["x", "squeezed_shape"], ["squeezed"]),
         onnx.helper.make_node("Transpose", ["squeezed"], ["transposed"], perm=[0, 2, 1]),
         # back to x's own shape, not the swapped one: a different tensor than x transposed
         onnx.helper.make_node("Concat", ["first", "second", "last"], ["same_shape"], axis=0),
         onnx.helper.make_node("Reshape", ["transposed", "same_shape"], ["y"])],
        "not_a_swap", [onnx.helper.make_tensor_value_info("x", onnx.TensorProto.FLOAT, ["b", 4, "n", 8])],
        [onnx.helper.make_tensor_value_info("y", onnx.TensorProto.FLOAT, None)])
    model = onnx_ir.from_proto(onnx.helper.make_model(graph, opset_imports=[onnx.helper.make_opsetid("", 18)]))
    assert fuse_ready_key_transposes(model) == 0
    assert [node.op_type for node in model.graph].count("Reshape") == 2


def test_every_layer_of_an_exported_decoder_folds_its_key_transpose(exported_llama, tmp_path):
    """tiny-llama's ONNX generation export, as published: in what onnxruntime runs, every layer's `Q @ K^T` is one
    matmul that reads the key transposed (`transB`), and no Transpose feeds a matmul."""
    import json

    output, _ = exported_llama
    folder = output / "onnx-generation"
    layers = json.loads((folder / "config.json").read_text())["num_hidden_layers"]
    _optimized_ops(folder / "model.onnx", tmp_path)
    graph = onnx.load(str(tmp_path / "optimized.onnx"), load_external_data=False).graph
    transposed = {name for node in graph.node if node.op_type == "Transpose" for name in node.output}
    matmuls = [node for node in graph.node if node.op_type in ("MatMul", "FusedMatMul")]
    assert not [node.name for node in matmuls if transposed & set(node.input)]
    reads_transposed = [node for node in matmuls if node.op_type == "FusedMatMul"
                        and {a.name: a.i for a in node.attribute}.get("transB") == 1]
    assert len(reads_transposed) == layers


class _GroupedQueryAttention(torch.nn.Module):
    """transformers' grouped-query attention over a cache: `repeat_kv` (each of the 2 key/value heads repeated to
    the 6 query heads), then SDPA with an additive mask."""

    def forward(self, query, key, value, mask):
        def repeat_kv(states):
            batch, heads, length, size = states.shape
            return states[:, :, None].expand(batch, heads, 3, length, size).reshape(batch, heads * 3, length, size)

        return torch.nn.functional.scaled_dot_product_attention(query, repeat_kv(key), repeat_kv(value), attn_mask=mask)


def _grouped_inputs(rng: np.random.Generator, batch: int, length: int, past: int) -> list[np.ndarray]:
    query = rng.standard_normal((batch, 6, length, 8)).astype(np.float32)
    key, value = (rng.standard_normal((batch, 2, past + length, 8)).astype(np.float32) for _ in range(2))
    mask = np.where(rng.random((batch, 1, length, past + length)) < 0.8, 0.0, -1e9).astype(np.float32)
    return [query, key, value, mask]


@pytest.fixture(scope="module")
def exported_grouped_attention() -> onnx_ir.Model:
    batch, length, total = torch.export.Dim("batch"), torch.export.Dim("length"), torch.export.Dim("total")
    inputs = tuple(torch.from_numpy(array) for array in _grouped_inputs(np.random.default_rng(0), 2, 3, 2))
    shapes = [{0: batch, 2: length}, {0: batch, 2: total}, {0: batch, 2: total}, {0: batch, 2: length, 3: total}]
    program = torch.onnx.export(_GroupedQueryAttention(), inputs, dynamo=True, optimize=True, verbose=False,
                                dynamic_shapes=shapes)
    return program.model


def test_without_the_fix_onnxruntime_copies_the_repeated_cache(exported_grouped_attention, tmp_path):
    assert _optimized_ops(exported_grouped_attention, tmp_path).count("Expand") == 2, (
        "onnxruntime no longer runs transformers' repeat_kv as two Expands (or the exporter writes it otherwise): "
        "look again at broadcast_grouped_query_caches")


@pytest.mark.parametrize(("batch", "length", "past"), [(1, 1, 9), (3, 5, 0), (2, 4, 6)])
def test_the_grouped_attention_computes_the_same_bit_for_bit(exported_grouped_attention, tmp_path, batch, length,
                                                              past):
    """A decode step, a prompt and a chunk, on other sizes than the trace's: the same tensor, to the bit, with the
    cache never repeated and the scale still folded into one matmul."""
    inputs = _grouped_inputs(np.random.default_rng(batch * 100 + length), batch, length, past)
    before = _run_all(exported_grouped_attention, inputs)
    model = onnx_ir.from_proto(onnx_ir.to_proto(exported_grouped_attention))
    assert fuse_ready_key_transposes(model) == 1
    assert broadcast_grouped_query_caches(model) == 2
    assert not [node for node in model.graph if node.op_type == "Expand"]
    ops = _optimized_ops(model, tmp_path)
    assert "Expand" not in ops and ops.count("FusedMatMul") == 1 and "Mul" not in ops, ops
    np.testing.assert_array_equal(_run_all(model, inputs), before)


def test_a_repeat_with_another_use_is_left_alone():
    """The repeated cache also read elsewhere (here: a graph output) still has to be made, so the rewrite leaves the
    attention as it is rather than compute the repeat and the broadcast both."""
    nodes = [onnx.helper.make_node("Constant", [], ["axes"], value_ints=[2]),
             onnx.helper.make_node("Constant", [], ["wide"], value_ints=[1, 2, 3, 5, 8]),
             onnx.helper.make_node("Constant", [], ["merged"], value_ints=[1, 6, 5, 8]),
             onnx.helper.make_node("Unsqueeze", ["kv", "axes"], ["unsqueezed"]),
             onnx.helper.make_node("Expand", ["unsqueezed", "wide"], ["expanded"]),
             onnx.helper.make_node("Reshape", ["expanded", "merged"], ["repeated"]),
             onnx.helper.make_node("MatMul", ["p", "repeated"], ["y"])]
    graph = onnx.helper.make_graph(
        nodes, "shared_repeat",
        [onnx.helper.make_tensor_value_info("kv", onnx.TensorProto.FLOAT, [1, 2, 5, 8]),
         onnx.helper.make_tensor_value_info("p", onnx.TensorProto.FLOAT, [1, 6, 4, 5])],
        [onnx.helper.make_tensor_value_info("y", onnx.TensorProto.FLOAT, [1, 6, 4, 8]),
         onnx.helper.make_tensor_value_info("repeated", onnx.TensorProto.FLOAT, [1, 6, 5, 8])])
    model = onnx_ir.from_proto(onnx.shape_inference.infer_shapes(
        onnx.helper.make_model(graph, opset_imports=[onnx.helper.make_opsetid("", 18)])))
    assert broadcast_grouped_query_caches(model) == 0
    assert [node.op_type for node in model.graph].count("Expand") == 1


def test_an_exported_grouped_query_decoder_never_repeats_its_cache(exported_llama, tmp_path):
    """tiny-llama (4 query heads over 2 key/value heads), its ONNX generation export as published: no Expand of the
    cache left in what onnxruntime runs."""
    output, _ = exported_llama
    model = onnx_ir.load(output / "onnx-generation" / "model.onnx")
    expanded = [node for node in model.graph if node.op_type == "Expand"
                and node.inputs[0].producer() is not None and node.inputs[0].producer().op_type == "Unsqueeze"
                and any(value.name.startswith("present.") for value in node.inputs[0].producer().inputs)]
    assert not expanded


def _external_tensor():
    """A float initializer whose data is in an external file that is not there (the graph loaded without it)."""
    from onnx import TensorProto

    tensor = TensorProto(name="w", data_type=TensorProto.FLOAT, dims=[4, 4], data_location=TensorProto.EXTERNAL)
    entry = tensor.external_data.add()
    entry.key, entry.value = "location", "absent.bin"
    return tensor


def test_without_the_fix_the_float16_converter_reads_data_for_a_shape():
    from onnxruntime.transformers import float16 as converter

    with pytest.raises(Exception, match="absent.bin"):
        converter.make_value_info_from_tensor(_external_tensor())


def test_with_the_fix_the_float16_converter_takes_the_shape_from_the_dims():
    from onnxruntime.transformers import float16 as converter

    from hfexport.formats.onnx.onnxruntime_workarounds import value_info_from_dims

    with value_info_from_dims(converter):
        info = converter.make_value_info_from_tensor(_external_tensor())
    assert [dim.dim_value for dim in info.type.tensor_type.shape.dim] == [4, 4]
    with pytest.raises(Exception, match="absent.bin"):  # the converter's own again once out of it
        converter.make_value_info_from_tensor(_external_tensor())
