"""Dynamic shapes: the recipe's dims and axis specs as `torch.export` dims for one component's traced inputs, and
the defaults a generation component gets when the recipe names none."""

from __future__ import annotations

import re
from typing import Any

from hfexport.engine import auto_dynamic_shapes
from hfexport.errors import PlanError
from hfexport.recipe.data import Recipe
from hfexport.recipe.validation import parse_axis


def build_dims(recipe: Recipe) -> dict[str, Any]:
    """One `torch.export.Dim` per declared dim name."""
    from torch.export import Dim

    dims = {}
    for name, bounds in recipe.dims.items():
        kwargs = {key: bounds[key] for key in ("min", "max") if key in bounds}
        dims[name] = Dim(name, **kwargs)
    return dims


def describe_shape(value) -> Any:
    import torch

    if isinstance(value, torch.Tensor):
        return {"shape": list(value.shape), "dtype": str(value.dtype).removeprefix("torch.")}
    if value is None or isinstance(value, (bool, int, float, str)):
        return {"value": value}
    return {"container": type(value).__name__}


class AxisResolver:
    """Turns recipe axis specs into torch.export dims for one component's prepared inputs."""

    def __init__(self, recipe: Recipe, dims: dict, component: str, generation: bool):
        self.recipe, self.dims, self.component, self.generation = recipe, dims, component, generation

    def axis(self, spec: Any, size: int, where: str, component_level: bool) -> tuple[Any, str | None]:
        from torch.export import Dim

        kind, value = parse_axis(spec)
        if kind == "keyword":
            return {"static": (None, "static"), "auto": (Dim.AUTO, "auto"), "dynamic": (Dim.DYNAMIC, "dynamic")}[value]
        if kind == "int":
            if size != value:
                raise PlanError(f"{where}: the recipe pins this axis to {value}, but the sample input has size {size}")
            return None, f"static ({value})"
        name, scale, offset = value
        base = self.dims[name]
        bounds = self.recipe.dims.get(name, {})
        if (size - offset) % scale:
            raise PlanError(f"{where}: the sample input has size {size}, which is not {spec} for any whole {name}")
        base_size = (size - offset) // scale
        if base_size <= 1:
            if self.generation and not component_level and size == 1 and (scale, offset) == (1, 0):
                # A target-wide dim on an axis this component traces at 1 (the decode step): static here.
                return None, "static (1 in this component)"
            traced = f"size {size}" if (scale, offset) == (1, 0) else f"size {size} ({name} = {base_size})"
            raise PlanError(
                f"{where}: dim {name!r} is traced from a sample of {traced}; torch.export specializes sizes 0 "
                f"and 1, so use a sample where {name} >= 2 on this axis"
            )
        low, high = bounds.get("min"), bounds.get("max")
        if (low is not None and base_size < low) or (high is not None and base_size > high):
            raise PlanError(
                f"{where}: the sample input has size {size}, outside dim {name!r} [{low}, {high}] "
                "(change sample_inputs or the dim's bounds)"
            )
        dim = base if (scale, offset) == (1, 0) else base * scale + offset
        text = f"{name} [{low if low is not None else '-'}, {high if high is not None else '-'}]"
        if (scale, offset) != (1, 0):
            text = f"{spec} ({text})"
        return dim, text

    def tensor_axes(self, axes: dict, tensor, where: str, component_level: bool) -> tuple[dict | None, dict]:
        spec, text = {}, {}
        for key, axis_spec in axes.items():
            index = int(key)
            if index >= tensor.dim():
                raise PlanError(f"{where}.{key}: axis {index} does not exist; the input has rank {tensor.dim()}")
            dim, description = self.axis(axis_spec, int(tensor.shape[index]), f"{where}.{key}", component_level)
            if dim is not None:
                spec[index] = dim
            text[str(index)] = description
        return (spec or None), text


def resolve_shapes(resolver: AxisResolver, shapes: dict, component_shapes: dict, inputs: dict, path: str,
                   strict_keys: bool) -> tuple[dict, dict]:
    """torch.export `dynamic_shapes` for `inputs` from recipe specs, and a description of every dynamic axis."""
    import torch

    merged = {**shapes, **component_shapes}
    unknown = [key for key in merged if key not in inputs]
    if unknown and strict_keys:
        raise PlanError(
            f"{path}: no input named {', '.join(map(repr, unknown))}; the traced inputs are: {', '.join(inputs)}"
        )
    result, described = {}, {}
    listed_tensors = {key: inputs[key] for key in merged if isinstance(inputs.get(key), torch.Tensor)}
    for key, value in inputs.items():
        where = f"{path}.{key}"
        spec = merged.get(key)
        component_level = key in component_shapes
        if isinstance(value, torch.Tensor):
            inherited_from = None
            if spec is None and key not in merged:
                # An unlisted input shaped exactly like a listed one follows it (attention_mask after input_ids).
                inherited_from = next(
                    (name for name, tensor in listed_tensors.items() if tensor.shape == value.shape), None
                )
                spec = merged.get(inherited_from) if inherited_from else None
            if spec is None:
                result[key] = None
                continue
            if not isinstance(spec, dict) or "*" in spec:
                raise PlanError(f"{where}: a tensor input takes a per-axis map")
            result[key], text = resolver.tensor_axes(spec, value, where, component_level)
            if inherited_from:
                text = {axis: f"{desc} (as {inherited_from})" for axis, desc in text.items()}
            described[key] = text
            continue
        template = auto_dynamic_shapes(value)
        if spec is None or not template:
            # An empty cache (prefill) still needs its container shape (`[]`), not None: torch.export matches
            # the pytree structure of dynamic_shapes against the inputs'.
            result[key] = None if template is None else _static_like(template)
            continue
        result[key], described[key] = _resolve_container(resolver, spec, value, template, where, component_level)
    return result, described


def _static_like(template):
    if isinstance(template, dict):
        return None
    if isinstance(template, (list, tuple)):
        return type(template)(_static_like(item) for item in template)
    return None


def _resolve_container(resolver, spec, value, template, where, component_level):
    """A cache (or other pytree) input: `{"*": axes}` for every tensor, or a list with one entry per tensor."""
    from transformers.exporters.utils import get_leaf_tensors

    leaves = list(get_leaf_tensors(value).values())
    flat_template = _flatten_template(template)
    if len(leaves) != len(flat_template):
        leaves = [None] * len(flat_template)
    if isinstance(spec, dict) and "*" in spec:
        per_tensor = [spec["*"]] * len(flat_template)
    elif isinstance(spec, list):
        if len(spec) != len(flat_template):
            raise PlanError(f"{where}: {len(spec)} entries given, but this input holds {len(flat_template)} tensors")
        per_tensor = spec
    else:
        raise PlanError(f"{where}: a cache input takes {{\"*\": axes}} or a list with one entry per tensor")
    specs, description = [], {}
    for index, (axes, rank_template, leaf) in enumerate(zip(per_tensor, flat_template, leaves)):
        if axes is None:
            specs.append(None)
            continue
        tensor = leaf if leaf is not None else _FakeShape(rank_template)
        spec_i, text = resolver.tensor_axes(axes, tensor, f"{where}.{index}", component_level)
        specs.append(spec_i)
        description[str(index)] = text
    it = iter(specs)
    rebuilt = _rebuild_template(template, it)
    if isinstance(spec, dict) and "*" in spec and description:
        description = {"*": next(iter(description.values())), "tensors": len(flat_template)}
    return rebuilt, description


class _FakeShape:
    """Rank without sizes, for a cache leaf whose tensor cannot be read (sizes then are not checked)."""

    def __init__(self, template: dict):
        self.shape = [2] * len(template)

    def dim(self):
        return len(self.shape)


def _flatten_template(template) -> list:
    if isinstance(template, dict):
        return [template]
    if isinstance(template, (list, tuple)):
        return [leaf for item in template for leaf in _flatten_template(item)]
    return []


def _rebuild_template(template, specs):
    if isinstance(template, dict):
        return next(specs)
    if isinstance(template, (list, tuple)):
        return type(template)(_rebuild_template(item, specs) for item in template)
    return template


def varying_sizes(stages: dict) -> tuple[set[int], set[int]]:
    """(batch sizes, sequence lengths) of the sample, read off the 2-D tensor inputs (input_ids, attention_mask,
    position_ids, decoder_input_ids): batch from axis 0 of every stage's, lengths from axis 1 of every stage's but
    the decode step's (its mask is one longer than its cache, which would make a head_dim of that size look like a
    sequence axis). A cache filled by the prefill has the prefill's length; a cross-attention cache the encoder's."""
    import torch

    batches, lengths = set(), set()
    for name, (_, subinputs) in stages.items():
        for value in subinputs.values():
            if isinstance(value, torch.Tensor) and value.dim() == 2:
                batches.add(int(value.shape[0]))
                if name != "decode":
                    lengths.add(int(value.shape[1]))
    return {size for size in batches if size > 1}, {size for size in lengths if size > 1}


#: The axes of an attention cache layer's `keys` / `values` that vary between calls: batch and length
#: (transformers 5.23's layout, `[batch, key_value_heads, length, head_dim]`; `hfexport.models.empty_cache`).
ATTENTION_CACHE_AXES = (0, 2)
_ATTENTION_LEAF = re.compile(r"(?:^|\.)layers\.\d+\.(?:keys|values)$")


def _may_vary(leaf_name: str, leaf, axis: int) -> bool:
    """Whether axis `axis` of cache leaf `leaf_name` may be dynamic: any axis but an attention layer's heads and
    head_dim (a state-space model's states, a leaf of another layout, are left to the sample sizes)."""
    if leaf.dim() == 4 and _ATTENTION_LEAF.search(leaf_name):
        return axis in ATTENTION_CACHE_AXES
    return True


#: The largest batch the verifier probes a target with default shapes at (`hfexport.verify.probes.AUTO_VALUES`).
AUTO_PROBE_BATCH = 8


def _auto(size: int, bound: int | None):
    """`Dim.AUTO`, with `max=bound` where the bound holds the traced size (else unbounded: the sample decides)."""
    from torch.export import Dim

    return Dim.AUTO(max=bound) if bound is not None and size <= bound else Dim.AUTO


def default_generation_shapes(prepared: dict, sizes: tuple[set[int], set[int]],
                              bounds: tuple[int | None, int | None] = (None, None)) -> tuple[dict, dict]:
    """A generation component's shapes when the recipe gives none: `Dim.AUTO` on every axis of a tensor input, and
    on a cache tensor only on axis 0 where the sample has a batch size and on later axes where it has a sequence
    length (`sizes`, from `varying_sizes`); a cache's other axes (heads, head_dim, a static cache's length, a
    state-space model's state sizes) are static.

    The engine's `dynamic=True` marks every axis of every cache tensor `Dim.AUTO`: four symbols per tensor, two
    tensors per layer, and torch.export's symbolic-shape work grows with them (transformers 5.23 warns that explicit
    shapes export "significantly faster"); a 30-layer decoder's decode step carries 240 (measured:
    benchmarks/results/generation_shapes.json). An axis whose sample size happens to equal a batch or sequence size
    stays `Dim.AUTO` (torch.export then decides, as before), so nothing that varies is pinned, except in an attention
    layer's keys and values (`ATTENTION_CACHE_AXES`): their heads and head_dim never vary, whatever the sample's
    lengths (a prompt of 8 tokens beside Llama 3's 8 key-value heads made the heads axis symbolic).

    `bounds` (batch, length), from `plan.generation.generation_bounds` where the format needs them: an axis 0 of a batch size gets
    `max=batch`, a later axis of a sequence length `max=length` (on every input, the caches' included), so the
    program is planned for what the model can take, not for the exporter's guess."""
    import torch
    from transformers.exporters.utils import get_leaf_tensors

    batches, lengths = sizes
    batch_bound, length_bound = bounds

    def axis_dim(axis: int, size: int):
        if axis == 0:
            return _auto(size, batch_bound if size in batches else None)
        return _auto(size, length_bound if size in lengths else None)

    result, cached = {}, False
    for key, value in prepared.items():
        if isinstance(value, torch.Tensor):
            result[key] = {axis: axis_dim(axis, size) for axis, size in enumerate(value.shape)} or None
            continue
        template = auto_dynamic_shapes(value)
        if not template or isinstance(template, dict):
            result[key] = template if template else (None if template is None else _static_like(template))
            continue
        leaves = get_leaf_tensors(value)
        if len(leaves) != len(_flatten_template(template)):
            result[key] = template  # a container hfexport cannot read leaf by leaf: the engine's default
            continue
        specs = iter([{axis: axis_dim(axis, size) for axis, size in enumerate(leaf.shape)
                       if size in (batches if axis == 0 else lengths) and _may_vary(name, leaf, axis)} or None
                      for name, leaf in leaves.items()])
        result[key] = _rebuild_template(template, specs)
        cached = cached or bool(leaves)
    described = {"*": "auto"} if not cached else {
        "*": "auto", "cache": "auto on the batch and sequence axes, other axes static"}
    if batch_bound is not None or length_bound is not None:
        described["bounds"] = ", ".join(f"{name} <= {bound}" if bound is not None else f"{name} unbounded"
                                        for name, bound in (("batch", batch_bound), ("sequence", length_bound)))
    return result, described
