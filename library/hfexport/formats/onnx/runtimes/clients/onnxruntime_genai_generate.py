"""Greedy generation with onnxruntime-genai on an export folder (run in onnxruntime-genai's own environment).

argv: FOLDER REQUEST_JSON. REQUEST_JSON holds {"prompts": [[ids]], "max_new_tokens", "pad_token_id", "padded", "overlay"} (what is
overlaid on genai_config.json: a dtype variant's `model_quantized.onnx` as the decoder's filename, shared past/present
buffers for a fused one).
Prints one JSON line: {"version", "batch1": [[new ids] per prompt], "padded": [[new ids] per prompt] or null}.
This is how onnxruntime-genai's users generate (og.Model, og.GeneratorParams, og.Generator); it never imports hfexport.
"""

import json
import sys

import numpy as np
import onnxruntime_genai as og


def generate(model, rows, max_new_tokens):
    """New tokens per row of one (left-padded) batch `rows`, greedy."""
    params = og.GeneratorParams(model)
    width = len(rows[0])
    params.set_search_options(do_sample=False, max_length=width + max_new_tokens, batch_size=len(rows))
    generator = og.Generator(model, params)
    generator.append_tokens(np.array(rows, dtype=np.int32))
    while not generator.is_done():
        generator.generate_next_token()
    return [[int(token) for token in generator.get_sequence(index)[width:]] for index in range(len(rows))]


def main():
    folder, request_file = sys.argv[1], sys.argv[2]
    with open(request_file, encoding="utf-8") as handle:
        request = json.load(handle)
    config = og.Config(folder)
    if request.get("overlay"):  # a dtype variant beside model.onnx (and its shared cache buffers), as users pick it
        config.overlay(json.dumps(request["overlay"]))
    model = og.Model(config)
    batch1 = [generate(model, [prompt], request["max_new_tokens"])[0] for prompt in request["prompts"]]
    padded = None
    if request.get("padded") and request.get("pad_token_id") is not None:
        width = max(len(prompt) for prompt in request["prompts"])
        rows = [[request["pad_token_id"]] * (width - len(prompt)) + list(prompt) for prompt in request["prompts"]]
        padded = generate(model, rows, request["max_new_tokens"])
    print(json.dumps({"version": og.__version__, "batch1": batch1, "padded": padded}))


if __name__ == "__main__":
    main()
