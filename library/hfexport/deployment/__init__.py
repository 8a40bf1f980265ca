"""Deployment runtimes: the programs people deploy generation exports with, run by the gate on the files hfexport saves.

A generation target passes in a runtime only when that runtime, installed where its users have it, generated the same
tokens as `model.generate` (greedy) on the recipe's sample prompts. Each runtime is one module of this package
(transformers.js, optimum, onnxruntime-genai on ONNX; OpenVINO GenAI and optimum-intel on OpenVINO; ExecuTorch's LLM
runner and optimum-executorch on `.pte`); each returns a `RuntimeCheck`, which the report stores per target under
`runtimes`. A runtime that is not installed is `not_checked` with why, never `passed`; one that crashes or runs past
its time limit is `failed` with its own message, and the job goes on.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass

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
