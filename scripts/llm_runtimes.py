"""The deployment runtimes' column of the compatibility matrix for the decoder families: each tiny decoder
(`hfexport.testing.models`: Llama, GPT-2, Qwen2, Gemma3, Phi-3, Mistral) exported by a job to its OpenVINO and
ExecuTorch generation targets, the gate running every runtime of the format (`hfexport.deployment.RUNTIMES`) on the
saved files; each verdict, with why where it is not a pass, goes to docs/llm_runtimes.json and a Markdown table on
stdout (pasted into docs/generation.md#deployment-runtimes).

    HFEXPORT_RUNTIME_OPENVINO_GENAI=... HFEXPORT_RUNTIME_OPTIMUM_INTEL=... python scripts/llm_runtimes.py [WORKDIR]

Without those variables the runtimes' own environments are built (hfexport.testing.peers) and used.
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

    os.environ.setdefault("HFEXPORT_RUNTIME_OPENVINO_GENAI", str(peers.openvino_genai_venv()))
    os.environ.setdefault("HFEXPORT_RUNTIME_OPTIMUM_INTEL", str(peers.peer_venv()))
    workdir = Path(sys.argv[1] if len(sys.argv) > 1 else "/tmp/hfexport-llm-runtimes")
    formats = os.environ.get("FORMATS", "openvino").split(",")
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
    document = {"hfexport": __version__, "generated": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
                "rows": rows}
    (ROOT / "docs" / "llm_runtimes.json").write_text(json.dumps(document, indent=2) + "\n")
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


#: The encoder-decoder families, each exported to its ONNX generation target in the seq2seq layout
#: (hfexport.onnx_seq2seq) and checked by the ONNX runtimes: `python scripts/llm_runtimes.py --seq2seq [WORKDIR]`
#: writes docs/seq2seq_runtimes.json (beside the decoders' docs/llm_runtimes.json) and its table on stdout.
SEQ2SEQ_FAMILIES = ["tiny-bart", "tiny-t5", "tiny-marian", "tiny-mbart", "tiny-whisper"]


def seq2seq_main(arguments: list[str]) -> int:
    from hfexport.job.run import run_job
    from hfexport.testing import peers
    from hfexport.testing.matrix import ensure_models
    from hfexport.version import __version__

    os.environ.setdefault("HFEXPORT_RUNTIME_OPTIMUM", str(peers.peer_venv()))
    os.environ.setdefault("HFEXPORT_RUNTIME_TRANSFORMERS_JS", str(peers.node_modules()))
    os.environ.setdefault("HFEXPORT_RUNTIME_ONNXRUNTIME_GENAI", str(peers.genai_venv()))
    workdir = Path(arguments[0] if arguments else "/tmp/hfexport-seq2seq-runtimes")
    families = os.environ.get("SEQ2SEQ_FAMILIES", ",".join(SEQ2SEQ_FAMILIES)).split(",")
    models = ensure_models(workdir, families)
    rows = []
    for name in families:
        started = time.perf_counter()
        report = run_job(models[name], workdir / "out" / name, targets=["onnx-generation"], latency=False, workers=1)
        result = report.targets["onnx-generation"]
        rows.append({"model": name, "format": "onnx", "status": result.status, "error": result.error,
                     "runtimes": result.runtimes, "wall_s": round(time.perf_counter() - started, 1)})
        print(json.dumps(rows[-1])[:400], file=sys.stderr, flush=True)
    document = {"hfexport": __version__, "generated": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
                "rows": rows}
    (ROOT / "docs" / "seq2seq_runtimes.json").write_text(json.dumps(document, indent=2) + "\n")
    print("| model | export | transformers.js | optimum | onnxruntime-genai |")
    print("|---|---|---|---|---|")
    for row in rows:
        cells = []
        for runtime in ("transformers.js", "optimum", "onnxruntime-genai"):
            found = [check for check in row["runtimes"] if check["runtime"] == runtime]
            cells.append(" / ".join(f"{check['verdict']} (batch {check.get('batch_sizes')})"
                                    + (f": {check['reason']}" if check.get("reason") else "") for check in found)
                         or "—")
        print(f"| `{row['model']}` | {row['status']} | " + " | ".join(cells) + " |")
    return 0


if __name__ == "__main__":
    raise SystemExit(seq2seq_main(sys.argv[2:]) if sys.argv[1:2] == ["--seq2seq"] else main())
