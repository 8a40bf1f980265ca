"""What the gate holds, step by step (issue 45): `hfexport export` of SmolLM2-135M-Instruct f32 (export_memory.py's
command and recipe, one target, `--no-latency`) in this process, with the resident set (`/proc/self/smaps_rollup`:
Rss and its anonymous part, MB) written to a log before and after each step of the gate: the eager pass
(`_references`), each load of the artifact (`_load`), each probe compared (`_compare_case`), each output leaf
compared (`compare_tensors`, lines starting "  CT") and greedy generation (`_compare_generation`). The log is the
diagnosis; the peaks are the report's and `/usr/bin/time -v`'s.

Run: `PYTHONPATH=library /usr/bin/time -v .venv/bin/python benchmarks/gate_memory_steps.py TARGET LOG` (TARGET:
onnx-generation, openvino-generation or pte-generation; SMOLLM2_DIR, default /tmp/hfexport-smollm2; OUT, the output
folder). Results of the runs in docs/publishing.md, "Memory": benchmarks/results/gate_memory_smollm2.json.
"""

from __future__ import annotations

import os
import runpy
import sys
import tempfile
from pathlib import Path

from _process import smaps_rollup

HERE = Path(__file__).resolve().parent


def rollup() -> dict:
    """`smaps_rollup` in MB."""
    return {name: kb // 1024 for name, kb in smaps_rollup().items()}


def traced(module, name: str, log, label) -> None:
    original = getattr(module, name)

    def wrapper(*args, **kwargs):
        before = rollup()
        result = original(*args, **kwargs)
        print(label(args, kwargs), before, rollup(), file=log)
        return result

    setattr(module, name, wrapper)


def main() -> None:
    target, log_path = sys.argv[1], sys.argv[2]
    log = open(log_path, "w", buffering=1, encoding="utf-8")  # noqa: SIM115 - open for the whole run
    import hfexport.verify.check as check
    import hfexport.verify.parity as parity

    traced(parity, "compare_tensors", log, lambda args, kwargs: f"  CT {tuple(args[1].shape)}")
    traced(check, "_compare_case", log, lambda args, kwargs: f"CASE {args[1].get('name')}")
    traced(check, "_load", log, lambda args, kwargs: f"LOAD {kwargs}")
    traced(check, "_references", log, lambda args, kwargs: "REFS")
    traced(check, "_compare_generation", log, lambda args, kwargs: "GEN")
    model = os.environ.get("SMOLLM2_DIR", str(Path(tempfile.gettempdir()) / "hfexport-smollm2"))
    out = os.environ.get("OUT", str(Path(tempfile.gettempdir()) / f"gate-memory-{target}"))
    sys.argv = ["hfexport", "export", model, "--recipe", str(HERE / "recipes" / "smollm2_multi.json"), "--target",
                target, "-o", out, "--force", "--json", "--quiet", "--no-latency"]
    runpy.run_module("hfexport", run_name="__main__")


if __name__ == "__main__":
    main()
