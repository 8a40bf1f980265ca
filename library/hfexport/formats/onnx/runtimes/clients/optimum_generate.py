"""Greedy generation with optimum's ORTModelForCausalLM on an export folder (run in optimum's own environment); an
encoder-decoder's (`encoder_model.onnx` + `decoder_model_merged.onnx`) with ORTModelForSeq2SeqLM, or, given
`input_features` (Whisper), ORTModelForSpeechSeq2Seq.

argv: FOLDER REQUEST_JSON. REQUEST_JSON holds {"prompts": [[ids]], "max_new_tokens", "pad_token_id",
"eos_token_id", "padded", "file_name"} (the graph's file in FOLDER, as users pass it), for an encoder-decoder also
"is_encoder_decoder", "padding_side" and Whisper's "input_features" ([batch, mel bins, frames]). Prints one JSON line:
{"version", "batch1": [[new ids]], "padded": [[new ids]] or null} (an encoder-decoder's new ids: after its decoder
start token).
Token ids, not text: transformers 4.57 (optimum's) cannot read transformers 5's tokenizer_config.json.
This is how optimum's users load an ONNX LLM; it never imports hfexport.
"""

import json
import sys

import torch
from optimum.onnxruntime import ORTModelForCausalLM, ORTModelForSeq2SeqLM, ORTModelForSpeechSeq2Seq


def generate(model, rows, masks, request):
    output = model.generate(input_ids=torch.tensor(rows), attention_mask=torch.tensor(masks), do_sample=False,
                            max_new_tokens=request["max_new_tokens"], pad_token_id=request["pad_token_id"],
                            eos_token_id=request["eos_token_id"])
    return [row[len(rows[0]):].tolist() for row in output]


def new_tokens(rows, request):
    """Each sequence without its decoder start token, where it starts with it (optimum's Whisper leaves it out)."""
    start = request.get("decoder_start_token_id")
    return [row[1:] if start is None or row[:1] == [start] else row for row in rows.tolist()]


def seq2seq(folder, request):
    """Each prompt alone, then all in one batch padded on `padding_side`: new tokens after the decoder start."""
    options = dict(do_sample=False, max_new_tokens=request["max_new_tokens"], pad_token_id=request["pad_token_id"],
                   eos_token_id=request["eos_token_id"])
    if request.get("input_features") is not None:
        model = ORTModelForSpeechSeq2Seq.from_pretrained(folder)
        features = torch.tensor(request["input_features"], dtype=torch.float32)
        batch1 = [new_tokens(model.generate(input_features=features[i: i + 1], **options), request)[0]
                  for i in range(features.shape[0])]
        padded = new_tokens(model.generate(input_features=features, **options), request) \
            if request.get("padded") else None
        return batch1, padded
    model = ORTModelForSeq2SeqLM.from_pretrained(folder)
    batch1 = [new_tokens(model.generate(input_ids=torch.tensor([p]), attention_mask=torch.ones(1, len(p), dtype=torch.long),
                                        **options), request)[0] for p in request["prompts"]]
    padded = None
    if request.get("padded"):
        width = max(len(p) for p in request["prompts"])
        pad, right = request["pad_token_id"], request.get("padding_side") == "right"
        rows = [list(p) + [pad] * (width - len(p)) if right else [pad] * (width - len(p)) + list(p)
                for p in request["prompts"]]
        masks = [[1] * len(p) + [0] * (width - len(p)) if right else [0] * (width - len(p)) + [1] * len(p)
                 for p in request["prompts"]]
        padded = new_tokens(model.generate(input_ids=torch.tensor(rows), attention_mask=torch.tensor(masks),
                                           **options), request)
    return batch1, padded


def main():
    folder, request_file = sys.argv[1], sys.argv[2]
    with open(request_file, encoding="utf-8") as handle:
        request = json.load(handle)
    if request.get("is_encoder_decoder"):
        from importlib.metadata import version

        batch1, padded = seq2seq(folder, request)
        print(json.dumps({"version": version("optimum-onnx"), "batch1": batch1, "padded": padded}))
        return
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
