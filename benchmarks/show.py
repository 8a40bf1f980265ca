"""Issue 15 benchmark: where `hfexport show` spends its time, and `show` (the recipe only) vs `show --resolve`.

`show --resolve` (the old `show`) loads the model to resolve the plan. Measured in one fresh process, phase by phase:
importing the CLI, importing the engine (`transformers.exporters`' exporter classes: torch, torch._dynamo, torchao,
...), reading the recipe, loading the model, building the plan. Then the wall time of fresh `hfexport show` and
`hfexport show --resolve` processes on examples/tiny-bert (target onnx), alternated, ROUNDS each, medians.
Target: `show` in about a second.

Run: `.venv/bin/python benchmarks/show.py` -> benchmarks/results/show.json

`--imports BEFORE`: issue 31, `hfexport show` and `hfexport validate` with the CLI importing only what each command
runs vs BEFORE, the `library/` folder of a checkout where the CLI imported the whole job stack (e.g.
`git archive <commit> library | tar -x -C /tmp/before`): fresh processes, the four variants alternated, ROUNDS each
(default 9), wall, CPU and peak RSS medians and the modules each imported -> benchmarks/results/show_imports.json
"""

from __future__ import annotations

import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from _process import alternate, machine, ratios, run_checked, summary, write_result

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent
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


def wall(*argv: str, env: dict) -> float:
    started = time.perf_counter()
    result = subprocess.run([sys.executable, "-m", "hfexport", *argv], env=env, capture_output=True, text=True)
    seconds = time.perf_counter() - started
    if result.returncode != 0:
        raise SystemExit(f"{argv} failed: {result.stderr}")
    return seconds


MODULES = "import runpy, sys\nsys.argv = ['hfexport', *sys.argv[1:]]\ntry:\n    runpy.run_module('hfexport', " \
          "run_name='__main__')\nfinally:\n    print(len(sys.modules), file=sys.stderr)\n"


def imports(before: Path) -> dict:
    """`show` and `validate` here (lazy imports) vs `before` (the whole job stack), fresh processes alternated."""
    rounds = int(os.environ.get("ROUNDS", "9"))
    libraries = {"before": before.resolve(), "after": ROOT / "library"}
    commands = {"show": ["show", MODEL], "validate": ["validate", MODEL]}
    variants = [f"{command} ({side})" for command in commands for side in libraries]
    logs = Path(tempfile.mkdtemp(prefix="hfexport-show-imports-"))

    def run(name: str, index: int) -> dict:
        command, side = name.split(" (")
        env = {**os.environ, "PYTHONPATH": str(libraries[side.rstrip(")")])}
        figures = run_checked(name.replace(" ", "_"), [sys.executable, "-c", MODULES, *commands[command]], logs,
                              env=env)
        figures["modules"] = int((logs / f"{name.replace(' ', '_')}.err").read_text().split()[-1])
        return figures

    runs = alternate(variants, rounds, run)
    result = {
        "benchmark": "hfexport show / validate on examples/tiny-bert: the CLI importing what each command runs "
                     "(after) vs importing the whole job stack (before), fresh processes alternated",
        "rounds": rounds, "machine": machine(),
        **summary(runs, ("wall_s", "cpu_s", "peak_rss_mb", "modules")),
        "after_vs_before": {command: ratios(runs, f"{command} (after)", f"{command} (before)")
                            for command in commands},
        "runs": runs,
    }
    result["machine"]["load_avg_at_end"] = os.getloadavg()[0]
    return result


def main() -> int:
    if sys.argv[1:2] == ["--imports"]:
        result = imports(Path(sys.argv[2]))
        write_result("show_imports.json", result)
        print(json.dumps({key: result[key] for key in result if key.startswith(("median", "after"))}, indent=2))
        return 0
    env = {**os.environ, "PYTHONPATH": str(ROOT / "library")}
    phases = json.loads(subprocess.run([sys.executable, "-c", PHASES, MODEL], env=env, capture_output=True,
                                       text=True, check=True).stdout)
    rounds = int(os.environ.get("ROUNDS", "5"))
    fast, resolved = [], []
    for _ in range(rounds):
        fast.append(wall("show", MODEL, env=env))
        resolved.append(wall("show", MODEL, "--resolve", env=env))
    result = {
        "machine": machine(), "load_average": os.getloadavg()[0], "rounds": rounds,
        "model": "examples/tiny-bert", "target": "onnx",
        "phases_s (show --resolve, one process)": phases,
        "show_s": {"median": round(statistics.median(fast), 3), "runs": [round(t, 3) for t in fast]},
        "show_resolve_s": {"median": round(statistics.median(resolved), 3), "runs": [round(t, 3) for t in resolved]},
    }
    result["ratio"] = round(result["show_s"]["median"] / result["show_resolve_s"]["median"], 3)
    write_result("show.json", result)
    print(json.dumps(result, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
