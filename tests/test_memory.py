"""Memory per stage (hfexport.job.memory): each stage's own peak RSS, measured by the kernel, in the report, the CLI
and the Markdown beside the preflight's estimate; `--max-memory` refuses a job that cannot fit before any weight is
read, naming the stage and the estimate."""

from __future__ import annotations

import json
import resource
import time
from pathlib import Path

import pytest
from hfexport.files import current_rss
from hfexport.job.memory import SAMPLE_S, StageMemory, drop_mapped_weights
from hfexport.job.run import run_job
from hfexport.progress import Step
from hfexport.report.data import JobReport, TargetReport
from hfexport.report.markdown import memory_line, report_markdown

EXAMPLE = Path(__file__).resolve().parents[1] / "examples" / "tiny-bert"
MB = 1 << 20


def _touch(size: int) -> bytearray:
    block = bytearray(size)
    for offset in range(0, size, 4096):  # resident: every page written
        block[offset] = 1
    time.sleep(10 * SAMPLE_S)  # held for a few sampling periods (a shorter-lived allocation can be missed)
    return block


def test_each_stage_gets_its_own_peak_and_the_process_peak_stays_the_kernels():
    report = JobReport(source={"model": "m"})
    report.targets["t"] = TargetReport(target="t", export_format="onnx", mode="forward")
    steps: list[Step] = []
    tracker = StageMemory(steps.append, report)
    assert tracker.per_stage  # Linux: /proc/self/statm
    tracker(Step("load_model", "start"))
    tracker(Step("load_model", "done"))
    tracker(Step("export", "start", "t"))
    block = _touch(300 * MB)
    del block
    tracker(Step("export", "done", "t"))
    tracker(Step("verify", "start", "t"))
    tracker(Step("probe", "done", "t"))  # not a stage: forwarded, not measured
    tracker(Step("verify", "done", "t"))
    peaks = report.targets["t"].memory["peak_rss_mb"]
    assert peaks["export"] - peaks["verify"] > 250, peaks
    assert report.memory["peak_rss_mb"]["load_model"] < peaks["export"]
    # the kernel's high-water mark is left alone: ru_maxrss (wait4, time -v, the report's peak_rss_mb) keeps the peak
    assert resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024 >= peaks["export"] - 1  # statm vs hiwater
    assert [step.step for step in steps] == ["load_model", "load_model", "export", "export", "verify", "probe",
                                             "verify"]


def test_a_kept_models_mapped_weights_leave_the_resident_set_and_read_back_the_same(tmp_path):
    """The gate of a job that keeps its model drops the pages still the checkpoint's file pages (issue 45) once its
    eager side is done: they leave RSS and read back the same bytes; a page the process wrote stays as written."""
    import torch

    path = tmp_path / "weights.bin"
    values = torch.arange(1 << 22, dtype=torch.float32)  # 16 MB
    values.numpy().tofile(path)
    model = torch.nn.Module()
    model.weight = torch.nn.Parameter(torch.from_file(str(path), shared=False, size=1 << 22), requires_grad=False)
    model.weight[0] = -1.0  # written: a copy-on-write page, no longer the file's
    assert torch.equal(model.weight[1:], values[1:])  # every page read: resident
    before = current_rss()
    dropped = drop_mapped_weights(model)
    assert dropped >= (16 << 20) - 2 * 4096 - 4096 and current_rss() < before - (8 << 20)
    assert model.weight[0] == -1.0 and torch.equal(model.weight[1:], values[1:])


def test_an_artifacts_mapped_files_leave_the_resident_set_once_loaded(tmp_path):
    """What the gate does once a runtime that copies the weights it mapped has loaded the artifact (OpenVINO's CPU
    plugin repacks its `.bin`): the pages of every mapping of a file in the artifact's folder are handed back and
    read again, the same bytes, where the runtime reads them again."""
    import mmap

    from hfexport.files import drop_mapped_folder

    data = bytes(range(256)) * (1 << 16)  # 16 MB
    (tmp_path / "model.bin").write_bytes(data)
    with open(tmp_path / "model.bin", "rb") as handle:
        mapped = mmap.mmap(handle.fileno(), 0, access=mmap.ACCESS_READ)
    assert mapped[:] == data  # every page read: resident
    before = current_rss()
    assert drop_mapped_folder(tmp_path) >= len(data) - 4096 and current_rss() < before - (8 << 20)
    assert mapped[:] == data
    mapped.close()


def test_an_artifacts_read_only_mapped_pages_leave_the_resident_set_while_it_loads(tmp_path):
    """The gate's compile of an OpenVINO artifact (`dropping_mapped_folder`): pages the runtime already read leave the
    resident set while it still runs (read-only mappings only), and read again are the same bytes."""
    import mmap

    from hfexport.files import dropping_mapped_folder

    data = bytes(range(256)) * (1 << 16)  # 16 MB
    (tmp_path / "model.bin").write_bytes(data)
    with open(tmp_path / "model.bin", "rb") as handle:
        mapped = mmap.mmap(handle.fileno(), 0, access=mmap.ACCESS_READ)
    def same() -> bool:  # read in 1 MB pieces: no 16 MB copy to sit in the heap and blur the resident set
        return all(mapped[start:start + (1 << 20)] == data[start:start + (1 << 20)]
                   for start in range(0, len(data), 1 << 20))

    with dropping_mapped_folder(tmp_path, every=0.01):
        before = current_rss()
        assert same()  # every page read: resident until the thread drops them
        deadline = time.monotonic() + 5
        while current_rss() > before + (8 << 20) and time.monotonic() < deadline:
            time.sleep(0.02)
        assert current_rss() < before + (8 << 20)
        assert same()
    assert same()
    mapped.close()


def test_stages_nest_an_outer_stage_keeps_an_inner_peak():
    report = JobReport(source={"model": "m"})
    report.targets["t"] = TargetReport(target="t", export_format="onnx", mode="forward")
    tracker = StageMemory(lambda step: None, report)
    tracker(Step("export", "start", "t"))
    tracker(Step("save", "start", "t"))
    block = _touch(200 * MB)
    del block
    tracker(Step("save", "done", "t"))
    tracker(Step("export", "done", "t"))
    peaks = report.targets["t"].memory["peak_rss_mb"]
    assert peaks["export"] >= peaks["save"] > 200


def test_a_job_reports_each_stage_and_the_estimate_beside_it(tmp_path):
    report = run_job(EXAMPLE, tmp_path / "out", targets=["onnx"], latency=False)
    assert report.targets["onnx"].status == "ok"
    job = report.memory
    assert set(job["estimate_mb"]) == {"load_model", "export"} and job["available_mb"] > 0
    assert job["peak_rss_mb"]["load_model"] > 0 and job["per_stage"] is True
    stages = report.targets["onnx"].memory["peak_rss_mb"]
    assert {"plan", "export", "save", "verify"} <= set(stages)
    assert max(stages.values()) <= report.peak_rss_mb + 1  # sampled (statm) vs the kernel's high-water mark
    saved = json.loads((tmp_path / "out" / "export_report.json").read_text())  # schema-checked when written
    assert saved["memory"]["estimate_mb"] == job["estimate_mb"]
    assert saved["targets"]["onnx"]["memory"]["peak_rss_mb"] == stages
    target_file = json.loads((tmp_path / "out" / "onnx" / "export_report.json").read_text())
    assert target_file["targets"]["onnx"]["memory"]["peak_rss_mb"]["export"] == stages["export"]
    line = memory_line(report)
    assert line.startswith("Peak memory: load ") and "onnx: " in line and "gate " in line
    assert "preflight estimate: load " in line and ", trace+convert " in line
    assert "write weights " in line.split("preflight")[0]
    assert line in report_markdown(report)  # the PR text and the job summary

    from hfexport.surfaces.space import outcome_markdown

    assert line in outcome_markdown(report)  # the Space's outcome


def test_cli_shows_the_stages_and_max_memory_refuses_before_loading(cli, tmp_path):
    run = cli("export", str(EXAMPLE), "--target", "onnx", "-o", str(tmp_path / "out"), "--no-latency",
              "--max-memory", "64GB")
    assert run.returncode == 0, run.stderr
    assert "Peak memory: load " in run.stdout and "preflight estimate" in run.stdout and "budget 68.7 GB" in run.stdout

    run = cli("export", str(EXAMPLE), "--target", "onnx", "-o", str(tmp_path / "small"), "--max-memory", "100MB",
              "--no-preflight")  # the budget is kept even without the preflight's own check
    assert run.returncode == 2 and "Traceback" not in run.stderr
    refusal = [line for line in run.stderr.splitlines() if line.startswith("error:")]
    assert len(refusal) == 1, run.stderr
    assert "needed at the trace+convert stage" in refusal[0] and "onnx/forward" in refusal[0]
    assert "the --max-memory budget is 104.9 MB" in refusal[0] and "raise --max-memory" in refusal[0]
    assert "load_model" not in run.stderr and not (tmp_path / "small" / "onnx").exists()

    run = cli("export", str(EXAMPLE), "-o", str(tmp_path / "x"), "--max-memory", "lots")
    assert run.returncode == 2 and "not a memory size" in run.stderr and "Traceback" not in run.stderr


def _headers_only_checkpoint(folder: Path, zoo_name: str) -> Path:
    """A zoo model's published config at full size (depth and vocabulary) with a safetensors file whose header lists
    every tensor and whose data is a hole (sparse: no disk, nothing to read): what the preflight reads, and only that."""
    import struct

    import torch
    from transformers import AutoConfig, AutoModelForCausalLM

    from hfexport.testing.zoo import ZOO, recipe

    fields = {k: v for k, v in ZOO[zoo_name].config.items() if k != "transformers_version"}
    config = AutoConfig.for_model(fields.pop("model_type"), **fields)
    folder.mkdir(parents=True)
    config.save_pretrained(folder)
    target = recipe()
    target["targets"]["onnx-generation"]["dtype"] = "float16"
    (folder / "export_config.json").write_text(json.dumps(target))
    with torch.device("meta"):
        state = AutoModelForCausalLM.from_config(config).state_dict()
    if config.tie_word_embeddings:
        state.pop("lm_head.weight", None)
    header, offset = {}, 0
    for key, tensor in state.items():
        size = tensor.numel() * 2
        header[key] = {"dtype": "BF16", "shape": list(tensor.shape), "data_offsets": [offset, offset + size]}
        offset += size
    data = json.dumps(header).encode()
    data += b" " * (-len(data) % 8)
    with open(folder / "model.safetensors", "wb") as handle:
        handle.write(struct.pack("<Q", len(data)) + data)
        handle.truncate(8 + len(data) + offset)
    return folder


@pytest.mark.slow  # ~80 s under load: the job hashes the 2.5 GB (sparse) checkpoint for its cache key, twice
def test_llama_3_2_1b_above_the_budget_is_refused_before_a_weight_is_read(cli, tmp_path):
    from hfexport.testing import cgroup

    model = _headers_only_checkpoint(tmp_path / "llama", "llama-3.2-1b")
    assert (model / "model.safetensors").stat().st_size > 2_400_000_000  # 1.24B parameters in bfloat16
    run = cli("export", str(model), "-o", str(tmp_path / "out"), "--max-memory", "3GB")
    assert run.returncode == 2 and "Traceback" not in run.stderr, run.stderr
    refusal = [line for line in run.stderr.splitlines() if line.startswith("error:")]
    assert len(refusal) == 1, run.stderr
    assert "not enough memory: about" in refusal[0] and "needed at the gate stage" in refusal[0]
    assert "weights 4.9 GB as loaded, at float32" in refusal[0] and "onnx/generation" in refusal[0]
    assert "the --max-memory budget is 3.2 GB" in refusal[0]
    assert "load_model" not in run.stderr and not (tmp_path / "out" / "onnx-generation").exists()

    if not cgroup.available():
        return
    import subprocess
    import sys

    root = Path(__file__).resolve().parents[1]
    with cgroup.memory_cgroup(3 << 30) as group:  # the limit itself, read from cgroup v1, without --max-memory
        run = subprocess.run([sys.executable, "-m", "hfexport", "export", str(model), "-o", str(tmp_path / "out")],
                             capture_output=True, text=True, preexec_fn=group.enter, timeout=600,
                             env={**__import__("os").environ, "PYTHONPATH": str(root / "library")})
    assert run.returncode == 2 and "not enough memory" in run.stderr and "available" in run.stderr, run.stderr
    assert "load_model" not in run.stderr and group.failcnt == 0 and 0 < group.max_usage < 3 << 30


# ── the stages as a reader sees them, and the estimate's stage list (cheap: no export) ──────────────────────────


def test_memory_line_names_the_stages_as_a_user_reads_them_with_the_estimate_and_budget():
    report = JobReport(source={"model": "m", "recipe_sha256": "0" * 64}, memory={
        "peak_rss_mb": {"load_model": 900.0},
        "estimate_mb": {"load_model": 1000.0, "export": 700.0, "save": 1200.0, "verify": 1300.0, "variants": 2000.0},
        "max_memory_mb": 3072.0})
    report.targets["t"] = TargetReport(target="t", export_format="onnx", mode="generation", memory={
        "peak_rss_mb": {"plan": 800.0, "export": 750.0, "save": 1100.0, "verify": 1400.0, "runtimes": 1000.0,
                        "variants": 1900.0}, "children_peak_rss_mb": {"runtimes": 600.0}})
    line = memory_line(report)
    assert line == ("Peak memory: load 943.7 MB · t: trace+convert 786.4 MB, write weights 1.2 GB, gate 1.5 GB, "
                    "runtimes 1.0 GB, quantize 2.0 GB (runtime processes up to 629.1 MB) · preflight estimate: "
                    "load 1.0 GB, trace+convert 734.0 MB, write weights 1.3 GB, gate 1.4 GB, quantize 2.1 GB "
                    "(budget 3.2 GB)")
    assert line in report_markdown(report) and line in report_markdown(report, publication=True)
    assert memory_line(JobReport(source={"model": "m"})) is None  # nothing measured: no line
    # a job exported from its structure: the plan (which runs the twin) estimated, so shown beside its estimate
    report.memory["estimate_mb"] = {"load_model": 560.0, "plan": 624.0, "export": 700.0}
    assert memory_line(report) == ("Peak memory: load 943.7 MB · t: plan 838.9 MB, trace+convert 786.4 MB, write "
                                   "weights 1.2 GB, gate 1.5 GB, runtimes 1.0 GB, quantize 2.0 GB (runtime processes "
                                   "up to 629.1 MB) · preflight estimate: load 587.2 MB, plan 654.3 MB, trace+convert "
                                   "734.0 MB (budget 3.2 GB)")


def _targets(document: dict) -> list:
    from hfexport.recipe.loading import load_recipe

    recipe = load_recipe({"recipe_version": 1, "task": "text-generation", "sample_inputs": {"text": ["Hello."]},
                          "targets": document})
    return [recipe.target(name) for name in document]


LLAMA = Path(__file__).resolve().parents[1] / "examples" / "tiny-llama"


def test_the_estimate_has_a_quantize_stage_where_a_target_has_variants(tmp_path):
    from hfexport.job import preflight
    from hfexport.job.structure import traced_without_weights

    weights = (100 * MB, {"F32": 25 * MB})
    plain, = _targets({"ov": {"export_format": "openvino", "mode": "generation"}})
    variants, = _targets({"ov": {"export_format": "openvino", "mode": "generation", "variants": ["int8", "int4"]}})
    assert set(preflight.estimate(LLAMA, [plain], tmp_path, weights=weights).memory_stages) == {"load_model", "export"}
    stages = preflight.estimate(LLAMA, [variants], tmp_path, weights=weights).memory_stages
    assert set(stages) == {"load_model", "export", "variants"}  # the loaded path: NNCF on the written IR
    factor = max(preflight.VARIANT_MEMORY[name] for name in ("int8", "int4"))
    assert stages["variants"] == preflight.LIBRARIES_MB * MB + 100 * MB + int(factor * 100 * MB)
    assert stages["load_model"] == preflight.LIBRARIES_MB * MB  # float32 on disk: mapped, read by the export

    # from the model's structure (ONNX): the gate of a target with variants loads the model (each variant's gate
    # reads it), so its gate stage holds the weights whatever the budget, as the quantize stage does
    onnx, = _targets({"onnx": {"export_format": "onnx", "mode": "generation", "variants": ["q8", "q4"]}})
    stages = preflight.estimate(LLAMA, [onnx], tmp_path, weights=weights, structure=traced_without_weights,
                                streamed_gate=True, max_memory=1 << 30).memory_stages
    assert set(stages) == {"load_model", "plan", "export", "save", "verify", "variants"}
    assert stages["verify"] >= preflight.LIBRARIES_MB * MB + 100 * MB
    assert stages["variants"] == preflight.LIBRARIES_MB * MB + 100 * MB + int(
        max(preflight.VARIANT_MEMORY[name] for name in ("q8", "q4")) * 100 * MB)


def test_a_job_whose_variants_cannot_fit_is_refused_naming_the_quantize_stage(tmp_path, monkeypatch):
    from hfexport.errors import PreflightError
    from hfexport.job import preflight

    monkeypatch.setitem(preflight.VARIANT_MEMORY, "8da4w", 10.0)  # a variant whose making needs the most
    executorch, = _targets({"et": {"export_format": "executorch", "mode": "generation", "variants": ["8da4w"]}})
    need = preflight.estimate(LLAMA, [executorch], tmp_path, weights=(2 << 30, {"F32": 1 << 29})).memory_stages
    assert max(need, key=need.get) == "variants", need
    with pytest.raises(PreflightError, match=r"needed at the quantize stage \(weights 2\.1 GB, the model beside the variants 8da4w made and "
                       r"gated\), the --max-memory budget is 4\.3 GB"):
        preflight.check_fits(LLAMA, [executorch], tmp_path, weights=(2 << 30, {"F32": 1 << 29}), max_memory=4 << 30)


def _benchmark():
    import importlib.util
    import sys

    benchmarks = str(Path(__file__).resolve().parents[1] / "benchmarks")
    if benchmarks not in sys.path:  # the benchmark's own harness (`_process`)
        sys.path.append(benchmarks)
    spec = importlib.util.spec_from_file_location(
        "stage_memory_variants", Path(__file__).resolve().parents[1] / "benchmarks" / "stage_memory_variants.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


@pytest.mark.slow  # SmolLM2-135M-Instruct's real weights: an export, its gate and two variants (1-3 min each)
@pytest.mark.parametrize("case", ["onnx", "openvino"])
def test_smollm2_each_stage_is_within_a_quarter_of_the_preflight_estimate(case, smollm2, cli, tmp_path):
    """The job's report holds the preflight's estimate per stage and each stage's measured peak (a fresh process:
    the CLI); each estimated stage is within ±25% of its peak (benchmarks/stage_memory_variants.py's comparison,
    where the estimate of a job exported from the loaded model stands for its export, save and gate together)."""
    benchmark = _benchmark()
    recipe = tmp_path / "recipe.json"
    recipe.write_text(json.dumps(benchmark._recipe(case)))
    run = cli("export", str(smollm2), "--recipe", str(recipe), "-o", str(tmp_path / "out"), "--no-latency",
              "--workers", "1")
    assert "Traceback" not in run.stderr, run.stderr
    report = json.loads((tmp_path / "out" / "export_report.json").read_text())
    estimate = report["memory"]["estimate_mb"]
    rows = benchmark.compare({"measured_mb": benchmark.measured(report, case)}, estimate)
    assert {"load_model", "export", "variants", "job"} <= set(rows), rows  # ONNX's from its structure: save, gate
    assert all(row["within"] for row in rows.values()), rows
    line = next(line for line in run.stdout.splitlines() if line.startswith("Peak memory: load "))
    assert "preflight estimate: load " in line and "write weights " in line, line
