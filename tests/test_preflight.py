"""Preflight: memory and disk needs estimated from safetensors metadata (local headers, or the Hub's over HTTP),
and a clear refusal before any weights are loaded when they do not fit."""

from __future__ import annotations

import os
import copy
import json
import uuid
from pathlib import Path

import pytest
from hfexport.formats import format_backend
from hfexport.job.preflight import (
    ARTIFACT_PROCESS,
    MAPPED_GATE_RELEASE,
    DISK_FACTOR,
    GENERATION_FACTOR,
    RUNTIME_MB,
    PreflightError,
    estimate,
    weights_metadata,
)
from hfexport.job.run import run_job
from hfexport.progress import Step
from hfexport.recipe.loading import load_recipe
from hfexport.recipe.data import Recipe

EXAMPLE = Path(__file__).resolve().parents[1] / "examples" / "tiny-bert"
LLAMA = Path(__file__).resolve().parents[1] / "examples" / "tiny-llama"
MB = 1 << 20


def _parameters(folder: Path) -> int:
    from safetensors.numpy import load_file

    return sum(array.size for array in load_file(str(folder / "model.safetensors")).values())


def test_local_weights_from_safetensors_headers():
    total, dtypes = weights_metadata(EXAMPLE)
    count = _parameters(EXAMPLE)
    assert dtypes == {"F32": count} and total == 4 * count
    assert total < (EXAMPLE / "model.safetensors").stat().st_size  # the header is not weights


def test_hub_weights_over_http_match_and_sharded_repos_sum(hub, tmp_path):
    repo = f"user/preflight-{uuid.uuid4().hex[:8]}"
    hub.seed_repo(repo, EXAMPLE)
    assert weights_metadata(repo) == weights_metadata(EXAMPLE)

    # A sharded checkpoint: model.safetensors.index.json + two shards, read through their headers only.
    import json

    from safetensors.numpy import load_file, save_file

    tensors = load_file(str(EXAMPLE / "model.safetensors"))
    names = sorted(tensors)
    half = len(names) // 2
    shards = {"model-00001-of-00002.safetensors": names[:half], "model-00002-of-00002.safetensors": names[half:]}
    files = {"config.json": (EXAMPLE / "config.json").read_bytes()}
    weight_map = {}
    for shard, keys in shards.items():
        save_file({k: tensors[k] for k in keys}, str(tmp_path / shard))
        files[shard] = (tmp_path / shard).read_bytes()
        weight_map.update({k: shard for k in keys})
    files["model.safetensors.index.json"] = json.dumps({"metadata": {}, "weight_map": weight_map}).encode()
    sharded = f"user/sharded-{uuid.uuid4().hex[:8]}"
    hub.seed_repo(sharded, files)
    assert weights_metadata(sharded) == weights_metadata(EXAMPLE)


def test_estimates_follow_the_documented_multipliers(tmp_path):
    bert, llama = load_recipe(EXAMPLE), load_recipe(LLAMA)
    weights, _ = weights_metadata(EXAMPLE)
    onnx = estimate(EXAMPLE, [bert.target("onnx")], tmp_path)
    # float32 on disk: mapped, so the gate hands the model's pages back before the artifact's runtime opens
    factor = format_backend("onnx").memory_factor - MAPPED_GATE_RELEASE
    assert onnx.memory_needed == RUNTIME_MB * MB + int(weights * factor)
    assert onnx.disk_needed == int(weights * DISK_FACTOR)
    both = estimate(EXAMPLE, [bert.target("onnx"), bert.target("pt2")], tmp_path)
    assert both.memory_needed == onnx.memory_needed  # targets run one after another: the largest one counts
    assert both.disk_needed == 2 * onnx.disk_needed
    llama_weights, _ = weights_metadata(LLAMA)
    single = estimate(LLAMA, [llama.target("onnx-generation")], tmp_path)  # the example's single graph
    assert single.disk_needed == int(llama_weights * DISK_FACTOR)
    data = copy.deepcopy(llama.data)
    data["targets"]["onnx-generation"]["generation"] = {"single_graph": False}
    pair = estimate(LLAMA, [Recipe(data, llama.source).target("onnx-generation")], tmp_path)
    assert pair.disk_needed == int(llama_weights * DISK_FACTOR * 2)  # prefill and decode graphs
    factor = format_backend("onnx").memory_factor  # one generation graph holds what a forward export does; two, more
    assert single.memory_needed == RUNTIME_MB * MB + int(llama_weights * (factor - MAPPED_GATE_RELEASE))
    pair_factor = factor * GENERATION_FACTOR - MAPPED_GATE_RELEASE
    assert pair.memory_needed == RUNTIME_MB * MB + int(llama_weights * pair_factor)
    assert onnx.memory_available and onnx.disk_available and onnx.fits


def test_the_llm_runner_program_is_estimated_as_one_graph(tmp_path):
    """An ExecuTorch generation target that says nothing of its layout is ExecuTorch's LLM runner program: one
    program that holds its cache, saved once, so it holds the weights as a forward export does (Llama-3.2-1B's config
    at full depth was refused on a 24 GiB machine at 1.5 times that: tests/test_full_depth.py). `single_graph: false`
    keeps the engine's prefill and decode pair: two."""
    llama = load_recipe(LLAMA)
    weights, _ = weights_metadata(LLAMA)
    factor = format_backend("executorch").memory_factor - MAPPED_GATE_RELEASE  # float32 on disk: mapped
    data = copy.deepcopy(llama.data)
    data["targets"]["pte-generation"].pop("generation")
    runner = estimate(LLAMA, [Recipe(data, llama.source).target("pte-generation")], tmp_path)
    assert runner.memory_needed == RUNTIME_MB * MB + int(weights * factor)
    assert runner.disk_needed == int(weights * DISK_FACTOR)
    data["targets"]["pte-generation"]["generation"] = {"single_graph": False}
    pair = estimate(LLAMA, [Recipe(data, llama.source).target("pte-generation")], tmp_path)
    pair_factor = (factor + MAPPED_GATE_RELEASE) * GENERATION_FACTOR - MAPPED_GATE_RELEASE
    assert pair.memory_needed == RUNTIME_MB * MB + int(weights * pair_factor)
    assert pair.disk_needed == int(weights * DISK_FACTOR * 2)


def test_a_job_exported_from_its_structure_is_estimated_stage_by_stage(tmp_path):
    """A process whose targets are all traced without weights, from a local safetensors checkpoint (issue 45): the
    libraries and the twin at the load, the twin run at the plan (a placeholder copied whole at a time), the
    weightless graph at the export, the largest tensor at the save, and at the gate the larger of the reference's
    kept blocks (within the budget; none where the artifact is checked in a process of its own, an ONNX generation
    target) and the artifact's weights as its runtime maps them (half for a float16 ONNX target); anything else, the
    weights times the format's factor."""
    from hfexport.job.preflight import (
        LIBRARIES_MB,
        STRUCTURE_GATE_TENSORS,
        STRUCTURE_MAPPED,
        STRUCTURE_PLAN_TENSORS,
        STRUCTURE_RELOAD,
        STRUCTURE_SAVE_TENSORS,
        VOCABULARY_BLOCK,
        largest_tensor_bytes,
        loaded_bytes,
        structure_stages,
    )

    from hfexport.formats.programs import format_program
    from hfexport.job.structure import traced_without_weights as traced

    llama = load_recipe(LLAMA)
    weights = weights_metadata(LLAMA)
    loaded, largest, libraries = loaded_bytes(*weights), largest_tensor_bytes(LLAMA), LIBRARIES_MB * MB
    data = copy.deepcopy(llama.data)
    data["targets"]["fp16"] = {**data["targets"]["onnx-generation"], "dtype": "float16"}
    generation, fp16 = llama.target("onnx-generation"), Recipe(data, llama.source).target("fp16")
    budget = 64 << 30
    result = estimate(LLAMA, [generation], tmp_path, max_memory=budget, structure=traced, streamed_gate=True)
    export = libraries + int(format_program("onnx").structure_export_memory * loaded)
    assert result.memory_stages == {"load_model": libraries, "plan": libraries + STRUCTURE_PLAN_TENSORS * largest,
                                    "export": export,
                                    "save": export + STRUCTURE_SAVE_TENSORS * largest,
                                    # the artifact checked in a process of its own, counted beside the references
                                    "verify": libraries + max(loaded + STRUCTURE_GATE_TENSORS * largest,
                                                              ARTIFACT_PROCESS + loaded)}
    assert result.memory_needed == max(result.memory_stages.values())
    vocabulary = json.loads((LLAMA / "config.json").read_text())["vocab_size"]
    arrays = __import__("safetensors.numpy", fromlist=["load_file"]).load_file(str(LLAMA / "model.safetensors"))
    # a vocabulary's table (read in blocks of rows by the writers and the streamed reference) counts as one block
    assert largest == max(4 * array.size if array.ndim != 2 or array.shape[0] != vocabulary else
                          min(4 * array.size, VOCABULARY_BLOCK) for array in arrays.values())
    tight = libraries + (1 << 30) + loaded // 4  # the reference keeps a quarter of the weights, the artifact maps half
    half = estimate(LLAMA, [fp16], tmp_path, max_memory=tight, structure=traced, streamed_gate=True).memory_stages
    assert half["verify"] == libraries + max(loaded // 4 + STRUCTURE_GATE_TENSORS * largest,
                                             ARTIFACT_PROCESS + loaded // 2)
    # a gate that checks its artifact in this process (an OpenVINO decode exported without state): the reference
    # keeps what the budget leaves (a quarter); with its state (the default), in a process of its own
    data["targets"]["stateless"] = {**data["targets"]["openvino-generation"], "options": {
        **data["targets"]["openvino-generation"].get("options", {}), "stateful": False}}
    openvino, stateless = llama.target("openvino-generation"), Recipe(data, llama.source).target("stateless")
    mapped = int(STRUCTURE_MAPPED * format_program("openvino").mapped_weight_bytes(stateless, loaded))
    kept = structure_stages([stateless], loaded, largest, tight, streamed_gate=True)
    assert kept["verify"] == libraries + max(loaded // 4 + STRUCTURE_GATE_TENSORS * largest, mapped)
    apart = structure_stages([openvino], loaded, largest, tight, streamed_gate=True)
    assert apart["verify"] == libraries + max(loaded // 4 + STRUCTURE_GATE_TENSORS * largest, ARTIFACT_PROCESS + mapped)
    loads = estimate(LLAMA, [generation], tmp_path, structure=traced, streamed_gate=False).memory_stages
    # latency timed: the gate loads the model (float32 on disk: mapped, nothing widened) where the export left some
    # behind, and hands its mapped pages back before the artifact's runtime maps its weights (MAPPED_GATE_RELEASE)
    assert loads["load_model"] == libraries + int(STRUCTURE_RELOAD * loaded)
    assert loads["verify"] == libraries + max(loaded + STRUCTURE_GATE_TENSORS * largest, loaded)
    mixed = estimate(LLAMA, [generation, llama.target("pt2")], tmp_path, structure=traced, streamed_gate=True)
    assert set(mixed.memory_stages) == {"load_model", "export"}  # the .pt2 target loads the model: as before
    assert set(estimate(LLAMA, [generation], tmp_path).memory_stages) == {"load_model", "export"}


def test_not_enough_memory_is_refused_before_loading(monkeypatch, tmp_path):
    monkeypatch.setenv("HFEXPORT_MEMORY_LIMIT_MB", "1")
    steps: list[Step] = []
    with pytest.raises(PreflightError) as error:
        run_job(EXAMPLE, tmp_path / "out", targets=["onnx"], progress=steps.append)
    message = str(error.value)
    assert "not enough memory: about" in message and "needed" in message and "1.0 MB available" in message
    assert "--no-preflight" in message and "onnx/forward" in message
    assert not any(step.step == "load_model" for step in steps)
    assert not (tmp_path / "out" / "onnx").exists()


def test_not_enough_disk_is_refused(monkeypatch, tmp_path):
    monkeypatch.setenv("HFEXPORT_DISK_LIMIT_MB", "0.01")
    with pytest.raises(PreflightError, match=r"not enough disk space in .*needed .*free"):
        run_job(EXAMPLE, tmp_path / "out", targets=["onnx", "pt2"])


def test_cli_refusal_is_one_line_and_no_preflight_bypasses_it(cli, tmp_path, monkeypatch):
    run = cli("export", str(EXAMPLE), "--target", "pt2", "-o", str(tmp_path / "out"),
              env={"HFEXPORT_MEMORY_LIMIT_MB": "1"})
    assert run.returncode == 2 and "Traceback" not in run.stderr
    assert "not enough memory" in run.stderr and "--no-preflight" in run.stderr
    assert not (tmp_path / "out" / "pt2").exists()

    monkeypatch.setenv("HFEXPORT_MEMORY_LIMIT_MB", "1")
    report = run_job(EXAMPLE, tmp_path / "out", targets=["pt2"], preflight=False, verify=False)
    assert report.targets["pt2"].status == "ok" and (tmp_path / "out" / "pt2" / "model.pt2").is_file()


def test_bad_override_is_a_clear_error(monkeypatch, tmp_path):
    monkeypatch.setenv("HFEXPORT_MEMORY_LIMIT_MB", "lots")
    with pytest.raises(PreflightError, match="HFEXPORT_MEMORY_LIMIT_MB='lots' is not a number of megabytes"):
        run_job(EXAMPLE, tmp_path / "out", targets=["onnx"])


def test_an_executorch_program_planned_beyond_the_memory_is_refused_before_its_export(session_dir, monkeypatch,
                                                                                      tmp_path):
    """ExecuTorch allocates its memory plan, sized for the dims' upper bounds, when a program loads: a generation
    target whose bounded plan would not fit is refused after the plan, before the export, naming the bounds, the
    largest planned tensor and what to change (tiny Whisper at batch 8 x 64 positions over a 1 MB limit)."""
    from hfexport.files import human_bytes
    from hfexport.models import load_model
    from hfexport.plan.memory_plan import PLAN_OVER_LARGEST
    from hfexport.testing.models import make_model

    folder = session_dir / "tiny-whisper"  # the session's copy (test_onnx_seq2seq, test_plan)
    if not (folder / "export_config.json").is_file():
        make_model("tiny-whisper", folder)
    model = load_model(folder, load_recipe(folder))  # loaded: the job's weight preflight is skipped, not the plan's
    monkeypatch.setenv("HFEXPORT_MEMORY_LIMIT_MB", "1")
    steps: list[Step] = []
    report = run_job(folder, tmp_path / "out", targets=["executorch-generation"], model_object=model,
                     progress=steps.append)
    target = report.targets["executorch-generation"]
    encoder = model.config.max_source_positions  # the encoder's length, as Whisper fixes it
    largest = 8 * 4 * encoder * encoder * 4
    assert target.status == "error" and target.error == (
        "targets.executorch-generation: ExecuTorch plans every tensor's memory for its dims' upper bounds (batch <= 8, "
        f"sequence <= 64) and allocates it when the program loads: its encoder self-attention scores [8, 4, {encoder}, "
        f"{encoder}] float32 alone are {human_bytes(largest)}, about {human_bytes(largest * PLAN_OVER_LARGEST)} in "
        "all, and 1.0 MB are available; lower the bounds in the recipe: `generation.max_cache_len`, or "
        "`dynamic_shapes` with named dims and their `dims` (the default batch bound is at least 8, the verifier's "
        "probe)"), target.error
    assert not any(step.step == "export" for step in steps)
    assert not (tmp_path / "out" / "executorch-generation").exists()


@pytest.mark.skipif(not __import__("hfexport.testing.cgroup", fromlist=["available"]).available(),
                    reason="needs a writable cgroup v1 memory controller (root)")
def test_a_cgroups_page_cache_of_what_the_job_read_counts_as_available(tmp_path):
    """The job reads its checkpoint before the preflight (the cache key hashes the shards): that page cache, charged
    to the job's cgroup, is reclaimable, so it must not read as used (the real-vocabulary 1B was refused in its 3 GB
    cgroup with 756 MB "available")."""
    import subprocess
    import sys

    from hfexport.testing.cgroup import evict, memory_cgroup

    data = tmp_path / "shard.bin"
    data.write_bytes(os.urandom(1 << 20) * 256)  # 256 MB
    evict(tmp_path)
    probe = ("import sys; from pathlib import Path; from hfexport.job import preflight; "
             "Path(sys.argv[1]).read_bytes(); print(preflight.available_memory())")
    with memory_cgroup(1 << 30) as group:
        run = subprocess.run([sys.executable, "-c", probe, str(data)], preexec_fn=group.enter, capture_output=True,
                             text=True, timeout=120)
    assert run.returncode == 0, run.stderr[-2000:]
    assert group.max_usage > 256 << 20  # the file's pages were charged to the cgroup
    assert int(run.stdout.split()[-1]) > (1 << 30) - (200 << 20), run.stdout  # and still count as available


@pytest.mark.skipif(not __import__("hfexport.testing.cgroup", fromlist=["available"]).available(),
                    reason="needs a writable cgroup v1 memory controller (root)")
def test_a_memory_cgroup_ends_what_a_timed_out_child_left_in_it():
    """A child killed by its timeout leaves its own children in the cgroup: they are ended and the cgroup removed."""
    import subprocess
    import sys

    from hfexport.testing.cgroup import memory_cgroup

    spawn = "import subprocess, sys, time; subprocess.Popen([sys.executable, '-c', 'import time; time.sleep(600)']); " \
            "time.sleep(600)"
    with memory_cgroup(1 << 30) as group:
        with pytest.raises(subprocess.TimeoutExpired):
            subprocess.run([sys.executable, "-c", spawn], preexec_fn=group.enter, timeout=3)
        left = [int(pid) for pid in (group.folder / "cgroup.procs").read_text().split()]
        assert left  # the grandchild outlived its killed parent
    assert not group.folder.exists()
    for pid in left:
        assert not Path(f"/proc/{pid}").exists() or "zombie" in Path(f"/proc/{pid}/status").read_text().lower()
