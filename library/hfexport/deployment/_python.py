"""What the runtime modules share: finding a Python runtime's interpreter, running a client script (each runtime's
own, in its format's `runtimes/clients/`) on a request file. (Private to this package: each runtime module is the
concept; this is their plumbing.)"""

from __future__ import annotations

import importlib.util
import json
import sys
import tempfile
from pathlib import Path

from hfexport.deployment import PASSED, GenerationRequest, RuntimeCheck, judge_tokens, run_client, runtime_environment
from hfexport.deployment.warm import run_warm


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
    payload = {"prompts": request.prompts, "max_new_tokens": request.max_new_tokens,
               "pad_token_id": request.pad_token_id, "eos_token_id": request.eos_token_id,
               "padded": bool(padded and request.padded_expected is not None), "texts": request.texts}
    if request.is_encoder_decoder:  # the encoder's input padded on its side; Whisper's features (float32 in JSON)
        payload.update(is_encoder_decoder=True, padding_side=request.padding_side,
                       decoder_start_token_id=request.decoder_start_token_id)
        if "input_features" in request.extra:
            payload["input_features"] = request.extra["input_features"].astype("float32").tolist()
    return payload


def run_python_client(python: str, client: Path, folder: Path, payload: dict, timeout: float) -> dict:
    """Run the client script `client` (a runtime's own, in its format's `runtimes/clients/`) as
    `python CLIENT FOLDER REQUEST`; its last stdout line (JSON) as a dict. Inside `warm_clients()` it is forked
    from a server that imported the client's modules once (`hfexport.deployment.warm`)."""
    with tempfile.TemporaryDirectory(prefix="hfexport-runtime-") as scratch:
        request_file = Path(scratch) / "request.json"
        request_file.write_text(json.dumps(payload), encoding="utf-8")
        warm = run_warm(python, client, [str(folder), str(request_file)], scratch, timeout)
        if warm is not None:
            return warm
        return run_client([python, str(client), str(folder), str(request_file)], timeout=timeout,
                          cwd=scratch)


def as_expected(request: GenerationRequest, expected: list[list[int]], got: list[list[int]],
                keep_stop_token: bool = False) -> list[list[int]]:
    """`got` cut after EOS and to max_new_tokens as `expected` is. `keep_stop_token`: a runtime that stops at an EOS
    without returning it (OpenVINO GenAI's LLMPipeline, optimum-intel) gets that EOS back where `expected`'s row ends
    with it (the same decision, the same length)."""
    out = []
    for index, tokens in enumerate(got):
        tokens = request.cut(tokens)
        want = expected[index] if index < len(expected) else []
        if keep_stop_token and want and want[-1] in request.eos_token_id and tokens == want[:-1]:
            tokens = want
        out.append(tokens)
    return out


def judge(runtime: str, request: GenerationRequest, result: dict, batches: list[int], *,
          keys: tuple[str, str] = ("batch1", "padded"), keep_stop_token: bool = False, **fields) -> RuntimeCheck:
    """The one token judge of every runtime: a client's batch-1 new tokens (`result[keys[0]]`), then, where the
    request has a left-padded batch, that batch's (`result[keys[1]]`), against `model.generate`'s, cut as `expected`
    is (`as_expected`), and judged as the target is (`judge_tokens`: token for token, or a quantized target's
    agreement floor); `fields` (a precision) go into the record."""
    fields = {"version": result.get("version"), "batch_sizes": batches, **fields}
    single_key, padded_key = keys
    check = judge_tokens(runtime, request, request.expected,
                         as_expected(request, request.expected, result[single_key], keep_stop_token), **fields)
    if check.verdict != PASSED or request.padded_expected is None:
        return check
    padded = judge_tokens(runtime, request, request.padded_expected, as_expected(
        request, request.padded_expected, result.get(padded_key) or [], keep_stop_token), **fields)
    if padded.verdict != PASSED:
        padded.reason = f"left-padded batch of {len(request.prompts)}: {padded.reason}"
    return padded
