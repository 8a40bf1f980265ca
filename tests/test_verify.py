"""Parity verification as a gate: artifacts reloaded from disk vs the eager model, across the declared ranges.

The exported examples (session fixtures) are verified by the job that exports them; the trap and perturbation
tests export or edit their own copies. Unit tests of probes and metrics run on a plan (nothing traced).
"""

from __future__ import annotations

import json
import shutil
import xml.etree.ElementTree as ElementTree
from pathlib import Path

import pytest
import torch
from hfexport.report.markdown import report_markdown
from hfexport.report.data import JobReport, validate_report

TRAP_RECIPE = {
    "recipe_version": 1,
    "task": "feature-extraction",
    # One sentence, no dynamic_shapes: the engine's dynamic=True leaves every axis to torch.export (Dim.AUTO),
    # which specializes the batch of 1 it was traced with.
    "sample_inputs": {"text": ["The capital of France is Paris."]},
    "targets": {"onnx": {"export_format": "onnx", "options": {"dynamic": True}}},
}


def _target(report: JobReport, name: str):
    target = report.targets[name]
    assert target.verification is not None, f"{name} was not verified"
    return target


def _probe_batches(verification: dict) -> dict[int, bool]:
    return {probe["dims"]["batch"]: probe["passed"] for probe in verification["probes"] if "batch" in probe["dims"]}


# ── the exported examples, verified by their job ─────────────────────────────


def test_explicit_batch_dim_passes_at_batch_1_and_8_on_every_format(exported_bert):
    output, report = exported_bert
    for name in ("onnx", "openvino", "pt2", "pte"):
        target = _target(report, name)
        verification = target.verification
        assert target.status == "ok", (name, target.error)
        assert verification["passed"] and verification["reloaded_from_disk"]
        assert _probe_batches(verification) == {1: True, 5: True, 8: True}, name
        # min, an odd value inside and max of seq [2, 64]
        assert [probe["dims"]["seq"] for probe in verification["probes"]] == [2, 37, 64]
        for probe in verification["probes"]:
            assert set(probe["outputs"]) == {"last_hidden_state", "pooler_output"}
            for metrics in probe["outputs"].values():
                assert metrics["passed"] and metrics["cosine"] > 0.9999 and metrics["max_abs"] < 1e-4
        assert target.timings["verify_s"] > 0 and target.timings["export_s"] > 0
    # the report beside the artifacts holds the same verification
    saved = JobReport.read(output / "onnx")
    assert saved.targets["onnx"].verification["probes"] == report.targets["onnx"].verification["probes"]
    assert "verify_s" in JobReport.read(output).timings


def test_generation_targets_compare_prefill_and_decode_and_greedy_tokens(exported_llama):
    _, report = exported_llama
    target = _target(report, "onnx-generation")  # a single graph (generation.single_graph): the decode alone
    verification = target.verification
    assert target.status == "ok", target.error
    components = {probe["component"] for probe in verification["probes"]}
    # the decode is compared on the prompt (an empty cache, against the eager prefill) and on a step after it
    assert components == {"decode (the prompt, on an empty cache)", "decode"}
    # axes are auto for this target: batch 1 and 8 are probed
    assert sorted({probe["dims"]["batch"] for probe in verification["probes"]}) == [1, 8]
    prompt = [probe for probe in verification["probes"] if probe["component"].startswith("decode (the prompt")]
    assert len(prompt) == 2  # batch 1 and batch 8
    for probe in prompt:
        assert probe["outputs"]["logits"]["top1"] == 1.0
        assert probe["outputs"]["past_key_values"]["leaves"] == 4  # 2 layers x keys/values
    generation = verification["generation"]
    assert generation["passed"] and generation["token_agreement"] == 1.0
    assert generation["max_new_tokens"] == 8 and generation["first_divergence"] is None
    forward = _target(report, "pt2").verification
    assert forward["passed"] and all(probe["outputs"]["logits"]["top1"] == 1.0 for probe in forward["probes"])


def test_report_markdown_has_a_table_per_target(exported_bert, cli):
    output, report = exported_bert
    text = report_markdown(report)
    # one table per target, and one more for a target also checked at a reduced runtime precision (OpenVINO's bf16
    # default on CPUs that have it; absent where the runtime computes at f32)
    tables = sum(1 + ("runtime_check" in target.verification) for target in report.targets.values())
    assert tables >= 4
    assert text.count("| probe | component | output | max abs | max rel | cosine | top-1 | result |") == tables
    assert "| batch=8 seq=64 | model | `last_hidden_state` |" in text
    assert "**Parity: ✅ passed**" in text and "probe cost bound 65,536 input elements" in text
    printed = cli("report", str(output))
    assert printed.returncode == 0, printed.stderr
    assert printed.stdout.strip() == text.strip()


# ── the batch-pinning trap ───────────────────────────────────────────────────


def test_batch_pinning_trap_fails_at_batch_8_with_the_backend_message(tmp_path, tiny_bert, cli):
    recipe = tmp_path / "trap.json"
    recipe.write_text(json.dumps(TRAP_RECIPE))
    output = tmp_path / "out"
    result = cli("export", str(tiny_bert), "--recipe", str(recipe), "-o", str(output))
    assert result.returncode == 1, result.stderr
    report = JobReport.read(output / "onnx")
    target = report.targets["onnx"]
    assert target.status == "failed"
    assert (output / "onnx" / "model.onnx").is_file()  # artifacts stay on disk, marked failed
    verification = target.verification
    assert verification["cost_bound"]["auto_axes"] is True
    batches = _probe_batches(verification)
    assert batches[1] is True and batches[8] is False
    rejected = next(probe for probe in verification["probes"] if probe["dims"]["batch"] == 8)
    # ONNX Runtime's own words: the batch axis was pinned to the sample's 1
    assert "Got invalid dimensions for input: input_ids" in rejected["error"]
    assert "index: 0 Got: 8 Expected: 1" in rejected["error"]
    assert "batch=8" in target.error and "Expected: 1" in target.error
    markdown = cli("report", str(output))
    # ONNX Runtime's error as it raised it (the session runs from the file: hfexport.formats.onnx.file_runner)
    assert "❌ rejected: InvalidArgument: [ONNXRuntimeError] : 2 : INVALID_ARGUMENT : Got invalid dimensions" in markdown.stdout


def test_no_verify_lets_the_trap_through_and_verify_catches_it_later(tmp_path, tiny_bert, cli):
    recipe = dict(TRAP_RECIPE, targets={"pt2": {"export_format": "dynamo", "options": {"dynamic": True}}})
    (tmp_path / "trap.json").write_text(json.dumps(recipe))
    output = tmp_path / "out"
    result = cli("export", str(tiny_bert), "--recipe", str(tmp_path / "trap.json"), "-o", str(output), "--no-verify")
    assert result.returncode == 0, result.stderr
    assert JobReport.read(output / "pt2").targets["pt2"].verification is None

    saved = {path: (path / "export_report.json").read_bytes() for path in (output / "pt2", output)}
    checked = cli("verify", str(output / "pt2"), "--model", str(tiny_bert))
    assert checked.returncode == 1, checked.stderr
    # Terminal text (issue 44): words and aligned columns, no Markdown or HTML; the saved reports left as they were.
    assert "pt2 (torch.export / forward) vs " + str(tiny_bert) in checked.stdout, checked.stdout
    assert "parity: FAILED" in checked.stdout and "rejected: " in checked.stdout, checked.stdout
    assert not any(mark in checked.stdout for mark in ("<details>", "**", "| ---", "|---", "###")), checked.stdout
    assert {path: (path / "export_report.json").read_bytes() for path in saved} == saved
    markdown = cli("verify", str(output / "pt2"), "--model", str(tiny_bert), "--format", "markdown")
    assert markdown.returncode == 1 and "❌ rejected" in markdown.stdout and "<details>" in markdown.stdout
    assert {path: (path / "export_report.json").read_bytes() for path in saved} == saved

    checked = cli("verify", str(output / "pt2"), "--model", str(tiny_bert), "--write-report")
    assert checked.returncode == 1, checked.stderr
    for path in (output / "pt2", output):  # with --write-report, the target's report and the job summary both
        target = JobReport.read(path).targets["pt2"]
        assert target.status == "failed"
        assert _probe_batches(target.verification)[8] is False
        assert target.verification["against"]["model"] == str(tiny_bert)

    # The OUTPUT folder, no --model: every target, against the model its report names (issue 30).
    again = cli("verify", str(output))
    assert again.returncode == 1 and "pt2 (torch.export / forward) vs " + str(tiny_bert) in again.stdout, again.stderr
    missing = cli("verify", str(tmp_path / "no-such-output"))
    assert missing.returncode == 2 and "no-such-output: no such folder" in missing.stderr, missing.stderr


# ── deliberately wrong artifacts ─────────────────────────────────────────────


def _perturb_onnx(folder: Path) -> str:
    """Scale the largest float initializer of model.onnx (stored in its external data) by 1.5; return its name."""
    import numpy
    import onnx
    from onnx import numpy_helper

    model = onnx.load(str(folder / "model.onnx"))
    floats = [init for init in model.graph.initializer if init.data_type == onnx.TensorProto.FLOAT]
    largest = max(floats, key=lambda init: numpy.prod(init.dims))
    array = numpy_helper.to_array(largest, base_dir=str(folder))
    largest.CopyFrom(numpy_helper.from_array((array * 1.5).astype(array.dtype), largest.name))
    for file in folder.glob("model.onnx*"):
        file.unlink()
    onnx.save_model(model, str(folder / "model.onnx"), save_as_external_data=True, location="model.onnx.data")
    return largest.name


def _perturb_openvino_bin(folder: Path) -> None:
    """Scale, in place in openvino_model.bin, the bytes of the largest f32 constant the .xml points at."""
    import numpy

    root = ElementTree.parse(folder / "openvino_model.xml").getroot()
    constants = [layer.find("data") for layer in root.iter("layer") if layer.get("type") == "Const"]
    f32 = [data for data in constants if data is not None and data.get("element_type") == "f32"]
    largest = max(f32, key=lambda data: int(data.get("size")))
    offset, size = int(largest.get("offset")), int(largest.get("size"))
    blob = bytearray((folder / "openvino_model.bin").read_bytes())
    values = numpy.frombuffer(bytes(blob[offset:offset + size]), dtype=numpy.float32) * 1.5
    blob[offset:offset + size] = values.astype(numpy.float32).tobytes()
    (folder / "openvino_model.bin").write_bytes(bytes(blob))


def _assert_metric_failure(target: dict) -> None:
    verification = target["verification"]
    assert target["status"] == "failed" and not verification["passed"]
    bad = verification["probes"][0]["outputs"]["last_hidden_state"]
    assert not bad["passed"] and bad["max_abs"] > 1e-2 and bad["cosine"] < 0.9999
    assert [failure.split()[0] for failure in bad["failures"]] == ["max_abs", "cosine"]
    assert "last_hidden_state: max_abs" in verification["failures"][0]


def test_perturbed_onnx_initializer_fails_parity_and_verify_exits_1(tmp_path, exported_bert, tiny_bert, cli):
    output, _ = exported_bert
    copy = tmp_path / "onnx"
    shutil.copytree(output / "onnx", copy)
    passed = cli("verify", str(copy), "--model", str(tiny_bert))
    assert passed.returncode == 0, passed.stdout + passed.stderr
    assert "parity: passed" in passed.stdout and "**" not in passed.stdout

    _perturb_onnx(copy)
    failed = cli("verify", str(copy), "--model", str(tiny_bert), "--json", "--write-report")
    assert failed.returncode == 1, failed.stderr
    _assert_metric_failure(json.loads(failed.stdout)["targets"]["onnx"])
    assert JobReport.read(copy).targets["onnx"].status == "failed"  # rewritten beside the artifacts


def test_perturbed_openvino_bin_fails_parity(tmp_path, exported_bert, tiny_bert):
    from hfexport.job.reverify import reverify

    output, _ = exported_bert
    copy = tmp_path / "openvino"
    shutil.copytree(output / "openvino", copy)
    _perturb_openvino_bin(copy)
    report, name = reverify(copy, tiny_bert, write_report=True)
    assert name == "openvino"
    _assert_metric_failure(report.to_dict()["targets"]["openvino"])
    assert JobReport.read(copy).targets["openvino"].status == "failed"


# ── probes and metrics on a plan (nothing traced) ────────────────────────────


@pytest.fixture(scope="module")
def bert_model(tiny_bert):
    from hfexport.models import load_model, load_processor
    from hfexport.recipe.loading import load_recipe

    recipe = load_recipe(tiny_bert)
    return recipe, load_model(tiny_bert, recipe), load_processor(tiny_bert)


def _plan(bert_model, **changes):
    from hfexport.plan import build_plan
    from hfexport.recipe.loading import load_recipe

    recipe, model, processor = bert_model
    data = json.loads(json.dumps(recipe.data))
    target = data["targets"]["onnx"]
    for key, value in changes.items():
        if key == "dims":
            data["dims"] = value
        elif value is None:
            target.pop(key, None)
        else:
            target[key] = value
    return build_plan(load_recipe(data), "onnx", model, None, processor), model


def test_probes_cover_min_inside_max_and_recipe_values(bert_model):
    from hfexport.verify.probes import plan_probes

    plan, model = _plan(bert_model)
    probes, bound = plan_probes(plan, model.config)
    assert [probe["dims"] for probe in probes] == [{"batch": 1, "seq": 2}, {"batch": 5, "seq": 37},
                                                    {"batch": 8, "seq": 64}]
    assert bound["max_probe_elements"] == 65536 and bound["auto_axes"] is False

    plan, model = _plan(bert_model, parity={"probe": {"seq": [3, 17]}})
    probes, _ = plan_probes(plan, model.config)
    assert [probe["dims"] for probe in probes] == [{"batch": 1, "seq": 3}, {"batch": 5, "seq": 17},
                                                    {"batch": 8, "seq": 17}]


def test_probe_cost_bound_caps_the_largest_dim_first_and_says_so(bert_model):
    from hfexport.verify.probes import plan_probes

    plan, model = _plan(bert_model, parity={"max_probe_elements": 300})
    probes, bound = plan_probes(plan, model.config)
    last = probes[-1]
    # batch 8 x seq 64 x 2 inputs = 1024 > 300: seq halves first, batch stays > 1
    assert last["dims"]["batch"] == 8 and last["dims"]["seq"] * 8 * 2 <= 300
    assert last["capped"]["seq"]["requested"] == 64
    assert bound["max_probe_elements"] == 300


def test_seq_probes_stay_within_the_model_limit(bert_model):
    from hfexport.verify.probes import plan_probes

    plan, model = _plan(bert_model, dims={"batch": {"min": 1, "max": 8}, "seq": {"min": 2, "max": 4096}})
    probes, _ = plan_probes(plan, model.config)
    assert max(probe["dims"]["seq"] for probe in probes) == model.config.max_position_embeddings == 128


def test_auto_axes_probe_batch_1_and_8(bert_model):
    from hfexport.verify.probes import plan_probes

    plan, model = _plan(bert_model, dynamic_shapes=None)
    probes, bound = plan_probes(plan, model.config)
    assert bound["auto_axes"] is True
    assert [probe["dims"] for probe in probes] == [{"batch": 1, "seq": 5}, {"batch": 8, "seq": 37}]


def test_static_axes_are_probed_at_their_value_only(bert_model):
    from hfexport.verify.probes import plan_probes

    plan, model = _plan(bert_model, dynamic_shapes={"input_ids": {"0": 2, "1": "seq"}})
    probes, _ = plan_probes(plan, model.config)
    assert [probe["dims"] for probe in probes] == [{"seq": 2}, {"seq": 37}, {"seq": 64}]
    plan, model = _plan(bert_model, dynamic_shapes={"input_ids": {"0": "static", "1": "static"}})
    probes, _ = plan_probes(plan, model.config)
    assert probes == [{"dims": {}, "capped": {}}]


def test_resized_inputs_keep_attention_masks_valid():
    from hfexport.verify.probes import AxisRef, resize_inputs

    ids = torch.tensor([[0, 0, 5, 6], [7, 8, 9, 10]])
    mask = torch.tensor([[0, 0, 1, 1], [1, 1, 1, 1]])  # left padding
    refs = [AxisRef(name, axis, dim) for name in ("input_ids", "attention_mask") for axis, dim in ((0, "b"), (1, "s"))]
    grown = resize_inputs({"input_ids": ids, "attention_mask": mask}, refs, {"b": 3, "s": 6})
    assert grown["input_ids"].tolist() == [[0, 0, 5, 6, 0, 0], [7, 8, 9, 10, 7, 8], [0, 0, 5, 6, 0, 0]]
    assert grown["attention_mask"].tolist() == [[0, 0, 1, 1, 1, 1], [1] * 6, [0, 0, 1, 1, 1, 1]]
    cropped = resize_inputs({"input_ids": ids, "attention_mask": mask}, refs, {"b": 1, "s": 2})
    assert cropped["input_ids"].tolist() == [[5, 6]]  # left-padded rows are cropped from the left
    assert cropped["attention_mask"].tolist() == [[1, 1]]
    right = torch.tensor([[1, 1, 0, 0]])
    emptied = resize_inputs({"input_ids": ids[:1], "attention_mask": right}, refs, {"b": 1, "s": 1})
    assert emptied["attention_mask"].tolist() == [[1]]  # never a row that attends to nothing


def test_metrics_of_one_output():
    from hfexport.verify.parity import compare_tensors
    from hfexport.verify.thresholds import default_tolerance

    tolerance = default_tolerance("onnx")
    eager = torch.tensor([[1.0, -2.0, 3.0], [0.5, 0.25, -4.0]])
    same = compare_tensors(eager + 1e-6, eager, tolerance, logits=True)
    assert same["passed"] and same["top1"] == 1.0 and same["cosine"] == pytest.approx(1.0)
    off = eager.clone()
    off[1, 2] = 4.0  # flips the argmax of row 1 and is 8 off
    result = compare_tensors(off, eager, tolerance, logits=True)
    assert not result["passed"]
    assert result["max_abs"] == pytest.approx(8.0) and result["max_rel"] == pytest.approx(2.0)
    assert result["top1"] == 0.5 and result["mismatched"] == pytest.approx(1 / 6)
    assert [failure.split()[0] for failure in result["failures"]] == ["max_abs", "cosine", "top1"]
    nan = compare_tensors(torch.tensor([float("nan"), 1.0]), torch.tensor([0.0, 1.0]), tolerance)
    assert not nan["passed"] and nan["max_abs"] is None
    shape = compare_tensors(torch.zeros(2, 3), torch.zeros(3, 2), tolerance)
    assert not shape["passed"] and "shape" in shape["failures"][0]


def test_metrics_by_blocks_are_the_whole_tensors(monkeypatch):
    """compare_tensors walks a leaf in row blocks (issue 45: a logits leaf's temporaries once made the gate's peak):
    one-row blocks give the figures of one block, NaNs, an inf and a flipped argmax included."""
    import hfexport.verify.parity as parity
    from hfexport.verify.thresholds import default_tolerance

    tolerance = default_tolerance("onnx")
    eager = torch.randn(6, 5, generator=torch.Generator().manual_seed(0))
    got = eager + 1e-6
    got[1, 2], got[2, 0], got[4, 4] = float("nan"), float("inf"), 10.0
    eager[3, 1] = got[3, 1] = float("nan")
    whole = parity.compare_tensors(got, eager, tolerance, logits=True)
    monkeypatch.setattr(parity, "CHUNK_ELEMENTS", 5)
    blocks = parity.compare_tensors(got, eager, tolerance, logits=True)
    assert blocks == whole and whole["top1"] == 0.5 and whole["max_abs"] is None


def test_padded_positions_are_not_compared():
    from hfexport.recipe.data import Target
    from hfexport.verify.parity import compare_outputs
    from hfexport.verify.thresholds import thresholds_for

    thresholds = thresholds_for(Target("t", "onnx"))
    eager = {"logits": torch.zeros(2, 3, 4)}
    exported = {"logits": torch.zeros(2, 3, 4)}
    exported["logits"][1, 0] = 7.0  # a padded query position: undefined, left out
    mask = torch.tensor([[1, 1, 1], [0, 1, 1]])
    assert compare_outputs(exported, eager, thresholds, mask)["logits"]["passed"]
    assert not compare_outputs(exported, eager, thresholds)["logits"]["passed"]


def test_thresholds_defaults_and_recipe_overrides():
    from hfexport.recipe.data import Target
    from hfexport.verify.thresholds import default_tolerance, thresholds_for

    assert default_tolerance("dynamo")["atol"] < default_tolerance("onnx")["atol"]
    assert default_tolerance("onnx", "float16")["atol"] == 1e-2
    assert default_tolerance("openvino", quantized=True)["atol"] is None
    target = Target("t", "onnx", parity={"atol": 1e-3, "outputs": {"logits": {"min_top1": 0.5}}})
    thresholds = thresholds_for(target)
    assert thresholds["default"]["atol"] == 1e-3 and thresholds["default"]["rtol"] == 1e-3
    assert thresholds["outputs"]["logits"] == {**thresholds["default"], "min_top1": 0.5}
    assert "with the recipe's parity" in thresholds["basis"]


def test_report_schema_rejects_a_malformed_verification(exported_bert):
    _, report = exported_bert
    data = report.to_dict()
    data["targets"]["onnx"]["verification"]["probes"][0]["outputs"]["last_hidden_state"]["max_abs"] = "small"
    with pytest.raises(ValueError, match="max_abs"):
        validate_report(data)
    data = report.to_dict()
    del data["targets"]["onnx"]["verification"]["passed"]
    with pytest.raises(ValueError, match="passed"):
        validate_report(data)


# ── the real checkpoint ──────────────────────────────────────────────────────


@pytest.mark.slow
def test_batch_pinning_trap_on_all_minilm_l6_v2(tmp_path, minilm):
    """As measured in the issue: all-MiniLM-L6-v2, engine dynamic=True, one sentence -> fails at batch 8;
    the same model with an explicit batch dim passes at batch 1 and 8."""
    from hfexport.job.run import run_job

    trap = run_job(minilm, tmp_path / "trap", recipe=TRAP_RECIPE)
    target = trap.targets["onnx"]
    assert target.status == "failed"
    assert "Got invalid dimensions for input" in next(
        probe["error"] for probe in target.verification["probes"] if probe["dims"]["batch"] == 8)
    explicit = dict(TRAP_RECIPE, dims={"batch": {"min": 1, "max": 8}, "seq": {"min": 2, "max": 512}},
                    sample_inputs={"text": ["The capital of France is Paris.", "A second, longer sentence for the batch."]},
                    targets={"onnx": {"export_format": "onnx", "dynamic_shapes": {"input_ids": {"0": "batch", "1": "seq"}}}})
    fixed = run_job(minilm, tmp_path / "fixed", recipe=explicit).targets["onnx"]
    assert fixed.status == "ok", fixed.error
    assert _probe_batches(fixed.verification) == {1: True, 5: True, 8: True}


def test_the_gate_runs_the_eager_model_before_it_opens_the_artifact_and_can_release_it(exported_llama, tiny_llama,
                                                                                        monkeypatch):
    """Issue 45: the eager side of every check first, then `release`, then the artifact's runtime: the model (here,
    with no other reference) is freed before the session opens, and the verdict is the job's own."""
    import gc
    import weakref

    from hfexport.models import load_model, load_processor
    from hfexport.plan import build_plan
    from hfexport.recipe.loading import load_recipe
    from hfexport.verify import check

    output, report = exported_llama
    recipe, processor = load_recipe(tiny_llama), load_processor(tiny_llama)
    plan = build_plan(recipe, "onnx-generation", load_model(tiny_llama, recipe), None, processor)  # its own model
    holder = {"model": load_model(tiny_llama, recipe)}
    model = weakref.ref(holder["model"])
    events = []
    monkeypatch.setattr(check, "_load", lambda *args, load=check._load, **kwargs: events.append(
        ("load", model() is None, kwargs.get("lean"))) or load(*args, **kwargs))

    def release():
        events.append(("release", None))
        holder.clear()
        gc.collect()

    verification = check.verify_exported(output / "onnx-generation", holder["model"], plan, processor,
                                         release=release, own_process=False)  # its own: test_verify_artifact_process
    # released, and gone, before the artifact loaded, its weights left memory-mapped (lean)
    assert events == [("release", None), ("load", True, True)]
    assert verification["passed"] and verification["generation"]["token_agreement"] == 1.0
    job = report.targets["onnx-generation"].verification
    assert [probe["name"] for probe in verification["probes"]] == [probe["name"] for probe in job["probes"]]
    assert [probe["passed"] for probe in verification["probes"]] == [probe["passed"] for probe in job["probes"]]
