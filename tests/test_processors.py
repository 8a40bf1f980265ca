"""Multimodal processors whose video processor needs torchvision, loaded here without it (`hfexport.processors`):
MiniCPM-V 4.6's and Qwen2.5-Omni's processors are assembled from their PIL image processor, feature extractor and
tokenizer, and make the inputs the full processor makes for images and audio; only a video is refused, with
transformers' own message. Tiny models, seconds each."""

from __future__ import annotations

import importlib.util
import json

import numpy as np
import pytest

from hfexport.testing.models import MINICPM_V_IMAGE, QWEN2_5_OMNI_TOKENS, make_model

pytestmark = pytest.mark.skipif(importlib.util.find_spec("torchvision") is not None,
                                reason="torchvision is installed: the processors load whole")


def _image(height: int, width: int, seed: int = 0):
    from PIL import Image

    return Image.fromarray(np.random.default_rng(seed).integers(0, 256, (height, width, 3), dtype=np.uint8))


@pytest.fixture(scope="module")
def tiny_minicpm_v(session_dir):
    return make_model("tiny-minicpm-v", session_dir / "processors" / "tiny-minicpm-v")


@pytest.fixture(scope="module")
def tiny_omni(session_dir):
    return make_model("tiny-qwen2.5-omni", session_dir / "processors" / "tiny-qwen2.5-omni")


def test_minicpm_v_loads_without_its_video_processor_and_makes_the_processors_inputs(tiny_minicpm_v, caplog):
    import torch

    from hfexport.models import load_processor
    from hfexport.processors import missing_parts
    from hfexport.testing.models import minicpm_v_inputs

    processor = load_processor(tiny_minicpm_v)
    assert type(processor).__name__ == "MiniCPMV4_6Processor"
    assert missing_parts(processor) == {"video_processor": "MiniCPMV4_6VideoProcessor requires the Torchvision "
                                                           "library but it was not found in your environment"}
    assert "MiniCPMV4_6Processor loaded without its video processor" in caplog.text
    image = _image(MINICPM_V_IMAGE["height"], MINICPM_V_IMAGE["width"])
    made = processor(text=["<image> Describe the picture"], images=[[image]], return_tensors="pt")
    expected = minicpm_v_inputs(tiny_minicpm_v, ["<image> Describe the picture"], [image])
    assert set(made) == set(expected)
    assert all(torch.equal(made[name], expected[name]) for name in expected)
    # what the processor's constructor read from the saved video settings
    assert processor.video_slice_mode is False and processor.video_token_divisor == 16


def test_qwen2_5_omni_makes_audio_and_image_inputs_and_refuses_a_video(tiny_omni):
    from hfexport.models import load_processor
    from hfexport.processors import missing_parts

    processor = load_processor(tiny_omni)
    assert type(processor).__name__ == "Qwen2_5OmniProcessor"
    assert missing_parts(processor) == {"video_processor": "Qwen2VLVideoProcessor requires the Torchvision library "
                                                           "but it was not found in your environment"}
    audio = np.random.default_rng(0).standard_normal(16_000).astype(np.float32)
    prompt = QWEN2_5_OMNI_TOKENS["audio_bos_token"] + QWEN2_5_OMNI_TOKENS["audio_token"] \
        + QWEN2_5_OMNI_TOKENS["audio_eos_token"] + " Transcribe"
    heard = processor(text=[prompt], audio=[audio], return_tensors="pt")
    assert {"input_ids", "input_features", "feature_attention_mask"} <= set(heard)
    audio_id = processor.tokenizer.convert_tokens_to_ids(QWEN2_5_OMNI_TOKENS["audio_token"])
    assert int((heard["input_ids"] == audio_id).sum()) > 1  # the placeholder expanded to the clip's length
    image = QWEN2_5_OMNI_TOKENS["vision_bos_token"] + QWEN2_5_OMNI_TOKENS["image_token"] \
        + QWEN2_5_OMNI_TOKENS["vision_eos_token"] + " Describe"
    seen = processor(text=[image], images=[_image(32, 48)], return_tensors="pt")
    assert seen["image_grid_thw"].tolist() == [[1, 4, 6]]
    assert seen["pixel_values"].shape[0] == 24
    video = QWEN2_5_OMNI_TOKENS["video_token"] + " Describe"
    with pytest.raises(ImportError, match="video processor not loaded: Qwen2VLVideoProcessor requires the "
                                          "Torchvision library"):
        processor(text=[video], videos=[np.zeros((2, 32, 32, 3), dtype=np.uint8)], return_tensors="pt")


def test_a_processor_saved_without_its_video_processor_keeps_the_video_settings(tiny_minicpm_v, tmp_path):
    """What an export saves beside its files: the video settings as read, so the folder loads whole where
    torchvision is installed (and assembles again here)."""
    from hfexport.models import load_processor
    from hfexport.processors import missing_parts

    processor = load_processor(tiny_minicpm_v)
    processor.save_pretrained(tmp_path)
    saved = json.loads((tmp_path / "processor_config.json").read_text(encoding="utf-8"))
    original = json.loads((tiny_minicpm_v / "video_preprocessor_config.json").read_text(encoding="utf-8"))
    assert saved["video_processor"] == original
    again = load_processor(tmp_path)
    assert missing_parts(again) == missing_parts(processor)
    assert again.image_processor.to_dict() == processor.image_processor.to_dict()


def test_qwen2_vl_makes_the_grid_thw_inputs_from_its_pil_image_processor(session_dir):
    """The Qwen2-VL-class processor (Qwen2.5-VL's, Qwen3-VL's... take the same video processor): packed patches, the
    image grid, each image placeholder expanded to its merged patches, and the multimodal token types."""
    from hfexport.models import load_processor
    from hfexport.processors import missing_parts
    from hfexport.testing.models import PADDLEOCR_VL_IMAGE, QWEN2_VL_PROMPT, QWEN2_VL_TOKENS

    folder = make_model("tiny-qwen2-vl", session_dir / "processors" / "tiny-qwen2-vl")
    processor = load_processor(folder)
    assert type(processor).__name__ == "Qwen2VLProcessor" and set(missing_parts(processor)) == {"video_processor"}
    image = _image(PADDLEOCR_VL_IMAGE["height"], PADDLEOCR_VL_IMAGE["width"])
    made = processor(text=[f"{QWEN2_VL_PROMPT} Describe"], images=[image], return_tensors="pt")
    assert made["image_grid_thw"].tolist() == [[1, 4, 8]] and list(made["pixel_values"].shape) == [32, 384]
    image_id = processor.tokenizer.convert_tokens_to_ids(QWEN2_VL_TOKENS["image_token"])
    assert int((made["input_ids"] == image_id).sum()) == 8  # 32 patches merged 2 x 2
    assert int(made["mm_token_type_ids"].sum()) == 8


def test_the_job_report_says_which_processor_part_was_not_loaded(session_dir, tmp_path):
    """The report's source names the part and transformers' reason (here on a target the plan refuses: seconds)."""
    from hfexport.job.run import run_job
    from hfexport.report.data import validate_report

    folder = make_model("tiny-qwen2-vl", session_dir / "processors" / "tiny-qwen2-vl-job")
    report = run_job(folder, tmp_path / "out", targets=["executorch-generation"])
    assert report.targets["executorch-generation"].status == "error"
    assert "not in Core ATen opset" in report.targets["executorch-generation"].error
    assert report.source["processor_not_loaded"] == {
        "video_processor": "Qwen2VLVideoProcessor requires the Torchvision library but it was not found in your "
                           "environment"}
    written = json.loads((tmp_path / "out" / "export_report.json").read_text(encoding="utf-8"))
    validate_report(written)
    assert written["source"]["processor_not_loaded"] == report.source["processor_not_loaded"]
