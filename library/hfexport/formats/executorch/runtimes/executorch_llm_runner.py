"""ExecuTorch's `TextLLMRunner(model.pte, tokenizer.json)` on an ExecuTorch generation export, as its users
run it (executorch's Python bindings of the C++ runner the Android and iOS apps embed).

It runs in the environment named by `HFEXPORT_RUNTIME_EXECUTORCH_LLM_RUNNER` (a Python with `executorch`), else
beside hfexport where `executorch.extension.llm.runner` is importable (hfexport's `executorch` extra), else the check
is `not_checked`. The client (`clients/executorch_llm_runner_client.py`) gives the runner each sample prompt's text
(the runner encodes it: `num_bos=1` where the model's tokenizer adds a BOS token of its own), greedy (temperature 0), one prompt
at a time (the runner has no batch), and reads the new tokens back through a copy of `tokenizer.json` without its
decoder, so each reported piece is a vocabulary string naming one token id: the check is token for token against
`model.generate` (an 8da4w variant's: its share of agreeing tokens at least its floor, `hfexport.verify.variants`),
and the runner's prompt must be the same number of tokens. The text the runner reports with the
folder's own `tokenizer.json` must then be the tokenizer's decoding of those tokens; where a piece is not UTF-8 on its
own (a byte-level piece of a longer character), the bindings cannot report it (`UnicodeDecodeError`) and the text is
not compared (the tokens still are).
"""

from __future__ import annotations

import json
from pathlib import Path

from hfexport.deployment import (
    FAILED,
    NOT_CHECKED,
    PASSED,
    GenerationRequest,
    RuntimeCheck,
    RuntimeClientError,
    judge_tokens,
)
from hfexport.deployment._python import interpreter, run_python_client
from hfexport.formats.executorch.llm_program import manifest_is_llm
from hfexport.files import MANIFEST_FILE

RUNTIME = "executorch-llm-runner"
MODULE = "executorch.extension.llm.runner"
CLIENT = Path(__file__).resolve().parent / "clients" / "executorch_llm_runner_client.py"
TOKENIZER_FILE = "tokenizer.json"


def is_llm_program_folder(folder: Path) -> bool:
    """A folder whose export.json names one ExecuTorch LLM runner program (`hfexport.formats.executorch.llm_program`)."""
    try:
        return manifest_is_llm(json.loads((folder / MANIFEST_FILE).read_text(encoding="utf-8")))
    except (OSError, ValueError, TypeError, AttributeError):
        return False


def _adds_bos(folder: Path, text: str) -> int:
    """1 where the folder's tokenizer starts `text` with a token of its own (a BOS its post-processor adds), which
    TextLLMRunner's tokenizer adds only when asked (`num_bos`); 0 where the text itself starts as it should (a chat
    prompt whose first token is the BOS id: SmolLM2's `<|im_start|>`)."""
    from tokenizers import Tokenizer

    tokenizer = Tokenizer.from_file(str(folder / TOKENIZER_FILE))
    with_special = tokenizer.encode(text, add_special_tokens=True).ids
    plain = tokenizer.encode(text, add_special_tokens=False).ids
    return 1 if with_special[1:] == plain and len(with_special) == len(plain) + 1 else 0


def check_generation(folder: Path, request: GenerationRequest) -> RuntimeCheck:
    """TextLLMRunner on `folder`: token for token at batch 1, then the text it reports against the tokenizer's."""
    folder = Path(folder)
    python = interpreter(RUNTIME, MODULE)
    if python is None:
        return RuntimeCheck(RUNTIME, NOT_CHECKED, reason="executorch is not installed (pip install executorch, or set "
                            "HFEXPORT_RUNTIME_EXECUTORCH_LLM_RUNNER to a Python that has it)")
    if request.is_encoder_decoder or not is_llm_program_folder(folder) or not (folder / TOKENIZER_FILE).is_file():
        return RuntimeCheck(RUNTIME, NOT_CHECKED, reason="not in the LLM runner's contract (one model.pte that holds "
                            "its KV cache, tokenizer.json beside it): the export keeps the engine's graphs, with the cache "
                            "as inputs and outputs (an encoder-decoder, a VLM, a state-space model, or a target that "
                            "sets its own layout: generation.single_graph / multi_token_decode / "
                            "cache_implementation, quantization, components, dynamic_shapes, a backend other than "
                            "XNNPACK)")
    if not request.texts or len(request.texts) != len(request.prompts):
        return RuntimeCheck(RUNTIME, NOT_CHECKED, reason="the recipe's sample inputs have no text prompts: "
                            "TextLLMRunner takes text")
    num_bos = [_adds_bos(folder, text) for text in request.texts]
    payload = {"texts": request.texts, "max_new_tokens": request.max_new_tokens, "num_bos": num_bos}
    try:
        answer = run_python_client(python, CLIENT, folder, payload, request.timeout_s)
    except RuntimeClientError as error:
        return RuntimeCheck(RUNTIME, FAILED, reason=str(error), batch_sizes=[1])
    fields = {"version": answer.get("version"), "batch_sizes": [1], "precision": "f32"}
    for index, (prompt, counted) in enumerate(zip(request.prompts, answer["prompt_tokens"], strict=False)):
        if counted != len(prompt):
            return RuntimeCheck(RUNTIME, FAILED, reason=f"prompt {index}: the runner encoded {counted} tokens, "
                                f"the model's tokenizer {len(prompt)}", **fields)
    got = [request.cut(tokens) for tokens in answer["tokens"]]
    # token for token; a quantized variant's by its floor (`request.min_token_agreement`: hfexport.verify.variants)
    verdict = judge_tokens(RUNTIME, request, request.expected, got, **fields)
    if verdict.verdict != PASSED:
        return verdict
    return _judge_text(folder, got, answer, fields) or verdict


def _judge_text(folder: Path, got: list[list[int]], answer: dict, fields: dict) -> RuntimeCheck | None:
    """failed when the runner's text (with the folder's tokenizer.json) is not the tokenizer's decoding of the
    runner's own tokens (`model.generate`'s, where they are token for token); None otherwise (same text, or not
    reportable by the bindings)."""
    from tokenizers import Tokenizer

    tokenizer = Tokenizer.from_file(str(folder / TOKENIZER_FILE))
    for index, (tokens, text) in enumerate(zip(got, answer["texts"], strict=False)):
        if text is None:
            continue
        want = tokenizer.decode(tokens, skip_special_tokens=False)
        if text != want:
            return RuntimeCheck(RUNTIME, FAILED, reason=f"prompt {index}: the same tokens, but the runner's text "
                                f"{text[:80]!r} is not the tokenizer's {want[:80]!r}", **fields)
    return None
