"""What the gate of an OpenVINO generation target holds, step by step (issue 45): `hfexport export` run in this
process with its steps instrumented, on SmolLM2-135M-Instruct at float32 (SMOLLM2_DIR, default /tmp/hfexport-smollm2;
`hfexport.testing.models.build_smollm2`), `benchmarks/recipes/smollm2_multi.json`'s `openvino-generation`,
`--no-latency`.

Recorded: `/proc/self/status`'s VmRSS, RssAnon and RssFile sampled every 10 ms, the peak between one step and the next
(the save, the gate, `verify_exported`'s eager pass `_references`, each `_load` of the artifact, `_compare`, the
runtime-precision check), the value at each step, the count of OpenVINO's `Core.read_model` and `Core.compile_model`
calls (the real calls, counted), the model's weights by where they live (the mapped checkpoint or the heap), the
report's per-stage peaks and its verification (to compare parity before and after a change), and the process's
peak (`ru_maxrss`).

Run: `PYTHONPATH=library .venv/bin/python benchmarks/gate_openvino_composition.py` (env LABEL names the run, OUT the
result file, default benchmarks/results/gate_openvino_composition.json, merged by label; WORK the output folder).
"""

from __future__ import annotations

import json
import os
import resource
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
SMOLLM2 = Path(os.environ.get("SMOLLM2_DIR", "/tmp/hfexport-smollm2"))
OUT = Path(os.environ.get("OUT", HERE / "results" / "gate_openvino_composition.json"))
WORK = Path(os.environ.get("WORK", Path(tempfile.gettempdir()) / "hfexport-gate-openvino-composition"))
LABEL = os.environ.get("LABEL", "run")
TARGET = "openvino-generation"


def status() -> dict:
    out = {}
    with open("/proc/self/status", encoding="utf-8") as handle:
        for line in handle:
            if line.startswith(("VmRSS", "RssAnon", "RssFile")):
                key, value = line.split(":")
                out[key] = int(value.split()[0]) // 1024
    return out


class Recorder:
    """The step now running, the peak RSS seen since it began (a sampling thread) and the value at each step."""

    def __init__(self):
        self.label, self.peaks, self.steps = "start", {}, []
        threading.Thread(target=self._sample, daemon=True).start()

    def _sample(self) -> None:
        while True:
            now = status()
            if now["VmRSS"] > self.peaks.get(self.label, {}).get("VmRSS", 0):
                self.peaks[self.label] = now
            time.sleep(0.01)

    def mark(self, label: str) -> None:
        self.label = label
        self.steps.append({"step": label, **status()})


def weights_by_mapping(model) -> dict:
    """The model's parameter and buffer bytes (MB) by the file mapping they live in ("anonymous" otherwise)."""
    maps = []
    with open("/proc/self/maps", encoding="utf-8") as handle:
        for line in handle:
            fields = line.split(maxsplit=5)
            low, high = (int(value, 16) for value in fields[0].split("-"))
            maps.append((low, high, os.path.basename(fields[5].strip()) if len(fields) == 6 else "anonymous"))
    sizes, seen = {}, set()
    for tensor in [*model.parameters(), *model.buffers()]:
        storage = tensor.untyped_storage()
        if storage.data_ptr() in seen:
            continue
        seen.add(storage.data_ptr())
        where = next((name for low, high, name in maps if low <= storage.data_ptr() < high), "anonymous")
        sizes[where] = sizes.get(where, 0) + storage.nbytes()
    return {where: round(size / 2**20, 1) for where, size in sizes.items()}


def instrument(recorder: Recorder, result: dict) -> None:
    import openvino

    from hfexport.job import pipeline
    from hfexport.verify import check

    counts = result["openvino_calls"] = {"read_model": 0, "compile_model": 0}
    for name in counts:
        original = getattr(openvino.Core, name)

        def counted(self, *args, _name=name, _original=original, **kwargs):
            counts[_name] += 1
            recorder.mark(f"{_name} #{counts[_name]}")
            value = _original(self, *args, **kwargs)
            recorder.mark(f"after {_name} #{counts[_name]}")
            return value

        setattr(openvino.Core, name, counted)

    def wrap(owner, name: str) -> None:
        original = getattr(owner, name)

        def wrapped(*args, **kwargs):
            recorder.mark(f"enter {name}")
            if name == "_references":
                result["model_weights_mb"] = weights_by_mapping(args[1])
            try:
                return original(*args, **kwargs)
            finally:
                recorder.mark(f"exit {name}")

        setattr(owner, name, wrapped)

    for name in ("verify_exported", "_references", "_load", "_compare", "_runtime_precision_check"):
        wrap(check, name)
    for name in ("save", "gate"):
        wrap(pipeline.TargetPipeline, name)


def main() -> None:
    uptime_before = subprocess.run(["uptime"], capture_output=True, text=True).stdout.strip()
    recorder, result = Recorder(), {}
    instrument(recorder, result)
    from hfexport.machine import cpu_info
    from hfexport.surfaces.cli import main as cli

    out = WORK / LABEL
    report_file = WORK / f"{LABEL}.report.json"
    with open(report_file, "w", encoding="utf-8") as handle:
        stdout, sys.stdout = sys.stdout, handle
        try:
            rc = cli(["export", str(SMOLLM2), "--recipe", str(HERE / "recipes" / "smollm2_multi.json"), "--target",
                      TARGET, "-o", str(out), "--force", "--json", "--quiet", "--no-latency"])
        finally:
            sys.stdout = stdout
    report = json.loads(report_file.read_text())
    target = report["targets"][TARGET]
    result.update(
        date=time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()), cpu=cpu_info(), uptime_before=uptime_before,
        uptime_after=subprocess.run(["uptime"], capture_output=True, text=True).stdout.strip(), returncode=rc,
        process_peak_rss_mb=round(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024, 1),
        stage_peak_rss_mb=(target.get("memory") or {}).get("peak_rss_mb"), status=target["status"],
        peaks_between_steps_mb=recorder.peaks, steps_mb=recorder.steps,
        verification={key: target["verification"].get(key) for key in ("passed", "probes", "generation", "runtime")})
    merged = json.loads(OUT.read_text()) if OUT.is_file() else {}
    merged[LABEL] = result
    OUT.write_text(json.dumps(merged, indent=1) + "\n")
    print(json.dumps({key: result[key] for key in ("process_peak_rss_mb", "stage_peak_rss_mb", "openvino_calls")}))


if __name__ == "__main__":
    main()
