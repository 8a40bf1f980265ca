"""Progress events of a job (`Step`) and the callback type every surface implements to show them."""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass

from hfexport.errors import first_line


@dataclass
class Step:
    """One progress event of a job or a publication.

    `step` is one of `STEPS`: cache (the cache lookup), preflight, load_model, then per target plan, export, save,
    verify, latency and target (the target as a whole), compare (a quantized target against its reference) and
    publish. `status` is start, done or error; `detail` a short line (the error's first line on error); `seconds`
    is set on done and error."""
    step: str
    status: str
    target: str | None = None
    detail: str | None = None
    seconds: float | None = None


STEPS = ("cache", "preflight", "load_model", "plan", "export", "save", "verify", "latency", "target", "compare",
         "publish")
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
