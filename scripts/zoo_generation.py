"""The config zoo's decoders (`hfexport.testing.zoo`: published configs, 2 layers, random weights, each in its published
dtype) through the default generation targets: a job exports each model to `onnx-generation` and `openvino-generation`, and
the gate runs every deployment runtime of the format. One JSON line per model, then a Markdown table, to stdout.

    [MODELS=llama-3.2-1b,...] [INTERMEDIATE=512] python scripts/zoo_generation.py [WORKDIR]

`INTERMEDIATE` cuts every model's MLP width and a MoE block's experts (default 512; `0` keeps the published ones):
no cache or attention shape depends on them, and it keeps the 4096-wide models' exports in minutes. Every format
and task: `scripts/compatibility_matrix.py --zoo`. The runtimes' environments come from
`HFEXPORT_RUNTIME_*`, else `hfexport.testing.peers` builds them (package registries only).
"""

from __future__ import annotations

import json
import os
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
TARGETS = ("onnx-generation", "openvino-generation")


def runtime_environments() -> dict[str, str]:
    from hfexport.testing import peers

    return {"HFEXPORT_RUNTIME_OPTIMUM": str(peers.peer_venv()),
            "HFEXPORT_RUNTIME_ONNXRUNTIME_GENAI": str(peers.genai_venv()),
            "HFEXPORT_RUNTIME_TRANSFORMERS_JS": str(peers.node_modules()),
            "HFEXPORT_RUNTIME_OPENVINO_GENAI": str(peers.openvino_genai_venv()),
            "HFEXPORT_RUNTIME_OPTIMUM_INTEL": str(peers.peer_venv())}


def survey(name: str, workdir: Path, intermediate: int) -> dict:
    """One zoo model's row: the checkpoint's dtype, and per target its status, export dtype and runtime verdicts."""
    from hfexport.job.run import run_job
    from hfexport.testing.zoo import build

    started = time.perf_counter()
    folder = build(name, workdir / name, mlp=intermediate or None)
    report = run_job(folder, workdir / f"{name}-out", list(TARGETS), latency=False)
    row = {"model": name, "checkpoint_dtype": report.source.get("checkpoint_dtype")}
    for target_name, target in report.targets.items():
        verification = target.verification or {}
        row[target_name] = {
            "status": target.status, "error": target.error, "export_dtype": verification.get("export_dtype"),
            "runtimes": {check["runtime"]: check["verdict"] if check["verdict"] == "passed"
                         else f"{check['verdict']}: {check.get('reason') or ''}"[:300]
                         for check in target.runtimes or []}}
    row["seconds"] = round(time.perf_counter() - started, 1)
    return row


def table(rows: list[dict]) -> str:
    lines = ["| model | checkpoint | " + " | ".join(TARGETS) + " | s |", "|---|---|" + "---|" * len(TARGETS) + "---|"]
    for row in rows:
        cells = []
        for target in TARGETS:
            entry = row.get(target) or {}
            runtimes = ", ".join(f"{runtime} {verdict.split(':')[0]}" for runtime, verdict in entry.get(
                "runtimes", {}).items())
            cells.append(f"{entry.get('status', 'error')} ({entry.get('export_dtype')}; {runtimes})")
        lines.append(f"| {row['model']} | {row['checkpoint_dtype']} | " + " | ".join(cells) + f" | {row['seconds']} |")
    return "\n".join(lines)


def main() -> None:
    sys.path.insert(0, str(ROOT / "library"))
    from hfexport.testing.zoo import ZOO

    workdir = Path(sys.argv[1]) if len(sys.argv) > 1 else Path(tempfile.mkdtemp(prefix="hfexport-zoo-"))
    names = [name for name in os.environ.get("MODELS", "").split(",") if name] or [
        name for name, model in ZOO.items() if model.task == "text-generation"]
    intermediate = int(os.environ.get("INTERMEDIATE", "512"))
    for key, value in runtime_environments().items():
        os.environ.setdefault(key, value)
    rows = []
    for name in names:
        rows.append(survey(name, workdir, intermediate))
        print(json.dumps(rows[-1]), flush=True)
    print(table(rows))


if __name__ == "__main__":
    main()
