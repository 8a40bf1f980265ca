"""Greedy generation with optimum's ORTModelForCausalLM on an export folder (run in optimum's own environment).

argv: FOLDER REQUEST_JSON. REQUEST_JSON holds {"prompts": [[ids]], "max_new_tokens", "pad_token_id",
"eos_token_id", "padded", "file_name"} (the graph's file in FOLDER, as users pass it). Prints one JSON line: {"version", "batch1": [[new ids]], "padded": [[new ids]] or null}.
Token ids, not text: transformers 4.57 (optimum's) cannot read transformers 5's tokenizer_config.json.
This is how optimum's users load an ONNX LLM; it never imports hfexport.
"""

import json
import sys

import torch
from optimum.onnxruntime import ORTModelForCausalLM


def generate(model, rows, masks, request):
    output = model.generate(input_ids=torch.tensor(rows), attention_mask=torch.tensor(masks), do_sample=False,
                            max_new_tokens=request["max_new_tokens"], pad_token_id=request["pad_token_id"],
                            eos_token_id=request["eos_token_id"])
    return [row[len(rows[0]):].tolist() for row in output]


def main():
    folder, request_file = sys.argv[1], sys.argv[2]
    with open(request_file, encoding="utf-8") as handle:
        request = json.load(handle)
    model = ORTModelForCausalLM.from_pretrained(folder, file_name=request.get("file_name", "model.onnx"))
    batch1 = [generate(model, [prompt], [[1] * len(prompt)], request)[0] for prompt in request["prompts"]]
    padded = None
    if request.get("padded"):
        width = max(len(prompt) for prompt in request["prompts"])
        pad = request["pad_token_id"]
        rows = [[pad] * (width - len(prompt)) + list(prompt) for prompt in request["prompts"]]
        masks = [[0] * (width - len(prompt)) + [1] * len(prompt) for prompt in request["prompts"]]
        padded = generate(model, rows, masks, request)
    from importlib.metadata import version

    print(json.dumps({"version": version("optimum-onnx"), "batch1": batch1, "padded": padded}))


if __name__ == "__main__":
    main()
