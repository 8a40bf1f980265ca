"""SmolLM2-135M-Instruct in OpenVINO GenAI: hfexport's OpenVINO generation export vs optimum-intel's (issue 27).

Both folders are run by `openvino_genai.LLMPipeline(folder, "CPU", INFERENCE_PRECISION_HINT="f32")` in the runtime's
own environment (`hfexport.testing.peers.openvino_genai_venv()`), one long-lived process per folder, so every call alternates
with the other's in one run: greedy, batch 1, chat-template prompts (token ids), exactly NEW_TOKENS new tokens
(`min_new_tokens`), one warm-up each, then ROUNDS rounds of every prompt on both, the order swapped each round.
Figures are GenAI's own `perf_metrics` (time to first token, throughput of the decode), medians over the calls; a
ratio is hfexport's over optimum-intel's. Each side's tokens are recorded; equal tokens show both run the same model.

- hfexport: `hfexport export SMOLLM2 --recipe R -o OUT` with R one plain OpenVINO generation target (no options but
  `dynamic`), i.e. the stateful `openvino_model.xml` with its tokenizer models (HFEXPORT_DIR: a folder already made);
- optimum-intel: `optimum-cli export openvino --model SMOLLM2 --task text-generation-with-past --weight-format fp32`
  in the peers' venv (OPTIMUM_DIR: a folder already made).

Run: `python benchmarks/llm_runtimes.py` (ROUNDS, default 5; NEW_TOKENS, default 32) ->
benchmarks/results/llm_runtimes.json (or OUT). The CPU (lscpu) and the load average before and after are recorded:
the machine is shared.

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

ROUNDS = int(os.environ.get("ROUNDS", "5"))
NEW_TOKENS = int(os.environ.get("NEW_TOKENS", "32"))
OUT = Path(os.environ.get("OUT", HERE / "results" / "llm_runtimes.json"))
CHAT = ["What is the capital of France?", "Write a haiku about the sea.", "Explain gravity to a child in one sentence.",
        "Name three primary colors."]

# One LLMPipeline per process; each stdin line is a prompt (token ids), answered with GenAI's metrics and tokens.
WORKER = r"""
import json, sys
import numpy as np, openvino as ov, openvino_genai as g
pipe = g.LLMPipeline(sys.argv[1], "CPU", INFERENCE_PRECISION_HINT="f32")
config = pipe.get_generation_config()
config.max_new_tokens = config.min_new_tokens = int(sys.argv[2])
config.do_sample = False
print(json.dumps({"ready": True}), flush=True)
for line in sys.stdin:
    ids = np.array([json.loads(line)], dtype=np.int64)
    result = pipe.generate(g.TokenizedInputs(ov.Tensor(ids), ov.Tensor(np.ones_like(ids))), config)
    metrics = result.perf_metrics
    print(json.dumps({"ttft_ms": metrics.get_ttft().mean, "tokens_per_s": metrics.get_throughput().mean,
                      "generate_ms": metrics.get_generate_duration().mean,
                      "tokens": [int(t) for t in result.tokens[0]]}), flush=True)
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
    ours = Path(os.environ["HFEXPORT_DIR"]) if os.environ.get("HFEXPORT_DIR") else work / "hfexport"
    if not (ours / "openvino_model.xml").is_file():
        recipe = work / "recipe.json"
        recipe.parent.mkdir(parents=True, exist_ok=True)
        recipe.write_text(json.dumps({"recipe_version": 1, "task": "text-generation", "targets": {
            "openvino-generation": {"export_format": "openvino", "mode": "generation", "options": {"dynamic": True}}}}))
        subprocess.run([sys.executable, "-m", "hfexport", "export", str(model), "--recipe", str(recipe), "-o",
                        str(work / "out"), "--quiet"], check=True, env={**os.environ, "PYTHONPATH": str(ROOT / "library")})
        ours = work / "out" / "openvino-generation"
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
    prompts = [tokenizer.apply_chat_template([{"role": "user", "content": text}], add_generation_prompt=True,
                                             tokenize=True, return_dict=True)["input_ids"] for text in CHAT]
    python = str(genai_venv())
    load_before = load()
    commands = {name: [python, "-c", WORKER, str(folder), str(NEW_TOKENS)]
                for name, folder in (("hfexport", ours), ("optimum-intel", theirs))}
    runs, ratios = alternate_workers(commands, prompts, ROUNDS, reference="optimum-intel")
    document = {
        "what": "SmolLM2-135M-Instruct, OpenVINO GenAI LLMPipeline (f32 hint), batch 1, greedy, "
                f"{NEW_TOKENS} new tokens, {len(prompts)} chat prompts x {ROUNDS} rounds, alternated",
        "cpu": machine(), "load_average_before": load_before, "load_average_after": load(),
        "generated": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
        "median": {name: {key: round(statistics.median(run[key] for run in results), 2)
                          for key in ("tokens_per_s", "ttft_ms", "generate_ms")} for name, results in runs.items()},
        "ratio_hfexport_over_optimum_intel": {key: round(statistics.median(values), 3)
                                              for key, values in ratios.items()},
        "same_tokens": all(a["tokens"] == b["tokens"] for a, b in zip(runs["hfexport"], runs["optimum-intel"],
                                                                     strict=True)),
    }
    OUT.parent.mkdir(parents=True, exist_ok=True)
    OUT.write_text(json.dumps(document, indent=2) + "\n")
    print(json.dumps(document, indent=2))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
