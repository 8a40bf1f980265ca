"""Progress events of a job (`Step`) and the callback type every surface implements to show them; the heartbeat that
re-sends a long step while it runs, so that no surface (CLI, action log, Space) looks hung."""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from dataclasses import dataclass

from hfexport.errors import first_line


@dataclass
class Step:
    """One progress event of a job or a publication.

    `step` is one of `STEPS`: cache (the cache lookup), preflight, load_model, then per target plan, export, save,
    verify, probe (one verification probe, sent as it ends), runtimes (generating in the deployment runtimes), variants (making and gating the target's
    variants), latency
    and target (the target as a whole), compare (a
    quantized target against its reference) and publish. `status` is start, done or error, or `RUNNING` (a
    `Heartbeat` re-sending a step still in progress, `seconds` so far); `detail` a short line (the error's first line
    on error); `seconds` is set on done and error."""
    step: str
    status: str
    target: str | None = None
    detail: str | None = None
    seconds: float | None = None


STEPS = ("cache", "preflight", "load_model", "plan", "export", "save", "verify", "probe", "runtimes", "variants",
         "latency", "target", "compare", "publish")
#: each step measured for memory (`hfexport.job.memory.STAGES`) as the report's readers know it (the CLI, the
#: Markdown of PRs, job summaries and the Space, the preflight's refusal): the export traces the model and converts
#: it to the format, the save writes the graph and its weights, the gate checks parity, the variants are quantized
#: (each then gated)
STAGE_LABELS = {"load_model": "load", "plan": "plan", "export": "trace+convert", "save": "write weights",
                "rebind": "rebind", "verify": "gate", "runtimes": "runtimes", "variants": "quantize",
                "latency": "latency", "compare": "compare"}
ProgressCallback = Callable[[Step], None]


def no_progress(_: Step) -> None:
    """The callback of a job nobody watches."""


class StepTimer:
    """A `with` block reported as one step: start on entry, done (or error, with the error's first line) on exit."""
    def __init__(self, progress: ProgressCallback, step: str, target: str | None = None, detail: str | None = None):
        self.progress, self.step, self.target, self.detail = progress, step, target, detail
        self.seconds = 0.0

    def __enter__(self):
        self.start = time.perf_counter()
        self.progress(Step(self.step, "start", self.target, self.detail))
        return self

    def __exit__(self, kind, error, _tb):
        self.seconds = time.perf_counter() - self.start
        status = "done" if kind is None else "error"
        detail = self.detail if kind is None else first_line(error)
        self.progress(Step(self.step, status, self.target, detail, self.seconds))
        return False


RUNNING = "running"  # a heartbeat of a step still in progress: `seconds` is its elapsed time so far


class Heartbeat:
    """A progress callback that forwards every step and, while a step is open (started, not yet done), re-sends it
    every `every` seconds as status "running" with its elapsed seconds, from a daemon thread: a five-minute export
    step keeps saying it is alive and for how long, in a CI log or the Space as on a terminal. Use as a context
    manager (the thread stops on exit)."""

    def __init__(self, progress: ProgressCallback, every: float = 15.0):
        self.progress, self.every = progress, every
        self.open: dict[tuple[str, str | None], tuple[Step, float]] = {}
        self.lock = threading.Lock()
        self.stopped = threading.Event()
        self.thread: threading.Thread | None = None

    def __call__(self, step: Step) -> None:
        key = (step.step, step.target)
        with self.lock:
            if step.status == "start":
                self.open[key] = (step, time.perf_counter())
            elif step.status != RUNNING:
                self.open.pop(key, None)
            self.progress(step)

    def beat(self) -> None:
        """Send one "running" step for every open step (the thread calls it every `every` seconds)."""
        now = time.perf_counter()
        with self.lock:
            for step, started in list(self.open.values()):
                if step.step != "target" and now - started >= self.every / 2:  # a step just begun needs no beat
                    self.progress(Step(step.step, RUNNING, step.target, step.detail, round(now - started, 1)))

    def _run(self) -> None:
        while not self.stopped.wait(self.every):
            self.beat()

    def __enter__(self) -> Heartbeat:
        self.thread = threading.Thread(target=self._run, name="hfexport-progress", daemon=True)
        self.thread.start()
        return self

    def __exit__(self, *_exc) -> None:
        self.stopped.set()
        if self.thread is not None:
            self.thread.join(timeout=1)
