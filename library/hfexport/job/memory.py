"""Peak memory per stage of a job: the resident set's high-water mark of each step (load, plan, export, save, rebind,
verify, runtimes, latency, compare), measured by the kernel, and the preflight's estimate beside it.

Linux keeps a process's peak RSS (`VmHWM` in /proc/self/status) and lets the process reset it (writing 5 to
/proc/self/clear_refs, Linux 4.0+): at every stage's start and end the peak so far is read, folded into every open
stage (stages nest: a probe inside verify), and reset; so each stage gets its own peak, and the job's peak is the
largest of them. Where the reset is refused (another OS, a locked-down /proc) each figure is the process's peak
up to the end of that stage (`per_stage` false). Child processes (the deployment runtimes' clients) have their own
peak: `RUSAGE_CHILDREN`'s largest waited-for child, recorded for a stage where it rose. docs/publishing.md, "Memory".
"""

from __future__ import annotations

import resource
import threading
from pathlib import Path

from hfexport.progress import ProgressCallback, Step

#: The steps measured (hfexport.progress.STEPS); `target`, `probe`, `cache` and `preflight` are not: the first spans
#: the others, a probe is a part of verify, the last two read metadata only.
STAGES = ("load_model", "plan", "export", "save", "rebind", "verify", "runtimes", "latency", "compare")
MB = 1 << 20

_lock = threading.Lock()
_folded_peak = 0  # the largest high-water mark read before a reset: the process's peak survives the resets


def _high_water_mark() -> int | None:
    """This process's peak RSS since its start or the last reset, in bytes (None where /proc does not say)."""
    try:
        for line in Path("/proc/self/status").read_text().splitlines():
            if line.startswith("VmHWM:"):
                return int(line.split()[1]) * 1024
    except (OSError, ValueError, IndexError):
        pass
    return None


def _reset_high_water_mark() -> bool:
    try:
        Path("/proc/self/clear_refs").write_text("5")
    except OSError:
        return False
    return True


def _read_and_reset() -> int:
    """The peak since the last call (bytes), then reset, and remember it in the process's peak."""
    global _folded_peak
    mark = _high_water_mark()
    if mark is None:
        mark = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024
    _folded_peak = max(_folded_peak, mark)
    _reset_high_water_mark()
    return mark


def process_peak_mb() -> float:
    """This process's peak RSS so far in MB, across the per-stage resets (what `ru_maxrss` says without them)."""
    with _lock:
        mark = _high_water_mark() or 0
        return max(_folded_peak, mark, resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024) / MB


def _children_peak() -> int:
    return resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss * 1024


class StageMemory:
    """A progress callback that measures the peak RSS of every stage (`STAGES`) of the steps it forwards, into
    `report` (a `JobReport`) as each stage ends: a target's stages into its `memory`, the others into the job's.

    `foreign`: targets exported by other processes (`hfexport.job.parallel`): their steps seen here are those
    processes', not this one's, and are not measured (their reports carry their own figures), except latency,
    which the job's process times."""

    def __init__(self, progress: ProgressCallback, report, foreign=()):
        self.progress, self.report = progress, report
        self.foreign = set(foreign)
        with _lock:
            _read_and_reset()
            self.per_stage = _reset_high_water_mark()
        self.open: dict[tuple[str, str | None], list[int]] = {}  # (step, target) -> [peak, children's peak at start]

    def __call__(self, step: Step) -> None:
        if step.step in STAGES and step.status in ("start", "done", "error") and not (
                step.target in self.foreign and step.step != "latency"):
            self._measure(step)
        self.progress(step)

    def _measure(self, step: Step) -> None:
        key = (step.step, step.target)
        with _lock:
            mark = _read_and_reset()
            if not self.per_stage:
                mark = max(mark, _folded_peak)
            for entry in self.open.values():
                entry[0] = max(entry[0], mark)
            if step.status == "start":
                self.open[key] = [0, _children_peak()]
                return
            entry = self.open.pop(key, None)
        if entry is None:
            return
        owner = self.report if step.target is None else self.report.targets.get(step.target)
        if owner is None:
            return
        block = dict(owner.memory or {})
        peaks = dict(block.get("peak_rss_mb", {}))
        peaks[step.step] = round(max(peaks.get(step.step, 0.0), entry[0] / MB), 1)
        block.update(peak_rss_mb=peaks, per_stage=self.per_stage)
        children = _children_peak()
        if children > entry[1]:  # a child that ran in this stage set a new largest child
            block["children_peak_rss_mb"] = {**block.get("children_peak_rss_mb", {}), step.step: round(children / MB, 1)}
        owner.memory = block


def estimate_record(estimate, max_memory_mb: float | None = None) -> dict:
    """The preflight's memory estimate (a `hfexport.job.preflight.Estimate`) as the report's job `memory` block."""
    block = {"estimate_mb": {stage: round(need / MB, 1) for stage, need in estimate.memory_stages.items()}}
    if estimate.memory_available is not None:
        block["available_mb"] = round(estimate.memory_available / MB, 1)
    if max_memory_mb is not None:
        block["max_memory_mb"] = float(max_memory_mb)
    return block

