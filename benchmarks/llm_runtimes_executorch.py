"""SmolLM2-135M-Instruct in ExecuTorch's TextLLMRunner: hfexport's `.pte` + `.ptd` vs optimum-executorch's `.pte`
(issue 27, the ExecuTorch half of benchmarks/llm_runtimes.py).

Every folder is run by `executorch.extension.llm.runner.TextLLMRunner` (executorch 1.5.1's Python bindings of the C++
runner, from hfexport's venv), one long-lived process per folder (in each of GENERATIONS fresh sets), the same process
setup for each (ExecuTorch's LLM kernels registered, `executorch.extension.llm.custom_ops.custom_ops`; XNNPACK's default
thread pool, its size recorded), so every call alternates with the others' in one run: greedy (temperature 0), batch 1
(the runner has no batch), chat-template prompts that ask for long answers, as text (their first token is SmolLM2's BOS
id, so `num_bos=0`), at most NEW_TOKENS new tokens, one warm-up each, then ROUNDS rounds of every prompt on every
folder, the order reversed each round. Each program's cache size (`get_max_seq_len`) is read and recorded: all are 2048.

Same work on every side: the runner has no option to ignore EOS (`GenerationConfig` 1.5.1), and optimum-executorch's
`.pte` does not stop at SmolLM2's `<|im_end|>` (id 2) in the runner: it answers `get_eos_id` = 2 but has no
`get_eos_ids`, the method the runner reads, so the runner falls back to the tokenizer's EOS. So the decode rate is
measured over the same tokens: per prompt and round, the first `n` new tokens every side produced (n = the shortest side's count),
from the times the runner hands each token to the callback: `(n - 1) / (t[n-1] - t[0])`. Time to first token is the
runner's own stats (`first_token_ms - inference_start_ms`: the prompt's encoding and prefill). Medians over the
calls; a ratio is hfexport's over the other's, per call pair (tokens/s: > 1 is faster; TTFT: < 1 is faster).
`same_tokens`: every side's first n tokens equal. The new tokens are read through a copy of `tokenizer.json` without
its decoder (each piece a vocabulary string: hfexport.formats.executorch.runtimes.executorch_llm_runner), so ids are compared.

- hfexport: `hfexport export SMOLLM2 --recipe R -o OUT` with R one plain ExecuTorch generation target (the LLM
  runner's contract: a static cache of 2048 positions, batch 1; `hfexport.formats.executorch.llm_program`);
- optimum-executorch: `optimum-cli export executorch --model SMOLLM2 --task text-generation --recipe xnnpack` in its
  own venv (`hfexport.testing.peers.optimum_executorch_venv()`: optimum-executorch 1.1.0 pins
  transformers 5.0.0rc1; the model's config without the GGUF `quantization_config`, `llm_runtimes._peer_model`), its
  default (plain SDPA over the static cache, batch 1, 2048 positions); and the same with `--use_custom_sdpa
  --use_custom_kv_cache` (ExecuTorch's LLM kernels, as hfexport's program uses them): "optimum-executorch-custom-ops".
  It writes no `tokenizer.json`, so the model's own is used for it.

Exports are cached under WORK (default /tmp/hfexport-llm-runtimes-bench) and reused: hfexport's in a folder named by
a hash of the checkpoint (config and weights' size), the versions of torch/transformers/executorch and the source of
hfexport's ExecuTorch LLM export (`formats/executorch/llm_program.py`, `data_file.py`, `workarounds.py`), so a code
change re-exports; optimum-executorch's by its options. HFEXPORT_DIR / OPTIMUM_DIR / OPTIMUM_CUSTOM_DIR name folders
already made. Each SmolLM2 export (XNNPACK lowering) takes about 13 minutes on this 2-core machine when quiet.

Run: `python benchmarks/llm_runtimes_executorch.py` (ROUNDS, default 3; GENERATIONS, default 3: the rounds split over
that many fresh sets of runner processes, as `_process.alternate_workers` does for the other runtime benchmarks, with
the ratios per set recorded; SETTLE_S, default 0.2 s before each call; NEW_TOKENS, default 32) ->
benchmarks/results/llm_runtimes_executorch.json (or OUT). With the exports cached, a run is 3 folders x 4 prompts x
(ROUNDS + GENERATIONS) calls. The CPU (lscpu) and the load average before and after are recorded: the machine is shared.
"""

from __future__ import annotations

import json
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent
sys.path.insert(0, str(ROOT / "library"))
sys.path.insert(0, str(HERE))

from _process import alternate_workers, load, machine  # noqa: E402 - the benchmarks' harness
from llm_runtimes import _peer_model  # noqa: E402

ROUNDS = int(os.environ.get("ROUNDS", "3"))
SETTLE_S = float(os.environ.get("SETTLE_S", "0.2"))
GENERATIONS = min(int(os.environ.get("GENERATIONS", "3")), ROUNDS)  # each generation holds at least one round
NEW_TOKENS = int(os.environ.get("NEW_TOKENS", "32"))
OUT = Path(os.environ.get("OUT", HERE / "results" / "llm_runtimes_executorch.json"))
WORK = Path(os.environ.get("WORK", "/tmp/hfexport-llm-runtimes-bench"))
REFERENCE = "optimum-executorch"
#: optimum-executorch's exports: the side's name -> (folder env var, cache folder, optimum-cli's extra options)
OPTIMUM_SIDES = {
    "optimum-executorch": ("OPTIMUM_DIR", "optimum-executorch", ()),
    "optimum-executorch-custom-ops": ("OPTIMUM_CUSTOM_DIR", "optimum-executorch-custom-ops",
                                      ("--use_custom_sdpa", "--use_custom_kv_cache")),
}
#: hfexport's source files that make the program (a change re-exports)
SOURCES = ("formats/executorch/llm_program.py", "formats/executorch/data_file.py", "formats/executorch/workarounds.py")
#: chat prompts that ask for answers longer than NEW_TOKENS, so that no side stops early at its EOS
PROMPTS = ["Write a short story about a robot who learns to paint.", "Explain in detail how a bicycle works.",
           "Describe the water cycle step by step.", "List ten fruits and describe each one."]

# One TextLLMRunner per process; each stdin line is a prompt (text), answered with the runner's stats, the new tokens
# and the time each was handed over. The runner prints its pieces on the C stdout: that goes to stderr, answers to
# the original stdout.
WORKER = r"""
import json, os, sys, tempfile, time
from executorch.extension.llm.custom_ops import custom_ops  # the LLM kernels, registered in every worker alike
from executorch.kernels import quantized  # the quantized embeddings' kernels (8da4w programs), in every worker alike
from executorch.extension.llm.runner import GenerationConfig, TextLLMRunner
from executorch.extension.pybindings import portable_lib
from executorch.runtime import Runtime
folder, tokenizer_path, new_tokens = sys.argv[1], sys.argv[2], int(sys.argv[3])
answers = os.fdopen(os.dup(1), "w")
os.dup2(2, 1)
tokenizer = json.load(open(tokenizer_path, encoding="utf-8"))
ids = dict(tokenizer["model"]["vocab"])
ids.update({added["content"]: added["id"] for added in tokenizer.get("added_tokens") or []})
plain = os.path.join(tempfile.mkdtemp(), "tokenizer.json")
json.dump(dict(tokenizer, decoder=None), open(plain, "w", encoding="utf-8"))
program, data = os.path.join(folder, "model.pte"), os.path.join(folder, "model.ptd")
data = data if os.path.isfile(data) else None
methods = Runtime.get().load_program(program, data_path=data)
meta = {name: methods.load_method(name).execute([])[0] for name in ("get_max_seq_len", "use_kv_cache",
        "enable_dynamic_shape") if name in methods.method_names}
del methods
runner = TextLLMRunner(program, plain, data)
print(json.dumps({"ready": True, "metadata": meta, "threads": portable_lib._threadpool_get_thread_count()}),
      file=answers, flush=True)
for line in sys.stdin:
    pieces, times, stats = [], [], []
    def token(piece):
        times.append(time.perf_counter())
        pieces.append(piece)
    runner.reset()
    config = GenerationConfig(echo=False, max_new_tokens=new_tokens, temperature=0.0, num_bos=0)
    runner.generate(json.loads(line), config, token_callback=token, stats_callback=stats.append)
    s = stats[0]
    print(json.dumps({"ttft_ms": s.first_token_ms - s.inference_start_ms,
                      "generate_ms": s.inference_end_ms - s.inference_start_ms,
                      "token_ms": [round((t - times[0]) * 1000, 3) for t in times],
                      "prompt_tokens": s.num_prompt_tokens, "tokens": [ids[p] for p in pieces]}),
          file=answers, flush=True)
"""


def _source_key(model: Path) -> str:
    """What hfexport's export of `model` depends on: the checkpoint, the engine's versions, hfexport's source."""
    import hashlib
    from importlib.metadata import version

    digest = hashlib.sha256()
    digest.update((model / "config.json").read_bytes())
    for weights in sorted(model.glob("*.safetensors")):
        digest.update(f"{weights.name}:{weights.stat().st_size}".encode())
    for package in ("torch", "transformers", "executorch"):
        digest.update(version(package).encode())
    for source in SOURCES:
        digest.update((ROOT / "library" / "hfexport" / source).read_bytes())
    return digest.hexdigest()[:12]


def _exports(model: Path) -> dict[str, Path]:
    from hfexport.testing.peers import optimum_executorch_venv

    folders = {}
    ours = Path(os.environ["HFEXPORT_DIR"]) if os.environ.get("HFEXPORT_DIR") else \
        WORK / f"hfexport-{_source_key(model)}" / "pte-llm"
    if not (ours / "model.pte").is_file():
        recipe = WORK / "recipe-pte.json"
        recipe.parent.mkdir(parents=True, exist_ok=True)
        recipe.write_text(json.dumps({"recipe_version": 1, "task": "text-generation", "targets": {
            "pte-llm": {"export_format": "executorch", "mode": "generation"}}}))
        subprocess.run([sys.executable, "-m", "hfexport", "export", str(model), "--recipe", str(recipe), "-o",
                        str(ours.parent), "--quiet"], check=True,
                       env={**os.environ, "PYTHONPATH": str(ROOT / "library")})
    folders["hfexport"] = ours
    for name, (variable, cached, options) in OPTIMUM_SIDES.items():
        theirs = Path(os.environ[variable]) if os.environ.get(variable) else WORK / cached
        if not (theirs / "model.pte").is_file():
            cli = Path(optimum_executorch_venv()).parent / "optimum-cli"
            scratch = theirs.with_name(theirs.name + ".partial")
            subprocess.run([str(cli), "export", "executorch", "--model", str(_peer_model(model, WORK)), "--task",
                            "text-generation", "--recipe", "xnnpack", *options, "--output_dir", str(scratch)],
                           check=True)
            scratch.rename(theirs)
        folders[name] = theirs
    return folders


def _same_work(runs: dict[str, list[dict]]) -> tuple[dict, dict, bool]:
    """Per call (the same prompt and round on every side): each side's decode tokens/s over the first n tokens every
    side produced, and hfexport's ratios over each other side (tokens/s, TTFT); whether those tokens are the same."""
    names = list(runs)
    rates: dict[str, list[float]] = {name: [] for name in names}
    ratios: dict[str, dict[str, list[float]]] = {name: {"tokens_per_s": [], "ttft_ms": []} for name in names
                                                 if name != "hfexport"}
    same = True
    for calls in zip(*(runs[name] for name in names), strict=True):
        n = min(len(call["tokens"]) for call in calls)
        same = same and all(call["tokens"][:n] == calls[0]["tokens"][:n] for call in calls)
        got = {}
        for name, call in zip(names, calls, strict=True):
            seconds = (call["token_ms"][n - 1] - call["token_ms"][0]) / 1000 if n > 1 else 0
            got[name] = (n - 1) / seconds if seconds > 0 else None
            call["decode_tokens"], call["tokens_per_s"] = n - 1, got[name]
            if got[name]:
                rates[name].append(got[name])
        for name in ratios:
            if got[name] and got["hfexport"]:
                ratios[name]["tokens_per_s"].append(got["hfexport"] / got[name])
            if calls[names.index(name)]["ttft_ms"]:
                ratios[name]["ttft_ms"].append(calls[0]["ttft_ms"] / calls[names.index(name)]["ttft_ms"])
    return rates, ratios, same


def _ratios_of(runs: dict[str, list[dict]], other: str, generation: int) -> dict:
    """hfexport's ratios over `other` (tokens/s, TTFT), the median over the calls of one set of processes."""
    pairs = [(ours, theirs) for ours, theirs in zip(runs["hfexport"], runs[other], strict=True)
             if ours["generation"] == generation]
    tokens = [ours["tokens_per_s"] / theirs["tokens_per_s"] for ours, theirs in pairs
              if ours["tokens_per_s"] and theirs["tokens_per_s"]]
    ttft = [ours["ttft_ms"] / theirs["ttft_ms"] for ours, theirs in pairs if theirs["ttft_ms"]]
    return {"tokens_per_s": round(statistics.median(tokens), 3) if tokens else None,
            "ttft_ms": round(statistics.median(ttft), 3) if ttft else None}


def main() -> int:
    from transformers import AutoTokenizer

    from hfexport.testing.models import build_smollm2

    model = build_smollm2(Path(os.environ.get("SMOLLM2_DIR", "/tmp/hfexport-smollm2")))
    sides = _exports(model)
    tokenizer = AutoTokenizer.from_pretrained(model)
    prompts = [tokenizer.apply_chat_template([{"role": "user", "content": text}], add_generation_prompt=True,
                                             tokenize=False) for text in PROMPTS]
    load_before = load()
    commands = {name: [sys.executable, "-c", WORKER, str(folder), str(model / "tokenizer.json"), str(NEW_TOKENS)]
                for name, folder in sides.items()}
    ready: dict[str, dict] = {}
    runs, _ = alternate_workers(commands, prompts, ROUNDS, reference=REFERENCE, keys=("ttft_ms",), ready=ready,
                                settle_s=SETTLE_S, generations=GENERATIONS, stderr=subprocess.DEVNULL)
    load_after = load()
    rates, ratios, same = _same_work(runs)
    by_generation = {name: [_ratios_of(runs, name, generation) for generation in range(GENERATIONS)]
                     for name in ratios}
    document = {
        "what": "SmolLM2-135M-Instruct, ExecuTorch 1.5.1 TextLLMRunner (XNNPACK, f32), batch 1, greedy, at most "
                f"{NEW_TOKENS} new tokens, {len(prompts)} chat prompts x {ROUNDS} rounds over {GENERATIONS} fresh "
                f"sets of processes, alternated, {SETTLE_S} s before each call; hfexport's "
                "model.pte + model.ptd vs optimum-executorch 1.1.0's model.pte (default, and with its custom-ops "
                "options); decode tokens/s over the same first n tokens on every side",
        "cpu": machine(), "load_average_before": load_before, "load_average_after": load_after,
        "generated": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
        "programs": {name: {"files_bytes": {path.name: path.stat().st_size for path in sorted(folder.iterdir())
                                            if path.suffix in (".pte", ".ptd")}, **ready[name]}
                     for name, folder in sides.items()},
        "median": {name: {"decode_tokens_per_s": round(statistics.median(rates[name]), 2) if rates[name] else None,
                          "ttft_ms": round(statistics.median(run["ttft_ms"] for run in results), 2),
                          "generate_ms": round(statistics.median(run["generate_ms"] for run in results), 2)}
                   for name, results in runs.items()},
        "ratio_hfexport_over": {name: {key: round(statistics.median(values), 3) for key, values in by_key.items()
                                       if values} for name, by_key in ratios.items()},
        "ratio_hfexport_over_by_generation": by_generation,
        "decode_tokens_compared": [run["decode_tokens"] for run in runs["hfexport"][: len(prompts)]],
        "same_tokens": same,
        "new_tokens": {name: [run["tokens"] for run in results[: len(prompts)]] for name, results in runs.items()},
    }
    OUT.parent.mkdir(parents=True, exist_ok=True)
    OUT.write_text(json.dumps(document, indent=2) + "\n")
    print(json.dumps({key: document[key] for key in ("median", "ratio_hfexport_over", "same_tokens",
                                                     "load_average_before", "load_average_after")}, indent=2))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
