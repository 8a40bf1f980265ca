"""SmolLM2-135M-Instruct in OpenVINO GenAI: hfexport's OpenVINO generation export vs optimum-intel's (issue 27).

Both folders are run by `openvino_genai.LLMPipeline(folder, "CPU", INFERENCE_PRECISION_HINT="f32",
ATTENTION_BACKEND=B)` in the runtime's own environment (`hfexport.testing.peers.openvino_genai_venv()`), one long-lived
process per folder and backend, so every call alternates with the other export's in one run: greedy, chat-template
prompts (token ids), exactly NEW_TOKENS new tokens (`min_new_tokens`), at batch 1 (each prompt alone) and batch 4 (the
four prompts in one `generate` call, left-padded with their attention mask; LLMPipeline runs a batch as one request
per row, continuously batched), one warm-up each, then ROUNDS rounds of every call on both exports, the order swapped
each round, each call after a SETTLE_S pause (the other process's threads idle), the rounds split over GENERATIONS
fresh pairs of processes (one process's state alone moves a figure by several percent). The backends (BACKENDS,
default both):
- `PA`, GenAI's default on x86/ARM CPUs: its `SDPAToPagedAttention` pass rewrites the stateful graph into
  PagedAttention with GenAI's own block cache (continuous batching);
- `SDPA`: the stateful graph as exported, its KV cache in the graph's ReadValue/Assign states (what GenAI runs where
  PagedAttention is not available, and what optimum-intel's `OVModelForCausalLM` compiles).
Figures are GenAI's own `perf_metrics` (time to first token, throughput of the decode), medians over the calls; a
ratio is hfexport's over optimum-intel's, per call (the two sides' calls are neighbours in time), then the median
(tokens/s: > 1 is faster; TTFT: < 1 is faster). Each side's tokens are recorded; equal tokens show both run the same
model.

- hfexport: `hfexport export SMOLLM2 --recipe R -o WORK/out --no-latency` with R one plain OpenVINO generation target
  (no options but `dynamic`), i.e. the stateful `openvino_model.xml` with its tokenizer models, verified by the gate
  (HFEXPORT_DIR: a folder already made);
- optimum-intel: `optimum-cli export openvino --model SMOLLM2 --task text-generation-with-past --weight-format fp32`
  in the peers' venv (OPTIMUM_DIR: a folder already made). Both write their defaults in the graph's
  `rt_info/runtime_options`, which the CPU plugin applies: optimum-intel KV_CACHE_PRECISION f16 (its unquantized
  text-generation default), hfexport (the engine's) INFERENCE_PRECISION_HINT and KV_CACHE_PRECISION f32, the
  checkpoint's precision; both run at the f32 hint passed here, and at those KV caches unless KV_CACHE_PRECISION
  (e.g. `f32`) sets one for both.

Run: `python benchmarks/llm_runtimes.py` (ROUNDS, default 8; GENERATIONS, default 4; SETTLE_S, default 0.2;
NEW_TOKENS, default 32; BATCHES, default `1,4`; BACKENDS, default `PA,SDPA`; KV_CACHE_PRECISION, default each
export's own; WORK, default
/tmp/hfexport-llm-runtimes-bench, where the two exports are made once and reused) -> benchmarks/results/
llm_runtimes.json (or OUT). The CPU (lscpu) and the load average before and after are recorded: the machine is shared.

The ExecuTorch half of issue 27's benchmark (hfexport's `.pte` vs optimum-executorch's in TextLLMRunner) is
`benchmarks/llm_runtimes_executorch.py`.
"""

from __future__ import annotations

import json
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path

from _process import alternate_workers, load, machine  # noqa: E402 - the benchmarks' harness

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent
sys.path.insert(0, str(ROOT / "library"))

ROUNDS = int(os.environ.get("ROUNDS", "8"))
SETTLE_S = float(os.environ.get("SETTLE_S", "0.2"))
GENERATIONS = min(int(os.environ.get("GENERATIONS", "4")), ROUNDS)  # each generation holds at least one round
BATCHES = [int(size) for size in os.environ.get("BATCHES", "1,4").split(",")]
BACKENDS = os.environ.get("BACKENDS", "PA,SDPA").split(",")
NEW_TOKENS = int(os.environ.get("NEW_TOKENS", "32"))
KV_CACHE_PRECISION = os.environ.get("KV_CACHE_PRECISION", "")
OUT = Path(os.environ.get("OUT", HERE / "results" / "llm_runtimes.json"))
CHAT = ["What is the capital of France?", "Write a haiku about the sea.", "Explain gravity to a child in one sentence.",
        "Name three primary colors."]

# One LLMPipeline per process (folder, new tokens, pad id, attention backend); each stdin line is a batch of prompts (token ids; more than one: left-padded with
# PAD, with their attention mask, as one `generate` call), answered with GenAI's metrics and the tokens of each row.
WORKER = r"""
import json, sys
import numpy as np, openvino as ov, openvino_genai as g
kv_cache = {"KV_CACHE_PRECISION": sys.argv[5]} if sys.argv[5] else {}  # else each export's own rt_info default
pipe = g.LLMPipeline(sys.argv[1], "CPU", INFERENCE_PRECISION_HINT="f32", ATTENTION_BACKEND=sys.argv[4], **kv_cache)
config = pipe.get_generation_config()
config.max_new_tokens = config.min_new_tokens = int(sys.argv[2])
config.do_sample = False
pad = int(sys.argv[3])
print(json.dumps({"ready": True}), flush=True)
for line in sys.stdin:
    prompts = json.loads(line)
    width = max(map(len, prompts))
    ids = np.full((len(prompts), width), pad, dtype=np.int64)
    mask = np.zeros_like(ids)
    for row, prompt in enumerate(prompts):
        ids[row, width - len(prompt):], mask[row, width - len(prompt):] = prompt, 1
    result = pipe.generate(g.TokenizedInputs(ov.Tensor(ids), ov.Tensor(mask)), config)
    metrics = result.perf_metrics
    print(json.dumps({"ttft_ms": metrics.get_ttft().mean, "tokens_per_s": metrics.get_throughput().mean,
                      "generate_ms": metrics.get_generate_duration().mean,
                      "tokens": [[int(t) for t in row] for row in result.tokens]}), flush=True)
"""


def _peer_model(model: Path, work: Path) -> Path:
    """SMOLLM2 as transformers 4.57 (optimum-intel's) reads it: `rope_theta` at the top level (it has no
    `rope_parameters`, and would build RoPE at 10000), the GGUF's `quantization_config` dropped
    (benchmarks/smollm2_vs_optimum.py's `peer_model`)."""
    plain = work / "smollm2-peers"
    plain.mkdir(parents=True, exist_ok=True)
    for item in model.iterdir():
        if item.name != "config.json" and not (plain / item.name).exists():
            (plain / item.name).symlink_to(item.resolve())
    config = json.loads((model / "config.json").read_text())
    config.pop("quantization_config", None)
    config.setdefault("rope_theta", (config.get("rope_parameters") or {}).get("rope_theta"))
    (plain / "config.json").write_text(json.dumps(config, indent=1))
    return plain


def _exports() -> tuple[Path, Path]:
    from hfexport.testing.models import build_smollm2
    from hfexport.testing.peers import peer_venv

    model = build_smollm2(Path(os.environ.get("SMOLLM2_DIR", "/tmp/hfexport-smollm2")))
    work = Path(os.environ.get("WORK", "/tmp/hfexport-llm-runtimes-bench"))
    ours = Path(os.environ["HFEXPORT_DIR"]) if os.environ.get("HFEXPORT_DIR") else work / "out" / "openvino-generation"
    if not (ours / "openvino_model.xml").is_file():
        if os.environ.get("HFEXPORT_DIR"):
            raise SystemExit(f"HFEXPORT_DIR={ours} has no openvino_model.xml")
        recipe = work / "recipe.json"
        recipe.parent.mkdir(parents=True, exist_ok=True)
        recipe.write_text(json.dumps({"recipe_version": 1, "task": "text-generation", "targets": {
            "openvino-generation": {"export_format": "openvino", "mode": "generation", "options": {"dynamic": True}}}}))
        subprocess.run([sys.executable, "-m", "hfexport", "export", str(model), "--recipe", str(recipe), "-o",
                        str(work / "out"), "--quiet", "--no-latency"], check=True, env={**os.environ, "PYTHONPATH": str(ROOT / "library")})
    theirs = Path(os.environ["OPTIMUM_DIR"]) if os.environ.get("OPTIMUM_DIR") else work / "optimum-openvino"
    if not (theirs / "openvino_model.xml").is_file():
        cli = Path(peer_venv()).parent / "optimum-cli"
        subprocess.run([str(cli), "export", "openvino", "--model", str(_peer_model(model, work)), "--task", "text-generation-with-past",
                        "--weight-format", "fp32", str(theirs)], check=True)
    return ours, theirs


def main() -> int:
    from transformers import AutoTokenizer

    from hfexport.testing.peers import openvino_genai_venv as genai_venv

    ours, theirs = _exports()
    tokenizer = AutoTokenizer.from_pretrained(ours)
    chat = [tokenizer.apply_chat_template([{"role": "user", "content": text}], add_generation_prompt=True,
                                          tokenize=True, return_dict=True)["input_ids"] for text in CHAT]
    # batch 1: each prompt alone; a larger batch: all the prompts, rotated so that each call starts with another one
    calls = [(size, [chat[i % len(chat)] for i in range(start, start + size)] if size > 1 else [chat[start]])
             for size in BATCHES for start in range(len(chat))]
    pad = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else tokenizer.eos_token_id
    python = str(genai_venv())
    load_before = load()
    sides = (("hfexport", ours), ("optimum-intel", theirs))
    results = {}
    for backend in BACKENDS:
        commands = {name: [python, "-c", WORKER, str(folder), str(NEW_TOKENS), str(pad), backend, KV_CACHE_PRECISION]
                    for name, folder in sides}
        runs, _ = alternate_workers(commands, [batch for _, batch in calls], ROUNDS, reference="optimum-intel",
                                    settle_s=SETTLE_S, generations=GENERATIONS)
        sizes = [size for _ in range(ROUNDS) for size, _ in calls]  # the batch size of each answer, in order
        results[backend] = {}
        for size in BATCHES:
            ours_, theirs_ = ([run for run, of in zip(runs[name], sizes, strict=True) if of == size]
                              for name, _ in sides)
            results[backend][f"batch_{size}"] = {
                "calls": len(ours_),
                "median": {name: {key: round(statistics.median(run[key] for run in answers), 2)
                                  for key in ("tokens_per_s", "ttft_ms", "generate_ms")}
                           for name, answers in (("hfexport", ours_), ("optimum-intel", theirs_))},
                "ratio_hfexport_over_optimum_intel": {
                    key: round(statistics.median(a[key] / b[key] for a, b in zip(ours_, theirs_, strict=True)), 3)
                    for key in ("tokens_per_s", "ttft_ms")},
                "ratio_by_generation": [
                    {key: round(statistics.median(a[key] / b[key] for a, b in zip(ours_, theirs_, strict=True)
                                                  if a["generation"] == generation), 3)
                     for key in ("tokens_per_s", "ttft_ms")}
                    for generation in range(GENERATIONS)],
                "same_tokens": all(a["tokens"] == b["tokens"] for a, b in zip(ours_, theirs_, strict=True)),
            }
        print(json.dumps({backend: results[backend]}), file=sys.stderr, flush=True)
    document = {
        "what": "SmolLM2-135M-Instruct, OpenVINO GenAI LLMPipeline (f32 hint, KV cache "
                + (f"{KV_CACHE_PRECISION} on both" if KV_CACHE_PRECISION else "each export's own") + "), greedy, "
                f"{NEW_TOKENS} new tokens forced, {len(chat)} chat prompts as token ids, batch "
                + " and ".join(map(str, BATCHES)) + f" ({len(chat)} calls each per round; a larger batch left-padded)"
                f", {ROUNDS} rounds over {GENERATIONS} fresh pairs of processes, alternated, {SETTLE_S} s between calls, "
                "attention backend " + " and ".join(BACKENDS),
        "cpu": machine(), "load_average_before": load_before, "load_average_after": load(),
        "generated": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
        "attention_backend": results,
    }
    OUT.parent.mkdir(parents=True, exist_ok=True)
    OUT.write_text(json.dumps(document, indent=2) + "\n")
    print(json.dumps(document, indent=2))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
