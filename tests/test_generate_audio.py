"""Generation from audio prompts: Qwen3-ASR and the Qwen2.5-Omni thinker, whose prefill encodes its audio itself.
hfexport traces the engine's audio encoder again on one clip, merges its (projected) features into the prompt at the
config's audio token (`embed`), and `generate` computes each clip's encoder inputs with the model's own code
(docs/generation.md)."""

import numpy as np
import pytest
import torch

from hfexport.testing.models import QWEN2_5_OMNI_TOKENS, make_model

RATE = 16000
PROMPTS = {
    "tiny-qwen3-asr": "<|audio_start|><|audio_pad|><|audio_end|>",
    "tiny-qwen2.5-omni": QWEN2_5_OMNI_TOKENS["audio_bos_token"] + QWEN2_5_OMNI_TOKENS["audio_token"]
    + QWEN2_5_OMNI_TOKENS["audio_eos_token"],
}


def _clips(seed: int, count: int, seconds: float) -> list:
    """`count` clips the export never saw: a tone at a seeded pitch plus seeded noise."""
    rng = np.random.default_rng(seed)
    time = np.arange(int(RATE * seconds)) / RATE
    return [(0.3 * np.sin(2 * np.pi * rng.uniform(150, 900) * time) + 0.02 * rng.standard_normal(time.size))
            .astype("float32") for _ in range(count)]


def _inputs(folder, name: str, texts: list[str], clips: list) -> dict:
    from hfexport.models import load_processor

    processor = load_processor(folder)
    processor.tokenizer.padding_side = "left"
    return dict(processor(text=[f"{PROMPTS[name]} {text}" for text in texts], audio=clips, sampling_rate=RATE,
                          return_tensors="pt", padding=True))


def _model(folder, name: str):
    from transformers import AutoModelForImageTextToText, AutoModelForSpeechSeq2Seq

    loader = AutoModelForSpeechSeq2Seq if name == "tiny-qwen3-asr" else AutoModelForImageTextToText
    return loader.from_pretrained(folder).eval()


@pytest.mark.slow
@pytest.mark.parametrize("export_format", ["onnx", "openvino"])
@pytest.mark.parametrize("name", ["tiny-qwen3-asr", "tiny-qwen2.5-omni"])
def test_audio_prompts_generate_token_for_token(session_dir, name, export_format):
    """The job's gate passes (every probe, greedy generation token for token), and the saved files give
    `model.generate`'s tokens on a left-padded batch of new clips (about 3 min per export at load 10 on 2 cores)."""
    from hfexport import ExportedModel
    from hfexport.generate.vision_language import encoder_features
    from hfexport.job.run import run_job

    folder = make_model(name, session_dir / f"audio-{name}")
    target = f"{export_format}-generation"
    output = session_dir / f"audio-{name}-{target}"
    checked = run_job(folder, output, targets=[target], latency=False).targets[target]
    assert checked.status == "ok" and checked.verification["passed"], checked.verification["failures"]
    assert checked.verification["generation"]["token_agreement"] == 1.0
    exported = ExportedModel.from_pretrained(output / target)
    model = _model(folder, name)
    seconds = 1.2 if name == "tiny-qwen3-asr" else 0.8  # one attention window: 8 s (Qwen3-ASR), 1 s (Omni)
    inputs = _inputs(folder, name, ["What is said?", "Transcribe the audio, please"], _clips(3, 2, seconds))
    with torch.no_grad():
        expected = model.generate(**inputs, max_new_tokens=8, do_sample=False)
    assert torch.equal(exported.generate(**inputs, max_new_tokens=8), expected)
    # clips of three attention windows (and of two, beside them): the one-window encoder runs once per window
    seconds = (17.3, 12.0) if name == "tiny-qwen3-asr" else (2.37, 1.5)
    longer = _inputs(folder, name, ["What is said?", "Transcribe the audio, please"],
                     _clips(4, 1, seconds[0]) + _clips(5, 1, seconds[1]))
    with torch.no_grad():
        expected = model.generate(**longer, max_new_tokens=8, do_sample=False)
        whole = model.get_audio_features(**_audio(model, longer)).pooler_output
    assert torch.equal(exported.generate(**longer, max_new_tokens=8), expected)
    if export_format == "onnx":  # the features too: the windows' concatenated, against the model on whole clips
        features = encoder_features(exported, "audio", longer)
        assert features.shape == whole.shape
        assert float((features - whole).abs().max()) <= 1e-5  # measured: 9.3e-9 (Qwen3-ASR), 8.9e-8 (Omni)


def _audio(model, inputs: dict) -> dict:
    from hfexport.preparers import encoder_input_names

    return {name: inputs[name] for name in encoder_input_names(model, "audio") if inputs.get(name) is not None}


@pytest.mark.parametrize("name, seconds, frames, windows", [
    ("tiny-qwen3-asr", 17.3, 800, 3),  # 1730 valid mel frames, padded to 1800: windows of 800, 800, 200
    ("tiny-qwen2.5-omni", 2.37, 100, 3),  # 237 valid frames of 3000 (the mask): windows of 100, 100, 37
])
def test_a_clip_cut_into_its_attention_windows_gives_the_whole_clips_features(session_dir, name, seconds, frames,
                                                                               windows):
    """The window split `generate` runs the one-window encoder on (`hfexport.preparers.clip_windows`, windows of
    `attention_window_frames` from the encoder's `n_window` / `n_window_infer`): the model's own
    `get_audio_features`, once per window, the outputs concatenated, is the model on the whole clip (eager)."""
    from hfexport.plan.vision_language import WINDOWS_ATOL
    from hfexport.preparers import attention_window_frames, clip_windows

    folder = make_model(name, session_dir / f"audio-{name}")
    model = _model(folder, name)
    clip = _audio(model, _inputs(folder, name, ["What is said?"], _clips(7, 1, seconds)))
    assert attention_window_frames(model.get_encoder(modality="audio")) == frames
    parts = clip_windows(clip, frames)
    assert len(parts) == windows
    assert all(part["input_features"].shape[-1] <= frames for part in parts)
    with torch.no_grad():
        whole = model.get_audio_features(**clip).pooler_output
        joined = torch.cat([model.get_audio_features(**part).pooler_output for part in parts])
    assert joined.shape == whole.shape
    assert float((joined - whole).abs().max()) <= WINDOWS_ATOL  # measured: 0 (Qwen3-ASR), 7.5e-8 (Omni)
    assert clip_windows(_audio(model, _inputs(folder, name, ["hi"], _clips(7, 1, 0.5))), frames)[0]["input_features"] \
        .shape[-1] > 0  # a clip of one window is passed whole
    assert clip_windows(clip, None) == [clip]


def test_a_clip_whose_frame_mask_is_not_right_padded_is_not_cut():
    """The model chunks the frames it keeps: windows cut on a left-padded axis would not be its windows."""
    from hfexport.preparers import clip_windows

    clip = {"input_features": torch.zeros(1, 4, 300), "input_features_mask": torch.cat(
        [torch.zeros(1, 50, dtype=torch.long), torch.ones(1, 250, dtype=torch.long)], dim=1)}
    with pytest.raises(ValueError, match="not right-padded"):
        clip_windows(clip, 100)
    clip["input_features_mask"] = clip["input_features_mask"].flip(-1)
    assert [part["input_features_mask"].shape[-1] for part in clip_windows(clip, 100)] == [100, 100, 100]


def test_a_window_of_another_window_count_than_the_traced_one_is_refused():
    """`generate` feeds the encoder one window at a time; an encoder traced on several windows (an export whose
    windows hfexport did not cut) computes that many only, so a window split otherwise is refused, not computed
    wrong."""
    from hfexport.errors import GenerationError
    from hfexport.generate.vision_language import _check_windows

    traced = {"cu_seqlens": {"shape": [2], "dtype": "int32"}}
    _check_windows("audio_encoder", traced, {"cu_seqlens": torch.tensor([0, 50], dtype=torch.int32)})
    with pytest.raises(GenerationError, match=r"traced on a clip of 1 attention window\(s\) and computes that many "
                                              r"only; this clip has 2"):
        _check_windows("audio_encoder", traced, {"cu_seqlens": torch.tensor([0, 50, 75], dtype=torch.int32)})
