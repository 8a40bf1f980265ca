"""What ExecuTorch's runtime alone holds for an exported generation target (issue 45: the gate's artifact side in a
process of its own, as the ONNX gate runs it): a fresh process loads the saved `.pte`/`.ptd` as a user does
(`hfexport.load`) and runs the gate's kind of work on it, greedy generation from the recipe's sample prompts
(batch 2) and, with BIG=1, one prompt pass at the memory plan's bounds (batch 8 x seq 512 for
benchmarks/recipes/smollm2_multi.json), sampling its resident set (/proc/self/smaps_rollup: anonymous and
file-backed) after each step and its high-water mark (VmHWM).

Beside the figures: the program's memory plan (each method's planned buffers, the flatbuffer's
`non_const_buffer_sizes`, allocated when the method loads whatever the input's size), the `.ptd`'s size (XNNPACK packs the weights it reads
from it into its own buffers when the method loads), and the libraries' baseline (the same process before it loads
the program: hfexport, torch, executorch's runtime).

Run: `PYTHONPATH=library .venv/bin/python benchmarks/executorch_runtime_memory.py FOLDER [OUT.json]` where FOLDER is
an exported target's folder (e.g. `hfexport export /tmp/hfexport-smollm2 --recipe benchmarks/recipes/smollm2_multi.json
--target pte-generation -o OUT`, then OUT/pte-generation). Env BIG=1 adds the bound-sized prompt pass.
"""

from __future__ import annotations

import json
import os
import sys
import time
from pathlib import Path

from _process import smaps_rollup

MB = 1 << 20


def resident() -> dict:
    """This process's resident set now (MB): total, anonymous, file-backed, and its high-water mark."""
    fields = {name: kb / 1024 for name, kb in smaps_rollup().items()}
    with open("/proc/self/status") as handle:
        hwm = next(int(line.split()[1]) for line in handle if line.startswith("VmHWM:")) / 1024
    return {"rss_mb": round(fields["Rss"], 1), "anonymous_mb": round(fields["Anonymous"], 1),
            "file_mb": round(fields["Rss"] - fields["Anonymous"], 1), "hwm_mb": round(hwm, 1)}


def main(folder: Path, out: Path | None) -> dict:
    steps = {}
    started = time.perf_counter()
    import torch  # noqa: F401 - the libraries' baseline: what the artifact process imports before any weight
    from executorch import runtime  # noqa: F401

    import hfexport
    from hfexport.exported import ExportedModel

    steps["libraries"] = resident()
    exported = ExportedModel.from_pretrained(folder)
    steps["loaded"] = resident()
    plans = {}
    for path in sorted(folder.glob("*.pte")):
        for plan in _program(path).execution_plan:
            plans[f"{path.stem}.{plan.name}"] = [round(size / MB, 1) for size in plan.non_const_buffer_sizes[1:]]
    recipe = json.loads((folder / "export_config.json").read_text())
    prompts = recipe.get("sample_inputs", {}).get("text") or ["The capital of France is", "The quick brown fox"]
    from tokenizers import Tokenizer

    tokenizer = Tokenizer.from_file(str(folder.parent.parent / "tokenizer.json")) \
        if (folder.parent.parent / "tokenizer.json").is_file() else None
    if tokenizer is None:
        ids = [[1, 2, 3, 4, 5], [6, 7, 8, 9, 10]]
    else:
        ids = [tokenizer.encode(text).ids for text in prompts]
    width = max(len(row) for row in ids)
    input_ids = torch.tensor([[0] * (width - len(row)) + row for row in ids])
    mask = torch.tensor([[0] * (width - len(row)) + [1] * len(row) for row in ids])
    exported.generate(input_ids=input_ids, attention_mask=mask, max_new_tokens=8, do_sample=False)
    steps["generated"] = resident()
    if os.environ.get("BIG"):  # the largest prompt the program takes (its dims' bounds less what a step adds)
        for length in (512, 511, 510, 256):
            big = torch.ones((8, length), dtype=torch.long)
            try:
                exported.generate(input_ids=big, attention_mask=torch.ones_like(big), max_new_tokens=1,
                                  do_sample=False)
            except RuntimeError:
                continue
            steps[f"prompt_8x{length}"] = resident()
            break
    data = sorted(folder.glob("*.ptd"))
    result = {
        "folder": str(folder), "hfexport": hfexport.__version__, "steps": steps,
        "memory_plan_mb": plans, "ptd_mb": {path.name: round(path.stat().st_size / MB, 1) for path in data},
        "peak_rss_mb": steps[list(steps)[-1]]["hwm_mb"],
        "above_libraries_mb": round(steps[list(steps)[-1]]["hwm_mb"] - steps["libraries"]["rss_mb"], 1),
        "seconds": round(time.perf_counter() - started, 1),
        "uptime": os.popen("uptime").read().strip(), "cpu": _cpu(),
    }
    if out is not None:
        out.write_text(json.dumps(result, indent=1) + "\n")
    return result


def _program(path: Path):
    """The `.pte`'s program as executorch's serializer reads it (its flatbuffer alone, before the segments)."""
    from executorch.exir._serialize._program import _flatbuffer_to_program, _get_extended_header

    data = path.read_bytes()
    header = _get_extended_header(data[:64])
    return _flatbuffer_to_program(data[:header.program_size] if header is not None and header.is_valid() else data)


def _cpu() -> str:
    with open("/proc/cpuinfo") as handle:
        return next((line.split(":", 1)[1].strip() for line in handle if line.startswith("model name")), "")


if __name__ == "__main__":
    found = main(Path(sys.argv[1]), Path(sys.argv[2]) if len(sys.argv) > 2 else None)
    print(json.dumps(found, indent=1))
