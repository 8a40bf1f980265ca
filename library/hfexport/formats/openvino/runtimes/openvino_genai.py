"""OpenVINO GenAI's `LLMPipeline(folder, "CPU")` on an OpenVINO generation export, as its users run it (a
vision-language export's: `VLMPipeline`, `hfexport.formats.openvino.runtimes.openvino_genai_vlm`).

It runs in the environment named by `HFEXPORT_RUNTIME_OPENVINO_GENAI` (a Python with `openvino-genai`), else beside
hfexport where `openvino_genai` is importable, else the check is `not_checked`. The client
(`clients/openvino_genai_client.py`) feeds the request's prompts as token ids (`TokenizedInputs`) with greedy
decoding, at an f32 inference precision hint (token for token against `model.generate`, at batch 1 and on the
left-padded batch), and, where the CPU plugin's default precision is not f32 (bf16 on CPUs with AVX512-BF16 or
AMX), again at that default, judged by hfexport's token agreement floor for that precision
(`verify.thresholds.RUNTIME_MIN_TOKEN_AGREEMENT`): a second record with that precision.
"""

from __future__ import annotations

from pathlib import Path

from hfexport.deployment import (
    FAILED,
    NOT_CHECKED,
    PASSED,
    GenerationRequest,
    RuntimeCheck,
    RuntimeClientError,
    compare_tokens,
    first_difference,
    token_agreement,
)
from hfexport.deployment._python import as_expected, interpreter, judge, request_payload, run_python_client
from hfexport.formats.openvino.runtimes import openvino_genai_vlm
from hfexport.verify.thresholds import RUNTIME_MIN_TOKEN_AGREEMENT

RUNTIME = "openvino-genai"
MODULE = "openvino_genai"
CLIENT = Path(__file__).resolve().parent / "clients" / "openvino_genai_client.py"
MODEL_FILE = "openvino_model.xml"


def stop_token_kept(request: GenerationRequest, got: list[list[int]]) -> list[list[int]]:
    """`got` cut as `expected` is, with the EOS LLMPipeline stops at without returning given back (`as_expected`)."""
    return as_expected(request, request.expected, got, keep_stop_token=True)


def judge_at_precision(runtime: str, request: GenerationRequest, got: list[list[int]], precision: str,
                       **fields) -> RuntimeCheck:
    """f32: token for token. A reduced precision (bf16, f16): passed when the token agreement reaches hfexport's
    floor for it (`RUNTIME_MIN_TOKEN_AGREEMENT`; a quantized variant's own floor where that is lower), else failed
    naming the agreement and the first difference."""
    if precision == "f32" or precision not in RUNTIME_MIN_TOKEN_AGREEMENT:
        return compare_tokens(runtime, request.expected, got, precision=precision, **fields)
    agreement = token_agreement(request.expected, got)
    floor = min(RUNTIME_MIN_TOKEN_AGREEMENT[precision], request.min_token_agreement)
    difference = first_difference(request.expected, got)
    if agreement >= floor:
        return RuntimeCheck(runtime, PASSED, precision=precision, first_difference=difference, **fields)
    return RuntimeCheck(runtime, FAILED, precision=precision, first_difference=difference,
                        reason=f"at {precision} {agreement:.2f} of the greedy tokens agree with model.generate, "
                               f"below hfexport's floor of {floor} for {precision}", **fields)


def check_generation(folder: Path, request: GenerationRequest) -> list[RuntimeCheck]:
    """LLMPipeline on `folder` at an f32 hint (token-exact, batch 1 and left-padded), and at the device's default
    precision where that is not f32."""
    folder = Path(folder)
    python = interpreter(RUNTIME, MODULE)
    if python is None:
        return [RuntimeCheck(RUNTIME, NOT_CHECKED, reason="openvino-genai is not installed (pip install "
                             "openvino-genai, or set HFEXPORT_RUNTIME_OPENVINO_GENAI to a Python that has it)")]
    if "pixel_values" in request.extra:  # a vision-language export: VLMPipeline, from text and images
        return [openvino_genai_vlm.check_generation(folder, request, python)]
    if request.is_encoder_decoder or not (folder / MODEL_FILE).is_file():
        return [RuntimeCheck(RUNTIME, NOT_CHECKED, reason=f"no {MODEL_FILE} (one stateful decoder-only graph) in the "
                             "export: LLMPipeline runs decoder-only LLMs exported as one stateful graph")]
    try:
        answer = run_python_client(python, CLIENT, folder, request_payload(request, padded=True), request.timeout_s)
    except RuntimeClientError as error:
        return [RuntimeCheck(RUNTIME, FAILED, reason=str(error))]
    version = answer.get("version")
    batches = [1] + ([len(request.prompts)] if "f32_padded" in answer else [])
    checks = [judge_f32(RUNTIME, request, answer, batches)]
    default = answer.get("default_precision")
    if "default" in answer:
        checks.append(judge_at_precision(RUNTIME, request, stop_token_kept(request, answer["default"]), default,
                                         version=version, batch_sizes=[1]))
    return checks


def judge_f32(runtime: str, request: GenerationRequest, answer: dict, batches: list[int]) -> RuntimeCheck:
    """An OpenVINO client's f32 answer (`f32`: batch 1, `f32_padded`: the left-padded batch) by the one judge
    (`_python.judge`), with the stop token LLMPipeline and optimum-intel drop kept."""
    return judge(runtime, request, answer, batches, keys=("f32", "f32_padded"), keep_stop_token=True, precision="f32")
