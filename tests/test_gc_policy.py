"""The one-shot garbage-collector policy of `hfexport export`/`init` (hfexport.gc_policy): the collector is off until
planning starts, skips what was alive then, is restored afterwards, and the artifact does not change."""

from __future__ import annotations

import gc
import hashlib
from pathlib import Path

import pytest
from hfexport.gc_policy import one_shot_collection
from hfexport.progress import Step


@pytest.fixture
def collector_state():
    """Run the test from a known collector state (enabled, nothing frozen) and put the caller's state back."""
    was_enabled, frozen = gc.isenabled(), gc.get_freeze_count()
    gc.unfreeze()
    gc.enable()
    yield
    if not was_enabled:
        gc.disable()
    if frozen:
        gc.freeze()


_OFF_UNTIL_PLAN = """
import gc
from hfexport.gc_policy import one_shot_collection
from hfexport.job.run import Step

gc.unfreeze()
gc.enable()
seen = []
with one_shot_collection(seen.append) as on_step:
    assert not gc.isenabled()
    on_step(Step("load_model", "start"))
    assert not gc.isenabled() and gc.get_freeze_count() == 0
    on_step(Step("plan", "start", "onnx"))
    assert gc.isenabled()
    frozen = gc.get_freeze_count()
    assert frozen > 1000, frozen  # the modules and objects alive when planning started
    on_step(Step("plan", "start", "pt2"))  # a second target: nothing frozen again
    assert gc.get_freeze_count() == frozen
assert gc.isenabled() and gc.get_freeze_count() == 0
assert [(step.step, step.target) for step in seen] == [("load_model", None), ("plan", "onnx"), ("plan", "pt2")]
"""


def test_off_until_plan_then_frozen_and_on_and_restored():
    """Run in a fresh interpreter: the collector is process-wide state that other tests in this session touch."""
    import os
    import subprocess
    import sys

    root = Path(__file__).resolve().parent.parent
    env = {**os.environ, "PYTHONPATH": str(root / "library")}
    result = subprocess.run([sys.executable, "-c", _OFF_UNTIL_PLAN], capture_output=True, text=True, env=env,
                            timeout=120)
    assert result.returncode == 0, result.stderr


def test_restored_on_error_and_without_a_plan(collector_state):
    with pytest.raises(RuntimeError), one_shot_collection() as on_step:
        on_step(Step("plan", "start", "onnx"))
        raise RuntimeError("export failed")
    assert gc.isenabled() and gc.get_freeze_count() == 0
    with one_shot_collection() as on_step:  # a cache hit: no plan step, the collector stays off until the end
        on_step(Step("cache", "start"))
        assert not gc.isenabled()
    assert gc.isenabled() and gc.get_freeze_count() == 0


def test_a_caller_with_the_collector_off_keeps_it_off(collector_state):
    gc.disable()
    with one_shot_collection() as on_step:
        on_step(Step("plan", "start", "onnx"))
        assert not gc.isenabled()
    assert not gc.isenabled() and gc.get_freeze_count() == 0


def _sha256(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def test_cli_export_writes_the_same_bytes_as_the_library_job(cli, exported_bert, tiny_bert, tmp_path):
    """`hfexport export` (policy on) and `run_job` (policy off) save byte-identical ONNX files."""
    library_output, report = exported_bert
    assert report.targets["onnx"].status == "ok"
    result = cli("export", str(tiny_bert), "--target", "onnx", "-o", str(tmp_path / "out"), "--no-verify", "--quiet")
    assert result.returncode == 0, result.stderr
    for name in ("model.onnx", "model.onnx.data", "export.json"):
        assert _sha256(tmp_path / "out" / "onnx" / name) == _sha256(library_output / "onnx" / name), name
