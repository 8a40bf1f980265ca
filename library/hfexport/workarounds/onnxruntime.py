"""RMSNorm in the form onnxruntime fuses, applied to every ONNX program the engine exports (`fuse_ready_rms_norms`).

torch 2.13's ONNX exporter (onnxscript's torchlib) lowers `torch.rsqrt` to `Reciprocal(Sqrt(v))`, so an RMSNorm
(`x * rsqrt(mean(x**2) + eps) * weight`: Llama, Qwen, Mistral, Gemma, SmolLM...) is exported as
`Mul(x, Reciprocal(Sqrt(...)))`. onnxruntime 1.32's `SimplifiedLayerNormFusion`, the graph optimization that folds
an RMSNorm into one `SimplifiedLayerNormalization` kernel in every runtime built on it (optimum's ORTModel*,
onnxruntime-genai, transformers.js on onnxruntime-node), matches `Div(x, Sqrt(...))` only: the exporter's form ran
unfused, six kernels per norm (61 norms on SmolLM2-135M). The rewrite here is the same arithmetic (`x / s` for
`x * (1 / s)`, one rounding instead of two) in the form the fusion matches, which optimum's and the model builder's
exports have. Measured on SmolLM2-135M's prompt pass at one intra-op thread (onnxruntime-genai's default on a 2-core
machine), AMD EPYC Zen 5, quiet: 82.8 ms unfused, 78.4 ms rewritten (benchmarks/smollm2_runtimes.py has the runtimes'
figures).
"""

from __future__ import annotations


def _reciprocal_sqrt_product(op, x, variance):
    return op.Mul(x, op.Reciprocal(op.Sqrt(variance)))


def _sqrt_quotient(op, x, variance):
    return op.Div(x, op.Sqrt(variance))


def fuse_ready_rms_norms(model) -> int:
    """Rewrite every `Mul(x, Reciprocal(Sqrt(v)))` (either operand order) of the onnx_ir `model` into
    `Div(x, Sqrt(v))`, in place, where the reciprocal has no other use; returns how many were rewritten."""
    from onnxscript.rewriter import RewritePass, pattern

    rules = pattern.RewriteRuleSet(
        [pattern.RewriteRule(_reciprocal_sqrt_product, _sqrt_quotient, name="SqrtQuotient")], commute=True)
    before = _count(model, "Reciprocal")
    RewritePass(rules)(model)
    return before - _count(model, "Reciprocal")


def _count(model, op_type: str) -> int:
    import onnx_ir

    graphs = [model.graph, *(function for function in model.functions.values())]
    return sum(1 for graph in graphs for node in onnx_ir.traversal.RecursiveGraphIterator(graph)
               if node.op_type == op_type and node.domain in ("", "ai.onnx"))
