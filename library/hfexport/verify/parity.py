"""Comparing one exported output with the eager one, leaf by leaf: max abs/rel difference, cosine, top-1 agreement."""

from __future__ import annotations

from typing import Any

from hfexport.verify.thresholds import tolerance_of

CACHE_OUTPUTS = ("past_key_values", "present_key_values", "cache_params")


# ── Comparing outputs ────────────────────────────────────────────────────────


def compare_tensors(exported, eager, tolerance: dict, logits: bool = False) -> dict:
    """Metrics of one output leaf and whether it meets `tolerance`; `failures` names each metric that did not."""
    import torch

    result: dict[str, Any] = {"shape": list(eager.shape)}
    failures: list[str] = []
    if tuple(exported.shape) != tuple(eager.shape):
        result.update(exported_shape=list(exported.shape), passed=False,
                      failures=[f"shape {list(exported.shape)} != eager {list(eager.shape)}"])
        return result
    got, want = exported.detach().float(), eager.detach().float()
    both_nan = torch.isnan(got) & torch.isnan(want)
    bad_nan = (torch.isnan(got) | torch.isnan(want)) & ~both_nan
    if bool(bad_nan.any()):
        failures.append(f"nan: {int(bad_nan.sum())} elements are NaN on one side only")
    got, want = torch.where(both_nan, 0.0, got), torch.where(both_nan, 0.0, want)
    diff = (got - want).abs()
    if got.numel() == 0:
        max_abs = max_rel = 0.0
        cosine = 1.0
    else:
        max_abs = float(torch.nan_to_num(diff, nan=float("inf")).max())
        scale = float(want.abs().max())
        significant = want.abs() >= 1e-3 * scale if scale > 0 else torch.zeros_like(want, dtype=torch.bool)
        max_rel = float((diff[significant] / want.abs()[significant]).max()) if bool(significant.any()) else 0.0
        norms = float(torch.linalg.vector_norm(got, dtype=torch.float64)) * float(
            torch.linalg.vector_norm(want, dtype=torch.float64))
        dot = float((got.double() * want.double()).sum()) if got.numel() < (1 << 24) else float(
            sum(float((a.double() * b.double()).sum()) for a, b in zip(got.flatten().split(1 << 22),
                                                                       want.flatten().split(1 << 22))))
        cosine = 1.0 if norms == 0 and max_abs == 0 else (dot / norms if norms else 0.0)
    result.update(max_abs=_finite(max_abs), max_rel=_finite(max_rel), cosine=_finite(cosine))
    if result["max_abs"] is None or result["cosine"] is None:
        failures.append("non-finite: the difference is inf or NaN")
    atol, rtol = tolerance.get("atol"), tolerance.get("rtol")
    if atol is not None or rtol is not None:
        allowed = (atol or 0.0) + (rtol or 0.0) * want.abs()
        outside = diff > allowed
        if bool(outside.any()):
            result["mismatched"] = float(outside.float().mean())
            failures.append(f"max_abs {max_abs:.3g} exceeds atol {atol if atol is not None else 0:g} + rtol "
                            f"{rtol if rtol is not None else 0:g}·|eager| on {result['mismatched']:.2%} of elements")
    if tolerance.get("min_cosine") is not None and result["cosine"] is not None and cosine < tolerance["min_cosine"]:
        failures.append(f"cosine {cosine:.6f} < min_cosine {tolerance['min_cosine']}")
    if logits and want.dim() >= 1 and want.shape[-1] >= 2 and want.numel():
        top1 = float((got.argmax(-1) == want.argmax(-1)).float().mean())
        result["top1"] = top1
        if tolerance.get("min_top1") is not None and top1 < tolerance["min_top1"]:
            failures.append(f"top1 {top1:.4f} < min_top1 {tolerance['min_top1']}")
    result["passed"] = not failures
    result["failures"] = failures
    return result


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
    if mask is None or tensor.dim() < 2 or tensor.shape[0] != mask.shape[0] or bool(mask.all()):
        return tensor
    axis = tensor.dim() - 2 if _group(name) != name else 1
    if axis < 1 or tensor.shape[axis] != mask.shape[1]:
        return tensor
    return tensor.movedim(axis, 1)[mask.bool()]


def compare_outputs(exported_output, eager_output, thresholds: dict, mask=None) -> dict:
    """`{output: metrics}` for every leaf of the eager output; cache leaves grouped (worst leaf kept). Positions
    that `mask` (the call's 2-D attention_mask) marks as padding are left out."""
    got, want = _leaves(exported_output), _leaves(eager_output)
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
