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
    from onnxscript.rewriter import pattern

    rules = pattern.RewriteRuleSet(
        [pattern.RewriteRule(_reciprocal_sqrt_product, _sqrt_quotient, name="SqrtQuotient")], commute=True)
    return rules.apply_to_model(model)
