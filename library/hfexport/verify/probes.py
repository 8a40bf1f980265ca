"""Probe inputs: for every dynamic dim its min, a value inside and its max (or the recipe's `parity.probe`), within
`parity.max_probe_elements`; representative inputs (the recipe's sample texts) for quantized targets.
"""

from __future__ import annotations

from dataclasses import dataclass

from hfexport.models import sequence_limit
from hfexport.plan.shapes import AUTO_PROBE_BATCH
from hfexport.preparers import repack_images
from hfexport.recipe.validation import parse_axis

DEFAULT_MAX_PROBE_ELEMENTS = 1 << 16
AUTO_VALUES = {"batch": [1, AUTO_PROBE_BATCH], "seq": [5, 37]}
INSIDE_VALUE = 37


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


def probe_tensors(inputs: dict) -> dict:
    import torch

    return {name: value for name, value in inputs.items() if isinstance(value, torch.Tensor)}


def _is_dynamic(plan) -> bool:
    return any(getattr(component.config, "dynamic", False) for component in plan.components.values())


def probe_axes(plan) -> tuple[list[AxisRef], bool]:
    """Which axes of the sample inputs vary with which dim, and whether they are "auto" (no named dims)."""
    tensors = probe_tensors(plan.inputs)
    shapes = plan.target.dynamic_shapes
    if shapes is None:
        refs = _auto_axes(tensors) if _is_dynamic(plan) else []
        if "image_encoder" in plan.components or "audio_encoder" in plan.components:
            # A vision-language prompt holds a fixed number of image tokens per image (an audio-language prompt: of
            # audio tokens per clip): a longer or shorter probe would repeat or cut them (the model then refuses
            # it), so only the batch varies (rows with their images or clips).
            refs = [ref for ref in refs if ref.dim != "seq"]
        return refs, True
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
    tensors = probe_tensors(plan.inputs)
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

    return sum(math.prod(probe_shape(tensor.shape, name, refs, assignment)) for name, tensor in probe_tensors(inputs).items())


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


def is_mask(name: str) -> bool:
    return name.endswith("attention_mask")


def resize_inputs(inputs: dict, refs: list[AxisRef], assignment: dict) -> dict:
    """The sample inputs at the probe's sizes: rows and columns tiled cyclically or cropped (deterministic);
    grown attention-mask columns are 1 and a mask row never ends up all zeros."""
    import torch

    result = dict(inputs)
    mask = mask_of(inputs)
    # Left-padded prompts (decoders) are cropped from the left, so a short probe keeps real tokens.
    left_padded = mask is not None and mask.numel() > 0 and bool((mask[:, -1] == 1).all()) and not bool(
        (mask[:, 0] == 1).all())
    for name, tensor in probe_tensors(inputs).items():
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
            if is_mask(name) and axis > 0:
                value.narrow(axis, current, size - current).fill_(1)
        if is_mask(name) and value.dim() == 2 and value.numel():
            empty = value.sum(-1) == 0
            if bool(empty.any()):
                value = value.clone()
                value[empty] = 1
        result[name] = value.contiguous()
    return repack_images(inputs, result)  # packed patches (Qwen2-VL-class) follow their image grid's rows


def keep_image_tokens(resized: dict, inputs: dict, image_token: int | None) -> dict:
    """A vision-language probe grown along the text: the cyclic tiling of `resize_inputs` repeats the image
    placeholders, which the model then refuses ("Image features and image tokens do not match"); the repeated
    ones become the row's last text token, so every row keeps its images' token count and the text grows."""
    ids, before = resized.get("input_ids"), inputs.get("input_ids")
    if image_token is None or ids is None or before is None or ids.shape[1] <= before.shape[1]:
        return resized
    ids = ids.clone()
    # Qwen2-VL-class processors also mark each token's modality (`mm_token_type_ids`: 1 at image tokens), from which
    # the rope index groups the image grids: a placeholder turned into text is text there too.
    types = resized.get("mm_token_type_ids")
    types = types.clone() if types is not None and types.shape == ids.shape else None
    for row in range(ids.shape[0]):
        original = before[row % before.shape[0]]
        wanted = int((original == image_token).sum())
        positions = (ids[row] == image_token).nonzero().flatten()
        text = original[original != image_token]
        if len(positions) > wanted and len(text):
            ids[row, positions[wanted:]] = text[-1]
            if types is not None:
                types[row, positions[wanted:]] = 0
    return {**resized, "input_ids": ids, **({"mm_token_type_ids": types} if types is not None else {})}


def shapes_of(inputs: dict) -> dict:
    return {name: list(tensor.shape) for name, tensor in probe_tensors(inputs).items()}


def probe_label(dims: dict) -> str:
    return " ".join(f"{dim}={value}" for dim, value in dims.items()) or "sample"


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


def mask_of(inputs: dict):
    mask = inputs.get("attention_mask")
    return mask if mask is not None and getattr(mask, "dim", lambda: 0)() == 2 else None
