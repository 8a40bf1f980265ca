"""Generation of a model with multi-axis rope (M-RoPE: Qwen2-VL-class, `mrope_section`) over exported graphs, token
for token what `model.generate` returns.

Such a model's generate feeds the language model `position_ids` `[4, batch, seq]`: the text positions and the (t, h,
w) positions of `get_rope_index` over the image grids (`_prepare_position_ids_for_generation`), each continued by one
per decode step. hfexport's generate computes the prompt's with the model's own method, on its class without weights
(`hfexport.generate.vision_language.rope_positions`), and the packed patches (`pixel_values` [patches, ...] beside
`image_grid_thw`) go to the image encoder one image at a time. The exports take minutes on the shared 2-core machine
(tiny Qwen2-VL, ONNX: 164 s under load), so they are slow tests; the packing helpers run by default.
"""

from __future__ import annotations

import pytest
import torch

from hfexport.testing.models import PADDLEOCR_VL_IMAGE, QWEN2_VL_PROMPT, make_model

MAX_NEW = 10
# Padded prompts whose images sit mid-text: on the tiny random model, these images (seed 5) give different tokens
# with 1-axis positions than with the 3-axis ones (checked in the test), so the case tells the two apart.
PROMPTS = [f"Look at this: {QWEN2_VL_PROMPT} and describe it", f"What is {QWEN2_VL_PROMPT} here"]
DISCRIMINATING_SEED = 5


def _images(count: int, seed: int):
    import numpy as np

    rng = np.random.default_rng(seed)
    shape = (PADDLEOCR_VL_IMAGE["height"], PADDLEOCR_VL_IMAGE["width"], 3)
    return [rng.integers(0, 256, shape, dtype=np.uint8) for _ in range(count)]


def _inputs(processor, prompts, seed: int) -> dict:
    return dict(processor(text=list(prompts), images=_images(len(prompts), seed), return_tensors="pt", padding=True))


def _assert_equal(got, expected):
    assert got.shape == expected.shape and torch.equal(got, expected), f"\nexpected {expected.tolist()}\ngot {got.tolist()}"


def test_packed_patches_are_sliced_and_repacked_by_their_image_grid():
    from hfexport.preparers import image_count, image_slice, repack_images

    grid = torch.tensor([[1, 2, 2], [1, 2, 4]])  # 4 and 8 patch rows
    pixels = torch.arange(12.0)[:, None].expand(12, 3)
    images = {"pixel_values": pixels, "image_grid_thw": grid}
    assert image_count(images) == 2
    second = image_slice(images, 1, 2)
    assert second["pixel_values"][:, 0].tolist() == list(range(4, 12)) and second["image_grid_thw"].tolist() == [[1, 2, 4]]
    assert image_count({"pixel_values": pixels[:5], "image_grid_thw": grid}) is None
    # a probe tiling the images to 3 (image 2 is image 0 again) takes their patches along
    tiled = repack_images(images, {"pixel_values": pixels, "image_grid_thw": grid[[0, 1, 0]]})
    assert tiled["pixel_values"][:, 0].tolist() == [*range(12), *range(4)]
    cropped = repack_images(images, {"pixel_values": pixels, "image_grid_thw": grid[:1]})
    assert cropped["pixel_values"][:, 0].tolist() == list(range(4))
    llava = {"pixel_values": torch.zeros(2, 3, 8, 8)}
    assert image_count(llava) == 2 and image_slice(llava, 1, 2)["pixel_values"].shape[0] == 1


@pytest.fixture(scope="module")
def qwen2_vl(session_dir):
    from transformers import Qwen2VLForConditionalGeneration

    from hfexport.models import load_processor

    folder = make_model("tiny-qwen2-vl", session_dir / "tiny-qwen2-vl-mrope")
    return folder, Qwen2VLForConditionalGeneration.from_pretrained(folder).eval(), load_processor(folder)


@pytest.mark.slow
@pytest.mark.parametrize("export_format", ["onnx", "openvino", "dynamo"])
def test_qwen2_vl_generates_from_images_as_model_generate(session_dir, qwen2_vl, export_format):
    from hfexport import ExportedModel
    from hfexport.job.run import run_job

    folder, model, processor = qwen2_vl
    target = f"{export_format}-generation"
    output = session_dir / f"exported-qwen2-vl-{export_format}"
    report = run_job(folder, output, targets=[target], latency=False)
    assert report.targets[target].status == "ok", report.targets[target].error
    generation = report.targets[target].verification["generation"]
    assert generation["passed"] and generation["token_agreement"] == 1.0, generation

    exported = ExportedModel.from_pretrained(output / target, precision="f32")
    assert exported.runners["decode"].metadata.kwargs["position_ids"]["shape"][0] == 4
    inputs = _inputs(processor, PROMPTS, DISCRIMINATING_SEED)
    assert (inputs["attention_mask"] == 0).any() and inputs["pixel_values"].shape[0] == 2 * 32  # packed, padded
    with torch.no_grad():
        expected = model.generate(**inputs, do_sample=False, max_new_tokens=MAX_NEW)
        mask = inputs["attention_mask"]
        one_axis = ((mask.cumsum(-1) - 1).masked_fill(mask == 0, 0))[None].expand(4, -1, -1).clone()
        control = model.generate(**inputs, position_ids=one_axis, do_sample=False, max_new_tokens=MAX_NEW)
    assert not torch.equal(control, expected)  # the case tells 1-axis positions from the model's own
    _assert_equal(exported.generate(**inputs, max_new_tokens=MAX_NEW), expected)

    # seeded sampling, two sequences per prompt: the positions repeat with the prompts, as generate repeats them
    torch.manual_seed(7)
    with torch.no_grad():
        expected = model.generate(**inputs, do_sample=True, top_k=20, num_return_sequences=2, max_new_tokens=MAX_NEW)
    got = exported.generate(**inputs, do_sample=True, top_k=20, num_return_sequences=2, max_new_tokens=MAX_NEW, seed=7)
    _assert_equal(got, expected)


@pytest.mark.slow
@pytest.mark.parametrize("export_format", ["onnx", "openvino"])
def test_paddleocr_vl_generates_from_images_as_model_generate(session_dir, export_format):
    """PaddleOCR-VL shares the mechanism (its `_prepare_position_ids_for_generation` and `get_rope_index` are
    Qwen2-VL's): nothing in hfexport names either model."""
    from transformers import AutoModelForImageTextToText

    from hfexport import ExportedModel
    from hfexport.job.run import run_job
    from hfexport.models import load_processor
    from hfexport.testing.models import PADDLEOCR_VL_PROMPT

    folder = make_model("tiny-paddleocr-vl", session_dir / "tiny-paddleocr-vl-mrope")
    target = f"{export_format}-generation"
    output = session_dir / f"exported-paddleocr-vl-{export_format}"
    report = run_job(folder, output, targets=[target], latency=False)
    assert report.targets[target].status == "ok", report.targets[target].error
    assert report.targets[target].verification["generation"]["passed"]
    model, processor = AutoModelForImageTextToText.from_pretrained(folder).eval(), load_processor(folder)
    exported = ExportedModel.from_pretrained(output / target, precision="f32")
    prompts = [prompt.replace(QWEN2_VL_PROMPT, PADDLEOCR_VL_PROMPT) for prompt in PROMPTS]
    inputs = _inputs(processor, prompts, DISCRIMINATING_SEED)
    assert (inputs["attention_mask"] == 0).any()
    with torch.no_grad():
        expected = model.generate(**inputs, do_sample=False, max_new_tokens=MAX_NEW)
    _assert_equal(exported.generate(**inputs, max_new_tokens=MAX_NEW), expected)
