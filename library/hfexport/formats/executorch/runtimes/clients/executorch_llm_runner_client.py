"""ExecuTorch's TextLLMRunner on a folder, greedy, from the prompts' texts: run by
hfexport.formats.executorch.runtimes.executorch_llm_runner in the runtime's own environment (it never imports hfexport).

    python executorch_llm_runner_client.py FOLDER REQUEST.json

REQUEST: {"texts": [str], "max_new_tokens", "num_bos": [int per prompt]}. Each prompt runs twice, in a fresh runner:
- with a copy of the folder's `tokenizer.json` whose `decoder` is removed: the runner then reports each new token as
  its vocabulary string, which names exactly one token id (the bindings report text pieces, not ids, and raise
  UnicodeDecodeError on a piece that is part of a UTF-8 character); encoding, the program, sampling and stopping are
  the runner's own, unchanged;
- with the folder's own `tokenizer.json`, as its users run it: the text, as bytes (None when a piece is not UTF-8 on
  its own: the bindings cannot hand it over).

ExecuTorch's LLM kernels (`llama::custom_sdpa`, `llama::update_cache`: hfexport.formats.executorch.llm_program) and its
quantized kernels (`quantized_decomposed::embedding_4bit`/`embedding_byte`, an 8da4w program's embedding) are registered first,
as the runner's users do (importing `executorch.extension.llm.custom_ops.custom_ops` and `executorch.kernels.quantized`).

Prints one JSON line: {"version", "tokens": [[ids]], "prompt_tokens": [n], "texts": [str or None], "text_errors"}.
The runner prints each piece on the C stdout itself: that goes to stderr here, so the last stdout line is the answer.
"""

import ctypes
import json
import os
import sys
import tempfile
from importlib.metadata import version

from executorch.extension.llm.custom_ops import custom_ops  # noqa: F401 - registers the LLM kernels the program calls
from executorch.kernels import quantized  # noqa: F401 - registers the quantized kernels an 8da4w program calls
from executorch.extension.llm.runner import GenerationConfig, TextLLMRunner

PROGRAM, DATA, TOKENIZER = "model.pte", "model.ptd", "tokenizer.json"


def vocabulary(tokenizer: dict) -> dict:
    """Token string -> id: the model's vocabulary and the added tokens."""
    strings = dict(tokenizer.get("model", {}).get("vocab") or {})
    if isinstance(tokenizer.get("model", {}).get("vocab"), list):  # a Unigram model: [[piece, score], ...]
        strings = {piece: index for index, (piece, _) in enumerate(tokenizer["model"]["vocab"])}
    for added in tokenizer.get("added_tokens") or []:
        strings[added["content"]] = added["id"]
    return strings


def run(folder, tokenizer_path, text, max_new_tokens, num_bos):
    """One generation in a fresh runner: (pieces, prompt token count, error)."""
    data = os.path.join(folder, DATA)
    runner = TextLLMRunner(os.path.join(folder, PROGRAM), tokenizer_path, data if os.path.isfile(data) else None)
    config = GenerationConfig(echo=False, max_new_tokens=max_new_tokens, temperature=0.0, num_bos=num_bos, num_eos=0)
    pieces, stats = [], []
    try:
        runner.generate(text, config, token_callback=pieces.append, stats_callback=stats.append)
        error = None
    except UnicodeDecodeError as failure:
        error = f"a piece is not UTF-8 on its own ({failure.object!r}): the bindings cannot report it"
    return pieces, (stats[0].num_prompt_tokens if stats else None), error


def main():
    folder, request_path = sys.argv[1], sys.argv[2]
    with open(request_path, encoding="utf-8") as stream:
        request = json.load(stream)
    libc = ctypes.CDLL(None)
    stdout = os.dup(1)
    os.dup2(2, 1)  # the runner's own printing (C stdout) goes to stderr
    try:
        with open(os.path.join(folder, TOKENIZER), encoding="utf-8") as stream:
            tokenizer = json.load(stream)
        ids = vocabulary(tokenizer)
        plain = dict(tokenizer, decoder=None)
        answer = {"version": version("executorch"), "tokens": [], "prompt_tokens": [], "texts": [],
                  "text_errors": []}
        with tempfile.TemporaryDirectory() as scratch:
            plain_path = os.path.join(scratch, TOKENIZER)
            with open(plain_path, "w", encoding="utf-8") as stream:
                json.dump(plain, stream)
            for text, num_bos in zip(request["texts"], request["num_bos"]):
                pieces, prompt_tokens, error = run(folder, plain_path, text, request["max_new_tokens"], num_bos)
                if error:
                    raise RuntimeError(error)
                unknown = [piece for piece in pieces if piece not in ids]
                if unknown:
                    raise RuntimeError(f"pieces that are no vocabulary string: {unknown[:3]}")
                answer["tokens"].append([ids[piece] for piece in pieces])
                answer["prompt_tokens"].append(prompt_tokens)
                pieces, _, error = run(folder, os.path.join(folder, TOKENIZER), text, request["max_new_tokens"],
                                       num_bos)
                answer["texts"].append(None if error else "".join(pieces))
                answer["text_errors"].append(error)
    finally:
        libc.fflush(None)
        os.dup2(stdout, 1)
    print(json.dumps(answer), flush=True)


if __name__ == "__main__":
    main()
