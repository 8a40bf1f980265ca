"""A job exported from the model's structure before its weights are loaded (issue 45): where every target its process
exports is traced without weights (an ONNX generation target, a float32 or int8-weight OpenVINO one:
`FormatProgram.traced_without_weights`), the job plans
and exports on the placeholder twin built from config.json (`hfexport.rebind.placeholders`), writes the weights
from the checkpoint's safetensors shards through the weight map, entry by entry (`CheckpointTensors`), and loads
the model only when something needs its weights: the gate's eager reference, a rebind, a target that turns out to
need the weights export. So planning and exporting hold one row per parameter and one map entry's tensors, never
the model; a job that does not verify never loads it.

The twin is used where the export from it is the one from the weights, byte for byte: a local folder (or a Hub
repo id's snapshot: `_checkpoint_folder`) of safetensors shards that hold every state_dict key (a tied one saved
once), no parameter bit-identical to another, constant or symmetric (`weight_map.degenerate_keys`, read from the
shards one tensor at a time), a recipe that leaves rebinding on, no samples or inputs of the caller's. Anything
else loads the model first, as before. docs/rebind.md, "The structure traced without weights"; docs/publishing.md,
"Memory".
"""

from __future__ import annotations

import ctypes
import gc
import json
import weakref
from dataclasses import dataclass
from pathlib import Path

from hfexport.formats.programs import format_program
from hfexport.hub import HubRepo, looks_like_repo_id
from hfexport.files import current_rss
from hfexport.job.memory import MB, drop_mapped_weights
from hfexport.job.preflight import GATE_RESERVE, available_memory
from hfexport.logs import engine_output, import_engine
from hfexport.models import EXPORT_DTYPE, checkpoint_dtype, load_config, load_model, model_class_for
from hfexport.progress import StepTimer
from hfexport.rebind.checkpoint import INDEX_FILE, CheckpointTensors
from hfexport.rebind.placeholders import (made_on, placeholder_model, plan_quantizer, structure_for, traces_on,
                                          without_quantizer)
from hfexport.rebind.streaming import is_streamed, streamed_model
from hfexport.rebind.weight_map import degenerate_keys, sources
from hfexport.verify.check import artifact_process_refusal


@dataclass
class Structure:
    """The job's twin (the job's `model_object` until the model is loaded) and where its weights are read from."""
    twin: object
    tensors: CheckpointTensors


def load_structure(job) -> None:
    """Make `job.model_object` the model's placeholder twin and `job.structure` its shards, where every target of
    the job's own process can be exported from them (the module's docstring); else leave the job as it is, for
    `hfexport.job.run._load` to load the model."""
    options = job.options
    targets = [job.recipe.target(name) for group in job.groups[:1] for name in group]
    if job.model_object is not None or options.inputs is not None or job.samples or \
            not targets or not all(traced_without_weights(target) for target in targets):
        return
    folder = _checkpoint_folder(job)
    if folder is None:
        return
    import_engine()
    with StepTimer(job.progress, "load_model", detail=f"{job.model}: its structure, no weights") as timer, \
            engine_output("load_model"):
        structure = _twin(job, folder)
    job.report.timings["load_model_s"] = round(timer.seconds, 4)
    if structure is not None:
        job.model_object, job.structure = structure.twin, structure


def traced_without_weights(target) -> bool:
    """Whether `target` is exported from the placeholder twin (its format's rule for its quantization, a generation
    target that rebinds): the job's and the preflight's one test."""
    return format_program(target.export_format).traced_without_weights(target.quantization, target.options) \
        and target.mode == "generation" and target.rebind


def _checkpoint_folder(job) -> Path | None:
    """The folder the twin and its shards are read from: the job's local folder, or, for a Hub repo id, its revision's
    snapshot in the Hub cache with only what this path reads downloaded (config.json, generation_config.json, the
    safetensors index and shards: where the model is loaded later, for the gate, transformers finds them there);
    None where the Hub revision has no safetensors checkpoint (the model is loaded as before)."""
    folder = Path(str(job.model))
    if folder.is_dir():
        return folder
    if not looks_like_repo_id(str(job.model)):
        return None
    repo = HubRepo(str(job.model), job.revision_to_load, job.options.token)
    config = repo.download("config.json")
    index = repo.download(INDEX_FILE)
    try:
        shards = sorted(set(json.loads(index.read_text(encoding="utf-8"))["weight_map"].values())) if index else \
            ["model.safetensors"]
    except (ValueError, KeyError, TypeError, AttributeError):
        return None  # an index that does not read: transformers' loader says what is wrong with it
    if config is None or any(not isinstance(name, str) or "/" in name or "\\" in name for name in shards):
        return None
    if not all(repo.download(name) for name in shards):
        return None
    repo.download("generation_config.json")
    return config.parent


def _twin(job, folder: Path) -> Structure | None:
    """The twin of the model in `folder` and its shards; None where the export from it would not be the one from the
    weights."""
    import torch
    from transformers import GenerationConfig

    config = load_config(folder, None, job.options.token, job.options.trust_remote_code)
    stored = checkpoint_dtype(config)  # before the twin is built at float32, which sets the config's dtype
    cls = model_class_for(config, job.recipe.task, job.recipe.model_class)
    try:
        with torch.device("meta"):  # an Auto class names the model's class once built
            model_class = type(cls.from_config(config) if hasattr(cls, "from_config") else cls._from_config(config))
        twin = placeholder_model(config, model_class, dtype=getattr(torch, EXPORT_DTYPE))
        shards = CheckpointTensors(folder, getattr(torch, EXPORT_DTYPE), twin.state_dict().keys())
    except Exception:  # noqa: BLE001 - a structure that cannot be built so (or no safetensors): load the model
        return None
    tied = {name: group for group in sources(twin)[2] for name in group}
    if any(name not in shards.where and not any(other in shards.where for other in tied.get(name, ()))
           for name, _ in twin.named_parameters(remove_duplicate=False)):
        return None  # a parameter the shards do not hold under its name (a renamed checkpoint): transformers' loader
    try:
        if degenerate_keys(twin, tensors=CheckpointTensors(folder)):
            return None
        generation = folder / "generation_config.json"
        twin.generation_config = GenerationConfig.from_pretrained(folder) if generation.is_file() else \
            GenerationConfig.from_model_config(config)
    except Exception:  # noqa: BLE001 - a shard or file that does not read: the model's loader says what is wrong
        return None
    if stored:
        job.report.source["checkpoint_dtype"] = stored
    return Structure(twin, shards)


def load_weights(job) -> None:
    """The job's model loaded in place of its twin (the gate's eager reference, a rebind, an export from the
    weights), once; nothing for a job that loaded the model from the start. A streamed reference left in place (a gate
    that failed before releasing it) is replaced too: its parameters are placeholders outside its forward."""
    if job.structure is None or job.model_object is not job.structure.twin and not is_streamed(job.model_object):
        return
    with StepTimer(job.progress, "load_model", detail=f"{job.model}: its weights, for the gate") as timer, \
            engine_output("load_model"):
        job.model_object = load_model(job.model, job.recipe, job.revision_to_load, job.options.token,
                                      job.options.trust_remote_code)
    _add_load_time(job, timer.seconds)


def load_reference(job, plan, folder: Path | None = None) -> None:
    """The gate's eager reference as `job.model_object`: for a target whose gate releases the model
    (`gate_releases`' conditions) in a job exported from its structure, the model with its weights streamed from the
    shards block by block while it runs (`hfexport.rebind.streaming`: the float32 model never in memory, each
    forward reading the checkpoint again), keeping converted blocks between forwards up to `_resident_bytes` (the
    budget's room: none within a tight `--max-memory` or cgroup; all dropped before the artifact's runtime opens, in
    this process or in one of its own, `hfexport.verify.check.artifact_process_refusal`); else the model loaded
    (`load_weights`)."""
    structure = job.structure
    if structure is None or job.model_object is not structure.twin or not _gate_alone(job, plan):
        load_weights(job)
        return
    import torch

    gc.collect()  # what the export and the save left on the heap handed back first: it counts against the budget
    _trim_heap()
    # kept where the budget has room: each forward reads the checkpoint again for what is not (SmolLM2-135M's gate
    # 4.8 -> 62.9 s with none kept; docs/publishing.md, "Memory")
    resident = _resident_bytes(job)
    apart = folder is not None and artifact_process_refusal(folder, plan, structure.twin.config) is None
    kept = f"up to {resident >> 20} MB kept between forwards" + \
        ("; the artifact then checked in a process of its own" if apart else "")
    with StepTimer(job.progress, "load_model", detail=f"{job.model}: its weights streamed block by block, for the "
                   f"gate ({kept})") as timer:
        tensors = CheckpointTensors(structure.tensors.folder, getattr(torch, EXPORT_DTYPE),
                                    structure.tensors.state_dict_keys)
        job.model_object = streamed_model(structure.twin, tensors, resident)
    _add_load_time(job, timer.seconds)


def _add_load_time(job, seconds: float) -> None:
    """A later load of the model (each gate's reference) added to the job's `load_model_s`."""
    job.report.timings["load_model_s"] = round(job.report.timings.get("load_model_s", 0) + seconds, 4)


def _resident_bytes(job) -> int:
    """How much of the converted weights the streamed reference may keep between forwards: the memory available now
    (a cgroup's headroom included; within `--max-memory` beside what this process holds) less `GATE_RESERVE`. All
    of it is dropped before the artifact's runtime opens (`release_weights`)."""
    available = available_memory()
    if job.options.max_memory_mb:
        budget = int(job.options.max_memory_mb * MB) - current_rss()
        available = budget if available is None else min(available, budget)
    return max(0, (available or 0) - GATE_RESERVE)


def gate_releases(job, plan) -> bool:
    """Whether the gate lets the model go once the eager side of its checks is done (parity's references,
    `hfexport.verify.check.verify_exported`; the deployment runtimes' expected tokens), before the artifact's runtime
    opens: a job exported from its structure whose model was streamed or loaded for this gate (`load_reference`;
    made again when the next target's gate needs it), where only the gate needs it (`_gate_alone`)."""
    return job.structure is not None and job.model_object is not job.structure.twin and _gate_alone(job, plan)


def _gate_alone(job, plan) -> bool:
    """Whether only the gate's eager side needs the model: not a target with variants (each variant's gate reads the
    model after the runtimes), nor a job that times latency (which runs the model beside the artifact)."""
    return not plan.target.variants and not job.options.latency


def release_weights(job) -> None:
    """The job's model dropped for its twin, and its memory handed back: the float32 model and the artifact's runtime
    are then never in memory together (issue 45). A model that stays reachable (a reference left somewhere) is said
    in the job's log, not hidden."""
    if job.structure is None or job.model_object is job.structure.twin:
        return
    # its pages still the checkpoint's handed back first: a mapping of the shards can outlive the model (measured:
    # SmolLM2's first 4 layers, the whole file resident, 162 MB, beside ExecuTorch's runtime once the model was freed)
    drop_mapped_weights(job.model_object)
    model = weakref.ref(job.model_object)
    job.model_object = job.structure.twin
    gc.collect()
    _trim_heap()
    if model() is not None:
        import logging

        logging.getLogger(__name__).warning("the model is still referenced after the gate released it: its memory "
                                            "stays beside the artifact's runtime")


def _trim_heap() -> None:
    """glibc's free memory at the top and inside the heap given back to the system (the model's smaller tensors live
    there, below malloc's mmap threshold); nothing where the C library is not glibc."""
    try:
        ctypes.CDLL("libc.so.6").malloc_trim(0)
    except (OSError, AttributeError):
        pass


def structure_export(pipeline, plan, key: str | None, structure: bool):
    """(the plan to export, the twin it is traced from or None, the tensors the weights are written from) for a
    target's export: the job's twin and its shards where the job has one and the plan runs on it (its own
    components are the twin: `structure_for`'s conditions); else the model loaded (the plan made again on it when it
    was made on the twin, for this export only) and, where `structure` and a rebind key allow it, a twin of the loaded
    model. A plan is exported only with the model it was made on (`made_on`): one made on the twin before a rebind
    loaded the model (and fell back to an export) traces the twin's placeholders, whatever model it runs with."""
    job = pipeline.job
    twin = job.structure and job.structure.twin
    if twin is not None and (job.model_object is twin or is_streamed(job.model_object)
                             or not made_on(plan, job.model_object)):
        if (key or plan.quantization) and structure and traces_on(plan, twin):
            return without_quantizer(plan), twin, job.structure.tensors
        load_weights(job)
        # made again on the model for this export only: the job keeps the twin's (a plan holds the model it was made
        # on, and the gate lets the model go: `gate_releases`)
        plan = pipeline._build_plan()
    if not (key and structure):
        return plan, None, None
    plan, twin = structure_for(plan, job.model_object)
    return plan, twin, sources(job.model_object)[0] if twin is not None else None



#: The rebind key of a quantized target's transient weight map: the float32 IR's, dropped once it is quantized (a
#: quantized export records no map and is never rebound).
QUANTIZED_KEY = "0" * 64


def export_structure(job, plan, traced, twin):
    """The engine's export of `traced` (`plan` traced on the twin, `structure_export`) inside the format's
    `structure_conversion` (OpenVINO: the placeholders' constants file-backed, scratch files beside the output)."""
    from hfexport.export import run_plan

    with format_program(plan.target.export_format).structure_conversion(Path(job.output)):
        return run_plan(traced, twin)


def quantize_written(folder: Path, plan) -> None:
    """A quantized target's placeholder export, its weights written (`write_weights`), quantized by the target's own
    quantizer (`FormatProgram.quantize_written`); nothing for an unquantized one."""
    if plan.quantization:
        format_program(plan.target.export_format).quantize_written(folder, plan_quantizer(plan))
