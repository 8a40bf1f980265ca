"""A recipe-driven export is the engine call its recipe stands for: tiny-bert's `onnx` target through
`AutoHfExporter.from_pretrained(...).export()` and a hand-written `OnnxExporter().export(...)` with the same
settings give programs with the same inputs, the same dynamic axes and the same outputs."""

from __future__ import annotations

import pytest
import torch
from hfexport import AutoHfExporter, ExportedModel
from hfexport.models import load_model
from torch.export import Dim
from transformers import AutoTokenizer
from transformers.exporters import ExportFormat, OnnxConfig, OnnxExporter


@pytest.fixture(scope="module")
def both(tiny_bert):
    exporter = AutoHfExporter.from_pretrained(tiny_bert, target="onnx")
    model = load_model(tiny_bert, exporter.recipe).eval()
    from_recipe = exporter.export(model)  # inputs synthesized from the recipe's sample texts

    # The same export, written by hand from the recipe's text: dims, opset, sample texts.
    tokenizer = AutoTokenizer.from_pretrained(tiny_bert)
    inputs = dict(tokenizer(["The capital of France is Paris.", "A tiny encoder for tests."], return_tensors="pt",
                            padding=True))
    batch, seq = Dim("batch", min=1, max=8), Dim("seq", min=2, max=64)
    config = OnnxConfig(dynamic_shapes={name: {0: batch, 1: seq} for name in inputs}, opset_version=18)
    by_hand = OnnxExporter().export(model, inputs, config)
    return model, from_recipe, by_hand, inputs


def test_the_recipe_exporter_is_bound_to_the_engine_config(tiny_bert):
    exporter = AutoHfExporter.from_pretrained(tiny_bert, target="onnx")
    assert isinstance(exporter.config, OnnxConfig)
    assert exporter.config.export_format is ExportFormat.ONNX and exporter.config.opset_version == 18
    assert exporter.target.name == "onnx" and exporter.recipe.default_target == "onnx"


def test_same_traced_inputs_and_axes(both):
    _, from_recipe, by_hand, inputs = both
    assert isinstance(from_recipe, ExportedModel)
    recipe_meta, hand_meta = from_recipe.components["model"].metadata, by_hand.components["model"].metadata
    assert recipe_meta.kwargs == hand_meta.kwargs
    assert list(recipe_meta.kwargs) == list(inputs)
    recipe_graph, hand_graph = from_recipe.program.graph, by_hand.program.graph

    def axes(graph):
        return {value.name: [str(dim) for dim in value.shape] for value in graph.inputs}

    assert axes(recipe_graph) == axes(hand_graph)
    assert all(not size.isdigit() for shape in axes(recipe_graph).values() for size in shape), "batch and seq dynamic"


@pytest.mark.parametrize("batch, seq", [(3, 9), (1, 40), (8, 5)])
def test_same_outputs(both, batch, seq):
    model, from_recipe, by_hand, _ = both
    generator = torch.Generator().manual_seed(batch * 100 + seq)
    input_ids = torch.randint(5, model.config.vocab_size, (batch, seq), generator=generator)
    attention_mask = torch.ones_like(input_ids)
    attention_mask[0, seq // 2:] = 0
    probe = {"input_ids": input_ids, "attention_mask": attention_mask}
    recipe_out = from_recipe(**probe).last_hidden_state
    hand_out = by_hand(**probe).last_hidden_state
    torch.testing.assert_close(recipe_out, hand_out, atol=1e-6, rtol=1e-6)
    with torch.no_grad():
        torch.testing.assert_close(recipe_out, model(**probe).last_hidden_state, atol=1e-4, rtol=1e-3)
