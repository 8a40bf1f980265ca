"""What the engine traces with: its config object for the format, the inputs after its export input preparers
(and a record of what they did), and the calls `generate` makes, captured for hfexport's own components."""

from __future__ import annotations

import contextlib
import copy
import functools
import inspect
from typing import Any

from hfexport.engine import engine_format, export_backends
from hfexport.errors import PlanError
from hfexport.recipe.data import Target
from hfexport.workarounds.transformers_models import base_rope_index
from hfexport import preparers


def engine_config(target: Target, options: dict, dynamic_shapes: dict | None):
    """The engine's config object for the target's format, enums converted from their strings (a format registered
    with the engine under a name `ExportFormat` lacks, `register_backend`, keeps its string)."""
    export_format = engine_format(target.export_format)
    if export_format not in export_backends():
        raise PlanError(f"targets.{target.name}.export_format: the engine has no backend for {export_format!r} "
                        "(register one: hfexport.register_backend)")
    config_class = export_backends()[export_format].config
    options = dict(options)
    if dynamic_shapes is None:
        options.setdefault("dynamic", True)  # never pin an axis silently: AUTO on every axis, batch sample >= 2
    try:
        return config_class(export_format=export_format, dynamic_shapes=dynamic_shapes, **options)
    except (TypeError, ValueError) as error:
        raise PlanError(f"targets.{target.name}.options: {error}") from None


def traced_inputs(model, inputs: dict) -> dict:
    """Inputs as the engine traces them: after `prepare_for_export` (flags popped, preparer keys added); for a probe,
    its forward kwargs as the graph takes them (an `image_sizes` tensor becomes the Python ints the graph was
    specialized on)."""
    from transformers.exporters.utils import prepare_for_export

    _, prepared, _ = prepare_for_export(model, copy.copy(dict(inputs)))
    return base_rope_index(model, dict(prepared))


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
    """What the engine's export input preparers did to `inputs` (`prepared` = `traced_inputs(model, inputs)`): each
    input they added (`cu_seqlens`, `position_ids`, ...) and each they replaced (`image_sizes`: a tensor become Python
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


def preparer_context(module, record: dict) -> dict:
    """`hfexport.preparers.context` of a component whose inputs the engine's preparers added to ({} otherwise)."""
    added = [name for name, entry in record.items() if entry["kind"] == "added"]
    return preparers.context(module, added) if added else {}


@contextlib.contextmanager
def call_capture(owner, name: str):
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
