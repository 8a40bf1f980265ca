"""State-space generation where the prefill cannot take a dynamic length: Mamba on OpenVINO and ExecuTorch.

There transformers 5.23's scan stays a loop unrolled at the sample's length (hfexport.workarounds.transformers_models), so hfexport
exports the decode alone and `generate` runs the prompt through it one token at a time from a zero state, zeroing a
left-padded row's state while it is padding, as Mamba's masked prefill leaves it. The default run exports tiny Mamba
to OpenVINO once per session (the decode only: ~20 s); ExecuTorch is the slow test at the end (and a matrix cell).
"""

from __future__ import annotations

import pytest
import torch
from hfexport.testing.models import make_model

MAX_NEW = 10
# Of different lengths (the batch is left-padded), none of the sample's 27 tokens, one over it.
PROMPTS = ["The capital of France is", "Hi",
           "The quick brown fox jumps over the lazy dog and then runs far away into the old dark forest again"]


@pytest.fixture(scope="session")
def tiny_mamba(session_dir):
    return make_model("tiny-mamba", session_dir / "tiny-mamba")


@pytest.fixture(scope="session")
def mamba_openvino_job(session_dir, tiny_mamba):
    """tiny-mamba's `openvino-generation` target, exported and verified by the job: (output folder, JobReport)."""
    from hfexport.job.run import run_job

    output = session_dir / "exported-mamba-openvino"
    return output, run_job(tiny_mamba, output, targets=["openvino-generation"])


@pytest.fixture(scope="module")
def mamba(tiny_mamba):
    from transformers import AutoModelForCausalLM, AutoTokenizer

    model = AutoModelForCausalLM.from_pretrained(tiny_mamba).eval()
    return model, AutoTokenizer.from_pretrained(tiny_mamba, padding_side="left")


@pytest.fixture(scope="module")
def exported(mamba_openvino_job):
    from hfexport import ExportedModel

    output, report = mamba_openvino_job
    target = report.targets["openvino-generation"]
    assert target.status == "ok", target.error
    return ExportedModel.from_pretrained(output / "openvino-generation", precision="f32", device="cpu")


def _reference(model, inputs, **kwargs):
    with torch.no_grad():
        return model.generate(**inputs, do_sample=False, max_new_tokens=MAX_NEW, **kwargs)


def _assert_equal(got, expected):
    assert got.shape == expected.shape and torch.equal(got, expected), f"\nexpected {expected.tolist()}\ngot {got.tolist()}"


def test_the_export_is_the_decode_alone_with_its_state_in_inputs_and_outputs(exported):
    assert list(exported.components) == ["decode"]
    assert set(exported.runners["decode"].metadata.kwargs) == {"input_ids", "attention_mask", "cache_params"}
    assert not list(exported.runners["decode"].request.query_state())  # stateless: generate resets padded rows


def test_a_left_padded_batch_matches_model_generate(exported, mamba):
    model, tokenizer = mamba
    inputs = dict(tokenizer(PROMPTS, return_tensors="pt", padding=True))
    assert (inputs["attention_mask"] == 0).any() and inputs["input_ids"].shape[1] != 27
    expected = _reference(model, inputs)
    new = expected[:, inputs["input_ids"].shape[1]:]
    assert len({tuple(row.tolist()) for row in new}) == len(PROMPTS)  # the rows differ: padding and state matter
    _assert_equal(exported.generate(inputs["input_ids"], inputs["attention_mask"], max_new_tokens=MAX_NEW), expected)


def test_single_prompts_of_any_length_match_model_generate(exported, mamba):
    model, tokenizer = mamba
    for prompt in [*PROMPTS, "a"]:
        inputs = dict(tokenizer([prompt], return_tensors="pt"))
        _assert_equal(exported.generate(**inputs, max_new_tokens=MAX_NEW), _reference(model, inputs))


def test_seeded_sampling_matches_model_generate(exported, mamba):
    model, tokenizer = mamba
    inputs = dict(tokenizer(PROMPTS[:2], return_tensors="pt", padding=True))
    torch.manual_seed(3)
    with torch.no_grad():
        expected = model.generate(**inputs, do_sample=True, top_k=20, temperature=0.8, max_new_tokens=MAX_NEW)
    got = exported.generate(inputs["input_ids"], inputs["attention_mask"], do_sample=True, top_k=20, temperature=0.8,
                            max_new_tokens=MAX_NEW, seed=3)
    _assert_equal(got, expected)


def test_right_padding_is_refused(exported, mamba):
    from hfexport.generate import GenerationError

    _, tokenizer = mamba
    inputs = tokenizer(PROMPTS[:2], return_tensors="pt", padding=True)
    with pytest.raises(GenerationError, match="left padding only"):
        exported.generate(inputs["input_ids"], inputs["attention_mask"].flip(1), max_new_tokens=2)


def test_a_stateful_decode_runs_unpadded_prompts_and_refuses_padded_ones(session_dir, tiny_mamba, mamba):
    """A recipe's `stateful: true` keeps the state in the infer request, where generate cannot zero a padded row."""
    import json

    from hfexport import ExportedModel
    from hfexport.generate import GenerationError
    from hfexport.job.run import run_job

    recipe = json.loads((tiny_mamba / "export_config.json").read_text())
    target = recipe["targets"]["openvino-generation"]
    recipe["targets"] = {"ov-stateful": {**target, "options": {**target["options"], "stateful": True}}}
    recipe["default_target"] = "ov-stateful"
    output = session_dir / "exported-mamba-openvino-stateful"
    report = run_job(tiny_mamba, output, targets=["ov-stateful"], recipe=recipe, verify=False)
    assert report.targets["ov-stateful"].status == "ok", report.targets["ov-stateful"].error
    exported = ExportedModel.from_pretrained(output / "ov-stateful", precision="f32", device="cpu")
    assert list(exported.runners["decode"].request.query_state())
    model, tokenizer = mamba
    for prompt in PROMPTS[:2]:
        inputs = dict(tokenizer([prompt], return_tensors="pt"))
        _assert_equal(exported.generate(**inputs, max_new_tokens=MAX_NEW), _reference(model, inputs))
    padded = tokenizer(PROMPTS[:2], return_tensors="pt", padding=True)
    with pytest.raises(GenerationError, match="stateful=True"):
        exported.generate(padded["input_ids"], padded["attention_mask"], max_new_tokens=2)


def test_the_job_checked_the_decode_at_every_probe_batch_and_generation(mamba_openvino_job):
    _, report = mamba_openvino_job
    verification = report.targets["openvino-generation"].verification
    assert verification["passed"], verification["failures"]
    probes = verification["probes"]
    assert {probe["component"] for probe in probes} == {"decode"}
    assert {probe["dims"]["batch"] for probe in probes} == {1, 8} and all(probe["outputs"] for probe in probes)
    generation = verification["generation"]
    assert generation["passed"] and generation["token_agreement"] == 1.0 and generation["prompts"] == 2


@pytest.mark.slow
def test_executorch_decode_generates_as_model_generate(session_dir, tiny_mamba, mamba):
    """The ExecuTorch cell: the decode alone (its `attention_mask` slot traced as None takes no tensor: error 0x12
    before), a left-padded batch token for token, and the job's probes at batch 1 and 8."""
    from hfexport import ExportedModel
    from hfexport.job.run import run_job

    output = session_dir / "exported-mamba-executorch"
    report = run_job(tiny_mamba, output, targets=["executorch-generation"])
    target = report.targets["executorch-generation"]
    assert target.status == "ok" and target.verification["passed"], target.error or target.verification["failures"]
    exported = ExportedModel.from_pretrained(output / "executorch-generation")
    assert list(exported.components) == ["decode"]
    model, tokenizer = mamba
    inputs = dict(tokenizer(PROMPTS, return_tensors="pt", padding=True))
    _assert_equal(exported.generate(inputs["input_ids"], inputs["attention_mask"], max_new_tokens=MAX_NEW),
                  _reference(model, inputs))


@pytest.mark.parametrize("export_format", ["executorch", "openvino"])
def test_a_dynamic_sequence_forward_is_refused_before_tracing_where_the_scan_is_unrolled(tiny_mamba, mamba,
                                                                                         export_format):
    """The matrix's forward cells on these formats used to fail in torch.export after the trace ("Constraints
    violated (seq)! ... Suggested fixes: seq = 27"); the plan now refuses them first, naming the field and the cause,
    and a pinned sequence plans."""
    from hfexport.errors import PlanError
    from hfexport.models import load_processor
    from hfexport.plan import build_plan
    from hfexport.recipe.loading import load_recipe

    import json

    model, processor = mamba[0], load_processor(tiny_mamba)
    document = json.loads((tiny_mamba / "export_config.json").read_text(encoding="utf-8"))
    with pytest.raises(PlanError) as refused:
        build_plan(load_recipe(document), f"{export_format}-forward", model, processor=processor)
    message = str(refused.value)
    assert message.startswith(f"targets.{export_format}-forward.dynamic_shapes.input_ids.1: a dynamic sequence (seq")
    assert "Constraints violated (seq)!" in message and "Python loop over the sequence" in message
    assert build_plan(load_recipe(document), "dynamo-forward", model, processor=processor)  # takes the scan
    document["targets"][f"{export_format}-forward"]["dynamic_shapes"]["input_ids"]["1"] = "static"
    pinned = build_plan(load_recipe(document), f"{export_format}-forward", model, processor=processor)
    assert pinned.components["model"].dynamic_axes["input_ids"]["1"] == "static"
