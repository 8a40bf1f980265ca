"""`build_plan`: a recipe target resolved against one concrete model. Pure data in, engine objects out; nothing
traced. Mode `forward` is one `"model"` component here; mode `generation` is planned in `plan.generation`."""

from __future__ import annotations

from hfexport.engine import register_cache_pytrees
from hfexport.inputs import build_sample_inputs
from hfexport.models import infer_task
from hfexport.plan.generation import plan_generation
from hfexport.plan.vision_language import grid_thw_refusal
from hfexport.plan.data import ComponentPlan, Plan
from hfexport.plan.shapes import AxisResolver, describe_shape, resolve_shapes, build_dims
from hfexport.plan.tracing import engine_config, traced_inputs, preparer_context, preparer_record
from hfexport.quantization.quantizer import attach
from hfexport.recipe.data import Recipe
from hfexport.errors import PlanError
from hfexport.workarounds.transformers_models import unrolled_sequence


def build_plan(recipe: Recipe, target_name: str | None, model, inputs: dict | None = None, processor=None, *,
               source=None, revision: str | None = None, token: str | None = None, samples: dict | None = None) -> Plan:
    """Resolve target `target_name` of `recipe` against `model` (and inputs, synthesized when None, with the given
    sample files `samples` in place of synthesized images and clips: `hfexport.samples`)."""
    target = recipe.target(target_name)
    task = recipe.task or infer_task(model.config)
    if inputs is None:
        inputs = build_sample_inputs(recipe, processor, model.config, task, target.mode, samples)
    dims = build_dims(recipe)
    register_cache_pytrees(model)
    single_graph = target.single_graph
    if target.single_graph_by_default and getattr(model.config, "is_encoder_decoder", False):
        single_graph = False  # the default single graph is for decoder-only models
    multi_token_decode = single_graph or bool(target.generation.get("multi_token_decode", False))

    if (refusal := grid_thw_refusal(model, target.export_format, inputs)) is not None:
        raise PlanError(f"targets.{target.name}: {refusal}")
    if target.mode == "forward":
        base = f"targets.{target.name}.dynamic_shapes"
        shapes = target.dynamic_shapes
        prepared = traced_inputs(model, inputs)
        resolver = AxisResolver(recipe, dims, "model", generation=False)
        dynamic_shapes, described = (
            resolve_shapes(resolver, shapes, {}, prepared, base, strict_keys=True) if shapes is not None
            else (None, None)
        )
        _refuse_unrolled_sequence(model, target, dynamic_shapes or {}, described or {}, base)
        config = engine_config(target, target.options, dynamic_shapes)
        record = preparer_record(inputs, prepared)
        _refuse_unreached_preparer_inputs(model, record)
        _refuse_audio_lengths_computed_inside(model, prepared)
        components = {"model": ComponentPlan(
            "model", config, {k: describe_shape(v) for k, v in prepared.items()}, described or {"*": "auto"},
            record, preparer_context(model, record),
        )}
        plan = Plan(recipe, target, task, dict(inputs), components, None, multi_token_decode, dims)
    else:
        plan = plan_generation(recipe, target, task, model, inputs, dims, single_graph, multi_token_decode)
    if target.quantization:
        # `source` (the model's folder or repo id, at `revision`) is where a `repo_file` calibration file is read.
        plan.quantization = attach(plan, model, processor, source or getattr(model, "name_or_path", None) or None,
                                   revision, token)
    return plan


def _refuse_unrolled_sequence(model, target, dynamic_shapes: dict, described: dict, base: str) -> None:
    """A forward target whose text axis is dynamic on a format that unrolls the model's sequence loop is refused
    before tracing, naming the recipe field and the upstream cause (`unrolled_sequence`), not after a failed export."""
    axes = dynamic_shapes.get("input_ids")
    axis = axes.get(1) if isinstance(axes, dict) else None
    cause = unrolled_sequence(model, target.export_format) if axis is not None and not isinstance(axis, int) else None
    if cause:
        text = next((value for key, value in (described.get("input_ids") or {}).items() if str(key) == "1"), "")
        raise PlanError(f"{base}.input_ids.1: a dynamic sequence ({text}) cannot be exported to "
                        f"{target.export_format}: {cause}; pin the axis (\"static\") or export to dynamo or onnx")


def _refuse_unreached_preparer_inputs(model, record: dict) -> None:
    """A whole-model forward whose engine-prepared inputs (`cu_seqlens`, `window_index`, ...) its `forward` takes only
    as `**kwargs` is refused before tracing: the model does not hand them to the encoder they are for (Qwen3-ASR's
    `get_audio_features`, MiniCPM-V's `get_image_features`, transformers 5.23), which then computes them from the data
    itself, and torch.export stops there."""
    import inspect

    explicit = inspect.signature(model.forward).parameters
    unreached = [name for name, entry in record.items() if entry["kind"] == "added" and name not in explicit]
    if unreached:
        raise PlanError(
            f"{type(model).__name__}: the engine's input preparers computed {', '.join(unreached)} for the whole "
            "model, but its forward takes them only as **kwargs and does not pass them to the encoder they are for, "
            "which computes them from the data itself: torch.export stops there (\"GuardOnDataDependentSymNode: "
            "Could not extract specialized integer from data-dependent expression\"); export mode `generation`, "
            "whose encoder component takes them")


def _refuse_audio_lengths_computed_inside(model, prepared: dict) -> None:
    """A whole-model forward over an omni audio encoder (a module that takes `feature_lens`, the marker of
    transformers 5.23's omni-audio preparer) fed `feature_attention_mask` is refused before tracing: the model computes
    `feature_lens` from the mask inside `get_audio_features`, so the preparer never fires and torch.export stops at
    the mask's data-dependent selection (measured on tiny Qwen2.5-Omni)."""
    import inspect

    if "feature_attention_mask" not in prepared or "feature_lens" in prepared:
        return
    encoder = next((module for module in model.modules() if "feature_lens" in inspect.signature(
        getattr(type(module), "forward", lambda self: None)).parameters), None)
    if encoder is not None:
        raise PlanError(
            f"{type(model).__name__}: its audio encoder ({type(encoder).__name__}) takes `feature_lens`, which the "
            "model computes from `feature_attention_mask` inside its forward, so the engine's omni-audio input "
            "preparer never runs and torch.export stops at the mask (\"GuardOnDataDependentSymNode: Could not guard "
            "on data-dependent expression Eq(u1, 0)\")")
