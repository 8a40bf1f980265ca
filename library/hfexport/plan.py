"""Plan: a recipe target resolved against one concrete model. Pure data in, engine objects out; nothing traced.

A plan holds, per component, the engine config (with `torch.export.Dim`s built from the recipe's dims), the
inputs the engine will trace with (keys as they are after the engine's `prepare_for_export`), and a readable
statement of which axes are dynamic. Mode `forward` is one `"model"` component; mode `generation` has the
components the engine's `decompose_for_generation` finds for this model (`prefill`/`decode`, or encoders, ...).
"""

from __future__ import annotations

import contextlib
import copy
import functools
import inspect
from dataclasses import dataclass, field
from typing import Any

from hfexport.engine import auto_dynamic_shapes, export_backends, register_cache_pytrees, traced_cache_layout
from hfexport.errors import PlanError
from hfexport.executorch_llm import max_context
from hfexport.inputs import build_sample_inputs
from hfexport.workarounds.transformers_models import base_rope_index, prefill_by_decode
from hfexport.models import infer_task
from hfexport import preparers
from hfexport.quantization.quantizer import attach
from hfexport.recipe.model import Recipe, Target
from hfexport.recipe.validation import parse_axis


@dataclass
class ComponentPlan:
    """One graph to export: its engine config and the shapes it will be traced with."""

    name: str
    config: Any  # the engine's ExportConfigMixin subclass
    input_shapes: dict[str, Any]  # sample shapes, for the report
    dynamic_axes: dict[str, Any]  # input -> axis -> description; {"*": "auto"} when torch.export decides
    # What the engine's export input preparers (transformers' `register_export_input_preparer`) computed from the
    # sample inputs before tracing: input -> {"kind": "added" | "replaced", ...} (`preparer_record`).
    prepared_inputs: dict[str, Any] = field(default_factory=dict)
    # What running those preparers again on new inputs needs (`hfexport.preparers.context`), when they added inputs.
    preparer_context: dict[str, Any] = field(default_factory=dict)


@dataclass
class Plan:
    """Everything needed to run one target's engine call."""

    recipe: Recipe
    target: Target
    task: str
    inputs: dict[str, Any]  # forward kwargs (forward) or generate kwargs (generation)
    components: dict[str, ComponentPlan]
    generation_config: Any = None
    multi_token_decode: bool = False
    dims: dict[str, Any] = field(default_factory=dict)
    quantization: dict | None = None  # method, params, engine objects, calibration (hfexport.quantization.spec)
    # hfexport's own components, which the engine's decompose_for_generation misses (transformers 5.23):
    # {name: (module, the kwargs it is traced with)}, an encoder-decoder's `encoder` or a VLM's `image_encoder`, `embed`
    own_components: dict[str, tuple[Any, dict]] = field(default_factory=dict)
    trace_inputs: dict | None = None  # generate kwargs the engine traces with, when not `inputs` (seq2seq)
    # A state-space model whose prefill this format would trace at the sample's length only
    # (`hfexport.workarounds.transformers_models.prefill_by_decode`): no prefill is exported, generate runs the prompt through decode.
    prefill_by_decode: bool = False
    # `generation.single_graph`: the multi-token decode alone, which runs the prompt on an empty cache too (no prefill).
    single_graph: bool = False
    # ExecuTorch's LLM runner contract (`hfexport.executorch_llm`): one program `model` that holds its cache, exported
    # by hfexport itself; the cache size it holds.
    llm_runner: int | None = None

    @property
    def export_format(self):
        return next(iter(self.components.values())).config.export_format

    @property
    def mode(self) -> str:
        return self.target.mode

    @property
    def config(self):
        """The engine config: one for `forward`, `{component: config}` for `generation`."""
        if self.target.mode == "forward":
            return self.components["model"].config
        return {name: component.config for name, component in self.components.items()}

    def prepared_inputs(self) -> dict | None:
        """The report's `prepared_inputs`: per component, what the engine's input preparers computed (None: nothing)."""
        record = {name: component.prepared_inputs for name, component in self.components.items()
                  if component.prepared_inputs}
        return record or None

    def describe(self) -> dict:
        """The resolved plan as JSON: format, mode, dims, and per component its options and dynamic axes."""
        return {
            "target": self.target.name,
            "export_format": str(self.target.export_format),
            "mode": self.target.mode,
            "task": self.task,
            "dims": copy.deepcopy(self.recipe.dims),
            "generation": copy.deepcopy(self.target.generation) or None,
            "quantization": copy.deepcopy(self.quantization),
            "components": {
                name: {
                    "options": _options_of(component.config),
                    "input_shapes": component.input_shapes,
                    "dynamic_axes": component.dynamic_axes,
                }
                for name, component in self.components.items()
            },
        }


def _options_of(config) -> dict:
    skip = {"export_format", "dynamic_shapes", "quantizer"}
    return {key: value for key, value in vars(config).items() if key not in skip}


def build_dims(recipe: Recipe) -> dict[str, Any]:
    """One `torch.export.Dim` per declared dim name."""
    from torch.export import Dim

    dims = {}
    for name, bounds in recipe.dims.items():
        kwargs = {key: bounds[key] for key in ("min", "max") if key in bounds}
        dims[name] = Dim(name, **kwargs)
    return dims


def _describe_shape(value) -> Any:
    import torch

    if isinstance(value, torch.Tensor):
        return {"shape": list(value.shape), "dtype": str(value.dtype).removeprefix("torch.")}
    if value is None or isinstance(value, (bool, int, float, str)):
        return {"value": value}
    return {"container": type(value).__name__}


class _AxisResolver:
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


def _resolve_shapes(resolver: _AxisResolver, shapes: dict, component_shapes: dict, inputs: dict, path: str,
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


def _varying_sizes(stages: dict) -> tuple[set[int], set[int]]:
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


def _default_generation_shapes(prepared: dict, sizes: tuple[set[int], set[int]]) -> tuple[dict, dict]:
    """A generation component's shapes when the recipe gives none: `Dim.AUTO` on every axis of a tensor input, and
    on a cache tensor only on axis 0 where the sample has a batch size and on later axes where it has a sequence
    length (`sizes`, from `_varying_sizes`); a cache's other axes (heads, head_dim, a static cache's length, a
    state-space model's state sizes) are static.

    The engine's `dynamic=True` marks every axis of every cache tensor `Dim.AUTO`: four symbols per tensor, two
    tensors per layer, and torch.export's symbolic-shape work grows with them (transformers 5.23 warns that explicit
    shapes export "significantly faster"); a 30-layer decoder's decode step carries 240 (measured:
    benchmarks/results/generation_shapes.json). An axis whose sample size happens to equal a batch or sequence size
    stays `Dim.AUTO` (torch.export then decides, as before), so nothing that varies is pinned."""
    import torch
    from torch.export import Dim
    from transformers.exporters.utils import get_leaf_tensors

    batches, lengths = sizes
    result, cached = {}, False
    for key, value in prepared.items():
        if isinstance(value, torch.Tensor):
            result[key] = {axis: Dim.AUTO for axis in range(value.dim())} or None
            continue
        template = auto_dynamic_shapes(value)
        if not template or isinstance(template, dict):
            result[key] = template if template else (None if template is None else _static_like(template))
            continue
        leaves = list(get_leaf_tensors(value).values())
        if len(leaves) != len(_flatten_template(template)):
            result[key] = template  # a container hfexport cannot read leaf by leaf: the engine's default
            continue
        specs = iter([{axis: Dim.AUTO for axis, size in enumerate(leaf.shape)
                       if size in (batches if axis == 0 else lengths)} or None for leaf in leaves])
        result[key] = _rebuild_template(template, specs)
        cached = cached or bool(leaves)
    described = {"*": "auto"} if not cached else {
        "*": "auto", "cache": "auto on the batch and sequence axes, other axes static"}
    return result, described


def _engine_config(target: Target, options: dict, dynamic_shapes: dict | None):
    """The engine's config object for the target's format, enums converted from their strings."""
    from transformers.exporters import ExportFormat

    export_format = ExportFormat(target.export_format)
    config_class = export_backends()[export_format].config
    options = dict(options)
    if dynamic_shapes is None:
        options.setdefault("dynamic", True)  # never pin an axis silently: AUTO on every axis, batch sample >= 2
    try:
        return config_class(export_format=export_format, dynamic_shapes=dynamic_shapes, **options)
    except (TypeError, ValueError) as error:
        raise PlanError(f"targets.{target.name}.options: {error}") from None


def _prepared(model, inputs: dict) -> dict:
    """Inputs as the engine traces them: after `prepare_for_export` (flags popped, preparer keys added)."""
    from transformers.exporters.utils import prepare_for_export

    _, prepared, _ = prepare_for_export(model, copy.copy(dict(inputs)))
    return base_rope_index(model, dict(prepared))


def traced_inputs(model, inputs: dict) -> dict:
    """A probe's forward kwargs as the graph takes them: what the engine's input preparers computed from them added
    or replaced, as at export time (an `image_sizes` tensor becomes the Python ints the graph was specialized on)."""
    return _prepared(model, inputs)


_RECORDED_VALUES = 64  # a prepared input of at most this many values is recorded with its values


def _describe_prepared(value) -> dict:
    import torch

    if isinstance(value, torch.Tensor):
        described = {"shape": list(value.shape), "dtype": str(value.dtype).removeprefix("torch.")}
        if value.numel() <= _RECORDED_VALUES:
            described["value"] = value.tolist()
        return described
    if isinstance(value, (list, tuple)):
        return {"python": type(value).__name__, "value": _jsonable_value(value)}
    if isinstance(value, (int, float, bool)):
        return {"python": type(value).__name__, "value": value}
    return {"python": type(value).__name__}


def _jsonable_value(value):
    if isinstance(value, (list, tuple)):
        return [_jsonable_value(item) for item in value]
    return value if isinstance(value, (int, float, bool, str)) or value is None else repr(value)


def preparer_record(inputs: dict, prepared: dict) -> dict:
    """What the engine's export input preparers did to `inputs` (`prepared` = `_prepared(model, inputs)`): each input
    they added (`cu_seqlens`, `position_ids`, ...) and each they replaced (`image_sizes`: a tensor become Python
    ints), with shapes and small values. The engine's dtype cast and popped output flags are not preparers' work."""
    import torch

    record: dict[str, Any] = {}
    for name, after in prepared.items():
        if name not in inputs:
            record[name] = {"kind": "added", **_describe_prepared(after)}
            continue
        before = inputs[name]
        if isinstance(before, torch.Tensor) and isinstance(after, torch.Tensor):
            if before.shape == after.shape and (before.dtype == after.dtype or before.is_floating_point()):
                continue  # unchanged, or only cast to the model's dtype
        elif type(before) is type(after) and not isinstance(before, torch.Tensor):
            continue
        record[name] = {"kind": "replaced", "from": _describe_prepared(before), **_describe_prepared(after)}
    return record


def _preparer_context(module, record: dict) -> dict:
    """`hfexport.preparers.context` of a component whose inputs the engine's preparers added to ({} otherwise)."""
    added = [name for name, entry in record.items() if entry["kind"] == "added"]
    return preparers.context(module, added) if added else {}


def _generation_config(model, target: Target):
    generation = target.generation
    if generation.get("cache_implementation") != "static":
        return None
    config = copy.deepcopy(model.generation_config)
    config.cache_implementation = "static"
    # transformers 5.23 sizes the static cache from `GenerationConfig.max_cache_len`; `cache_config` only reaches
    # quantized caches, so a `{"max_cache_len": N}` there was ignored (the cache came out prompt + 1 long).
    config.max_cache_len = generation["max_cache_len"]
    return config


@contextlib.contextmanager
def _call_capture(owner, name: str):
    """The kwargs of every call to `owner.<name>` within the block, each call's arguments bound to its signature
    (`**kwargs` merged in); nothing is recorded when `owner` is None. The method is shadowed by an instance
    attribute that keeps its signature (generate filters kwargs by it) and removed afterwards."""
    calls: list[dict] = []
    if owner is None:
        yield calls
        return
    original = getattr(owner, name)
    signature = inspect.signature(original)

    @functools.wraps(original)
    def recording(*args, **kwargs):
        call = {}
        for argument, value in signature.bind(*args, **kwargs).arguments.items():
            kind = signature.parameters[argument].kind
            if kind == inspect.Parameter.VAR_KEYWORD:
                call.update(value)
            elif kind != inspect.Parameter.VAR_POSITIONAL:
                call[argument] = value
        calls.append(call)
        return original(*args, **kwargs)

    setattr(owner, name, recording)
    try:
        yield calls
    finally:
        delattr(owner, name)  # the instance attribute; the class's method shows again


def _encoder_capture(model):
    """The kwargs of every call to `model.get_encoder()` within the block (nothing when `model` is None).

    transformers 5.23's `decompose_for_generation` captures an encoder-decoder's prefill/decode only; `generate`
    runs the encoder before them, so hfexport exports it as a third component, traced with what generate passed."""
    return _call_capture(model.get_encoder() if model is not None else None, "forward")


def _seq2seq_trace_inputs(model, inputs: dict) -> dict:
    """Generate kwargs that trace an encoder-decoder with two decoder prompt tokens.

    With the usual one-token decoder prompt, the decode step is captured with a one-token self-attention cache,
    and torch.export specializes a size-1 axis: the exported decode would only ever run the second token. Two
    start tokens make the prefill's decoder axis and the decode's cache axis 2 at trace time, so both stay
    dynamic (generate then feeds the prefill one token, as model.generate does)."""
    import torch

    if "decoder_input_ids" in inputs:
        return dict(inputs)
    start = model.generation_config.decoder_start_token_id
    if start is None:
        start = model.config.decoder_start_token_id
    if start is None:
        raise PlanError("the encoder-decoder has no decoder_start_token_id (generation_config or config)")
    start = start[0] if isinstance(start, (list, tuple)) else int(start)
    batch = next(value.shape[0] for value in inputs.values() if isinstance(value, torch.Tensor))
    return {**inputs, "decoder_input_ids": torch.full((batch, 2), start, dtype=torch.long)}


# ── Vision-language generation ───────────────────────────────────────────────
# transformers 5.23's `generate` encodes a VLM's images before the prefill (`_prepare_multimodal_encoder_kwargs_for_
# generation` calls `base_model.get_image_features` and hands the prefill `mm_encoder_outputs` instead of
# `pixel_values`), so the engine's `decompose_for_generation`, which captures the forward calls of generate, splits
# the prefill into `language_model` (taking `inputs_embeds`), `lm_head` and `decode` with no image encoder, and
# leaves the merge of image features into the text embeddings to the caller. hfexport adds the two missing pieces
# as components of their own: `image_encoder` (the call generate made: vision tower, feature selection, projector)
# and `embed` (token embeddings with the image features scattered in at the image-token positions).

IMAGE_ENCODER, EMBED = "image_encoder", "embed"
OWN_COMPONENTS = ("encoder", IMAGE_ENCODER, EMBED)  # exported by hfexport itself, not by export_for_generation


def _image_features_capture(model):
    """The kwargs of every call to `model.base_model.get_image_features` within the block (see above)."""
    base = getattr(model, "base_model", None)
    if getattr(base, "get_image_features", None) is None or "image" not in getattr(model, "input_modalities", ()):
        base = None
    return _call_capture(base, "get_image_features")


def image_token_id(config) -> int | None:
    """The placeholder token a VLM's processor repeats once per image feature."""
    for name in ("image_token_id", "image_token_index"):
        value = getattr(config, name, None)
        if isinstance(value, int):
            return value
    return None


def _image_modules(model, fixed: dict):
    """`(image_encoder, embed)`: the two modules hfexport exports beside a VLM's engine components."""
    import torch

    base = model.base_model

    class ImageEncoder(torch.nn.Module):
        """`base_model.get_image_features` on one prompt's images, as generate calls it: the image features of
        every image token, `[tokens, hidden]` (pooled outputs concatenated, as the model's forward does)."""

        def __init__(self):
            super().__init__()
            self.base = base
            # the engine's input preparers read the exported module's config (`target_sizes`'s `get_max_seqlen`: the
            # attention implementation), as they read a model's
            self.config = base.config

        def forward(self, **images):
            features = self.base.get_image_features(**images, **fixed, return_dict=True).pooler_output
            if isinstance(features, (list, tuple)):
                features = torch.cat(list(features), dim=0)
            return features.reshape(-1, features.shape[-1])

    class Embed(torch.nn.Module):
        """Token embeddings with the image features scattered in at the image-token positions (the model's
        `masked_scatter`), `[batch, seq, hidden]`: the `inputs_embeds` the language model's prefill takes."""

        def __init__(self):
            super().__init__()
            self.embed_tokens = model.get_input_embeddings()
            self.image_token_id = image_token_id(model.config)

        def forward(self, input_ids, image_features):
            embeds = self.embed_tokens(input_ids)
            mask = (input_ids == self.image_token_id).unsqueeze(-1)
            return embeds.masked_scatter(mask, image_features.to(embeds.dtype))

    return ImageEncoder().eval(), Embed().eval()


def _image_stages(model, inputs: dict, call: dict, stages: dict) -> dict:
    """`{"image_encoder": ..., "embed": ...}` stages from the captured `get_image_features` call.

    The encoder is traced on the first prompt's images (the first slice of every image tensor): LLaVA's
    `get_image_features` turns the image batch into a Python list, which pins the traced batch, so `generate` runs
    it once per prompt. The merge is checked here against the `inputs_embeds` the engine captured for the
    language model, so a model that builds them differently is refused at plan time, not exported wrong."""
    import torch

    images = {key: value for key, value in call.items() if isinstance(value, torch.Tensor)}
    fixed = {key: value for key, value in call.items() if key not in images and key != "return_dict"}
    positions = stages.get("decode", (None, {}))[1].get("position_ids")
    if isinstance(positions, torch.Tensor) and positions.dim() == 3:
        # Qwen2-VL-class rope (`get_rope_index`): text positions plus (t, h, w) positions laid out on each image's
        # grid, continued in the decode by the prompt's rope deltas; computing them needs the image grids and the
        # model's own index, which hfexport's generate (exported graphs only, 1-axis positions) does not have.
        raise PlanError(f"{type(model).__name__}: its decode takes multi-axis rope positions (position_ids "
                        f"{list(positions.shape)}: the text position and (t, h, w) positions from the model's "
                        "get_rope_index over the image grids, shifted by the prompt's rope deltas); hfexport's "
                        "generate feeds 1-axis positions, so it cannot run this model's generation export")
    if "input_ids" not in inputs or image_token_id(model.config) is None:
        raise PlanError(f"{type(model).__name__}: a vision-language model needs input_ids and an image token id "
                        "(config.image_token_id) to generate from images")
    counts = {int(value.shape[0]) for value in images.values()}
    if len(counts) != 1:
        raise PlanError(f"{type(model).__name__}: the image inputs {sorted(images)} do not share a batch axis "
                        f"({', '.join(f'{k}: {list(v.shape)}' for k, v in images.items())}); hfexport's image "
                        "encoder runs one prompt's images at a time")
    encoder, embed = _image_modules(model, fixed)
    with torch.no_grad():
        features = torch.cat([encoder(**{key: value[row : row + 1] for key, value in images.items()})
                              for row in range(counts.pop())])
        merged = embed(inputs["input_ids"], features)
    expected = stages.get("language_model", (None, {}))[1].get("inputs_embeds")
    if expected is None or expected.shape != merged.shape or not torch.allclose(expected, merged, atol=1e-5):
        raise PlanError(f"{type(model).__name__}: the language model's inputs_embeds are not the token embeddings "
                        "with the image features at the image tokens; hfexport cannot export this model's image "
                        "merge")
    first = {key: value[:1].clone() for key, value in images.items()}
    return {IMAGE_ENCODER: (encoder, first), EMBED: (embed, {"input_ids": inputs["input_ids"], "image_features": features})}


def generation_stages(model, inputs: dict, generation_config=None, multi_token_decode: bool = False) -> dict:
    """The engine's `decompose_for_generation`, plus a VLM's `image_encoder` and `embed` (see above), first."""
    from transformers.exporters.utils import decompose_for_generation

    with _image_features_capture(model) as image_calls:
        stages = decompose_for_generation(model, inputs, generation_config=generation_config,
                                          multi_token_decode=multi_token_decode)
    if image_calls and IMAGE_ENCODER not in stages:
        stages = {**_image_stages(model, inputs, image_calls[0], stages), **stages}
    return stages


def _check_single_graph(target_name: str, stages: dict) -> None:
    """`generation.single_graph` is for a decoder-only text model whose decode is attention over a `DynamicCache`: a
    VLM's prompt goes through its image merge, and a state-space decode (`cache_params`) takes one token per step."""
    where = f"targets.{target_name}.generation.single_graph"
    if set(stages) != {"prefill", "decode"}:
        raise PlanError(f"{where}: this model's components are {', '.join(stages)}; single_graph needs a plain "
                        "prefill/decode pair (a decoder-only text model)")
    cache = stages["decode"][1].get("past_key_values")
    if type(cache).__name__ != "DynamicCache":
        raise PlanError(f"{where}: the decode takes {type(cache).__name__ if cache is not None else 'no attention cache'}"
                        f" ({', '.join(stages['decode'][1])}); single_graph runs the prompt on an empty DynamicCache "
                        "of attention layers")


def _single_graph_fits(stages: dict) -> bool:
    """Whether `_check_single_graph` accepts `stages` (a plain prefill/decode pair over a `DynamicCache`)."""
    try:
        _check_single_graph("", stages)
    except PlanError:
        return False
    return True


def _llm_runner_plan(target: Target, model, stages: dict, components: dict, other_layout: bool):
    """The one component of ExecuTorch's LLM runner contract (`hfexport.executorch_llm`) for a decoder-only text
    model's default ExecuTorch generation target on XNNPACK, else None (the engine's prefill/decode pair)."""
    if not target.llm_runner_by_default or other_layout or target.components or target.dynamic_shapes is not None \
            or set(stages) != {"prefill", "decode"} or not _single_graph_fits(stages):
        return None
    config = components["decode"].config
    if getattr(config, "backend", "xnnpack") != "xnnpack":
        return None
    return ComponentPlan("model", config, {"input_ids": [1, "seq"], "cache_position": ["seq"]},
                         {"input_ids": {"1": "seq"}, "cache_position": {"0": "seq"}})


def build_plan(recipe: Recipe, target_name: str | None, model, inputs: dict | None = None, processor=None, *,
               source=None, revision: str | None = None, token: str | None = None, samples: dict | None = None) -> Plan:
    """Resolve target `target_name` of `recipe` against `model` (and inputs, synthesized when None, with the given
    sample files `samples` in place of synthesized images and clips: `hfexport.samples`)."""
    import torch

    target = recipe.target(target_name)
    task = recipe.task or infer_task(model.config)
    if inputs is None:
        inputs = build_sample_inputs(recipe, processor, model.config, task, target.mode, samples)
    dims = build_dims(recipe)
    register_cache_pytrees(model)
    base = f"targets.{target.name}.dynamic_shapes"
    shapes = target.dynamic_shapes
    components: dict[str, ComponentPlan] = {}
    generation_config = llm_runner = None
    single_graph = target.single_graph
    if target.single_graph_by_default and getattr(model.config, "is_encoder_decoder", False):
        single_graph = False  # the default single graph is for decoder-only models
    multi_token_decode = single_graph or bool(target.generation.get("multi_token_decode", False))

    if target.mode == "forward":
        prepared = _prepared(model, inputs)
        resolver = _AxisResolver(recipe, dims, "model", generation=False)
        dynamic_shapes, described = (
            _resolve_shapes(resolver, shapes, {}, prepared, base, strict_keys=True) if shapes is not None else (None, None)
        )
        config = _engine_config(target, target.options, dynamic_shapes)
        record = preparer_record(inputs, prepared)
        components["model"] = ComponentPlan(
            "model", config, {k: _describe_shape(v) for k, v in prepared.items()}, described or {"*": "auto"},
            record, _preparer_context(model, record),
        )
    else:
        generation_config = _generation_config(model, target)
        seq2seq = bool(getattr(model.config, "is_encoder_decoder", False))
        if seq2seq and (generation_config is not None or multi_token_decode):
            raise PlanError(f"targets.{target.name}.generation: an encoder-decoder exports with the default layout "
                            "(a DynamicCache of one token per step); static caches, multi-token decode and single "
                            "graphs are for decoder-only models")
        default_graph = single_graph and target.single_graph_by_default
        stages = None
        try:
            # The cache layout the export's capture and trace use (hfexport.engine.traced_cache_layout: a sliding
            # window layer holds every token), so the shapes planned here are those of the traced samples.
            with _encoder_capture(model if seq2seq else None) as encoder_calls, traced_cache_layout():
                stages = generation_stages(
                    model, _seq2seq_trace_inputs(model, inputs) if seq2seq else dict(inputs),
                    generation_config=generation_config, multi_token_decode=multi_token_decode
                )
        except PlanError:
            raise
        except Exception as error:  # noqa: BLE001 - the engine's own message, one line
            if not default_graph:
                raise PlanError(f"targets.{target.name}: the engine cannot split this model for generation: "
                                f"{error}") from None
        if default_graph and (stages is None or not _single_graph_fits(stages)):
            # the ONNX/OpenVINO default (one graph) on a model without a plain prefill/decode over attention: its own layout
            single_graph = multi_token_decode = False
            try:
                with traced_cache_layout():
                    stages = generation_stages(model, dict(inputs), generation_config=generation_config)
            except Exception as error:  # noqa: BLE001 - the engine's own message, one line
                raise PlanError(f"targets.{target.name}: the engine cannot split this model for generation: "
                                f"{error}") from None
        sizes = _varying_sizes(stages)
        by_decode = prefill_by_decode(model, str(target.export_format)) and "prefill" in stages
        if single_graph:
            _check_single_graph(target.name, stages)
            stages = {"decode": stages["decode"]}
        elif by_decode:
            # On this format Mamba's scan stays the engine's loop unrolled at the sample's length (modeling_fixes),
            # so its prefill would take that many tokens only. The decode is the same recurrence for one token:
            # export it alone; generate feeds it the prompt token by token, from a zero state.
            stages = {"decode": stages["decode"]}
        if seq2seq:
            if not encoder_calls:
                raise PlanError(f"targets.{target.name}: generate() never ran {type(model).__name__}'s encoder")
            encoder_inputs = {key: value for key, value in encoder_calls[0].items() if isinstance(value, torch.Tensor)}
            stages = {"encoder": (model.get_encoder(), encoder_inputs), **stages}
        unknown_overrides = [name for name in target.components if name not in stages]
        if unknown_overrides:
            raise PlanError(
                f"targets.{target.name}.components: no component {', '.join(map(repr, unknown_overrides))}; "
                f"this model's components are: {', '.join(stages)}"
            )
        seen_keys: set[str] = set()
        for name, (submodel, subinputs) in stages.items():
            override = target.components.get(name, {})
            prepared = _prepared(submodel, subinputs)
            seen_keys.update(prepared)
            options = {**target.options, **override.get("options", {})}
            if str(target.export_format) == "openvino" and (generation_config is not None or seq2seq or by_decode):
                # Keep the cache in the decode's inputs and outputs (OpenVINO `stateful=False`) unless the recipe asks
                # otherwise, for three reasons:
                # - a StaticCache (transformers 5.23): `stateful=True` folds its 0-d `cumulative_length` into a
                #   constant (the traced write position), so every decode step writes the same cache slot;
                # - an encoder-decoder (transformers 5.23): the stateful transformation pins every state axis that
                #   the decode passes through unchanged to its sample length (`_state_init_dims`), which for the
                #   cross-attention cache is the encoder's length: the decode then only takes prompts of the sample's
                #   length ("Can not clone with new dims ... {0 - ?, 4, 27, 8}");
                # - a state-space decode that runs the prompt (`by_decode`): left padding zeroes a row's state
                #   between the prompt's steps (hfexport.generate), which needs the state in the inputs and outputs.
                options.setdefault("stateful", False)
            component_shapes = override.get("dynamic_shapes", {})
            if shapes is None and not component_shapes:
                dynamic_shapes, described = _default_generation_shapes(prepared, sizes)
            else:
                resolver = _AxisResolver(recipe, dims, name, generation=True)
                dynamic_shapes, described = _resolve_shapes(
                    resolver, {k: v for k, v in (shapes or {}).items() if k in prepared}, component_shapes,
                    prepared, f"targets.{target.name}.components.{name}.dynamic_shapes"
                    if component_shapes else base, strict_keys=bool(component_shapes),
                )
            config = _engine_config(target, options, dynamic_shapes)
            record = preparer_record(subinputs, prepared)
            components[name] = ComponentPlan(name, config, {k: _describe_shape(v) for k, v in prepared.items()}, described,
                                             record, _preparer_context(submodel, record))
        unknown = [key for key in (shapes or {}) if key not in seen_keys]
        if unknown:
            raise PlanError(
                f"{base}: no component takes {', '.join(map(repr, unknown))}; inputs are: {', '.join(sorted(seen_keys))}"
            )
        llm_runner = _llm_runner_plan(target, model, stages, components, seq2seq or by_decode)
        if llm_runner is not None:
            components = {"model": llm_runner}
    plan = Plan(recipe, target, task, dict(inputs), components, generation_config, multi_token_decode, dims)
    if llm_runner is not None:
        plan.llm_runner = max_context(model, target.generation)
    if target.mode == "generation":
        plan.prefill_by_decode, plan.single_graph = by_decode, single_graph
        # Without a prefill the decode is exported as hfexport's own (the engine's export_for_generation traces both).
        own = (*OWN_COMPONENTS, "decode") if by_decode or single_graph else OWN_COMPONENTS
        plan.own_components = {name: stages[name] for name in own if name in stages}
        if "encoder" in stages:
            plan.trace_inputs = _seq2seq_trace_inputs(model, inputs)
    if target.quantization:
        # `source` (the model's folder or repo id, at `revision`) is where a `repo_file` calibration file is read.
        plan.quantization = attach(plan, model, processor, source or getattr(model, "name_or_path", None) or None,
                                   revision, token)
    return plan
