"""`ExportedModel`: the engine's exported-model class, extended by hfexport (loading published targets safely,
generation over prefill/decode graphs). Everything the engine's class does works unchanged."""

from __future__ import annotations

import os
from pathlib import Path

from transformers.exporters import ExportedModel as _EngineExportedModel

from .errors import SourceError, redact
from .safety import MANIFEST_FILE, check_manifest_file

EXPORTS_FOLDER = "exports"
RECIPE_COPY_FILE = "export_config.json"  # the recipe target hfexport.job saves beside each export


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
        precision: str | None = None,
        **kwargs,
    ) -> ExportedModel:
        """The engine's `from_pretrained`, after checking the export's `export.json` (`hfexport.safety`).

        `precision` is the precision the runtime computes at: `None` applies the owner's choice (the target's
        `runtime.precision` in the `export_config.json` hfexport saves beside the export), `"auto"` the device's
        default (OpenVINO's CPU plugin: bf16 on CPUs with AVX512-BF16/AMX), `"f32"`, `"bf16"` or `"f16"` pin it
        (the last two for OpenVINO only). A `config={"INFERENCE_PRECISION_HINT": ...}` passed for OpenVINO wins.

        `target` picks a published target: `exports/<target>` of a Hub repo (or of a folder; an hfexport OUTPUT
        folder's `<target>` works too). From the Hub, the manifest is downloaded first, checked, and the engine then
        loads that same commit (the revision is pinned to the manifest's commit, so a branch that moves meanwhile
        cannot swap the files). A manifest naming anything but transformers' output/cache classes and builtin
        containers raises `UnsafeExportError` before the engine reads it.

        ONNX exports are then built here from the engine's public classes (`ExportMetadata`, `ExportedComponent`,
        the runner through `.to()`), not through the engine's loader, which imports its ONNX *exporter* to read a
        graph: onnxscript compiles its torch_lib on that import, ~5 s per process (transformers 5.23).
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
            checked = check_manifest_file(manifest)
            fetch = _local_fetcher(manifest.parent)
        else:
            revision, checked = _checked_hub_manifest(str(pretrained_model_name_or_path), subfolder, revision, token,
                                                      cache_dir, force_download, local_files_only)
            fetch = _hub_fetcher(str(pretrained_model_name_or_path), subfolder, revision, token, cache_dir,
                                 force_download, local_files_only)
        kwargs = _apply_precision(str(checked.get("export_format")), precision, fetch, kwargs)
        if checked.get("export_format") == "onnx":
            return cls._load_onnx(checked, fetch, **kwargs)
        if checked.get("export_format") == "dynamo":
            return cls._load_pt2(checked, fetch, pretrained_model_name_or_path, revision=revision,
                                 subfolder=subfolder, token=token, cache_dir=cache_dir,
                                 force_download=force_download, local_files_only=local_files_only, **kwargs)
        return super().from_pretrained(
            pretrained_model_name_or_path, revision=revision, subfolder=subfolder, token=token, cache_dir=cache_dir,
            force_download=force_download, local_files_only=local_files_only, **kwargs,
        )

    @classmethod
    def _load_pt2(cls, manifest: dict, fetch, pretrained_model_name_or_path, **kwargs) -> ExportedModel:
        """A `.pt2` export, each program checked (`safety.check_pt2_archive`) before torch unpickles anything, then
        loaded by the engine with transformers' cache classes allowed to a weights-only load: torch 2.13's
        `torch.export.load` otherwise falls back to `weights_only=False` on the sample inputs of every generation
        export (they hold a cache), and logs that with a malformed message that raises under pytest's handler."""
        import torch

        from .safety import check_pt2_archive, pt2_unpickling_allowlist

        for name, entry in manifest["components"].items():
            check_pt2_archive(fetch(entry["file"], True), f"{name}: {entry['file']}")
        with torch.serialization.safe_globals(pt2_unpickling_allowlist()):
            return super().from_pretrained(pretrained_model_name_or_path, **kwargs)


    @classmethod
    def _load_onnx(cls, manifest: dict, fetch, device=None, trust_remote_code: bool = False,
                   **runner_kwargs) -> ExportedModel:
        """An ONNX export from its checked manifest: each graph opened by ONNX Runtime from its saved file."""
        import onnx_ir
        from transformers import AutoConfig, GenerationConfig
        from transformers.exporters import ExportedComponent, ExportFormat, ExportMetadata

        components = {}
        for name, entry in manifest["components"].items():
            path = fetch(entry["file"], required=True)
            data = fetch(f"{entry['file']}.data", required=False)
            program = onnx_ir.load(str(path))
            program.meta["path"] = str(path)  # the runner opens this file; ONNX Runtime reads the weights beside it
            if data is not None and data.is_symlink():
                _read_weights_from_blob(program, data)
            components[name] = ExportedComponent(program, ExportMetadata.from_dict(entry["metadata"]))
        config_file, generation_file = fetch("config.json", required=False), fetch("generation_config.json",
                                                                                    required=False)
        config = AutoConfig.from_pretrained(config_file.parent, trust_remote_code=trust_remote_code) \
            if config_file else None
        generation_config = GenerationConfig.from_pretrained(generation_file.parent) if generation_file else None
        model = cls(components, ExportFormat.ONNX, config=config, generation_config=generation_config)
        return model.to(device, **runner_kwargs)


def _apply_precision(export_format: str, precision: str | None, fetch, kwargs: dict) -> dict:
    """The runner arguments with the runtime precision applied: the caller's, else the owner's recipe pin."""
    from .runtime import PRECISION_FORMATS, load_options

    allowed = PRECISION_FORMATS.get(export_format, ("auto", "f32"))
    if precision is not None and precision not in allowed:
        raise SourceError(f"precision={precision!r}: {export_format} exports run at "
                          f"{' or '.join(repr(p) for p in allowed)} ('bf16'/'f16' are OpenVINO runtime precisions)")
    if precision is None:  # only OpenVINO has a runtime precision to pin: nothing else to read for the others
        precision = owner_precision(fetch) if len(allowed) > 2 else "auto"
    options = load_options(export_format, precision)
    if "config" in options:
        kwargs = {**kwargs, "config": {**options["config"], **(kwargs.get("config") or {})}}
    return kwargs


def owner_precision(fetch) -> str:
    """The target's `runtime.precision` from the recipe copy saved beside the export ("auto" when there is none)."""
    from .recipe import load_recipe
    from .runtime import pinned_precision

    path = fetch(RECIPE_COPY_FILE, required=False)
    if path is None:
        return "auto"
    recipe = load_recipe(path)  # schema-checked: a malformed copy is a RecipeError naming the file and JSON path
    return pinned_precision(recipe.target(recipe.default_target).runtime)


def _read_weights_from_blob(program, data: Path) -> None:
    """The Hub cache links `model.onnx.data` to a blob outside the snapshot, which onnx_ir refuses to read: point the
    graph's external tensors at the blob (what the engine's `OnnxExporter.load_program` does, transformers 5.23)."""
    import onnx_ir

    for graph in program.graphs():
        for value in graph.initializers.values():
            tensor = value.const_value
            if isinstance(tensor, onnx_ir.ExternalTensor) and Path(tensor.path) == data:
                value.const_value = onnx_ir.ExternalTensor(data.resolve(), tensor.offset, tensor.length, tensor.dtype,
                                                           shape=tensor.shape, name=tensor.name)


def _local_fetcher(directory: Path):
    def fetch(name: str, required: bool) -> Path | None:
        path = directory / name
        if path.is_file():
            return path
        if required:
            raise SourceError(f"{path}: missing (named by {directory / MANIFEST_FILE})")
        return None

    return fetch


def _hub_fetcher(repo_id: str, subfolder: str, revision: str, token, cache_dir, force_download: bool,
                 local_files_only: bool):
    """Download one file of the export folder at the pinned commit; None for an optional file the repo lacks."""
    from huggingface_hub import hf_hub_download
    from huggingface_hub.errors import EntryNotFoundError, HfHubHTTPError

    def fetch(name: str, required: bool) -> Path | None:
        try:
            return Path(hf_hub_download(repo_id, name, subfolder=subfolder or None, revision=revision, token=token,
                                        cache_dir=cache_dir, force_download=force_download,
                                        local_files_only=local_files_only))
        except EntryNotFoundError:
            if required:
                raise SourceError(f"{repo_id}@{revision}/{_join(subfolder, name)}: missing (named by "
                                  f"{MANIFEST_FILE})") from None
            return None
        except (HfHubHTTPError, OSError, ValueError) as error:
            raise SourceError(f"cannot download {_join(subfolder, name)} from {repo_id}: "
                              f"{redact(_first_line(error))}") from None

    return fetch


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
                          local_files_only: bool) -> tuple[str, dict]:
    """Download and check `<subfolder>/export.json`: the commit it came from (which pins every later download), and
    the checked manifest."""
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
    manifest = check_manifest_file(file, f"{where}/{MANIFEST_FILE}")
    return _snapshot_commit(Path(file)) or revision, manifest


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
