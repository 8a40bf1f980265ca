"""all-MiniLM-L6-v2, ONNX Runtime dynamic int8: which `quantize_dynamic` params keep the embeddings, on real text and
on random tokens (the figures behind hfexport's `ort_dynamic` defaults, docs/quantization.md).

hfexport exports the fp32 ONNX graph once (benchmarks/recipes/minilm.json's `onnx` target, no verification); then
`onnxruntime.quantization.quantize_dynamic` quantizes it with each params set, and each quantized graph runs on
- real text: the 8 sentences of benchmarks/quantization.py plus the recipe's 2 sample texts (padded batch), and
- random tokens: 9 x 37 ids drawn from [1000, 30000) with a fixed seed (what a random-token probe feeds),
against the eager model. Per set: cosine of `last_hidden_state` over all unpadded tokens, the worst token's cosine,
and the worst mean-pooled, L2-normalised sentence embedding (what sentence-transformers computes for this model).
Latency: every graph (fp32 included) on batch 8 x 128 random tokens, 3 warm-up calls, then ROUNDS rounds calling each
once in turn (so machine load hits all alike); ratio of medians against fp32. Whether u8s8 can saturate is a property
of the CPU (AVX2/AVX512 without VNNI: 16-bit pair sums; reduce_range's 7-bit weights keep them in range), recorded
with the CPU.

Run: `.venv/bin/python benchmarks/ort_dynamic_params.py` -> benchmarks/results/ort_dynamic_params.json
"""

from __future__ import annotations

import json
import os
import platform
import sys
from pathlib import Path

HERE = Path(__file__).resolve().parent
WORK = HERE / ".work" / "ort_dynamic_params"
ROUNDS = int(os.environ.get("ROUNDS", "15"))
PARAMS = {
    "onnxruntime defaults (per-tensor int8: u8s8)": {},
    "per_channel (u8s8)": {"per_channel": True},
    "reduce_range": {"reduce_range": True},
    "per_channel + reduce_range (hfexport default)": {"per_channel": True, "reduce_range": True},
    "weight_type uint8 (u8u8)": {"weight_type": "QUInt8"},
    "per_channel + weight_type uint8 (u8u8)": {"per_channel": True, "weight_type": "QUInt8"},
}


def main() -> dict:
    import onnxruntime
    import torch
    from onnxruntime.quantization import QuantType, quantize_dynamic
    from transformers import AutoModel, AutoTokenizer

    sys.path.insert(0, str(HERE))
    from hfexport.job.run import run_job
    from _process import machine
    from quantization import SENTENCES, minilm_dir

    folder = minilm_dir()
    recipe = json.loads((HERE / "recipes" / "minilm.json").read_text())
    output = WORK / "out"
    if not (output / "onnx" / "model.onnx").is_file():
        run_job(folder, output, recipe=recipe, targets=["onnx"], verify=False, force=True)
    source = output / "onnx" / "model.onnx"
    tokenizer = AutoTokenizer.from_pretrained(folder)
    model = AutoModel.from_pretrained(folder).eval()
    real = dict(tokenizer(SENTENCES + recipe["sample_inputs"]["text"], padding=True, return_tensors="pt"))
    generator = torch.Generator().manual_seed(0)
    ids = torch.randint(1000, 30000, (9, 37), generator=generator)
    random = {"input_ids": ids, "attention_mask": torch.ones_like(ids), "token_type_ids": torch.zeros_like(ids)}

    def embeddings(hidden, mask):
        weights = mask.unsqueeze(-1).float()
        return torch.nn.functional.normalize((hidden * weights).sum(1) / weights.sum(1), dim=-1)

    def score(got, inputs) -> dict:
        with torch.no_grad():
            want = model(**inputs).last_hidden_state
        mask = inputs["attention_mask"]
        a, b = got[mask.bool()], want[mask.bool()]
        return {"cosine": round(float(torch.nn.functional.cosine_similarity(a.flatten(), b.flatten(), dim=0)), 4),
                "worst_token_cosine": round(float(torch.nn.functional.cosine_similarity(a, b, dim=-1).min()), 4),
                "worst_embedding_cosine": round(float((embeddings(got, mask) * embeddings(want, mask)).sum(-1).min()), 4)}

    rows, sessions = [], {"fp32": onnxruntime.InferenceSession(str(source), providers=["CPUExecutionProvider"])}
    for label, params in PARAMS.items():
        kwargs = {key: getattr(QuantType, value) if key == "weight_type" else value for key, value in params.items()}
        quantized = WORK / f"q{len(rows)}.onnx"
        quantize_dynamic(str(source), str(quantized), **kwargs)
        session = onnxruntime.InferenceSession(str(quantized), providers=["CPUExecutionProvider"])
        names = [node.name for node in session.get_inputs()]
        row = {"params": label, "kwargs": params}
        for kind, inputs in (("real_text", real), ("random_tokens", random)):
            feed = {name: inputs[name].numpy() for name in names if name in inputs}
            row[kind] = score(torch.from_numpy(session.run(None, feed)[0]), inputs)
        row["u8s8"] = params.get("weight_type", "QInt8") == "QInt8"
        row["saturates_without_vnni"] = row["u8s8"] and not params.get("reduce_range", False)
        rows.append(row)
        sessions[label] = session
        print(f"{label:52s} real {row['real_text']} random {row['random_tokens']}", flush=True)
    import statistics
    import time

    latency_ids = torch.randint(1000, 30000, (8, 128), generator=generator)
    latency_feed = {"input_ids": latency_ids.numpy(), "attention_mask": torch.ones_like(latency_ids).numpy(),
                    "token_type_ids": torch.zeros_like(latency_ids).numpy()}
    feeds = {label: {node.name: latency_feed[node.name] for node in session.get_inputs()}
             for label, session in sessions.items()}
    times: dict[str, list[float]] = {label: [] for label in sessions}
    for label, session in sessions.items():
        for _ in range(3):
            session.run(None, feeds[label])
    for _ in range(ROUNDS):
        for label, session in sessions.items():
            started = time.perf_counter()
            session.run(None, feeds[label])
            times[label].append(time.perf_counter() - started)
    medians = {label: statistics.median(values) for label, values in times.items()}
    for row in rows:
        row["latency_ms"] = round(medians[row["params"]] * 1000, 1)
        row["latency_vs_fp32"] = round(medians[row["params"]] / medians["fp32"], 3)
        print(f"{row['params']:52s} latency {row['latency_vs_fp32']}x fp32", flush=True)
    result = {"benchmark": "ort_dynamic_params", "fp32_latency_ms": round(medians["fp32"] * 1000, 1),
              "latency_batch": [8, 128], "rounds": ROUNDS, "machine": machine(), "load_average": os.getloadavg()[0],
              "versions": {"onnxruntime": onnxruntime.__version__, "python": platform.python_version()},
              "real_text_batch": list(real["input_ids"].shape), "random_batch": list(ids.shape), "rows": rows}
    path = HERE / "results" / "ort_dynamic_params.json"
    path.write_text(json.dumps(result, indent=2) + "\n")
    print(f"wrote {path}")
    return result


if __name__ == "__main__":
    main()
