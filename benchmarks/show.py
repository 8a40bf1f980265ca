"""Issue 15 benchmark: where `hfexport show` spends its time, and `show` (the recipe only) vs `show --resolve`.

`show --resolve` (the old `show`) loads the model to resolve the plan. Measured in one fresh process, phase by phase:
importing the CLI, importing the engine (`transformers.exporters`' exporter classes: torch, torch._dynamo, torchao,
...), reading the recipe, loading the model, building the plan. Then the wall time of fresh `hfexport show` and
`hfexport show --resolve` processes on examples/tiny-bert (target onnx), alternated, ROUNDS each, medians.
Target: `show` in about a second.

Run: `.venv/bin/python benchmarks/show.py` -> benchmarks/results/show.json
"""

from __future__ import annotations

import json
import os
import platform
import statistics
import subprocess
import sys
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent
ROUNDS = int(os.environ.get("ROUNDS", "5"))
MODEL = str(ROOT / "examples" / "tiny-bert")

PHASES = """
import json, sys, time
marks = [("start", time.perf_counter())]
import hfexport.surfaces.cli
marks.append(("import hfexport.surfaces.cli", time.perf_counter()))
from hfexport.export import AutoHfExporter
marks.append(("import the engine (transformers.exporters exporters: torch, dynamo, torchao)", time.perf_counter()))
exporter = AutoHfExporter.from_pretrained(sys.argv[1])
marks.append(("read and validate the recipe", time.perf_counter()))
model = exporter.load_model()
marks.append(("load the model", time.perf_counter()))
exporter.plan(model).describe()
marks.append(("build the plan (sample inputs, dims)", time.perf_counter()))
print(json.dumps({name: round(t - marks[i][1], 3) for i, (name, t) in enumerate(marks[1:])}))
"""


def cpu_name() -> str:
    for line in Path("/proc/cpuinfo").read_text().splitlines():
        if line.startswith("model name"):
            return line.split(":", 1)[1].strip()
    return platform.processor() or "unknown"


def wall(*argv: str, env: dict) -> float:
    started = time.perf_counter()
    result = subprocess.run([sys.executable, "-m", "hfexport", *argv], env=env, capture_output=True, text=True)
    seconds = time.perf_counter() - started
    if result.returncode != 0:
        raise SystemExit(f"{argv} failed: {result.stderr}")
    return seconds


def main() -> int:
    env = {**os.environ, "PYTHONPATH": str(ROOT / "library")}
    phases = json.loads(subprocess.run([sys.executable, "-c", PHASES, MODEL], env=env, capture_output=True,
                                       text=True, check=True).stdout)
    fast, resolved = [], []
    for _ in range(ROUNDS):
        fast.append(wall("show", MODEL, env=env))
        resolved.append(wall("show", MODEL, "--resolve", env=env))
    result = {
        "cpu": cpu_name(), "cores": os.cpu_count(), "load_average": os.getloadavg()[0], "rounds": ROUNDS,
        "model": "examples/tiny-bert", "target": "onnx",
        "phases_s (show --resolve, one process)": phases,
        "show_s": {"median": round(statistics.median(fast), 3), "runs": [round(t, 3) for t in fast]},
        "show_resolve_s": {"median": round(statistics.median(resolved), 3), "runs": [round(t, 3) for t in resolved]},
    }
    result["ratio"] = round(result["show_s"]["median"] / result["show_resolve_s"]["median"], 3)
    out = HERE / "results" / "show.json"
    out.write_text(json.dumps(result, indent=2) + "\n")
    print(json.dumps(result, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
