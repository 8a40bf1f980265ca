"""What a quantization asks of the model's layer shapes, checked against its config.json before anything runs.

Group-wise weight quantization splits each weight's input (reduction) axis into groups of `group_size` values that
share a scale; NNCF refuses a layer whose input size the group size does not divide (`InvalidGroupSizeError`,
raised after the whole export, 87 s on SmolLM2-135M: 128 does not divide its hidden size 576). The input sizes of a
transformer's linear layers follow from its config by one rule, whatever the architecture (no table of models):
the hidden size (query/key/value and gate/up projections), the attention heads times the head size (the output
projection) and the feed-forward sizes (the down projection), per sub-config (`text_config`, `vision_config`, ...).

`layer_input_sizes(config)` reads them; `group_size_problems` (a target's `quantization`) and
`variant_group_size_problems` (its OpenVINO `int4` or ExecuTorch `8da4w` variant's stated `group_size`: torchao's
`PerGroup` cannot group a layer either) name the recipe field, what does not
divide, and the largest group size that divides every layer. Pure data: no torch, so `hfexport validate` stays cheap.
"""

from __future__ import annotations

import math

from hfexport.errors import Problem

_HIDDEN = ("hidden_size", "d_model", "n_embd", "dim")
_FEED_FORWARD = ("intermediate_size", "ffn_hidden_size", "ffn_dim", "encoder_ffn_dim", "decoder_ffn_dim", "n_inner", "d_ff",
                 "moe_intermediate_size", "shared_expert_intermediate_size")
_HEADS = ("num_attention_heads", "n_head", "num_heads", "encoder_attention_heads")
_HEAD_SIZE = ("head_dim", "d_kv", "attention_head_dim")
_SUB_CONFIGS = ("text_config", "vision_config", "audio_config", "encoder", "decoder", "language_config")

#: NNCF's weight modes that quantize in groups along the input axis, and NNCF's default group size for each
#: (nncf 3.4: `get_weight_compression_configuration`; the int8 modes are per channel, group -1).
GROUPED_NNCF_MODES = {"int4_sym": 128, "int4_asym": 128, "nf4": 128, "fp4": 128, "mxfp4": 32}


def _size(holder: dict, key: str) -> int | None:
    value = holder.get(key)
    return value if isinstance(value, int) and not isinstance(value, bool) and value > 0 else None


def _first(holder: dict, keys: tuple[str, ...]) -> tuple[str, int] | None:
    for key in keys:
        if (value := _size(holder, key)) is not None:
            return key, value
    return None


def layer_input_sizes(config: dict) -> dict[str, int]:
    """{where in config.json: input size} of the model's linear layers (`hidden_size`, `num_attention_heads *
    head_dim`, `intermediate_size`, ... and the same in each sub-config, as `text_config.hidden_size`)."""
    sizes: dict[str, int] = {}
    holders = [("", config)] + [(f"{key}.", config[key]) for key in _SUB_CONFIGS if isinstance(config.get(key), dict)]
    for prefix, holder in holders:
        hidden = _first(holder, _HIDDEN)
        if hidden:
            sizes[prefix + hidden[0]] = hidden[1]
        for key in _FEED_FORWARD:
            if (value := _size(holder, key)) is not None:
                sizes[prefix + key] = value
        if hidden and "n_inner" in holder and holder["n_inner"] is None:  # GPT-2: 4 x n_embd
            sizes[f"4 * {prefix}{hidden[0]}"] = 4 * hidden[1]
        if hidden and isinstance(holder.get("mlp_ratio"), (int, float)) and holder["mlp_ratio"] > 0:  # DINOv2
            sizes[f"{prefix}mlp_ratio * {prefix}{hidden[0]}"] = int(hidden[1] * holder["mlp_ratio"])
        heads, head_size = _first(holder, _HEADS), _first(holder, _HEAD_SIZE)
        if heads and head_size and (not hidden or heads[1] * head_size[1] != hidden[1]):
            sizes[f"{prefix}{heads[0]} * {prefix}{head_size[0]}"] = heads[1] * head_size[1]
    return sizes


def dividing_group_size(sizes, at_most: int) -> int | None:
    """The largest power of two up to `at_most` (at least 16) that divides every size, None if none does."""
    common = math.gcd(*sizes) if sizes else 0
    size = 1 << (max(at_most, 1).bit_length() - 1)
    while size >= 16:
        if common % size == 0:
            return size
        size //= 2
    return None


def group_size_problems(section: dict, target_path: list, config: dict, config_source: str = "config.json",
                        ) -> list[Problem]:
    """A grouped weight quantization (`nncf_weights` in a 4-bit mode) whose group size, stated or NNCF's default, does
    not divide a layer's input size: one problem on the group size (or the mode, when the default is meant), with
    the layers it does not divide and a group size that works (or -1, per channel, where no power of two does)."""
    if section.get("method") != "nncf_weights":
        return []
    params = section.get("params") or {}
    mode = params.get("mode", "int8_asym")
    if mode not in GROUPED_NNCF_MODES:
        return []
    group = params.get("group_size", GROUPED_NNCF_MODES[mode])
    if not isinstance(group, int) or isinstance(group, bool) or group <= 0:
        return []  # -1 (per channel) divides everything; a wrong type is the section check's
    undivided = _undivided_layers(config, group)
    if undivided is None:
        return []
    layers, works = undivided
    base = ".".join(map(str, [*target_path, "quantization", "params"]))
    stated = "group_size" in params
    path = f"{base}.group_size" if stated else f"{base}.mode"
    what = f"group_size {group}" if stated else f"{mode} groups {group} weights by default (NNCF) and"
    if mode == "mxfp4":
        fix = "mxfp4 groups 32 weights always: use another mode (int4_asym with a group size that divides them)"
    elif works:
        fix = f"{'use' if stated else 'add'} group_size {works}, which divides every layer's input"
    else:
        fix = "use group_size -1 (one scale per output channel)"
    return [_problem(path, what, layers, config_source, fix)]


def variant_group_size_problems(target: dict, target_path: list, config: dict, config_source: str = "config.json",
                                ) -> list[Problem]:
    """A target's variants (`hfexport.quantization.variants`) whose stated `group_size` does not divide a layer's
    input size: one problem on it, with the layers and a group size that works. An unstated one is resolved from the
    same sizes when the variant is made (`hfexport.formats.openvino.variants.group_size`)."""
    problems = []
    for index, item in enumerate(target.get("variants") or []):
        group = item.get("group_size") if isinstance(item, dict) else None
        if not isinstance(group, int) or isinstance(group, bool) or group <= 0:
            continue
        undivided = _undivided_layers(config, group)
        if undivided is None:
            continue
        layers, works = undivided
        fix = f"use group_size {works}, which divides every layer's input" if works else \
            "use group_size -1 (one scale per output channel)"
        path = ".".join(map(str, [*target_path, "variants", index, "group_size"]))
        refused = _REFUSED_BY.get(item.get("name"), _REFUSED_BY["int4"])
        problems.append(_problem(path, f"group_size {group}", layers, config_source, fix, refused))
    return problems


def _undivided_layers(config: dict, group: int) -> tuple[str, int | None] | None:
    """The layers whose input size `group` does not divide (as `name = size, ...`) and the largest group size that
    divides them all (None: no power of two does); None when `group` divides every layer."""
    sizes = layer_input_sizes(config)
    bad = {key: value for key, value in sizes.items() if value % group}
    if not bad:
        return None
    return ", ".join(f"{key} = {value}" for key, value in bad.items()), dividing_group_size(sizes.values(), group)


#: who refuses a group size that does not divide a layer, and when, per variant
_REFUSED_BY = {"int4": "NNCF would refuse it after the export",
               "8da4w": "torchao cannot group their weights (optimum-executorch leaves such layers in float32)"}


def _problem(path: str, what: str, layers: str, config_source: str, fix: str,
             refused: str = _REFUSED_BY["int4"]) -> Problem:
    return Problem(path, f"{what} does not divide the input size of the model's layers ({layers}, {config_source}):"
                         f" {refused}; {fix}")
