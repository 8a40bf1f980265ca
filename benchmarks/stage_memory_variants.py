"""The preflight's memory estimate per stage against the peaks a job then measures, for targets that quantize
(issue 45): ONNX's q8/q4 variants and its fp16 variant, OpenVINO's int8/int4 variants (NNCF), an OpenVINO int8-weight
target (NNCF, compressed in its save: the structure path) and ExecuTorch's 8da4w variant, each a job of its own in a fresh process.

The models: SmolLM2-135M-Instruct's real weights (float32, `hfexport.testing.models.build_smollm2`, default
/tmp/hfexport-smollm2) and a depth-cut published config (`hfexport.testing.zoo`, default Llama-3.2-1B's at 2 layers:
its 128k-token embedding makes the weights 1.3 GB at float32, bfloat16 on disk, weights moved by seeded noise so the
job may export from its structure). Each job: `python -m hfexport export MODEL --recipe R -o OUT --json --no-latency
--workers 1` (`_process.run_measured`: wall, CPU, wait4 peak). The result keeps, per case, the report's measured
peaks per stage (`memory`, hfexport.job.memory: the job's `load_model`, the target's others) and the estimate the
job recorded; `compare` sets each stage's peak beside the estimate the current estimator makes (the preflight reads
metadata only, so a change of its constants is checked again without a run: `COMPARE_ONLY=1`).

Run: `PYTHONPATH=library .venv/bin/python benchmarks/stage_memory_variants.py` (env MODELS=smollm2,llama-3.2-1b,
CASES=onnx,onnx-fp16,openvino,openvino-int8,executorch, LAYERS=2, WORK) -> benchmarks/results/stage_memory_variants.json
(merged: a case run again replaces its entry). Heavy: under `flock /tmp/hfexport-heavy.lock` on a shared machine.
"""

from __future__ import annotations

import json
import os
import shutil
import sys
import tempfile
from pathlib import Path

from _process import ROOT, machine_and_versions, run_measured

RESULT = ROOT / "benchmarks" / "results" / "stage_memory_variants.json"
CASES = {
    "onnx": {"export_format": "onnx", "mode": "generation", "variants": ["q8", "q4"]},
    "onnx-fp16": {"export_format": "onnx", "mode": "generation", "variants": ["fp16"]},
    "openvino": {"export_format": "openvino", "mode": "generation", "variants": ["int8", "int4"]},
    "openvino-int8": {"export_format": "openvino", "mode": "generation",
                      "quantization": {"method": "nncf_weights", "params": {"mode": "int8_asym"}}},
    "executorch": {"export_format": "executorch", "mode": "generation", "variants": ["8da4w"]},
}
TOLERANCE = 0.25


def _model(name: str, work: Path) -> Path:
    if name == "smollm2":
        from hfexport.testing.models import build_smollm2

        return Path(build_smollm2(Path(os.environ.get("SMOLLM2", "/tmp/hfexport-smollm2"))))
    from hfexport.testing.zoo import build, make_weights_distinct

    folder = work / f"{name}-{os.environ.get('LAYERS', '2')}l"
    if not (folder / "config.json").is_file():
        build(name, folder, layers=int(os.environ.get("LAYERS", "2")))
        make_weights_distinct(folder)
    return folder


def _recipe(case: str) -> dict:
    from hfexport.testing.zoo import TEXTS

    return {"recipe_version": 1, "task": "text-generation", "default_target": case,
            "sample_inputs": {"text": list(TEXTS)}, "targets": {case: CASES[case]}}


def measured(report: dict, case: str) -> dict:
    """Each stage's peak RSS (MB) in a job's report: the job's load (its largest) and the target's stages."""
    peaks = dict((report["targets"][case].get("memory") or {}).get("peak_rss_mb") or {})
    job = (report.get("memory") or {}).get("peak_rss_mb") or {}
    if "load_model" in job:
        peaks["load_model"] = job["load_model"]
    return peaks


def current_estimate(model: Path, case: str, work: Path) -> dict:
    """The estimate (MB per stage) the current preflight makes for the case's job, as the job asks for it."""
    from hfexport.job.preflight import MB, estimate
    from hfexport.job.structure import traced_without_weights
    from hfexport.recipe.loading import load_recipe

    recipe = load_recipe(_recipe(case))
    result = estimate(model, [recipe.target(case)], work, structure=traced_without_weights, streamed_gate=True)
    return {stage: round(need / MB, 1) for stage, need in result.memory_stages.items()}


def compare(entry: dict, estimated: dict) -> dict:
    """Per stage both figures, (estimate - measured) / measured and whether it is within `TOLERANCE`; the job's
    need (the largest stage) against the largest peak too. A job exported from the loaded model has one estimate
    for its target's export, save and gate (`preflight.memory_needed`): set beside the largest of the three."""
    rows = {}
    peaks = dict(entry["measured_mb"])
    if "save" not in estimated:  # exported from the loaded model: its `export` estimate is the target's peak through
        peaks["export"] = max(peaks.get(stage, 0.0) for stage in ("export", "save", "verify"))  # its gate
    for stage, need in estimated.items():
        if stage in peaks:
            error = (need - peaks[stage]) / peaks[stage]
            rows[stage] = {"estimate_mb": need, "measured_mb": peaks[stage], "error": round(error, 3),
                           "within": abs(error) <= TOLERANCE}
    largest = max(peaks.values())
    error = (max(estimated.values()) - largest) / largest
    rows["job"] = {"estimate_mb": max(estimated.values()), "measured_mb": largest, "error": round(error, 3),
                   "within": abs(error) <= TOLERANCE}
    return rows


def main() -> None:
    models = os.environ.get("MODELS", "smollm2,llama-3.2-1b").split(",")
    cases = os.environ.get("CASES", ",".join(CASES)).split(",")
    work = Path(os.environ.get("WORK") or tempfile.mkdtemp(prefix="stage-memory-variants-"))
    result = json.loads(RESULT.read_text()) if RESULT.is_file() else {"runs": {}}
    env = {**os.environ, "PYTHONPATH": str(ROOT / "library")}
    for name in models:
        model = _model(name, work)
        for case in cases:
            key = f"{name}/{case}"
            if os.environ.get("COMPARE_ONLY"):
                if key in result["runs"]:
                    entry = result["runs"][key]
                    entry["compare"] = compare(entry, current_estimate(model, case, work))
                continue
            (work / f"{case}.json").write_text(json.dumps(_recipe(case)))
            out = work / f"out-{name}-{case}"
            shutil.rmtree(out, ignore_errors=True)
            run = run_measured([sys.executable, "-m", "hfexport", "export", str(model), "--recipe",
                                str(work / f"{case}.json"), "-o", str(out), "--json", "--no-latency", "--workers", "1"],
                               work / f"{name}-{case}.out", work / f"{name}-{case}.err", env=env)
            report_file = out / "export_report.json"
            if not report_file.is_file():
                result["runs"][key] = {**run, "error": (work / f"{name}-{case}.err").read_text()[-2000:]}
                continue
            report = json.loads(report_file.read_text())
            target = report["targets"][case]
            entry = {**run, "status": target["status"], "error": target.get("error"),
                     "recorded_estimate_mb": (report.get("memory") or {}).get("estimate_mb"),
                     "measured_mb": measured(report, case),
                     "children_peak_rss_mb": (target.get("memory") or {}).get("children_peak_rss_mb"),
                     "timings": target.get("timings"), "peak_rss_mb_report": report.get("peak_rss_mb"),
                     "variants": [{k: v.get(k) for k in ("name", "verdict", "bytes")} for v in target.get("variants") or []],
                     "runtimes": [{k: c.get(k) for k in ("runtime", "verdict")} for c in target.get("runtimes") or []]}
            entry["compare"] = compare(entry, current_estimate(model, case, work))
            result["runs"][key] = entry
            result.update(machine_and_versions())
            RESULT.write_text(json.dumps(result, indent=2) + "\n")
            print(key, json.dumps(entry["compare"]), flush=True)
    RESULT.write_text(json.dumps(result, indent=2) + "\n")


if __name__ == "__main__":
    main()
