"""Progress events of a job (`Step`) and the callback type every surface implements to show them."""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass

from hfexport.errors import first_line


@dataclass
class Step:
    """One progress event: `step` is load_model, plan, export, save, verify or target; `status` start/done/error."""

    step: str
    status: str
    target: str | None = None
    detail: str | None = None
    seconds: float | None = None


ProgressCallback = Callable[[Step], None]


def no_progress(_: Step) -> None:
    pass


class StepTimer:
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
