"""SmolLM2-135M-Instruct in ExecuTorch's TextLLMRunner: hfexport's `.pte` + `.ptd` vs optimum-executorch's `.pte`
(issue 27, the ExecuTorch half of benchmarks/llm_runtimes.py).

Both folders are run by `executorch.extension.llm.runner.TextLLMRunner` (executorch 1.5.1's Python bindings of the C++
runner, from hfexport's venv), one long-lived process per folder, so every call alternates with the other's in one
run: greedy (temperature 0), batch 1 (the runner has no batch), the chat-template prompts as text (their first token
is SmolLM2's BOS id, so `num_bos=0`), at most NEW_TOKENS new tokens, one warm-up each, then ROUNDS rounds of every
prompt on both, the order swapped each round. Figures are the runner's own `Stats`: time to first token
(`first_token_ms - inference_start_ms`, the prompt's encoding and prefill) and the decode's tokens per second
(`num_generated_tokens - 1` over `inference_end_ms - first_token_ms`); medians over the calls; a ratio is hfexport's
over optimum-executorch's (tokens/s: > 1 is faster; TTFT: < 1 is faster). The new tokens are read through a copy of
`tokenizer.json` without its decoder (each piece a vocabulary string: hfexport.deployment.executorch_llm_runner), so
each side's token ids are recorded and compared.

- hfexport: `hfexport export SMOLLM2 --recipe R -o OUT` with R one plain ExecuTorch generation target (the LLM
  runner's contract: a static cache of 2048 positions, batch 1) (HFEXPORT_DIR: a folder already made);
- optimum-executorch: `optimum-cli export executorch --model SMOLLM2 --task text-generation --recipe xnnpack` in its
  own venv (`hfexport.testing.peers.peer_venv(("optimum-executorch==1.1.0",))`: optimum-executorch 1.1.0 pins
  transformers 5.0.0rc1; the model's config without the GGUF `quantization_config`, `llm_runtimes._peer_model`)
  (OPTIMUM_DIR: a folder already made). Its default is also batch 1 and a static cache of
  2048 positions; it writes no `tokenizer.json`, so the model's own is used for it.

Run: `python benchmarks/llm_runtimes_executorch.py` (ROUNDS, default 3; NEW_TOKENS, default 32) ->
benchmarks/results/llm_runtimes_executorch.json (or OUT). The CPU (lscpu) and the load average before and after are
recorded: the machine is shared.
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
from llm_runtimes import CHAT, _peer_model  # noqa: E402

ROUNDS = int(os.environ.get("ROUNDS", "3"))
NEW_TOKENS = int(os.environ.get("NEW_TOKENS", "32"))
OUT = Path(os.environ.get("OUT", HERE / "results" / "llm_runtimes_executorch.json"))
OPTIMUM_EXECUTORCH = ("optimum-executorch==1.1.0",)

# One TextLLMRunner per process; each stdin line is a prompt (text), answered with the runner's stats and tokens.
# The runner prints its pieces on the C stdout: that goes to stderr, answers to the original stdout.
WORKER = r"""
import json, os, sys, tempfile
from executorch.extension.llm.runner import GenerationConfig, TextLLMRunner
folder, tokenizer_path, new_tokens = sys.argv[1], sys.argv[2], int(sys.argv[3])
answers = os.fdopen(os.dup(1), "w")
os.dup2(2, 1)
tokenizer = json.load(open(tokenizer_path, encoding="utf-8"))
ids = dict(tokenizer["model"]["vocab"])
ids.update({added["content"]: added["id"] for added in tokenizer.get("added_tokens") or []})
plain = os.path.join(tempfile.mkdtemp(), "tokenizer.json")
json.dump(dict(tokenizer, decoder=None), open(plain, "w", encoding="utf-8"))
data = os.path.join(folder, "model.ptd")
runner = TextLLMRunner(os.path.join(folder, "model.pte"), plain, data if os.path.isfile(data) else None)
print(json.dumps({"ready": True}), file=answers, flush=True)
for line in sys.stdin:
    pieces, stats = [], []
    runner.reset()
    config = GenerationConfig(echo=False, max_new_tokens=new_tokens, temperature=0.0, num_bos=0)
    runner.generate(json.loads(line), config, token_callback=pieces.append, stats_callback=stats.append)
    s = stats[0]
    decode_s = (s.inference_end_ms - s.first_token_ms) / 1000
    print(json.dumps({"ttft_ms": s.first_token_ms - s.inference_start_ms,
                      "tokens_per_s": (s.num_generated_tokens - 1) / decode_s if decode_s > 0 else None,
                      "generate_ms": s.inference_end_ms - s.inference_start_ms,
                      "prompt_tokens": s.num_prompt_tokens, "tokens": [ids[p] for p in pieces]}),
          file=answers, flush=True)
"""


def _exports(model: Path) -> tuple[Path, Path]:
    from hfexport.testing.peers import peer_venv

    work = Path(os.environ.get("WORK", "/tmp/hfexport-llm-runtimes-bench"))
    ours = Path(os.environ["HFEXPORT_DIR"]) if os.environ.get("HFEXPORT_DIR") else work / "out" / "pte-llm"
    if not (ours / "model.pte").is_file():
        recipe = work / "recipe-pte.json"
        recipe.parent.mkdir(parents=True, exist_ok=True)
        recipe.write_text(json.dumps({"recipe_version": 1, "task": "text-generation", "targets": {
            "pte-llm": {"export_format": "executorch", "mode": "generation"}}}))
        subprocess.run([sys.executable, "-m", "hfexport", "export", str(model), "--recipe", str(recipe), "-o",
                        str(work / "out"), "--quiet"], check=True, env={**os.environ, "PYTHONPATH": str(ROOT / "library")})
    theirs = Path(os.environ["OPTIMUM_DIR"]) if os.environ.get("OPTIMUM_DIR") else work / "optimum-executorch"
    if not (theirs / "model.pte").is_file():
        cli = Path(peer_venv(OPTIMUM_EXECUTORCH)).parent / "optimum-cli"
        subprocess.run([str(cli), "export", "executorch", "--model", str(_peer_model(model, work)), "--task",
                        "text-generation",
                        "--recipe", "xnnpack", "--output_dir", str(theirs)], check=True)
    return ours, theirs


def main() -> int:
    from transformers import AutoTokenizer

    from hfexport.testing.models import build_smollm2

    model = build_smollm2(Path(os.environ.get("SMOLLM2_DIR", "/tmp/hfexport-smollm2")))
    ours, theirs = _exports(model)
    tokenizer = AutoTokenizer.from_pretrained(model)
    prompts = [tokenizer.apply_chat_template([{"role": "user", "content": text}], add_generation_prompt=True,
                                             tokenize=False) for text in CHAT]
    load_before = load()
    sides = (("hfexport", ours), ("optimum-executorch", theirs))
    commands = {name: [sys.executable, "-c", WORKER, str(folder), str(model / "tokenizer.json"), str(NEW_TOKENS)]
                for name, folder in sides}
    runs, ratios = alternate_workers(commands, prompts, ROUNDS, reference="optimum-executorch",
                                     stderr=subprocess.DEVNULL)
    document = {
        "what": "SmolLM2-135M-Instruct, ExecuTorch 1.5.1 TextLLMRunner (XNNPACK, f32), batch 1, greedy, at most "
                f"{NEW_TOKENS} new tokens, {len(prompts)} chat prompts x {ROUNDS} rounds, alternated; hfexport's "
                "model.pte + model.ptd vs optimum-executorch 1.1.0's model.pte",
        "cpu": machine(), "load_average_before": load_before, "load_average_after": load(),
        "generated": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
        "files_bytes": {name: {path.name: path.stat().st_size for path in sorted(folder.iterdir())
                               if path.suffix in (".pte", ".ptd")} for name, folder in sides},
        "median": {name: {key: round(statistics.median(run[key] for run in results), 2)
                          for key in ("tokens_per_s", "ttft_ms", "generate_ms")} for name, results in runs.items()},
        "ratio_hfexport_over_optimum_executorch": {key: round(statistics.median(values), 3)
                                                   for key, values in ratios.items() if values},
        "same_tokens": all(a["tokens"] == b["tokens"] for a, b in zip(runs["hfexport"], runs["optimum-executorch"],
                                                                     strict=True)),
        "new_tokens": [run["tokens"] for run in runs["hfexport"][: len(prompts)]],
    }
    OUT.parent.mkdir(parents=True, exist_ok=True)
    OUT.write_text(json.dumps(document, indent=2) + "\n")
    print(json.dumps(document, indent=2))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
