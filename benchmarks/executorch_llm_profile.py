"""Where an ExecuTorch LLM program's decode step spends its time: an ETDump profile of each folder's `model.pte` (with
its `model.ptd` where there is one), per operator and per layer (issue 27: how hfexport's SmolLM2 program's ~3% decode
gap to optimum-executorch's custom-ops `.pte` was found; `formats/executorch/llm_program._drop_inverse_transposes`).

Each folder runs in a fresh process (`_load_for_executorch(..., enable_etdump=True)`, ExecuTorch's LLM kernels
registered, the thread pool at THREADS, default: ExecuTorch's own): REPEATS times a prompt of PROMPT tokens then DECODE
single-token steps, greedy. Reported per folder: the median decode step (`Method::execute`), the per-step sums of the
XNNPACK delegate calls and of the portable/LLM-kernel operator calls, the median time of `llama::custom_sdpa` per
layer, XNNPACK's linear kernels per step by weight form and the four longest delegate calls (SmolLM2's longest
is its head; decode steps only). ETDump's own overhead is in every figure alike; compare folders, not absolute times.

Run: `python benchmarks/executorch_llm_profile.py FOLDER [FOLDER ...]` (THREADS, PROMPT=30, DECODE=32, REPEATS=3)
-> benchmarks/results/executorch_llm_profile.json (or OUT). The exports: `llm_runtimes_executorch.py` caches them.
"""

from __future__ import annotations

import json
import os
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))

from _process import load, machine  # noqa: E402 - the benchmarks' harness

THREADS = int(os.environ.get("THREADS", "0"))
PROMPT, DECODE, REPEATS = (int(os.environ.get(name, default)) for name, default in
                           (("PROMPT", "30"), ("DECODE", "32"), ("REPEATS", "3")))
OUT = Path(os.environ.get("OUT", HERE / "results" / "executorch_llm_profile.json"))

RUN = r"""
import os, sys, torch
from executorch.extension.llm.custom_ops import custom_ops  # noqa: F401 - the LLM kernels
from executorch.kernels import quantized  # noqa: F401 - an 8da4w program's quantized embedding kernels
from executorch.extension.pybindings import portable_lib
folder, out, threads, prompt, decode, repeats = sys.argv[1], sys.argv[2], *map(int, sys.argv[3:])
if threads:
    portable_lib._unsafe_reset_threadpool(threads)
data = os.path.join(folder, "model.ptd")
module = portable_lib._load_for_executorch(os.path.join(folder, "model.pte"), data if os.path.isfile(data) else None,
                                           enable_etdump=True)
for _ in range(repeats):
    logits = module.forward((torch.arange(100, 100 + prompt).unsqueeze(0), torch.arange(prompt)))[0]
    for step in range(decode):
        token = int(logits[0, -1].argmax())
        logits = module.forward((torch.tensor([[token]]), torch.tensor([prompt + step])))[0]
module.write_etdump_result_to_file(out)
print(portable_lib._threadpool_get_thread_count())
"""


def _profile(folder: Path) -> dict:
    from executorch.devtools import Inspector

    with tempfile.TemporaryDirectory() as scratch:
        dump = Path(scratch) / "etdump.etdp"
        done = subprocess.run([sys.executable, "-c", RUN, str(folder), str(dump), str(THREADS), str(PROMPT),
                               str(DECODE), str(REPEATS)], check=True, capture_output=True, text=True)
        inspector = Inspector(etdump_path=str(dump))
    block = next(block for block in inspector.event_blocks if block.name == "Execute")
    calls = DECODE + 1  # per repeat: the prompt, then DECODE steps

    def decode_median(event) -> float:  # microseconds over the decode steps only
        return statistics.median(raw for index, raw in enumerate(event.perf_data.raw) if index % calls) * 1000

    events = [(event.name, decode_median(event)) for event in block.events
              if event.perf_data is not None and len(event.perf_data.raw) == calls * REPEATS]
    return {
        "threads": int(done.stdout.split()[-1]),
        "decode_step_ms": round(next(t for name, t in events if name == "Method::execute") / 1000, 3),
        "delegate_calls_us_per_step": round(sum(t for name, t in events if name == "DELEGATE_CALL")),
        "operator_calls_us_per_step": round(sum(t for name, t in events if name == "OPERATOR_CALL")),
        "custom_sdpa_us_per_layer": [round(t) for name, t in events if name == "llama::custom_sdpa.out"],
        # XNNPACK's linear kernels per step, by weight form (QB4W: 4-bit groups; QC8W: 8-bit per channel)
        "fully_connected_us_per_step": {form: round(sum(t for name, t in events if name.startswith(
            "Fully Connected") and form in name)) for form in ("QB4W", "QC8W", "QC4W")},
        "largest_delegate_calls_us": sorted((round(t) for name, t in events if name == "DELEGATE_CALL"),
                                            reverse=True)[:4],
    }


def main() -> int:
    folders = [Path(folder) for folder in sys.argv[1:]]
    if not folders:
        raise SystemExit("usage: executorch_llm_profile.py FOLDER [FOLDER ...] (each with model.pte)")
    before = load()
    profiles = {str(folder): _profile(folder) for folder in folders}
    document = {"what": f"ETDump of each program: {REPEATS} x (a {PROMPT}-token prompt, then {DECODE} decode steps); "
                        "medians over the decode steps", "cpu": machine(), "load_average_before": before,
                "load_average_after": load(), "profiles": profiles}
    OUT.parent.mkdir(parents=True, exist_ok=True)
    OUT.write_text(json.dumps(document, indent=2) + "\n")
    print(json.dumps(profiles, indent=2))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
