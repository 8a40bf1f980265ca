"""Encoder-decoder generation over exported graphs: the `encoder` component once, then prefill/decode with the
self- and cross-attention cache, token for token what `model.generate` returns (batched, padded as the tokenizer
pads, EOS per row), and the job's generation check on the same export.

The default run exports tiny mBART (whose two sample prompts generate different tokens: a mask or cache error
shows) to ONNX and to OpenVINO once per session; every other family × format is a compatibility-matrix cell
(tests/test_matrix.py).
"""

from __future__ import annotations

import pytest
import torch

from hfexport.testing.models import make_model


MAX_NEW = 10
PROMPTS = ["The capital of France is", "The quick brown fox jumps over the lazy"]


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
    from hfexport.job.propose import init_recipe

    folder = make_model("tiny-t5", session_dir / "tiny-t5-init")
    (folder / "export_config.json").unlink()  # init is for models without a recipe
    result = init_recipe(folder, ["onnx"], output=session_dir / "t5-init-recipe.json")
    assert result.passed == ["onnx-generation"], result.failed
    assert result.recipe["targets"]["onnx-generation"]["mode"] == "generation"
    generation = result.report.targets["onnx-generation"].verification["generation"]
    assert generation["passed"] and generation["token_agreement"] == 1.0


@pytest.fixture(scope="session")
def mbart_openvino_job(session_dir, tiny_mbart, cli):
    """tiny-mbart's `openvino-generation` target, exported and verified by `hfexport export` in a subprocess:
    (target folder, the target's report). A subprocess, because the OpenVINO 2026.4.1 failure this guards against
    kills the process (heap corruption), which would take the whole test session down with it."""
    import json

    output = session_dir / "exported-mbart-openvino"
    result = cli("export", str(tiny_mbart), "--target", "openvino-generation", "-o", str(output), "--json", "--quiet",
                 "--no-preflight")
    assert result.returncode == 0, f"exit {result.returncode}\n{result.stdout[-2000:]}\n{result.stderr[-3000:]}"
    return output / "openvino-generation", json.loads(result.stdout)["targets"]["openvino-generation"]


@pytest.fixture(scope="module")
def exported_openvino(mbart_openvino_job):
    from hfexport import ExportedModel

    folder, report = mbart_openvino_job
    assert report["status"] == "ok", report.get("error")
    return ExportedModel.from_pretrained(folder, precision="f32", device="cpu")


def test_openvino_job_verified_every_probe_and_generation(mbart_openvino_job):
    """The job's own check of the OpenVINO export: every prefill/decode probe ran (none skipped as internal state)
    and greedy generation on the padded sample prompts matched model.generate token for token. Before, the process
    died in the third probe (OpenVINO 2026.4.1 writing through a freed shared input, see `hfexport.formats.openvino.workarounds`)."""
    _, report = mbart_openvino_job
    verification = report["verification"]
    probes = verification["probes"]
    assert {probe["component"] for probe in probes} >= {"prefill", "decode"}
    assert all(probe["passed"] and not probe.get("skipped") for probe in probes), probes
    generation = verification["generation"]
    assert generation["passed"] and generation["token_agreement"] == 1.0 and generation["prompts"] == 2, generation


def test_openvino_decode_keeps_the_caches_in_its_inputs(exported_openvino):
    """hfexport exports an encoder-decoder's OpenVINO decode stateless: transformers 5.23's stateful transformation
    pins the cross-attention state to the sample's encoder length."""
    decode = exported_openvino.runners["decode"]
    assert not list(decode.request.query_state())
    names = {name for port in decode.compiled_model.inputs for name in port.get_names()}
    assert any(".cross_attention_cache." in name for name in names), names


# OpenVINO alone, no hfexport: a program that returns its input `x` (through a no-op ConvertLike, as the engine's
# seq2seq prefill returns `encoder_last_hidden_state`) beside a computed output, run at shapes that change, each
# call's inputs freed after it. argv[1]: "share" (share_inputs=True) or "copy".
PASS_THROUGH_PROGRAM = """
import sys
import numpy as np
import openvino as ov
import openvino.opset13 as ops

x = ops.parameter(ov.PartialShape([-1, -1, 16]), np.float32, name="x")
m = ops.parameter(ov.PartialShape([-1, -1]), np.int64, name="m")
x.output(0).get_tensor().set_names({"x"})
m.output(0).get_tensor().set_names({"m"})
scaled = ops.multiply(x, ops.unsqueeze(ops.convert(m, np.float32), ops.constant(np.int64(2))))
computed = ops.result(ops.reduce_sum(scaled, ops.constant(np.int64(1)), False))
computed.output(0).get_tensor().set_names({"y"})
returned = ops.result(ops.convert_like(x, x))
returned.output(0).get_tensor().set_names({"x_out"})
model = ov.Model([computed, returned], [x, m], "pass_through")
if sys.argv[1] == "build":
    ov.save_model(model, sys.argv[2])
    sys.exit(0)
request = ov.Core().compile_model(model, "CPU", {"INFERENCE_PRECISION_HINT": "f32"}).create_infer_request()
rng = np.random.default_rng(0)
for batch, seq in [(1, 5), (2, 9), (3, 4), (2, 27), (1, 3), (4, 11)] * 5:
    feed = {"x": rng.standard_normal((batch, seq, 16), dtype=np.float32), "m": np.ones((batch, seq), np.int64)}
    out = request.infer(feed, share_inputs=sys.argv[1] == "share")
    assert out["x_out"].shape == (batch, seq, 16)
    del feed, out
    reuse = [np.ones(k * 37) for k in range(50)]  # the freed inputs' heap, handed out again
print("survived")
"""


def _run_pass_through(mode: str):
    import subprocess
    import sys

    return subprocess.run([sys.executable, "-c", PASS_THROUGH_PROGRAM, mode], capture_output=True, text=True,
                          timeout=300, check=False)


def test_openvino_corrupts_the_heap_through_a_returned_shared_input():
    """Why `hfexport.formats.openvino.workarounds` copies: OpenVINO 2026.4.1 keeps an output that is an input bound to the caller's
    shared buffer, and writes through it at the next shape once the caller freed it (glibc aborts or the process gets
    SIGSEGV; 15 of 15 runs here). With copies (`share_inputs=False`) every run survives. When the shared runs survive
    too, OpenVINO has fixed it: the module's copies can go."""
    shared = [_run_pass_through("share") for _ in range(3)]
    assert any(run.returncode < 0 for run in shared), [(run.returncode, run.stdout, run.stderr[-500:]) for run in shared]
    copied = _run_pass_through("copy")
    assert copied.returncode == 0 and "survived" in copied.stdout, copied.stderr[-2000:]


def test_only_openvino_programs_that_return_an_input_get_copying_runners(tmp_path):
    """The check reads the compiled program: the pass-through program is detected and its runner always copies;
    without its returned input (every output computed) it keeps the engine's zero-copy runner, as does a runner that
    is not OpenVINO's."""
    import subprocess
    import sys

    import openvino as ov
    from torch.utils._pytree import tree_flatten, treespec_dumps
    from transformers.exporters import ExportMetadata

    from hfexport.engine import runner_class
    from hfexport.formats.openvino.workarounds import copy_returned_inputs, returns_an_input

    subprocess.run([sys.executable, "-c", PASS_THROUGH_PROGRAM, "build", str(tmp_path / "m.xml")], check=True,
                   timeout=300)
    core = ov.Core()
    computed_only = core.read_model(tmp_path / "m.xml")
    computed_only.remove_result(next(r for r in computed_only.get_results() if "x_out" in r.output(0).get_names()))
    engine_runner = runner_class("openvino")
    metadata = ExportMetadata(out_spec=treespec_dumps(tree_flatten({"y": 0, "x_out": 0})[1]))
    runners = {"returns": engine_runner(core.compile_model(core.read_model(tmp_path / "m.xml"), "CPU"), metadata),
               "computes": engine_runner(core.compile_model(computed_only, "CPU"), metadata), "other": object()}
    assert [returns_an_input(runner) for runner in runners.values()] == [True, False, False]
    before = dict(runners)
    copy_returned_inputs(runners)
    assert type(runners["returns"]) is not engine_runner and isinstance(runners["returns"], engine_runner)
    assert runners["returns"].compiled_model is before["returns"].compiled_model
    assert runners["computes"] is before["computes"] and runners["other"] is before["other"]


# A loaded OpenVINO mBART export called directly, as a user would: `ExportedModel.__call__` on its prefill alone and
# `runners[...]` on the encoder, prefill and decode (both share inputs by default), at encoder lengths and batches
# that change, each call's inputs freed after it; every output against the eager model's. argv: export, model folder.
DIRECT_CALLS_PROGRAM = """
import sys

import numpy as np
import torch

from hfexport.testing.models import make_model
from transformers import AutoModelForSeq2SeqLM, DynamicCache, EncoderDecoderCache

from hfexport import ExportedModel

exported = ExportedModel.from_pretrained(sys.argv[1], precision="f32", device="cpu")
model = AutoModelForSeq2SeqLM.from_pretrained(sys.argv[2]).eval()
prefill_alone = ExportedModel({"model": exported.components["prefill"]}, "openvino").to(
    "cpu", config={"INFERENCE_PRECISION_HINT": "f32"})
start = model.config.decoder_start_token_id
rng = np.random.default_rng(0)
for batch, length in [(1, 5), (2, 9), (3, 4), (2, 27), (1, 3), (4, 11)] * 2:
    input_ids = torch.from_numpy(rng.integers(5, model.config.vocab_size, (batch, length)))
    mask = torch.ones_like(input_ids)
    decoder_ids = torch.tensor([[start, 7, 9]] * batch)
    with torch.no_grad():
        expected = model(input_ids=input_ids, attention_mask=mask, decoder_input_ids=decoder_ids).logits
    encoder_outputs = exported.runners["encoder"](input_ids=input_ids, attention_mask=mask)
    cache = EncoderDecoderCache(DynamicCache(config=model.config), DynamicCache(config=model.config))
    prefill_kwargs = dict(attention_mask=mask, decoder_input_ids=decoder_ids[:, :2], encoder_outputs=encoder_outputs,
                          past_key_values=cache)
    alone = prefill_alone(**prefill_kwargs)
    prefill = exported.runners["prefill"](**prefill_kwargs)
    torch.testing.assert_close(alone.logits, expected[:, :2], atol=1e-4, rtol=1e-4)
    torch.testing.assert_close(prefill.logits, expected[:, :2], atol=1e-4, rtol=1e-4)
    decode = exported.runners["decode"](attention_mask=mask, decoder_input_ids=decoder_ids[:, 2:],
                                        encoder_outputs=encoder_outputs, past_key_values=prefill.past_key_values)
    torch.testing.assert_close(decode.logits, expected[:, 2:], atol=1e-4, rtol=1e-4)
    del input_ids, mask, encoder_outputs, cache, prefill_kwargs, alone, prefill, decode
    reuse = [np.ones(k * 37) for k in range(50)]  # the freed inputs' heap, handed out again
print("survived")
"""


def test_direct_calls_on_an_openvino_encoder_decoder_are_safe_and_right(mbart_openvino_job, tiny_mbart):
    """`ExportedModel(...)` and `exported.runners[...]` called with their default shared inputs, at six shapes in
    turn, on an export whose prefill and decode return inputs: outputs as the eager model's, and the process lives (in
    a subprocess: the failure kills it). Before the copies moved into the loaded runner (they were applied by
    `generate` and the job's probes only), this died with SIGSEGV in 3 of 3 runs."""
    import os
    import subprocess
    import sys
    from pathlib import Path

    folder, report = mbart_openvino_job
    assert report["status"] == "ok", report.get("error")
    library = str(Path(__file__).resolve().parent.parent / "library")
    run = subprocess.run([sys.executable, "-c", DIRECT_CALLS_PROGRAM, str(folder), str(tiny_mbart)],
                         capture_output=True, text=True, timeout=600, check=False,
                         env={**os.environ, "PYTHONPATH": library})
    assert run.returncode == 0 and "survived" in run.stdout, f"exit {run.returncode}\n{run.stderr[-3000:]}"


def test_openvino_encoder_decoder_plans_default_to_stateless(tiny_mbart, mbart):
    """The plan keeps the caches in an encoder-decoder's OpenVINO inputs (`stateful: false`) unless the recipe says
    otherwise (generate then refuses the stateful decode, whose cross-attention state has the sample's length)."""
    import json

    from hfexport.plan import build_plan
    from hfexport.recipe.loading import load_recipe

    model, tokenizer = mbart
    recipe = json.loads((tiny_mbart / "export_config.json").read_text())
    plan = build_plan(load_recipe(recipe), "openvino-generation", model, processor=tokenizer)
    assert {name: component.config.stateful for name, component in plan.components.items()} == \
        {"encoder": False, "prefill": False, "decode": False}
    recipe["targets"]["openvino-generation"].setdefault("options", {})["stateful"] = True
    asked = build_plan(load_recipe(recipe), "openvino-generation", model, processor=tokenizer)
    assert all(component.config.stateful for component in asked.components.values())


def test_openvino_generation_matches_model_generate(exported_openvino, mbart):
    """Batch 2 padded, then each prompt alone (encoder lengths other than the sample's 27 tokens), on one loaded
    export: the same requests run every shape in turn, as a user's would."""
    model, tokenizer = mbart
    inputs = dict(tokenizer(PROMPTS, return_tensors="pt", padding=True))
    assert (inputs["attention_mask"] == 0).any()
    expected = _reference(model, inputs)
    assert not torch.equal(expected[0], expected[1])
    _assert_equal(exported_openvino.generate(inputs["input_ids"], inputs["attention_mask"], max_new_tokens=MAX_NEW),
                  expected)
    for prompt in [*PROMPTS, "Hi"]:
        single = dict(tokenizer([prompt], return_tensors="pt"))
        _assert_equal(exported_openvino.generate(**single, max_new_tokens=MAX_NEW), _reference(model, single))


@pytest.mark.slow
@pytest.mark.parametrize("export_format", ["onnx", "openvino", "executorch"])
def test_whisper_generates_from_audio_as_model_generate(session_dir, export_format):
    """Whisper from audio: the feature extractor's `input_features`, the decoder starting from the generation
    config's `decoder_start_token_id`; `generate` returns the new tokens only, as Whisper's own generate does.
    Batch 2 (two clips); ExecuTorch and OpenVINO as ONNX (the matrix's note of a missing `input_ids` predated the check's
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
