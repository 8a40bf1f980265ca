"""Where an ONNX generation graph's decode step spends its time in ONNX Runtime: each folder's `model.onnx` (hfexport's
variant folders and onnxruntime-genai's model builder's) profiled by ONNX Runtime's own profiler
(`SessionOptions.enable_profiling`) over decode steps at one cache length (issue 46: hfexport's q4 against the
builder's int4 at equal bits).

Each folder runs in a fresh process: a session at THREADS intra-op threads (ORT_ENABLE_ALL, as onnxruntime-genai's
default), a prompt of PROMPT tokens with an empty cache, then REPEATS decode steps of one token each over that prompt's
cache (the same step again: the cache length stays PROMPT, so every step does the same work), the first WARMUP of
them not counted. The inputs are read off the graph: `input_ids`, `attention_mask` (ones over the cache and the new
token) and `position_ids` where the graph has them, the cache (`past_key_values.N.key/value` -> `present.N.key/value`).
Reported per folder: the graph's node count and op histogram (as stored), the nodes the step runs (the profiler's
kernel events in one `model_run`, after ONNX Runtime's own fusions), the median step (`model_run`), and the kernel time
per op type per step (the median over steps of each op type's summed kernel time), top first; `MatMulNBits` also by
its weight's shape (N x K) and bits, so the head shows apart. The profiler's overhead is in every figure alike:
compare folders run in the same load, not absolute times.

Run: `python benchmarks/ort_decode_profile.py NAME=FOLDER [NAME=FOLDER ...]` (THREADS=2, PROMPT=100, REPEATS=60,
WARMUP=10) -> benchmarks/results/ort_decode_profile.json (or OUT); the CPU and the load average before and after are
recorded. The folders: benchmarks/variant_speed.py's (`FORMATS=onnx`, its WORK).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))

from _process import load, machine  # noqa: E402 - the benchmarks' harness

THREADS, PROMPT, REPEATS, WARMUP = (int(os.environ.get(name, default)) for name, default in
                                    (("THREADS", "2"), ("PROMPT", "100"), ("REPEATS", "60"), ("WARMUP", "10")))
OUT = Path(os.environ.get("OUT", HERE / "results" / "ort_decode_profile.json"))

RUN = r"""
import collections, json, os, statistics, sys, tempfile
import numpy as np, onnx, onnxruntime as ort
folder, threads, prompt, repeats, warmup = sys.argv[1], *map(int, sys.argv[2:])
path = os.path.join(folder, "model.onnx")
graph = onnx.load(path, load_external_data=False).graph
weights = {tensor.name: list(tensor.dims) for tensor in graph.initializer}
matmulnbits = {node.name: {a.name: a.i for a in node.attribute if a.type == onnx.AttributeProto.INT}
               for node in graph.node if node.op_type == "MatMulNBits"}
options = ort.SessionOptions()
options.intra_op_num_threads = threads
options.enable_profiling = True
options.profile_file_prefix = os.path.join(tempfile.mkdtemp(), "profile")
session = ort.InferenceSession(path, options, providers=["CPUExecutionProvider"])
inputs = {value.name: value for value in session.get_inputs()}
past = [name for name in inputs if name.startswith("past_key_values.")]
shape = inputs[past[0]].shape
decoder = json.load(open(os.path.join(folder, "genai_config.json")))["model"]["decoder"]
# the builder's graph names its cache's head axis (`kv_cache_dim`): the config's sizes where an axis is not a number
heads = shape[1] if isinstance(shape[1], int) else decoder["num_key_value_heads"]
head_size = shape[3] if isinstance(shape[3], int) else decoder["head_size"]
def feed(ids, cache, width):
    feeds = {"input_ids": np.asarray([ids], dtype=np.int64)}
    if "attention_mask" in inputs:
        feeds["attention_mask"] = np.ones((1, width), dtype=np.int64)
    if "position_ids" in inputs:
        feeds["position_ids"] = np.arange(width - len(ids), width, dtype=np.int64)[None]
    for name in past:
        feeds[name] = cache[name]
    return feeds
dtype = np.float16 if "float16" in inputs[past[0]].type else np.float32
empty = {name: np.zeros((1, heads, 0, head_size), dtype=dtype) for name in past}
outputs = [value.name for value in session.get_outputs()]
result = session.run(None, feed(list(range(100, 100 + prompt)), empty, prompt))
cache = {name: result[outputs.index(name.replace("past_key_values.", "present."))] for name in past}
token = int(result[0][0, -1].argmax())
for _ in range(repeats):
    session.run(None, feed([token], cache, prompt + 1))
events = json.load(open(session.end_profiling()))
runs = [event for event in events if event.get("name") == "model_run"][-(repeats - warmup):]
kernels = [event for event in events if event.get("cat") == "Node" and event["name"].endswith("_kernel_time")]
steps = []
for run in runs:
    start, end = run["ts"], run["ts"] + run["dur"]
    steps.append([event for event in kernels if start <= event["ts"] <= end])
def label(event):
    op = event["args"]["op_name"]
    node = event["name"][: -len("_kernel_time")]
    if op == "MatMulNBits" and node in matmulnbits:
        attrs = matmulnbits[node]
        return f"MatMulNBits {attrs['N']}x{attrs['K']} {attrs['bits']}-bit level {attrs.get('accuracy_level', 0)}"
    return op
per_op = collections.defaultdict(list)
for step in steps:
    sums = collections.Counter()
    for event in step:
        sums[label(event)] += event["dur"]
    for op in set(label(event) for events_ in steps for event in events_):
        per_op[op].append(sums.get(op, 0))
counts = collections.Counter(label(event) for event in steps[-1])
op_ms = {op: round(statistics.median(values) / 1000, 4) for op, values in per_op.items()}
print(json.dumps({
    "graph_nodes": len(graph.node),
    "graph_ops": dict(collections.Counter(f"{n.domain}::{n.op_type}" if n.domain else n.op_type
                                          for n in graph.node).most_common()),
    "run_nodes": len(steps[-1]),
    "step_ms": round(statistics.median(run["dur"] for run in runs) / 1000, 3),
    "kernel_ms": round(statistics.median(sum(e["dur"] for e in step) for step in steps) / 1000, 3),
    "steps": len(runs),
    "op_ms": dict(sorted(op_ms.items(), key=lambda item: -item[1])),
    "op_nodes_per_step": dict(counts.most_common()),
}))
"""


def profile(folder: Path) -> dict:
    """One process's profile of `folder`'s graph (RUN)."""
    command = [sys.executable, "-c", RUN, str(folder), str(THREADS), str(PROMPT), str(REPEATS), str(WARMUP)]
    run = subprocess.run(command, capture_output=True, text=True)
    if run.returncode:
        raise SystemExit(f"{folder}: {run.stderr[-2000:]}")
    return json.loads(run.stdout.splitlines()[-1])


def main() -> dict:
    folders = dict(argument.split("=", 1) for argument in sys.argv[1:])
    result = {"about": __doc__.split("\n\n")[0], "machine": machine(), "threads": THREADS, "prompt": PROMPT,
              "steps": REPEATS - WARMUP, "load_average_before": load(), "folders": {}}
    for name, folder in folders.items():
        result["folders"][name] = {"folder": folder, **profile(Path(folder))}
        print(name, json.dumps({key: result["folders"][name][key] for key in ("run_nodes", "step_ms", "kernel_ms")}),
              file=sys.stderr, flush=True)
    result["load_average_after"] = load()
    OUT.parent.mkdir(parents=True, exist_ok=True)
    OUT.write_text(json.dumps(result, indent=2) + "\n")
    return result


if __name__ == "__main__":
    main()
