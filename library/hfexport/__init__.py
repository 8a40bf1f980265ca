"""hfexport: owner-validated exports of Hugging Face models.

One import serves both hfexport's API and the engine's (`transformers.exporters`): names are resolved lazily,
so `import hfexport` stays cheap and a backend's packages load only when a target needs them.

The package follows the data flow (docs/architecture.md), bottom to top: foundation (`errors`, `files`,
`progress`, `hub`, `engine`, `runtime`, ...) → `models`/`inputs` → `recipe/` → `plan` → `export`/`exported`/
`generate`/`safety/` → `verify/` → `report/` → `publication/` → `job/` → `surfaces/` (CLI, action, webhook,
Space). Imports only go down.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING

from .version import __version__

# hfexport's own names -> module.
_OWN = {
    "AutoHfExporter": "export",
    "AutoExportConfig": "export",
    "RecipeExporter": "export",
    "ExportedModel": "exported",
    "Recipe": "recipe.data",
    "Target": "recipe.data",
    "load_recipe": "recipe.loading",
    "RecipeError": "errors",
    "HfExportError": "errors",
    "Plan": "plan",
    "build_plan": "plan",
    "run_job": "job.run",
    "JobOptions": "job.run",
    "JobReport": "report.data",
    "publish": "publication.publish",
    "load": "exported",
}

# The engine's public names, re-exported as they are.
_ENGINE = (
    "DynamoConfig",
    "DynamoExporter",
    "ExecutorchConfig",
    "ExecutorchExporter",
    "ExportConfigMixin",
    "ExportFormat",
    "ExportMetadata",
    "ExportedComponent",
    "ExportQuantizer",
    "HfExporter",
    "ModelRunner",
    "NNCFOnnxQuantizer",
    "NNCFOpenVINOQuantizer",
    "NNCFQuantizationConfig",
    "NNCFTorchFXQuantizer",
    "NNCFWeightCompressionConfig",
    "OnnxConfig",
    "OnnxExporter",
    "OnnxRuntimeDynamicConfig",
    "OnnxRuntimeQuantizer",
    "OnnxRuntimeStaticConfig",
    "OpenVINOConfig",
    "OpenVINOExporter",
    "PT2EQuantizer",
    "register_backend",
)
_ENGINE_UTILS = ("decompose_for_generation", "get_leaf_tensors", "prepare_for_export")

__all__ = sorted([*_OWN, *_ENGINE, *_ENGINE_UTILS, "__version__"])
_ENGINE_MODULES = ("export", "exported", "generate")  # they import transformers.exporters (torch) at import


def __getattr__(name: str):
    if name in _ENGINE or name in _ENGINE_UTILS or _OWN.get(name) in _ENGINE_MODULES:
        from .logs import import_engine

        import_engine()  # the engine's import-time chatter (torchao, torch's pytree warnings) goes to logging
    if name in _OWN:
        value = getattr(importlib.import_module(f".{_OWN[name]}", __name__), name)
    elif name in _ENGINE:
        value = getattr(importlib.import_module("transformers.exporters"), name)
    elif name in _ENGINE_UTILS:
        value = getattr(importlib.import_module("transformers.exporters.utils"), name)
    else:
        raise AttributeError(f"module 'hfexport' has no attribute {name!r}")
    globals()[name] = value
    return value


def __dir__():
    return __all__


if TYPE_CHECKING:  # pragma: no cover
    from .errors import HfExportError, RecipeError
    from .export import AutoExportConfig, AutoHfExporter, RecipeExporter
    from .exported import ExportedModel, load
    from .job.run import JobOptions, run_job
    from .plan import Plan, build_plan
    from .publication.publish import publish
    from .recipe.loading import load_recipe
    from .recipe.data import Recipe, Target
    from .report.data import JobReport
