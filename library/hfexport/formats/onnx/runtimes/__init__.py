"""The deployment runtimes of ONNX exports: transformers.js, optimum, onnxruntime-genai."""
