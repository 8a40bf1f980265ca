"""What torch.export keeps of its last trace once an export has returned, let go when hfexport's export is done
(`trace_state_released()`, around every export: `export._format_fixes`). Issue 45: the gate's eager reference and
the artifact's runtime open beside what the export left, so it counts in the job's peak.

torch 2.13 keeps, after `torch.export.export` returns (found at the gate's start of SmolLM2-135M-Instruct's ONNX and
OpenVINO generation exports, `benchmarks/gate_heap.py`; docs/publishing.md, "Memory"):

- `torch.fx.experimental.proxy_tensor._FAKE_TENSOR_ID_TO_PROXY_MAP_FOR_EXPORT`: fake tensor id -> fx Node of the last
  non-strict trace, emptied only when the next trace starts; through its nodes the whole traced graph (SmolLM2:
  35,456 nodes, their fake values, SymInts and stack traces, ~62 MB of Python objects) stays after the engine dropped
  its program;
- `ShapeEnv`'s methods cached on the class with `functools.lru_cache` (`_maybe_guard_rel`, `_inner_evaluate_expr`,
  ...), keyed by the ShapeEnv itself, and `PhiloxStateTracker`'s class attributes (the last trace's fake seed and
  offset): the last ShapeEnv and FakeTensorMode;
- then, with none of that holding them, the ShapeEnv still lives: its `tracked_fakes` (the fake inputs torch.export
  made) have C++ sizes whose symbolic nodes point back at the ShapeEnv, a cycle through C++ that Python's collector
  cannot see; the ShapeEnv, its FakeTensorMode and its fake-tensor dispatch cache (SmolLM2: 5,228 entries, ~13 MB)
  stay until the process ends.

Emptying those is what torch does anyway before its next trace (or never needs again once the export returned:
`tracked_fakes` only feed the guards of the export that made them), so the exports are the same.
"""

from __future__ import annotations

import contextlib
import gc
import linecache
import weakref
from collections.abc import Iterator

from hfexport.workarounds import replaced, workaround


@workaround(
    "torch-export-keeps-its-last-trace",
    upstream="torch 2.13",
    works_around="(memory) after torch.export returns, module-level state keeps its last trace: the fake-tensor "
                 "id -> fx Node map of non-strict tracing (the whole traced graph), ShapeEnv's class-level "
                 "lru caches and PhiloxStateTracker (the ShapeEnv, its FakeTensorMode), and the ShapeEnv's "
                 "tracked_fakes, a cycle through C++ SymInts the collector cannot free",
    applied="export._format_fixes, around every export (trace_state_released)",
    canary="tests/test_export_leftovers.py::test_torch_export_still_keeps_its_last_trace")
@contextlib.contextmanager
def trace_state_released() -> Iterator[None]:
    """Within the block, every ShapeEnv made is noted; on leaving, what torch keeps of the block's traces is let go
    (the module's docstring), and the source files the traces' stack traces read dropped from Python's `linecache`
    (SmolLM2's export: 202 files, ~15 MB of lines; read again from disk if a traceback needs them; the sources of
    code made at run time, which have no file, stay)."""
    from torch.fx.experimental.symbolic_shapes import ShapeEnv

    made: list[weakref.ref] = []
    original = ShapeEnv.__init__

    def noted(self, *args, **kwargs):
        original(self, *args, **kwargs)
        made.append(weakref.ref(self))

    try:
        with replaced((ShapeEnv, "__init__", noted)):
            yield
    finally:
        release_trace_state(made)


def release_trace_state(shape_envs=()) -> None:
    """Let go of torch's module-level holders of the last trace and empty the `tracked_fakes` of `shape_envs`
    (weak references: the ShapeEnvs a block made, `trace_state_released`), then collect what that freed."""
    from torch._decomp.decompositions_for_rng import PhiloxStateTracker
    from torch.fx.experimental import proxy_tensor
    from torch.fx.experimental.symbolic_shapes import ShapeEnv

    proxy_tensor._FAKE_TENSOR_ID_TO_PROXY_MAP_FOR_EXPORT.clear()
    for method in vars(ShapeEnv).values():
        clear = getattr(method, "cache_clear", None)
        if callable(clear):
            clear()
    PhiloxStateTracker.reset()
    for reference in shape_envs:
        shape_env = reference()
        if shape_env is not None and shape_env.tracked_fakes:
            shape_env.tracked_fakes.clear()
    for name, entry in list(linecache.cache.items()):
        if len(entry) == 4 and entry[1] is not None:  # a file's lines (its mtime): read again when asked for
            linecache.cache.pop(name, None)
    for _ in range(2):  # the second pass frees what the first one's freed fake tensors held from C++ (their sizes)
        gc.collect()
