"""Vision-language generation over exported graphs: an image and a prompt generate, without the torch model, token
for token what `model.generate` returns (batched, left-padded, EOS per row), and the job's generation check covers it.

transformers 5.23's `generate` encodes the images before the prefill, so the engine's `decompose_for_generation`
captures no image encoder (and leaves the merge of image features into the text embeddings to the caller); hfexport
exports both as components of its own (`image_encoder`, `embed`, docs/generation.md). The default run exports tiny
LLaVA (CLIP vision tower + Llama) to ONNX once per session; dynamo, OpenVINO and ExecuTorch are slow.
"""

from __future__ import annotations

import pytest
import torch

from hfexport.testing.models import make_model

MAX_NEW = 10
PROMPTS = ["<image> Describe the picture", "<image> The capital of France is"]


@pytest.fixture(scope="module")
def exported(llava_job):
    from hfexport import ExportedModel

    output, report = llava_job
    assert report.targets["onnx-generation"].status == "ok", report.targets["onnx-generation"].error
    return ExportedModel.from_pretrained(output / "onnx-generation", precision="f32")


def images(count: int, seed: int = 3):
    """Seeded RGB images, not the recipe's sample images."""
    import numpy as np

    rng = np.random.default_rng(seed)
    return [rng.integers(0, 256, (48, 40, 3), dtype=np.uint8) for _ in range(count)]


def _inputs(processor, prompts, seed: int = 3) -> dict:
    return dict(processor(text=list(prompts), images=images(len(prompts), seed), return_tensors="pt", padding=True))


def _reference(model, inputs, **kwargs):
    with torch.no_grad():
        return model.generate(**inputs, do_sample=False, max_new_tokens=MAX_NEW, **kwargs)


def _assert_equal(got, expected):
    assert got.shape == expected.shape and torch.equal(got, expected), f"\nexpected {expected.tolist()}\ngot {got.tolist()}"


def test_the_engine_alone_captures_no_image_encoder(llava):
    """The engine bug hfexport works around (transformers 5.23): when this fails, the engine captures the image
    encoder itself, and hfexport.plan's `image_encoder`/`embed` components should be revisited."""
    from transformers.exporters.utils import decompose_for_generation

    model, processor = llava
    stages = decompose_for_generation(model, _inputs(processor, PROMPTS))
    assert list(stages) == ["language_model", "lm_head", "decode"]
    assert "inputs_embeds" in stages["language_model"][1]


def test_the_export_has_an_image_encoder_and_an_embedding_merge(exported):
    assert list(exported.components) == ["image_encoder", "embed", "language_model", "lm_head", "decode"]
    assert set(exported.runners["image_encoder"].metadata.kwargs) == {"pixel_values"}
    assert set(exported.runners["embed"].metadata.kwargs) == {"input_ids", "image_features"}


def test_padded_batch_matches_model_generate(exported, llava):
    model, processor = llava
    inputs = _inputs(processor, PROMPTS)
    assert (inputs["attention_mask"] == 0).any()
    expected = _reference(model, inputs)
    assert not torch.equal(expected[0, -MAX_NEW:], expected[1, -MAX_NEW:])  # the rows differ: images and padding matter
    got = exported.generate(inputs["input_ids"], inputs["attention_mask"], pixel_values=inputs["pixel_values"],
                            max_new_tokens=MAX_NEW)
    _assert_equal(got, expected)


def test_the_image_changes_the_tokens_as_in_model_generate(exported, llava):
    model, processor = llava
    references = []
    for seed in (5, 11):
        inputs = _inputs(processor, PROMPTS[:1], seed=seed)  # one prompt (batch 1), two different images
        references.append(_reference(model, inputs))
        _assert_equal(exported.generate(**inputs, max_new_tokens=MAX_NEW), references[-1])
    assert not torch.equal(references[0], references[1])


def test_seeded_sampling_matches_model_generate(exported, llava):
    model, processor = llava
    inputs = _inputs(processor, PROMPTS)
    torch.manual_seed(7)
    with torch.no_grad():
        expected = model.generate(**inputs, do_sample=True, top_k=20, temperature=0.8, max_new_tokens=MAX_NEW)
    got = exported.generate(**inputs, do_sample=True, top_k=20, temperature=0.8, max_new_tokens=MAX_NEW, seed=7)
    _assert_equal(got, expected)


def test_the_job_checked_generation_token_for_token(llava_job):
    _, report = llava_job
    verification = report.targets["onnx-generation"].verification
    generation = verification["generation"]
    assert generation["passed"] and generation["token_agreement"] == 1.0, generation
    assert generation["prompts"] == 2
    checked = {probe["component"] for probe in verification["probes"]}
    assert {"image_encoder", "embed", "language_model", "lm_head", "decode"} <= checked
    assert {probe["dims"]["batch"] for probe in verification["probes"]} == {1, 8}


def test_generating_without_the_image_is_refused(exported, llava):
    from hfexport.errors import GenerationError

    _, processor = llava
    inputs = _inputs(processor, PROMPTS)
    with pytest.raises(GenerationError, match=r"generates from images: pass \['pixel_values'\]"):
        exported.generate(inputs["input_ids"], inputs["attention_mask"], max_new_tokens=2)


def test_an_export_without_the_image_encoder_is_refused(llava_job):
    from hfexport import ExportedModel
    from hfexport.errors import GenerationError

    output, _ = llava_job
    broken = ExportedModel.from_pretrained(output / "onnx-generation", precision="f32")
    del broken.components["image_encoder"]
    with pytest.raises(GenerationError, match=r"lacks \['image_encoder'\]"):
        broken.generate(torch.tensor([[5, 6, 7]]), max_new_tokens=2)


@pytest.mark.slow
@pytest.mark.parametrize("export_format", ["dynamo", "openvino", "executorch"])
def test_other_formats_generate_from_images_as_model_generate(session_dir, tiny_llava, llava, export_format):
    from hfexport import ExportedModel
    from hfexport.job.run import run_job

    target = f"{export_format}-generation"
    output = session_dir / f"exported-llava-{export_format}"
    report = run_job(tiny_llava, output, targets=[target])
    assert report.targets[target].status == "ok", report.targets[target].error
    model, processor = llava
    exported = ExportedModel.from_pretrained(output / target, precision="f32")
    inputs = _inputs(processor, PROMPTS)
    _assert_equal(exported.generate(**inputs, max_new_tokens=MAX_NEW), _reference(model, inputs))


def test_init_proposes_an_image_text_generation_recipe_whose_samples_hold_images(session_dir):
    """`hfexport init` on a VLM: the task is image-text-to-text (it was text2text-generation: LLaVA's class name ends
    in ForConditionalGeneration, as T5's does), the samples carry images, and the default texts get the processor's
    image placeholder (without it the processor refuses the images)."""
    from hfexport.inputs import build_sample_inputs
    from hfexport.job.propose import propose_recipe
    from hfexport.models import load_config, load_processor
    from hfexport.recipe.loading import load_recipe

    folder = make_model("tiny-llava", session_dir / "tiny-llava-init")
    (folder / "export_config.json").unlink()
    proposed = propose_recipe(folder, ["onnx"])
    assert proposed["task"] == "image-text-to-text" and "images" in proposed["sample_inputs"]
    assert proposed["targets"]["onnx-generation"]["mode"] == "generation"
    recipe, config = load_recipe(proposed), load_config(folder)
    inputs = build_sample_inputs(recipe, load_processor(folder), config, recipe.task, "generation")
    assert (inputs["input_ids"] == config.image_token_index).sum(dim=1).tolist() == [16, 16]
    assert inputs["pixel_values"].shape[0] == 2


@pytest.mark.slow
def test_init_proposes_a_passing_generation_recipe_for_llava(session_dir):
    from hfexport.job.propose import init_recipe

    folder = make_model("tiny-llava", session_dir / "tiny-llava-init-job")
    (folder / "export_config.json").unlink()
    result = init_recipe(folder, ["onnx"], output=session_dir / "llava-init-recipe.json")
    assert result.passed == ["onnx-generation"], result.failed
    generation = result.report.targets["onnx-generation"].verification["generation"]
    assert generation["passed"] and generation["token_agreement"] == 1.0
