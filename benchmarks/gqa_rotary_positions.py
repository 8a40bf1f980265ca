"""Whether ONNX Runtime's `GroupQueryAttention` can rotate q and k itself at the graph's `position_ids` (its input 9,
`do_rotary` 1, packed q/k/v) in place of the fused variants' `Split` and two `RotaryEmbedding` nodes per layer
(`hfexport.formats.onnx.attention_fusion`; 90 of the 412 nodes a SmolLM2 q4 decode step runs), with the same
results: issue 46, q4's node count against the model builder's.

Two one-layer graphs (4 query heads, 2 key/value heads, head size 16, a 64-position cos/sin table): `split` as
hfexport writes it (Split, RotaryEmbedding for q and for k, GroupQueryAttention with `do_rotary` 0 and the mask as
`attention_bias`) and `packed` (one GroupQueryAttention over the packed projection, `do_rotary` 1, the cos/sin tables
and `position_ids` as inputs 7-9, the same bias). Both run on the same random inputs in each case: a one-row prompt
from position 0, a decode step of two rows at positions 3 and 7 over a 7-slot cache, a two-row prompt from 0, a
left-padded two-row prompt as transformers writes its positions (`[1, 1, 0, 1, 2, 3]`: `cumsum(mask) - 1`, padding
1) and a two-row prompt at arbitrary positions. Reported per case and runtime: the largest difference of the
attention output and of the present key and value. Runtimes: ONNX Runtime (hfexport's venv) and onnxruntime-node
(`hfexport.testing.peers.node_modules`, transformers.js' runtime), where installed.

Run: `python benchmarks/gqa_rotary_positions.py` -> benchmarks/results/gqa_rotary_positions.json (or OUT).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import tempfile
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parent / "library"))
sys.path.insert(0, str(HERE))

from _process import machine  # noqa: E402 - the benchmarks' harness

OUT = Path(os.environ.get("OUT", HERE / "results" / "gqa_rotary_positions.json"))
HEADS, KV_HEADS, HEAD_SIZE, POSITIONS = 4, 2, 16, 64
#: case name -> (past length, new tokens, each row's positions)
CASES = {"prompt, 1 row": (0, 5, [[0, 1, 2, 3, 4]]),
         "decode, 2 rows at 3 and 7": (7, 1, [[3], [7]]),
         "prompt, 2 rows from 0": (0, 6, [[0, 1, 2, 3, 4, 5]] * 2),
         "prompt, 2 rows, row 0 left-padded by 2": (0, 6, [[1, 1, 0, 1, 2, 3], [0, 1, 2, 3, 4, 5]]),
         "prompt, 2 rows at arbitrary positions": (0, 4, [[5, 9, 2, 7], [3, 3, 3, 3]])}

NODE = r"""
import ort from "onnxruntime-node";
import fs from "fs";
const [folder] = process.argv.slice(2);
const cases = JSON.parse(fs.readFileSync(folder + "/cases.json"));
const split = await ort.InferenceSession.create(folder + "/split.onnx");
const packed = await ort.InferenceSession.create(folder + "/packed.onnx");
const result = {};
for (const [name, feeds] of Object.entries(cases)) {
  const tensors = {};
  for (const [key, v] of Object.entries(feeds)) {
    const data = v.dtype === "float32" ? Float32Array.from(v.data)
      : v.dtype === "int64" ? BigInt64Array.from(v.data.map(BigInt)) : Int32Array.from(v.data);
    tensors[key] = new ort.Tensor(v.dtype, data, v.shape);
  }
  const a = await split.run(tensors), b = await packed.run(tensors);
  result[name] = ["out", "present_key", "present_value"].map(n => {
    let m = 0; for (let i = 0; i < a[n].data.length; i++) m = Math.max(m, Math.abs(a[n].data[i] - b[n].data[i]));
    return m; });
}
console.log(JSON.stringify({version: ort.env.versions.node, cases: result}));
"""


def graphs():
    """The `split` and `packed` one-layer models (onnx ModelProto)."""
    import numpy as np
    import onnx
    from onnx import TensorProto, helper

    angles = np.arange(POSITIONS)[:, None] / (10000 ** (np.arange(0, HEAD_SIZE, 2) / HEAD_SIZE))[None]
    tables = [onnx.numpy_helper.from_array(np.cos(angles).astype(np.float32), "cos"),
              onnx.numpy_helper.from_array(np.sin(angles).astype(np.float32), "sin")]
    width = (HEADS + 2 * KV_HEADS) * HEAD_SIZE
    inputs = [helper.make_tensor_value_info("qkv", TensorProto.FLOAT, ["b", "s", width]),
              helper.make_tensor_value_info("position_ids", TensorProto.INT64, ["b", "s"]),
              helper.make_tensor_value_info("past_key", TensorProto.FLOAT, ["b", KV_HEADS, "p", HEAD_SIZE]),
              helper.make_tensor_value_info("past_value", TensorProto.FLOAT, ["b", KV_HEADS, "p", HEAD_SIZE]),
              helper.make_tensor_value_info("seqlens_k", TensorProto.INT32, ["b"]),
              helper.make_tensor_value_info("total", TensorProto.INT32, []),
              helper.make_tensor_value_info("bias", TensorProto.FLOAT, ["b", 1, "s", "t"])]
    outputs = [helper.make_tensor_value_info(name, TensorProto.FLOAT, None)
               for name in ("out", "present_key", "present_value")]
    attention = {"domain": "com.microsoft", "num_heads": HEADS, "kv_num_heads": KV_HEADS}
    cache = ["past_key", "past_value", "seqlens_k", "total"]
    widths = onnx.numpy_helper.from_array(np.asarray([HEADS * HEAD_SIZE, KV_HEADS * HEAD_SIZE,
                                                      KV_HEADS * HEAD_SIZE], dtype=np.int64), "widths")
    split = [helper.make_node("Split", ["qkv", "widths"], ["q", "k", "v"], axis=-1),
             helper.make_node("RotaryEmbedding", ["q", "position_ids", "cos", "sin"], ["q_rotated"],
                              domain="com.microsoft", num_heads=HEADS),
             helper.make_node("RotaryEmbedding", ["k", "position_ids", "cos", "sin"], ["k_rotated"],
                              domain="com.microsoft", num_heads=KV_HEADS),
             helper.make_node("GroupQueryAttention", ["q_rotated", "k_rotated", "v", *cache, "", "", "", "bias"],
                              ["out", "present_key", "present_value"], do_rotary=0, **attention)]
    packed = [helper.make_node("GroupQueryAttention", ["qkv", "", "", *cache, "cos", "sin", "position_ids", "bias"],
                               ["out", "present_key", "present_value"], do_rotary=1, **attention)]
    opsets = [helper.make_opsetid("", 17), helper.make_opsetid("com.microsoft", 1)]
    return {name: helper.make_model(helper.make_graph(nodes, name, inputs, outputs, initializers),
                                    opset_imports=opsets, ir_version=10)  # onnxruntime-node 1.30 reads up to 10-13
            for name, nodes, initializers in (("split", split, [*tables, widths]), ("packed", packed, tables))}


def feeds() -> dict:
    """Each case's inputs (numpy), the mask as `attention_bias`: causal, row 0's padding masked."""
    import numpy as np

    rng = np.random.default_rng(0)
    out = {}
    for name, (past, new, positions) in CASES.items():
        rows = len(positions)
        bias = np.zeros((rows, 1, new, past + new), np.float32)
        for i in range(new):
            bias[:, :, i, past + i + 1:] = np.finfo(np.float32).min
        if "left-padded" in name:
            bias[0, :, :, :2] = np.finfo(np.float32).min
        out[name] = {"qkv": rng.standard_normal((rows, new, (HEADS + 2 * KV_HEADS) * HEAD_SIZE)).astype(np.float32),
                     "position_ids": np.asarray(positions, dtype=np.int64),
                     "past_key": rng.standard_normal((rows, KV_HEADS, past, HEAD_SIZE)).astype(np.float32),
                     "past_value": rng.standard_normal((rows, KV_HEADS, past, HEAD_SIZE)).astype(np.float32),
                     "seqlens_k": np.full([rows], past + new - 1, np.int32),
                     "total": np.asarray(past + new, np.int32), "bias": bias}
    return out


def main() -> dict:
    import numpy as np
    import onnx
    import onnxruntime as ort

    models, cases = graphs(), feeds()
    sessions = {name: ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"])
                for name, model in models.items()}
    python = {name: [float(np.abs(a - b).max()) for a, b in zip(sessions["split"].run(None, inputs),
                                                                 sessions["packed"].run(None, inputs), strict=True)]
              for name, inputs in cases.items()}
    result = {"about": __doc__.split("\n\n")[0], "machine": machine(),
              "columns": ["out", "present_key", "present_value"],
              "onnxruntime": {"version": ort.__version__, "cases": python}}
    try:
        from hfexport.testing import peers

        modules = peers.node_modules()
    except Exception as error:  # noqa: BLE001 - onnxruntime-node is optional here
        result["onnxruntime-node"] = f"not run: {type(error).__name__}: {error}"
    else:
        with tempfile.TemporaryDirectory() as scratch:
            for name, model in models.items():
                onnx.save(model, f"{scratch}/{name}.onnx")
            Path(scratch, "cases.json").write_text(json.dumps(
                {name: {key: {"shape": list(value.shape), "dtype": str(value.dtype), "data": value.ravel().tolist()}
                        for key, value in inputs.items()} for name, inputs in cases.items()}))
            Path(scratch, "run.mjs").write_text(NODE)
            (Path(scratch) / "node_modules").symlink_to(Path(modules) / "node_modules", target_is_directory=True)
            node = subprocess.run(["node", f"{scratch}/run.mjs", scratch], capture_output=True, text=True, check=True)
            result["onnxruntime-node"] = json.loads(node.stdout.splitlines()[-1])
    OUT.parent.mkdir(parents=True, exist_ok=True)
    OUT.write_text(json.dumps(result, indent=2) + "\n")
    print(json.dumps({key: result[key] for key in ("onnxruntime", "onnxruntime-node")}, indent=1))
    return result


if __name__ == "__main__":
    main()
