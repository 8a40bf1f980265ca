"""A dry plan: what a recipe asks of the model checked against the model itself, before anything is downloaded
but its config.json. The model is built from its config on torch's meta device (no weights read, no memory for
them); its class says whether it generates and its `forward` which inputs it takes. The Space's live check runs
this as the visitor types, so a recipe that cannot work is an error on its line before Convert is enabled, not a
failure a second after the click (`build_plan` finds the same problems once the model is loaded)."""

from __future__ import annotations

import functools
import inspect
import json

from hfexport.errors import Problem
from hfexport.models import TASK_AUTO_CLASSES, infer_task, model_class_for
from hfexport.recipe.data import Recipe


def model_problems(recipe: Recipe, config: dict, config_source: str = "config.json") -> list[Problem]:
    """Each target's mode and input names against the model `config` describes: a `generation` target of a model
    that does not generate, a `dynamic_shapes` input its `forward` does not take. Empty when the model cannot be
    built from its config here (a custom architecture: the export itself then says what is wrong)."""
    try:
        model = _meta_model(json.dumps(config, sort_keys=True), recipe.task, recipe.model_class)
    except Exception:  # noqa: BLE001 - a config transformers cannot build: nothing to check it against here
        return []
    name = type(model).__name__
    task = recipe.task or infer_task(model.config)
    takes = _forward_inputs(model)
    problems = []
    for target_name in recipe.target_names:
        target = recipe.target(target_name)
        where = f"targets.{target_name}"
        if target.mode == "generation" and not model.can_generate():
            problems.append(Problem(f"{where}.mode", f"\"generation\" needs a model that generates; {name} (task "
                                    f"{task!r}, from {config_source}) does not: use \"forward\""))
        if target.mode == "forward" and isinstance(target.dynamic_shapes, dict) and takes:
            for key in target.dynamic_shapes:
                if key not in takes:
                    problems.append(Problem(f"{where}.dynamic_shapes.{key}", f"{name} takes no input named "
                                            f"{key!r}; its inputs: {', '.join(takes)}"))
    return problems


def warm_up() -> None:
    """Import what a dry plan needs (torch, transformers' model classes) now, in a background thread of a server,
    so that the first live check does not wait for the imports."""
    import threading

    def load() -> None:
        import torch  # noqa: F401
        from transformers import AutoConfig, AutoModel  # noqa: F401

    threading.Thread(target=load, name="hfexport-dry-plan-warm-up", daemon=True).start()


def _forward_inputs(model) -> list[str]:
    """The named inputs of the model's `forward` (not its `**kwargs`)."""
    kinds = (inspect.Parameter.POSITIONAL_OR_KEYWORD, inspect.Parameter.KEYWORD_ONLY)
    return [name for name, parameter in inspect.signature(model.forward).parameters.items()
            if parameter.kind in kinds and name != "self"]


@functools.lru_cache(maxsize=4)
def _meta_model(config_json: str, task: str | None, model_class: str | None):
    """The model class a job would load (`models.model_class_for`), built from the config on the meta device."""
    import torch
    from transformers import AutoConfig

    document = json.loads(config_json)
    config = AutoConfig.for_model(document.pop("model_type"), **document)
    cls = model_class_for(config, task if task in TASK_AUTO_CLASSES else None, model_class)
    with torch.device("meta"):
        return cls.from_config(config) if hasattr(cls, "from_config") else cls(config)  # an Auto class, or one
