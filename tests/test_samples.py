"""A person's own sample image or WAV clip as a job's sample input (`hfexport.samples`, `run_job(sample_files=...)`,
`hfexport export --sample-image/--sample-audio`, the Space's upload): checked before anything loads, decoded, put in
place of the recipe's synthesized images and clips, and named (never by its path) in the report.

The Space's upload, end to end in Chromium, is in tests/test_space.py.
"""

from __future__ import annotations

import json
import struct
import wave
from pathlib import Path

import numpy as np
import pytest
from hfexport.errors import PlanError
from hfexport.samples import SampleError, processor_kinds, read_sample, resample

ROOT = Path(__file__).resolve().parent.parent
EXAMPLES = ROOT / "examples"


def _png(path: Path, size=(40, 30), seed: int = 0) -> Path:
    from PIL import Image

    pixels = np.random.default_rng(seed).integers(0, 256, (size[1], size[0], 3), dtype=np.uint8)
    path.parent.mkdir(parents=True, exist_ok=True)
    Image.fromarray(pixels).save(path)
    return path


def _wav(path: Path, samples: np.ndarray, rate: int = 16000, width: int = 2) -> Path:
    """`samples` (frames x channels, floats in [-1, 1)) as PCM of `width` bytes."""
    frames = samples if samples.ndim == 2 else samples[:, None]
    if width == 1:
        raw = np.round(frames * 128 + 128).clip(0, 255).astype(np.uint8).tobytes()
    elif width == 3:
        ints = np.round(frames * 2**23).clip(-(2**23), 2**23 - 1).astype("<i4")
        raw = ints.view(np.uint8).reshape(-1, 4)[:, :3].tobytes()
    else:
        raw = np.round(frames * 2 ** (8 * width - 1)).clip(-(2 ** (8 * width - 1)),
                                                            2 ** (8 * width - 1) - 1).astype(f"<i{width}").tobytes()
    path.parent.mkdir(parents=True, exist_ok=True)
    with wave.open(str(path), "wb") as clip:
        clip.setnchannels(frames.shape[1])
        clip.setsampwidth(width)
        clip.setframerate(rate)
        clip.writeframes(raw)
    return path


def _tone(rate: int, seconds: float, hz: float = 440.0) -> np.ndarray:
    return (0.5 * np.sin(2 * np.pi * hz * np.arange(int(rate * seconds)) / rate)).astype(np.float32)


# ── Images ───────────────────────────────────────────────────────────────────


def test_an_image_is_decoded_to_rgb_and_recorded_by_name_size_and_pixels(tmp_path):
    from PIL import Image

    path = _png(tmp_path / "nested" / "my photo.png", (40, 30))
    sample = read_sample(path, "image")
    assert sample.image().mode == "RGB" and sample.image().size == (40, 30)
    record = sample.record()
    assert record == {"kind": "image", "name": "my photo.png", "bytes": path.stat().st_size,
                      "sha256": record["sha256"], "width": 40, "height": 30}
    assert str(tmp_path) not in json.dumps(record)
    assert sample.describe().startswith("`my photo.png` · 40 × 30 px · ")
    Image.open(path).convert("L").save(tmp_path / "grey.jpg")  # any mode becomes RGB, JPEG too
    assert read_sample(tmp_path / "grey.jpg", "image").image().mode == "RGB"


def test_what_is_not_a_usable_image_is_refused_by_name_with_what_was_expected(tmp_path, monkeypatch):
    import hfexport.samples as samples

    text = tmp_path / "cat.png"
    text.write_text("not a picture")
    good = _png(tmp_path / "good.png", (40, 30))
    truncated = tmp_path / "cut.png"
    truncated.write_bytes(good.read_bytes()[: good.stat().st_size // 2])
    empty = tmp_path / "empty.png"
    empty.write_bytes(b"")
    cases = [
        (text, "sample image cat.png: not an image (expected PNG, JPEG"),
        (truncated, "sample image cut.png: the image cannot be decoded"),
        (empty, "sample image empty.png: the file is empty"),
        (tmp_path / "missing.png", "sample image missing.png: no such file"),
    ]
    for path, expected in cases:
        with pytest.raises(SampleError) as error:
            read_sample(path, "image")
        assert str(error.value).startswith(expected), str(error.value)
        assert str(tmp_path) not in str(error.value)
    monkeypatch.setattr(samples, "MAX_IMAGE_PIXELS", 1000)  # checked from the header, before decoding
    with pytest.raises(SampleError, match=r"good.png: 40 × 30 pixels is over the 1,000 pixel limit"):
        read_sample(good, "image")
    monkeypatch.setattr(samples, "MAX_BYTES", {"image": 100, "audio": 100})
    with pytest.raises(SampleError, match=r"good.png: .* is over the 100 B limit for a sample image"):
        read_sample(good, "image")
    with pytest.raises(SampleError, match="unknown sample kind 'video'"):
        read_sample(good, "video")


# ── Audio ────────────────────────────────────────────────────────────────────


@pytest.mark.parametrize("width", [1, 2, 3, 4])
def test_pcm_wav_of_every_width_decodes_to_the_same_mono_signal(tmp_path, width):
    left = _tone(16000, 0.25)
    right = -0.5 * left
    path = _wav(tmp_path / f"pcm{width}.wav", np.stack([left, right], 1), width=width)
    sample = read_sample(path, "audio")
    assert (sample.seconds, sample.sampling_rate, sample.channels) == (0.25, 16000, 2)
    tolerance = 1.5 / 128 if width == 1 else 1e-4
    np.testing.assert_allclose(sample.audio(16000), (left + right) / 2, atol=tolerance)
    assert sample.record()["name"] == f"pcm{width}.wav" and "stereo" in sample.describe()


def test_a_clip_at_another_rate_is_resampled_keeping_its_pitch():
    clip = _tone(44100, 1.0, hz=440.0)
    down = resample(clip, 44100, 16000)
    assert down.dtype == np.float32 and down.size == 16000
    spectrum = np.abs(np.fft.rfft(down))
    assert abs(np.argmax(spectrum) * 16000 / down.size - 440) <= 1
    assert resample(_tone(8000, 0.5), 8000, 16000).size == 8000
    assert resample(clip, 44100, 44100) is clip


def test_what_is_not_a_usable_wav_is_refused_by_name_with_what_to_do(tmp_path, monkeypatch):
    import hfexport.samples as samples

    data = struct.pack("<4f", 0.0, 0.1, -0.1, 0.0)
    fmt = struct.pack("<HHIIHH", 3, 1, 16000, 64000, 4, 32)  # WAVE_FORMAT_IEEE_FLOAT
    floats = tmp_path / "float.wav"
    floats.write_bytes(b"RIFF" + struct.pack("<I", 36 + len(data)) + b"WAVEfmt " + struct.pack("<I", 16) + fmt
                       + b"data" + struct.pack("<I", len(data)) + data)
    mp3 = tmp_path / "song.wav"
    mp3.write_bytes(b"ID3\x03\x00" + bytes(100))
    silent = _wav(tmp_path / "silent.wav", np.zeros((0, 1), np.float32))
    cases = [
        (floats, "sample audio float.wav: the WAV file cannot be decoded (32-bit float WAV; save it as 16-bit PCM WAV)"),
        (mp3, "sample audio song.wav: not a WAV file"),
        (silent, "sample audio silent.wav: the WAV file holds no audio frames"),
    ]
    for path, expected in cases:
        with pytest.raises(SampleError) as error:
            read_sample(path, "audio")
        assert str(error.value).startswith(expected), str(error.value)
    long = _wav(tmp_path / "long.wav", _tone(8000, 2.0), rate=8000)
    monkeypatch.setattr(samples, "MAX_AUDIO_SECONDS", 1.0)
    with pytest.raises(SampleError, match=r"long.wav: 2.0 s is over the 1 s limit"):
        read_sample(long, "audio")


# ── What a processor takes ───────────────────────────────────────────────────


def test_the_kinds_a_processor_takes_are_read_from_its_saved_files(tmp_path, tiny_llava):
    from transformers import CLIPImageProcessor, WhisperFeatureExtractor

    WhisperFeatureExtractor(feature_size=80).save_pretrained(tmp_path / "whisper")
    CLIPImageProcessor().save_pretrained(tmp_path / "clip")

    def files(folder: Path) -> list:
        return [json.loads((folder / name).read_text()) if (folder / name).is_file() else None
                for name in ("processor_config.json", "preprocessor_config.json")]

    assert processor_kinds(files(tiny_llava)) == ["image"]  # LlavaProcessor: its image processor, nested
    assert processor_kinds(files(tmp_path / "whisper")) == ["audio"]
    assert processor_kinds(files(tmp_path / "clip")) == ["image"]
    assert processor_kinds(files(EXAMPLES / "tiny-bert")) == []  # a tokenizer only
    assert processor_kinds([{"video_processor": {"video_processor_type": "X", "image_mean": [0.5]}}]) == []
    assert processor_kinds([{"feature_extractor": {"sampling_rate": 16000}, "image_processor": {
        "image_processor_type": "Y"}}]) == ["image", "audio"]


# ── Sample inputs and jobs ───────────────────────────────────────────────────


def test_the_given_image_stands_in_every_synthesized_image_of_the_recipe(tmp_path, llava, tiny_llava):
    from hfexport.inputs import build_sample_inputs
    from hfexport.recipe.loading import load_recipe

    model, processor = llava
    recipe = load_recipe(tiny_llava)
    sample = read_sample(_png(tmp_path / "photo.png", (70, 50)), "image")
    inputs = build_sample_inputs(recipe, processor, model.config, recipe.task, "forward", {"image": sample})
    expected = processor.image_processor(images=[sample.image()] * 2, return_tensors="pt")["pixel_values"]
    assert inputs["pixel_values"].shape[0] == 2 and (inputs["pixel_values"] == expected).all()
    synthesized = build_sample_inputs(recipe, processor, model.config, recipe.task, "forward")
    assert not (synthesized["pixel_values"] == expected).all()
    text_only = type(recipe)({**recipe.data, "sample_inputs": {"text": ["<image> hello", "<image> world"]}})
    with pytest.raises(PlanError, match=r"sample_inputs.images: .* photo.png has no place"):
        build_sample_inputs(text_only, processor, model.config, recipe.task, "forward", {"image": sample})


def test_a_job_on_a_speech_model_is_traced_and_verified_on_the_given_clip(tmp_path, session_dir):
    """Tiny Whisper, a 44.1 kHz stereo clip: resampled to the extractor's 16 kHz, traced, verified; the report names
    the clip by its name and what it is, and its Markdown says the export was traced on it."""
    from hfexport.job.run import run_job
    from hfexport.report.markdown import report_markdown
    from hfexport.testing.models import make_model

    model = session_dir / "tiny-whisper-samples"
    if not (model / "config.json").is_file():
        make_model("tiny-whisper", model)
    clip = _wav(tmp_path / "uploads" / "hello.wav", np.stack([_tone(44100, 1.2), _tone(44100, 1.2, 330)], 1),
                rate=44100)
    steps = []
    report = run_job(model, tmp_path / "out", targets=["dynamo-forward"], sample_files={"audio": clip},
                     latency=False, progress=steps.append)
    target = report.targets["dynamo-forward"]
    assert target.status == "ok" and target.verification["passed"], target.error
    assert target.sample_files == [{"kind": "audio", "name": "hello.wav", "bytes": clip.stat().st_size,
                                    "sha256": target.sample_files[0]["sha256"], "seconds": 1.2,
                                    "sampling_rate": 44100, "channels": 2}]
    assert "cache" not in {step.step for step in steps}  # an earlier export on other samples is no hit
    written = (tmp_path / "out" / "dynamo-forward" / "export_report.json").read_text()
    assert "hello.wav" in written and str(tmp_path / "uploads") not in written
    markdown = report_markdown(report)
    assert "**Sample input:** the given audio `hello.wav` · 1.20 s · 44100 Hz · stereo" in markdown, markdown


def test_a_bad_sample_or_one_the_recipe_has_no_place_for_is_refused_before_anything_is_written(tmp_path, cli):
    from hfexport.job.run import run_job

    bad = tmp_path / "scan.png"
    bad.write_text("no pixels here")
    result = cli("export", str(EXAMPLES / "tiny-bert"), "--sample-image", str(bad), "-o", str(tmp_path / "out"))
    assert result.returncode == 1, result.stderr
    assert result.stderr.strip().splitlines()[-1].startswith("error: sample image scan.png: not an image")
    assert "Traceback" not in result.stderr and not (tmp_path / "out").exists()
    image = _png(tmp_path / "photo.png")
    with pytest.raises(PlanError, match=r"sample_inputs.images: the recipe's sample inputs hold no images, so the "
                                        r"sample image photo.png has no place"):
        run_job(EXAMPLES / "tiny-bert", tmp_path / "out2", sample_files={"image": image})
    assert not (tmp_path / "out2").exists()


def test_the_space_stages_the_upload_in_the_jobs_folder_and_reproduces_the_job_with_its_name(tmp_path):
    from hfexport.surfaces import space as logic

    upload = _png(tmp_path / "gradio-cache" / "abc" / "dog.png")
    sample = logic.check_sample(str(upload), "image")
    samples = {"image": {"path": str(upload), "describe": sample.describe()}}
    job = tmp_path / "session" / "job1"
    staged = logic.stage_samples(samples, job)
    assert staged == {"image": str(job / "samples" / "dog.png")} and Path(staged["image"]).read_bytes() == \
        upload.read_bytes()
    request = logic.JobRequest(model="user/m", output=job / "out", targets=["onnx"], sample_files=staged)
    assert request.command == "hfexport export user/m --target onnx --sample-image dog.png -o out"
    assert logic.sample_markdown(samples).startswith("✓ Convert traces and verifies the export on your sample image "
                                                     "`dog.png` · 40 × 30 px")
    state = {"model": "user/m", "recipe_source": "repo", "repo_recipe": "{}", "loaded_text": "x", "samples": samples}
    settings = logic.SpaceSettings(workdir=tmp_path, jobs_image="img")
    assert "not your sample file" in logic.jobs_blocker(state, "tok", settings, "x")
    upload.unlink()  # gone from Gradio's cache since it was checked: Convert says so instead of running without it
    with pytest.raises(SampleError, match="sample image dog.png: no such file"):
        logic.stage_samples(samples, tmp_path / "session" / "job2")
