"""OpenVINO GenAI's LLMPipeline on a folder, greedy, from token ids: run by hfexport.formats.openvino.runtimes.openvino_genai in the
runtime's own environment (it never imports hfexport).

    python openvino_genai_client.py FOLDER REQUEST.json

REQUEST: {"prompts": [[ids]], "max_new_tokens", "eos_token_id": [ids], "pad_token_id", "padded": bool}. Prints one
JSON line: the runtime's version, the CPU plugin's default precision, and the new tokens per prompt at an f32
inference precision hint ("f32", batch 1; "f32_padded", all prompts in one left-padded batch) and at the device's
default precision ("default", only where that default is not f32).
"""

import json
import sys

import numpy as np
import openvino as ov
import openvino_genai


def generate(pipe, prompts, request, padded):
    config = pipe.get_generation_config()
    config.max_new_tokens = request["max_new_tokens"]
    config.min_new_tokens = 0
    config.do_sample = False
    config.num_beams = 1
    config.num_return_sequences = 1
    config.ignore_eos = False
    config.stop_token_ids = set(request["eos_token_id"])
    if padded:
        width = max(map(len, prompts))
        ids = np.full((len(prompts), width), request["pad_token_id"], dtype=np.int64)
        mask = np.zeros((len(prompts), width), dtype=np.int64)
        for row, prompt in enumerate(prompts):
            ids[row, width - len(prompt):] = prompt
            mask[row, width - len(prompt):] = 1
        result = pipe.generate(openvino_genai.TokenizedInputs(ov.Tensor(ids), ov.Tensor(mask)), config)
        return [list(map(int, tokens)) for tokens in result.tokens]
    out = []
    for prompt in prompts:
        ids = np.array([prompt], dtype=np.int64)
        result = pipe.generate(openvino_genai.TokenizedInputs(ov.Tensor(ids), ov.Tensor(np.ones_like(ids))), config)
        out.append(list(map(int, result.tokens[0])))
    return out


def main():
    folder, request_path = sys.argv[1], sys.argv[2]
    with open(request_path, encoding="utf-8") as stream:
        request = json.load(stream)
    hint = ov.Core().get_property("CPU", "INFERENCE_PRECISION_HINT")  # what the plugin computes at unless told
    default = hint.get_type_name() if hasattr(hint, "get_type_name") else str(hint)
    answer = {"version": openvino_genai.__version__, "default_precision": default}
    pipe = openvino_genai.LLMPipeline(folder, "CPU", INFERENCE_PRECISION_HINT="f32")
    answer["f32"] = generate(pipe, request["prompts"], request, False)
    if request.get("padded"):
        answer["f32_padded"] = generate(pipe, request["prompts"], request, True)
    del pipe
    if default != "f32":
        pipe = openvino_genai.LLMPipeline(folder, "CPU")
        answer["default"] = generate(pipe, request["prompts"], request, False)
    print(json.dumps(answer))


if __name__ == "__main__":
    main()
