"""The deployment runtimes' column of the compatibility matrix for the decoder families: each tiny decoder
(`hfexport.testing.models`: Llama, GPT-2, Qwen2, Gemma3, Phi-3, Mistral) exported by a job to its generation targets,
the gate running every runtime of the format (its `runtimes`, `hfexport.formats`) on the saved files. Each verdict, with
why where it is not a pass (and, for the failures and workarounds traced to a runtime's own source, the cause:
`CAUSES`), is merged into docs/llm_runtimes.json by (model, format); scripts/compatibility_matrix.py renders that file
into docs/compatibility.md's runtimes tables (`--render-only` needs no rerun of the matrix), and a Markdown table goes
to stdout.

    FORMATS=onnx,onnx-q8,openvino [MODELS=tiny-phi3,...] python scripts/llm_runtimes.py [WORKDIR]

`onnx`: the float32 ONNX generation target (transformers.js, optimum, onnxruntime-genai, token for token);
`onnx-q8`: an 8-bit target (`ort_dynamic`) added to the model's recipe, published as transformers.js' q8 variant
`onnx/model_quantized.onnx` and judged by hfexport's 8-bit token agreement floor; `openvino`: OpenVINO GenAI and
optimum-intel; `executorch`: ExecuTorch's TextLLMRunner and optimum-executorch on the LLM runner
program. The runtimes' environments come from `HFEXPORT_RUNTIME_*`, else `hfexport.testing.peers` builds them.
"""

from __future__ import annotations

import json
import os
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
DOCUMENT = ROOT / "docs" / "llm_runtimes.json"
FAMILIES = ["tiny-llama", "tiny-gpt2", "tiny-qwen2", "tiny-gemma3", "tiny-phi3", "tiny-mistral"]
FORMATS = {"openvino": "openvino-generation", "executorch": "executorch-generation", "onnx": "onnx-generation",
           "onnx-q8": "onnx-generation-q8"}
#: The recipe targets this script adds to a model's recipe (the matrix's recipes have one target per format/mode).
ADDED_TARGETS = {"onnx-generation-q8": {"export_format": "onnx", "mode": "generation",
                                        "quantization": {"method": "ort_dynamic"}}}
#: Why a runtime fails or needs a workaround on a family, traced to its source (the version the gate runs).
CAUSES = {
    ("tiny-phi3", "optimum"): (
        "optimum-onnx 0.1.0's bug, not the export's: `ORTModelForCausalLM.__init__` "
        "(optimum/onnxruntime/modeling_decoder.py) takes `num_key_value_heads` from the config only for the model "
        "types it lists (arcee, deepseek_v3, cohere, gemma, gemma3_text, glm, granite, gpt_oss, helium, mistral, llama, "
        "nemotron, qwen2, qwen3, qwen3_moe, smollm3, stablelm; gemma3, falcon, gpt_bigcode apart) and "
        "`num_attention_heads` for every other, phi3 included, so it builds a grouped-query Phi-3's empty past with "
        "the query head count (tiny-phi3: 4 where the graph's past takes its 2 KV heads) and ONNX Runtime refuses "
        "the first step. A Phi-3 whose KV heads equal its heads (Phi-3-mini: 32/32) is not affected."),
    ("tiny-gpt2", "onnxruntime-genai"): (
        "passes as onnxruntime-genai's generic `decoder` model type: its own `gpt2` type is a model of its own "
        "(src/models/model.cpp) that takes one combined `past_%d` cache tensor per layer, not the contract's "
        "`past_key_values.%d.key|value` pairs, so genai_config.json says `decoder` for GPT-2 "
        "(hfexport.formats.onnx.decoder_contract.GENAI_LLM_TYPES)."),
}


def add_targets(folder: Path, formats: list[str]) -> None:
    """The script's own targets (`ADDED_TARGETS`) written into the model's recipe beside the matrix's."""
    wanted = {FORMATS[name]: ADDED_TARGETS[FORMATS[name]] for name in formats if FORMATS[name] in ADDED_TARGETS}
    if not wanted:
        return
    recipe_file = folder / "export_config.json"
    recipe = json.loads(recipe_file.read_text(encoding="utf-8"))
    base = recipe["targets"].get("onnx-generation") or {}
    for name, target in wanted.items():  # the float32 target's shapes and options, quantized
        recipe["targets"][name] = {**{key: value for key, value in base.items() if key != "parity"}, **target}
    recipe_file.write_text(json.dumps(recipe, indent=2) + "\n", encoding="utf-8")


def merged(rows: list[dict]) -> dict:
    """docs/llm_runtimes.json with `rows` replacing the rows of the same (model, format)."""
    from hfexport.version import __version__

    previous = json.loads(DOCUMENT.read_text(encoding="utf-8")).get("rows", []) if DOCUMENT.is_file() else []
    keys = {(row["model"], row["format"]) for row in rows}
    kept = [row for row in previous if (row["model"], row["format"]) not in keys]
    order = {name: index for index, name in enumerate(FAMILIES)}
    every = sorted(kept + rows, key=lambda row: (list(FORMATS).index(row["format"]) if row["format"] in FORMATS
                                                  else 99, order.get(row["model"], 99)))
    return {"hfexport": __version__, "generated": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
            "about": "The gate's deployment runtimes per decoder family (scripts/llm_runtimes.py); "
                     "scripts/compatibility_matrix.py renders it into docs/compatibility.md.",
            "rows": every}


def main() -> int:
    from hfexport.job.run import run_job
    from hfexport.testing import peers
    from hfexport.testing.matrix import ensure_models

    formats = os.environ.get("FORMATS", "openvino").split(",")
    if "openvino" in formats:
        os.environ.setdefault("HFEXPORT_RUNTIME_OPENVINO_GENAI", str(peers.openvino_genai_venv()))
        os.environ.setdefault("HFEXPORT_RUNTIME_OPTIMUM_INTEL", str(peers.peer_venv()))
    if any(name.startswith("onnx") for name in formats):
        os.environ.setdefault("HFEXPORT_RUNTIME_OPTIMUM", str(peers.peer_venv()))
        os.environ.setdefault("HFEXPORT_RUNTIME_ONNXRUNTIME_GENAI", str(peers.genai_venv()))
        os.environ.setdefault("HFEXPORT_RUNTIME_TRANSFORMERS_JS", str(peers.node_modules()))
    if "executorch" in formats:
        os.environ.setdefault("HFEXPORT_RUNTIME_OPTIMUM_EXECUTORCH", str(peers.optimum_executorch_venv()))
    workdir = Path(sys.argv[1] if len(sys.argv) > 1 else "/tmp/hfexport-llm-runtimes")
    families = os.environ.get("MODELS", ",".join(FAMILIES)).split(",")
    models = ensure_models(workdir, families)
    rows = []
    for export_format in formats:
        for name in families:
            add_targets(models[name], formats)
            target = FORMATS[export_format]
            started = time.perf_counter()
            report = run_job(models[name], workdir / "out" / name, targets=[target], latency=False, workers=1,
                             force=True)  # never a cache hit: the runtimes run only on a fresh export
            result = report.targets[target]
            runtimes = [{**check, **({"cause": CAUSES[(name, check["runtime"])]}
                                     if (name, check["runtime"]) in CAUSES else {})} for check in result.runtimes]
            rows.append({"model": name, "format": export_format, "target": target, "status": result.status,
                         "error": result.error, "runtimes": runtimes,
                         "wall_s": round(time.perf_counter() - started, 1)})
            print(json.dumps(rows[-1])[:400], file=sys.stderr, flush=True)
            DOCUMENT.write_text(json.dumps(merged(rows), indent=2) + "\n")  # after each row: a long run keeps them
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
#: (hfexport.formats.onnx.seq2seq_contract) and checked by the ONNX runtimes: `python scripts/llm_runtimes.py --seq2seq [WORKDIR]`
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
