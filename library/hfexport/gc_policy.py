"""Garbage-collector policy for a one-shot command (`hfexport export`, `hfexport init`): less time walking objects
that live until the process ends. Library calls (`run_job` from the Space or the webhook worker) are untouched.

Python's cyclic collector walks every tracked object on each full pass. After `import torch, transformers` and the
ONNX stack that is millions of long-lived objects (functions, classes, module dicts), walked again by every full pass
while torch.export allocates, and once more at interpreter exit: ~15% of the CPU time of an all-MiniLM-L6-v2 ONNX
export (benchmarks/export_breakdown.py). So, inside `one_shot_collection`:

- the collector is off until the job's first `plan` step starts: imports, the config and the weights allocate little
  cyclic garbage (tensors are freed by reference counting as usual);
- then everything alive is frozen (`gc.freeze`, the permanent generation) and the collector is back on: tracing's
  garbage is collected as before, but full passes skip the frozen objects;
- on leaving, the collector's state is restored (`gc.unfreeze`, enabled as before), so an in-process caller (tests)
  keeps collecting everything; at interpreter exit (`atexit`) everything is frozen, so finalization skips the walk.

Collection never changes what is computed: the artifacts are byte-identical (benchmarks/export_breakdown.py checks).
"""

from __future__ import annotations

import atexit
import gc
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any

_EXIT_FREEZE_REGISTERED = False


@contextmanager
def one_shot_collection(progress: Callable[[Any], None] | None = None) -> Iterator[Callable[[Any], None]]:
    """Yield a job progress callback (forwarding to `progress`) that turns the collector on when planning starts."""
    global _EXIT_FREEZE_REGISTERED
    was_enabled = gc.isenabled()
    state = {"frozen": False}

    def on_step(step) -> None:
        if not state["frozen"] and step.step == "plan" and step.status == "start":
            gc.freeze()
            state["frozen"] = True
            if was_enabled:
                gc.enable()
        if progress is not None:
            progress(step)

    if not _EXIT_FREEZE_REGISTERED:
        atexit.register(gc.freeze)
        _EXIT_FREEZE_REGISTERED = True
    gc.disable()
    try:
        yield on_step
    finally:
        if state["frozen"]:
            gc.unfreeze()
        if was_enabled:
            gc.enable()
