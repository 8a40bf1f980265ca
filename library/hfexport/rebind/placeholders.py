"""A model's structure without its weights, for tracing an export whose weights are written afterwards from the
checkpoint's shards (`hfexport.rebind.checkpoint`, issue 45).

`placeholder_model(config)` builds the model on the meta device, then gives every parameter a placeholder that
takes no memory: one row of `cols` values expanded over the parameter's shape (stride 0 on every other axis), the
row alternating +c, -c with a value c of its own per parameter. Unlike meta or fake tensors these are real tensors,
so everything the engine runs on a model runs on them (its prefill/decode split calls `model.generate`, which a meta
model fails); unlike zeros they are told apart after export, so the weight map is made by value as for any export
(`hfexport.rebind.weight_map.build`): no two parameters equal (the exporters would merge them), none constant, none
symmetric (a square matrix stored transposed is not the one stored as it is), each value exact in float16 and
bfloat16's range (c = (1 + k/1024) * 2**e, k < 1024; at most MAX_PARAMETERS). Buffers (rotary `inv_freq`, derived
from the config) are real: made as the model's own `_init_weights` makes them on a meta-loaded model.

What a placeholder export costs is what the exporter materializes from the parameters (the ONNX exporter folds each
linear weight's transpose into a new initializer), never the model's own copy; the map's stored tensors are then
overwritten, entry by entry, from the shards (`weight_map.apply(..., tensors=CheckpointTensors(...))`).
"""

from __future__ import annotations

import copy

from hfexport.errors import HfExportError
from hfexport.files import MANIFEST_FILE
from hfexport.formats.programs import format_program
from hfexport.rebind.folder import record
from hfexport.rebind.weight_map import apply, degenerate_keys
from hfexport.safety.artifacts import check_manifest_file

#: Placeholder values (1 + k/1024) * 2**e for e in 0..14 stay below float16's largest finite value.
MAX_PARAMETERS = 1024 * 15


def placeholder_value(index: int) -> float:
    """The c of the `index`-th parameter: distinct for every index below MAX_PARAMETERS, exact in float16."""
    exponent, step = divmod(index, 1024)
    return (1 + step / 1024) * 2.0 ** exponent


def placeholder(shape, dtype, value: float):
    """A tensor of `shape` whose every row (last axis) is +value, -value, +value, ... and that holds one row."""
    import torch

    shape = tuple(shape)
    row = torch.full((shape[-1] if shape else 1,), value, dtype=dtype)
    row[1::2] = -value
    return row.expand(shape) if shape else row.reshape(())


def placeholder_model(config, model_class, dtype=None):
    """The `model_class` model of `config` with placeholder parameters and real buffers, in eval mode. Raises
    ValueError where the structure cannot be made so (too many parameters, a module whose buffers are made together
    with its parameters)."""
    import torch

    with torch.device("meta"):
        model = model_class._from_config(config, **({"dtype": dtype} if dtype is not None else {}))
    replaced = {}
    for module in model.modules():
        for name, parameter in list(module._parameters.items()):
            if parameter is None:
                continue
            if id(parameter) not in replaced:
                if len(replaced) >= MAX_PARAMETERS:
                    raise ValueError(f"more than {MAX_PARAMETERS} parameters: no distinct placeholder for each")
                value = placeholder_value(len(replaced))
                replaced[id(parameter)] = torch.nn.Parameter(placeholder(parameter.shape, parameter.dtype, value),
                                                             requires_grad=False)
            module._parameters[name] = replaced[id(parameter)]
    for module in model.modules():
        meta = [name for name, buffer in module._buffers.items() if buffer is not None and buffer.is_meta]
        if not meta:
            continue
        if any(parameter is not None for parameter in module._parameters.values()):
            raise ValueError(f"{type(module).__name__} holds parameters and buffers made together: its buffers "
                             "cannot be made without its weights")
        for name in meta:
            module._buffers[name] = torch.empty_like(module._buffers[name], device="cpu")
        model._init_weights(module)
    return model.eval()


class StructureRefused(HfExportError):
    """The placeholder export cannot take the model's weights (the map does not explain every stored tensor): the
    target is exported from the model itself instead."""


def structure_for(plan, model):
    """(the plan, the placeholder twin of `model`) that `plan`'s export is traced from: the plan's own components
    (a single graph's decode, captured on the model) moved onto the twin. (plan, None) where the export needs the
    model's weights: a format without `traces_without_weights`, a forward target, a quantized one (but an OpenVINO
    int8-weight target: `FormatProgram.traced_without_weights`), OpenVINO's float16-compressed one, an own component
    that is not the model (an encoder-decoder's encoder, a vision-language model's image encoder), an ExecuTorch
    LLM-runner program, or a degenerate checkpoint (so the files are always those the weights export writes)."""
    if not traces_on(plan, model) or degenerate_keys(model):
        return plan, None
    try:
        twin = placeholder_model(copy.deepcopy(model.config), type(model), dtype=model.dtype)
    except ValueError:
        return plan, None
    if any(dict(twin.named_buffers()).keys() - dict(model.named_buffers()).keys()) \
            or dict(twin.named_parameters()).keys() != dict(model.named_parameters()).keys():
        return plan, None  # the config does not rebuild the model that was loaded
    twin.generation_config = copy.deepcopy(model.generation_config)
    twin_plan = copy.copy(plan)
    twin_plan.own_components = {name: (twin, inputs) for name, (_, inputs) in plan.own_components.items()}
    return without_quantizer(twin_plan), twin


def without_quantizer(plan):
    """`plan` with its components' engine configs copied without their quantizer: a quantized target traced from
    the twin is quantized once its weights are written (`FormatProgram.quantize_written`), never the placeholders."""
    if not plan.quantization:
        return plan
    plan = copy.copy(plan)
    plan.components = {name: copy.copy(component) for name, component in plan.components.items()}
    for component in plan.components.values():
        component.config = copy.copy(component.config)
        component.config.quantizer = None
    return plan


def plan_quantizer(plan):
    """The quantizer the plan's components were given (one for all of them: `hfexport.quantization.quantizer.attach`),
    None for an unquantized plan."""
    return next((component.config.quantizer for component in plan.components.values()
                 if getattr(component.config, "quantizer", None) is not None), None)


def traces_on(plan, model) -> bool:
    """Whether `plan`, made on `model`, can be exported from a placeholder twin of it (`structure_for`'s conditions
    but the degenerate checkpoint's)."""
    if not format_program(plan.target.export_format).traced_without_weights(plan.target.quantization,
                                                                           plan.target.options) \
            or plan.mode != "generation" or plan.llm_runner is not None:
        return False
    return made_on(plan, model)


def made_on(plan, model) -> bool:
    """Whether `plan`'s own components are `model` or shallow copies of it (always, for a plan without any): what an
    export of `plan` traces are their weights, whichever model it is run with (one made on the twin: placeholders)."""
    return all(_is_model(module, model) for module, _ in plan.own_components.values())


def _is_model(module, model) -> bool:
    """Whether `module` is `model` or a shallow copy of it (the engine's prefill/decode split returns copies)."""
    return type(module) is type(model) and all(
        mine is theirs for mine, theirs in zip(module.parameters(), model.parameters(), strict=True))


def write_weights(folder, structure, tensors, key: str) -> dict:
    """Make the weight map of the placeholder export saved in `folder` (traced from `structure`), then write
    `tensors` (the weights by state_dict key: a loaded model's, `weight_map.sources`, or a checkpoint's shards,
    `CheckpointTensors`) through it, entry by entry (`weight_map.apply`: each stored tensor written as it is made).
    Returns the map. Raises StructureRefused where the map leaves a stored tensor or a parameter unexplained (an
    exporter that computed a new tensor from the weights: its placeholder values would stay)."""
    weight_map = record(folder, structure, key)
    for field in ("degenerate", "uncovered", "unmapped"):
        if weight_map[field]:
            raise StructureRefused(f"the placeholder export's weight map has {field} {weight_map[field][0]}")
    if hasattr(tensors, "alias_parts"):  # a tied parameter the checkpoint saves once is read under its saved name
        tensors = tensors.alias_parts(weight_map)
    try:
        apply(folder, check_manifest_file(folder / MANIFEST_FILE), weight_map, tensors=tensors)
    finally:
        if hasattr(tensors, "close"):
            tensors.close()
    return weight_map
