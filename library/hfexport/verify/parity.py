"""Comparing one exported output with the eager one, leaf by leaf: max abs/rel difference, cosine, top-1 agreement.

Computed in NumPy on torch tensors and NumPy arrays alike (a torch tensor is read as the array it shares memory with),
without importing torch: the ONNX gate's artifact side runs it in a process without torch (`hfexport.verify.artifact`),
the same code on the same figures as in process."""

from __future__ import annotations

from typing import Any

from hfexport.verify.thresholds import tolerance_of

CACHE_OUTPUTS = ("past_key_values", "present_key_values", "cache_params")


# ── Comparing outputs ────────────────────────────────────────────────────────


#: Elements compared at a time: every metric is a max, a count or a sum, taken block by block, so comparing a
#: [batch*seq, vocab] logits leaf holds a few 4 MB temporaries, not a dozen copies of it (issue 45: the float32 and
#: float64 temporaries of one SmolLM2 logits leaf at batch 8 once made the gate's peak).
CHUNK_ELEMENTS = 1 << 20


def as_array(value):
    """A torch tensor or array-like as a NumPy array, sharing a CPU tensor's memory; a tensor NumPy has no dtype for
    (bfloat16) as float32, the dtype every metric is computed at (exact for it)."""
    import numpy

    if hasattr(value, "detach"):  # a torch tensor, without importing torch
        value = value.detach().cpu()
        if str(value.dtype) == "torch.bfloat16":
            value = value.float()
        return value.numpy()
    return numpy.asarray(value)


def compare_tensors(exported, eager, tolerance: dict, logits: bool = False) -> dict:
    """Metrics of one output leaf and whether it meets `tolerance`; `failures` names each metric that did not.
    Computed in row blocks of about `CHUNK_ELEMENTS` (`_block_metrics`), the same figures as on the whole tensor.
    `exported`, `eager`: torch tensors or NumPy arrays."""
    exported, eager = as_array(exported), as_array(eager)
    result: dict[str, Any] = {"shape": list(eager.shape)}
    failures: list[str] = []
    if tuple(exported.shape) != tuple(eager.shape):
        result.update(exported_shape=list(exported.shape), passed=False,
                      failures=[f"shape {list(exported.shape)} != eager {list(eager.shape)}"])
        return result
    atol, rtol = tolerance.get("atol"), tolerance.get("rtol")
    metrics = _block_metrics(exported, eager, atol, rtol, logits and eager.ndim >= 1 and eager.shape[-1] >= 2)
    if metrics["bad_nan"]:
        failures.append(f"nan: {metrics['bad_nan']} elements are NaN on one side only")
    max_abs, max_rel, cosine = metrics["max_abs"], metrics["max_rel"], metrics["cosine"]
    result.update(max_abs=_finite(max_abs), max_rel=_finite(max_rel), cosine=_finite(cosine))
    if result["max_abs"] is None or result["cosine"] is None:
        failures.append("non-finite: the difference is inf or NaN")
    if (atol is not None or rtol is not None) and metrics["outside"]:
        result["mismatched"] = _mean(metrics["outside"], metrics["numel"])
        failures.append(f"max_abs {max_abs:.3g} exceeds atol {atol if atol is not None else 0:g} + rtol "
                        f"{rtol if rtol is not None else 0:g}·|eager| on {result['mismatched']:.2%} of elements")
    if tolerance.get("min_cosine") is not None and result["cosine"] is not None and cosine < tolerance["min_cosine"]:
        failures.append(f"cosine {cosine:.6f} < min_cosine {tolerance['min_cosine']}")
    if metrics["rows"]:
        top1 = _mean(metrics["top1"], metrics["rows"])
        result["top1"] = top1
        if tolerance.get("min_top1") is not None and top1 < tolerance["min_top1"]:
            failures.append(f"top1 {top1:.4f} < min_top1 {tolerance['min_top1']}")
    result["passed"] = not failures
    result["failures"] = failures
    return result


def _blocks(got, want):
    """(got, want) as float32 row blocks of about `CHUNK_ELEMENTS` each (rows along the last axis: argmax stays whole)."""
    import numpy

    width = want.shape[-1] if want.ndim >= 1 and want.shape[-1] else 1
    got, want = got.reshape(-1, width), want.reshape(-1, width)
    step = max(1, CHUNK_ELEMENTS // width)
    for start in range(0, want.shape[0], step):
        yield got[start : start + step].astype(numpy.float32), want[start : start + step].astype(numpy.float32)


def _block_max(values: list[float]) -> float:
    """The max of per-block maxima as the max of the whole: NaN where any block's is."""
    import math

    return math.nan if any(math.isnan(value) for value in values) else max(values, default=0.0)


def _mean(count: int, total: int) -> float:
    """`count / total` as a float32 mean of a 0/1 tensor gives it (exact sum, one float32 division)."""
    import numpy

    return float(numpy.float32(count) / numpy.float32(total))


def _block_metrics(got, want, atol, rtol, logits: bool) -> dict:
    """max |got - want| (NaN on one side only: inf), max relative difference where |want| >= 1e-3 of its max,
    cosine (float64 sums), the count outside `atol + rtol·|want|`, NaNs on one side only and (logits) rows whose
    argmax agree; NaNs on both sides count as 0 on both. Two passes: the scale of |want| first."""
    import numpy

    numel = want.size
    metrics = {"numel": numel, "bad_nan": 0, "outside": 0, "top1": 0, "rows": 0, "max_abs": 0.0, "max_rel": 0.0,
               "cosine": 1.0}
    if numel == 0:
        return metrics
    scales, abs_maxima, rel_maxima, any_significant = [], [], [], False
    got_sq = want_sq = dot = 0.0
    for got_block, want_block in _blocks(got, want):
        both_nan = numpy.isnan(got_block) & numpy.isnan(want_block)
        scales.append(float(numpy.abs(numpy.where(both_nan, numpy.float32(0), want_block)).max()))
    scale = _block_max(scales)
    for got_block, want_block in _blocks(got, want):
        if logits:
            metrics["top1"] += int((got_block.argmax(-1) == want_block.argmax(-1)).sum())
            metrics["rows"] += got_block.shape[0]
        got_nan, want_nan = numpy.isnan(got_block), numpy.isnan(want_block)
        both_nan = got_nan & want_nan
        metrics["bad_nan"] += int(((got_nan | want_nan) & ~both_nan).sum())
        zero = numpy.float32(0)
        got_block, want_block = numpy.where(both_nan, zero, got_block), numpy.where(both_nan, zero, want_block)
        diff = numpy.abs(got_block - want_block)
        # NaN (one side only) counts as inf; an inf difference as the largest finite value (as torch.nan_to_num)
        abs_maxima.append(float(numpy.nan_to_num(diff, nan=numpy.inf).max()))
        magnitude = numpy.abs(want_block)
        if scale > 0:
            significant = magnitude >= 1e-3 * scale
            if bool(significant.any()):
                any_significant = True
                rel_maxima.append(float((diff[significant] / magnitude[significant]).max()))
        got_wide, want_wide = got_block.astype(numpy.float64), want_block.astype(numpy.float64)
        got_sq += float(numpy.square(got_wide).sum())
        want_sq += float(numpy.square(want_wide).sum())
        dot += float((got_wide * want_wide).sum())
        if atol is not None or rtol is not None:
            metrics["outside"] += int((diff > (atol or 0.0) + (rtol or 0.0) * magnitude).sum())
    max_abs = _block_max(abs_maxima)
    norms = got_sq ** 0.5 * want_sq ** 0.5
    metrics.update(max_abs=max_abs, max_rel=_block_max(rel_maxima) if any_significant else 0.0,
                   cosine=1.0 if norms == 0 and max_abs == 0 else (dot / norms if norms else 0.0))
    return metrics


def _finite(value: float) -> float | None:
    """A metric as JSON can hold it: inf and NaN become null (and fail the output)."""
    import math

    return value if math.isfinite(value) else None


def _leaves(output) -> dict:
    from transformers.exporters.utils import get_leaf_tensors

    return get_leaf_tensors(output)


def _group(name: str) -> str:
    """Cache leaves (`past_key_values.layers.3.keys`) are reported together as their top-level output."""
    head = name.split(".")[0]
    return head if head in CACHE_OUTPUTS else name


def _unpadded(tensor, name: str, mask):
    """Only the positions whose attention_mask is 1: a padded query position attends to nothing, and what a
    backend computes there is unspecified (a left-padded decoder's first rows differ by design). Token-major
    outputs are `[batch, seq, ...]`; cache leaves `[batch, heads, seq, dim]`."""
    import numpy

    if mask is None or tensor.ndim < 2 or tensor.shape[0] != mask.shape[0] or bool(mask.all()):
        return tensor
    axis = tensor.ndim - 2 if _group(name) != name else 1
    if axis < 1 or tensor.shape[axis] != mask.shape[1]:
        return tensor
    return numpy.moveaxis(tensor, axis, 1)[mask.astype(bool)]


def compare_outputs(exported_output, eager_output, thresholds: dict, mask=None) -> dict:
    """`{output: metrics}` for every leaf of the eager output; cache leaves grouped (worst leaf kept). Positions
    that `mask` (the call's 2-D attention_mask) marks as padding are left out."""
    return compare_leaves(_leaves(exported_output), _leaves(eager_output), thresholds, mask)


def compare_leaves(got: dict, want: dict, thresholds: dict, mask=None) -> dict:
    """`compare_outputs` on the two outputs' leaves, `{dotted path: tensor or array}` (`get_leaf_tensors`' names,
    the eager ones in their order)."""
    got = {name: as_array(value) for name, value in got.items()}
    want = {name: as_array(value) for name, value in want.items()}
    mask = None if mask is None else as_array(mask)
    results: dict[str, dict] = {}
    for name, tensor in want.items():
        group = _group(name)
        tolerance = tolerance_of(thresholds, name)
        if name not in got:
            entry = {"shape": list(tensor.shape), "passed": False, "failures": ["missing from the exported outputs"]}
        elif tuple(got[name].shape) != tuple(tensor.shape):
            entry = compare_tensors(got[name], tensor, tolerance)
        else:
            entry = compare_tensors(_unpadded(got[name], name, mask), _unpadded(tensor, name, mask), tolerance,
                                    logits=name.split(".")[-1].endswith("logits"))
            entry["shape"] = list(tensor.shape)
        if group == name:
            results[name] = entry
            continue
        merged = results.setdefault(group, {"leaves": 0, "max_abs": 0.0, "max_rel": 0.0, "cosine": 1.0,
                                            "passed": True, "failures": []})
        merged["leaves"] += 1
        # A leaf without a metric (missing, wrong shape, non-finite) makes the group's metric null.
        for key in ("max_abs", "max_rel"):
            value, current = entry.get(key), merged[key]
            if current is not None and (value is None or value >= current):
                merged[key] = value
                if key == "max_abs":
                    merged["worst_leaf"] = name
        cosine = entry.get("cosine")
        merged["cosine"] = None if cosine is None or merged["cosine"] is None else min(merged["cosine"], cosine)
        if not entry["passed"]:
            merged["passed"] = False
            merged["failures"] = (merged["failures"] + [f"{name}: {failure}" for failure in entry["failures"]])[:4]
    return results
