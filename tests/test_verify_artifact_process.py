"""The gate's artifact side in a torch-free process of its own (issue 45, item 3: a gate that fits), for ONNX and
OpenVINO generation targets.

`verify_exported` computes the eager references, releases the model and hands the ONNX session's side (OpenVINO's
compiled stateful decode: its graph check at f32 and its runtime precision's) to `python -m hfexport.verify.artifact`;
the verification dict it assembles from that process's answers is the one the in-process gate gives, passing or
failing, and a process that dies is one failure line.
"""

from __future__ import annotations

import dataclasses
import json
import shutil
import subprocess
import sys
from pathlib import Path
from types import SimpleNamespace

import pytest

LIBRARY = Path(__file__).resolve().parents[1] / "library"


@pytest.fixture(scope="module")
def llama_onnx(tmp_path_factory, tiny_llama):
    """tiny-llama's single-graph ONNX generation target, exported (and gated) once; its model, plan and processor."""
    from hfexport.job.run import run_job
    from hfexport.models import load_model, load_processor
    from hfexport.plan import build_plan
    from hfexport.recipe.loading import load_recipe

    output = tmp_path_factory.mktemp("artifact-process")
    report = run_job(tiny_llama, output, ["onnx-generation"], latency=False, runtimes=False)
    assert report.targets["onnx-generation"].status == "ok", report.targets["onnx-generation"].error
    recipe, processor = load_recipe(tiny_llama), load_processor(tiny_llama)
    model = load_model(tiny_llama, recipe)
    return output / "onnx-generation", model, build_plan(recipe, "onnx-generation", model, None, processor), processor


def _comparable(verification: dict) -> dict:
    """The verification dict without its timings and without where the artifact ran."""
    verification = json.loads(json.dumps(verification))
    for key in ("seconds", "reload_s"):
        verification.pop(key, None)
    verification.get("runtime", {}).pop("process", None)
    verification.get("runtime", {}).pop("process_peak_rss_mb", None)
    verification.get("runtime", {}).pop("process_parent_rss_mb", None)
    for probe in verification["probes"] + verification.get("runtime_check", {}).get("probes", []):
        probe.pop("seconds", None)
    return verification


def _both(folder: Path, model, plan, processor) -> tuple[dict, dict]:
    from hfexport.verify.check import verify_exported

    separate = verify_exported(folder, model, plan, processor, lean=True)  # by default where lean
    here = verify_exported(folder, model, plan, processor, lean=True, own_process=False)
    assert separate["runtime"]["process"] == "separate" and "process" not in here["runtime"]
    return separate, here


def test_the_artifact_process_gives_the_in_process_verification(llama_onnx):
    folder, model, plan, processor = llama_onnx
    separate, here = _both(folder, model, plan, processor)
    assert separate["passed"] and separate["generation"]["token_agreement"] == 1.0
    assert [probe["component"] for probe in separate["probes"]] == [probe["component"] for probe in here["probes"]]
    assert _comparable(separate) == _comparable(here)


def test_a_perturbed_artifact_fails_with_the_same_lines_in_its_own_process(tmp_path, llama_onnx):
    import onnx

    folder, model, plan, processor = llama_onnx
    copy = tmp_path / "onnx-generation"
    shutil.copytree(folder, copy)
    graph = onnx.load(str(copy / "model.onnx"), load_external_data=False).graph
    largest = max((tensor for tensor in graph.initializer if tensor.data_location == onnx.TensorProto.EXTERNAL),
                  key=lambda tensor: int({entry.key: entry.value for entry in tensor.external_data}["length"]))
    where = {entry.key: entry.value for entry in largest.external_data}
    _fails_alike_once_scaled(copy, copy / where["location"], int(where.get("offset", 0)), int(where["length"]),
                             model, plan, processor)


def _fails_alike_once_scaled(copy, weights, offset: int, length: int, model, plan, processor) -> None:
    """The float32 weight at `offset` of `weights` scaled in place (the file's layout unchanged): the artifact in
    `copy` then fails with the same lines apart and in process."""
    import numpy

    with weights.open("r+b") as data:
        data.seek(offset)
        values = numpy.frombuffer(data.read(length), dtype=numpy.float32) * 1.5 + 0.5
        data.seek(offset)
        data.write(values.astype(numpy.float32).tobytes())
    separate, here = _both(copy, model, plan, processor)
    assert not separate["passed"] and separate["failures"]
    assert separate["failures"] == here["failures"]
    assert _comparable(separate) == _comparable(here)


@pytest.mark.parametrize(("exported", "runtime"), [("llama_onnx", "ONNX Runtime"), ("llama_openvino", "OpenVINO")])
def test_a_dead_artifact_process_is_one_failure_line(exported, runtime, request, monkeypatch):
    from hfexport.verify.check import summary, verify_exported

    folder, model, plan, processor = request.getfixturevalue(exported)
    monkeypatch.setattr(sys, "executable", shutil.which("false"))  # the child exits 1 without answering
    verification = verify_exported(folder, model, plan, processor, lean=True)
    assert not verification["passed"] and len(verification["failures"]) == 1
    assert verification["failures"][0].startswith(f"the artifact's runtime process ({runtime}, python -m "
                                                  "hfexport.verify.artifact) failed: exit status 1")
    assert summary(verification).startswith("parity failed: the artifact's runtime process")


def test_the_model_is_released_before_the_artifact_process_starts(llama_onnx, tiny_llama, monkeypatch):
    import gc
    import weakref

    from hfexport.models import load_model
    from hfexport.recipe.loading import load_recipe
    from hfexport.verify.check import verify_exported

    folder, _, plan, processor = llama_onnx
    holder = {"model": load_model(tiny_llama, load_recipe(tiny_llama))}
    model = weakref.ref(holder["model"])
    events, spawn = [], subprocess.run

    def run(command, **kwargs):
        events.append(("spawn", model() is None, command[1:3]))
        return spawn(command, **kwargs)

    def release():
        events.append(("release",))
        holder.clear()
        gc.collect()

    monkeypatch.setattr(subprocess, "run", run)
    verification = verify_exported(folder, holder["model"], plan, processor, release=release)
    assert events == [("release",), ("spawn", True, ["-m", "hfexport.verify.artifact"])]
    assert verification["passed"] and verification["runtime"]["process"] == "separate"


def test_the_rule_reads_the_saved_artifact_before_the_reference_is_made(llama_onnx):
    from hfexport.verify.check import artifact_process_refusal

    folder, model, plan, _ = llama_onnx
    assert artifact_process_refusal(folder, plan, model.config) is None
    assert artifact_process_refusal(folder.parent / "missing", plan, model.config) == "its manifest does not read"
    forward = SimpleNamespace(target=SimpleNamespace(**{**vars(plan.target), "mode": "forward"}))
    assert artifact_process_refusal(folder, forward, model.config) == \
        "not a generation target of a format whose gate runs apart (ONNX, OpenVINO)"


def test_the_artifact_process_imports_no_torch():
    code = ("import sys, hfexport.verify.artifact, hfexport.verify.parity, hfexport.formats.onnx.gate_process, "
            "hfexport.formats.openvino.gate_process; print(sorted(m for m in ('torch', 'transformers') "
            "if m in sys.modules))")
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True,
                          env={"PYTHONPATH": str(LIBRARY), "PATH": "/usr/bin:/bin"})
    assert done.stdout.strip() == "[]"


def test_the_verify_stage_counts_the_artifact_process_beside_the_exporting_one():
    """The verify stage's peak is the exporting process's resident set while the artifact's ran plus that process's
    own peak, where that is more than this process measured alone (the preflight's `verify` estimates both)."""
    from hfexport.job.pipeline import _count_artifact_process
    from hfexport.report.data import TargetReport

    report = TargetReport(target="t", export_format="onnx", mode="generation")
    report.memory = {"peak_rss_mb": {"verify": 900.0}}
    _count_artifact_process(report, {"runtime": {"process_peak_rss_mb": 915.0, "process_parent_rss_mb": 877.0}})
    assert report.memory["peak_rss_mb"]["verify"] == 1792.0
    _count_artifact_process(report, {"runtime": {}})  # in process: as measured
    assert report.memory["peak_rss_mb"]["verify"] == 1792.0


# ── OpenVINO: a stateful decode compiled in the artifact's process ───────────


@pytest.fixture(scope="module")
def llama_openvino(tmp_path_factory, tiny_llama):
    """tiny-llama's OpenVINO generation target (one stateful decode; its recipe pins no runtime precision), exported
    (and gated) once; its model, plan and processor."""
    from hfexport.job.run import run_job
    from hfexport.models import load_model, load_processor
    from hfexport.plan import build_plan
    from hfexport.recipe.loading import load_recipe

    output = tmp_path_factory.mktemp("artifact-process-openvino")
    report = run_job(tiny_llama, output, ["openvino-generation"], latency=False, runtimes=False)
    assert report.targets["openvino-generation"].status == "ok", report.targets["openvino-generation"].error
    recipe, processor = load_recipe(tiny_llama), load_processor(tiny_llama)
    model = load_model(tiny_llama, recipe)
    return (output / "openvino-generation", model, build_plan(recipe, "openvino-generation", model, None, processor),
            processor)


def _pinned(plan, precision: str):
    """`plan` with its target's `runtime.precision` pinned to `precision`."""
    return dataclasses.replace(plan, target=dataclasses.replace(plan.target, runtime={"precision": precision}))


@pytest.mark.parametrize("precision", ["auto", "f32"])
def test_the_openvino_artifact_process_gives_the_in_process_verification(llama_openvino, monkeypatch, precision):
    """The graph check compiled at f32 and the runtime check at the device's or the recipe's precision (bf16 on a
    CPU with AVX512-BF16 or AMX, else f32: the same as the graph's) in that process give the in-process dict; the
    process imported no torch."""
    folder, model, plan, processor = llama_openvino
    plan = _pinned(plan, precision)
    answered, spawn = [], subprocess.run

    def run(command, **kwargs):
        done = spawn(command, **kwargs)
        answered.append(json.loads((Path(command[-1]) / "result.json").read_text()))
        return done

    monkeypatch.setattr(subprocess, "run", run)
    separate, here = _both(folder, model, plan, processor)
    assert separate["passed"] and separate["generation"]["token_agreement"] == 1.0
    assert separate["runtime"]["checks"][0]["precision"] == "f32"  # INFERENCE_PRECISION_HINT, whatever the CPU
    assert all(probe.get("skipped") for probe in separate["probes"])  # as in process: the cache is the request's
    assert _comparable(separate) == _comparable(here)
    assert [result["torch_imported"] for result in answered] == [False]
    assert len(answered[0]["checks"]) == (1 if precision == "f32" else 2)  # f32 pinned: not compiled again


def test_a_perturbed_openvino_artifact_fails_with_the_same_lines_in_its_own_process(tmp_path, llama_openvino):
    import xml.etree.ElementTree as ElementTree

    folder, model, plan, processor = llama_openvino
    copy = tmp_path / "openvino-generation"
    shutil.copytree(folder, copy)
    constants = [layer.find("data").attrib for layer in ElementTree.parse(copy / "openvino_model.xml").iter("layer")
                 if layer.get("type") == "Const" and layer.find("data").get("element_type") == "f32"]
    largest = max(constants, key=lambda data: int(data["size"]))
    _fails_alike_once_scaled(copy, copy / "openvino_model.bin", int(largest["offset"]), int(largest["size"]),
                             model, plan, processor)


def test_an_openvino_decode_without_state_is_checked_in_process(tmp_path, llama_openvino):
    """A decode exported with `stateful: false` (its probes fed a captured cache) stays in the exporting process."""
    from hfexport.verify.check import artifact_process_refusal

    folder, model, plan, _ = llama_openvino
    assert artifact_process_refusal(folder, plan, model.config) is None
    copy = tmp_path / "openvino-generation"
    shutil.copytree(folder, copy)
    manifest = json.loads((copy / "export.json").read_text())
    manifest["components"]["decode"]["metadata"]["export_config"]["stateful"] = False
    (copy / "export.json").write_text(json.dumps(manifest))
    assert artifact_process_refusal(copy, plan, model.config) == "not a single decode that keeps its cache as state"


def test_a_program_without_the_state_its_manifest_names_is_one_failure_line(tmp_path, llama_openvino):
    """The process finds no state in a decode the manifest says keeps it (the entries it skips were released before
    it spawned): one failure line, not a comparison on released references."""
    import openvino
    import openvino.opset13 as ops

    from hfexport.verify.check import verify_exported

    folder, model, plan, processor = llama_openvino
    copy = tmp_path / "openvino-generation"
    shutil.copytree(folder, copy)
    ids = ops.parameter([-1, -1], openvino.Type.i64, name="input_ids")
    logits = ops.convert(ids, openvino.Type.f32)
    logits.output(0).get_tensor().set_names({"logits"})
    stateless = openvino.Model([logits], [ids], "stateless")  # a program under the stateful manifest, no state
    openvino.save_model(stateless, str(copy / "openvino_model.xml"), compress_to_fp16=False)
    verification = verify_exported(copy, model, plan, processor, lean=True)
    assert not verification["passed"] and verification["failures"] == [
        "the artifact's runtime process (OpenVINO) cannot check it: decode: a program that keeps no cache state"]
