"""`ExportedModel`: the engine's exported-model class, extended by hfexport (loading published targets safely,
generation over prefill/decode graphs). Everything the engine's class does works unchanged."""

from __future__ import annotations

import functools
import inspect
import os
from pathlib import Path

from transformers.exporters import ExportedComponent
from transformers.exporters import ExportedModel as _EngineExportedModel

from hfexport.engine import engine_format, runner_class, set_runners
from hfexport.errors import (
    CorruptExportError,
    HfExportError,
    PublishError,
    SourceError,
    UnsafeExportError,
)
from hfexport.files import RECIPE_COPY_FILE
from hfexport.formats import format_traits
from hfexport.formats.backend import backend_errors
from hfexport.formats.onnx.file_component import OnnxFile, OnnxFileComponent
from hfexport.formats.programs import check_program_files, format_program
from hfexport.generate import DECODE, generate
from hfexport.hub import HubRepo, hub_error, snapshot_commit
from hfexport.layout import LayoutError, legacy_folder, target_folders, target_places
from hfexport.layout import check_file_name as check_artifact_name
from hfexport import preparers
from hfexport.formats.onnx.file_runner import OnnxFileRunner
from hfexport.formats.openvino.workarounds import copy_returned_inputs
from hfexport.recipe.loading import load_recipe
from hfexport.machine import (
    has_runtime_precision,
    load_options,
    pinned_precision,
)
from hfexport.safety.artifacts import (
    MANIFEST_FILE,
    check_manifest_file,
    checked_file,
    read_json,
)
from hfexport.safety.treespec import check_file_name


class ExportedModel(_EngineExportedModel):
    """The engine's `ExportedModel`, returned by every hfexport export.

    `save_dtype`: the dtype its ONNX graphs are converted to when saved (the recipe target's `dtype`, "float16":
    `hfexport.formats.onnx.float16`); None keeps the exported dtype. The graphs in memory stay as exported; the saved files,
    and what `load` reads back, are float16."""

    save_dtype: str | None = None

    @classmethod
    def from_engine(cls, exported: _EngineExportedModel) -> ExportedModel:
        """Re-class an engine result without copying its programs."""
        if isinstance(exported, cls):
            return exported
        return cls(
            exported.components, exported.export_format, config=exported.config,
            generation_config=exported.generation_config,
        )

    @property
    def config(self):
        """The model's config. A loaded export reads its `config.json` (checked as strict JSON at load) into the
        config object on first use: running the graphs does not need it, and building it imports and documents the
        model's config class (transformers 5.23: 20-40 ms of a ~0.3 s load, benchmarks/load_published.py). A
        config.json transformers cannot read raises `CorruptExportError` here, naming the file."""
        pending = self.__dict__.get("_pending_config")
        if pending is not None:  # a failure leaves it pending: the next read raises again
            self.__dict__["_config"] = pending()
            del self.__dict__["_pending_config"]
        return self.__dict__.get("_config")

    @config.setter
    def config(self, value) -> None:
        self.__dict__.pop("_pending_config", None)
        self.__dict__["_config"] = value

    def to(self, device=None, **runner_kwargs) -> ExportedModel:
        """The engine's `to`: each component on its backend's runtime. ONNX components that have not been parsed
        (`OnnxFileComponent`) run from their files on hfexport's `OnnxFileRunner` (the CPU, without importing
        onnx_ir), or reach the engine's runner as their file, which ONNX Runtime opens: no onnx_ir parse to run them.
        An OpenVINO program that returns one of its inputs gets a runner that always copies its inputs
        (`hfexport.formats.openvino.workarounds`), so `model(...)`, `runners[...]` and `generate` are all safe from OpenVINO
        2026.4.1 writing through a freed input."""
        unparsed = {name: component for name, component in self.components.items()
                    if isinstance(component, OnnxFileComponent) and not component.parsed}
        if unparsed and len(unparsed) == len(self.components):  # hfexport's runner: no onnx_ir import on the CPU
            set_runners(self, {name: OnnxFileRunner.from_program(OnnxFile(component.path), component.metadata,
                                                                 device, **runner_kwargs)
                               for name, component in unparsed.items()})
            return self
        components = self.components
        if unparsed:
            self.components = {**components, **{name: ExportedComponent(OnnxFile(component.path), component.metadata)
                                                for name, component in unparsed.items()}}
        try:
            super().to(device, **runner_kwargs)
        finally:
            self.components = components
        copy_returned_inputs(self.runners)
        return self

    def save_pretrained(self, save_directory, *args, tokenizer=None, push_to_hub=False, **kwargs):
        """The engine's `save_pretrained`; a decoder-only generation export is then put in its runtimes' contract:
        ONNX (one `decode` graph) as `model.onnx` + `model.onnx_data` and `genai_config.json` (`hfexport.formats.onnx.decoder_contract`)
        for transformers.js, optimum and onnxruntime-genai; an ONNX encoder-decoder (encoder, prefill, decode) as
        `encoder_model.onnx` + `decoder_model_merged.onnx` (`hfexport.formats.onnx.seq2seq_contract`) for optimum and transformers.js; OpenVINO (one stateful `decode` graph) as optimum-intel's
        `openvino_model.xml` with `tokenizer`'s files and its OpenVINO tokenizer models (`hfexport.formats.openvino.genai_layout`)
        for OpenVINO GenAI and optimum-intel; `from_pretrained` here reads the same files.

        `push_to_hub=True` uploads once every file is written (`repo_id`, `commit_message`, `token`, `private` as the
        engine takes them): the engine's own upload runs before the files written here (the `.ptd`, the runtimes'
        layout) exist, so it would publish an export its loaders cannot open."""
        if push_to_hub:
            return self._save_and_push(Path(save_directory), *args, tokenizer=tokenizer, **kwargs)
        program = format_program(self.export_format)  # ExecuTorch: each program's weights in its .ptd
        result = program.save(self, save_directory, super().save_pretrained, *args, **kwargs)
        # the runtimes' contract: ONNX's float16, decoder and seq2seq layouts; OpenVINO's optimum-intel layout; the
        # tokenizer ExecuTorch's LLM runner reads
        program.after_save(self, Path(save_directory), tokenizer)
        preparers.write(save_directory, getattr(self, "input_preparers", {}))
        return result

    def _save_and_push(self, directory: Path, *args, tokenizer=None, commit_message=None, repo_id=None, **hub_kwargs):
        """Save everything, then upload the files that changed, as the engine's `push_to_hub` does."""
        from huggingface_hub import HfApi

        directory.mkdir(parents=True, exist_ok=True)
        timestamps = self._get_files_timestamps(directory)
        self.save_pretrained(directory, *args, tokenizer=tokenizer)
        token = hub_kwargs.get("token")
        try:
            repo_id = HfApi().create_repo(repo_id or directory.name, exist_ok=True, **hub_kwargs).repo_id
            self._upload_modified_files(directory, repo_id, timestamps, commit_message=commit_message, token=token)
        except Exception as error:  # noqa: BLE001 - huggingface_hub's errors, as one readable message
            raise hub_error(error, repo_id or directory.name, "uploading the export", token=token,
                            error_class=PublishError) from None

    def generate(self, input_ids=None, attention_mask=None, generation_config=None, logits_processor=None,
                 stopping_criteria=None, streamer=None, generator=None, seed=None, tokenizer=None, **kwargs):
        """
        Generates tokens over the `prefill`/`decode` components, without the torch model, as `model.generate` does
        for a decoder-only model: greedy search, or multinomial sampling with `do_sample=True`
        (`hfexport.generate.generate`). A Mamba export on OpenVINO or ExecuTorch has a `decode` alone: the prompt
        runs through it one token at a time (docs/generation.md).

        Arguments (`input_ids`, `attention_mask`, `generation_config`, `logits_processor`, `stopping_criteria`,
        `streamer`, `generator`, `seed`, `tokenizer`, `GenerationConfig` fields as kwargs), result and errors:
        docs/generation.md, "`ExportedModel.generate`: arguments, result, errors".
        """
        return generate(self, input_ids, attention_mask, generation_config=generation_config,
                        logits_processor=logits_processor, stopping_criteria=stopping_criteria, streamer=streamer,
                        generator=generator, seed=seed, tokenizer=tokenizer, **kwargs)

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
        allow_unsafe_pt2: bool = False,
        file_name: str | None = None,
        **kwargs,
    ) -> ExportedModel:
        """Load an export after proving it safe to load (`hfexport.safety.artifacts`, docs/security.md).

        `precision` (the runtime's: the owner's pin by default), `target` / `file_name` (a published target wherever the
        publication put it), `allow_unsafe_pt2`, and what is checked before any backend opens a file: docs/publishing.md,
        "`ExportedModel.from_pretrained`: precision, targets, what is checked".
        """
        revision = revision or "main"
        path = Path(str(pretrained_model_name_or_path))
        prefix = _variant_prefix(file_name)
        if target:
            _check_target_name(target)
        if path.is_dir():
            if target:
                subfolder, prefix = _local_target_folder(path, subfolder, target)
            folder = path / subfolder
            if subfolder and not folder.resolve().is_relative_to(path.resolve()):
                raise UnsafeExportError(f"{folder}: resolves to {folder.resolve()}, outside {path}: refused (a "
                                        "linked target folder would load another export)")
            if not os.path.lexists(folder / (prefix + MANIFEST_FILE)):
                raise SourceError(f"no {prefix + MANIFEST_FILE} in {folder}: not an exported model"
                                  + _targets_hint(_local_targets(path)))
            fetch = _local_fetcher(folder)
            source = str(folder)
            checked = check_manifest_file(fetch(prefix + MANIFEST_FILE, True), f"{source}/{prefix + MANIFEST_FILE}")
        else:
            repo_id = str(pretrained_model_name_or_path)
            if target:
                subfolder, prefix = _hub_target_folder(repo_id, subfolder, target, revision, token, cache_dir,
                                                       local_files_only)
            revision, checked = _checked_hub_manifest(repo_id, subfolder, revision, token, cache_dir, force_download,
                                                      local_files_only, prefix)
            fetch = _hub_fetcher(repo_id, subfolder, revision, token, cache_dir, force_download, local_files_only)
            source = f"{repo_id}@{revision}" + (f"/{subfolder}" if subfolder else "")
        kwargs = _apply_precision(str(checked.get("export_format")), precision, fetch, kwargs, prefix)
        return cls._load_checked(checked, fetch, source, allow_unsafe_pt2=allow_unsafe_pt2, prefix=prefix, **kwargs)

    @classmethod
    def _load_checked(cls, manifest: dict, fetch, source: str, device=None, trust_remote_code: bool = False,
                      allow_unsafe_pt2: bool = False, prefix: str = "", **runner_kwargs) -> ExportedModel:
        """An export from its checked manifest: every program file checked for its format, then read by its backend,
        with the configs beside it; a backend's failure on a checked file becomes a `CorruptExportError`."""
        from transformers import GenerationConfig
        from transformers.exporters import ExportMetadata

        export_format = manifest["export_format"]
        program = format_program(export_format)
        runner = program.runner() or runner_class(export_format)  # the engine's options
        options = [name for name in inspect.signature(runner.from_program).parameters
                   if name not in ("program", "metadata", "device")]
        unknown = [name for name in runner_kwargs if name not in options]
        if unknown:  # the caller's mistake, said before anything loads (as the engine's loader says it)
            raise TypeError(f"Unknown kwargs {unknown}: the {export_format} runner takes {options}.")
        paths = check_program_files(manifest, fetch, source, allow_unsafe_pt2=allow_unsafe_pt2)
        if DECODE in manifest["components"]:  # a generation export: the format's options for it, unless given
            runner_kwargs = {**program.generation_runner_options(), **runner_kwargs}
        input_preparers = {}  # the engine's input preparers run again on new inputs (hfexport.preparers)
        preparers_file = fetch(prefix + preparers.FILE, False)
        if preparers_file is not None:  # checked before any program is read
            label = f"{source}/{prefix}{preparers.FILE}"
            input_preparers = preparers.check_input_preparers(read_json(preparers_file, label), label)
        components = {}
        for name, entry in manifest["components"].items():
            label = f"{source}/{entry['file']}"
            metadata = ExportMetadata.from_dict(entry["metadata"])
            component = program.component(paths[name], metadata, fetch, entry, label)  # ONNX: read on demand
            if component is None:
                with backend_errors(label, export_format):
                    component = ExportedComponent(program.read(paths[name], fetch, entry, allow_unsafe_pt2), metadata)
            components[name] = component
        generation_config = None
        config_name, generation_name = prefix + "config.json", prefix + "generation_config.json"
        config_file, generation_file = fetch(config_name, False), fetch(generation_name, False)
        if config_file is not None:  # strict JSON of bounded size now; the config object on first use (`config`)
            read_json(config_file, f"{source}/{config_name}")
        with backend_errors(f"{source}/{generation_name}", "transformers"):
            if generation_file is not None:
                read_json(generation_file, f"{source}/{generation_name}")
                generation_config = GenerationConfig.from_pretrained(generation_file.parent,
                                                                     config_file_name=generation_file.name)
        model = cls(components, engine_format(export_format), generation_config=generation_config)
        model.input_preparers = input_preparers
        if config_file is not None:
            model.__dict__["_pending_config"] = functools.partial(
                _read_config, config_file.parent if not prefix else config_file, f"{source}/{config_name}",
                trust_remote_code)
        hint = program.load_hint(manifest, components)  # ExecuTorch: a program without the .ptd beside it
        with backend_errors(f"{source}/{next(iter(manifest['components'].values()))['file']}", export_format, hint):
            return model.to(device, **runner_kwargs)


def _read_config(path: Path, label: str, trust_remote_code: bool):
    """A loaded export's config, read from its checked `config.json` (or a variant's `<stem>.config.json`)."""
    from transformers import AutoConfig

    with backend_errors(label, "transformers"):
        return AutoConfig.from_pretrained(path, trust_remote_code=trust_remote_code)


def _apply_precision(export_format: str, precision: str | None, fetch, kwargs: dict, prefix: str = "") -> dict:
    """The runner arguments with the runtime precision applied: the caller's, else the owner's recipe pin."""
    allowed = format_traits(export_format).runtime_precisions
    if precision is not None and precision not in allowed:
        raise SourceError(f"precision={precision!r}: {export_format} exports run at "
                          f"{' or '.join(repr(p) for p in allowed)} ('bf16'/'f16' are OpenVINO runtime precisions)")
    if precision is None:  # only OpenVINO has a runtime precision to pin: nothing else to read for the others
        precision = owner_precision(fetch, prefix) if has_runtime_precision(export_format) else "auto"
    options = load_options(export_format, precision)
    if "config" in options:
        kwargs = {**kwargs, "config": {**options["config"], **(kwargs.get("config") or {})}}
    return kwargs


def owner_precision(fetch, prefix: str = "") -> str:
    """The target's `runtime.precision` from the recipe copy saved beside the export ("auto" when there is none)."""
    path = fetch(prefix + RECIPE_COPY_FILE, required=False)
    if path is None:
        return "auto"
    recipe = load_recipe(path)  # schema-checked: a malformed copy is a RecipeError naming the file and JSON path
    return pinned_precision(recipe.target(recipe.default_target).runtime)


def _local_fetcher(directory: Path):
    """`fetch(name, required)`: the checked path of a file of a local export (`safety.checked_file`), None for a
    missing optional one."""
    def fetch(name: str, required: bool) -> Path | None:
        return checked_file(directory, name, source=str(directory), required=required)

    return fetch


def _hub_fetcher(repo_id: str, subfolder: str, revision: str, token, cache_dir, force_download: bool,
                 local_files_only: bool):
    """`fetch(name, required)`: download one file of the export folder at the pinned commit and return its checked
    path (inside that commit's snapshot folder, or the repo's blob store the snapshot links to); None for an
    optional file the repo lacks (a 404; the Hub failing raises). An optional file already known absent at that
    commit (`model.onnx.data` of a publication, which names it `model.onnx_data`; `generation_config.json` of a
    forward export) is not asked for again (`HubRepo.known_absent`)."""
    repo = HubRepo(repo_id, revision, token, cache_dir=cache_dir)
    source = f"{repo_id}@{revision}" + (f"/{subfolder}" if subfolder else "")

    def fetch(name: str, required: bool) -> Path | None:
        check_file_name(name, source)
        file = repo.download(_join(subfolder, name), force_download=force_download, local_files_only=local_files_only)
        if file is None:
            if required:
                raise CorruptExportError(f"{source}/{name}: missing (named by {MANIFEST_FILE})")
            return None
        return _checked_cached(file, name, subfolder, source)

    return fetch


def _checked_cached(file: Path, name: str, subfolder: str, source: str) -> Path:
    """A file huggingface_hub downloaded, checked to lie in its revision's snapshot (`snapshots/<commit>/<subfolder>`)
    or, through the snapshot's link, in the repo's blob store."""
    snapshot = next((parent for parent in file.parents if parent.parent.name == "snapshots"), None)
    if snapshot is None:
        raise UnsafeExportError(f"{source}/{name}: downloaded to {file}, outside the Hub cache's snapshots: refused")
    folder = snapshot / subfolder if subfolder else snapshot
    return checked_file(folder, name, source=source, roots=(snapshot.parent.parent / "blobs",))


def load(repo_or_path, target: str | None = None, revision: str | None = None, **kwargs) -> ExportedModel:
    """Load an export saved or published by hfexport, after proving it safe to load.

    Args:
        repo_or_path (`str` or `Path`): a target folder, a job's OUTPUT folder, a model folder or a Hub repo id.
        target (`str`, *optional*): the target to load (`OUTPUT/<target>` or the published `exports/<target>`);
            needed when there are several.
        revision (`str`, *optional*): the Hub revision, e.g. `refs/pr/3` for an open hfexport pull request.
        kwargs: `ExportedModel.from_pretrained`'s options (`precision`, `token`, `cache_dir`, `device`, ...).

    Returns:
        `ExportedModel`: `model(**inputs)` runs the export, `.generate(...)` generates with a generation target.

    Raises:
        UnsafeExportError: the export would run code or read outside its folder if loaded.
        CorruptExportError: the export is broken (names the file and the field).
        SourceError: nothing exported there, or the folder or repo cannot be read.
    """
    return ExportedModel.from_pretrained(repo_or_path, target=target, revision=revision or "main", **kwargs)


def _check_target_name(target: str) -> None:
    if not target or "/" in target or "\\" in target or target in (".", "..") or target.startswith("."):
        raise SourceError(f"{target!r} is not a target name")


def _variant_prefix(file_name: str | None) -> str:
    """`model_quantized.onnx` -> `model_quantized.`: what the names of that variant's hfexport files start with."""
    if not file_name:
        return ""
    suffix = next((s for s in (".onnx", ".xml", ".pte", ".pt2") if str(file_name).endswith(s)), None)
    fmt = {".onnx": "onnx", ".xml": "openvino", ".pte": "executorch", ".pt2": "dynamo"}.get(suffix or "", "onnx")
    try:
        check_artifact_name(file_name, fmt)
    except LayoutError as error:
        raise SourceError(str(error)) from None
    return "" if file_name in ("model.onnx", "openvino_model.xml", "model.pte", "model.pt2") else \
        str(file_name)[: -len(suffix)] + "."


def _local_target_folder(path: Path, subfolder: str, target: str) -> tuple[str, str]:
    """Where target `target` is under `path/subfolder`, as (folder, prefix of its hfexport files): an hfexport OUTPUT
    folder's `<target>/`, a publication's place (hfexport.layout: `onnx/`, `onnx/model_quantized.*`, `openvino/`, a
    recipe's `path`, ...), or an older publication's `exports/<target>/`."""

    root = path / subfolder
    if (root / target / MANIFEST_FILE).is_file():
        return _join(subfolder, target), ""
    files = [p.relative_to(root).as_posix() for depth in ("*", "*/*", "*/*/*", "*/*/*/*") for p in root.glob(depth)
             if p.is_file() or p.is_symlink()]
    found = target_places(set(files), lambda name: _read_small(root / name))
    if target not in found:
        raise SourceError(f"no target {target!r} in {root}" + _targets_hint(sorted(found)))
    return _join(subfolder, found[target].folder), found[target].prefix


def _read_small(path: Path) -> str | None:
    """A recipe copy's text, only from a regular file (never through a link) of sane size: it only names a target."""
    if path.is_symlink() or not path.is_file() or path.stat().st_size > 1 << 20:
        return None
    return path.read_text(encoding="utf-8", errors="replace")


def _hub_target_folder(repo_id: str, subfolder: str, target: str, revision: str, token, cache_dir,
                       local_files_only: bool) -> tuple[str, str]:
    """Where target `target` is published in `repo_id` at `revision`, as (folder, prefix of its hfexport files; see
    `_local_target_folder`): one `model_info` request gives the branch's commit and its file list, and the small
    recipe copy of each published place, read at that commit (from the cache, once downloaded: no request), names
    it. The Hub failing raises (`SourceError`): an unreachable Hub is never "no such target"."""
    if local_files_only:  # no listing without the Hub: the folder a target of that name would have by default
        return _join(subfolder, legacy_folder(target)), ""
    repo = HubRepo(repo_id, revision, token, cache_dir=cache_dir)
    info = repo.info()
    commit = info.sha or revision
    prefix = f"{subfolder.strip('/')}/" if subfolder.strip("/") else ""
    paths = {sibling.rfilename[len(prefix):] for sibling in info.siblings or ()
             if sibling.rfilename.startswith(prefix)}

    def read(name: str) -> str | None:
        data = repo.read(prefix + name, revision=commit)
        return None if data is None else data.decode("utf-8", errors="replace")  # an unreadable copy names no target

    found = target_places(paths, read)
    if target not in found:
        raise SourceError(f"no target {target!r} published in {repo_id}@{revision}" + _targets_hint(sorted(found)))
    return _join(subfolder, found[target].folder), found[target].prefix


def _join(*parts: str) -> str:
    return "/".join(part.strip("/") for part in parts if part and part.strip("/"))


def _local_targets(folder: Path) -> list[str]:

    found = [p.parent.name for p in folder.glob(f"*/{MANIFEST_FILE}")]
    files = {p.relative_to(folder).as_posix() for depth in ("*/*", "*/*/*", "*/*/*/*") for p in folder.glob(depth)}
    found += list(target_folders(files, lambda name: _read_small(folder / name)))
    return sorted(set(found))


def _targets_hint(targets: list[str]) -> str:
    return f" (targets found: {', '.join(targets)}; pass target=...)" if targets else ""


def _checked_hub_manifest(repo_id: str, subfolder: str, revision: str, token, cache_dir, force_download: bool,
                          local_files_only: bool, prefix: str = "") -> tuple[str, dict]:
    """Download and check `<subfolder>/<prefix>export.json`: the commit it came from (which pins every later
    download), and the checked manifest. Only the Hub's 404 means "not an exported model"."""
    where = f"{repo_id}@{revision}" + (f"/{subfolder}" if subfolder else "")
    manifest = prefix + MANIFEST_FILE
    file = HubRepo(repo_id, revision, token, cache_dir=cache_dir).download(
        _join(subfolder, manifest), force_download=force_download, local_files_only=local_files_only)
    if file is None and local_files_only:
        raise SourceError(f"{where}: {manifest} is not in the local cache (local_files_only)")
    if file is None:
        raise SourceError(f"no {manifest} at {where}: not an exported model"
                          + _targets_hint(_hub_targets(repo_id, revision, token)))
    commit = snapshot_commit(Path(file)) or revision
    label = f"{repo_id}@{commit}" + (f"/{subfolder}" if subfolder else "")
    checked = _checked_cached(Path(file), manifest, subfolder, label)
    return commit, check_manifest_file(checked, f"{where}/{manifest}")


def _hub_targets(repo_id: str, revision: str, token) -> list[str]:
    """The names of the targets published in `repo_id` at `revision` (for an error's hint; none when the Hub fails
    now: the error it hints at is already raised)."""
    repo = HubRepo(repo_id, revision, token)

    def read(path: str) -> str | None:
        data = repo.read(path)
        return None if data is None else data.decode("utf-8", errors="replace")

    try:
        return sorted(target_folders(set(repo.files()), read))
    except HfExportError:  # only a hint for an error message
        return []
