"""A job's targets exported in several processes at once (`JobOptions.workers`, `hfexport export --workers`).

Why processes: most of an export is single-threaded Python holding the GIL (torch.export's trace, the decompositions,
ExecuTorch's and the ONNX optimizer's passes), so a job of several targets on a machine with several cores exports
fastest with one process per core. The job's own process keeps the lightest share of the targets; each worker
process (`python -m hfexport.job.parallel_worker`) imports the engine, loads the model itself (its own copy of the weights:
the preflight counts one per process) and runs the very same stages as the job's process (`job.pipeline.TargetPipeline`:
plan, export, save into the same OUTPUT, verify) for its share. Each target folder is written aside and renamed
(`files.save_atomically`); a worker that dies leaves its unfinished targets reported as errors and its half-written
folders removed. Latency is timed afterwards in the job's process, once no export competes for the cores.

Protocol, one JSON object per line (as `surfaces.worker`'s): the job's process writes one request on the worker's
stdin (the token travels there, never in argv or the environment) and keeps stdin open while it runs (the worker
exits when stdin closes: a job process that dies takes its workers with it); the worker answers on its original stdout (the
engine's prints go to stderr) with `{"type": "step", "step": {...}}` events, `{"type": "target", "name": ...,
"report": {...}}` as each of its targets ends, then `{"type": "done", "peak_rss_mb": ...}` or
`{"type": "failed", "error": "..."}`.
"""

from __future__ import annotations

import contextlib
import json
import logging
import os
import shutil
import subprocess
import sys
import threading
from collections.abc import Iterator
from pathlib import Path

from hfexport.errors import killed_by
from hfexport.formats import format_traits
from hfexport.job.preflight import memory_needed
from hfexport.logs import LOGGER
from hfexport.progress import ProgressCallback, Step

# Relative export time of one target: its format's `export_cost` (tiny Llama generation,
# benchmarks/results/demo_breakdown.json: pte 50-63 s, ONNX 22-26 s, OpenVINO 16 s, pt2 3-4 s); a generation target
# traces two graphs or more.
GENERATION_COST = 2.0  # a prefill and a decode
SINGLE_GRAPH_COST = 1.2  # `generation.single_graph`: one multi-token decode (benchmarks/results/single_graph.json)

LIBRARY_ROOT = Path(__file__).resolve().parents[2]  # the folder holding the hfexport package


def export_cost(target) -> float:
    """The relative time one recipe target takes to export (the split needs only the order of magnitude)."""
    if target.mode != "generation":
        return format_traits(target.export_format).export_cost
    graphs = SINGLE_GRAPH_COST if target.single_graph else GENERATION_COST
    return format_traits(target.export_format).export_cost * graphs


def usable_cpus() -> int:
    """The cores this process may run on: its affinity, capped by a cgroup v2 CPU quota when there is one."""
    try:
        count = len(os.sched_getaffinity(0))
    except (AttributeError, OSError):
        count = os.cpu_count() or 1
    with contextlib.suppress(OSError, ValueError):
        quota, period = Path("/sys/fs/cgroup/cpu.max").read_text().split()
        if quota != "max":
            count = min(count, max(1, int(quota) // int(period)))
    return max(1, count)


def split_targets(costs: dict[str, float], processes: int) -> list[list[str]]:
    """`costs`' target names over at most `processes` groups of about equal total cost (the heaviest target first,
    each onto the group with the least so far), lightest group first: the job's own process takes that one, as it
    also times and compares the targets afterwards. Within a group the targets keep their recipe order."""
    groups: list[list[str]] = [[] for _ in range(max(1, min(processes, len(costs))))]
    totals = [0.0] * len(groups)
    for name in sorted(costs, key=lambda name: -costs[name]):  # sorted() is stable: equal costs keep recipe order
        lightest = totals.index(min(totals))
        groups[lightest].append(name)
        totals[lightest] += costs[name]
    order = list(costs)
    ranked = sorted(range(len(groups)), key=lambda index: totals[index])
    return [sorted(groups[index], key=order.index) for index in ranked if groups[index]]


def export_groups(targets: dict, workers: int | str, weights: int | None, memory_available: int | None,
                  cpus: int | None = None) -> list[list[str]]:
    """The targets to export (name -> recipe `Target`), grouped one group per process.

    `workers`: a number of processes, or "auto": one per usable core, no more than there are targets, and no more
    than fit in memory together (`preflight.memory_needed`; one process when the weights' size is unknown)."""
    if workers == "auto":
        count = min(len(targets), cpus or usable_cpus())
        while count > 1 and (weights is None or memory_available is not None and memory_needed(
                weights, [[targets[name] for name in group] for group in _split(targets, count)]) > memory_available):
            count -= 1
    else:
        count = workers_number(workers)
    return _split(targets, count) if targets else []


def _split(targets: dict, count: int) -> list[list[str]]:
    return split_targets({name: export_cost(target) for name, target in targets.items()}, count)


def workers_number(workers: int | str) -> int:
    """`workers` as a number of processes (>= 1), or a ValueError saying what is accepted."""
    try:
        count = int(workers)
    except (TypeError, ValueError):
        count = 0
    if count < 1 or isinstance(workers, float):
        raise ValueError(f"workers={workers!r}: expected a number of processes (1 or more) or 'auto'")
    return count


@contextlib.contextmanager
def share_cores(processes: int, cpus: int | None = None) -> Iterator[None]:
    """torch's intra-op threads for one of `processes` processes exporting at once on the usable cores (the eager
    forwards of verification would otherwise each start a thread per core); restored afterwards. No-op without
    torch imported, or with one process."""
    torch = sys.modules.get("torch")
    if torch is None or processes <= 1:
        yield
        return
    before = torch.get_num_threads()
    torch.set_num_threads(max(1, (cpus or usable_cpus()) // processes))
    try:
        yield
    finally:
        torch.set_num_threads(before)


def serialized(progress: ProgressCallback) -> ProgressCallback:
    """`progress`, called by one thread at a time (the worker readers' threads and the job's own)."""
    lock = threading.Lock()

    def call(step: Step) -> None:
        with lock:
            progress(step)

    return call


class TargetWorker:
    """One worker process exporting `names`: started at construction, its events forwarded to `progress` by a
    reader thread; `wait()` for its end, `stop()` to kill it. After either, `reports` holds the report (as a dict)
    of every target it finished, and `error` why the others were not (None when it finished them all)."""

    def __init__(self, request: dict, names: list[str], progress: ProgressCallback):
        self.names = list(names)
        self.reports: dict[str, dict] = {}
        self.error: str | None = None
        self.peak_rss_mb = 0.0
        self.finished = False
        self.progress = progress
        env = dict(os.environ)
        env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(LIBRARY_ROOT), env.get("PYTHONPATH")]))
        self.process = subprocess.Popen([sys.executable, "-m", "hfexport.job.parallel_worker"], stdin=subprocess.PIPE,
                                        stdout=subprocess.PIPE, env=env, text=True, bufsize=1)
        with contextlib.suppress(BrokenPipeError, OSError):  # a worker that died at once is reported by wait()
            self.process.stdin.write(json.dumps({**request, "targets": self.names}) + "\n")
            self.process.stdin.flush()
        # stdin stays open while the job runs: the worker stops when it closes, so a job process that dies (killed,
        # out of memory) takes its workers with it instead of leaving them exporting into OUTPUT.
        self.reader = threading.Thread(target=self._read, daemon=True, name=f"hfexport-export-{self.process.pid}")
        self.reader.start()

    def _read(self) -> None:
        for line in self.process.stdout:
            try:
                event = json.loads(line)
            except ValueError:
                continue  # not a protocol line (the worker's stdout is reserved: cannot happen)
            kind = event.get("type")
            if kind == "step":
                with contextlib.suppress(Exception):  # a surface's failing display must not lose the results
                    self.progress(Step(**event["step"]))
            elif kind == "target":
                self.reports[event["name"]] = event["report"]
            elif kind == "done":
                self.finished, self.peak_rss_mb = True, float(event.get("peak_rss_mb") or 0.0)
            elif kind == "failed":
                self.error = str(event.get("error") or "the export worker failed")

    def wait(self, stopped: bool = False) -> None:
        """Until the worker has exited and its last event is read (`stopped`: we killed it)."""
        code = self.process.wait()
        self.reader.join()
        with contextlib.suppress(OSError):
            self.process.stdin.close()
        if not self.finished and self.error is None:
            self.error = ("the export worker was stopped" if stopped else
                          f"the export worker process exited with code {code}{killed_by(code)} before finishing its "
                          "targets")

    def stop(self) -> None:
        """Kill the worker if it still runs (its unfinished targets' folders are removed by `remove_unfinished`)."""
        running = self.process.poll() is None
        if running:
            self.process.kill()
        self.wait(stopped=running)

    @property
    def unfinished(self) -> list[str]:
        return [name for name in self.names if name not in self.reports]


def remove_unfinished(output: Path, names: list[str]) -> None:
    """What a worker killed mid-save left of `names` in OUTPUT (`files.save_atomically`'s names): its staging folders
    are removed, and a previous export it had moved aside is put back."""
    for name in names:
        for staging in output.glob(f".{name}.partial-*"):
            shutil.rmtree(staging, ignore_errors=True)
        for old in output.glob(f".{name}.old-*"):
            if (output / name).exists():
                shutil.rmtree(old, ignore_errors=True)
            else:
                os.replace(old, output / name)


@contextlib.contextmanager
def export_workers(request: dict, groups: list[list[str]], progress: ProgressCallback,
                   output: Path) -> Iterator[list[TargetWorker]]:
    """One `TargetWorker` per group, started on entry (they import the engine while the job's process does). On
    exit (normal, an error, Ctrl-C) every worker still running is killed and its unfinished targets' folders are
    removed; the caller `wait()`s for them first on the normal path."""
    workers: list[TargetWorker] = []
    try:
        for names in groups:
            workers.append(TargetWorker(request, names, progress))
        yield workers
    finally:
        for worker in workers:
            worker.stop()
            remove_unfinished(output, worker.unfinished)


def logging_settings() -> dict:
    """How quiet this process is (`logs.quiet_engine_logs`), for a worker to be the same."""
    return {"level": LOGGER.level, "handler": bool(LOGGER.handlers), "disabled": logging.root.manager.disable}
