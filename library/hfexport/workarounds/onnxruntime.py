"""Graphs in the forms onnxruntime's graph optimizations match, applied to every ONNX program the engine exports.

**RMSNorm** (`fuse_ready_rms_norms`).

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

**Attention's key transpose** (`fuse_ready_key_transposes`). torchlib lowers `scaled_dot_product_attention` for any
rank, so it swaps the key's last two axes through a 3-d view: `Reshape(Transpose(Reshape(k, [-1, L, E]), [0, 2, 1]),
[*batch, E, L])`. onnxruntime's `MatMulTransposeFusion` folds a transpose into the `Q @ K^T` matmul only when the
`Transpose` feeds the matmul directly, so every layer copied its whole key cache, transposed, on every step (optimum's
export, from `matmul(q, k.transpose(2, 3))`, has the folded form). The rewrite is the same transpose as one
`Transpose` of the last two axes. Measured on SmolLM2-135M (raw onnxruntime, AMD EPYC Zen 4, quiet): a 40-token
prompt 79.5 -> 73.8 ms and a decode step 25.7 -> 23.9 ms at two threads, 123.8 -> 120.3 ms and 30.7 -> 29.9 ms at one.
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


_INT64_MIN, _INT64_MAX = -(2**63), 2**63 - 1


def _key_swap_through_3d(op, x, squeezed_shape, swapped_shape):
    return op.Reshape(op.Transpose(op.Reshape(x, squeezed_shape), perm=[0, 2, 1]), swapped_shape)


def _shape_entries(shape, x, rank: int) -> list | None:
    """The 1-d int64 `shape` as a list of entries, each a constant int or the index of one of `x`'s axes, where
    `shape` is a `Concat` of constants and `Slice`s of `Shape(x)` (torchlib's form); None for anything else."""
    import onnx_ir as ir

    concat = shape.producer()
    if concat is None or concat.op_type != "Concat" or concat.domain != "":
        return None
    entries = []
    for part in concat.inputs:
        constant = ir.convenience.get_const_tensor(part)
        if constant is not None:
            entries.extend(int(v) for v in constant.numpy().reshape(-1))
            continue
        sliced = part.producer()
        if sliced is None or sliced.op_type != "Slice" or len(sliced.inputs) != 3:
            return None
        source = sliced.inputs[0].producer()
        if (source is None or source.op_type != "Shape" or source.inputs[0] is not x
                or source.attributes.get_int("start", 0) != 0 or "end" in source.attributes):
            return None
        bounds = [ir.convenience.get_const_tensor(value) for value in sliced.inputs[1:]]
        if any(bound is None or bound.numpy().size != 1 for bound in bounds):
            return None
        start, end = (max(min(int(bound.numpy().reshape(-1)[0]), _INT64_MAX), _INT64_MIN) for bound in bounds)
        entries.extend(("axis", axis) for axis in range(rank)[start:end])
    return entries


def _swaps_the_last_two_axes(context, x, squeezed_shape, swapped_shape, **_) -> bool:
    """The two reshapes are torchlib's: to `[-1, x.shape[-2], x.shape[-1]]`, then back to `x`'s shape with its last two
    axes swapped; `x`'s rank must be known."""
    del context
    rank = len(x.shape) if x.shape is not None else None
    if rank is None or rank < 3:
        return False
    axes = [("axis", axis) for axis in range(rank)]
    return (_shape_entries(squeezed_shape, x, rank) == [-1, axes[-2], axes[-1]]
            and _shape_entries(swapped_shape, x, rank) == [*axes[:-2], axes[-1], axes[-2]])


def _key_swap(op, x, squeezed_shape, swapped_shape):
    rank = len(x.shape)
    return op.Transpose(x, perm=[*range(rank - 2), rank - 1, rank - 2])


def fuse_ready_key_transposes(model) -> int:
    """Rewrite every torchlib key transpose through a 3-d view (`Reshape`, `Transpose([0, 2, 1])`, `Reshape` back
    with the last two axes swapped) of the onnx_ir `model` into one `Transpose` of the last two axes, in place;
    returns how many were rewritten."""
    from onnxscript.rewriter import pattern

    rule = pattern.RewriteRule(_key_swap_through_3d, _key_swap, _swaps_the_last_two_axes, name="KeySwap")
    return pattern.RewriteRuleSet([rule]).apply_to_model(model)
