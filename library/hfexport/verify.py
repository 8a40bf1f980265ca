"""Parity verification: does the artifact on disk compute what the model computes? A gate, not a warning.

The target folder is reloaded from disk (`ExportedModel.from_pretrained`) and run next to the eager model (eval
mode, no grad) on the same probe inputs. Probes cover the declared dynamic ranges: for every dynamic dim its min,
an odd value inside (37 when it fits) and its max, or the values the recipe lists in `parity.probe`; the i-th
probe takes every dim's i-th value, so batch is > 1 on the last probe whenever batch is dynamic. Where the axes are
"auto" (torch.export decides), batch 1 and 8 and two sequence lengths are probed: that is how a batch silently
pinned to the sample's 1 is caught. A probe costs at most `parity.max_probe_elements` input elements (default
`DEFAULT_MAX_PROBE_ELEMENTS`); larger dims are halved until it fits and the report says so.

Every output leaf (named as the model's output fields; cache leaves grouped as `past_key_values`) gets max abs
diff, max rel diff, cosine similarity and, for logits, top-1 agreement, checked against thresholds: the recipe's
`parity` (global, then per output) over defaults per format and dtype (`default_tolerance`, docs/parity.md).
A probe the artifact rejects is a failure carrying the backend's message. Generation targets also decode greedily
over the exported graphs (`hfexport.generate.generate`) and must agree token for token with `model.generate`.
"""

from __future__ import annotations

import copy
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from .errors import redact
from .models import sequence_limit
from .recipe import parse_axis

DEFAULT_MAX_PROBE_ELEMENTS = 1 << 16
DEFAULT_MAX_NEW_TOKENS = 8
AUTO_VALUES = {"batch": [1, 8], "seq": [5, 37]}
INSIDE_VALUE = 37
CACHE_OUTPUTS = ("past_key_values", "present_key_values", "cache_params")
_MESSAGE_CHARS = 600

# Defaults per format and precision; the recipe's `parity` overrides them (globally, then per output).
# None: that check does not apply (quantized artifacts are judged on direction and top-1, not on elements).
_FP32 = {"dynamo": (1e-5, 1e-4, 0.99999, 0.99), "onnx": (1e-4, 1e-3, 0.9999, 0.99),
         "openvino": (1e-4, 1e-3, 0.9999, 0.99), "executorch": (1e-4, 1e-3, 0.9999, 0.99)}
_HALF = (1e-2, 1e-2, 0.999, 0.95)
_FP16_WEIGHTS = (5e-3, 1e-2, 0.9995, 0.98)
# A float32 graph run at a reduced *runtime* precision (OpenVINO's CPU plugin: bf16 by default on CPUs with
# AVX512-BF16/AMX). Element-wise bounds do not hold there: bf16 rounding compounds over a real decoder's layers
# (SmolLM2-135M logits: max_abs 1.4 at bf16, top-1 still 1.0), so outputs are judged by direction and decisions, as
# quantized ones are. The graph itself is checked at f32 against the strict rows. Figures: docs/parity.md.
_RUNTIME = {"bf16": (None, None, 0.998, 0.95), "f16": (None, None, 0.9995, 0.95)}
# Greedy decoding at a reduced runtime precision: near-tied logits flip a pick and the rest of that row then
# diverges (SmolLM2-135M at bf16: 0.69 over 3 chat prompts x 16 tokens), so token agreement has a floor; a broken
# graph diverges from the first tokens.
RUNTIME_MIN_TOKEN_AGREEMENT = {"bf16": 0.5, "f16": 0.75}
_TOLERANCE_KEYS = ("atol", "rtol", "min_cosine", "min_top1")
# Shape probes of a quantized target prove it runs at every declared size: shapes and finiteness only.
SHAPE_ONLY = {"default": {}, "outputs": {}, "basis": "shape probe: shapes and finite values only"}


def default_tolerance(export_format: str, dtype: str = "float32", quantized: bool = False,
                      options: dict | None = None, precision: str = "f32") -> dict:
    """The thresholds an artifact meets unless its recipe says otherwise (the table in docs/parity.md).

    `precision` is the precision the runtime computes at (read back from it): a float32 graph that OpenVINO runs
    in bf16 is judged by the bf16 row, not by float32's."""
    if quantized:
        values = (None, None, 0.98, 0.9)  # 8-bit; per method and bit width: hfexport.quantization.default_parity
    elif precision in _RUNTIME:
        values = _RUNTIME[precision]
    elif dtype in ("float16", "bfloat16"):
        values = _HALF
    elif export_format == "openvino" and (options or {}).get("compress_to_fp16"):
        values = _FP16_WEIGHTS
    else:
        values = _FP32.get(str(export_format), _FP32["onnx"])
    return dict(zip(_TOLERANCE_KEYS, values))


def thresholds_for(target, dtype: str = "float32", precision: str = "f32") -> dict:
    """`{"default": {...}, "outputs": {name: {...}}, "basis": "..."}`: the defaults with the recipe's overrides.

    At a reduced runtime precision the recipe's float thresholds (`atol`, `rtol`, `min_cosine`, `min_top1`, made
    for the float32 graph) do not apply; the recipe pins `runtime.precision` to be judged (and run) at float32."""
    parity = target.parity or {}
    default = default_tolerance(target.export_format, dtype, bool(target.quantization), target.options, precision)
    reduced = precision in _RUNTIME and not target.quantization
    if target.quantization:  # per method and bit width (hfexport.quantization.default_parity)
        from .quantization import default_parity

        quantized = default_parity(target.quantization["method"], target.mode, target.quantization.get("params"))
        default.update({key: quantized[key] for key in _TOLERANCE_KEYS})
    overridden = [] if reduced else [key for key in _TOLERANCE_KEYS if key in parity]
    default.update({key: parity[key] for key in overridden})
    outputs = {} if reduced else {name: {**default, **values} for name, values in (parity.get("outputs") or {}).items()}
    what = "quantized" if target.quantization else (f"{dtype} graph at {precision} runtime precision" if reduced
                                                    else dtype)
    basis = f"defaults for {target.export_format} {what}"
    if overridden or outputs:
        basis += " with the recipe's parity"
    return {"default": default, "outputs": outputs, "basis": basis}


def _tolerance_of(thresholds: dict, output: str) -> dict:
    outputs = thresholds["outputs"]
    return outputs.get(output) or outputs.get(output.split(".")[0]) or thresholds["default"]


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
        tolerance = _tolerance_of(thresholds, name)
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


# ── Probes ───────────────────────────────────────────────────────────────────


@dataclass(frozen=True)
class AxisRef:
    """Axis `axis` of input `input` has size `scale * dim + offset`."""

    input: str
    axis: int
    dim: str
    scale: int = 1
    offset: int = 0

    def size(self, value: int) -> int:
        return self.scale * value + self.offset


def _tensors(inputs: dict) -> dict:
    import torch

    return {name: value for name, value in inputs.items() if isinstance(value, torch.Tensor)}


def _is_dynamic(plan) -> bool:
    return any(getattr(component.config, "dynamic", False) for component in plan.components.values())


def probe_axes(plan) -> tuple[list[AxisRef], bool]:
    """Which axes of the sample inputs vary with which dim, and whether they are "auto" (no named dims)."""
    tensors = _tensors(plan.inputs)
    shapes = plan.target.dynamic_shapes
    if shapes is None:
        return (_auto_axes(tensors) if _is_dynamic(plan) else []), True
    refs: list[AxisRef] = []
    for name, spec in shapes.items():
        if name not in tensors or not isinstance(spec, dict) or "*" in spec:
            continue
        for key, axis_spec in spec.items():
            kind, value = parse_axis(axis_spec)
            if kind == "dim":
                refs.append(AxisRef(name, int(key), *value))
            elif kind == "keyword" and value != "static":
                refs.append(AxisRef(name, int(key), "batch" if int(key) == 0 else "seq"))
    listed = {ref.input for ref in refs}
    for name, tensor in tensors.items():
        if name in shapes:
            continue
        # An unlisted input shaped like a listed one follows it (attention_mask after input_ids), as in the plan.
        source = next((other for other in listed if tensors[other].shape == tensor.shape), None)
        if source:
            refs += [AxisRef(name, ref.axis, ref.dim, ref.scale, ref.offset) for ref in refs if ref.input == source]
    return refs, False


def _auto_axes(tensors: dict) -> list[AxisRef]:
    """Axis 0 of every input with the sample's batch is `batch`; axis 1 of token-shaped inputs is `seq`."""
    if not tensors:
        return []
    first = tensors.get("input_ids", next(iter(tensors.values())))
    if first.dim() == 0:
        return []
    batch = first.shape[0]
    refs = [AxisRef(name, 0, "batch") for name, tensor in tensors.items() if tensor.dim() >= 1 and tensor.shape[0] == batch]
    tokens = tensors.get("input_ids")
    if tokens is not None and tokens.dim() >= 2:
        refs += [AxisRef(name, 1, "seq") for name, tensor in tensors.items()
                 if tensor.dim() >= 2 and tuple(tensor.shape[:2]) == tuple(tokens.shape[:2])]
    return refs


def _inside(low: int, high: int) -> int | None:
    """An odd value strictly between low and high: 37 when it fits, else the odd one nearest the middle."""
    if low < INSIDE_VALUE < high:
        return INSIDE_VALUE
    middle = (low + high) // 2
    for candidate in (middle | 1, (middle | 1) - 2):
        if low < candidate < high:
            return candidate
    return None


def dim_values(plan, refs: list[AxisRef], auto: bool, config=None, reserve: int = 0) -> dict[str, list[int]]:
    """The values each dynamic dim is probed at: the recipe's `parity.probe`, else [min, inside, max]."""
    tensors = _tensors(plan.inputs)
    listed = plan.target.parity.get("probe", {}) or {}
    limit = sequence_limit(config) if config is not None else None
    max_cache_len = (plan.target.generation or {}).get("max_cache_len")
    values: dict[str, list[int]] = {}
    for dim in dict.fromkeys(ref.dim for ref in refs):
        mine = [ref for ref in refs if ref.dim == dim]
        first = mine[0]
        sample = (int(tensors[first.input].shape[first.axis]) - first.offset) // first.scale
        sequence_like = any(ref.axis >= 1 and not tensors[ref.input].is_floating_point() for ref in mine)
        if dim in listed:
            candidates = [int(value) for value in listed[dim]]
        elif auto:
            candidates = list(AUTO_VALUES.get(dim, [sample]))
        else:
            bounds = plan.recipe.dims.get(dim, {})
            low = max(bounds.get("min", 1), 1)
            high = bounds.get("max", max(low, 2 * sample))
            candidates = [low, _inside(low, high), high]
        ceiling = None
        if sequence_like:
            for cap in (limit, max_cache_len):
                if cap:
                    ceiling = min(ceiling or cap, cap - reserve)
        clamped = []
        for value in candidates:
            if value is None:
                continue
            if ceiling is not None:
                value = min(value, max(1, ceiling))
            value = max(value, 1)
            if all(ref.size(value) >= 1 for ref in mine) and value not in clamped:
                clamped.append(value)
        values[dim] = sorted(clamped) or [sample]
    return values


def probe_shape(tensor_shape, name: str, refs: list[AxisRef], assignment: dict) -> list[int]:
    shape = list(tensor_shape)
    for ref in refs:
        if ref.input == name and ref.dim in assignment:
            shape[ref.axis] = ref.size(assignment[ref.dim])
    return shape


def _elements(inputs: dict, refs: list[AxisRef], assignment: dict) -> int:
    import math

    return sum(math.prod(probe_shape(tensor.shape, name, refs, assignment)) for name, tensor in _tensors(inputs).items())


def plan_probes(plan, config=None, reserve: int = 0) -> tuple[list[dict], dict]:
    """The probes (`{"dims": {...}, "capped": {...}}`) and the cost bound that shaped them."""
    refs, auto = probe_axes(plan)
    parity = plan.target.parity or {}
    bound = int(parity.get("max_probe_elements", DEFAULT_MAX_PROBE_ELEMENTS))
    sample_cost = _elements(plan.inputs, [], {})
    limit = max(bound, sample_cost)
    cost_bound = {"max_probe_elements": bound, "counted": "input elements per probe", "effective": limit}
    if not refs:
        return [{"dims": {}, "capped": {}}], cost_bound
    values = dim_values(plan, refs, auto, config, reserve)
    lows = {dim: min(options) for dim, options in values.items()}
    count = max(len(options) for options in values.values())
    probes, seen = [], set()
    for index in range(count):
        assignment = {dim: options[min(index, len(options) - 1)] for dim, options in values.items()}
        capped = {}
        while _elements(plan.inputs, refs, assignment) > limit:
            # Halve the dim furthest above its smallest probe value (sequence before batch on a tie).
            reducible = [dim for dim in assignment if assignment[dim] > lows[dim]]
            if not reducible:
                break
            dim = max(reducible, key=lambda d: (assignment[d] / max(lows[d], 1), d != "batch"))
            capped.setdefault(dim, assignment[dim])
            assignment[dim] = max(lows[dim], assignment[dim] // 2)
        key = tuple(sorted(assignment.items()))
        if key in seen:
            continue
        seen.add(key)
        probes.append({"dims": assignment, "capped": {dim: {"requested": requested, "probed": assignment[dim]}
                                                      for dim, requested in capped.items()}})
    cost_bound["auto_axes"] = auto
    return probes, cost_bound


def _is_mask(name: str) -> bool:
    return name.endswith("attention_mask")


def resize_inputs(inputs: dict, refs: list[AxisRef], assignment: dict) -> dict:
    """The sample inputs at the probe's sizes: rows and columns tiled cyclically or cropped (deterministic);
    grown attention-mask columns are 1 and a mask row never ends up all zeros."""
    import torch

    result = dict(inputs)
    mask = _mask_of(inputs)
    # Left-padded prompts (decoders) are cropped from the left, so a short probe keeps real tokens.
    left_padded = mask is not None and mask.numel() > 0 and bool((mask[:, -1] == 1).all()) and not bool(
        (mask[:, 0] == 1).all())
    for name, tensor in _tensors(inputs).items():
        value = tensor
        for axis, size in enumerate(probe_shape(tensor.shape, name, refs, assignment)):
            current = value.shape[axis]
            if size == current:
                continue
            if size < current:
                start = current - size if left_padded and axis > 0 else 0
                value = value.narrow(axis, start, size)
                continue
            index = torch.arange(size, device=value.device) % current
            value = value.index_select(axis, index)
            if _is_mask(name) and axis > 0:
                value.narrow(axis, current, size - current).fill_(1)
        if _is_mask(name) and value.dim() == 2 and value.numel():
            empty = value.sum(-1) == 0
            if bool(empty.any()):
                value = value.clone()
                value[empty] = 1
        result[name] = value.contiguous()
    return result


def _shapes(inputs: dict) -> dict:
    return {name: list(tensor.shape) for name, tensor in _tensors(inputs).items()}


def _label(dims: dict) -> str:
    return " ".join(f"{dim}={value}" for dim, value in dims.items()) or "sample"


def _backend_message(error: BaseException) -> str:
    """The backend's own words: the error's first lines, following the cause chain, without tokens."""
    import traceback

    parts, current = [], error
    while current is not None and len(parts) < 3:
        text = " ".join(line.strip() for line in str(current).strip().splitlines()[:4] if line.strip())
        if not text and current.__traceback__ is not None:
            frame = traceback.extract_tb(current.__traceback__)[-1]
            text = f"(no message) at {Path(frame.filename).name}:{frame.lineno} in {frame.name}"
        parts.append(f"{type(current).__name__}: {text}".strip())
        current = current.__cause__ or current.__context__
    return redact(" <- ".join(parts))[:_MESSAGE_CHARS]


# ── Running a target ─────────────────────────────────────────────────────────


def _traced(runner, inputs: dict) -> dict:
    """Only the kwargs the graph was traced with, as `ExportedModel.__call__` does for a single graph."""
    traced = runner.metadata.kwargs
    return {key: value for key, value in inputs.items() if key in traced}


def _run_forward_probe(exported, model, inputs: dict, thresholds: dict) -> dict:
    import torch

    with torch.no_grad():
        eager = model(**copy.deepcopy(inputs))
    try:
        got = exported(**inputs)
    except Exception as error:  # noqa: BLE001 - the backend rejecting a probe is a parity failure, not a crash
        return {"error": _backend_message(error), "outputs": {}}
    return {"outputs": compare_outputs(got, eager, thresholds, _mask_of(inputs))}


def _run_generation_probe(exported, model, plan, inputs: dict, thresholds: dict) -> list[dict]:
    """Decompose `generate` on the probe prompt (as the export did), then run every exported component on the
    kwargs its eager twin received."""
    import torch
    from transformers.exporters.utils import decompose_for_generation

    with torch.no_grad():
        stages = decompose_for_generation(model, copy.deepcopy(inputs), generation_config=plan.generation_config,
                                          multi_token_decode=plan.multi_token_decode)
    results = []
    for name, (submodel, subinputs) in stages.items():
        if name not in exported.components:
            continue
        runner = exported.runners[name]
        subinputs = _with_full_mask(runner, subinputs)
        entry = {"component": name, "shapes": _shapes(subinputs)}
        if _is_stateful(runner):
            entry.update(skipped="its cache lives in the OpenVINO infer request: checked by greedy generation",
                         outputs={})
            results.append(entry)
            continue
        with torch.no_grad():
            eager = submodel(**copy.deepcopy(subinputs))
        try:
            got = runner(**_traced(runner, copy.deepcopy(subinputs)))
        except Exception as error:  # noqa: BLE001 - recorded with the backend's message
            entry.update(error=_backend_message(error), outputs={})
            results.append(entry)
            continue
        entry["outputs"] = compare_outputs(got, eager, thresholds, _mask_of(subinputs))
        results.append(entry)
    return results


def _with_full_mask(runner, inputs: dict) -> dict:
    """`generate` leaves out an attention_mask of all ones (an unpadded batch of 1); a graph traced with one still
    takes it. Both sides then get the explicit all-ones mask over cache + new tokens (the same computation)."""
    import torch

    ids = inputs.get("input_ids")
    if "attention_mask" not in runner.metadata.kwargs or inputs.get("attention_mask") is not None or ids is None:
        return inputs
    if runner.metadata.kwargs["attention_mask"].get("rank", 2) != 2:
        return inputs  # a 4-D (static cache) mask is built by generate, never left out
    cache = inputs.get("past_key_values")
    past = int(cache.get_seq_length()) if cache is not None and hasattr(cache, "get_seq_length") else 0
    return {**inputs, "attention_mask": torch.ones(ids.shape[0], past + ids.shape[1], dtype=torch.long)}


def _mask_of(inputs: dict):
    mask = inputs.get("attention_mask")
    return mask if mask is not None and getattr(mask, "dim", lambda: 0)() == 2 else None


def _is_stateful(runner) -> bool:
    """An OpenVINO request holding state (a decode whose cache became internal variables): it cannot be fed a
    captured cache, so `hfexport.generate` (which seeds that state) checks it."""
    request = getattr(runner, "request", None)
    return request is not None and hasattr(request, "query_state") and bool(list(request.query_state()))


def _finish(probe: dict) -> dict:
    if probe.get("skipped"):
        probe["passed"] = True
        return probe
    probe["passed"] = not probe.get("error") and bool(probe.get("outputs")) and all(
        entry["passed"] for entry in probe["outputs"].values())
    return probe


def check_generation(exported, model, plan, processor=None, max_new_tokens: int = DEFAULT_MAX_NEW_TOKENS,
                     min_token_agreement: float = 1.0) -> dict:
    """Greedy decoding over the exported graphs vs `model.generate(do_sample=False)` on the sample prompts."""
    import torch

    inputs = plan.inputs
    result: dict[str, Any] = {"max_new_tokens": max_new_tokens, "min_token_agreement": min_token_agreement}
    input_ids = inputs.get("input_ids")
    if input_ids is None:
        result.update(passed=False, error="the sample inputs have no input_ids to generate from")
        return result
    attention_mask = inputs.get("attention_mask")
    generation_config = copy.deepcopy(plan.generation_config or model.generation_config)
    generation_config.do_sample, generation_config.num_beams = False, 1
    generation_config.max_new_tokens, generation_config.min_new_tokens = max_new_tokens, None
    eos = generation_config.eos_token_id
    result["prompts"] = int(input_ids.shape[0])
    result["eos_token_id"] = eos
    extra = {key: value for key, value in inputs.items() if key not in ("input_ids", "attention_mask")}
    with torch.no_grad():
        eager = model.generate(input_ids=input_ids, attention_mask=attention_mask, generation_config=generation_config,
                               **extra)
    try:
        from .generate import generate
    except ImportError as error:
        result.update(passed=False, error=f"greedy decoding over exported graphs is unavailable: {error}")
        return result
    try:
        got = generate(exported, input_ids, attention_mask=attention_mask, generation_config=generation_config)
    except Exception as error:  # noqa: BLE001 - the exported graphs failing to decode is a parity failure
        result.update(passed=False, error=_backend_message(error))
        return result
    prompt = input_ids.shape[1]
    eager_new, got_new = _new_tokens(eager, input_ids), _new_tokens(got, input_ids)
    eos_ids = set(eos if isinstance(eos, list) else [eos] if eos is not None else [])
    matched = total = 0
    first = None
    for row in range(input_ids.shape[0]):
        want, have = _until_eos(eager_new[row], eos_ids), _until_eos(got_new[row], eos_ids)
        agree = 0
        while agree < min(len(want), len(have)) and want[agree] == have[agree]:
            agree += 1
        matched += agree
        total += max(len(want), len(have))
        if first is None and (agree < len(want) or agree < len(have)):
            first = {"prompt": row, "position": agree,
                     "eager_token": want[agree] if agree < len(want) else None,
                     "exported_token": have[agree] if agree < len(have) else None}
            tokenizer = getattr(processor, "tokenizer", processor)
            if tokenizer is not None and hasattr(tokenizer, "decode"):
                for side in ("eager", "exported"):
                    token = first[f"{side}_token"]
                    first[f"{side}_text"] = None if token is None else tokenizer.decode([token])
    agreement = matched / total if total else 1.0
    result.update(prompt_length=int(prompt), token_agreement=agreement, first_divergence=first,
                  passed=agreement >= min_token_agreement)
    return result


def _new_tokens(sequences, prompt) -> list[list[int]]:
    """The generated tokens of each row (the prompt stripped when the sequences start with it)."""
    import torch

    sequences = torch.as_tensor(sequences)
    length = prompt.shape[1]
    if sequences.shape[1] >= length and torch.equal(sequences[:, :length].to(prompt.device), prompt):
        sequences = sequences[:, length:]
    return [[int(token) for token in row] for row in sequences]


def _until_eos(tokens: list[int], eos_ids: set) -> list[int]:
    for index, token in enumerate(tokens):
        if token in eos_ids:
            return tokens[: index + 1]
    return tokens


def _load(folder: Path, export_format: str, precision: str | None):
    """The artifact reloaded from disk as a user gets it (`hfexport.load`), at `precision` where the format has a
    runtime precision. OpenVINO is compiled for the CPU explicitly, so the precision it picked can be read back
    (AUTO does not expose it)."""
    from .exported import ExportedModel

    options = {"device": "cpu"} if export_format == "openvino" else {}
    return ExportedModel.from_pretrained(Path(folder), precision=precision or "auto", **options)


def _run_checks(exported, model, plan, processor, probes: list[dict], refs, thresholds: dict, *,
                representative: dict | None, generate_settings: dict, min_token_agreement: float) -> dict:
    """Every probe (and, for generation targets, greedy decoding) of one loaded artifact against the eager model.

    `representative`, for quantized targets, is the quality probe on real inputs judged by `thresholds`; the shape
    probes are then judged by shapes and finite values only (`SHAPE_ONLY`)."""
    generation = plan.target.mode == "generation"
    shape_thresholds = SHAPE_ONLY if representative is not None else thresholds
    runs = [(probe, shape_thresholds, "shape" if representative is not None else None) for probe in probes]
    if representative is not None:
        runs.append((representative, thresholds, "quality"))
    results: list[dict] = []
    for probe, probe_thresholds, role in runs:
        probe_started = time.perf_counter()
        inputs = probe.get("inputs") or resize_inputs(plan.inputs, refs, probe["dims"])
        base = {"name": probe.get("name") or _label(probe["dims"]), "dims": probe["dims"],
                **({"capped": probe["capped"]} if probe.get("capped") else {}), **({"role": role} if role else {})}
        if generation:
            try:
                entries = _run_generation_probe(exported, model, plan, inputs, probe_thresholds)
            except Exception as error:  # noqa: BLE001 - the eager side could not build this probe
                entries = [{"component": None, "error": f"could not capture the probe's stage inputs: "
                                                        f"{_backend_message(error)}", "outputs": {}}]
            seconds = (time.perf_counter() - probe_started) / max(len(entries), 1)
            for entry in entries:
                results.append(_finish({**base, **entry, "seconds": round(seconds, 4)}))
        else:
            entry = _run_forward_probe(exported, model, inputs, probe_thresholds)
            results.append(_finish({**base, "component": "model", "shapes": _shapes(inputs), **entry,
                                    "seconds": round(time.perf_counter() - probe_started, 4)}))
    generation_result = None
    if generation:
        generation_result = check_generation(
            exported, model, plan, processor,
            max_new_tokens=int(generate_settings.get("max_new_tokens", DEFAULT_MAX_NEW_TOKENS)),
            min_token_agreement=min_token_agreement,
        )
    failures = [_failure_line(probe) for probe in results if not probe["passed"]]
    if generation_result is not None and not generation_result["passed"]:
        failures.append(_generation_failure_line(generation_result))
    return {"passed": not failures, "thresholds": thresholds, "probes": results, "generation": generation_result,
            "failures": failures}


def representative_probe(plan, processor=None) -> dict:
    """The quality probe of a quantized target: the recipe's own sample inputs at their own size (its sample texts
    through the tokenizer when it gives texts), not random tokens: quantization error depends on the activations'
    range, which random tokens do not have (docs/quantization.md)."""
    texts = (plan.recipe.sample_inputs or {}).get("text") or []
    tokenizer = getattr(processor, "tokenizer", processor)
    real_text = bool(texts) and tokenizer is not None and callable(tokenizer)
    source = (f"the recipe's {len(texts)} sample text(s), tokenized" if real_text
              else "the recipe's sample inputs (not real text: no texts or no tokenizer)")
    return {"name": "representative", "dims": {}, "inputs": plan.inputs, "source": source, "real_text": real_text}


def verify_exported(folder: str | Path, model, plan, processor=None) -> dict:
    """Reload `folder` from disk and check it against `model` on probes of `plan`; the report's verification dict.

    Where the format has a runtime precision (OpenVINO), the graph is checked at float32 against the strict
    thresholds, and then at the precision a user of `hfexport.load` gets on this machine (the recipe's
    `runtime.precision`, else the device default, read back from the compiled model) against thresholds for that
    precision; the target passes when both do. `verification["runtime"]` names the CPU, backend, device and
    precision of each check."""
    import torch

    from .runtime import cpu_info, has_runtime_precision, pinned_precision, read_back

    started = time.perf_counter()
    target = plan.target
    parity = target.parity or {}
    if parity.get("skip"):
        return {"passed": True, "skipped": True, "reason": "parity.skip is set in the recipe", "probes": [],
                "failures": [], "seconds": 0.0}
    export_format = str(target.export_format)
    pinned = pinned_precision(target.runtime)
    has_precision = has_runtime_precision(export_format)
    try:
        exported = _load(Path(folder), export_format, "f32" if has_precision else pinned)
    except Exception as error:  # noqa: BLE001 - an artifact that does not load back fails verification
        message = f"the artifact does not load back from {Path(folder).name}: {_backend_message(error)}"
        return {"passed": False, "reloaded_from_disk": True, "error": message, "probes": [], "failures": [message],
                "seconds": round(time.perf_counter() - started, 4)}
    reload_s = time.perf_counter() - started
    dtype = next(iter(exported.components.values())).metadata.export_dtype or "float32"
    generation = target.mode == "generation"
    generate_settings = parity.get("generate", {}) or {}
    if target.quantization:  # token agreement over N tokens with a minimum fraction, unless the recipe says more
        from .quantization import default_parity

        generate_settings = {**default_parity(target.quantization["method"], target.mode,
                                              target.quantization.get("params")).get("generate", {}),
                             **generate_settings}
    min_agreement = float(generate_settings.get("min_token_agreement", 1.0))
    probes, cost_bound = plan_probes(plan, model.config, reserve=4 if generation else 0)
    refs, _ = probe_axes(plan)
    representative = representative_probe(plan, processor) if target.quantization else None
    was_training = model.training
    model.eval()
    runtime: dict[str, Any] = {"cpu": cpu_info(), "checks": []}
    try:
        graph_read = read_back(exported)
        graph_precision = graph_read["precision"] if has_precision else "f32"
        graph = _run_checks(exported, model, plan, processor, probes, refs,
                            thresholds_for(target, dtype, graph_precision),
                            representative=representative, generate_settings=generate_settings,
                            min_token_agreement=min_agreement)
        runtime["backend"] = graph_read["backend"]
        runtime["checks"].append({"name": "graph" if has_precision else "runtime", "requested": "f32" if
                                  has_precision else pinned, "precision": graph_read["precision"] or "unknown",
                                  "components": graph_read["components"], "passed": graph["passed"]})
        del exported
        runtime_check = None
        if has_precision:
            check, runtime_check = _runtime_precision_check(
                folder, model, plan, processor, probes, refs, dtype, pinned, representative, generate_settings,
                min_agreement)
            runtime["checks"].append(check)
        user = runtime["checks"][-1]
        runtime.update(precision=user["precision"], requested=pinned, device=_device_of(user.get("components") or {}))
    finally:
        model.train(was_training)
    failures = list(graph["failures"])
    if runtime_check is not None:
        precision = runtime["precision"]
        failures += [f"at {precision} ({_why(pinned)}): {line}" for line in runtime_check["failures"]]
    result = {
        "passed": not failures,
        "reloaded_from_disk": True,
        "export_dtype": dtype,
        "thresholds": graph["thresholds"],
        "cost_bound": cost_bound,
        "probes": graph["probes"],
        "generation": graph["generation"],
        "runtime": runtime,
        "failures": failures,
        "reload_s": round(reload_s, 4),
        "seconds": round(time.perf_counter() - started, 4),
        "torch_threads": torch.get_num_threads(),
    }
    if representative is not None:
        result["representative"] = {"source": representative["source"], "real_text": representative["real_text"]}
    if runtime_check is not None:
        result["runtime_check"] = runtime_check
    return result


def _why(pinned: str) -> str:
    return "the recipe's runtime.precision" if pinned != "auto" else "the device's default precision on this CPU"


def _device_of(components: dict) -> str:
    devices = sorted({str(entry.get("device")) for entry in components.values() if entry.get("device")})
    return ",".join(devices) or "cpu"


def _runtime_precision_check(folder, model, plan, processor, probes, refs, dtype: str, pinned: str, representative,
                             generate_settings: dict, min_agreement: float) -> tuple[dict, dict | None]:
    """The artifact at the precision `hfexport.load` gives on this machine, judged by that precision's thresholds:
    (the check's entry in `runtime.checks`, the report's `runtime_check`). Identical to the graph check (and not run
    again, `runtime_check` None) where the runtime computes at f32 anyway."""
    from .runtime import read_back

    target = plan.target
    exported = _load(Path(folder), str(target.export_format), pinned)
    try:
        read = read_back(exported)
        precision = read["precision"] or "unknown"
        check = {"name": "runtime", "requested": pinned, "precision": precision, "components": read["components"]}
        if precision == "f32":
            check.update(passed=True, same_as="graph")
            return check, None
        agreement = min(min_agreement, float(RUNTIME_MIN_TOKEN_AGREEMENT.get(precision, min_agreement)))
        result = _run_checks(exported, model, plan, processor, probes, refs, thresholds_for(target, dtype, precision),
                             representative=representative, generate_settings=generate_settings,
                             min_token_agreement=agreement)
    finally:
        del exported
    check["passed"] = result["passed"]
    return check, {"precision": precision, "requested": pinned, **result}


def _failure_line(probe: dict) -> str:
    where = f"probe {probe['name']}" + (f" [{probe['component']}]" if probe.get("component") not in (None, "model") else "")
    if probe.get("error"):
        return f"{where}: the artifact rejected the input: {probe['error']}"
    bad = [(name, entry) for name, entry in probe["outputs"].items() if not entry["passed"]]
    if not bad:
        return f"{where}: no outputs to compare"
    name, entry = bad[0]
    return f"{where}: {name}: {entry['failures'][0] if entry['failures'] else 'failed'}"


def _generation_failure_line(result: dict) -> str:
    if result.get("error"):
        return f"generation: {result['error']}"
    first = result.get("first_divergence") or {}
    return (f"generation: token agreement {result['token_agreement']:.3f} < {result['min_token_agreement']}; first "
            f"divergence at prompt {first.get('prompt')} position {first.get('position')}: eager "
            f"{first.get('eager_token')} vs exported {first.get('exported_token')}")


def summary(verification: dict | None) -> str:
    """One line: passed, skipped, or the first failure."""
    if not verification:
        return "not verified"
    if verification.get("skipped"):
        return "skipped (parity.skip)"
    if verification.get("passed"):
        count = len(verification.get("probes", []))
        return f"passed ({count} probe{'s' if count != 1 else ''})"
    failures = verification.get("failures") or [verification.get("error") or "failed"]
    more = f" (+{len(failures) - 1} more)" if len(failures) > 1 else ""
    return f"parity failed: {failures[0]}{more}"


# ── Re-verifying a saved target ──────────────────────────────────────────────


def reverify(folder: str | Path, model: str | Path, revision: str | None = None, token: str | None = None,
             trust_remote_code: bool = False):
    """Verify an existing `OUTPUT/<target>/` folder against `model` again: its standalone recipe
    (`export_config.json`, saved by the job) gives the target, sample inputs and thresholds. The target's
    `export_report.json` (and the job summary one folder up, when it lists the target) is rewritten atomically
    with the new verification. Returns `(JobReport, target name)`."""
    import datetime
    import json

    from .errors import SourceError, register_secret
    from .job import RECIPE_COPY_FILE, resolve_source
    from .models import load_model, load_processor
    from .plan import build_plan
    from .recipe import load_recipe
    from .report import REPORT_FILE, JobReport, TargetReport, file_entries, write_json_atomic

    register_secret(token)
    folder = Path(folder)
    if not (folder / "export.json").is_file():
        raise SourceError(f"{folder}: not an exported target folder (no export.json); pass OUTPUT/<target>")
    if not (folder / RECIPE_COPY_FILE).is_file():
        raise SourceError(f"{folder}: no {RECIPE_COPY_FILE}, the recipe target hfexport saves beside an export; "
                          "re-export it with `hfexport export`")
    # An export that cannot be loaded (tampered or corrupt) raises here, before the model loads: the command could not
    # run (exit 2); verification below then judges parity only.
    from .exported import ExportedModel
    from .safety import checked_file

    ExportedModel.from_pretrained(folder)
    recipe = load_recipe(checked_file(folder, RECIPE_COPY_FILE, source=str(folder)))
    name = recipe.default_target
    model_object = load_model(model, recipe, revision, token, trust_remote_code)
    processor = load_processor(model, revision, token)
    plan = build_plan(recipe, name, model_object, None, processor)
    started = time.perf_counter()
    verification = verify_exported(folder, model_object, plan, processor)
    seconds = time.perf_counter() - started
    verification["against"] = {"model": str(model), "revision": revision,
                               "verified_at": datetime.datetime.now(datetime.UTC).isoformat(timespec="seconds")}
    verification = json.loads(json.dumps(verification, default=str))

    report_file = folder / REPORT_FILE
    report = JobReport.read(report_file) if report_file.is_file() else None
    if report is None or name not in report.targets:
        target = recipe.target(name)
        source = {**resolve_source(model, revision, token), "recipe_source": str(folder / RECIPE_COPY_FILE),
                  "recipe_sha256": recipe.sha256}
        report = JobReport(source=source)
        report.targets[name] = TargetReport(
            target=name, export_format=target.export_format, mode=target.mode,
            recipe_target_sha256=recipe.target_hash(name),
            files=[entry for entry in file_entries(folder) if entry["path"] != REPORT_FILE],
        )
    target_report = report.targets[name]
    _apply(target_report, verification, seconds)
    write_json_atomic(report_file, report.to_json(only=name))
    summary_file = folder.parent / REPORT_FILE
    if summary_file.is_file():
        try:
            job = JobReport.read(summary_file)
        except Exception:  # noqa: BLE001 - a summary hfexport cannot read is left as it is
            job = None
        if job is not None and name in job.targets and job.targets[name].recipe_target_sha256 == recipe.target_hash(name):
            _apply(job.targets[name], verification, seconds)
            write_json_atomic(summary_file, job.to_json())
    return report, name


def _apply(target_report, verification: dict, seconds: float) -> None:
    target_report.verification = verification
    target_report.timings["verify_s"] = round(seconds, 4)
    if target_report.status in ("ok", "failed", "unchanged"):
        target_report.status = "ok" if verification["passed"] else "failed"
        target_report.error = None if verification["passed"] else summary(verification)
