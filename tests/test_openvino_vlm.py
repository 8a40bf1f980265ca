"""A vision-language OpenVINO generation export in optimum-intel's layout, the one OpenVINO GenAI's `VLMPipeline`
opens (`openvino_language_model.xml`, `openvino_text_embeddings_model.xml`, `openvino_vision_embeddings_model.xml`,
the tokenizer IRs, a flat `preprocessor_config.json`: `hfexport.formats.openvino.vlm_layout`), run by VLMPipeline in
the gate on each sample's text and image, token for token against `model.generate`
(`hfexport.formats.openvino.runtimes.openvino_genai_vlm`).

The export tests are slow (no session fixture exports tiny-llava to OpenVINO: a job of about a minute and a half);
the refusals and the hand-over of prompts and images are checked on files written here.
"""

from __future__ import annotations

import json
import os
import subprocess
from pathlib import Path

import numpy as np
import pytest

from hfexport.deployment import FAILED, NOT_CHECKED, PASSED, GenerationRequest
from hfexport.formats.openvino import vlm_layout
from hfexport.formats.openvino.runtimes import openvino_genai, openvino_genai_vlm
from hfexport.testing.readme import readme_snippet

TARGET = "openvino-generation"
PROMPTS = ["<image>\nDescribe the picture", "<image>\nThe capital of France is"]
MAX_NEW = 8
#: tiny-llava's image processor (CLIP's), as the flat preprocessor_config.json VLMPipeline reads holds it
SETTINGS = {"crop_size": {"height": 32, "width": 32}, "size": {"shortest_edge": 32}, "do_normalize": True,
            "image_mean": [0.48145466, 0.4578275, 0.40821073], "image_std": [0.26862954, 0.26130258, 0.27577711],
            "rescale_factor": 1 / 255}


def _normalized(images: np.ndarray) -> np.ndarray:
    """`[n, height, width, 3]` uint8 images as a CLIP processor's float32 `pixel_values`."""
    mean = np.asarray(SETTINGS["image_mean"], dtype=np.float32)[:, None, None]
    std = np.asarray(SETTINGS["image_std"], dtype=np.float32)[:, None, None]
    return ((images.transpose(0, 3, 1, 2).astype(np.float32) * np.float32(1 / 255)) - mean) / std


def test_vlmpipeline_is_not_checked_with_its_own_reason_where_it_cannot_run_the_export(tmp_path):
    """Decided before running: a model type VLMPipeline does not know (Idefics3/SmolVLM) is refused in its own words
    (vlm_config.cpp); one it runs on a vision split hfexport does not write (Qwen2.5-VL's, with window attention)
    names that split; a LLaVA or Qwen2-VL folder without the layout names the layout, one whose decode takes one
    token says so."""
    request = GenerationRequest(prompts=[[5, 3, 6]], expected=[[7]], max_new_tokens=1, eos_token_id=[1],
                                texts=["<image>\nhi"], extra={"pixel_values": np.zeros((1, 3, 32, 32), np.float32)})
    (tmp_path / "config.json").write_text(json.dumps({"model_type": "idefics3"}))
    check = openvino_genai_vlm.check_generation(tmp_path, request, "/no/python")
    assert (check.verdict, check.reason) == (NOT_CHECKED, "OpenVINO GenAI 2026.4.1's VLMPipeline throws \"Unsupported "
                                             "'idefics3' VLM model type\" (to_vlm_model_type, "
                                             "src/cpp/src/visual_language/vlm_config.cpp)")
    (tmp_path / "config.json").write_text(json.dumps({"model_type": "qwen2_5_vl"}))
    check = openvino_genai_vlm.check_generation(tmp_path, request, "/no/python")
    assert check.verdict == NOT_CHECKED and "window_attention_mask" in check.reason
    for model_type in ("llava", "qwen2_vl"):
        (tmp_path / "config.json").write_text(json.dumps({"model_type": model_type}))
        check = openvino_genai_vlm.check_generation(tmp_path, request, "/no/python")
        assert (check.verdict, check.reason) == (NOT_CHECKED, openvino_genai_vlm.NOT_IN_LAYOUT)
    decode = {"metadata": {"kwargs": {"input_ids": {"shape": [2, 1]}}}}
    (tmp_path / "export.json").write_text(json.dumps({"export_format": "openvino", "components": {"decode": decode}}))
    check = openvino_genai_vlm.check_generation(tmp_path, request, "/no/python")
    assert (check.verdict, check.reason) == (NOT_CHECKED, openvino_genai_vlm.ONE_TOKEN_DECODE)


def test_only_a_qwen2_vl_openvino_vlm_decode_is_traced_on_the_prompt():
    """VLMPipeline prefills through the language model made from the decode, and a Qwen2-VL decode traced on one
    token keeps that length: its OpenVINO image-text-to-text plan traces the decode on several tokens; LLaVA's, a
    Qwen2-VL text task's and another format's are not asked to."""
    from types import SimpleNamespace

    from hfexport.formats import format_traits

    openvino, onnx = format_traits("openvino"), format_traits("onnx")
    qwen2_vl, llava = SimpleNamespace(model_type="qwen2_vl"), SimpleNamespace(model_type="llava")
    assert openvino.decode_takes_the_prompt(qwen2_vl, "image-text-to-text")
    assert not openvino.decode_takes_the_prompt(llava, "image-text-to-text")
    assert not openvino.decode_takes_the_prompt(qwen2_vl, "text-generation")
    assert not onnx.decode_takes_the_prompt(qwen2_vl, "image-text-to-text")


def test_the_prompt_vlmpipeline_gets_is_the_processors(tmp_path):
    """VLMPipeline writes an image's tokens then a newline for each `<image>` tag: `<image>\\n` in the sample text is
    handed over as `<image>`; a text without that newline would make other ids than the processor's, and is not
    handed over."""
    image_token = 3
    prompt = [0, *[image_token] * 16, 9, 10]
    request = GenerationRequest(prompts=[prompt], expected=[[7]], max_new_tokens=1, eos_token_id=[1],
                                texts=["<image>\nDescribe"])
    given, expanded = openvino_genai_vlm.pipeline_prompts(request, {"image_token_index": image_token})
    assert given == ["<image>Describe"] and expanded == ["<image>" * 16 + "\nDescribe"]
    request.texts = ["<image> Describe"]
    with pytest.raises(openvino_genai_vlm.NotHandable, match="normalize_prompt"):
        openvino_genai_vlm.pipeline_prompts(request, {"image_token_index": image_token})


def test_qwen2_vl_prompts_keep_the_tag_vlmpipeline_expands(tmp_path):
    """VLMPipeline writes a Qwen2-VL image's `<|image_pad|>` tokens between `<|vision_start|>` and `<|vision_end|>`
    of its native tag: the sample text is handed over as it is; the ids are checked against that text expanded."""
    from hfexport.testing.models import QWEN2_VL_PROMPT

    pad = 7
    request = GenerationRequest(prompts=[[5, *[pad] * 8, 6, 9]], expected=[[7]], max_new_tokens=1, eos_token_id=[1],
                                texts=[f"{QWEN2_VL_PROMPT} Describe"])
    given, expanded = openvino_genai_vlm.pipeline_prompts(request, {"model_type": "qwen2_vl", "image_token_id": pad})
    assert given == [f"{QWEN2_VL_PROMPT} Describe"]
    assert expanded == ["<|vision_start|>" + "<|image_pad|>" * 8 + "<|vision_end|> Describe"]
    request.texts = ["<|image_pad|> Describe"]
    with pytest.raises(openvino_genai_vlm.NotHandable, match="InputsEmbedderQwen2VL"):
        openvino_genai_vlm.pipeline_prompts(request, {"model_type": "qwen2_vl", "image_token_id": pad})


def test_qwen2_vl_patches_give_back_the_image_vlmpipeline_keeps_at_its_size(tmp_path):
    """The PIL Qwen2-VL image processor's packed patches, put back in place and unnormalized, are the uint8 image
    exactly, for an image `smart_resize` keeps (VLMPipeline's, qwen2vl/classes.cpp, equal to the processor's on these
    sizes); an image it would resize is not handed over."""
    from transformers.image_utils import ChannelDimension
    from transformers.models.qwen2_vl.image_processing_pil_qwen2_vl import Qwen2VLImageProcessorPil, smart_resize

    pixels = 32 * 64
    processor = Qwen2VLImageProcessorPil(patch_size=8, temporal_patch_size=2, merge_size=2, min_pixels=pixels,
                                         max_pixels=pixels)
    (tmp_path / "preprocessor_config.json").write_text(json.dumps(processor.to_dict()))
    images = np.random.default_rng(0).integers(0, 256, (2, 32, 64, 3), dtype=np.uint8)
    out = processor(images=list(images), return_tensors="np", input_data_format=ChannelDimension.LAST)
    assert out["image_grid_thw"].tolist() == [[1, 4, 8]] * 2
    got = openvino_genai_vlm.source_images(tmp_path, out["pixel_values"], out["image_grid_thw"])
    assert np.array_equal(np.asarray(got), images)
    for height, width in ((32, 64), (30, 70), (100, 20), (16, 16), (200, 300)):
        assert openvino_genai_vlm.smart_resize(height, width, 16, 1024, 4096) == \
            smart_resize(height, width, 16, 1024, 4096), (height, width)
    with pytest.raises(openvino_genai_vlm.NotHandable, match="smart_resize"):
        openvino_genai_vlm.source_images(tmp_path, out["pixel_values"][:16], np.array([[1, 2, 8]]))


def test_the_image_vlmpipeline_gets_is_the_one_the_pixel_values_were_made_from(tmp_path):
    """The processor's normalization undone gives back the uint8 image exactly (VLMPipeline then normalizes it as the
    processor did); pixel values of another size than the crop (VLMPipeline would resize them) are not handed over."""
    (tmp_path / "preprocessor_config.json").write_text(json.dumps(SETTINGS))
    images = np.random.default_rng(0).integers(0, 256, (2, 32, 32, 3), dtype=np.uint8)
    assert np.array_equal(np.asarray(openvino_genai_vlm.source_images(tmp_path, _normalized(images))), images)
    with pytest.raises(openvino_genai_vlm.NotHandable, match="crop-sized"):
        openvino_genai_vlm.source_images(tmp_path, _normalized(images[:, :16]))
    with pytest.raises(openvino_genai_vlm.NotHandable, match="whole pixel values"):
        openvino_genai_vlm.source_images(tmp_path, _normalized(images) + 0.01)


def test_a_vision_language_request_goes_to_vlmpipeline(tmp_path, monkeypatch):
    """LLMPipeline's check hands a request with pixel values to VLMPipeline's (not "no openvino_model.xml")."""
    monkeypatch.setattr(openvino_genai, "interpreter", lambda runtime, name: "/some/python")
    (tmp_path / "config.json").write_text(json.dumps({"model_type": "idefics3"}))
    request = GenerationRequest(prompts=[[5]], expected=[[7]], max_new_tokens=1, eos_token_id=[1],
                                extra={"pixel_values": np.zeros((1, 3, 32, 32), np.float32)})
    (check,) = openvino_genai.check_generation(tmp_path, request)
    assert check.verdict == NOT_CHECKED and "Unsupported 'idefics3' VLM model type" in check.reason
    assert vlm_layout.limitation("llava") is None


# The export: tiny-llava's OpenVINO generation target, its gate running VLMPipeline (slow).


@pytest.fixture(scope="module")
def genai_env():
    from hfexport.testing import peers

    return {"HFEXPORT_RUNTIME_OPENVINO_GENAI": str(peers.openvino_genai_venv())}


@pytest.fixture(scope="module")
def llava_openvino(session_dir, tiny_llava, genai_env):
    """tiny-llava's `openvino-generation` target exported and verified by the job: (folder, target report)."""
    from unittest import mock

    from hfexport.job.run import run_job

    output = session_dir / "llava-openvino-vlm"
    with mock.patch.dict(os.environ, genai_env):
        report = run_job(tiny_llava, output, [TARGET], latency=False)
    return output / TARGET, report.targets[TARGET]


def _request(model, processor, texts: list[str], images: list[np.ndarray]) -> GenerationRequest:
    """`model.generate`'s greedy tokens on each text with its image (batch 1), as the gate asks the runtimes; the
    processor's image tensors (`pixel_values`, and Qwen2-VL's `image_grid_thw`) in `extra`."""
    import torch

    prompts, expected, extra = [], [], {}
    for text, image in zip(texts, images, strict=True):
        inputs = processor(text=[text], images=[image], return_tensors="pt")
        with torch.no_grad():
            out = model.generate(**inputs, do_sample=False, max_new_tokens=MAX_NEW)
        prompts.append(inputs["input_ids"][0].tolist())
        expected.append(out[0, inputs["input_ids"].shape[1]:].tolist())
        for name in ("pixel_values", "image_grid_thw"):
            if name in inputs:
                extra.setdefault(name, []).append(inputs[name].numpy())
    eos = model.generation_config.eos_token_id
    return GenerationRequest(prompts=prompts, expected=expected, max_new_tokens=MAX_NEW,
                             eos_token_id=eos if isinstance(eos, list) else [eos], padded_expected=None, texts=texts,
                             model_type=model.config.model_type,
                             extra={name: np.concatenate(arrays) for name, arrays in extra.items()})


@pytest.mark.slow
def test_the_export_is_in_vlmpipelines_layout(llava_openvino):
    """The three models VLMPipeline opens, with the names it feeds and reads; the language model stateful (its cache
    in states, `beam_idx`); hfexport's own prefill under its own name, as the manifest says."""
    import openvino as ov

    folder = llava_openvino[0]

    def io(name):
        model = ov.Core().read_model(str(folder / name))
        return ([(port.get_any_name(), str(port.get_partial_shape())) for port in model.inputs],
                [(port.get_any_name(), str(port.get_partial_shape())) for port in model.outputs], len(model.get_sinks()))

    assert io(vlm_layout.VISION_EMBEDDINGS_FILE) == ([("pixel_values", "[?,3,?,?]")],
                                                     [("last_hidden_state", "[1,16,64]")], 0)
    assert io(vlm_layout.TEXT_EMBEDDINGS_FILE) == ([("input_ids", "[?,?]")], [("inputs_embeds", "[?,?,64]")], 0)
    assert io(vlm_layout.LANGUAGE_MODEL_FILE) == ([("inputs_embeds", "[?,?,64]"), ("attention_mask", "[?,?]"),
                                                   ("position_ids", "[?,?]"), ("beam_idx", "[?]")],
                                                  [("logits", "[?,?,320]")], 4)
    for name in ("openvino_tokenizer.xml", "openvino_detokenizer.xml", "tokenizer.json", "config.json",
                 "generation_config.json"):
        assert (folder / name).is_file(), name
    flat = json.loads((folder / "preprocessor_config.json").read_text())
    assert (flat["crop_size"], flat["size"]) == ({"height": 32, "width": 32}, {"shortest_edge": 32})
    manifest = json.loads((folder / "export.json").read_text())
    assert manifest["components"]["language_model"]["file"] == vlm_layout.PREFILL_FILE
    for name in vlm_layout.FILES:  # the components' f32 precision hint, not the CPU's default precision
        model = ov.Core().read_model(str(folder / name))
        assert model.get_rt_info(["runtime_options", "INFERENCE_PRECISION_HINT"]).astype(str) == "f32", name


@pytest.mark.slow
def test_the_gate_ran_vlmpipeline_on_the_image_prompts_token_for_token(llava_openvino):
    target = llava_openvino[1]
    assert target.status == "ok", target.error
    genai = {check["runtime"]: check for check in target.runtimes}["openvino-genai"]
    assert (genai["verdict"], genai["batch_sizes"], genai["precision"]) == (PASSED, [1], "f32"), genai


@pytest.mark.slow
def test_vlmpipeline_reads_the_images(llava_openvino, llava, genai_env, monkeypatch):
    """Not a check that passes whatever the image: judged against the tokens of the images the model saw, VLMPipeline
    fed other pixels generates other tokens (and on the same pixels, the same)."""
    model, processor = llava
    rng = np.random.default_rng(3)
    images = [rng.integers(0, 256, (32, 32, 3), dtype=np.uint8) for _ in PROMPTS]
    request = _request(model, processor, PROMPTS, images)
    monkeypatch.setenv("HFEXPORT_RUNTIME_OPENVINO_GENAI", genai_env["HFEXPORT_RUNTIME_OPENVINO_GENAI"])
    (same,) = openvino_genai.check_generation(llava_openvino[0], request)
    assert same.verdict == PASSED, same.reason
    request.extra = {"pixel_values": _normalized(255 - np.stack(images))}
    (other,) = openvino_genai.check_generation(llava_openvino[0], request)
    assert other.verdict == FAILED and other.first_difference is not None, other


@pytest.mark.slow
def test_vlmpipeline_runs_the_pull_request_as_the_readme_says(llava_openvino, llava, tiny_llava, hub, genai_env,
                                                             tmp_path):
    """Published as a pull request on the local Hub, downloaded from `refs/pr/N`: the README's VLMPipeline snippet
    generates `model.generate`'s tokens for its prompt and picture, and the model card shows VLMPipeline."""
    import shutil


    from hfexport.publication.publish import publish

    repo = f"{hub.user}/llava-vlmpipeline"
    hub.seed_repo(repo, tiny_llava)
    output = tmp_path / "out-job"
    shutil.copytree(llava_openvino[0].parent, output)
    num = publish(output, repo, mode="pr", token=hub.write_token).pr_num
    image = np.random.default_rng(5).integers(0, 256, (32, 32, 3), dtype=np.uint8)
    done = _run_readme_snippet(hub, repo, num, vlm_layout.LANGUAGE_MODEL_FILE, "readme-vlm-openvino-genai", image,
                               genai_env, tmp_path)
    model, processor = llava
    request = _request(model, processor, [PROMPTS[0]], [image])
    new = processor.tokenizer.decode(request.expected[0], skip_special_tokens=True)
    assert new.strip() and new.strip() in done.stdout, (new, done.stdout)
    card = hub.read_file(repo, "README.md", f"refs/pr/{num}").decode()
    assert "openvino_genai.VLMPipeline" in card and "LLMPipeline" not in card


@pytest.mark.slow
def test_a_rebind_writes_the_layout_again_from_the_rebound_components(llava_openvino, llava, tmp_path):
    """VLMPipeline's three models copy the components' weights: after new weights are written into the components
    (`hfexport.rebind.folder.rebind_copy`), they are made again from them, not left holding the old weights."""
    import shutil

    from hfexport.rebind.folder import rebind_copy

    source = tmp_path / "previous"
    shutil.copytree(llava_openvino[0], source)
    for name in vlm_layout.FILES:
        (source / name.replace(".xml", ".bin")).write_bytes(b"stale")
    manifest = json.loads((source / "export.json").read_text())
    rebind_copy(source, tmp_path / "rebound", manifest, llava[0])
    for name in vlm_layout.FILES:
        weights = name.replace(".xml", ".bin")
        assert (tmp_path / "rebound" / weights).read_bytes() == (llava_openvino[0] / weights).read_bytes(), name


def test_the_card_opens_a_vlm_with_vlmpipeline_where_the_gate_ran_it():
    """An image-text-to-text OpenVINO target: the card's OpenVINO GenAI snippet is VLMPipeline's, with an image (an
    LLMPipeline cannot open that folder); none where VLMPipeline was not checked."""
    from hfexport.layout import Place
    from hfexport.report.card import runtime_snippets
    from hfexport.report.data import JobReport, TargetReport

    def card(verdict, files=()):
        target = TargetReport(TARGET, "openvino", "generation", plan={"task": "image-text-to-text"},
                              runtimes=[{"runtime": "openvino-genai", "verdict": verdict}], files=list(files))
        places = {TARGET: Place(f"openvino/{TARGET}")}
        return "\n".join(runtime_snippets("org/m", JobReport(source={}, targets={TARGET: target}), places))

    text = card("passed")
    assert f'openvino_genai.VLMPipeline(f"{{local}}/openvino/{TARGET}", "CPU")' in text
    assert "images=[ov.Tensor(pixels[None])]" in text and "apply_chat_template=False" in text
    assert "LLMPipeline" not in text and '"<image>\\nDescribe the picture"' in text
    assert "VLMPipeline" not in card("not_checked")
    # Qwen2-VL's layout (its vision split): its own image tag
    text = card("passed", [{"path": f"openvino/{TARGET}/{vlm_layout.SPLIT_FILES[1]}"}])
    assert '"<|vision_start|><|image_pad|><|vision_end|> Describe the picture"' in text


# Qwen2-VL: tiny-qwen2-vl's OpenVINO generation target on VLMPipeline's own vision split (slow).


@pytest.fixture(scope="module")
def qwen2_vl_openvino(session_dir, genai_env):
    """tiny-qwen2-vl built and its `openvino-generation` target exported and verified by the job: (model folder,
    target folder, target report)."""
    from unittest import mock

    from hfexport.job.run import run_job
    from hfexport.testing.models import make_model

    model = make_model("tiny-qwen2-vl", session_dir / "tiny-qwen2-vl-vlmpipeline")
    output = session_dir / "qwen2-vl-openvino-vlm"
    with mock.patch.dict(os.environ, genai_env):
        report = run_job(model, output, [TARGET], latency=False)
    return model, output / TARGET, report.targets[TARGET]


@pytest.fixture(scope="module")
def qwen2_vl(qwen2_vl_openvino):
    from transformers import AutoModelForImageTextToText

    from hfexport.models import load_processor

    folder = qwen2_vl_openvino[0]
    return AutoModelForImageTextToText.from_pretrained(folder).eval(), load_processor(folder)


@pytest.mark.slow
def test_a_qwen2_vl_export_is_in_vlmpipelines_layout_and_the_gate_ran_it_token_for_token(qwen2_vl_openvino):
    """VLMPipeline's Qwen2-VL split (qwen2vl/classes.cpp) with the names, shapes and types it feeds: the patch
    embeddings on `hidden_states`; the blocks and merger on `hidden_states`, `attention_mask` `[1, patches, patches]`
    and `rotary_pos_emb` of a static width (VLMPipeline reads it: head_dim / 2); the language model on
    `position_ids` `[3, batch, sequence]`, no `mm_token_type_ids`; its decode traced on several tokens. The gate
    passed VLMPipeline on both sample prompts."""
    import openvino as ov

    _, folder, target = qwen2_vl_openvino
    assert target.status == "ok", target.error
    genai = {check["runtime"]: check for check in target.runtimes}["openvino-genai"]
    assert (genai["verdict"], genai["batch_sizes"], genai["precision"]) == (PASSED, [1], "f32"), genai

    def io(name):
        model = ov.Core().read_model(str(folder / name))
        return ([(port.get_any_name(), str(port.get_partial_shape()), port.get_element_type().get_type_name())
                 for port in model.inputs], [(port.get_any_name(), str(port.get_partial_shape()))
                                             for port in model.outputs], len(model.get_sinks()))

    assert io(vlm_layout.VISION_EMBEDDINGS_FILE) == ([("hidden_states", "[?,384]", "f32")],
                                                     [("last_hidden_state", "[?,32]")], 0)
    assert io(vlm_layout.SPLIT_FILES[1]) == ([("hidden_states", "[?,32]", "f32"), ("attention_mask", "[1,?,?]", "f32"),
                                              ("rotary_pos_emb", "[?,4]", "f32")], [("last_hidden_state", "[?,64]")], 0)
    assert io(vlm_layout.LANGUAGE_MODEL_FILE) == ([("inputs_embeds", "[?,?,64]", "f32"),
                                                   ("attention_mask", "[?,?]", "i64"),
                                                   ("position_ids", "[3,?,?]", "i64"), ("beam_idx", "[?]", "i32")],
                                                  [("logits", "[?,?,320]")], 4)
    manifest = json.loads((folder / "export.json").read_text())
    assert vlm_layout.takes_the_prompt(manifest)
    flat = json.loads((folder / "preprocessor_config.json").read_text())
    assert (flat["patch_size"], flat["merge_size"], flat["temporal_patch_size"], flat["size"]) == \
        (8, 2, 2, {"longest_edge": 2048, "shortest_edge": 2048})
    for name in (*vlm_layout.FILES, *vlm_layout.SPLIT_FILES):  # the components' f32 precision hint
        model = ov.Core().read_model(str(folder / name))
        assert model.get_rt_info(["runtime_options", "INFERENCE_PRECISION_HINT"]).astype(str) == "f32", name


@pytest.mark.slow
def test_vlmpipeline_reads_qwen2_vl_images(qwen2_vl_openvino, qwen2_vl, genai_env, monkeypatch):
    """Judged against the tokens of the images the model saw, VLMPipeline fed other pixels generates other tokens
    (and on the same pixels, the same): the vision split is what runs, not a constant."""
    from hfexport.testing.models import PADDLEOCR_VL_IMAGE, QWEN2_VL_PROMPT

    model, processor = qwen2_vl
    shape = (PADDLEOCR_VL_IMAGE["height"], PADDLEOCR_VL_IMAGE["width"], 3)  # the pixel budget: smart_resize keeps it
    rng = np.random.default_rng(3)
    images = [rng.integers(0, 256, shape, dtype=np.uint8) for _ in range(2)]
    texts = [f"{QWEN2_VL_PROMPT} Describe the picture", f"{QWEN2_VL_PROMPT} The capital of France is"]
    request = _request(model, processor, texts, images)
    monkeypatch.setenv("HFEXPORT_RUNTIME_OPENVINO_GENAI", genai_env["HFEXPORT_RUNTIME_OPENVINO_GENAI"])
    (same,) = openvino_genai.check_generation(qwen2_vl_openvino[1], request)
    assert same.verdict == PASSED, same.reason
    other = _request(model, processor, texts, [255 - image for image in images])
    request.extra = other.extra
    (changed,) = openvino_genai.check_generation(qwen2_vl_openvino[1], request)
    assert changed.verdict == FAILED and changed.first_difference is not None, changed


@pytest.mark.slow
def test_vlmpipeline_runs_a_qwen2_vl_pull_request_as_the_readme_says(qwen2_vl_openvino, qwen2_vl, hub, genai_env,
                                                                      tmp_path):
    """Published as a pull request on the local Hub, downloaded from `refs/pr/N` with the real client: the README's
    Qwen2-VL VLMPipeline snippet generates `model.generate`'s new tokens for its prompt and picture."""

    from hfexport.publication.publish import publish
    from hfexport.testing.models import PADDLEOCR_VL_IMAGE, QWEN2_VL_PROMPT

    folder, exported, _ = qwen2_vl_openvino
    repo = f"{hub.user}/qwen2-vl-vlmpipeline"
    hub.seed_repo(repo, folder)
    num = publish(exported.parent, repo, mode="pr", token=hub.write_token).pr_num
    shape = (PADDLEOCR_VL_IMAGE["height"], PADDLEOCR_VL_IMAGE["width"], 3)
    image = np.random.default_rng(5).integers(0, 256, shape, dtype=np.uint8)
    done = _run_readme_snippet(hub, repo, num, vlm_layout.SPLIT_FILES[1], "readme-vlm-openvino-genai-qwen2-vl", image,
                               genai_env, tmp_path)
    model, processor = qwen2_vl
    request = _request(model, processor, [f"{QWEN2_VL_PROMPT} Describe the picture"], [image])
    new = processor.tokenizer.decode(request.expected[0], skip_special_tokens=True)
    assert new.strip() and new.strip() in done.stdout, (new, done.stdout)


@pytest.mark.slow
def test_a_rebind_makes_the_qwen2_vl_split_again_from_the_model(qwen2_vl_openvino, qwen2_vl, tmp_path):
    """The vision split holds the model's weights, not the components': a rebind to the model makes it again from
    the model (the same bytes for the same weights, the stale ones replaced); a rebind without a model object (from
    a checkpoint's tensors) removes it rather than keep weights that are not the new ones."""
    import shutil

    from hfexport.formats.openvino.program import OpenvinoProgram
    from hfexport.rebind.folder import rebind_copy

    exported = qwen2_vl_openvino[1]
    source = tmp_path / "previous"
    shutil.copytree(exported, source)
    for name in (*vlm_layout.FILES, *vlm_layout.SPLIT_FILES):
        (source / name.replace(".xml", ".bin")).write_bytes(b"stale")
    manifest = json.loads((source / "export.json").read_text())
    rebind_copy(source, tmp_path / "rebound", manifest, qwen2_vl[0])
    for name in (*vlm_layout.FILES, *vlm_layout.SPLIT_FILES):
        weights = name.replace(".xml", ".bin")
        assert (tmp_path / "rebound" / weights).read_bytes() == (exported / weights).read_bytes(), name
    OpenvinoProgram().after_rebind(tmp_path / "rebound")
    assert not any((tmp_path / "rebound" / name).exists() for name in vlm_layout.SPLIT_FILES)


def _run_readme_snippet(hub, repo: str, num: int, layout_file: str, marker: str, image, genai_env, tmp_path):
    """Download the folder of pull request `num` that holds `layout_file` with the real client, as `out/TARGET`
    beside `picture.npy` (`image`), and run the README's snippet after `marker` in OpenVINO GenAI's environment;
    the finished process (asserted to exit 0)."""
    from huggingface_hub import snapshot_download

    files = set(hub.list_files(repo, f"refs/pr/{num}"))
    folder = next(path.rsplit("/", 1)[0] for path in files if path.endswith("/" + layout_file))
    local = Path(snapshot_download(repo, revision=f"refs/pr/{num}", allow_patterns=[f"{folder}/*"],
                                   cache_dir=tmp_path / "hub-cache", token=hub.write_token))
    (tmp_path / "out").mkdir()
    (tmp_path / "out" / TARGET).symlink_to(local / folder)
    np.save(tmp_path / "picture.npy", image)
    script = tmp_path / "snippet.py"
    script.write_text(readme_snippet(marker))
    done = subprocess.run([genai_env["HFEXPORT_RUNTIME_OPENVINO_GENAI"], str(script)], cwd=tmp_path,
                          capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-2000:]
    return done
