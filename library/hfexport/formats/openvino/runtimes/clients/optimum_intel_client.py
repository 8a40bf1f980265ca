"""optimum-intel's `OVModelForCausalLM.from_pretrained(folder)` on an OpenVINO generation export, greedy, from token
ids: run by hfexport.formats.openvino.runtimes.optimum_intel in the runtime's own environment (it never imports hfexport).

    python optimum_intel_client.py FOLDER REQUEST.json

REQUEST: {"prompts": [[ids]], "max_new_tokens", "eos_token_id": [ids], "pad_token_id", "padded": bool}. Prints one
JSON line: optimum-intel's version and the new tokens per prompt at an f32 inference precision hint ("f32", batch 1;
"f32_padded", all prompts in one left-padded batch).
"""

import json
import sys
from importlib.metadata import version

import torch
from optimum.intel import OVModelForCausalLM


def generate(model, prompts, request, padded):
    options = {"max_new_tokens": request["max_new_tokens"], "min_new_tokens": 0, "do_sample": False,
               "num_beams": 1, "eos_token_id": request["eos_token_id"], "pad_token_id": request["pad_token_id"]}
    if padded:
        width = max(map(len, prompts))
        ids = torch.full((len(prompts), width), request["pad_token_id"], dtype=torch.long)
        mask = torch.zeros((len(prompts), width), dtype=torch.long)
        for row, prompt in enumerate(prompts):
            ids[row, width - len(prompt):] = torch.tensor(prompt)
            mask[row, width - len(prompt):] = 1
        out = model.generate(input_ids=ids, attention_mask=mask, **options)
        return [row[width:].tolist() for row in out]
    result = []
    for prompt in prompts:
        ids = torch.tensor([prompt], dtype=torch.long)
        out = model.generate(input_ids=ids, attention_mask=torch.ones_like(ids), **options)
        result.append(out[0, len(prompt):].tolist())
    return result


def main():
    folder, request_path = sys.argv[1], sys.argv[2]
    with open(request_path, encoding="utf-8") as stream:
        request = json.load(stream)
    model = OVModelForCausalLM.from_pretrained(folder, ov_config={"INFERENCE_PRECISION_HINT": "f32"})
    answer = {"version": version("optimum-intel"), "stateful": bool(model.stateful),
              "f32": generate(model, request["prompts"], request, False)}
    if request.get("padded") and request.get("pad_token_id") is not None:
        answer["f32_padded"] = generate(model, request["prompts"], request, True)
    print(json.dumps(answer))


if __name__ == "__main__":
    main()
