"""One `MatMulNBits` node of SmolLM2-135M's head shape (N 49152, K 576; a decode step: M 1) in ONNX Runtime's CPU
provider, per bits, block size and `accuracy_level`: why an 8-bit block graph (q8, q4's 8-bit head) decodes slowly.

ONNX Runtime's CPU kernels for 8-bit blocks compute in int8 (`accuracy_level` 4, `CompInt8`); at the default (unset:
fp32 compute) there is none, and the node dequantizes its whole weight to float32 on every call. Random weights and
scales (timing only), THREADS intra-op threads, median of CALLS calls after 3 warm-ups.

Run: `PYTHONPATH=library .venv/bin/python benchmarks/matmulnbits_8bit.py` (THREADS 2, CALLS 20) ->
benchmarks/results/matmulnbits_8bit.json (or OUT), with the CPU, ONNX Runtime's version and the load before and after.
"""

from __future__ import annotations

import json
import os
import statistics
import sys
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parent / "library"))

from _process import load, machine  # noqa: E402 - the benchmarks' harness

N, K = 49152, 576
THREADS = int(os.environ.get("THREADS", "2"))
CALLS = int(os.environ.get("CALLS", "20"))
OUT = Path(os.environ.get("OUT", HERE / "results" / "matmulnbits_8bit.json"))
CASES = [(4, 32, None), (4, 32, 4), (8, 32, None), (8, 32, 4), (8, 64, None), (8, 64, 4)]


def session(bits: int, block: int, level: int | None):
    import numpy as np
    import onnxruntime
    from onnx import TensorProto, helper, numpy_helper

    blocks = K // block
    rng = np.random.default_rng(0)
    data = rng.integers(0, 255, size=(N, blocks, block * bits // 8), dtype=np.uint8)
    scales = (rng.random(N * blocks, dtype=np.float32) * 0.01).astype(np.float32)
    attributes = {"K": K, "N": N, "bits": bits, "block_size": block}
    if level is not None:
        attributes["accuracy_level"] = level
    node = helper.make_node("MatMulNBits", ["x", "B", "scales"], ["y"], domain="com.microsoft", **attributes)
    graph = helper.make_graph([node], "head", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 1, K])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, 1, N])],
                              [numpy_helper.from_array(data, "B"), numpy_helper.from_array(scales, "scales")])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17), helper.make_opsetid("com.microsoft", 1)])
    options = onnxruntime.SessionOptions()
    options.intra_op_num_threads = THREADS
    return onnxruntime.InferenceSession(model.SerializeToString(), options, providers=["CPUExecutionProvider"])


def main() -> dict:
    import numpy as np
    import onnxruntime

    before = load()
    x = np.random.default_rng(1).random((1, 1, K), dtype=np.float32)
    rows = []
    for bits, block, level in CASES:
        run = session(bits, block, level)
        for _ in range(3):
            run.run(None, {"x": x})
        times = []
        for _ in range(CALLS):
            started = time.perf_counter()
            run.run(None, {"x": x})
            times.append((time.perf_counter() - started) * 1000)
        rows.append({"bits": bits, "block_size": block, "accuracy_level": level,
                     "median_ms": round(statistics.median(times), 2)})
        print(json.dumps(rows[-1]), flush=True)
    return {"about": __doc__.split("\n\n")[0], "shape": {"M": 1, "N": N, "K": K}, "threads": THREADS, "calls": CALLS,
            "onnxruntime": onnxruntime.__version__, "machine": machine(), "load_average_before": before,
            "load_average_after": load(), "cases": rows}


if __name__ == "__main__":
    result = main()
    OUT.write_text(json.dumps(result, indent=2) + "\n")
