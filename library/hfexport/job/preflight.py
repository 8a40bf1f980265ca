"""Preflight: will a job fit in memory and on disk? Decided from the weights' metadata, before loading them.

The weights' size comes from safetensors headers (a Hub repo's through `HfApi.get_safetensors_metadata`, which reads
only the headers with range requests; a local folder's through `safetensors.safe_open`), else from the file sizes
of the tree. Needs are estimates with documented multipliers (docs/publishing.md, "Preflight"):

- memory: `RUNTIME_MB` for the imported libraries, plus the weights as loaded for export (`loaded_bytes`: a
  half-precision checkpoint is loaded at float32, `hfexport.models.EXPORT_DTYPE`) times its format's `memory_factor`
  for the largest target (a process exports its targets one
  after another); generation targets that trace several graphs (a prefill and a decode) hold more
  (`GENERATION_FACTOR`), a single-graph one (and ExecuTorch's LLM runner program) as much as a forward export. A job that exports in several
  processes at once (`hfexport.job.parallel`) needs that for each process, summed. Its load: the libraries and the
  weights widened to float32 (a float32 checkpoint is mapped, its pages read by the export); a target's variants
  (the quantize stage): `variants_stage` (`loaded_stages`).
- memory, a job exported from the model's structure (`hfexport.job.structure`: a local safetensors checkpoint, every
  target of the process traced without weights): per stage, `structure_stages` (the libraries, the twin run by the
  plan, the weightless graph, the largest tensor, the gate's streamed reference and the artifact as its runtime maps
  it); the job's need is its largest stage.
- disk: per target, the weights as loaded times `DISK_FACTOR` per component graph (generation exports save one graph per
  stage, each with its weights: `graphs_saved`), plus the download of a Hub model that is not in the local cache yet.

Available memory is `psutil`'s available memory (capped by a cgroup v2 or v1 limit when there is one); disk is
`shutil.disk_usage` of the output's filesystem. `HFEXPORT_MEMORY_LIMIT_MB` / `HFEXPORT_DISK_LIMIT_MB` override
what is available (for tests and for sharing a machine).
"""

from __future__ import annotations

import os
import shutil
from dataclasses import dataclass, field
from pathlib import Path

from hfexport.errors import HfExportError, PreflightError, redact
from hfexport.files import human_bytes
from hfexport.formats import format_traits
from hfexport.formats.programs import format_program
from hfexport.hub import HubRepo
from hfexport.progress import STAGE_LABELS
from hfexport.quantization.variants import settings

RUNTIME_MB = 1024
GENERATION_FACTOR = 1.5
DISK_FACTOR = 1.1
GENERATION_COMPONENTS = 2
DTYPE_BYTES = {"F64": 8, "I64": 8, "U64": 8, "F32": 4, "I32": 4, "U32": 4, "F16": 2, "BF16": 2, "I16": 2, "U16": 2,
               "F8_E4M3": 1, "F8_E5M2": 1, "I8": 1, "U8": 1, "BOOL": 1}


#: Bytes per parameter once loaded for export, where they differ from the stored ones: half-precision floats widened
#: to float32 (`hfexport.models.EXPORT_DTYPE`).
LOADED_BYTES = {"F16": 4, "BF16": 4}

MB = 1 << 20
#: Under this many MB free, a failed write is reported with the disk's free space (`disk_full_hint`).
DISK_FULL_MB = 256


@dataclass
class Estimate:
    """What a job needs (bytes) and what the machine offers; `problems` lists what does not fit."""

    weights_bytes: int
    dtypes: dict[str, int]
    memory_needed: int
    disk_needed: int
    memory_available: int | None
    disk_available: int | None
    problems: list[str] = field(default_factory=list)
    #: bytes of memory each stage needs at its peak: `load_model` (the libraries and the weights widened), `export`
    #: (the largest target's export, `memory_needed`), `variants` where a target has variants (`variants_stage`); for
    #: a job exported from its structure `structure_stages` (`plan`, `save`, `verify` too); what the report's measured peaks
    #: are set beside
    memory_stages: dict[str, int] = field(default_factory=dict)

    @property
    def fits(self) -> bool:
        return not self.problems


def _human(count: int | float) -> str:

    return human_bytes(int(count))


def weights_metadata(model: str | Path, revision: str | None = None, token: str | None = None) -> tuple[int, dict]:
    """(bytes of the weights, parameter count per dtype) of a local folder or Hub repo, without loading them."""
    path = Path(str(model))
    if path.is_dir():
        return _local_weights(path)
    return _hub_weights(str(model), revision, token)


def _local_weights(folder: Path) -> tuple[int, dict]:
    from safetensors import safe_open

    files = sorted(folder.glob("*.safetensors"))
    counts: dict[str, int] = {}
    total = 0
    for file in files:
        with safe_open(str(file), framework="numpy") as handle:
            for key in handle.keys():
                tensor = handle.get_slice(key)
                size = 1
                for dim in tensor.get_shape():
                    size *= dim
                counts[tensor.get_dtype()] = counts.get(tensor.get_dtype(), 0) + size
                total += size * DTYPE_BYTES.get(tensor.get_dtype(), 4)
    if not files:  # .bin / .pt checkpoints: their file sizes
        total = sum(file.stat().st_size for pattern in ("*.bin", "*.pt", "*.pth") for file in folder.glob(pattern))
    return total, counts


def _hub_weights(repo_id: str, revision: str | None, token: str | None) -> tuple[int, dict]:
    from huggingface_hub.errors import NotASafetensorsRepoError

    repo = HubRepo(repo_id, revision, token)
    try:
        metadata = repo.api.get_safetensors_metadata(repo_id, revision=revision)
        counts = dict(metadata.parameter_count)
        return sum(count * DTYPE_BYTES.get(dtype, 4) for dtype, count in counts.items()), counts
    except NotASafetensorsRepoError:
        pass
    except Exception as error:  # noqa: BLE001 - every Hub failure becomes one readable line
        raise repo.error(error, "reading the weights' safetensors headers") from None
    info = repo.info(files_metadata=True, action="listing the weights")
    total = sum(sibling.size or 0 for sibling in info.siblings or []
                if sibling.rfilename.endswith((".bin", ".pt", ".pth", ".safetensors")))
    return total, {}


def loaded_bytes(weights: int, dtypes: dict) -> int:
    """The weights' bytes once loaded for export (`LOADED_BYTES`), from `weights_metadata`'s answer; the stored bytes
    when the per-dtype counts are unknown (no safetensors)."""
    return weights + sum(count * (LOADED_BYTES[dtype] - DTYPE_BYTES[dtype]) for dtype, count in dtypes.items()
                         if dtype in LOADED_BYTES)


def memory_factor(target) -> float:
    """How many times its weights one target's export holds in memory at its peak: the format's factor, times
    `GENERATION_FACTOR` where the target traces several graphs (`graphs_saved`). Measured: Llama-3.2-1B's config at
    full depth, one ONNX or OpenVINO generation graph, peaked at 1 GiB + 2.9 x its float32 weights; ExecuTorch's LLM
    runner program at 1 GiB + 3.1 x while lowering and 3.9-4.1 x while saving in two runs (its weight map reads the
    written .pte beside the model) (tests/test_full_depth.py); through the gate, on SmolLM2-135M-Instruct and a 2-layer
    Llama-3.2-1B config, OpenVINO 2.8 and 2.1 x, ExecuTorch 4.5 and 2.9 x: OpenVINO's factor is 3.1, ExecuTorch's
    4.2 (benchmarks/stage_memory_variants.py)."""
    several = target.mode == "generation" and graphs_saved(target) > 1
    return format_traits(target.export_format).memory_factor * (GENERATION_FACTOR if several else 1.0)


def graphs_saved(target) -> int:
    """How many graphs, each holding the weights, the target saves: a generation target's prefill and decode, or the
    decode alone (`generation.single_graph`), or ExecuTorch's LLM runner program (`llm_runner_by_default`: one program
    that holds its cache; the plan falls back to the pair for a model that is not a decoder-only text model, which
    the estimate, made before the config is read, does not know)."""
    if target.mode != "generation" or target.single_graph or target.llm_runner_by_default:
        return 1
    return GENERATION_COMPONENTS


#: What a gate that keeps a mapped float32 checkpoint's model hands back before the artifact's runtime opens (its
#: still-file pages, `hfexport.job.memory.drop_mapped_weights`), as a factor of the weights: SmolLM2-135M-Instruct's
#: OpenVINO job through the gate 2542 -> 1824 MB (docs/publishing.md, "Memory"). A widened (bfloat16) model is its
#: own memory and stays.
MAPPED_GATE_RELEASE = 1.0


def export_factor(targets, widened: bool = True) -> float:
    """How many times its weights a process exporting `targets` from the loaded model holds: its largest target's
    `memory_factor`, less `MAPPED_GATE_RELEASE` and its format's `mapped_gate_release` where the checkpoint is float32
    and mapped (not `widened`)."""
    def factor(target) -> float:
        release = MAPPED_GATE_RELEASE + format_traits(target.export_format).mapped_gate_release
        return memory_factor(target) - (0.0 if widened else release)

    return max(1.0, max(map(factor, targets), default=1.0))


def memory_needed(weights: int, groups, widened: bool = True) -> int:
    """Bytes of memory for exporting `groups` (lists of recipe `Target`s), one process per group, all at once: each
    process its libraries plus the weights times its `export_factor`."""
    return sum(RUNTIME_MB * MB + int(weights * export_factor(group, widened)) for group in groups)


#: A job exported from the model's structure (issue 45, `hfexport.job.structure`), per stage, in bytes: the libraries a
#: job's process holds once torch, transformers and the engine are imported (`LIBRARIES_MB`), plus factors of the
#: float32 weights (`loaded`; the format's own for its export and save: `FormatProgram.structure_export_memory`,
#: `structure_save_memory`), of the largest tensor at float32 and of what the artifact's runtime maps
#: (`FormatProgram.mapped_weight_bytes`). Measured on Llama-3.2-1B's width, bfloat16 on disk, a float16 ONNX
#: generation target, at 2 and 16 layers (docs/publishing.md, "Preflight"; tests/test_structure_memory.py).
LIBRARIES_MB = 560
#: What the plan holds beside the libraries and the twin, which it runs (the engine's split of `generate`): torch's
#: linear copies a placeholder weight (one row expanded) whole before its product, one at a time; a vocabulary's head
#: is run a block of rows at a time (`hfexport.rebind.streaming.placeholders_in_blocks`). Measured at Llama-3.2-1B's
#: width and vocabulary (T 64 MiB): 556 MB at 2 layers, 594-690 at 16, against 624 (docs/publishing.md, "Preflight");
#: SmolLM2-135M-Instruct's ONNX q8 + q4 job 534 against 624 (tests/test_memory.py's slow ±25% test).
STRUCTURE_PLAN_TENSORS = 1
STRUCTURE_SAVE_TENSORS = 5
STRUCTURE_MAPPED = 1.0
#: What the gate's eager side holds beside the converted blocks it keeps (`GATE_RESERVE` is what it leaves for
#: them): a block in flight, activations, the references.
STRUCTURE_GATE_TENSORS = 2
#: What the gate's artifact process (`hfexport.verify.artifact`) adds to the artifact's mapped weights beside what the
#: gate in process held: its interpreter, ONNX Runtime and NumPy (53 MB) and its copy of the largest probe's
#: references. The verify stage counts that process beside the exporting one; the buffers both forms hold are not
#: estimated (SmolLM2-135M-Instruct f32: 877 + 915 MB measured against 1207 estimated; docs/publishing.md, "Memory").
#: OpenVINO's process (OpenVINO and NumPy ~55 MB) holds the plugin's repacked copy and its buffers, which its
#: `mapped_weight_bytes` counts (SmolLM2's float32 gate apart, from the loaded model: 807 + 908 MB measured).
ARTIFACT_PROCESS = 60 * MB
#: What the gate's eager side needs besides the streamed weights it keeps: a block in flight (read and converted),
#: the activations, the references it holds for the comparison (`hfexport.job.structure._resident_bytes`).
GATE_RESERVE = 1 << 30


#: The variants stage (`hfexport.verify.variants.gate_variants`, each variant made from the saved export and gated),
#: per variant, what its making and gating hold beside the libraries and the eager model (the job's model, which each
#: variant's gate reads), as a factor of the float32 weights (`loaded`); a target's stage needs its largest variant's.
#: Measured, each pair together, on SmolLM2-135M-Instruct (float32 on disk) and a 2-layer Llama-3.2-1B config
#: (bfloat16): q8+q4 0.69 and 1.26 since they are made a weight at a time (2.84 and 1.68 with the quantizer holding
#: the float32 graph), int8+int4 2.49 and 2.16, 8da4w 4.42 and 2.93 (benchmarks/stage_memory_variants.py); q4f16's
#: stage is not measured apart: q4's figure (its making peaks 57 and 39 MB above q4's, 0.1 of the weights:
#: benchmarks/variant_write_memory.py); fp16 1.25 since its float16 conversion writes each weight as it converts it
#: (`float16.streamed_float16_model`; 2.25 when it held the float32 graph and its float16 copy): its stage measured
#: 0.97 and 1.38 beside what the estimate counts (benchmarks/stage_memory_variants.py, onnx-fp16: the gate's float16
#: session beside the model; the estimate +9% and -4%).
VARIANT_MEMORY = {"fp16": 1.25, "q8": 1.0, "q4": 1.0, "q4f16": 1.0, "int8": 2.3, "int4": 2.3, "8da4w": 3.6}
#: A job exported from its structure whose gate loads the model (variants, latency timed): what the export and the
#: save leave resident when it loads, as a factor of the float32 weights (measured 0.49 and 0.6: SmolLM2-135M-Instruct
#: and a 2-layer Llama-3.2-1B config, with variants)
STRUCTURE_RELOAD = 0.5


def variants_stage(targets, loaded: int, libraries: int) -> int | None:
    """The memory the variants stage of a process exporting `targets` needs at its peak: `libraries`, the eager
    model (`loaded`) and the largest variant's `VARIANT_MEMORY`; None where no target has variants."""
    factors = [VARIANT_MEMORY[settings(item)["name"]] for t in targets for item in (t.variants or [])]
    return libraries + loaded + int(max(factors) * loaded) if factors else None


def largest_tensor_bytes(folder: Path, blocks: bool = True) -> int:
    """The largest tensor of the safetensors checkpoint in `folder`, in bytes at float32 (from the headers), outside
    the vocabulary's (a 2-D tensor of config.json's `vocab_size` rows: the embedding and head, which the writers and
    the gate's streamed reference read a block of rows at a time, `weight_map.BLOCK_BYTES` and
    `streaming.VOCABULARY_BLOCK_BYTES`; counted as one such block). `blocks` False: the largest, whole."""
    from safetensors import safe_open

    vocabulary = _vocab_size(Path(folder))
    largest = 0
    for file in sorted(Path(folder).glob("*.safetensors")):
        with safe_open(str(file), framework="numpy") as handle:
            for key in handle.keys():
                shape = handle.get_slice(key).get_shape()
                size = 4
                for dim in shape:
                    size *= dim
                in_blocks = blocks and len(shape) == 2 and vocabulary and shape[0] == vocabulary
                largest = max(largest, min(size, VOCABULARY_BLOCK) if in_blocks else size)
    return largest


#: What a vocabulary's tensor counts for in `largest_tensor_bytes`: one block of its rows, as the writers and the
#: streamed reference read it (64 MiB at float32).
VOCABULARY_BLOCK = 64 << 20


def _vocab_size(folder: Path) -> int | None:
    """config.json's `vocab_size` (or its `text_config`'s) in `folder`; None where it does not say."""
    import json

    try:
        config = json.loads((folder / "config.json").read_text(encoding="utf-8"))
        size = config.get("vocab_size") or (config.get("text_config") or {}).get("vocab_size")
    except (OSError, ValueError, AttributeError):
        return None
    return size if isinstance(size, int) and size > 0 else None


def loaded_stages(targets, loaded: int, widened: bool = True) -> dict:
    """The memory each stage of a process exporting `targets` from the loaded model needs at its peak: `load_model`
    the libraries and, where the checkpoint is widened to float32 (`widened`), the weights as loaded (a float32
    checkpoint is mapped, its pages read later), `export` the largest target's export (`memory_needed`: its save
    and gate included), and `variants` where a target has them (`variants_stage`)."""
    stages = {"load_model": LIBRARIES_MB * MB + (loaded if widened else 0),
              "export": memory_needed(loaded, [targets], widened)}
    variants = variants_stage(targets, loaded, LIBRARIES_MB * MB)
    return {**stages, "variants": variants} if variants is not None else stages


def gate_apart(target) -> bool:
    """Whether the gate's artifact side of `target` may run in a process of its own (its format's
    `gate_in_own_process`, a generation target, not quantized, its cache kept as state where the format can keep it
    so and the recipe does not turn that off: OpenVINO's `stateful`): the verify stage is then the eager pass, or
    that process beside this one's references (`hfexport.job.structure.load_reference`, whose rule,
    `hfexport.verify.check.artifact_process_refusal`, reads the saved artifact too: one it refuses runs in process,
    estimated by the larger of the two)."""
    traits = format_traits(str(target.export_format))
    state = traits.cache_state_option
    return traits.gate_in_own_process and target.mode == "generation" and not target.quantization and \
        (state is None or (target.options or {}).get(state) is not False)


def structure_stages(targets, loaded: int, largest: int, available: int | None, streamed_gate: bool,
                     widened: bool = True, whole: int | None = None) -> dict:
    """The memory each stage of a process whose `targets` are all traced without weights needs at its peak, from a
    local safetensors checkpoint (`hfexport.job.structure`): `load_model` the libraries and the placeholder twin
    (where the gate loads the model: what the export left, `STRUCTURE_RELOAD`, and the weights widened to float32);
    `plan` the twin run by the engine's split of `generate` (`STRUCTURE_PLAN_TENSORS` x the largest tensor: the
    placeholder a linear layer copies whole, a vocabulary's head a block); `export` the weightless graph (the format's `structure_export_memory` x the weights, less the vocabulary's
    table `whole` where it is placeholders there: `structure_export_vocabulary`); `save` the graph written,
    converted (float16) and its weights written from the shards one map entry at a time (`STRUCTURE_SAVE_TENSORS` x
    the largest tensor outside a vocabulary's, plus for a float16 target the largest tensor `whole` at float16: the
    converted graph's initializer, written whole), a quantizer run on them (`structure_save_memory` x the weights);
    `verify` the gate's eager
    side (the converted blocks the streamed reference keeps: the weights, or what `available` leaves beside
    `GATE_RESERVE`; plus `STRUCTURE_GATE_TENSORS` x the largest tensor) and the artifact's runtime mapping its
    weights (in a process of its own, `gate_apart`: that process's own, `ARTIFACT_PROCESS`, too): the
    larger where the gate streams the model and lets it go first, the sum where it loads it (latency
    timed, or variants: `variants_stage`) widened to float32 (a mapped float32 one's pages are handed back first).
    `available`: the memory the job may use (its budget)."""
    libraries = LIBRARIES_MB * MB
    streamed_gate = streamed_gate and not any(t.variants for t in targets)  # a variant's gate reads the model
    apart = streamed_gate and all(map(gate_apart, targets))
    if streamed_gate:
        budget = loaded if available is None else max(0, min(loaded, available - libraries - GATE_RESERVE))
    else:
        budget = loaded
    programs = [format_program(t.export_format) for t in targets]
    mapped = int(STRUCTURE_MAPPED * max(p.mapped_weight_bytes(t, loaded) for p, t in zip(programs, targets)))
    table = whole if whole and whole > largest else 0  # a vocabulary table (read in blocks), at float32
    export = libraries + int(max(p.structure_export_memory * (loaded - (0 if p.structure_export_vocabulary else table))
                                 for p in programs))
    reference = budget + STRUCTURE_GATE_TENSORS * largest
    stages = {
        "load_model": libraries if streamed_gate else
        libraries + int(STRUCTURE_RELOAD * loaded) + (loaded if widened else 0),
        "plan": libraries + STRUCTURE_PLAN_TENSORS * largest,
        "export": export,
        "save": export + STRUCTURE_SAVE_TENSORS * largest
        + int(max(p.structure_save_factor(t) for p, t in zip(programs, targets)) * loaded)
        + ((whole or largest) // 2 if any(t.dtype == "float16" for t in targets) else 0),
        # the model released before the artifact's runtime opens where the gate streams it, or its mapped pages
        # handed back (a float32 checkpoint, `MAPPED_GATE_RELEASE`); a widened model's held beside the runtime
        # where the artifact is checked in a process of its own, that process beside this one (`ARTIFACT_PROCESS`)
        "verify": libraries + (max(reference, ARTIFACT_PROCESS + mapped) if apart
                               else reference + mapped if widened and not streamed_gate else max(reference, mapped)),
    }
    variants = variants_stage(targets, loaded, libraries)
    return {**stages, "variants": variants} if variants is not None else stages


def estimate(model: str | Path, targets, output: str | Path, revision: str | None = None,
             token: str | None = None, groups=None, weights: tuple[int, dict] | None = None,
             max_memory: int | None = None, structure=None, streamed_gate: bool = False) -> Estimate:
    """Memory and disk a job exporting `targets` (recipe `Target`s) of `model` into `output` needs, and has.
    `groups`: the targets split over processes that export at the same time (default: one process for all);
    `weights`: `weights_metadata`'s answer when the caller already has it; `max_memory`: the job's memory budget in
    bytes (`--max-memory`), which caps what is available. `structure`: where the job may export from the model's
    structure (`hfexport.job.structure`: no inputs or samples of the caller's), whether a target is traced without
    weights there (a predicate), and `streamed_gate`: whether its gate may stream the eager reference (no latency
    timed); a process whose targets all are then needs `structure_stages`, not the weights times a factor."""
    targets = list(targets)
    groups = [targets] if groups is None else groups
    weights, dtypes = weights or weights_metadata(model, revision, token)
    loaded = loaded_bytes(weights, dtypes)
    widened = loaded != weights or not dtypes  # no safetensors headers: a pickled checkpoint is read into memory
    available = available_memory()
    budget = max_memory is not None and (available is None or max_memory < available)
    largest = largest_tensor_bytes(model) if structure is not None and dtypes and Path(str(model)).is_dir() else None
    whole = largest_tensor_bytes(model, blocks=False) if largest is not None else None  # headers read once, not per group
    stages_per_group = [
        structure_stages(group, loaded, largest, max_memory if budget else available, streamed_gate, widened, whole)
        if largest is not None and all(map(structure, group)) else
        loaded_stages(group, loaded, widened) for group in groups]
    memory = sum(max(stages.values()) for stages in stages_per_group)
    memory_stages: dict[str, int] = {}
    for stages in stages_per_group:
        for stage, need in stages.items():
            memory_stages[stage] = memory_stages.get(stage, 0) + need
    disk = sum(int(loaded * DISK_FACTOR * graphs_saved(t)) for t in targets)
    output_dir = _existing_parent(Path(output))
    download = 0 if Path(str(model)).is_dir() or _cached(str(model), revision) else weights
    if download and _same_filesystem(output_dir, _hf_cache_dir()):
        disk += download
    result = Estimate(weights, dtypes, memory, disk, max_memory if budget else available, available_disk(output_dir),
                      memory_stages=memory_stages)
    what = f"weights {_human(loaded)}" + (" as loaded, at float32" if loaded != weights else "")
    if result.memory_available is not None and memory > result.memory_available:
        processes = f" in each of {len(groups)} export processes" if len(groups) > 1 else ""
        stage = max(memory_stages, key=memory_stages.get)
        if stage == "variants":
            made = sorted({settings(item)["name"] for t in targets for item in (t.variants or [])})
            how = f"{what}, the model beside the variants {', '.join(made)} made and gated"
        elif "save" in memory_stages:
            how = f"{what}, {_worst(targets)} exported from the model's structure"
        else:
            how = (f"{what} × {export_factor(targets, widened):g} for {_worst(targets)} + {_human(RUNTIME_MB * MB)} "
                   "for the libraries")
        result.problems.append(
            f"not enough memory: about {_human(memory)} needed at the {STAGE_LABELS.get(stage, stage)} stage "
            f"({how}{processes}), "
            + (f"the --max-memory budget is {_human(max_memory)}" if budget
               else f"{_human(result.memory_available)} available")
            + (" (export in one process: --workers 1)" if processes else "")
        )
    if result.disk_available is not None and disk > result.disk_available:
        result.problems.append(
            f"not enough disk space in {output_dir}: about {_human(disk)} needed ({what} × {DISK_FACTOR:g} per graph "
            f"for {len(list(targets))} target(s)" + (f", plus {_human(download)} to download" if download else "")
            + f"), {_human(result.disk_available)} free"
        )
    return result


def check_fits(model: str | Path, targets, output: str | Path, revision: str | None = None,
               token: str | None = None, groups=None, weights: tuple[int, dict] | None = None,
               max_memory: int | None = None, structure=None, streamed_gate: bool = False) -> Estimate:
    """`estimate`, raising `PreflightError` when the job does not fit."""
    try:
        result = estimate(model, targets, output, revision, token, groups, weights, max_memory, structure,
                          streamed_gate)
    except HfExportError:
        raise
    except Exception:  # noqa: BLE001 - an estimate we cannot make must not block the job
        return Estimate(0, {}, 0, 0, None, None, [])  # the loader reports real access problems itself
    if not result.fits:
        advice = "raise --max-memory" if max_memory is not None else "pass --no-preflight to try anyway"
        raise PreflightError(f"{model}: " + "; ".join(result.problems) + f" ({advice}, or export fewer targets)")
    return result



def _worst(targets) -> str:
    worst = max(targets, key=lambda t: format_traits(t.export_format).memory_factor, default=None)
    return f"{worst.export_format}/{worst.mode}" if worst else "the targets"


def available_memory() -> int | None:
    """Bytes of memory available to this process (HFEXPORT_MEMORY_LIMIT_MB overrides)."""
    override = _env_mb("HFEXPORT_MEMORY_LIMIT_MB")
    if override is not None:
        return override
    available = None
    try:
        import psutil

        available = psutil.virtual_memory().available
    except ImportError:
        available = _meminfo_available()
    limit = _cgroup_headroom()
    return min(v for v in (available, limit) if v is not None) if (available or limit) else None


def available_disk(path: Path) -> int | None:
    override = _env_mb("HFEXPORT_DISK_LIMIT_MB")
    if override is not None:
        return override
    try:
        return shutil.disk_usage(path).free
    except OSError:
        return None


def disk_full_hint(path: Path) -> str:
    """" (N MB free on the disk of PATH: full?)" when the disk `path` writes to has under `DISK_FULL_MB` free, else
    "": a write that failed there most likely ran out of space (OpenVINO then says only "iostream error")."""
    free = available_disk(_existing_parent(Path(path)))
    if free is None or free >= DISK_FULL_MB * MB:
        return ""
    return f" ({free / MB:.0f} MB free on the disk of {path}: full?)"


def _env_mb(name: str) -> int | None:
    value = os.environ.get(name)
    if not value:
        return None
    try:
        return int(float(value) * MB)
    except ValueError:
        raise PreflightError(f"{name}={redact(value)!r} is not a number of megabytes") from None


def _meminfo_available() -> int | None:
    try:
        for line in Path("/proc/meminfo").read_text().splitlines():
            if line.startswith("MemAvailable:"):
                return int(line.split()[1]) * 1024
    except (OSError, ValueError, IndexError):
        pass
    return None


def _cgroup_headroom() -> int | None:
    """The cgroup memory limit minus what the cgroup uses, when the process runs under one: cgroup v2's memory.max and
    memory.current, or cgroup v1's memory.limit_in_bytes and memory.usage_in_bytes (of the process's own cgroup).
    Inactive file pages (memory.stat) count as free, as `docker stats` does: the kernel reclaims them before it fails a
    charge, and the job's own reading of the checkpoint (its cache key hashes the shards) would otherwise leave it
    refused by the page cache it just filled."""
    try:
        limit = Path("/sys/fs/cgroup/memory.max").read_text().strip()
        current = int(Path("/sys/fs/cgroup/memory.current").read_text().strip())
        reclaimable = _stat(Path("/sys/fs/cgroup/memory.stat"), "inactive_file")
        return None if limit == "max" else max(int(limit) - current + reclaimable, 0)
    except (OSError, ValueError):
        pass
    try:
        own = next(line.split(":", 2)[2] for line in Path("/proc/self/cgroup").read_text().splitlines()
                   if line.split(":", 2)[1] == "memory")
        folder = Path("/sys/fs/cgroup/memory") / own.lstrip("/")
        limit_v1 = int((folder / "memory.limit_in_bytes").read_text().strip())
        usage = int((folder / "memory.usage_in_bytes").read_text().strip())
        reclaimable = _stat(folder / "memory.stat", "total_inactive_file")
    except (OSError, ValueError, IndexError, StopIteration):
        return None
    return None if limit_v1 >= 1 << 60 else max(limit_v1 - usage + reclaimable, 0)  # v1's "no limit": a huge number


def _stat(path: Path, key: str) -> int:
    """`key`'s value in a cgroup's memory.stat, 0 when absent."""
    for line in path.read_text().splitlines():
        name, _, value = line.partition(" ")
        if name == key:
            return int(value)
    return 0


def _existing_parent(path: Path) -> Path:
    path = path.resolve()
    while not path.exists() and path != path.parent:
        path = path.parent
    return path


def _hf_cache_dir() -> Path:
    from huggingface_hub import constants

    return _existing_parent(Path(constants.HF_HUB_CACHE))


def _same_filesystem(a: Path, b: Path) -> bool:
    try:
        return a.stat().st_dev == b.stat().st_dev
    except OSError:
        return True


def _cached(repo_id: str, revision: str | None) -> bool:
    """Whether the repo's weights are already in the local Hub cache at this revision."""
    from huggingface_hub import try_to_load_from_cache

    for name in ("model.safetensors", "model.safetensors.index.json", "pytorch_model.bin"):
        if isinstance(try_to_load_from_cache(repo_id, name, revision=revision), str):
            return True
    return False


def runtime_refusals(target, config: dict) -> list[dict]:
    """The deployment runtimes of a generation target's format that cannot run a model of this `config.json`, each
    `not_checked` with its upstream reason, known from the config before the export starts (each runtime module's
    `limitation(config)`, where it has one). The gate answers the same for them, without running them."""
    import importlib

    if target.mode != "generation":
        return []
    refused = []
    for name in format_traits(target.export_format).runtimes:
        module = importlib.import_module(name)
        reason = getattr(module, "limitation", None) and module.limitation(config)
        if reason:
            refused.append({"runtime": module.RUNTIME, "verdict": "not_checked", "reason": reason})
    return refused


def check_memory_plan(plan, name: str) -> None:
    """Refuse a target, before its export, whose programs would allocate more at load than this machine has: a
    format that plans its memory for the dims' upper bounds (ExecuTorch: `plans_memory_for_upper_bounds`) allocates
    it all when the program loads, which the gate does here (`plan.memory_plan`,
    `hfexport.plan.memory_plan.estimate_memory_plan`)."""
    estimate = plan.memory_plan
    available = available_memory() if estimate else None
    if available is None or estimate["bytes"] <= available:
        return
    largest, bounds = estimate["largest"], estimate["bounds"]
    label = format_traits(plan.target.export_format).label
    raise PreflightError(
        f"targets.{name}: {label} plans every tensor's memory for its dims' upper bounds (batch <= {bounds['batch']}, "
        f"sequence <= {bounds['length']}) and allocates it when the program loads: its {largest['what']} scores "
        f"{largest['shape']} float32 alone are {_human(largest['bytes'])}, about {_human(estimate['bytes'])} in all, "
        f"and {_human(available)} are available; lower the bounds in the recipe: `generation.max_cache_len`, or "
        "`dynamic_shapes` with named dims and their `dims` (the default batch bound is at least 8, the verifier's "
        "probe)")
