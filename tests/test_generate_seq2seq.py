"""Encoder-decoder generation over exported graphs: the `encoder` component once, then prefill/decode with the
self- and cross-attention cache, token for token what `model.generate` returns (batched, padded as the tokenizer
pads, EOS per row), and the job's generation check on the same export.

The default run exports tiny mBART (whose two sample prompts generate different tokens: a mask or cache error
shows) to ONNX once per session; every other family × format is a compatibility-matrix cell (tests/test_matrix.py).
"""

from __future__ import annotations

import pytest
import torch

from hfexport.testing.models import make_model

MAX_NEW = 10
PROMPTS = ["The capital of France is", "The quick brown fox jumps over the lazy"]


@pytest.fixture(scope="session")
def tiny_mbart(session_dir):
    return make_model("tiny-mbart", session_dir / "tiny-mbart")


@pytest.fixture(scope="session")
def mbart_job(session_dir, tiny_mbart):
    """tiny-mbart's `onnx-generation` target, exported and verified by the job: (output folder, JobReport)."""
    from hfexport.job.run import run_job

    output = session_dir / "exported-mbart"
    return output, run_job(tiny_mbart, output, targets=["onnx-generation"])


@pytest.fixture(scope="module")
def mbart(tiny_mbart):
    from transformers import AutoModelForSeq2SeqLM, AutoTokenizer

    return AutoModelForSeq2SeqLM.from_pretrained(tiny_mbart).eval(), AutoTokenizer.from_pretrained(tiny_mbart)


@pytest.fixture(scope="module")
def exported(mbart_job):
    from hfexport import ExportedModel

    output, report = mbart_job
    assert report.targets["onnx-generation"].status == "ok", report.targets["onnx-generation"].error
    return ExportedModel.from_pretrained(output / "onnx-generation", precision="f32")


def _reference(model, inputs, **kwargs):
    with torch.no_grad():
        return model.generate(**inputs, do_sample=False, max_new_tokens=MAX_NEW, **kwargs)


def _assert_equal(got, expected):
    assert got.shape == expected.shape and torch.equal(got, expected), f"\nexpected {expected.tolist()}\ngot {got.tolist()}"


def test_the_export_has_an_encoder_beside_prefill_and_decode(exported):
    assert list(exported.components) == ["encoder", "prefill", "decode"]
    assert set(exported.runners["encoder"].metadata.kwargs) == {"input_ids", "attention_mask"}


def test_padded_batch_matches_model_generate(exported, mbart):
    model, tokenizer = mbart
    inputs = dict(tokenizer(PROMPTS, return_tensors="pt", padding=True))
    assert (inputs["attention_mask"] == 0).any()
    expected = _reference(model, inputs)
    assert not torch.equal(expected[0], expected[1])  # the rows differ: padding and the per-row cache matter
    _assert_equal(exported.generate(inputs["input_ids"], inputs["attention_mask"], max_new_tokens=MAX_NEW), expected)


def test_single_prompts_match_model_generate(exported, mbart):
    model, tokenizer = mbart
    for prompt in PROMPTS:
        inputs = dict(tokenizer([prompt], return_tensors="pt"))
        _assert_equal(exported.generate(**inputs, max_new_tokens=MAX_NEW), _reference(model, inputs))


def test_eos_per_row(exported, mbart):
    model, tokenizer = mbart
    inputs = dict(tokenizer(PROMPTS, return_tensors="pt", padding=True))
    free = _reference(model, inputs)
    # An EOS that one row emits earlier than the other: that row then gets pad tokens, the other runs on.
    row0, row1 = free[0, 1:].tolist(), free[1, 1:].tolist()
    eos = next(token for index, token in enumerate(row0) if token not in row1[: index + 1])
    expected = _reference(model, inputs, eos_token_id=eos)
    assert (expected[0] == model.generation_config.pad_token_id).any()
    got = exported.generate(inputs["input_ids"], inputs["attention_mask"], max_new_tokens=MAX_NEW, eos_token_id=eos)
    _assert_equal(got, expected)


def test_seeded_sampling_matches_model_generate(exported, mbart):
    model, tokenizer = mbart
    inputs = dict(tokenizer(PROMPTS, return_tensors="pt", padding=True))
    torch.manual_seed(7)
    with torch.no_grad():
        expected = model.generate(**inputs, do_sample=True, top_k=20, temperature=0.8, max_new_tokens=MAX_NEW)
    got = exported.generate(inputs["input_ids"], inputs["attention_mask"], do_sample=True, top_k=20, temperature=0.8,
                            max_new_tokens=MAX_NEW, seed=7)
    _assert_equal(got, expected)


def test_the_job_checked_generation_token_for_token(mbart_job):
    _, report = mbart_job
    target = report.targets["onnx-generation"]
    generation = target.verification["generation"]
    assert generation["passed"] and generation["token_agreement"] == 1.0, generation
    assert generation["prompts"] == 2


def test_an_encoder_decoder_export_without_its_encoder_is_refused(mbart_job):
    from hfexport import ExportedModel
    from hfexport.generate import GenerationError

    output, _ = mbart_job
    broken = ExportedModel.from_pretrained(output / "onnx-generation", precision="f32")
    del broken.components["encoder"]
    with pytest.raises(GenerationError, match="no `encoder` component"):
        broken.generate(torch.tensor([[5, 6, 7]]), max_new_tokens=2)


def test_init_proposes_a_passing_generation_recipe_for_t5(session_dir):
    """`hfexport init` on a T5 (no recipe) writes a generation target that exported and generated token for token
    (it used to exit 1: the prefill took decoder_input_ids and encoder_outputs, which generate did not feed)."""
    from hfexport.job.init import init_recipe

    folder = make_model("tiny-t5", session_dir / "tiny-t5-init")
    (folder / "export_config.json").unlink()  # init is for models without a recipe
    result = init_recipe(folder, ["onnx"], output=session_dir / "t5-init-recipe.json")
    assert result.passed == ["onnx-generation"], result.failed
    assert result.recipe["targets"]["onnx-generation"]["mode"] == "generation"
    generation = result.report.targets["onnx-generation"].verification["generation"]
    assert generation["passed"] and generation["token_agreement"] == 1.0


@pytest.mark.slow
@pytest.mark.parametrize("export_format", ["onnx", "executorch"])
def test_whisper_generates_from_audio_as_model_generate(session_dir, export_format):
    """Whisper from audio: the feature extractor's `input_features`, the decoder starting from the generation
    config's `decoder_start_token_id`; `generate` returns the new tokens only, as Whisper's own generate does.
    Batch 2 (two clips); ExecuTorch as ONNX (the matrix's note of a missing `input_ids` predated the check's
    `input_features`)."""
    import numpy as np
    from transformers import AutoFeatureExtractor, WhisperForConditionalGeneration

    from hfexport import ExportedModel
    from hfexport.job.run import run_job

    folder = session_dir / "tiny-whisper"
    if not (folder / "export_config.json").is_file():
        make_model("tiny-whisper", folder)
    output = session_dir / f"exported-whisper-{export_format}"
    target = f"{export_format}-generation"
    report = run_job(folder, output, targets=[target])
    assert report.targets[target].status == "ok", report.targets[target].error
    assert report.targets[target].verification["generation"]["prompts"] == 2
    model = WhisperForConditionalGeneration.from_pretrained(folder).eval()
    extractor = AutoFeatureExtractor.from_pretrained(folder)
    exported = ExportedModel.from_pretrained(output / target, precision="f32")
    assert set(exported.runners["encoder"].metadata.kwargs) == {"input_features"}
    seconds = np.arange(int(16000 * 1.5)) / 16000
    audio = [np.sin(2 * np.pi * 440 * seconds).astype(np.float32),
             np.random.default_rng(0).standard_normal(16000).astype(np.float32) * 0.1]
    features = extractor(audio, sampling_rate=16000, return_tensors="pt").input_features
    with torch.no_grad():
        expected = model.generate(input_features=features, max_new_tokens=MAX_NEW)
    _assert_equal(exported.generate(input_features=features, max_new_tokens=MAX_NEW), expected)
