"""`AutoHfExporter.from_pretrained`: an exporter bound to a model owner's recipe target.

The engine's `AutoHfExporter`/`AutoExportConfig` are extended, not wrapped: `from_config` and `from_dict` work as
in the engine (with format strings converted to `ExportFormat`), and `supports_export_format` says which half of
a backend (config class or exporter) is missing.
"""

from __future__ import annotations

import contextlib
import importlib.util
import warnings
from pathlib import Path
from typing import Any

from transformers.exporters import AutoExportConfig as _EngineAutoExportConfig
from transformers.exporters import AutoHfExporter as _EngineAutoHfExporter

from hfexport.errors import Problem, RecipeError
from hfexport.engine import export_backends, exporter_class, traced_cache_layout
from hfexport.formats.executorch.llm_program import export as export_llm_program
from hfexport.exported import ExportedModel
from hfexport.formats import find_format
from hfexport.formats.programs import format_program
from hfexport.workarounds.torch_export import trace_state_released
from hfexport.workarounds.transformers_models import base_rope_index, modeling_fixes
from hfexport.models import load_model, load_processor
from hfexport.plan import build_plan
from hfexport.plan.tracing import engine_config
from hfexport.recipe.loading import load_recipe
from hfexport.recipe.data import Recipe

class AutoExportConfig(_EngineAutoExportConfig):
    """The engine's `AutoExportConfig`; `export_format` strings become `ExportFormat` members."""

    @classmethod
    def from_dict(cls, export_config_dict: dict):
        from transformers.exporters import ExportFormat

        values = dict(export_config_dict)
        if isinstance(values.get("export_format"), str):
            try:
                values["export_format"] = ExportFormat(values["export_format"])
            except ValueError:
                pass  # the engine names the registered formats
        return super().from_dict(values)


class AutoHfExporter(_EngineAutoHfExporter):
    """The engine's `AutoHfExporter`, plus `from_pretrained` (recipe-bound) and `supports_export_format`."""

    @classmethod
    def supports_export_format(cls, export_config: dict) -> bool:
        """True only when the format has both a config class and an importable exporter; else warn which is missing."""
        export_format = export_config.get("export_format")
        backend = export_backends().get(export_format)
        if backend is None:
            warnings.warn(
                f"No config class and no exporter are registered for export_format={export_format!r} "
                f"(registered: {', '.join(sorted(map(str, export_backends())))}). Register both with "
                "`hfexport.register_backend(MyExporter)`, whose `config_class` names the config.",
                stacklevel=2,
            )
            return False
        extra = find_format(export_format).extra if find_format(export_format) else None
        install = f"`pip install 'hfexport[{extra}]'`" if extra else "installing its packages"
        try:
            exporter = exporter_class(export_format)
        except ImportError as error:
            warnings.warn(
                f"The config class {backend.config.__name__} is registered for {export_format!r}, but its exporter "
                f"cannot be imported ({error}); fix it by {install}.",
                stacklevel=2,
            )
            return False
        missing = [name for name in exporter.required_packages if importlib.util.find_spec(name) is None]
        if missing:
            warnings.warn(
                f"The config class {backend.config.__name__} is registered for {export_format!r}, but its exporter "
                f"{exporter.__name__} lacks the packages {', '.join(missing)}; fix it by {install}.",
                stacklevel=2,
            )
            return False
        return True

    @classmethod
    def from_pretrained(
        cls,
        name_or_path: str | Path,
        target: str | None = None,
        revision: str | None = None,
        token: str | None = None,
        recipe: str | Path | dict | Recipe | None = None,
        trust_remote_code: bool = False,
        **overrides: Any,
    ) -> RecipeExporter:
        """An exporter bound to one target of the owner's recipe, the settings they validated.

        Only the recipe (`export_config.json`, or `config.json`'s `export_config`) is read here; the weights load on
        `.export()` / `.load_model()`.

        Args:
            name_or_path (`str` or `Path`): a local model folder or a Hub repo id.
            target (`str`, *optional*): the recipe target (default: the recipe's `default_target`).
            revision (`str`, *optional*): the Hub revision (branch, tag, commit).
            token (`str`, *optional*): a Hub token for private or gated repos.
            recipe (*optional*): a recipe to use instead of the model's own (a path, folder, repo id, dict or
                `Recipe`).
            trust_remote_code (`bool`): passed to transformers when the model loads.
            overrides: engine options for the target (e.g. `opset_version=18`), validated like the recipe.

        Returns:
            `RecipeExporter`.

        Raises:
            RecipeNotFoundError: the model has no recipe (and none was given).
            RecipeError: the recipe, or the overrides, are invalid: every problem with its JSON path.
            UnknownTargetError: `target` is not in the recipe.
            SourceError: the folder or repo cannot be read.
        """
        loaded = load_recipe(recipe if recipe is not None else name_or_path, revision=revision, token=token)
        name = loaded.target(target).name
        if overrides:
            loaded = loaded.with_target_overrides(name, **overrides)
        return RecipeExporter(loaded, name, source=name_or_path, revision=revision, token=token,
                              trust_remote_code=trust_remote_code)


class RecipeExporter:
    """An exporter bound to one recipe target (`AutoHfExporter.from_pretrained` makes one).

    Args:
        recipe (`Recipe`): the validated recipe.
        target (`str`): the name of the target in it.
        source (`str` or `Path`, *optional*): the model folder or repo the recipe came from; `.export()` without a
            model loads it from there.
        revision, token, trust_remote_code: how to load `source`.

    `.config` is the engine config of the target's options, `.plan(model)` resolves the target against a model
    (nothing traced), `.export(model=None, inputs=None)` exports it and returns an `ExportedModel`.
    """

    def __init__(self, recipe: Recipe, target: str, source: str | Path | None = None, revision: str | None = None,
                 token: str | None = None, trust_remote_code: bool = False):
        self.recipe = recipe
        self.target = recipe.target(target)
        self.source, self.revision, self.token = source, revision, token
        self.trust_remote_code = trust_remote_code
        self._processor = None

    def __repr__(self) -> str:
        return f"RecipeExporter(target={self.target.name!r}, format={self.target.export_format!r}, mode={self.target.mode!r})"

    @property
    def config(self):
        """The engine config of the target's options (dims are resolved against inputs by `.plan()`)."""
        return engine_config(self.target, self.target.options, None if self.target.dynamic_shapes is None else {})

    def load_model(self):
        """The source model, loaded with the class the recipe's task or the config names."""
        if self.source is None:
            raise ValueError("This exporter has no source model: pass a model to export()")
        return load_model(self.source, self.recipe, self.revision, self.token, self.trust_remote_code)

    def processor(self):
        if self._processor is None and self.source is not None:
            self._processor = load_processor(self.source, self.revision, self.token)
        return self._processor

    def plan(self, model, inputs: dict | None = None):
        """The resolved plan for `model`: engine configs with dims, inputs, components; nothing traced."""
        return build_plan(self.recipe, self.target.name, model, inputs, self.processor() if inputs is None else None,
                          source=self.source, revision=self.revision, token=self.token)

    def export(self, model=None, inputs: dict | None = None) -> ExportedModel:
        """Export `model` (the source model when None) the way the recipe target says; inputs synthesized if None."""
        model = model if model is not None else self.load_model()
        return run_plan(self.plan(model, inputs), model)


def _drop_model_output_samples(exported) -> None:
    """A `.pt2` saves its program's example inputs as a pickle; an encoder-decoder's prefill/decode were traced with
    `encoder_outputs`, a transformers `BaseModelOutput` (an OrderedDict subclass), which torch's weights-only
    unpickler cannot rebuild ("Can only SETITEM for dict ..."), so hfexport's load check refused the file. The
    example inputs are not needed to run the program (the signature's specs are): drop them for such programs."""
    import torch
    from transformers.utils import ModelOutput

    for component in exported.components.values():
        program = component.program
        if not isinstance(program, torch.export.ExportedProgram) or program.example_inputs is None:
            continue
        leaves = torch.utils._pytree.tree_leaves(program.example_inputs, is_leaf=lambda x: isinstance(x, ModelOutput))
        if any(isinstance(leaf, ModelOutput) for leaf in leaves):
            program.example_inputs = None  # the public setter allows None ("This is allowed", torch 2.13)


@contextlib.contextmanager
def _format_fixes(plan, model):
    """hfexport's narrow fixes of a backend's lowering (its format's `export_fixes`: ExecuTorch's, onnxscript's) and of
    the model's code under torch.export (hfexport.workarounds.transformers_models), for the plan's format; on leaving,
    what torch keeps of the block's traces let go (hfexport.workarounds.torch_export)."""
    with contextlib.ExitStack() as stack:
        stack.enter_context(trace_state_released())
        stack.enter_context(format_program(plan.export_format).export_fixes(plan, model))
        stack.enter_context(modeling_fixes(model, str(plan.export_format)))
        yield


def run_plan(plan, model) -> ExportedModel:
    """The engine call a plan stands for: `export` for mode forward, `export_for_generation` for generation."""
    if plan.target.dtype and plan.target.mode == "generation" and getattr(model.config, "is_encoder_decoder", False):
        # the two graphs of encoder_model.onnx + decoder_model_merged.onnx would be converted but published under the
        # float32 names, which transformers.js and optimum load as float32: refused rather than published misnamed
        raise RecipeError(Problem(f"targets.{plan.target.name}.dtype", "float16 is for decoder-only generation and "
                                  "forward targets: an encoder-decoder's encoder_model.onnx + decoder_model_merged.onnx "
                                  "have no float16 names in hfexport's layout yet"))
    if plan.llm_runner is not None:
        # ExecuTorch's LLM runner contract: hfexport's own export (the engine cannot add the runner's metadata methods
        # nor hold the cache in the program; hfexport.formats.executorch.llm_program says why), with the same lowering fixes
        with _format_fixes(plan, model):
            return ExportedModel.from_engine(export_llm_program(model, plan.components["model"].config,
                                                                plan.target.generation))
    exporter = AutoHfExporter.from_config(next(iter(plan.components.values())).config)
    with _format_fixes(plan, model):
        if plan.mode == "forward":
            # the rope positions the engine's preparers compute on the base model, where they miss them on the model
            # (hfexport.workarounds.transformers_models.base_rope_index; the plan's shapes include them)
            exported = exporter.export(model, base_rope_index(model, dict(plan.inputs)), plan.config)
        else:
            configs = plan.config
            # hfexport's own components (an encoder-decoder's encoder, a VLM's image encoder and embedding merge:
            # hfexport.plan), which transformers 5.23's export_for_generation does not capture; it exports the rest.
            # A retraced one (an audio encoder on one clip) keeps its config for the engine, whose split holds it too.
            own = {name: exporter.export(module, dict(inputs), configs[name] if name in plan.retraced
                                         else configs.pop(name)).components["model"]
                   for name, (module, inputs) in plan.own_components.items()}
            if configs:
                with traced_cache_layout():  # the capture holds the cache layers as the trace does (sliding windows)
                    exported = exporter.export_for_generation(
                        model, dict(plan.trace_inputs or plan.inputs), configs,
                        generation_config=plan.generation_config, multi_token_decode=plan.multi_token_decode,
                    )
            else:  # every component is hfexport's own (a state-space decode without its prefill: hfexport.plan)
                exported = ExportedModel(own, exporter.export_format, config=model.config,
                                         generation_config=plan.generation_config)
                own = {}
            if own:
                exported.components = {**own, **exported.components, **{name: own[name] for name in plan.retraced}}
                _drop_model_output_samples(exported)
        if exported.generation_config is None and getattr(model, "generation_config", None) is not None:
            # transformers 5.23: `export_for_generation(generation_config=None)` traces with the model's generation
            # config but keeps None on the ExportedModel, so `save_pretrained` wrote no generation_config.json and
            # a loader lost the EOS/pad tokens and limits the export was made with.
            import copy

            exported.generation_config = copy.deepcopy(model.generation_config)
    # the format's rewrites of the engine's programs for its runtime's fusions (OpenVINO's fused KV-cache attention,
    # onnxruntime's RMSNorm and attention fusions: hfexport.formats.*.workarounds)
    format_program(plan.export_format).after_export(exported)
    result = ExportedModel.from_engine(exported)
    result.save_dtype = plan.target.dtype  # a float16 ONNX target: converted as it is saved (hfexport.formats.onnx.float16)
    result.source_model = model  # what a runtime's layout makes graphs of its own from (OpenVINO: VLMPipeline's Qwen2-VL)
    # what running the engine's input preparers again needs, per component whose inputs they added to
    result.input_preparers = {name: component.preparer_context for name, component in plan.components.items()
                              if component.preparer_context and name in result.components}
    return result
