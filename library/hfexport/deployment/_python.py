"""What the runtime modules share: finding a Python runtime's interpreter, running a client script on a
request file. (Private to this package: each runtime module is the concept; this is their plumbing.)"""

from __future__ import annotations

import importlib.util
import json
import sys
import tempfile
from pathlib import Path

from hfexport.deployment import PASSED, GenerationRequest, RuntimeCheck, judge_tokens, run_client, runtime_environment
from hfexport.layout import transformers_js_dtype

CLIENTS = Path(__file__).resolve().parent / "clients"
#: Why a runtime does not check a folder without `model.onnx` + `genai_config.json` (hfexport.onnx_contract).
NOT_IN_CONTRACT = ("not in the ONNX runtimes' layout (model.onnx with past_key_values.{i}.key inputs, "
                   "genai_config.json): the export keeps the engine's graphs (an encoder-decoder, a VLM, a state-space "
                   "decode, a prefill/decode pair, or a graph with inputs the runtimes do not feed)")


def interpreter(runtime: str, module: str) -> str | None:
    """The python that has `module`: `HFEXPORT_RUNTIME_<RUNTIME>` if set, else hfexport's own when it can import
    `module`, else None (not installed)."""
    configured = runtime_environment(runtime)
    if configured:
        return configured if Path(configured).exists() else None
    try:
        found = importlib.util.find_spec(module) is not None
    except ImportError:  # `optimum.onnxruntime` without `optimum`
        found = False
    return sys.executable if found else None


def request_payload(request: GenerationRequest, padded: bool) -> dict:
    """The request as every client reads it (JSON): prompts as token ids, max_new_tokens, eos/pad ids, whether to
    generate the left-padded batch too, and the prompts' texts."""
    return {"prompts": request.prompts, "max_new_tokens": request.max_new_tokens,
            "pad_token_id": request.pad_token_id, "eos_token_id": request.eos_token_id,
            "padded": bool(padded and request.padded_expected is not None), "texts": request.texts}


def variant_dtype(request: GenerationRequest) -> str:
    """The precision a runtime's record names: transformers.js' dtype of the file the target is published under
    (`fp32`, `q8`, `fp16`, ...; `hfexport.layout.transformers_js_dtype`), else the file name."""
    return transformers_js_dtype(request.file_name) or request.file_name


def run_python_client(python: str, script: str, folder: Path, payload: dict, timeout: float) -> dict:
    """Run `clients/<script> FOLDER REQUEST` with `python`; its last stdout line (JSON) as a dict."""
    with tempfile.TemporaryDirectory(prefix="hfexport-runtime-") as scratch:
        request_file = Path(scratch) / "request.json"
        request_file.write_text(json.dumps(payload), encoding="utf-8")
        return run_client([python, str(CLIENTS / script), str(folder), str(request_file)], timeout=timeout,
                          cwd=scratch)


def judge(runtime: str, request: GenerationRequest, result: dict, batches: list[int],
          precision: str | None = None) -> RuntimeCheck:
    """A client's `batch1` (and `padded`) new tokens against `model.generate`'s, cut after EOS as `expected` is,
    judged as the target is (`judge_tokens`: token for token, or a quantized target's agreement floor)."""
    fields = {"version": result.get("version"), "batch_sizes": batches, "precision": precision}
    check = judge_tokens(runtime, request, request.expected, [request.cut(tokens) for tokens in result["batch1"]],
                         **fields)
    if check.verdict != PASSED or request.padded_expected is None:
        return check
    padded = judge_tokens(runtime, request, request.padded_expected,
                          [request.cut(tokens) for tokens in result.get("padded") or []], **fields)
    if padded.verdict != PASSED:
        padded.reason = f"left-padded batch of {len(request.prompts)}: {padded.reason}"
    return padded
