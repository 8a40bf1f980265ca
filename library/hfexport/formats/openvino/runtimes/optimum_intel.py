"""optimum-intel's `OVModelForCausalLM.from_pretrained(folder)` on an OpenVINO generation export, as its users run it.

optimum-intel pins transformers 4.x (hfexport's engine needs 5.x), so it lives in an environment of its own: the one
named by `HFEXPORT_RUNTIME_OPTIMUM_INTEL` (a Python with `optimum-intel[openvino]`), else beside hfexport where
`optimum.intel` is importable, else the check is `not_checked`. The client (`clients/optimum_intel_client.py`) feeds
the request's prompts as token ids to `generate` (greedy) at an f32 inference precision hint, at batch 1 and on the
left-padded batch, and the new tokens must be `model.generate`'s, token for token.
"""

from __future__ import annotations

from pathlib import Path

from hfexport.deployment import (
    FAILED,
    NOT_CHECKED,
    GenerationRequest,
    RuntimeCheck,
    RuntimeClientError,
)
from hfexport.deployment._python import interpreter, request_payload, run_python_client
from hfexport.formats.openvino.runtimes.openvino_genai import MODEL_FILE, judge_f32

RUNTIME = "optimum-intel"
MODULE = "optimum.intel"
CLIENT = Path(__file__).resolve().parent / "clients" / "optimum_intel_client.py"


def check_generation(folder: Path, request: GenerationRequest) -> RuntimeCheck:
    """OVModelForCausalLM on `folder` at an f32 hint: token-exact at batch 1 and on the left-padded batch."""
    folder = Path(folder)
    python = interpreter(RUNTIME, MODULE)
    if python is None:
        return RuntimeCheck(RUNTIME, NOT_CHECKED, reason="optimum-intel is not installed (pip install "
                            "optimum-intel[openvino], or set HFEXPORT_RUNTIME_OPTIMUM_INTEL to a Python that has it)")
    if request.is_encoder_decoder or not (folder / MODEL_FILE).is_file():
        return RuntimeCheck(RUNTIME, NOT_CHECKED, reason=f"no {MODEL_FILE} (one stateful decoder-only graph) in the "
                            "export: OVModelForCausalLM runs decoder-only LLMs exported as one graph")
    try:
        answer = run_python_client(python, CLIENT, folder, request_payload(request, padded=True), request.timeout_s)
    except RuntimeClientError as error:
        return RuntimeCheck(RUNTIME, FAILED, reason=str(error))
    batches = [1] + ([len(request.prompts)] if "f32_padded" in answer else [])
    return judge_f32(RUNTIME, request, answer, batches)
