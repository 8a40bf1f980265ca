"""Planning a decoder-only text model's generation: a static cache, one graph (`single_graph`), or ExecuTorch's
LLM runner program instead of the engine's prefill/decode pair."""

from __future__ import annotations

import copy

from hfexport.errors import PlanError
from hfexport.plan.data import ComponentPlan
from hfexport.recipe.data import Target


def static_cache_generation_config(model, target: Target):
    generation = target.generation
    if generation.get("cache_implementation") != "static":
        return None
    config = copy.deepcopy(model.generation_config)
    config.cache_implementation = "static"
    # transformers 5.23 sizes the static cache from `GenerationConfig.max_cache_len`; `cache_config` only reaches
    # quantized caches, so a `{"max_cache_len": N}` there was ignored (the cache came out prompt + 1 long).
    config.max_cache_len = generation["max_cache_len"]
    return config


def check_single_graph(target_name: str, stages: dict) -> None:
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


def single_graph_fits(stages: dict) -> bool:
    """Whether `check_single_graph` accepts `stages` (a plain prefill/decode pair over a `DynamicCache`)."""
    try:
        check_single_graph("", stages)
    except PlanError:
        return False
    return True


def llm_runner_plan(target: Target, model, stages: dict, components: dict, other_layout: bool):
    """The one component of ExecuTorch's LLM runner contract (`hfexport.formats.executorch.llm_program`) for a decoder-only text
    model's default ExecuTorch generation target on XNNPACK, else None (the engine's prefill/decode pair)."""
    if not target.llm_runner_by_default or other_layout or target.components or target.dynamic_shapes is not None \
            or set(stages) != {"prefill", "decode"} or not single_graph_fits(stages):
        return None
    config = components["decode"].config
    if getattr(config, "backend", "xnnpack") != "xnnpack":
        return None
    return ComponentPlan("model", config, {"input_ids": [1, "seq"], "cache_position": ["seq"]},
                         {"input_ids": {"1": "seq"}, "cache_position": {"0": "seq"}})
