"""Peak memory per stage of a job: the resident set's peak during each step (load, plan, export, save, rebind,
verify, runtimes, variants, latency, compare), and the preflight's estimate beside it.

A sampler thread reads this process's RSS (/proc/self/statm) every `SAMPLE_S` while a stage is open, and at every
stage's start and end; each open stage keeps the largest (stages nest: save inside an export's target). The
kernel's own high-water mark is left alone: resetting it (/proc/self/clear_refs) would make `wait4`, `time -v` and
the report's `peak_rss_mb` (ru_maxrss) show the last stage's peak instead of the process's. An allocation held for
less than a sampling period can be missed; the GB-sized ones this is for take longer than that to fault in. Child
processes (the deployment runtimes' clients) have their own peak: `RUSAGE_CHILDREN`'s largest waited-for child,
recorded for a stage where it rose. docs/publishing.md, "Memory".
"""

from __future__ import annotations

import resource
import threading

from hfexport.files import current_rss, drop_tensor_pages
from hfexport.progress import ProgressCallback, Step

#: The steps measured (hfexport.progress.STEPS); `target`, `probe`, `cache` and `preflight` are not: the first spans
#: the others, a probe is a part of verify, the last two read metadata only.
STAGES = ("load_model", "plan", "export", "save", "rebind", "verify", "runtimes", "variants", "latency", "compare")
SAMPLE_S = 0.02
MB = 1 << 20


_MEMORY_UNITS = {"": 1, "mb": 1, "m": 1, "gb": 1024, "g": 1024}


def parse_memory_size(value: str) -> float:
    """A memory budget in MB from `3000`, `3000MB` or `3GB` (GB here is 1024 MB, as MiB/GiB): the CLI's `--max-memory`,
    the action's `max-memory` input and the Space's `HFEXPORT_SPACE_MAX_MEMORY`. ValueError names what was expected."""
    number = str(value).strip().lower().rstrip("ib")
    unit = next((u for u in ("mb", "gb", "m", "g") if number.endswith(u)), "")
    try:
        megabytes = float(number.removesuffix(unit)) * _MEMORY_UNITS[unit]
    except ValueError:
        megabytes = 0.0
    if not megabytes > 0:
        raise ValueError(f"{value!r} is not a memory size (e.g. 3000, 3000MB or 3GB)")
    return megabytes


def drop_mapped_weights(model) -> int:
    """Hand back the resident pages of `model`'s parameters and buffers that are still the checkpoint's file pages
    (transformers maps a safetensors checkpoint): `hfexport.files.drop_file_pages`, so they are read again from the
    file if the model runs again, the same bytes; a page the process wrote stays. For a gate that keeps the model
    while the artifact's runtime opens (a job that loaded the model, `hfexport.job.pipeline`), once its eager side is
    done. Returns the bytes dropped."""
    return drop_tensor_pages((*model.parameters(), *model.buffers()))


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
        self.per_stage = current_rss() > 0
        self.lock = threading.Lock()
        self.open: dict[tuple[str, str | None], list[int]] = {}  # (step, target) -> [peak, children's peak at start]
        self.wake = threading.Event()
        self.thread: threading.Thread | None = None

    def __call__(self, step: Step) -> None:
        if self.per_stage and step.step in STAGES and step.status in ("start", "done", "error") and not (
                step.target in self.foreign and step.step != "latency"):
            self._measure(step)
        self.progress(step)

    def _sample(self) -> None:
        rss = current_rss()
        with self.lock:
            for entry in self.open.values():
                entry[0] = max(entry[0], rss)

    def _run(self) -> None:
        while True:
            with self.lock:
                if not self.open:
                    self.thread = None
                    return
            self._sample()
            self.wake.wait(SAMPLE_S)

    def _measure(self, step: Step) -> None:
        key = (step.step, step.target)
        self._sample()
        if step.status == "start":
            with self.lock:
                self.open[key] = [current_rss(), _children_peak()]
                if self.thread is None:
                    self.thread = threading.Thread(target=self._run, name="hfexport-memory", daemon=True)
                    self.thread.start()
            return
        with self.lock:
            entry = self.open.pop(key, None)
        owner = self.report if step.target is None else self.report.targets.get(step.target)
        if entry is None or owner is None:
            return
        block = dict(owner.memory or {})
        peaks = dict(block.get("peak_rss_mb", {}))
        peaks[step.step] = round(max(peaks.get(step.step, 0.0), entry[0] / MB), 1)
        block.update(peak_rss_mb=peaks, per_stage=True, sample_ms=round(SAMPLE_S * 1000))
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

