"""The reference for benchmarks/orchestration.py: the same ONNX export of all-MiniLM-L6-v2 as hfexport's recipe
target `onnx` (benchmarks/recipes/minilm.json), written directly against the engine. Usage: SCRIPT MODEL_DIR OUT."""

import sys

import torch
from transformers import AutoModel, AutoTokenizer
from transformers.exporters import OnnxConfig, OnnxExporter

model_dir, output = sys.argv[1], sys.argv[2]
model = AutoModel.from_pretrained(model_dir).eval()
tokenizer = AutoTokenizer.from_pretrained(model_dir)
inputs = dict(tokenizer(["The capital of France is Paris.", "Exporting sentence embeddings with a recipe."],
                        return_tensors="pt", padding=True))
batch, seq = torch.export.Dim("batch", min=1, max=8), torch.export.Dim("seq", min=2, max=256)
shapes = {name: {0: batch, 1: seq} for name in inputs}
exported = OnnxExporter().export(model, inputs, OnnxConfig(dynamic_shapes=shapes, opset_version=18))
exported.save_pretrained(output)
