"""A model run with its weights streamed from the checkpoint's shards, block by block, for the gate's eager reference
of a job exported from its structure (issue 45): the float32 model is never in memory, only the block that runs.

`streamed_model(twin, tensors)` builds a second placeholder model of the twin's class and config
(`hfexport.rebind.placeholders`: real buffers, parameters that take no memory) and hooks its blocks: before a block
runs, its parameters are read from `tensors` (`hfexport.rebind.checkpoint.CheckpointTensors`, at the export's dtype:
a bfloat16 checkpoint's tensors widened to float32, as `from_pretrained(dtype=float32)` widens them) and put in
place; once it has run (or failed), its placeholders are put back and the tensors dropped. A block is a module of
one of the model's `_no_split_modules` classes (a decoder layer: transformers' own unit of offloading), and every
other module that holds parameters of its own (embeddings, final norm, head). The computation is the loaded
model's, with the same tensors, layer after layer; the memory is one block's weights, and each forward reads the
checkpoint again (the page cache usually holds it). A vocabulary's embedding and head larger than
`VOCABULARY_BLOCK_BYTES` (Llama-3.2-1B's tied 128256 x 2048 table: 1 GB at float32) are never read whole: the
embedding reads the rows its ids name, the head computes its logits a block of rows at a time. accelerate's offload hooks do the same, but accelerate is not
among this project's dependencies.

A model whose code reads a parameter outside the module that holds it (not through that module's forward) would
read a placeholder there: its reference is then wrong, and the gate fails rather than passes.
"""

from __future__ import annotations

import copy
from contextlib import contextmanager

from hfexport.rebind.placeholders import placeholder_model


def streamed_model(twin, tensors, resident_bytes: int = 0):
    """A model of `twin`'s class and config, in eval mode, whose blocks read their weights from `tensors` (a mapping
    from state_dict key to tensor) while they run. Tied parameters are read under the key the checkpoint holds.
    `resident_bytes`: how much of the converted weights the model may keep between forwards (the first blocks that
    fit, once read), so that a machine with memory to spare does not convert them on every forward; 0 keeps none."""
    model = placeholder_model(twin.config, type(twin), dtype=twin.dtype)
    model.generation_config = copy.deepcopy(twin.generation_config)
    names = _parameter_names(model, tensors)
    budget = [max(0, int(resident_bytes))]
    vocabulary = _vocabulary(model, tensors)
    for module in vocabulary:
        _in_blocks(module, names[id(module.weight)], tensors)
    for block, own in _blocks(model):
        if block in vocabulary:
            continue
        hooks = _Block({leaf: names[id(parameter)] for leaf, parameter in _parameters(block, own)}, tensors, budget)
        block.register_forward_pre_hook(hooks.load)
        block.register_forward_hook(hooks.unload, always_call=True)
    model._streamed_from = tensors
    return model


#: An input embedding or output head whose weight is larger than this (bytes, at the model's dtype) is read in blocks
#: of rows of about this size while it runs (`_vocabulary`): Llama-3.2-1B's 128256 x 2048 table is 1 GB at float32.
VOCABULARY_BLOCK_BYTES = 64 << 20


def _vocabulary(model, tensors) -> list:
    """The model's input embedding (`torch.nn.Embedding`) and output head (`torch.nn.Linear`, no bias), each where it
    is a block of its own (not inside a `_no_split_modules` one), its weight larger than `VOCABULARY_BLOCK_BYTES` and
    `tensors` reads blocks of rows (`rows`)."""
    import torch

    if not hasattr(tensors, "rows"):
        return []
    inside = {id(module) for block, own in _blocks(model) if not own for module in block.modules()}
    found = []
    for module, kind in ((model.get_input_embeddings(), torch.nn.Embedding),
                         (model.get_output_embeddings(), torch.nn.Linear)):
        if isinstance(module, kind) and id(module) not in inside and module.weight.nbytes > VOCABULARY_BLOCK_BYTES \
                and getattr(module, "bias", None) is None and (kind is torch.nn.Embedding or type(module) is kind):
            found.append(module)
    return found


def _in_blocks(module, key: str, tensors) -> None:
    """`module` (a `_vocabulary` one) run from `tensors[key]` a block of rows at a time: an embedding reads the rows
    its input ids name (the ids renumbered into that small table; its `padding_idx`, which only gradients use, unset
    meanwhile); a head computes its outputs `VOCABULARY_BLOCK_BYTES` of weight rows at a time into one output, the
    values the whole weight gives. The full table is never in memory."""
    import torch

    placeholder = module.weight
    if isinstance(module, torch.nn.Embedding):
        padding = module.padding_idx

        def load(_module, args, kwargs):
            ids = args[0] if args else kwargs["input"]
            unique, inverse = torch.unique(ids, return_inverse=True)
            table = tensors.take(key, unique.tolist()) if len(unique) else placeholder.new_empty((0, placeholder.shape[1]))
            module._parameters["weight"] = torch.nn.Parameter(table.to(placeholder.dtype), requires_grad=False)
            module.padding_idx = None
            return (inverse.reshape(ids.shape), *args[1:]), {k: v for k, v in kwargs.items() if k != "input"}

        def unload(_module, _args, _output):
            module._parameters["weight"], module.padding_idx = placeholder, padding

        module.register_forward_pre_hook(load, with_kwargs=True)
        module.register_forward_hook(unload, always_call=True)
        return
    module.forward = _linear_in_blocks(placeholder, lambda start, stop: tensors.rows(key, start, stop).to(
        placeholder.dtype))


def _linear_in_blocks(weight, rows, bias=None):
    """A linear layer's forward over `weight`'s rows read `VOCABULARY_BLOCK_BYTES` at a time (`rows(start, stop)`:
    those rows, at `weight`'s dtype), each block's outputs (`bias`'s slice added) into one output: the values the
    whole weight gives, the whole weight never in memory."""
    import torch

    count, width = weight.shape
    step = max(1, VOCABULARY_BLOCK_BYTES // (width * weight.element_size()))

    def forward(hidden):
        out = hidden.new_empty((*hidden.shape[:-1], count))
        for start in range(0, count, step):
            block = rows(start, min(count, start + step))
            out[..., start:start + block.shape[0]] = torch.nn.functional.linear(
                hidden, block, None if bias is None else bias[start:start + block.shape[0]])
        return out

    return forward


@contextmanager
def placeholders_in_blocks(model):
    """While open, each `torch.nn.Linear` of `model` whose weight is a placeholder (`hfexport.rebind.placeholders`:
    one row expanded, stride 0 over the rows) larger than `VOCABULARY_BLOCK_BYTES` computes its outputs a block of
    rows at a time (`_linear_in_blocks`, the rows sliced from the placeholder): for the job's plan, which runs the
    twin (the engine's split of `generate`). torch's linear copies a stride-0 weight whole before its matrix product,
    on every forward: Llama-3.2-1B's 128256 x 2048 head, 1 GB at float32, was the plan stage's peak (issue 45). The
    values are the whole weight's; outside the block (the export traces the twin) the layers are as they were. A model
    with no such layer (a loaded one) runs as it is."""
    import torch

    swapped = []
    for module in model.modules():
        weight = getattr(module, "weight", None)
        if type(module) is torch.nn.Linear and "forward" not in vars(module) and isinstance(weight, torch.Tensor) \
                and weight.dim() == 2 and weight.stride(0) == 0 and weight.nbytes > VOCABULARY_BLOCK_BYTES:
            module.forward = _linear_in_blocks(weight, lambda start, stop, weight=weight: weight[start:stop],
                                               module.bias)
            swapped.append(module)
    try:
        yield model
    finally:
        for module in swapped:
            del module.forward


def is_streamed(model) -> bool:
    """Whether `model` is a `streamed_model` (its parameters placeholders outside its forward)."""
    return getattr(model, "_streamed_from", None) is not None


def _parameter_names(model, tensors) -> dict[int, str]:
    """Each parameter's key in `tensors`; a tied one's is the first of its names that `tensors` holds (the
    checkpoint saves a tie once), else the first that `model` lists."""
    names: dict[int, list[str]] = {}
    for name, parameter in model.named_parameters(remove_duplicate=False):
        names.setdefault(id(parameter), []).append(name)
    return {ident: next((name for name in group if name in tensors), group[0]) for ident, group in names.items()}


def _blocks(model):
    """(module, own) for each block: a `_no_split_modules` module with all its parameters (own False), or another
    module with parameters of its own (own True), outside any such block."""
    whole = set(getattr(model, "_no_split_modules", None) or ())

    def walk(module):
        if type(module).__name__ in whole and module is not model:
            yield module, False
            return
        if any(parameter is not None for parameter in module._parameters.values()):
            yield module, True
        for child in module.children():
            yield from walk(child)

    return list(walk(model))


def _parameters(block, own: bool):
    """(the dotted name inside `block`, the parameter) of the block's parameters, each tied one once per place."""
    if own:
        return [(name, parameter) for name, parameter in block._parameters.items() if parameter is not None]
    return list(block.named_parameters(remove_duplicate=False))


def _owner(block, leaf: str):
    *path, name = leaf.split(".")
    module = block
    for part in path:
        module = getattr(module, part)
    return module, name


class _Block:
    """One block's hooks: its parameters read from `tensors` before it runs (or taken from what it kept), its
    placeholders put back after; the tensors kept for the next forward while `budget` (shared by all blocks: bytes
    left) allows, else dropped."""

    def __init__(self, keys: dict[str, str], tensors, budget: list[int]):
        self.keys, self.tensors, self.budget = keys, tensors, budget
        self.placeholders: dict[str, object] = {}
        self.kept: dict[str, object] | None = None

    def load(self, block, _args) -> None:
        import torch

        loaded = {}
        for leaf, key in self.keys.items():
            module, name = _owner(block, leaf)
            placeholder = self.placeholders.setdefault(leaf, module._parameters[name])
            if self.kept is not None:
                module._parameters[name] = self.kept[leaf]
                continue
            tensor = self.tensors[key]
            if tuple(tensor.shape) != tuple(placeholder.shape):
                raise ValueError(f"{key}: the checkpoint holds shape {tuple(tensor.shape)}, the model "
                                 f"{tuple(placeholder.shape)}")
            module._parameters[name] = loaded[leaf] = torch.nn.Parameter(tensor.to(placeholder.dtype),
                                                                         requires_grad=False)
        size = sum(parameter.nbytes for parameter in loaded.values())
        if loaded and size <= self.budget[0]:
            self.kept, self.budget[0] = loaded, self.budget[0] - size

    def unload(self, block, _args, _output) -> None:
        for leaf, placeholder in self.placeholders.items():
            module, name = _owner(block, leaf)
            module._parameters[name] = placeholder
