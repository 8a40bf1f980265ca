"""`ExportedModel`: the engine's exported-model class, extended by hfexport (loading published targets safely,
generation over prefill/decode graphs). Everything the engine's class does works unchanged."""

from __future__ import annotations

import os
from pathlib import Path

from transformers.exporters import ExportedModel as _EngineExportedModel

from .errors import SourceError, redact
from .safety import MANIFEST_FILE, check_manifest_file

EXPORTS_FOLDER = "exports"


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

    def generate(self, input_ids, attention_mask=None, max_new_tokens: int = 20, eos_token_id=None,
                 pad_token_id=None):
        """Greedy decoding over the `prefill`/`decode` components, without the torch model (`hfexport.generate`):
        prompt + new tokens, as `model.generate(do_sample=False)` returns them. EOS and pad tokens default to the
        export's generation config, then its config."""
        from .generate import default_special_tokens, generate

        default_eos, default_pad = default_special_tokens(self)
        return generate(
            self, input_ids, attention_mask, max_new_tokens=max_new_tokens,
            eos_token_id=default_eos if eos_token_id is None else eos_token_id,
            pad_token_id=default_pad if pad_token_id is None else pad_token_id,
        )

    @classmethod
    def from_pretrained(
        cls,
        pretrained_model_name_or_path: str | Path,
        *,
        target: str | None = None,
        revision: str | None = "main",
        subfolder: str = "",
        token: str | bool | None = None,
        cache_dir: str | os.PathLike | None = None,
        force_download: bool = False,
        local_files_only: bool = False,
        **kwargs,
    ) -> ExportedModel:
        """The engine's `from_pretrained`, after checking the export's `export.json` (`hfexport.safety`).

        `target` picks a published target: `exports/<target>` of a Hub repo (or of a folder; an hfexport OUTPUT
        folder's `<target>` works too). From the Hub, the manifest is downloaded first, checked, and the engine then
        loads that same commit (the revision is pinned to the manifest's commit, so a branch that moves meanwhile
        cannot swap the files). A manifest naming anything but transformers' output/cache classes and builtin
        containers raises `UnsafeExportError` before the engine reads it.
        """
        revision = revision or "main"
        subfolder = _join(subfolder, _target_folder(target)) if target else subfolder
        path = Path(str(pretrained_model_name_or_path))
        if path.is_dir():
            if target and not (path / subfolder).is_dir() and (path / target).is_dir():
                subfolder = target  # an hfexport OUTPUT folder: OUTPUT/<target>
            manifest = path / subfolder / MANIFEST_FILE
            if not manifest.is_file():
                raise SourceError(f"no {MANIFEST_FILE} in {path / subfolder}: not an exported model"
                                  + _targets_hint(_local_targets(path)))
            check_manifest_file(manifest)
        else:
            revision = _checked_hub_manifest(str(pretrained_model_name_or_path), subfolder, revision, token,
                                             cache_dir, force_download, local_files_only)
        return super().from_pretrained(
            pretrained_model_name_or_path, revision=revision, subfolder=subfolder, token=token, cache_dir=cache_dir,
            force_download=force_download, local_files_only=local_files_only, **kwargs,
        )


def load(repo_or_path, target: str | None = None, revision: str | None = None, **kwargs) -> ExportedModel:
    """Load an export saved or published by hfexport: a target folder, `OUTPUT/<target>`, or `exports/<target>`
    of a folder or Hub repo (at `revision`, e.g. `refs/pr/3`), after the manifest safety check."""
    return ExportedModel.from_pretrained(repo_or_path, target=target, revision=revision or "main", **kwargs)


def _target_folder(target: str) -> str:
    if not target or "/" in target or "\\" in target or target in (".", "..") or target.startswith("."):
        raise SourceError(f"{target!r} is not a target name")
    return f"{EXPORTS_FOLDER}/{target}"


def _join(*parts: str) -> str:
    return "/".join(part.strip("/") for part in parts if part and part.strip("/"))


def _local_targets(folder: Path) -> list[str]:
    found = [p.parent.name for p in folder.glob(f"*/{MANIFEST_FILE}")]
    found += [p.parent.name for p in folder.glob(f"{EXPORTS_FOLDER}/*/{MANIFEST_FILE}")]
    return sorted(set(found))


def _targets_hint(targets: list[str]) -> str:
    return f" (targets found: {', '.join(targets)}; pass target=...)" if targets else ""


def _checked_hub_manifest(repo_id: str, subfolder: str, revision: str, token, cache_dir, force_download: bool,
                          local_files_only: bool) -> str:
    """Download and check `<subfolder>/export.json`; return the commit it came from (pins the engine's downloads)."""
    from huggingface_hub import hf_hub_download
    from huggingface_hub.errors import (
        EntryNotFoundError,
        HfHubHTTPError,
        LocalEntryNotFoundError,
        RepositoryNotFoundError,
        RevisionNotFoundError,
    )

    where = f"{repo_id}@{revision}" + (f"/{subfolder}" if subfolder else "")
    try:
        file = hf_hub_download(repo_id, MANIFEST_FILE, subfolder=subfolder or None, revision=revision, token=token,
                               cache_dir=cache_dir, force_download=force_download, local_files_only=local_files_only)
    except RevisionNotFoundError:
        raise SourceError(f"revision {revision!r} not found in {repo_id}") from None
    except EntryNotFoundError:
        raise SourceError(f"no {MANIFEST_FILE} at {where}: not an exported model"
                          + _targets_hint(_hub_targets(repo_id, revision, token))) from None
    except RepositoryNotFoundError:
        hint = "" if token else " (for a private repo, pass a token or set HF_TOKEN)"
        raise SourceError(f"repository {repo_id} not found or not accessible{hint}") from None
    except LocalEntryNotFoundError:
        raise SourceError(f"{where}: {MANIFEST_FILE} is not in the local cache and the Hub cannot be reached") from None
    except (HfHubHTTPError, OSError, ValueError) as error:
        raise SourceError(f"cannot read {MANIFEST_FILE} from {where}: {redact(_first_line(error))}") from None
    check_manifest_file(file, f"{where}/{MANIFEST_FILE}")
    commit = _snapshot_commit(Path(file))
    return commit or revision


def _snapshot_commit(file: Path) -> str | None:
    """The commit a cached file belongs to: huggingface_hub stores it under `snapshots/<commit>/`."""
    for parent in file.parents:
        if parent.parent.name == "snapshots":
            return parent.name
    return None


def _hub_targets(repo_id: str, revision: str, token) -> list[str]:
    from huggingface_hub import HfApi

    try:
        entries = HfApi().list_repo_tree(repo_id, path_in_repo=EXPORTS_FOLDER, revision=revision, token=token)
        return sorted(entry.path.rsplit("/", 1)[-1] for entry in entries if not hasattr(entry, "size"))
    except Exception:  # noqa: BLE001 - only a hint for an error message
        return []


def _first_line(error: BaseException) -> str:
    text = str(error).strip()
    return text.splitlines()[0] if text else type(error).__name__
