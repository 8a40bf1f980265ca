"""`FormatBackend`: what the layers ask of one export format, and the registry they ask it through.

A format's backend is data and pure names (no engine, no torch): its published folder and file names, what it
depends on, the recipe options and runtime precisions it takes, its default thresholds, its deployment runtimes
(module paths, run by `hfexport.deployment`), and the flags where formats behave differently. What a format does to
programs (export hooks, save, load, file checks, weight writers) is its `program` module (`hfexport.formats.programs`).
Modelled on transformers' `exporters` (`EXPORT_BACKENDS`, `register_backend`): one object per format, registered
by its name, the recipe's `export_format`.
"""

from __future__ import annotations

import contextlib
from dataclasses import dataclass
from pathlib import Path
from typing import Any, ClassVar

from hfexport.errors import CorruptExportError, HfExportError, UnsafeExportError, first_line

_REGISTRY: dict[str, FormatBackend] = {}
#: The engine config fields every format takes (transformers.exporters.configs), minus what the recipe sets elsewhere.
COMMON_OPTIONS = ("dynamic", "strict", "prefer_deferred_runtime_asserts_over_guards")


#: The tasks whose forward targets the ecosystem's embedding loaders (sentence-transformers, a feature-extraction
#: pipeline) and causal-LM loaders read: the model card shows them loading such targets.
EMBEDDING_TASKS = ("feature-extraction", "sentence-similarity")
CAUSAL_TASKS = ("text-generation",)
#: A vision-language generation target's task, and the components hfexport splits it into
#: (`hfexport.generate.vision_language`), which each format's runtime layout is made from.
IMAGE_TEXT_TASK = "image-text-to-text"
IMAGE_TEXT_COMPONENTS = ("image_encoder", "embed", "language_model", "lm_head", "decode")


@dataclass(frozen=True)
class CardTarget:
    """A published target as the model card's loading snippets see it (`hfexport.report.card`)."""

    name: str
    folder: str  # the repo folder it is published in
    stem: str | None  # a variant's file name without its suffix (`model_quantized`); None: the folder's default name
    path: str  # the repo path of its artifact (`onnx/model_quantized.onnx`)
    task: str | None
    files: tuple[str, ...]  # the paths of its files, as its report lists them


class FormatBackend:
    """One export format as the layers see it; subclasses set the class attributes (docs/architecture.md, "How to add
    a format")."""

    name: ClassVar[str]  # the recipe's `export_format`, the engine's `ExportFormat` value
    label: ClassVar[str]  # the one name people read for it (the Space, the CLI, the report, the card)
    aliases: ClassVar[tuple[str, ...]] = ()  # other spellings people type for `export_format`, each meaning `name`
    runtime_label: ClassVar[str]  # what reads its files, in a load error ("ONNX Runtime cannot load it")
    runtime_package: ClassVar[str]  # the package a report names as the backend that ran it
    folder: ClassVar[str]  # where a publication puts its targets
    default_file: ClassVar[str]  # the file the engine writes for a forward target, and its loaders' default name
    companion_files: ClassVar[tuple[str, ...]] = ()  # files named after `default_file` that a variant renames with it
    hub_tag: ClassVar[str]  # the model card's tag
    extra: ClassVar[str | None] = None  # the `pip install 'hfexport[extra]'` that brings its backend
    packages: ClassVar[tuple[str, ...]] = ()  # the packages an export of it depends on (cache key, validated_with)
    target_name: ClassVar[str]  # `hfexport init`'s target name
    init_options: ClassVar[dict] = {}  # `hfexport init`'s options for a target of it
    init_runtime: ClassVar[dict] = {}  # `hfexport init`'s `runtime` section for a target of it
    options: ClassVar[tuple[str, ...]]  # the recipe options its engine config takes
    runtime_precisions: ClassVar[tuple[str, ...]] = ("auto", "f32")  # precisions its runtime may be pinned to
    # (atol, rtol, min_cosine, min_top1) at float32 (docs/parity.md): a runtime of its own; torch itself is tighter
    fp32_tolerance: ClassVar[tuple[float, float, float, float]] = (1e-4, 1e-3, 0.9999, 0.99)
    half_weights_option: ClassVar[str | None] = None  # an option that stores the weights as float16
    max_program_bytes: ClassVar[int | None] = None  # the largest program file (`suffix`) it opens (default: weights')
    memory_factor: ClassVar[float] = 4.0  # peak memory of an export, times the weights (hfexport.job.preflight)
    # what its gate hands back beyond a mapped float32 model's pages, times the weights (preflight.export_factor)
    mapped_gate_release: ClassVar[float] = 0.0
    export_cost: ClassVar[float] = 1.0  # an export's relative time, to share targets out (hfexport.job.parallel)
    runtimes: ClassVar[tuple[str, ...]] = ()  # modules of its deployment runtimes (`RUNTIME`, `check_generation(folder, request)`)
    verify_load_options: ClassVar[dict] = {}  # `from_pretrained` options the verifier loads it with
    runs_in_torch: ClassVar[bool] = False  # its graphs run in torch, not in a runtime of their own
    # its gate may run the artifact in a torch-free process of its own (`hfexport.verify.artifact`, with its
    # `formats/<format>/gate_process.py`: ONNX Runtime, OpenVINO)
    gate_in_own_process: ClassVar[bool] = False
    checks_input_spec: ClassVar[bool] = False  # its program checks the input's pytree spec (a static cache's batch)
    one_decoder_graph: ClassVar[bool] = False  # its runtimes' generation contract is one decoder graph
    llm_program: ClassVar[bool] = False  # its generation contract is one program that holds its cache (an LLM runner)
    # its runtime allocates every planned tensor for the dynamic dims' upper bounds at load (ExecuTorch's memory plan)
    plans_memory_for_upper_bounds: ClassVar[bool] = False
    converts_to_float16: ClassVar[bool] = False  # a target's `dtype: float16` converts its saved graph
    generation_variants: ClassVar[bool] = False  # a generation target may be published under a variant's name
    cache_state_option: ClassVar[str | None] = None  # the option that keeps the cache as internal state
    quantized_lowerings: ClassVar[tuple[str, ...] | None] = None  # the `backend` options a quantized target may use
    nncf_quantizer: ClassVar[str] = "NNCFOnnxQuantizer"  # the engine's NNCF quantizer class for it
    nncf_onnx_limits: ClassVar[bool] = False  # NNCF quantizes it through its ONNX backend (fewer weight modes)
    contract_files: ClassVar[tuple[str, ...]] = ()  # a generation target with one is in its runtimes' contract
    sentence_transformers: ClassVar[bool] = False  # sentence-transformers loads it (`backend=<name>`): the card says so
    optimum_classes: ClassVar[tuple[str, str] | None] = None  # optimum's module and class prefix that load it
    variants: ClassVar[tuple[str, ...]] = ()  # the variants a target's `variants` may name (hfexport.quantization.variants)

    def decode_takes_the_prompt(self, config, task: str) -> bool:
        """Whether its runtimes run a generation export's prompt through the decode, so that the decode is traced on
        several new tokens (`generation.multi_token_decode`, unless the recipe sets it); the default: no."""
        return False

    @property
    def suffix(self) -> str:
        """The suffix of its program files (`.onnx`)."""
        return "." + self.default_file.rpartition(".")[2]

    def program_files(self, file: str) -> list[tuple[str, bool]]:
        """The files one component's loader opens, each with whether it must exist (what its exporter writes)."""
        return [(file, True)]

    def published_file(self, relative: str) -> str:
        """A saved file's name as publications name it (the default: as saved)."""
        return relative

    def artifact_name(self, quantization: dict | None = None, dtype: str | None = None) -> str | None:
        """The file name the loaders use for a forward target of this kind, None where they have none."""
        return None if quantization else self.default_file

    def variant_file(self, name: str) -> str:
        """The file a variant's graph is published as, beside the target's own (its runtimes open it by that name)."""
        raise KeyError(f"{self.name} publishes no variant {name!r}")

    def load_options(self, precision: str | None) -> dict:
        """Runner arguments that make it run at `precision` (none: it runs the graph's own element types)."""
        return {}

    def loading_snippets(self, loader: str, repo_id: str, targets: list[CardTarget]) -> list[str]:
        """The code lines it adds to the model card's section of `loader` (`report.card.LOADER_SECTIONS`) for its
        forward `targets` published in `repo_id` (default targets first); none where that loader does not read it.
        The default: sentence-transformers' and optimum's lines where it sets `sentence_transformers` and
        `optimum_classes`."""
        if loader == "sentence-transformers" and self.sentence_transformers:
            return _sentence_transformers_lines(self, repo_id, targets)
        if loader == "optimum" and self.optimum_classes:
            return _optimum_lines(repo_id, targets, *self.optimum_classes)
        return []

    def runtime_snippets(self, repo_id: str, target: CardTarget, passed: list[str]) -> list[str]:
        """The model card's lines that load a generation `target` of it in each of its deployment runtimes that
        `passed` (generated `model.generate`'s tokens in the gate)."""
        return []

    def __repr__(self) -> str:
        return f"<format {self.name}>"


def _sentence_transformers_lines(backend: FormatBackend, repo_id: str, targets: list[CardTarget]) -> list[str]:
    """sentence-transformers' `SentenceTransformer(..., backend=<format>)` for each embedding target of `backend`
    (a target outside its default file and folder named by `file_name`)."""
    lines = []
    for target in targets:
        if target.task in EMBEDDING_TASKS:
            extra = "" if target.folder == backend.folder and not target.stem else \
                f', model_kwargs={{"file_name": "{target.path}"}}'
            lines.append(f'model = SentenceTransformer("{repo_id}", backend="{backend.name}"{extra})  # {target.name}')
    return lines


def _optimum_lines(repo_id: str, targets: list[CardTarget], module: str, prefix: str) -> list[str]:
    """optimum's `<prefix>ForFeatureExtraction` / `<prefix>ForCausalLM` (from `module`) for each embedding or causal
    forward target; a variant only where its folder's default target is published too (optimum reads config.json
    from the subfolder)."""
    lines: list[str] = []
    for tasks, suffix, kwargs in ((EMBEDDING_TASKS, "ForFeatureExtraction", ""),
                                  (CAUSAL_TASKS, "ForCausalLM", ", use_cache=False")):
        found = [target for target in targets if target.task in tasks]
        defaults = {target.folder for target in found if not target.stem}
        for target in found:
            if target.stem and target.folder not in defaults:
                continue
            file_name = f', file_name="{target.path.rsplit("/", 1)[-1]}"' if target.stem else ""
            imported = f"from {module} import {prefix}{suffix}"
            lines += ([] if imported in lines else [imported]) + [
                (f'model = {prefix}{suffix}.from_pretrained("{repo_id}", subfolder="{target.folder}"'
                 f'{file_name}{kwargs})  # {target.name}')]
    return lines


def register_format(backend: type[FormatBackend] | FormatBackend):
    """Register a format under its name (a class is instantiated); usable as a class decorator."""
    instance = backend() if isinstance(backend, type) else backend
    _REGISTRY[instance.name] = instance
    return backend


def unregister_format(name: str) -> None:
    """Take a format out of the registry (a test's stub format)."""
    _REGISTRY.pop(name, None)


def find_format(export_format) -> FormatBackend | None:
    """The registered format named `export_format` (a string or the engine's `ExportFormat`), or None."""
    return _REGISTRY.get(str(getattr(export_format, "value", export_format)))


def format_traits(export_format) -> FormatBackend:
    """The registered format named `export_format`, else a bare `FormatBackend` (every flag off, no runtimes): what
    a layer asks of a format it may not know (an engine format hfexport has no backend for)."""
    return find_format(export_format) or FormatBackend()


def format_backend(export_format) -> FormatBackend:
    """The registered format named `export_format`; a `KeyError` naming the registered ones if there is none."""
    backend = find_format(export_format)
    if backend is None:
        raise KeyError(f"no export format {export_format!r}; formats: {', '.join(_REGISTRY)}")
    return backend


def formats() -> tuple[FormatBackend, ...]:
    """Every registered format, in registration order."""
    return tuple(_REGISTRY.values())


class FormatProgram:
    """What a format does to programs (the artifacts layer): its hooks around the engine's export, save and load, the
    checks of its files and its weight writer. Each format's `program` module subclasses it; the defaults are what a
    format without such a step does. Registered in `hfexport.formats.programs`."""

    name: ClassVar[str]  # its `FormatBackend`'s name
    weights: ClassVar[Any] = None  # its weight writer (`read(folder, file)`, `write(...)`: hfexport.rebind)
    # its generation targets are traced from the model's structure with placeholder weights, the weights written
    # afterwards through the weight map (hfexport.rebind.placeholders): the export never copies the model's weights
    traces_without_weights: ClassVar[bool] = False
    # the preflight's factors of the float32 weights for a target traced without weights (hfexport.job.preflight.
    # structure_stages): what converting the twin holds (ONNX's exporter: what it keeps per parameter), and what the
    # save holds besides the export's and the weights written entry by entry (a quantizer run on the written files;
    # below 0 where the save holds less than the export: OpenVINO's)
    structure_export_memory: ClassVar[float] = 0.06
    #: Whether `structure_export_memory` multiplies the vocabulary's table too (OpenVINO: its converter maps every
    #: placeholder's constant whole); else the weights outside it (ONNX's exporter keeps the one-row placeholders)
    structure_export_vocabulary: ClassVar[bool] = False
    structure_save_memory: ClassVar[float] = 0.0

    def structure_save_factor(self, target) -> float:
        """`structure_save_memory` for `target` (OpenVINO's differs where no quantizer runs on the written files)."""
        return self.structure_save_memory
    #: Whether the format's runtime copies the weights it memory-maps whatever it is told (OpenVINO's CPU plugin
    #: repacks them when it compiles): the gate then hands the mapped pages back as it loads and runs
    #: (`hfexport.verify.check._load`), even where it was asked to load lean
    repacks_mapped_weights: ClassVar[bool] = False

    def mapped_weight_bytes(self, target, loaded: int) -> int:
        """The bytes of the weights a target's artifact holds, which its runtime maps when the gate opens it, from the
        weights' bytes at float32 (`loaded`): the preflight's gate stage for a target traced without weights
        (`hfexport.job.preflight.structure_stages`)."""
        return loaded

    def traced_without_weights(self, quantization, options=None) -> bool:
        """Whether a generation target of this format with `quantization` (its recipe section, None for none) and
        `options` (its recipe options) is traced from the placeholder twin: a format that `traces_without_weights`,
        unquantized."""
        return self.traces_without_weights and not quantization

    def structure_conversion(self, scratch: Path) -> contextlib.AbstractContextManager:
        """Around the export of a placeholder twin: the format's way of keeping the placeholders' copies out of
        memory (`scratch`: a folder for scratch files)."""
        return contextlib.nullcontext()

    def structure_save(self) -> contextlib.AbstractContextManager:
        """Around the save of a placeholder export: the format's way of keeping what its conversion holds of the
        placeholders, read again as the files are written, out of memory."""
        return contextlib.nullcontext()

    def quantize_written(self, folder: Path, quantizer) -> None:
        """Quantize a placeholder export of a quantized target (`traced_without_weights`) once its weights are
        written into `folder`, with the target's `quantizer` (the default: no format quantizes so)."""
        raise NotImplementedError(f"{self.name} exports no quantized target from its structure")

    def export_fixes(self, plan, model) -> contextlib.AbstractContextManager:
        """hfexport's fixes of the backend's lowering, around the engine's export."""
        return contextlib.nullcontext()

    def after_export(self, exported) -> None:
        """Rewrite the engine's programs in place after the export (fusion-ready patterns)."""

    def save(self, model, directory, save, *args, **kwargs):
        """Save `model` with the engine's `save` (its `save_pretrained`)."""
        return save(directory, *args, **kwargs)

    def after_save(self, model, directory: Path, tokenizer=None) -> None:
        """Lay the saved folder out in its runtimes' contract (`tokenizer`: the one `save_pretrained` was given)."""

    def after_rebind(self, directory: Path, model=None) -> None:
        """Rewrite the files of the runtimes' contract derived from the components, once new weights were written into
        the components (`hfexport.rebind.folder.rebind_copy`; the default: none are derived); `model`, where given,
        the model whose weights they were."""

    def save_processor(self, directory: Path, processor) -> None:
        """Save the job's processor beside a saved target where its runtimes' contract reads it (the default: not)."""

    def runner(self):
        """The runner class a loaded export runs on, None for the engine's own."""
        return None

    def generation_runner_options(self) -> dict:
        """Runner options a generation export is loaded with when the caller gives none."""
        return {}

    def lean_load_options(self) -> dict:
        """`from_pretrained` options that keep the runtime from copying the weights it can read memory-mapped, for a
        gate that must not hold a second copy of the model (issue 45: the job exported from its structure); {} where
        the runtime's defaults already map them (OpenVINO's `ENABLE_MMAP`)."""
        return {}

    def component(self, path: Path, metadata, fetch, entry: dict, label: str):
        """A component read lazily from its checked file, None to read its program now (`read`)."""
        return None

    def read(self, path: Path, fetch, entry: dict, allow_unsafe_pt2: bool):
        """One checked program file, read by its backend through the engine's public exporter classes."""
        raise CorruptExportError(f"{path}: unknown export format {self.name!r}")

    def load_hint(self, manifest: dict, components: dict) -> str:
        """What to add to a load failure's message (a missing file beside the program)."""
        return ""

    def check_files(self, found: list, file: str, label: str, source: str, allow_unsafe_pt2: bool) -> None:
        """Check one component's files (`found`: the checked paths of its `program_files`, None where absent)."""

    def published(self, files: dict[str, Path], names: dict[str, str]) -> dict[str, bytes]:
        """Files whose contents change when they are published under `names` (a graph naming its renamed data)."""
        return {}

    def localize(self, folder: Path, local_of: dict[str, str]) -> None:
        """Undo `published`'s renames inside a downloaded export's files (names back as the job saves them)."""

    def write_variant(self, folder: Path, variant: dict, stage: Path, model=None) -> dict | None:
        """Make the variant `variant` (`hfexport.quantization.variants.settings`) of the export saved in `folder`, laid
        out in `stage` as the export's own files with the variant's graph in place of its full-precision one; the
        settings it resolved from the model (an OpenVINO int4 group size), if any. `model`: the eager model the
        export was made from (ExecuTorch's 8da4w quantizes a copy of it)."""
        raise NotImplementedError(f"{self.name} makes no variants")

    def remove_variant(self, folder: Path, file_name: str) -> None:
        """Remove a previous export's variant published as `file_name` from `folder` (the graph and its data)."""
        for stale in (file_name, file_name + "_data"):
            (Path(folder) / stale).unlink(missing_ok=True)

    def keep_variant(self, stage: Path, folder: Path, file_name: str) -> list[str]:
        """Move the variant's graph from `stage` into `folder` as `file_name` (its data renamed with it); its names."""
        raise NotImplementedError(f"{self.name} makes no variants")

    def next_token_scores(self, stage: Path, rows: list[list[int]]) -> list[tuple[list[float], list[int]]]:
        """Per token row: the log-likelihood of each next token and the most likely next token at every position,
        as the graph in `stage` computes them (the variants' quality gate)."""
        raise NotImplementedError(f"{self.name} scores no variants")


@contextlib.contextmanager
def backend_errors(label: str, export_format: str, hint: str = ""):
    """A backend's failure on a file hfexport checked, as one `CorruptExportError` line naming the file (a weights-only
    unpickling refusal as `UnsafeExportError`)."""
    import pickle

    try:
        yield
    except (HfExportError, KeyboardInterrupt):
        raise
    except pickle.UnpicklingError as error:
        raise UnsafeExportError(f"{label}: refused by the weights-only unpickler "
                                f"({first_line(error, 200)})") from None
    except Exception as error:  # noqa: BLE001 - the file passed hfexport's checks: the backend's reason, one line
        backend = find_format(export_format)
        raise CorruptExportError(f"{label}: {backend.runtime_label if backend else export_format} cannot load it: "
                                 f"{type(error).__name__}: {first_line(error, 300)}{hint}") from None
