"""The deployment runtimes' column of the compatibility matrix for the decoder families: each tiny decoder
(`hfexport.testing.models`: Llama, GPT-2, Qwen2, Gemma3, Phi-3, Mistral) exported by a job to its OpenVINO and
ExecuTorch generation targets, the gate running every runtime of the format (`hfexport.deployment.RUNTIMES`) on the
saved files; each verdict, with why where it is not a pass, goes to docs/llm_runtimes.json and a Markdown table on
stdout (pasted into docs/generation.md#deployment-runtimes).

    HFEXPORT_RUNTIME_OPENVINO_GENAI=... HFEXPORT_RUNTIME_OPTIMUM_INTEL=... python scripts/llm_runtimes.py [WORKDIR]
    FORMATS=executorch python scripts/llm_runtimes.py [WORKDIR]   # TextLLMRunner, beside hfexport's executorch

Without those variables the runtimes' own environments are built (hfexport.testing.peers) and used. FORMATS
(default `openvino`; `openvino,executorch`) names the formats run; the json keeps the other formats' rows.
"""

from __future__ import annotations

import json
import os
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
FAMILIES = ["tiny-llama", "tiny-gpt2", "tiny-qwen2", "tiny-gemma3", "tiny-phi3", "tiny-mistral"]
FORMATS = {"openvino": "openvino-generation", "executorch": "executorch-generation"}


def main() -> int:
    from hfexport.job.run import run_job
    from hfexport.testing import peers
    from hfexport.testing.matrix import ensure_models
    from hfexport.version import __version__

    workdir = Path(sys.argv[1] if len(sys.argv) > 1 else "/tmp/hfexport-llm-runtimes")
    formats = os.environ.get("FORMATS", "openvino").split(",")
    if "openvino" in formats:
        os.environ.setdefault("HFEXPORT_RUNTIME_OPENVINO_GENAI", str(peers.openvino_genai_venv()))
        os.environ.setdefault("HFEXPORT_RUNTIME_OPTIMUM_INTEL", str(peers.peer_venv()))
    models = ensure_models(workdir, FAMILIES)
    rows = []
    for name in FAMILIES:
        for export_format in formats:
            target = FORMATS[export_format]
            started = time.perf_counter()
            report = run_job(models[name], workdir / "out" / name, targets=[target], latency=False, workers=1)
            result = report.targets[target]
            rows.append({"model": name, "format": export_format, "status": result.status,
                         "error": result.error, "runtimes": result.runtimes,
                         "wall_s": round(time.perf_counter() - started, 1)})
            print(json.dumps(rows[-1])[:400], file=sys.stderr, flush=True)
    result = ROOT / "docs" / "llm_runtimes.json"
    try:  # the rows of the formats not run this time are kept
        kept = [row for row in json.loads(result.read_text())["rows"] if row["format"] not in formats]
    except (OSError, ValueError, KeyError):
        kept = []
    rows = sorted(kept + rows, key=lambda row: (FAMILIES.index(row["model"]), row["format"]))
    document = {"hfexport": __version__, "generated": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
                "rows": rows}
    result.write_text(json.dumps(document, indent=2) + "\n")
    runtimes = sorted({check["runtime"] for row in rows for check in row["runtimes"]})
    print("| model | format | export | " + " | ".join(runtimes) + " |")
    print("|---|---|---|" + "---|" * len(runtimes))
    for row in rows:
        cells = []
        for runtime in runtimes:
            found = [check for check in row["runtimes"] if check["runtime"] == runtime]
            cells.append(" / ".join(f"{check['verdict']} ({check.get('precision') or '—'})"
                                    + (f": {check['reason']}" if check.get("reason") else "") for check in found)
                         or "—")
        print(f"| `{row['model']}` | {row['format']} | {row['status']} | " + " | ".join(cells) + " |")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
