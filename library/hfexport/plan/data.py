"""The plan's data: one target resolved against one model, per component the engine config and traced shapes."""

from __future__ import annotations

import copy
from dataclasses import dataclass, field
from typing import Any

from hfexport.recipe.data import Recipe, Target


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
    # those of hfexport's own components that the engine's split also holds, traced again on other kwargs (an audio
    # encoder on one clip: `hfexport.plan.vision_language.encoder_embed_stages`); the engine still needs their config
    retraced: tuple[str, ...] = ()
    trace_inputs: dict | None = None  # generate kwargs the engine traces with, when not `inputs` (seq2seq)
    # A state-space model whose prefill this format would trace at the sample's length only
    # (`hfexport.workarounds.transformers_models.prefill_by_decode`): no prefill is exported, generate runs the prompt through decode.
    prefill_by_decode: bool = False
    # `generation.single_graph`: the multi-token decode alone, which runs the prompt on an empty cache too (no prefill).
    single_graph: bool = False
    # ExecuTorch's LLM runner contract (`hfexport.formats.executorch.llm_program`): one program `model` that holds its cache, exported
    # by hfexport itself; the cache size it holds.
    llm_runner: int | None = None
    # The memory its programs allocate at load where the format plans it for the dims' upper bounds
    # (`hfexport.plan.memory_plan.estimate_memory_plan`); None where it does not, or the bounds are the engine's.
    memory_plan: dict | None = None

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
