"""Where an ExecuTorch export's memory goes, phase by phase (issue 45): `hfexport export ARGS` in this process, with
`/proc/self/smaps_rollup` (resident: anonymous, file-backed) read at every job step's start and end and at the
lowering's phase boundaries (the engine's torch.export, `to_edge_transform_and_lower`, each XNNPACK preprocess,
`to_executorch`, the save's `write_to_file` / `write_tensor_data_to_file` and `data_file.separated`), the largest
resident set sampled every 10 ms between two marks (`peak_since_last`), and at each step's ends the live torch
storages the garbage collector still tracks (objects frozen by `hfexport.gc_policy` before planning, the model's
parameters among them, are not counted). tracemalloc cannot see torch's storages; this can. BIG=1 lists, at each
phase's end, every tracked tensor of 8 MiB or more with what refers to it (slow).

Run: `PYTHONPATH=library PROBE_LOG=phases.jsonl .venv/bin/python benchmarks/executorch_export_phases.py export MODEL
--recipe benchmarks/recipes/smollm2_multi.json --target pte-generation -o OUT --force --json --quiet --no-latency`
(one JSON object per mark in PROBE_LOG). The figures docs/workarounds.md quotes for SmolLM2's first 4 layers came
from it (the model cut with `config.num_hidden_layers = 4`, its first layers' weights).
"""
from __future__ import annotations

import functools
import gc
import importlib
import json
import os
import sys
import threading
import time

from _process import smaps_rollup

import hfexport.job.memory as job_memory
from hfexport.surfaces.cli import main

LOG = open(os.environ.get("PROBE_LOG", "executorch_export_phases.jsonl"), "w")  # noqa: SIM115 - the run's log
T0 = time.time()
PEAK = {"mb": 0}
HOOKS = [
    ("transformers.exporters.exporter_executorch", "to_edge_transform_and_lower", "to_edge_transform_and_lower"),
    ("executorch.exir.program._program", "EdgeProgramManager.to_executorch", "to_executorch"),
    ("executorch.exir.program._program", "ExecutorchProgramManager.write_to_file", "write_to_file"),
    ("executorch.exir.program._program", "ExecutorchProgramManager.write_tensor_data_to_file",
     "write_tensor_data_to_file"),
    ("hfexport.formats.executorch.data_file", "separated", "separated"),
    ("executorch.backends.xnnpack.xnnpack_preprocess", "XnnpackBackend.preprocess", "xnnpack_preprocess"),
    ("transformers.exporters.exporter_dynamo", "DynamoExporter.export_program", "torch_export"),
]


def smaps() -> dict:
    out = {name: kb // 1024 for name, kb in smaps_rollup().items()}
    out["File"] = out["Rss"] - out["Anonymous"]
    return out


def sampler() -> None:
    while True:
        with open("/proc/self/statm") as handle:
            PEAK["mb"] = max(PEAK["mb"], int(handle.read().split()[1]) * 4096 // 2**20)
        time.sleep(0.01)


def _tensors():
    import torch

    for obj in gc.get_objects():
        if isinstance(obj, torch.Tensor) and type(obj).__name__ not in ("FakeTensor", "FunctionalTensor") \
                and obj.device.type == "cpu":
            yield obj


def storages() -> dict:
    """The live (tracked) torch storages: count and MB, and those over 1 MiB."""
    if "torch" not in sys.modules:
        return {}
    seen = {}
    for tensor in _tensors():
        storage = tensor.untyped_storage()
        if storage.data_ptr():
            seen[storage.data_ptr()] = storage.nbytes()
    big = [size for size in seen.values() if size > 2**20]
    return {"n": len(seen), "MB": sum(seen.values()) // 2**20, "n>1MB": len(big), "MB>1MB": sum(big) // 2**20}


def big_tensors() -> list:
    """Every tracked tensor of 8 MiB or more: type, shape, MB, what refers to it."""
    found = []
    for tensor in _tensors():
        storage = tensor.untyped_storage()
        if storage.nbytes() <= 8 * 2**20:
            continue
        refs = []
        for referrer in gc.get_referrers(tensor):
            if isinstance(referrer, dict):
                refs += [str(key)[:50] for key, value in referrer.items() if value is tensor][:3]
            else:
                refs.append(type(referrer).__name__)
        found.append((type(tensor).__name__, tuple(tensor.shape), storage.nbytes() >> 20, refs[:6]))
    return found


def mark(label: str, deep: bool = False) -> None:
    record = {"t": round(time.time() - T0, 1), "label": label, **smaps(), "peak_since_last": PEAK["mb"]}
    PEAK["mb"] = 0
    if deep:
        record["torch"] = storages()
        if os.environ.get("BIG") and label.startswith("<"):
            record["big"] = big_tensors()
    LOG.write(json.dumps(record) + "\n")
    LOG.flush()


def wrap(module: str, path: str, name: str, deep: bool = True) -> None:
    owner = importlib.import_module(module)
    *parents, attribute = path.split(".")
    for parent in parents:
        owner = getattr(owner, parent)
    declared = owner.__dict__[attribute]
    original = getattr(owner, attribute)

    @functools.wraps(original)
    def wrapped(*args, **kwargs):
        mark(f"> {name}", deep)
        try:
            return original(*args, **kwargs)
        finally:
            mark(f"< {name}", deep)

    setattr(owner, attribute, staticmethod(wrapped) if isinstance(declared, staticmethod) else wrapped)


def call(self, step, _original=job_memory.StageMemory.__call__, _hooked=[]):  # noqa: B006 - once per process
    if not _hooked and "torch" in sys.modules:
        for module, path, name in HOOKS:
            wrap(module, path, name, deep=name != "xnnpack_preprocess")
        _hooked.append(True)
    mark(f"step {step.step} {step.status}", deep=step.status in ("start", "done"))
    return _original(self, step)


if __name__ == "__main__":
    threading.Thread(target=sampler, daemon=True).start()
    job_memory.StageMemory.__call__ = call
    try:
        sys.exit(main(sys.argv[1:]))
    finally:
        mark("exit", True)
