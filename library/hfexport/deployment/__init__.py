"""Deployment runtimes: the programs people deploy generation exports with, run by the gate on the files hfexport saves.

A generation target passes in a runtime only when that runtime, installed where its users have it, generated the same
tokens as `model.generate` (greedy) on the recipe's sample prompts. Each runtime is one module of this package
(transformers.js, optimum, onnxruntime-genai on ONNX; OpenVINO GenAI and optimum-intel on OpenVINO; ExecuTorch's
TextLLMRunner on `.pte`); each returns a `RuntimeCheck`, which the report stores per target under
`runtimes`. A runtime that is not installed is `not_checked` with why, never `passed`; one that crashes or runs past
its time limit is `failed` with its own message, and the job goes on.

Where a runtime is found: each lives in its users' own environment, so a runtime module looks for the environment
named by `HFEXPORT_RUNTIME_<NAME>` (a Python interpreter for the Python runtimes, a folder holding `node_modules/`
for transformers.js; `runtime_environment`), else for the runtime importable beside hfexport, else reports
`not_checked: not installed`. Client scripts run in those environments never import hfexport (`run_client`).
"""

from __future__ import annotations

import time
from dataclasses import asdict, dataclass, field
from pathlib import Path

from hfexport.errors import RuntimeClientError, killed_by, redact
from hfexport.formats import format_traits

PASSED, FAILED, NOT_CHECKED = "passed", "failed", "not_checked"


@dataclass
class RuntimeCheck:
    """One runtime's verdict on one target's files (the report's `runtimes[]` item, schema `$defs/runtime_check`)."""

    runtime: str  # e.g. "transformers.js", "onnxruntime-genai", "optimum", "openvino-genai", "executorch-llm-runner"
    verdict: str  # passed | failed | not_checked
    version: str | None = None  # the runtime's own version, read from it
    reason: str | None = None  # why failed / not checked (one line, no token)
    first_difference: dict | None = None  # {"prompt", "position", "expected", "got"} when tokens differ
    batch_sizes: list[int] | None = None  # the batch sizes it generated at (1, and a left-padded batch where it batches)
    precision: str | None = None  # what the runtime computed at, read back where it says (f32, bf16, ...)
    token_agreement: float | None = None  # judged by an agreement floor (quantized, float16): the share that agreed
    seconds: float | None = None

    def to_dict(self) -> dict:
        return {key: value for key, value in asdict(self).items() if value is not None}

    @property
    def passed(self) -> bool:
        return self.verdict == PASSED


def first_difference(expected: list[list[int]], got: list[list[int]]) -> dict | None:
    """The first (prompt, position) where `got` differs from `expected` (new tokens per prompt), or None if equal."""
    for prompt, (want, have) in enumerate(zip(expected, got, strict=False)):
        for position in range(max(len(want), len(have))):
            a = want[position] if position < len(want) else None
            b = have[position] if position < len(have) else None
            if a != b:
                return {"prompt": prompt, "position": position, "expected": a, "got": b}
    if len(expected) != len(got):
        return {"prompt": min(len(expected), len(got)), "position": 0, "expected": None, "got": None}
    return None


def compare_tokens(runtime: str, expected: list[list[int]], got: list[list[int]], **fields) -> RuntimeCheck:
    """passed when `got` equals `expected` token for token, else failed at the first differing position."""
    difference = first_difference(expected, got)
    if difference is None:
        return RuntimeCheck(runtime, PASSED, **fields)
    reason = (f"prompt {difference['prompt']} differs at new token {difference['position']}: "
              f"expected {difference['expected']}, got {difference['got']}")
    return RuntimeCheck(runtime, FAILED, reason=reason, first_difference=difference, **fields)


def token_agreement(expected: list[list[int]], got: list[list[int]]) -> float:
    """hfexport's token agreement (`hfexport.generate.verify_generation`): per prompt, the tokens before its first
    divergence from `expected`, over all of `expected`'s tokens."""
    total = sum(map(len, expected)) or 1
    same = 0
    for want, have in zip(expected, got, strict=False):
        for a, b in zip(want, have, strict=False):
            if a != b:
                break
            same += 1
    return same / total


def judge_tokens(runtime: str, request: GenerationRequest, expected: list[list[int]], got: list[list[int]],
                 **fields) -> RuntimeCheck:
    """A runtime's new tokens against `model.generate`'s, the way the gate judges the target itself: token for token
    (`compare_tokens`) for a float32 target; for a quantized or float16 one (`request.min_token_agreement` < 1, the
    target's `hfexport.verify.thresholds.resolve`), passed when the token agreement reaches that floor."""
    floor = request.min_token_agreement
    if floor >= 1.0:
        return compare_tokens(runtime, expected, got, **fields)
    agreement, difference = token_agreement(expected, got), first_difference(expected, got)
    fields.setdefault("token_agreement", round(agreement, 4))
    if agreement >= floor:
        return RuntimeCheck(runtime, PASSED, first_difference=difference, **fields)
    return RuntimeCheck(runtime, FAILED, first_difference=difference,
                        reason=f"{agreement:.2f} of the greedy tokens agree with model.generate, below the target's "
                               f"floor of {floor:g} (quantized or float16: hfexport.verify.thresholds)", **fields)


#: A `GenerationRequest` token field not generated yet (its `answer` generates it when a runtime first reads it).
PENDING = "pending"


class _Generated:
    """A `GenerationRequest` field holding `model.generate`'s tokens, generated on first read by the request's
    `answer`: the gate asks every runtime, and a runtime that is not installed (or not in its contract) answers
    `not_checked` without reading them, so when none runs, the model does not generate at all. The tokens are the
    same whenever they are generated (the same model, prompts and greedy config), so reading them late changes no
    verdict. Stored in the instance's `__dict__` under the field's own name (a data descriptor wins over it)."""

    def __init__(self, default=PENDING):
        self.default = default

    def __set_name__(self, owner, name: str) -> None:
        self.name = name

    def __get__(self, request, owner=None):
        if request is None:  # the dataclass asks for the default: none for a required field
            if self.default is PENDING:
                raise AttributeError(self.name)
            return self.default
        answer = request.__dict__.get("answer")
        if request.__dict__.get(self.name) is PENDING and answer is not None:
            request.answer = None
            request.expected, request.padded_expected = answer()
        return request.__dict__.get(self.name)

    def __set__(self, request, value) -> None:
        request.__dict__[self.name] = value


@dataclass
class GenerationRequest:
    """What every runtime is asked to generate, and what `model.generate` (greedy, f32) answered on the same input.

    `prompts` are the recipe's sample prompts as token ids, one list per prompt, unpadded (runtimes that take text
    get `texts`). `expected[i]` are the new tokens `model.generate` made for prompt i alone (batch 1), cut after the
    first EOS. `padded_expected` is the same for all prompts in one left-padded batch (None where the model has no
    pad token or there is one prompt): runtimes that batch are checked on it too. An encoder-decoder's prompts are its
    encoder's input (its new tokens follow the decoder start token), padded on the right in the batch
    (`padding_side`); Whisper's prompts are empty and its audio features are in `extra["input_features"]`. Both
    `expected` and `padded_expected` may be `PENDING` with an `answer()` that returns them
    (`hfexport.deployment.gate` builds it so): generated on first read (`_Generated`).
    """

    prompts: list[list[int]]
    expected: list[list[int]] = _Generated()
    max_new_tokens: int
    eos_token_id: list[int]
    pad_token_id: int | None = None
    padded_expected: list[list[int]] | None = _Generated(None)
    texts: list[str] | None = None
    model_type: str | None = None
    is_encoder_decoder: bool = False
    decoder_start_token_id: int | None = None  # an encoder-decoder's: new tokens are those after it
    padding_side: str = "left"  # how `padded_expected`'s batch was padded (an encoder-decoder's encoder input: right)
    timeout_s: float = 300.0
    extra: dict = field(default_factory=dict)  # arrays some families need (Whisper: input_features), by input name
    #: The ONNX file name the target is published under (`hfexport.layout.artifact_name`): a quantized or fp16 target
    #: is a transformers.js dtype variant (`model_quantized.onnx`, `model_fp16.onnx`), and each runtime opens it by
    #: that name, as its users do.
    file_name: str = "model.onnx"
    #: The share of greedy tokens that must agree with `model.generate` (`hfexport.verify.thresholds.resolve`): 1.0
    #: (token for token) unless the target is quantized.
    min_token_agreement: float = 1.0
    answer: object = field(default=None, repr=False, compare=False)  # () -> (expected, padded_expected), or None

    def cut(self, tokens: list[int]) -> list[int]:
        """`tokens` cut after the first EOS and to max_new_tokens, as `expected` is."""
        tokens = list(tokens)[: self.max_new_tokens]
        for index, token in enumerate(tokens):
            if token in self.eos_token_id:
                return tokens[: index + 1]
        return tokens




def run_checks(export_format: str, folder: Path, request: GenerationRequest) -> list[RuntimeCheck]:
    """Every runtime of `export_format` on `folder`; a runtime module that raises is `failed` with its message."""
    import importlib

    checks = []
    # Each format's `runtimes`: modules (hfexport.formats.<format>.runtimes.*), each with `RUNTIME: str` (the name
    # reports use) and `check_generation(folder: Path, request: GenerationRequest) -> RuntimeCheck`: its generated
    # tokens against `model.generate`'s (or a list of them: one runtime checked at several precisions).
    for name in format_traits(export_format).runtimes:
        module = importlib.import_module(name)
        started = time.perf_counter()
        try:
            found = module.check_generation(Path(folder), request)
        except Exception as error:  # noqa: BLE001 - one runtime's crash is its verdict; the job goes on
            found = RuntimeCheck(module.RUNTIME, FAILED, reason=redact(f"{type(error).__name__}: {error}")[:500])
        # A module may answer one record, or several (one runtime at two precisions: OpenVINO GenAI at an f32 hint
        # and at the device's default).
        for check in found if isinstance(found, list) else [found]:
            if check.seconds is None:
                check.seconds = round(time.perf_counter() - started, 3)
            checks.append(check)
    return checks


def run_client(command: list[str], *, timeout: float, env: dict[str, str] | None = None,
               cwd: str | Path | None = None) -> dict:
    """Run a runtime's client script (in the runtime's own environment); its last stdout line is a JSON object.

    Raises `RuntimeClientError` with the client's own last lines when it exits non-zero, prints no JSON, or runs
    past `timeout` seconds (then it is killed)."""
    import subprocess

    try:
        done = subprocess.run(command, capture_output=True, text=True, timeout=timeout, env=env, cwd=cwd,
                              stdin=subprocess.DEVNULL)
    except subprocess.TimeoutExpired:
        raise RuntimeClientError(f"ran past its time limit of {timeout:.0f} s and was stopped") from None
    return client_result(done.returncode, done.stdout, done.stderr)


def client_result(returncode: int, stdout: str, stderr: str) -> dict:
    """A client's result from its exit code and output: its last stdout line as JSON, or `RuntimeClientError` with
    its own error line (`run_client`; `hfexport.deployment.warm` reads a warm client's the same way)."""
    import json
    import re

    lines = [line for line in stdout.strip().splitlines() if line.strip()]
    if returncode != 0 or not lines:
        lines = (stderr or stdout).strip().splitlines()
        # The client's own error line where there is one (Node prints its stack after it), else its last lines.
        errors = [line.strip() for line in lines if re.match(r"^\s*(\w+\.)*\w*(Error|Exception)\b", line)]
        tail = errors[-1] if errors else " | ".join(lines[-3:])
        raise RuntimeClientError(redact(f"exited {returncode}{killed_by(returncode)}: {tail}"[:600]))
    try:
        return json.loads(lines[-1])
    except ValueError:
        raise RuntimeClientError(redact(f"printed no JSON result: {lines[-1][:300]}")) from None


def runtime_environment(name: str) -> str | None:
    """The environment configured for runtime `name` (`HFEXPORT_RUNTIME_<NAME>`, non-alphanumerics as `_`), or None."""
    import os
    import re

    return os.environ.get("HFEXPORT_RUNTIME_" + re.sub(r"[^A-Za-z0-9]", "_", name).upper()) or None
