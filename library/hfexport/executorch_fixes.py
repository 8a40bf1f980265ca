"""Narrow fixes for ExecuTorch's lowering, applied around the engine's ExecuTorch export (`executorch_fixes()`).

executorch 1.5.1 (with transformers 5.23's ExecuTorch exporter): `to_edge` checks every edge op's dtypes with
`EdgeOpArgValidator`, which walks a node's returned values against its schema's returns. For an op with a single
`Tensor[]` return (`aten.split_copy.Tensor`, `split_with_sizes_copy`, `unbind_copy`, ...) the node's value is the
list itself, but the validator iterates it as if each tensor were one return, so the "list" it inspects is the first
tensor and `len(tensor)` evaluates that tensor's first dim. When that dim is dynamic (the batch of GPT-2's
`c_attn(...).split(...)`), evaluating it adds the guard `batch == <traced batch>`: the whole program specializes the
batch, and ExecuTorch's memory plan gives an `arange(batch)` a static output, so any other batch fails at run time
with `method->execute() failed with error 0x12` ("Attempted to resize a static tensor"). The fix hands the validator
such a node's value as the one-element sequence of returns it expects, for the duration of that check only.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator


def _single_tensor_list_return(target) -> bool:
    import torch

    schema = getattr(target, "_schema", None)
    returns = getattr(schema, "returns", None)
    return bool(returns) and len(returns) == 1 and returns[0].type == torch.ListType.ofTensors()


@contextlib.contextmanager
def executorch_fixes() -> Iterator[None]:
    """Within the block, ExecuTorch's dtype validator no longer specializes a dynamic dim of a split's outputs."""
    try:
        from executorch.exir.verification.arg_validator import EdgeOpArgValidator
    except ImportError:  # ExecuTorch not installed: the engine reports that itself
        yield
        return
    original = EdgeOpArgValidator.call_function

    def call_function(self, target, args, kwargs):
        node = getattr(self, "node", None)
        value = node.meta.get("val") if node is not None else None
        if not (isinstance(value, list) and _single_tensor_list_return(target)):
            return original(self, target, args, kwargs)
        node.meta["val"] = [value]  # the returns: one Tensor[]
        try:
            return original(self, target, args, kwargs)
        finally:
            node.meta["val"] = value

    EdgeOpArgValidator.call_function = call_function
    try:
        yield
    finally:
        EdgeOpArgValidator.call_function = original
