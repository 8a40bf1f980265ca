"""What the export and the save leave on the heap when the gate starts (issue 45): `hfexport export` of
SmolLM2-135M-Instruct f32 (export_memory.py's command and recipe, one target, `--no-latency`) in this process; at the
gate's start (`hfexport.job.pipeline.load_reference`) the resident set (`/proc/self/smaps_rollup`: Rss, Anonymous),
pymalloc's arenas (`sys._debugmallocstats`) and the most numerous live Python objects are recorded, then again after
each release tried in turn, cumulative:

- `collect`: `gc.collect()` and glibc's `malloc_trim(0)`;
- `caches`: `torch._dynamo.reset()`, sympy's cache and every `functools.lru_cache` cleared, collected, trimmed;
- `holders`: the two module-level holders that keep the last export's objects reachable: torch.export's non-strict
  tracer's `proxy_tensor._FAKE_TENSOR_ID_TO_PROXY_MAP_FOR_EXPORT` (fake tensor id -> fx Node, cleared only when the
  next trace starts) and onnxscript's rewrite rules' pattern matchers (`_matcher.PatternMatcher`: the last rewrite's
  graph, node and match), then collected and trimmed.

Run: `PYTHONPATH=library .venv/bin/python benchmarks/gate_heap.py TARGET RESULT.json` (TARGET: onnx-generation or
openvino-generation; SMOLLM2_DIR, default /tmp/hfexport-smollm2; OUT, the output folder). Results:
benchmarks/results/gate_memory_smollm2.json's `heap_at_gate`.
"""

from __future__ import annotations

import collections
import ctypes
import functools
import gc
import json
import os
import runpy
import subprocess
import sys
import tempfile
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))

from gate_memory_steps import rollup  # noqa: E402 - the resident set from smaps_rollup, MB


def pymalloc() -> dict:
    """pymalloc's arenas, the bytes in live blocks and its unused pools, from `sys._debugmallocstats` (stderr)."""
    read, write = os.pipe()
    saved = os.dup(2)
    os.dup2(write, 2)
    try:
        sys._debugmallocstats()
    finally:
        os.dup2(saved, 2)
        os.close(write)
    text = os.read(read, 1 << 20).decode()
    os.close(read)
    figures = {}
    for line in text.splitlines():
        name, _, value = line.partition("=")
        value = value.strip().replace(",", "")
        if name.startswith("# arenas allocated current"):
            figures["arenas"] = int(value)
        elif name.startswith("# bytes in allocated blocks"):
            figures["live_blocks_mb"] = round(int(value) / 2**20, 1)
        elif "unused pools" in name:
            figures["unused_pools_mb"] = round(int(value) / 2**20, 1)
    return figures


def snapshot(label: str) -> dict:
    objects = gc.get_objects()
    kinds = collections.Counter(f"{type(obj).__module__}.{type(obj).__name__}" for obj in objects)
    return {"after": label, **{f"{key}_mb": mb for key, mb in rollup().items()}, **pymalloc(), "gc_objects": len(objects),
            "fx_nodes": kinds["torch.fx.node.Node"], "top": kinds.most_common(8)}


def trim() -> None:
    gc.collect()
    ctypes.CDLL("libc.so.6").malloc_trim(0)


def clear_caches() -> None:
    import sympy.core.cache
    import torch

    torch._dynamo.reset()
    sympy.core.cache.clear_cache()
    for obj in gc.get_objects():
        if isinstance(obj, functools._lru_cache_wrapper):
            obj.cache_clear()
    trim()


def clear_holders() -> None:
    from torch.fx.experimental import proxy_tensor

    proxy_tensor._FAKE_TENSOR_ID_TO_PROXY_MAP_FOR_EXPORT.clear()
    matcher = sys.modules.get("onnxscript.rewriter._matcher")
    if matcher is not None:
        for obj in [obj for obj in gc.get_objects() if isinstance(obj, matcher.PatternMatcher)]:
            state = vars(obj)
            for name in ("_graph", "_current_node", "_tracer"):
                if name in state:
                    state[name] = None
            if "_match" in state:
                state["_match"] = type(state["_match"])()
    trim()


def main() -> None:
    target, result_path = sys.argv[1], Path(sys.argv[2])
    import hfexport.job.pipeline as pipeline

    steps = []
    original = pipeline.load_reference

    def load_reference(job, plan):
        steps.append(snapshot("save (nothing released)"))
        for label, release in (("collect", trim), ("caches", clear_caches), ("holders", clear_holders)):
            release()
            steps.append(snapshot(label))
        return original(job, plan)

    pipeline.load_reference = load_reference
    model = os.environ.get("SMOLLM2_DIR", str(Path(tempfile.gettempdir()) / "hfexport-smollm2"))
    out = os.environ.get("OUT", str(Path(tempfile.gettempdir()) / f"gate-heap-{target}"))
    uptime = subprocess.run(["uptime"], capture_output=True, text=True).stdout.strip()
    sys.argv = ["hfexport", "export", model, "--recipe", str(HERE / "recipes" / "smollm2_multi.json"), "--target",
                target, "-o", out, "--force", "--json", "--quiet", "--no-latency"]
    try:
        runpy.run_module("hfexport", run_name="__main__")
    except SystemExit:
        pass
    result_path.write_text(json.dumps({"target": target, "uptime_start": uptime, "uptime_end": subprocess.run(
        ["uptime"], capture_output=True, text=True).stdout.strip(), "at_gate_start": steps}, indent=1) + "\n")


if __name__ == "__main__":
    main()
