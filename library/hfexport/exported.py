"""`ExportedModel`: the engine's exported-model class, extended by hfexport (loading published targets safely,
generation over prefill/decode graphs). Everything the engine's class does works unchanged."""

from __future__ import annotations

from transformers.exporters import ExportedModel as _EngineExportedModel


class ExportedModel(_EngineExportedModel):
    """The engine's `ExportedModel`, returned by every hfexport export."""

    @classmethod
    def from_engine(cls, exported: _EngineExportedModel) -> ExportedModel:
        """Re-class an engine result without copying its programs."""
        if isinstance(exported, cls):
            return exported
        return cls(
            exported.components, exported.export_format, config=exported.config,
            generation_config=exported.generation_config,
        )


def load(repo_or_path, target: str | None = None, revision: str | None = None, **kwargs) -> ExportedModel:
    """Load an export saved by hfexport: a target folder, or `exports/<target>` of a folder or Hub repo."""
    from pathlib import Path

    path = Path(str(repo_or_path))
    if target is None:
        return ExportedModel.from_pretrained(repo_or_path, revision=revision or "main", **kwargs)
    if path.is_dir():
        for candidate in (path / target, path / "exports" / target):
            if candidate.is_dir():
                return ExportedModel.from_pretrained(candidate, **kwargs)
    return ExportedModel.from_pretrained(repo_or_path, revision=revision or "main", subfolder=f"exports/{target}", **kwargs)
