"""Feasibility of an ONNX gate whose artifact side runs in a torch-free process of its own (issue 45, item 3).

What a fresh process holds that imports only what ONNX parity needs (onnxruntime, NumPy, the torch-free parts of
hfexport: the lean session options and the comparison), with an exported SmolLM2-135M `model.onnx` opened as the gate
opens it (lean: `generation_session_options(prepacking=False)`, the weights memory-mapped) and run on the gate's
probes of `benchmarks/recipes/smollm2_multi.json` (batch 1 x 5 and batch 8 x 37 prompts on an empty cache, then a
2-token decode on each; the eager references stand-ins of the same shapes, compared with
`hfexport.verify.parity.compare_leaves`) and a greedy generation of 8 tokens on 2 prompts of 6.

Run (the export first, as benchmarks/export_memory.py makes it: `hfexport export SMOLLM2 --recipe
benchmarks/recipes/smollm2_multi.json --target onnx-generation -o DIR`):
`PYTHONPATH=library python benchmarks/onnx_gate_feasibility.py DIR/onnx-generation` -> the measurement in a fresh
process under `/usr/bin/time -v` (VmRSS/VmHWM/RssAnon/RssFile at each point, whether torch or transformers got
imported, its maximum RSS), with the CPU and `uptime` around it, into benchmarks/results/onnx_gate_feasibility.json.
"""

from __future__ import annotations

import json
import sys
import time
from pathlib import Path


def status() -> dict:
    fields = {}
    for line in Path("/proc/self/status").read_text().splitlines():
        key, _, value = line.partition(":")
        if key in ("VmRSS", "VmHWM", "RssAnon", "RssFile"):
            fields[key] = round(int(value.split()[0]) / 1024, 1)
    return fields


def main(folder: Path) -> dict:
    points = {"start": status()}
    import numpy
    import onnxruntime

    from hfexport.formats.onnx.program import generation_session_options
    from hfexport.verify.parity import compare_leaves

    points["imported"] = status()
    session = onnxruntime.InferenceSession(str(folder / "model.onnx"), generation_session_options(prepacking=False),
                                           providers=["CPUExecutionProvider"])
    inputs = [spec.name for spec in session.get_inputs()]
    outputs = [spec.name for spec in session.get_outputs()]
    points["session"] = status()
    rng = numpy.random.default_rng(0)
    thresholds = {"default": {"atol": 1e-4, "rtol": 1e-3, "min_cosine": 0.9999, "min_top1": 0.99}, "outputs": {}}

    def run(ids, mask, positions, cache):
        feeds = {"input_ids": ids, "attention_mask": mask, "position_ids": positions}
        for name in inputs:
            if name.startswith("past_key_values."):
                feeds[name] = cache[name]
        found = dict(zip(outputs, session.run(outputs, feeds), strict=True))
        return found["logits"], {name.replace("present.", "past_key_values."): value for name, value in found.items()
                                 if name.startswith("present.")}

    def empty(batch):
        return {name: numpy.zeros((batch, 3, 0, 64), numpy.float32) for name in inputs
                if name.startswith("past_key_values.")}

    started = time.perf_counter()
    for batch, seq in ((1, 5), (8, 37)):
        ids = rng.integers(3, 49152, (batch, seq))
        mask = numpy.ones((batch, seq), numpy.int64)
        positions = numpy.broadcast_to(numpy.arange(seq), (batch, seq)).copy()
        logits, cache = run(ids, mask, positions, empty(batch))
        reference = {"logits": logits.copy(), **{f"c.{k}": v.copy() for k, v in cache.items()}}
        compare_leaves({"logits": logits, **{f"c.{k}": v for k, v in cache.items()}}, reference, thresholds)
        points[f"probe {batch}x{seq}"] = status()
        ids2 = rng.integers(3, 49152, (batch, 2))
        mask2 = numpy.ones((batch, seq + 2), numpy.int64)
        logits2, cache2 = run(ids2, mask2, positions[:, -2:] + 2, cache)
        reference = {"logits": logits2.copy(), **{f"c.{k}": v.copy() for k, v in cache2.items()}}
        compare_leaves({"logits": logits2, **{f"c.{k}": v for k, v in cache2.items()}}, reference, thresholds)
        del logits, cache, logits2, cache2, reference
        points[f"probe {batch}x{seq} decode"] = status()
    ids = rng.integers(3, 49152, (2, 6))
    mask = numpy.ones((2, 6), numpy.int64)
    positions = numpy.broadcast_to(numpy.arange(6), (2, 6)).copy()
    logits, cache = run(ids, mask, positions, empty(2))
    for _ in range(7):
        token = logits[:, -1, :].astype(numpy.float32).argmax(-1)[:, None]
        mask = numpy.concatenate([mask, numpy.ones((2, 1), numpy.int64)], axis=1)
        positions = positions[:, -1:] + 1
        logits, cache = run(token, mask, positions, cache)
    points["generation"] = status()
    return {"seconds": round(time.perf_counter() - started, 2), "points_mb": points,
            "torch_imported": "torch" in sys.modules, "transformers_imported": "transformers" in sys.modules,
            "modules": len(sys.modules)}


def measure(folder: Path) -> None:
    """`main` in a fresh process under `/usr/bin/time -v`, with the machine and its load, into the result file."""
    import os
    import re
    import subprocess
    import tempfile

    from _process import HERE, lscpu

    uptime = subprocess.run(["uptime"], capture_output=True, text=True).stdout.strip()
    with tempfile.TemporaryDirectory() as work:
        stats = Path(work) / "time"
        done = subprocess.run(["/usr/bin/time", "-v", "-o", str(stats), sys.executable, __file__, "--child",
                               str(folder)], capture_output=True, text=True, check=True, env=os.environ)
        peak = int(re.search(r"Maximum resident set size \(kbytes\): (\d+)", stats.read_text()).group(1))
    result = {"what": __doc__.split("\n\n")[1].replace("\n", " "), "onnx_folder": str(folder),
              "weights_mb": round((folder / "model.onnx_data").stat().st_size / 2**20, 1),
              "machine": {"lscpu": lscpu(), "cpus": os.cpu_count()}, "date_utc": time.strftime("%Y-%m-%d %H:%M"),
              "uptime_start": uptime, **json.loads(done.stdout), "time_v_max_rss_mb": round(peak / 1024, 1),
              "uptime_end": subprocess.run(["uptime"], capture_output=True, text=True).stdout.strip()}
    (HERE / "results" / "onnx_gate_feasibility.json").write_text(json.dumps(result, indent=2) + "\n")
    print(json.dumps(result, indent=1))


if __name__ == "__main__":
    if sys.argv[1] == "--child":
        print(json.dumps(main(Path(sys.argv[2]))))
    else:
        measure(Path(sys.argv[1]))
