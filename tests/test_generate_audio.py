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
    from hfexport.errors import GenerationError
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
    if name == "tiny-qwen2.5-omni":  # a 1.5 s clip is two of its encoder's windows: refused, not computed wrong
        longer = _inputs(folder, name, ["What is said?"], _clips(4, 1, 1.5))
        with pytest.raises(GenerationError, match=r"traced on a clip of 1 attention window\(s\) and computes that "
                                                  r"many only; this clip has 2"):
            exported.generate(**longer, max_new_tokens=2)
