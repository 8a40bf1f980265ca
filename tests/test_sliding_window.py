"""Generation probes of a sliding-window model hold the cache as the engine traced it (hfexport.engine.traced_cache_layout).

transformers 5.23's dynamo exporter traces `DynamicSlidingWindowLayer` as a full `DynamicLayer`: the exported prefill
returns every token's keys and values for a sliding layer, the exported decode takes them, and the sliding mask
applies the window. Eager keeps the last `window - 1` tokens. Captured eagerly (the engine's decompose_for_generation),
the decode was traced from the cut cache, and a `.pt2` decode then refused the full cache its own prefill returns
("Trying to flatten user inputs with exported input tree spec": the layer's token counter is pytree context; then
"Guard failed: past_key_values[0].stride()[1] != ...": the cut cache was a view); probes captured eagerly compared
caches of different lengths ("shape [1, 2, 5, 16] != eager [1, 2, 3, 16]") and fed the exported decode a cut cache
(ONNX Runtime: "GatherND ... invalid index"). Tiny Gemma3 has a sliding layer of window 4."""

import pytest
import torch
from hfexport.engine import traced_cache_layout
from hfexport.testing.models import GEMMA3_SLIDING_WINDOW, make_model


@pytest.fixture(scope="module")
def gemma3(tmp_path_factory):
    from transformers import AutoModelForCausalLM, AutoTokenizer

    folder = make_model("tiny-gemma3", tmp_path_factory.mktemp("gemma3") / "tiny-gemma3")
    return AutoModelForCausalLM.from_pretrained(folder).eval(), AutoTokenizer.from_pretrained(folder)


def _decode_cache_lengths(model, tokenizer) -> list[int]:
    from transformers.exporters.utils import decompose_for_generation

    inputs = tokenizer(["The quick brown fox jumps over the lazy"], return_tensors="pt")
    with torch.no_grad():
        stages = decompose_for_generation(model, dict(inputs))
    cache = stages["decode"][1]["past_key_values"]
    return [layer.keys.shape[-2] for layer in cache.layers], inputs["input_ids"].shape[1]


def test_eager_cuts_the_sliding_layer_to_its_window(gemma3):
    # When this fails, eager and the engine agree on the sliding cache: drop traced_cache_layout.
    lengths, prompt = _decode_cache_lengths(*gemma3)
    assert lengths == [GEMMA3_SLIDING_WINDOW - 1, prompt]


def test_in_the_traced_layout_the_sliding_layer_holds_every_token(gemma3):
    from transformers.cache_utils import DynamicSlidingWindowLayer

    before = DynamicSlidingWindowLayer.update
    with traced_cache_layout():
        lengths, prompt = _decode_cache_lengths(*gemma3)
    assert lengths == [prompt, prompt]
    assert DynamicSlidingWindowLayer.update is before


def test_gemma3_generation_passes_its_component_probes(tmp_path):
    """The matrix cell that failed without the fix (generation and decode probes refused by the `.pt2`): tiny Gemma3 on
    torch.export, prefill and decode probed at batch 1 and 8, then greedy generation token for token."""
    from hfexport.testing.matrix import Cell, run_cell

    result = run_cell(Cell("tiny-gemma3", "dynamo", "generation"), tmp_path)
    assert result.outcome == "pass", result.detail
