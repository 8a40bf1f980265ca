"""Generation planning shared by every family: the engine's split of `generate` into components (plus hfexport's
own), each planned with its engine config and traced shapes; the family modules add what theirs needs."""

from __future__ import annotations

from typing import Any

from hfexport.engine import traced_cache_layout
from hfexport.errors import PlanError
from hfexport.formats import format_traits
from hfexport.formats.executorch.llm_program import DEFAULT_MAX_CONTEXT, max_context
from hfexport.models import sequence_limit
from hfexport.plan.decoder import check_single_graph, static_cache_generation_config, llm_runner_plan, single_graph_fits
from hfexport.plan.data import ComponentPlan, Plan
from hfexport.plan.memory_plan import estimate_memory_plan
from hfexport.plan.seq2seq import check_default_layout, encoder_capture, seq2seq_trace_inputs, with_encoder
from hfexport.plan.shapes import (
    AUTO_PROBE_BATCH, AxisResolver, default_generation_shapes, describe_shape, resolve_shapes, varying_sizes,
)
from hfexport.plan.state_space import exports_decode_alone
from hfexport.plan.tracing import engine_config, traced_inputs, preparer_context, preparer_record
from hfexport.plan.vision_language import (
    EMBED, IMAGE_ENCODER, batch_encoder_refusal, encoded_modality, encoder_embed_stages, image_features_capture,
    image_stages, retraced_encoders, target_sizes_refusal,
)
from hfexport.recipe.data import Recipe, Target

OWN_COMPONENTS = ("encoder", IMAGE_ENCODER, EMBED)  # exported by hfexport itself, not by export_for_generation


def generation_stages(model, inputs: dict, generation_config=None, multi_token_decode: bool = False,
                      export_format: str | None = None) -> dict:
    """The engine's `decompose_for_generation`, plus a VLM's `image_encoder` and `embed` (plan.vision_language),
    first, or the `embed` of a modality the engine's split encodes itself (audio: Qwen3-ASR, Qwen2.5-Omni).
    `export_format`: the plan's, to refuse what that format's export of the engine's split cannot take."""
    from transformers.exporters.utils import decompose_for_generation

    with image_features_capture(model) as image_calls:
        stages = decompose_for_generation(model, inputs, generation_config=generation_config,
                                          multi_token_decode=multi_token_decode)
    if image_calls and IMAGE_ENCODER not in stages:
        if export_format and (refusal := target_sizes_refusal(model, export_format, image_calls[0])):
            raise PlanError(refusal)
        stages = {**image_stages(model, inputs, image_calls[0], stages), **stages}
    modality = encoded_modality(stages)
    if modality is not None:
        refusal = batch_encoder_refusal(model, stages[f"{modality}_encoder"], export_format) \
            if export_format else None
        if refusal:
            raise PlanError(refusal)
        stages = encoder_embed_stages(model, inputs, stages, modality)
    return stages


def plan_generation(recipe: Recipe, target: Target, task: str, model, inputs: dict, dims: dict[str, Any],
                    single_graph: bool, multi_token_decode: bool) -> Plan:
    """Target `target` (mode `generation`) resolved against `model`: its components, then the plan."""
    base = f"targets.{target.name}.dynamic_shapes"
    shapes = target.dynamic_shapes
    components: dict[str, ComponentPlan] = {}
    generation_config = static_cache_generation_config(model, target)
    seq2seq = bool(getattr(model.config, "is_encoder_decoder", False))
    if seq2seq:
        check_default_layout(target, generation_config, multi_token_decode)
    default_graph = single_graph and target.single_graph_by_default
    stages = None
    try:
        # The cache layout the export's capture and trace use (hfexport.engine.traced_cache_layout: a sliding
        # window layer holds every token), so the shapes planned here are those of the traced samples.
        with encoder_capture(model if seq2seq else None) as encoder_calls, traced_cache_layout():
            stages = generation_stages(
                model, seq2seq_trace_inputs(model, inputs) if seq2seq else dict(inputs),
                generation_config=generation_config, multi_token_decode=multi_token_decode,
                export_format=str(target.export_format),
            )
    except PlanError:
        raise
    except Exception as error:  # noqa: BLE001 - the engine's own message, one line
        if not default_graph:
            raise PlanError(f"targets.{target.name}: the engine cannot split this model for generation: "
                            f"{error}") from None
    if default_graph and (stages is None or not single_graph_fits(stages)):
        # the ONNX/OpenVINO default (one graph) on a model without a plain prefill/decode over attention: its own
        # layout, its decode on one new token unless the format's runtimes run the prompt through it (OpenVINO
        # GenAI's VLMPipeline on Qwen2-VL: `decode_takes_the_prompt`)
        single_graph = False
        multi_token_decode = format_traits(target.export_format).decode_takes_the_prompt(model.config, task)
        try:
            with traced_cache_layout():
                stages = generation_stages(model, dict(inputs), generation_config=generation_config,
                                           multi_token_decode=multi_token_decode,
                                           export_format=str(target.export_format))
        except Exception as error:  # noqa: BLE001 - the engine's own message, one line
            raise PlanError(f"targets.{target.name}: the engine cannot split this model for generation: "
                            f"{error}") from None
    sizes = varying_sizes(stages)
    bounds = (generation_bounds(recipe, target, model.config)
              if format_traits(target.export_format).plans_memory_for_upper_bounds else (None, None))
    by_decode = exports_decode_alone(model, str(target.export_format), stages)
    if single_graph:
        check_single_graph(target.name, stages)
        stages = {"decode": stages["decode"]}
    elif by_decode:
        stages = {"decode": stages["decode"]}  # a state-space decode alone (hfexport.plan.state_space)
    if seq2seq:
        stages = with_encoder(target, model, stages, encoder_calls)
    unknown_overrides = [name for name in target.components if name not in stages]
    if unknown_overrides:
        raise PlanError(
            f"targets.{target.name}.components: no component {', '.join(map(repr, unknown_overrides))}; "
            f"this model's components are: {', '.join(stages)}"
        )
    seen_keys: set[str] = set()
    for name, (submodel, subinputs) in stages.items():
        override = target.components.get(name, {})
        prepared = traced_inputs(submodel, subinputs)
        seen_keys.update(prepared)
        options = {**target.options, **override.get("options", {})}
        state_option = format_traits(target.export_format).cache_state_option  # OpenVINO's `stateful`
        if state_option and (generation_config is not None or seq2seq or by_decode):
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
            options.setdefault(state_option, False)
        component_shapes = override.get("dynamic_shapes", {})
        if shapes is None and not component_shapes:
            dynamic_shapes, described = default_generation_shapes(prepared, sizes, bounds)
        else:
            resolver = AxisResolver(recipe, dims, name, generation=True)
            dynamic_shapes, described = resolve_shapes(
                resolver, {k: v for k, v in (shapes or {}).items() if k in prepared}, component_shapes,
                prepared, f"targets.{target.name}.components.{name}.dynamic_shapes"
                if component_shapes else base, strict_keys=bool(component_shapes),
            )
        config = engine_config(target, options, dynamic_shapes)
        record = preparer_record(subinputs, prepared)
        components[name] = ComponentPlan(name, config, {k: describe_shape(v) for k, v in prepared.items()}, described,
                                         record, preparer_context(submodel, record))
    unknown = [key for key in (shapes or {}) if key not in seen_keys]
    if unknown:
        raise PlanError(
            f"{base}: no component takes {', '.join(map(repr, unknown))}; inputs are: {', '.join(sorted(seen_keys))}"
        )
    llm_runner = llm_runner_plan(target, model, stages, components, seq2seq or by_decode)
    if llm_runner is not None:
        components = {"model": llm_runner}
    plan = Plan(recipe, target, task, dict(inputs), components, generation_config, multi_token_decode, dims)
    if llm_runner is not None:
        plan.llm_runner = max_context(model, target.generation)
    plan.prefill_by_decode, plan.single_graph = by_decode, single_graph
    if any("bounds" in (component.dynamic_axes or {}) for component in components.values()):
        plan.memory_plan = estimate_memory_plan(model.config, bounds)
    # Without a prefill the decode is exported as hfexport's own (the engine's export_for_generation traces both).
    own = (*OWN_COMPONENTS, "decode") if by_decode or single_graph else OWN_COMPONENTS
    plan.retraced = tuple(retraced_encoders(model, stages))
    plan.own_components = {name: stages[name] for name in (*own, *plan.retraced) if name in stages}
    if "encoder" in stages:
        plan.trace_inputs = seq2seq_trace_inputs(model, inputs)
    return plan


def generation_bounds(recipe: Recipe, target: Target, config) -> tuple[int, int | None]:
    """(batch, length) upper bounds of a generation target's default shapes where the format's memory plan is sized
    for the upper bounds (`plans_memory_for_upper_bounds`: ExecuTorch allocates every planned tensor at its bound when
    the program loads). Batch: the recipe's `dims.batch.max`, at least the verifier's `AUTO_PROBE_BATCH`. Length: the
    recipe's `generation.max_cache_len`, else the decoder's positions (`max_target_positions`, else
    `max_position_embeddings` or its aliases) up to `DEFAULT_MAX_CONTEXT`, as ExecuTorch's LLM runner program's cache
    (`max_context`); None where the config states no positions (T5's relative ones: the engine's own cap stays).

    Without them every axis is `Dim.AUTO`, unbounded, and transformers 5.23's ExecuTorch exporter caps each one with a
    heuristic that ignores the tensor's width (`_fix_range_constraints`: 4x the traced size, or a floor shared out
    over the unbounded dims): Whisper large-v3-turbo's prefill was planned for batch 256 x 256 decoder positions, a
    [256, 20, 256, 1500] float32 cross-attention score among its tensors, 35,351 MiB in all, and did not load
    (`std::bad_alloc`)."""
    batch = max(int(recipe.dims.get("batch", {}).get("max") or 0), AUTO_PROBE_BATCH)
    if target.generation.get("max_cache_len"):
        return batch, int(target.generation["max_cache_len"])
    positions = getattr(config, "max_target_positions", None)
    if not (isinstance(positions, int) and positions > 0):
        positions = sequence_limit(config)
    return batch, (min(positions, DEFAULT_MAX_CONTEXT) if positions else None)

