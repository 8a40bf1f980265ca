"""Runs inside the peers' venv (hfexport.testing.peers): loads a published model the way users of each loader do.

`embed REPO REVISION SENTENCES_JSON [VARIANTS_JSON]`: sentence-transformers' torch model (from the repo's own weights)
against `backend="onnx"` and `backend="openvino"` at REVISION, and optimum's ORT/OV feature-extraction classes on the
conventional subfolders; VARIANTS_JSON (`{"onnx-int8": "onnx/model_quantized.onnx", ...}`) adds each named file, opened
with sentence-transformers' `file_name` (and, for ONNX, optimum's `subfolder` + `file_name`); prints cosine
similarities per loader (or the loader's error).
`causal REPO REVISION IDS_JSON SUBFOLDER_ONNX SUBFOLDER_OV`: optimum's ORTModelForCausalLM / OVModelForCausalLM
(use_cache=False) against transformers' torch model: the largest absolute logit difference per loader.
Prints one JSON line. Never imports hfexport (its transformers is a different major version).
"""

import json
import sys

F32 = {"INFERENCE_PRECISION_HINT": "f32"}


def _cosines(reference, other):
    import numpy as np

    reference, other = np.asarray(reference, dtype=np.float64), np.asarray(other, dtype=np.float64)
    return ((reference * other).sum(1) / np.linalg.norm(reference, axis=1) / np.linalg.norm(other, axis=1)).tolist()


def _attempt(results, name, function):
    try:
        results[name] = function()
    except Exception as error:  # noqa: BLE001 - reported to the test, which decides
        results[name] = {"error": f"{type(error).__name__}: {str(error)[:800]}"}


def embed(repo, revision, sentences, variants=None):
    from sentence_transformers import SentenceTransformer
    from transformers import AutoTokenizer

    reference = SentenceTransformer(repo, revision=revision).encode(sentences)
    results = {"reference": reference.tolist()}
    kwargs = {"onnx": {}, "openvino": {"ov_config": F32}}  # f32 on every CPU: bf16-capable ones default to bf16
    for backend in ("onnx", "openvino"):
        _attempt(results, f"sentence-transformers/{backend}", lambda backend=backend: {"cosine": _cosines(
            reference, SentenceTransformer(repo, backend=backend, revision=revision,
                                           model_kwargs=kwargs[backend]).encode(sentences))})
    for name, file_name in (variants or {}).items():
        backend = "openvino" if file_name.endswith(".xml") else "onnx"
        _attempt(results, f"sentence-transformers/{name}", lambda backend=backend, file_name=file_name: {
            "cosine": _cosines(reference, SentenceTransformer(
                repo, backend=backend, revision=revision,
                model_kwargs={**kwargs[backend], "file_name": file_name}).encode(sentences))})
    tokenizer = AutoTokenizer.from_pretrained(repo, revision=revision)
    batch = tokenizer(sentences, padding=True, return_tensors="pt")

    def mean_pooled(model):
        hidden = model(**batch).last_hidden_state
        mask = batch["attention_mask"].unsqueeze(-1).to(hidden.dtype)
        return ((hidden * mask).sum(1) / mask.sum(1)).detach().numpy()

    from transformers import AutoModel

    torch_pooled = mean_pooled(AutoModel.from_pretrained(repo, revision=revision))

    def ort():
        from optimum.onnxruntime import ORTModelForFeatureExtraction

        return {"cosine": _cosines(torch_pooled, mean_pooled(
            ORTModelForFeatureExtraction.from_pretrained(repo, revision=revision, subfolder="onnx")))}

    def ov():
        from optimum.intel import OVModelForFeatureExtraction

        return {"cosine": _cosines(torch_pooled, mean_pooled(
            OVModelForFeatureExtraction.from_pretrained(repo, revision=revision, subfolder="openvino", ov_config=F32)))}

    _attempt(results, "optimum/ORTModelForFeatureExtraction", ort)
    _attempt(results, "optimum/OVModelForFeatureExtraction", ov)
    for name, file_name in (variants or {}).items():
        if not file_name.endswith(".onnx"):
            continue
        from optimum.onnxruntime import ORTModelForFeatureExtraction

        folder, file = file_name.rsplit("/", 1)
        _attempt(results, f"optimum/ORTModelForFeatureExtraction/{name}", lambda folder=folder, file=file: {
            "cosine": _cosines(torch_pooled, mean_pooled(ORTModelForFeatureExtraction.from_pretrained(
                repo, revision=revision, subfolder=folder, file_name=file)))})
    return results


def causal(repo, revision, ids, onnx_subfolder, ov_subfolder):
    import torch
    from transformers import AutoModelForCausalLM

    input_ids = torch.tensor(ids)
    attention_mask = torch.ones_like(input_ids)
    reference = AutoModelForCausalLM.from_pretrained(repo, revision=revision)(
        input_ids=input_ids, attention_mask=attention_mask).logits.detach()
    results = {}

    def compare(model):
        logits = model(input_ids=input_ids, attention_mask=attention_mask).logits
        return {"max_abs_diff": float((torch.as_tensor(logits) - reference).abs().max())}

    def ort():
        from optimum.onnxruntime import ORTModelForCausalLM

        return compare(ORTModelForCausalLM.from_pretrained(repo, revision=revision, subfolder=onnx_subfolder,
                                                           use_cache=False, use_io_binding=False))

    def ov():
        from optimum.intel import OVModelForCausalLM

        return compare(OVModelForCausalLM.from_pretrained(repo, revision=revision, subfolder=ov_subfolder,
                                                          use_cache=False, ov_config=F32))

    _attempt(results, "optimum/ORTModelForCausalLM", ort)
    _attempt(results, "optimum/OVModelForCausalLM", ov)
    return results


if __name__ == "__main__":
    command, repo, revision = sys.argv[1:4]
    if command == "embed":
        print(json.dumps(embed(repo, revision, json.loads(sys.argv[4]),
                               json.loads(sys.argv[5]) if len(sys.argv) > 5 else None)))
    elif command == "causal":
        print(json.dumps(causal(repo, revision, json.loads(sys.argv[4]), sys.argv[5], sys.argv[6])))
    else:
        raise SystemExit(f"unknown command {command!r}")
