"""ONNX: the engine's ONNX export, saved in the layouts transformers.js, optimum and onnxruntime-genai read."""
