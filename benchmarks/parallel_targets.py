"""`make demo`'s job with its targets exported in several processes at once vs in one (issue 16: `make demo` <= 45 s).

Two commands, each a fresh process, alternated round by round (the order rotates) so that both see the same load:
- auto: `python -m hfexport export examples/tiny-llama --all-targets -o OUT` (the README's `make demo` command;
  `--workers auto`, the default: one process per usable core, hfexport.job.parallel);
- one process: the same with `--workers 1`.
Both verify every target and time it against eager torch (the defaults). Each run records wall, CPU (user + system
of the process and the worker processes it waited for, from wait4), the job report's per-target export seconds
and which process exported each target, its `peak_rss_mb` (the processes' peaks added), and the load average
around it. The exported files of the two variants are compared (same names, same sizes) in the first round.

Run: `.venv/bin/python benchmarks/parallel_targets.py` (env ROUNDS, default 2) -> results/parallel_targets.json
"""

from __future__ import annotations

import json
import os
import platform
import shutil
import statistics
import sys
import tempfile
from pathlib import Path

from _process import run_measured

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent
ROUNDS = int(os.environ.get("ROUNDS", "2"))
MODEL = os.environ.get("MODEL", str(ROOT / "examples" / "tiny-llama"))
VARIANTS = {"auto": [], "one process": ["--workers", "1"]}


def run(name: str, output: Path, logs: Path) -> dict:
    shutil.rmtree(output, ignore_errors=True)
    command = [sys.executable, "-m", "hfexport", "export", MODEL, "--all-targets", "-o", str(output), "--json",
               *VARIANTS[name]]
    env = {**os.environ, "PYTHONPATH": str(ROOT / "library")}
    stdout, stderr = logs / f"{name}.out", logs / f"{name}.err"
    result = run_measured(command, stdout, stderr, env)
    if result.pop("returncode") != 0:
        raise SystemExit(f"{name} failed: {stderr.read_text()[-3000:]}")
    report = json.loads(stdout.read_text())
    for target, entry in report["targets"].items():
        if entry["status"] != "ok" or not (entry.get("verification") or {}).get("passed"):
            raise SystemExit(f"{name} {target}: {entry['status']} {entry.get('error')}")
    result["export_s"] = {target: entry["timings"]["export_s"] for target, entry in report["targets"].items()}
    result["job_total_s"] = report["timings"]["total_s"]
    result["report_peak_rss_mb"] = report["peak_rss_mb"]
    return result


def files(output: Path) -> dict[str, int]:
    return {path.relative_to(output).as_posix(): path.stat().st_size for path in sorted(output.rglob("*"))
            if path.is_file() and path.name != "export_report.json"}


def main() -> dict:
    sys.path.insert(0, str(ROOT / "library"))
    from hfexport.job.parallel import export_groups, usable_cpus
    from hfexport.job.preflight import available_memory, weights_metadata
    from hfexport.recipe.loading import load_recipe
    from hfexport.machine import cpu_info

    recipe = load_recipe(MODEL)
    # the groups `--workers auto` makes, from the same inputs as the job's (hfexport.job.run._prepare)
    groups = export_groups({name: recipe.target(name) for name in recipe.target_names}, "auto",
                           weights_metadata(MODEL)[0], available_memory())
    runs: dict[str, list[dict]] = {name: [] for name in VARIANTS}
    same_files = None
    with tempfile.TemporaryDirectory(prefix="hfexport-parallel-") as work:
        work = Path(work)
        names = list(VARIANTS)
        for index in range(ROUNDS):
            for name in names[index % 2:] + names[:index % 2]:
                runs[name].append(run(name, work / name.replace(" ", "-"), work))
                last = runs[name][-1]
                print(f"round {index} {name}: {last['wall_s']:.1f} s wall, {last['cpu_s']:.1f} s CPU, "
                      f"load {last['load_avg_1m_before']} -> {last['load_avg_1m_after']}", file=sys.stderr)
            if same_files is None:
                same_files = files(work / "auto") == files(work / "one-process")

    def median(name: str, key: str) -> float:
        return round(statistics.median(run[key] for run in runs[name]), 2)

    return {
        "benchmark": "make demo's job (tiny-llama, every target, verified, latency timed): targets exported in one "
                     "process per core (--workers auto) vs one process (--workers 1), fresh processes alternated",
        "model": MODEL.replace(f"{ROOT}/", ""),
        "groups": {"cpus": usable_cpus(), "job process": groups[0], "workers": groups[1:]},
        "rounds": ROUNDS,
        "machine": {"cpu": cpu_info(), "cpus": os.cpu_count(), "python": platform.python_version()},
        "median_wall_s": {name: median(name, "wall_s") for name in VARIANTS},
        "median_cpu_s": {name: median(name, "cpu_s") for name in VARIANTS},
        "ratio_wall_auto_vs_one_process": round(median("auto", "wall_s") / median("one process", "wall_s"), 3),
        "ratio_cpu_auto_vs_one_process": round(median("auto", "cpu_s") / median("one process", "cpu_s"), 3),
        "same_file_names_and_sizes": same_files,
        "target_demo_s": 45,
        "runs": runs,
    }


if __name__ == "__main__":
    result = main()
    out = HERE / "results" / "parallel_targets.json"
    out.write_text(json.dumps(result, indent=2, ensure_ascii=False) + "\n")
    print(json.dumps({key: result[key] for key in ("groups", "median_wall_s", "median_cpu_s",
                                                   "ratio_wall_auto_vs_one_process", "same_file_names_and_sizes")},
                     indent=2))
