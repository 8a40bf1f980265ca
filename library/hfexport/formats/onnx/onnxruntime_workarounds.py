"""Graphs in the forms onnxruntime's graph optimizations match, applied to every ONNX program the engine exports.

Three rewrites, each the same arithmetic in the form onnxruntime's fusions match: RMSNorm
(`fuse_ready_rms_norms`), attention's key transpose (`fuse_ready_key_transposes`) and grouped-query caches
(`broadcast_grouped_query_caches`). What each works around and what it saved: docs/workarounds.md, "ONNX graphs in
onnxruntime's fusable forms". And one around onnxruntime's float16 converter (`value_info_from_dims`).
"""

from __future__ import annotations

import contextlib

from hfexport.workarounds import workaround


def _reciprocal_sqrt_product(op, x, variance):
    return op.Mul(x, op.Reciprocal(op.Sqrt(variance)))


def _sqrt_quotient(op, x, variance):
    return op.Div(x, op.Sqrt(variance))


@workaround(
    "onnxruntime-rms-norm-fusion",
    upstream="onnxruntime 1.32.0 (SimplifiedLayerNormFusion) with torch 2.13 (onnxscript 0.7.2 torchlib: rsqrt "
             "is Reciprocal(Sqrt))",
    works_around="(cost) the exporter writes an RMSNorm as x * Reciprocal(Sqrt(v)), onnxruntime's fusion into "
                 "one SimplifiedLayerNormalization kernel matches x / Sqrt(v) only: every runtime built on it "
                 "(optimum, onnxruntime-genai, transformers.js on Node) ran the norms unfused",
    applied="export.run_plan, on every ONNX program the engine exports (fuse_ready_rms_norms)",
    canary="tests/test_onnxruntime_fixes.py::test_without_the_fix_onnxruntime_leaves_the_rms_norm_unfused")
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


@workaround(
    "onnxruntime-key-transpose-fusion",
    upstream="onnxruntime 1.32.0 (MatMulTransposeFusion) with torch 2.13 (onnxscript 0.7.2 torchlib: "
             "scaled_dot_product_attention swaps the key's axes through a 3-d view)",
    works_around="(cost) torchlib transposes attention's key as Reshape, Transpose([0, 2, 1]), Reshape; "
                 "onnxruntime folds a transpose into the Q @ K^T matmul only when it feeds the matmul directly, "
                 "so every layer copied its key cache transposed on every step",
    applied="export.run_plan, on every ONNX program the engine exports (fuse_ready_key_transposes)",
    canary="tests/test_onnxruntime_fixes.py::test_without_the_fix_onnxruntime_copies_the_key_transposed")
def fuse_ready_key_transposes(model) -> int:
    """Rewrite every torchlib key transpose through a 3-d view (`Reshape`, `Transpose([0, 2, 1])`, `Reshape` back
    with the last two axes swapped) of the onnx_ir `model` into one `Transpose` of the last two axes, in place;
    returns how many were rewritten."""
    from onnxscript.rewriter import pattern

    rule = pattern.RewriteRule(_key_swap_through_3d, _key_swap, _swaps_the_last_two_axes, name="KeySwap")
    return _rewritten(pattern.RewriteRuleSet([rule]), model)


def _rewritten(rules, model) -> int:
    """Apply `rules` to `model`, then drop what that left unused (the shape arithmetic of what was replaced, which
    would otherwise keep a use of the replaced values and hide them from the next rewrite)."""
    from onnx_ir.passes.common import RemoveUnusedNodesPass

    count = rules.apply_to_model(model)
    if count:
        RemoveUnusedNodesPass()(model)
    return count


def _repeated(op, kv, axes, expand_shape, merged_shape):
    """transformers' `repeat_kv`: `kv[:, :, None].expand(b, h_kv, n, t, d).reshape(b, h_kv * n, t, d)`."""
    return op.Reshape(op.Expand(op.Unsqueeze(kv, axes), expand_shape, _outputs=["expanded"]), merged_shape,
                      _outputs=["repeated"])


def _scores_over_repeated_keys(op, query, query_scale, kv, axes, expand_shape, merged_shape, key_scale):
    """torchlib's `Q K^T` with the scale split over both operands, over repeated keys."""
    keys = _repeated(op, kv, axes, expand_shape, merged_shape)
    return op.MatMul(op.Mul(query, query_scale), op.Mul(op.Transpose(keys, perm=[0, 1, 3, 2]), key_scale))


def _output_over_repeated_values(op, probabilities, kv, axes, expand_shape, merged_shape):
    return op.MatMul(probabilities, _repeated(op, kv, axes, expand_shape, merged_shape))


def _dims(value) -> list | None:
    return list(value.shape.dims) if value is not None and value.shape is not None else None


def _is_scalar(value) -> bool:
    import onnx_ir as ir

    constant = ir.convenience.get_const_tensor(value)
    return constant is not None and constant.numpy().size == 1


def _is_a_head_repeat(context, kv, axes, expanded, repeated, query_scale=None, key_scale=None, **_) -> bool:
    """`repeated` is `kv` [b, h_kv, t, d] with each head repeated n times in place (heads h_kv * n, head i of it
    `kv`'s head i // n), read off the exporter's shapes: the unsqueeze at axis 2, the expand only along it (static
    h_kv, n and d), the reshape merging those two; the scales, where there are, scalar constants."""
    del context
    import onnx_ir as ir

    unsqueezed_at = ir.convenience.get_const_tensor(axes)
    source, wide, merged = _dims(kv), _dims(expanded), _dims(repeated)
    if unsqueezed_at is None or unsqueezed_at.numpy().reshape(-1).tolist() != [2]:
        return False
    if source is None or wide is None or merged is None or (len(source), len(wide), len(merged)) != (4, 5, 4):
        return False
    heads, repeats, size = wide[1], wide[2], source[3]
    if not all(isinstance(dim, int) for dim in (heads, repeats, size)) or repeats < 2 or source[1] != heads:
        return False
    batch, length = str(source[0]), str(source[2])  # a symbol's name or a size: compared as text
    if any(name in ("", "None") for name in (batch, length)):
        return False
    if [str(wide[0]), str(wide[3]), wide[4]] != [batch, length, size]:
        return False
    if [str(merged[0]), merged[1], str(merged[2]), merged[3]] != [batch, heads * repeats, length, size]:
        return False
    return all(_is_scalar(scale) for scale in (query_scale, key_scale) if scale is not None)


def _head_groups(expanded) -> tuple[int, int]:
    heads, repeats = _dims(expanded)[1:3]
    return heads, repeats


def _grouped_scores(op, query, query_scale, kv, axes, key_scale, expanded, **_):
    """[b, h_kv * n, s, d] queries viewed as [b, h_kv, n, s, d] against the [b, h_kv, 1, d, t] keys, the scores
    merged back to [b, h_kv * n, s, t]."""
    heads, repeats = _head_groups(expanded)
    size = _dims(kv)[3]
    grouped = op.Reshape(query, op.Constant(value_ints=[0, heads, repeats, -1, size]))
    keys = op.Transpose(op.Unsqueeze(kv, axes), perm=[0, 1, 2, 4, 3])
    scores = op.MatMul(op.Mul(grouped, query_scale), op.Mul(keys, key_scale))
    length = op.Shape(kv, start=2, end=3)
    return op.Reshape(scores, op.Concat(op.Constant(value_ints=[0, heads * repeats, -1]), length, axis=0))


def _grouped_output(op, probabilities, kv, axes, expanded, **_):
    """[b, h_kv * n, s, t] probabilities viewed as [b, h_kv, n, s, t] over the [b, h_kv, 1, t, d] values, merged
    back to [b, h_kv * n, s, d]."""
    heads, repeats = _head_groups(expanded)
    length = op.Shape(kv, start=2, end=3)
    grouped = op.Reshape(probabilities, op.Concat(op.Constant(value_ints=[0, heads, repeats, -1]), length, axis=0))
    output = op.MatMul(grouped, op.Unsqueeze(kv, axes))
    return op.Reshape(output, op.Constant(value_ints=[0, heads * repeats, -1, _dims(kv)[3]]))


@workaround(
    "onnxruntime-grouped-query-cache-copies",
    upstream="onnxruntime 1.32.0 (no graph optimization undoes a repeat) with transformers 5.23 (repeat_kv)",
    works_around="(cost) transformers' repeat_kv exports as Unsqueeze, Expand, Reshape: every layer copied its "
                 "whole key and value cache once per query head of a group, every step, before the two "
                 "attention matmuls; rewritten as the same matmuls broadcast over the group",
    applied="export.run_plan, on every ONNX program the engine exports (broadcast_grouped_query_caches)",
    canary="tests/test_onnxruntime_fixes.py::test_without_the_fix_onnxruntime_copies_the_repeated_cache")
def broadcast_grouped_query_caches(model) -> int:
    """Rewrite attention over a grouped-query cache repeated to every head (transformers' `repeat_kv`: an `Expand`
    that copies the whole key and value cache n times, every layer, every step) into the same matmuls over the cache
    as it is, broadcast over the repeats (the query and the probabilities viewed as [b, h_kv, n, s, .]), in place, in
    the onnx_ir `model`; returns how many matmuls were rewritten. Runs after `fuse_ready_key_transposes`, whose
    single key Transpose its scores rule matches."""
    from onnxscript.rewriter import pattern

    rules = pattern.RewriteRuleSet([
        pattern.RewriteRule(_scores_over_repeated_keys, _grouped_scores, _is_a_head_repeat, name="GroupedScores"),
        pattern.RewriteRule(_output_over_repeated_values, _grouped_output, _is_a_head_repeat, name="GroupedOutput"),
    ])
    return _rewritten(rules, model)


@workaround(
    "onnxruntime-float16-converter-reads-data-for-shapes",
    upstream="onnxruntime 1.32.0 (onnxruntime.transformers.float16.make_value_info_from_tensor)",
    works_around="(memory) the float16 converter reads an initializer's whole data (numpy_helper.to_array) only to "
                 "take its shape; a graph converted without its weights' data (a 1B model's float16 target, issue "
                 "45) has none to read",
    applied="formats.onnx.float16, while the converter runs on a graph whose large initializers are streamed",
    canary="tests/test_onnxruntime_fixes.py::test_without_the_fix_the_float16_converter_reads_data_for_a_shape")
@contextlib.contextmanager
def value_info_from_dims(converter):
    """While in it, onnxruntime's float16 `converter` module makes an initializer's value info from its dims."""
    from unittest import mock

    from onnx import helper

    def from_dims(tensor):
        return helper.make_tensor_value_info(tensor.name, tensor.data_type, tuple(tensor.dims))

    with mock.patch.object(converter, "make_value_info_from_tensor", from_dims):
        yield
