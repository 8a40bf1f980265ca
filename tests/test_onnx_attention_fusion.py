"""The quantized ONNX variants' fused attention (hfexport.formats.onnx.attention_fusion), on tiny-llama's export: each
layer one `GroupQueryAttention` over a packed q/k/v projection and its norms `SkipSimplifiedLayerNormalization`, as
onnxruntime-genai's builder writes them, under the contract's inputs and outputs, computing in ONNX Runtime what the
export computes, a left-padded prompt and the decode steps after it; a model outside what the fusion writes keeps its graph."""

from __future__ import annotations

import json
from collections import Counter

import numpy as np
import onnx
import onnxruntime as ort
import pytest

from hfexport.formats.onnx.attention_fusion import fusable, fuse_attention
from hfexport.formats.onnx.decoder_contract import genai_overlay


@pytest.fixture(scope="module")
def llama_graphs(exported_llama, tmp_path_factory):
    """(tiny-llama's exported onnx-generation graph, the fused graph, its config)."""
    output, _ = exported_llama
    source = output / "onnx-generation" / "model.onnx"
    fused = fuse_attention(source, tmp_path_factory.mktemp("fused") / "model.onnx")
    return source, fused, json.loads((source.parent / "config.json").read_text())


def _ops(path) -> Counter:
    return Counter(node.op_type for node in onnx.load(str(path), load_external_data=False).graph.node)


def _signature(path) -> list:
    graph = onnx.load(str(path), load_external_data=False).graph
    return [[(value.name, str(value.type)) for value in values] for values in (graph.input, graph.output)]


def test_every_layer_becomes_one_group_query_attention_under_the_same_contract(llama_graphs):
    source, fused, config = llama_graphs
    layers = config["num_hidden_layers"]
    assert fused != source
    ops = _ops(fused)
    assert ops["GroupQueryAttention"] == layers and ops["SkipSimplifiedLayerNormalization"] == 2 * layers
    assert ops["MatMul"] == 5 * layers + 1  # qkv packed, o, gate, up, down; the head
    assert ops["RotaryEmbedding"] == 2 * layers and not {"Softmax", "Slice", "Neg", "Transpose"} & set(ops)
    assert sum(ops.values()) < sum(_ops(source).values()) / 2  # the mask once, from attention_mask and input_ids (_bias)
    assert ops["Where"] == 1 and "GatherND" not in ops
    assert _signature(fused) == _signature(source)


def test_the_fused_graph_computes_what_the_export_computes(llama_graphs):
    source, fused, config = llama_graphs
    sessions = [ort.InferenceSession(str(path), providers=["CPUExecutionProvider"]) for path in (source, fused)]
    names = [value.name for value in sessions[0].get_outputs()]
    pasts = [value.name for value in sessions[0].get_inputs() if value.name.startswith("past_key_values.")]
    heads, size = config["num_key_value_heads"], config["head_dim"]
    ids = np.random.default_rng(0).integers(3, config["vocab_size"], (2, 7))
    mask = np.asarray([[0, 0, 0, 1, 1, 1, 1], [1] * 7])  # a left-padded batch, as transformers.js and optimum pad
    feed = {"input_ids": ids, "attention_mask": mask, "position_ids": np.clip(mask.cumsum(1) - 1, 0, None),
            **{name: np.zeros((2, heads, 0, size), np.float32) for name in pasts}}
    for _ in range(4):  # the prompt, then three decode steps on the unfused graph's greedy tokens
        expected, got = (session.run(names, feed) for session in sessions)
        np.testing.assert_allclose(got[0][0, 3:], expected[0][0, 3:], atol=1e-5, rtol=1e-4)  # not the pads' rows
        np.testing.assert_allclose(got[0][1], expected[0][1], atol=1e-5, rtol=1e-4)
        real = mask[0] == 1  # the pads' cache slots differ (masked: never read)
        for name, want, have in zip(names[1:], expected[1:], got[1:], strict=True):
            np.testing.assert_allclose(have[1], want[1], atol=1e-5, rtol=1e-4, err_msg=name)
            np.testing.assert_allclose(have[0][:, real], want[0][:, real], atol=1e-5, rtol=1e-4, err_msg=name)
        mask = np.concatenate([mask, np.ones((2, 1), int)], axis=1)
        feed = {"input_ids": expected[0][:, -1].argmax(-1)[:, None], "attention_mask": mask,
                "position_ids": mask.sum(1, keepdims=True) - 1, **dict(zip(pasts, expected[1:], strict=True))}


def test_a_model_outside_the_fusion_keeps_its_graph(llama_graphs, tmp_path):
    source, _, config = llama_graphs
    assert fusable(config)
    for changed in ({"sliding_window": 64}, {"layer_types": ["sliding_attention", "full_attention"]},
                    {"rope_parameters": {"rope_type": "dynamic", "rope_theta": 10000.0}}):
        assert not fusable({**config, **changed}), changed
    folder = tmp_path / "windowed"
    folder.mkdir()
    (folder / "model.onnx").symlink_to(source)
    (folder / "config.json").write_text(json.dumps({**config, "sliding_window": 64}))
    assert fuse_attention(folder / "model.onnx", folder / "fused.onnx") == folder / "model.onnx"
    assert not (folder / "fused.onnx").exists()


def test_onnxruntime_genai_is_told_to_share_the_fused_graphs_cache_buffers(llama_graphs, tmp_path):
    """The fused graph writes its present into its past's buffer (GroupQueryAttention), so the overlay a user (and the
    gate) puts on genai_config.json shares them; the export's concatenated present cannot, and keeps the config's."""
    source, fused, _ = llama_graphs
    assert genai_overlay(fused) == {"search": {"past_present_share_buffer": True}}
    assert genai_overlay(source) == {}
    renamed = tmp_path / "model_q4.onnx"
    renamed.write_bytes(fused.read_bytes())  # the graph alone: the overlay reads no weights
    assert genai_overlay(renamed) == {"model": {"decoder": {"filename": "model_q4.onnx"}},
                                      "search": {"past_present_share_buffer": True}}
