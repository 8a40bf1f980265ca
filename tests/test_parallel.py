"""A job's targets exported in several processes at once (hfexport.job.parallel): how they are shared out, that a
worker's target is the same export with the same checks, and that a worker which dies or a job interrupted with
Ctrl-C leaves no half-written output and no process behind."""

from __future__ import annotations

import os
import signal
import threading
from pathlib import Path

import pytest

from hfexport.job.parallel import export_groups, remove_unfinished, split_targets
from hfexport.job.preflight import MB, PreflightError, memory_needed
from hfexport.job.run import run_job
from hfexport.recipe.loading import load_recipe

WORKER_MODULE = "hfexport.job.parallel_worker"
SECRET = "hf_parallelTokenNeverLogged0123456789"


def _worker_pids(parent: int | None = None) -> list[int]:
    """The live worker children (`python -m hfexport.job.parallel_worker`) of `parent` (default: this process)."""
    pids = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            status = (entry / "status").read_text()
            cmdline = (entry / "cmdline").read_bytes()
        except OSError:
            continue
        if (f"PPid:\t{parent or os.getpid()}\n" in status and WORKER_MODULE.encode() in cmdline
                and "State:\tZ" not in status):
            pids.append(int(entry.name))
    return pids


def _leftovers(output: Path) -> list[str]:
    """Staging and set-aside folders (`files.save_atomically`) left in OUTPUT."""
    if not output.exists():
        return []
    return sorted(path.name for path in output.iterdir() if ".partial-" in path.name or ".old-" in path.name)


def test_targets_are_shared_out_by_cost_with_the_lightest_share_kept_here():
    costs = {"pt2": 0.25, "onnx": 1.5, "openvino": 1.0, "pte": 4.0}
    assert split_targets(costs, 2) == [["pt2", "onnx", "openvino"], ["pte"]]
    assert split_targets(costs, 3) == [["pt2", "openvino"], ["onnx"], ["pte"]]
    assert split_targets(costs, 8) == [["pt2"], ["openvino"], ["onnx"], ["pte"]]  # never an empty process
    assert split_targets(costs, 1) == [["pt2", "onnx", "openvino", "pte"]]


def test_auto_workers_follow_the_cores_and_the_memory(tiny_bert):
    recipe = load_recipe(tiny_bert)
    targets = {name: recipe.target(name) for name in ("onnx", "pt2", "pte")}
    weights = 100 * MB
    two = memory_needed(weights, [[targets["pte"]], [targets["onnx"], targets["pt2"]]])
    assert export_groups(targets, "auto", weights, two, cpus=2) == [["onnx", "pt2"], ["pte"]]
    assert export_groups(targets, "auto", weights, two, cpus=1) == [["onnx", "pt2", "pte"]]
    assert export_groups(targets, "auto", weights, two - 1, cpus=2) == [["onnx", "pt2", "pte"]]  # two do not fit
    assert export_groups(targets, "auto", None, None, cpus=4) == [["onnx", "pt2", "pte"]]  # size unknown: one
    assert len(export_groups(targets, "auto", weights, None, cpus=4)) == 3
    assert len(export_groups(targets, 2, weights, 1, cpus=1)) == 2  # asked for: the preflight decides
    assert export_groups({}, "auto", weights, None, cpus=2) == []


@pytest.mark.parametrize("workers", [0, -1, "two", 1.5])
def test_a_wrong_workers_value_is_refused_before_anything_runs(tiny_bert, tmp_path, workers):
    with pytest.raises(ValueError, match="expected a number of processes"):
        run_job(tiny_bert, tmp_path / "out", workers=workers)
    assert not (tmp_path / "out").exists()


def test_the_cli_refuses_a_wrong_workers_value_in_one_line(cli, tiny_bert, tmp_path):
    result = cli("export", str(tiny_bert), "-o", str(tmp_path / "out"), "--workers", "0")
    assert result.returncode == 2
    assert "argument --workers: '0': expected a number of processes (1 or more) or 'auto'" in result.stderr
    assert "Traceback" not in result.stderr


def test_the_preflight_counts_the_weights_once_per_process(tiny_bert, tmp_path, monkeypatch):
    recipe = load_recipe(tiny_bert)
    from hfexport.job.preflight import weights_metadata

    weights, _ = weights_metadata(tiny_bert)
    one = memory_needed(weights, [[recipe.target("onnx"), recipe.target("pt2")]])
    monkeypatch.setenv("HFEXPORT_MEMORY_LIMIT_MB", str((one + 1024 * 1024) / MB))
    with pytest.raises(PreflightError, match=r"in each of 2 export processes.*--workers 1"):
        run_job(tiny_bert, tmp_path / "out", targets=["onnx", "pt2"], workers=2)
    assert not (tmp_path / "out").exists()


def test_what_a_killed_worker_left_is_removed_and_a_previous_export_put_back(tmp_path):
    (tmp_path / ".onnx.partial-0a1b2c3d" / "onnx").mkdir(parents=True)  # killed while writing
    (tmp_path / ".pt2.old-0a1b2c3d").mkdir()  # killed between moving the old export aside and renaming the new one
    (tmp_path / ".pt2.old-0a1b2c3d" / "model.pt2").write_bytes(b"previous")
    (tmp_path / "pte").mkdir()  # killed after renaming the new export, before removing the old one
    (tmp_path / ".pte.old-0a1b2c3d").mkdir()
    (tmp_path / ".openvino.partial-0a1b2c3d").mkdir()  # not the worker's target: left alone
    remove_unfinished(tmp_path, ["onnx", "pt2", "pte"])
    assert sorted(path.name for path in tmp_path.iterdir()) == [".openvino.partial-0a1b2c3d", "pt2", "pte"]
    assert (tmp_path / "pt2" / "model.pt2").read_bytes() == b"previous"


def test_a_worker_exports_and_verifies_the_same_artifact_and_never_sees_the_token(tiny_bert, exported_bert, tmp_path):
    output = tmp_path / "out"
    threads: dict[tuple[str, str | None], str] = {}
    seen: dict[str, object] = {}

    def progress(step):
        threads.setdefault((step.step, step.target), threading.current_thread().name)
        if step.step == "export" and step.status == "start" and step.target == "onnx":
            pids = _worker_pids()
            seen["pids"] = pids
            seen["exposed"] = [pid for pid in pids
                               if SECRET.encode() in Path(f"/proc/{pid}/cmdline").read_bytes()
                               or SECRET.encode() in Path(f"/proc/{pid}/environ").read_bytes()]

    report = run_job(tiny_bert, output, targets=["onnx", "pt2"], workers=2, token=SECRET, progress=progress)

    assert {name: target.status for name, target in report.targets.items()} == {"onnx": "ok", "pt2": "ok"}
    assert list(report.targets) == ["onnx", "pt2"]  # recipe order, whichever process finished first
    # onnx (the heavier target) went to the worker: its steps arrived through a reader thread; pt2 stayed here
    assert threads[("export", "onnx")].startswith("hfexport-export-")
    assert threads[("export", "pt2")] == "MainThread"
    assert len(seen["pids"]) == 1 and seen["exposed"] == []
    for name in ("onnx", "pt2"):
        target = report.targets[name]
        assert target.verification["passed"] and target.verification["probes"], name
        assert "error" not in target.latency and target.timings["latency_s"] > 0, name
        assert (output / name / "export_report.json").is_file()
    # the same recipe target exported here (the session's sequential job) and in the worker: the same graph
    assert (output / "onnx" / "model.onnx").read_bytes() == (exported_bert[0] / "onnx" / "model.onnx").read_bytes()
    assert _leftovers(output) == [] and _worker_pids() == []
    assert all(SECRET not in file.read_text(errors="replace") for file in output.rglob("*.json"))


def test_a_worker_killed_mid_export_fails_only_its_targets_and_leaves_nothing_half_written(tiny_bert, tmp_path):
    output = tmp_path / "out"
    killed = []

    def progress(step):
        if step.step == "export" and step.status == "start" and step.target == "onnx":
            for pid in _worker_pids():
                os.kill(pid, signal.SIGKILL)
                killed.append(pid)

    report = run_job(tiny_bert, output, targets=["onnx", "pt2"], workers=2, progress=progress, latency=False)
    assert len(killed) == 1
    onnx = report.targets["onnx"]
    assert onnx.status == "error" and "exited with code -9 (killed by signal 9" in onnx.error
    assert report.targets["pt2"].status == "ok" and report.status == "error"
    assert not (output / "onnx").exists() and _leftovers(output) == []
    assert (output / "export_report.json").is_file()


def test_ctrl_c_stops_the_workers_and_leaves_nothing_half_written(tiny_bert, tmp_path):
    output = tmp_path / "out"

    def progress(step):
        if step.step == "export" and step.status == "start" and threading.current_thread() is threading.main_thread():
            raise KeyboardInterrupt

    with pytest.raises(KeyboardInterrupt):
        run_job(tiny_bert, output, targets=["onnx", "pt2"], workers=2, progress=progress)
    assert _worker_pids() == []
    assert not (output / "pt2").exists() and _leftovers(output) == []
    assert not (output / "export_report.json").exists()


JOB_SCRIPT = """
import os, sys, threading
from hfexport.job.run import run_job

out = os.fdopen(os.dup(1), "w")  # the job sends fds 1 and 2 to its engine log while it exports

def progress(step):
    if step.step == "export" and step.status == "start" and threading.current_thread() is not threading.main_thread():
        print("worker exporting", file=out, flush=True)

run_job(sys.argv[1], sys.argv[2], targets=["pte", "pt2"], workers=2, progress=progress, latency=False)
"""


def test_a_job_process_that_dies_takes_its_workers_with_it(tiny_bert, tmp_path):
    import subprocess
    import sys
    import time

    output = tmp_path / "out"
    env = {**os.environ, "PYTHONPATH": str(Path(__file__).resolve().parents[1] / "library")}
    job = subprocess.Popen([sys.executable, "-c", JOB_SCRIPT, str(tiny_bert), str(output)], stdout=subprocess.PIPE,
                           text=True, env=env)
    try:
        assert job.stdout.readline().strip() == "worker exporting"
        workers = _worker_pids(job.pid)
        assert len(workers) == 1
        job.kill()  # as the kernel's OOM killer would: no handler runs
        job.wait()
        # tiny-bert's pte export takes over 30 s: a worker left alone would only notice at its next event, after it
        deadline = time.monotonic() + 15
        while Path(f"/proc/{workers[0]}").exists() and "State:\tZ" not in _read(Path(f"/proc/{workers[0]}/status")):
            assert time.monotonic() < deadline, "the worker outlived its job process"
            time.sleep(0.2)
        assert not (output / "pte").exists()  # it stopped before finishing: no target folder
    finally:
        if job.poll() is None:
            job.kill()


def _read(path: Path) -> str:
    try:
        return path.read_text()
    except OSError:
        return ""
