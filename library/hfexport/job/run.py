"""Jobs: one model revision, one or more recipe targets. The API every surface (Python, CLI, action, Space) runs.

A job loads the recipe and the model once, then runs each target through its `TargetPipeline`
(`hfexport.job.pipeline`): plan, export through the engine (or rebind), save to `OUTPUT/<target>/` atomically
(written aside in `OUTPUT/.<target>.partial-*`, then renamed; an exception or Ctrl-C leaves no partial target
folder) with the recipe target used (`export_config.json`), gate, and the target's report next to the artifacts;
finally the job summary `OUTPUT/export_report.json`. With `workers` above one,
the targets are shared out to worker processes that export at the same time (`hfexport.job.parallel`), each running
the same steps; the latency of every target is then timed in the job's process, once the cores are free.
"""

from __future__ import annotations

import contextlib
import os
import resource
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from hfexport.engine import runner_class
from hfexport.errors import HfExportError, SourceError, register_secret
from hfexport.files import REPORT_FILE, write_json_atomic
from hfexport.hub import HubRepo, looks_like_repo_id
from hfexport.inputs import check_sample_places, sample_spec
from hfexport.job.compare import compare_job_targets
from hfexport.job.parallel import (
    export_groups,
    export_workers,
    logging_settings,
    serialized,
    share_cores,
    workers_number,
)
from hfexport.job import memory
from hfexport.job.pipeline import TargetPipeline, engine_error_message  # noqa: F401 - also run's, for its callers
from hfexport.job.structure import traced_without_weights, load_structure
from hfexport.job.preflight import MB, available_memory, check_fits, loaded_bytes, weights_metadata
from hfexport.latency import EagerTimings
from hfexport.logs import engine_output, import_engine
from hfexport.models import checkpoint_dtype, load_config, load_model, load_processor
from hfexport.processors import missing_parts
from hfexport.progress import ProgressCallback, Step, StepTimer, no_progress
from hfexport.publication.cache import cache_key, hub_content_hash, local_content_hash, lookup
from hfexport.recipe.loading import load_recipe
from hfexport.recipe.data import Recipe
from hfexport.report.data import JobReport, TargetReport
from hfexport.samples import read_samples


def resolve_source(model: str | Path, revision: str | None, token: str | None) -> dict:
    """Where the model comes from: a local folder (content hash) or a Hub repo (the revision's commit sha)."""
    path = Path(str(model))
    if path.is_dir():
        return {"model": str(model), "revision": None, "commit": None, "content_hash": local_content_hash(path)}
    if not looks_like_repo_id(str(model)):
        raise SourceError(f"{model}: no such folder, and not a Hub repo id")
    info = HubRepo(str(model), revision, token).info(files_metadata=True, action="reading the model's files")

    # content_hash: the model files' sha256, so publishing exports into the same repo (a new commit) is no change,
    # and a folder with the same files has the same hash.
    content_hash = hub_content_hash(str(model), info.sha, info.siblings, token)
    return {"model": str(model), "revision": revision, "commit": info.sha, "content_hash": content_hash}


def select_targets(recipe: Recipe, targets: Sequence[str] | None, all_targets: bool) -> list[str]:
    """The targets a job runs: all, the named ones (checked), or the recipe's default."""
    if all_targets:
        return recipe.target_names
    if not targets:
        return [recipe.default_target]
    for name in targets:
        recipe.target(name)  # raises with the list of targets
    return list(dict.fromkeys(targets))


def check_output(output: Path) -> None:
    """Refuse an OUTPUT that cannot become a folder we write to, before anything is loaded or exported."""
    for path in (output, *output.parents):
        if not path.exists():
            continue
        if not path.is_dir():
            raise HfExportError(f"output {output}: {path} exists and is not a folder")
        if not os.access(path, os.W_OK | os.X_OK):
            raise HfExportError(f"output {output}: {path} is not writable")
        return


def peak_rss_mb() -> float:
    """This process's peak resident set size so far, in MB (Linux reports KiB)."""
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024


@dataclass
class JobOptions:
    """How a job runs: everything `run_job` takes besides the model and the output folder.

    What each option does (targets, revision, token, recipe, verify, latency, runtimes, rebind, workers,
    sample_files, ...): docs/architecture.md, "A job's options".
    """
    targets: Sequence[str] | None = None
    all_targets: bool = False
    revision: str | None = None
    token: str | None = None
    recipe: str | Path | dict | Recipe | None = None
    trust_remote_code: bool = False
    progress: ProgressCallback | None = None
    model_object: Any = None
    inputs: dict | None = None
    force: bool = False
    preflight: bool = True
    publish_repo: str | None = None
    verify: bool = True
    latency: bool = True
    runtimes: bool = True
    workers: int | str = 1
    recipe_origin: str | None = None
    rebind: bool = True
    sample_files: dict[str, str | Path] | None = None
    max_memory_mb: float | None = None  # refuse a job the preflight estimates above this (hfexport.job.memory)


@dataclass
class _Job:
    """One running job: what `_prepare` resolved, and what its targets share (the model, the processor)."""
    model: str | Path
    output: Path
    options: JobOptions
    recipe: Recipe
    names: list[str]
    report: JobReport
    progress: ProgressCallback
    revision_to_load: str | None
    hits: dict
    keys: dict
    started: float
    groups: list[list[str]] = field(default_factory=list)  # the targets to export, one group per process
    model_object: Any = None
    processor: Any = None
    plans: dict = field(default_factory=dict)  # target -> plan, for timing the target after its export
    quantized_plans: dict = field(default_factory=dict)  # target -> plan, compared once every target is saved
    eager_timings: EagerTimings = field(default_factory=EagerTimings)  # eager torch timed once per input set
    workers_peak_rss_mb: float = 0.0  # the worker processes' peaks, added to this process's in the report
    repos: list[str] = field(default_factory=list)  # where published exports may be (cache hits, rebind sources)
    samples: dict = field(default_factory=dict)  # kind -> hfexport.samples.SampleFile (options.sample_files, read)
    structure: Any = None  # hfexport.job.structure.Structure: the twin exported before the model is loaded


def run_job(model: str | Path, output: str | Path, targets: Sequence[str] | None = None, *,
            options: JobOptions | None = None, **settings: Any) -> JobReport:
    """Export the requested targets of `model`'s recipe to `output/<target>/` and return the job's report.

    Before loading anything, each target's cache key (`hfexport.publication.cache`) is looked up in OUTPUT and in
    the exports published to `publish_repo` / the model's repo: a match is reported "unchanged" (with the reason)
    and not exported again. Then the preflight refuses a job that would not fit. The model is loaded once; each
    target is planned, exported through the engine, saved atomically (`OUTPUT/<target>/`, with the recipe target
    used and its report), verified and timed. A target that fails to export is recorded with its error and the
    others still run; a target that fails parity keeps its files and is reported "failed".

    Args:
        model: a local model folder or a Hub repo id.
        output: the folder the targets are saved in (`OUTPUT/<target>/`, `OUTPUT/export_report.json`).
        targets: the targets to run (default: the recipe's `default_target`).
        options: a `JobOptions`; or pass its fields as keyword arguments (`run_job(m, out, all_targets=True)`).

    Returns:
        The `JobReport`, also written to `OUTPUT/export_report.json`.

    Raises:
        RecipeError: the recipe is invalid (nothing is written).
        SourceError: the model or its recipe cannot be read.
        PreflightError: the job would not fit in memory or on disk.
    """
    if options is None:
        options = JobOptions(targets=targets, **settings)
    elif targets is not None or settings:
        raise TypeError("run_job: pass either options= or its fields as keyword arguments, not both")
    job = _prepare(model, Path(output), options)
    job.progress = memory.StageMemory(job.progress, job.report, foreign=[n for group in job.groups[1:] for n in group])
    for name in job.names:
        _add_target(job, name)
    if len(job.groups) > 1:
        _export_in_processes(job)
    elif job.groups:
        load_structure(job)  # targets traced without weights: the model's structure now, its weights when needed
        _load(job)
        for name in job.groups[0]:
            pipeline = TargetPipeline(job, name)
            pipeline.run()
            pipeline.complete()
    return _finish(job)


def _prepare(model: str | Path, output: Path, options: JobOptions) -> _Job:
    """The recipe, the targets, the source's identity, the cache lookup and the preflight: nothing loaded yet."""
    progress = options.progress or no_progress
    register_secret(options.token)
    started = time.perf_counter()
    recipe = load_recipe(options.recipe if options.recipe is not None else model, revision=options.revision,
                         token=options.token)
    origin = options.recipe_origin if options.recipe is not None else None
    if origin:  # "edited"/"proposed" only when it differs from the repo's own recipe, byte for byte (canonical JSON)
        own = _own_recipe(model, options.revision, options.token)
        if own is not None and own.sha256 == recipe.sha256:
            recipe, origin = own, None
    names = select_targets(recipe, options.targets, options.all_targets)
    samples = read_samples(options.sample_files)  # a bad file is refused here: nothing loaded, nothing written
    if samples and (recipe.sample_inputs or recipe.task):  # else the task is the model's: checked once it is known
        check_sample_places(sample_spec(recipe, recipe.task), samples)
    check_output(output)
    source = {
        **resolve_source(model, options.revision, options.token),
        "recipe_source": recipe.source,
        "recipe_sha256": recipe.sha256,
        **({"recipe_origin": origin} if origin else {}),
    }
    report = JobReport(source=source)
    revision_to_load = source["commit"] or options.revision
    repos = [repo for repo in (options.publish_repo, source["model"] if source["commit"] else None) if repo]
    hits, keys = _cache_hits(recipe, names, source, report.packages, output, options.token, progress,
                             skip=options.force or options.model_object is not None or options.inputs is not None
                             or bool(samples), repos=repos)
    if options.verify:  # an export saved with verify=False is no hit for a job that verifies: export and verify it
        hits = {name: hit for name, hit in hits.items() if hit.report.verification is not None}
    to_export = [name for name in names if name not in hits]
    groups = [to_export] if to_export else []
    in_processes = options.model_object is None and options.inputs is None and options.workers != 1
    if options.workers != "auto":
        workers_number(options.workers)  # a wrong value is refused before anything runs
    if to_export and options.model_object is None and (options.preflight or in_processes or options.max_memory_mb):
        with StepTimer(progress, "preflight", detail=str(model)):
            targets = {name: recipe.target(name) for name in to_export}
            weights = _weights_or_none(model, revision_to_load, options.token)
            if in_processes:
                groups = export_groups(targets, options.workers, weights and loaded_bytes(*weights),
                                       available_memory())
            if options.preflight or options.max_memory_mb:
                budget = int(options.max_memory_mb * MB) if options.max_memory_mb else None
                report.memory = memory.estimate_record(check_fits(
                    model, list(targets.values()), output, revision_to_load, options.token,
                    groups=[[targets[name] for name in group] for group in groups], weights=weights,
                    max_memory=budget, structure=traced_without_weights if options.inputs is None and not samples
                    else None,
                    streamed_gate=not options.latency), options.max_memory_mb)
    return _Job(model, output, options, recipe, names, report, progress, revision_to_load, hits, keys, started,
                groups=groups, model_object=options.model_object, repos=repos, samples=samples)


def _own_recipe(model: str | Path, revision: str | None, token: str | None) -> Recipe | None:
    """The model's own recipe (its repo's or folder's), or None when it has none or it cannot be read."""
    try:
        return load_recipe(model, revision=revision, token=token)
    except HfExportError:
        return None


def _weights_or_none(model, revision: str | None, token: str | None) -> tuple[int, dict] | None:
    """`preflight.weights_metadata`, or None when it cannot be read (the loader reports real access problems)."""
    try:
        return weights_metadata(model, revision, token)
    except Exception:  # noqa: BLE001 - an estimate we cannot make must not block the job
        return None


def _load(job: _Job, detail: str | None = None) -> None:
    """Load the model (unless the caller gave one) and its processor, once for every target."""
    import_engine()  # its import-time chatter (torchao, torch's pytree warnings) goes to logging
    options = job.options
    with StepTimer(job.progress, "load_model", detail=detail or str(job.model)) as timer, engine_output("load_model"):
        if job.model_object is None:
            config = load_config(job.model, job.revision_to_load, options.token, options.trust_remote_code)
            job.model_object = load_model(job.model, job.recipe, job.revision_to_load, options.token,
                                          options.trust_remote_code, config=config)
            if stored := checkpoint_dtype(config):  # what the weights are stored in; each target's export_dtype is its own
                job.report.source["checkpoint_dtype"] = stored
        if options.inputs is None:
            job.processor = load_processor(job.model, job.revision_to_load, options.token)
            if missing := missing_parts(job.processor):  # e.g. a video processor that needs torchvision
                job.report.source["processor_not_loaded"] = missing
    job.report.timings["load_model_s"] = round(timer.seconds, 4)


def _add_target(job: _Job, name: str) -> None:
    """The target's report in `job.report` (in recipe order); a cache hit is reported unchanged and done."""
    target = job.recipe.target(name)
    target_report = TargetReport(
        target=name, export_format=target.export_format, mode=target.mode,
        recipe_target_sha256=job.recipe.target_hash(name), cache_key=job.keys.get(name),
    )
    job.report.targets[name] = target_report
    if name in job.hits:
        _mark_unchanged(target_report, job.hits[name])
        job.progress(Step("target", "done", name, f"unchanged: {job.hits[name].reason}"))


def _export_in_processes(job: _Job) -> None:
    """Export `job.groups[0]` here while each other group exports in a worker process (`hfexport.job.parallel`);
    then take the workers' reports, and time and complete every target here, in recipe order."""
    job.progress = serialized(job.progress)
    own, *others = job.groups
    with export_workers(_worker_request(job), others, job.progress, job.output) as workers:
        shares = "; ".join(", ".join(group) for group in others)
        _load(job, f"{job.model}; {len(others)} more process{'es' if len(others) > 1 else ''} export {shares}")
        with share_cores(len(job.groups)):
            for name in own:
                TargetPipeline(job, name).run()
        if job.options.verify and job.options.latency:
            _import_runtimes(job, [name for group in others for name in group])
        for worker in workers:
            worker.wait()
            job.workers_peak_rss_mb += worker.peak_rss_mb
            for name in worker.names:
                if name in worker.reports:
                    job.report.targets[name] = TargetReport.from_dict(worker.reports[name])
                else:
                    target_report = job.report.targets[name]
                    target_report.status, target_report.error = "error", worker.error
    for name in (name for name in job.names if name not in job.hits):
        pipeline = TargetPipeline(job, name)
        if job.report.targets[name].quantization and name not in job.quantized_plans:
            job.quantized_plans[name] = pipeline.known_plan()
        pipeline.complete()


def _import_runtimes(job: _Job, names: list[str]) -> None:
    """Import the runtimes that timing the workers' targets here will need, while the workers still export: this
    process has not exported those formats, and ExecuTorch's runtime alone takes ~2.4 s to import."""
    for export_format in dict.fromkeys(str(job.recipe.target(name).export_format) for name in names):
        with contextlib.suppress(ImportError), engine_output(f"import {export_format}"):
            runner_class(export_format)


def _worker_request(job: _Job) -> dict:
    """What a worker process needs to export its share of the job (`export_in_worker`), as JSON."""
    return {
        "model": str(job.model), "output": str(job.output), "revision": job.revision_to_load,
        "token": job.options.token, "trust_remote_code": job.options.trust_remote_code,
        "recipe": job.recipe.data, "recipe_source": job.recipe.source, "source": job.report.source,
        "keys": job.keys, "verify": job.options.verify, "runtimes": job.options.runtimes,
        "rebind": job.options.rebind, "repos": job.repos, "processes": len(job.groups), "logging": logging_settings(),
        "sample_files": {kind: str(path) for kind, path in (job.options.sample_files or {}).items()},
    }


def export_in_worker(request: dict, progress: ProgressCallback, on_target) -> None:
    """A worker process's share of a job (`hfexport.job.parallel_worker`): load the model, then plan, export, save and
    verify each of `request["targets"]` exactly as the job's own process does, calling `on_target(name, report
    dict)` as each ends. Latency is left to the job's process."""
    register_secret(request["token"])
    options = JobOptions(revision=request["revision"], token=request["token"],
                         trust_remote_code=request["trust_remote_code"], verify=request["verify"], latency=False,
                         runtimes=request.get("runtimes", True), rebind=request.get("rebind", True))
    recipe = Recipe(request["recipe"], request["recipe_source"])
    job = _Job(request["model"], Path(request["output"]), options, recipe, list(request["targets"]),
               JobReport(source=request["source"]), progress, request["revision"], {}, request["keys"],
               time.perf_counter(), repos=list(request.get("repos", [])),
               samples=read_samples(request.get("sample_files")))
    job.progress = memory.StageMemory(progress, job.report)
    _load(job)
    with share_cores(request["processes"]):
        for name in job.names:
            _add_target(job, name)
            TargetPipeline(job, name).run()
            on_target(name, job.report.targets[name].to_dict())


def _finish(job: _Job) -> JobReport:
    """Compare quantized targets with their references, total the timings, write `OUTPUT/export_report.json`."""
    report = job.report
    if job.quantized_plans:
        for name in compare_job_targets(report, job.recipe, job.output, job.model_object, job.quantized_plans,
                                        job.processor, job.options.inputs, job.progress, job.samples):
            TargetPipeline(job, name).report()
    verify_times = [t.timings["verify_s"] for t in report.targets.values() if "verify_s" in t.timings]
    if verify_times:
        report.timings["verify_s"] = round(sum(verify_times), 4)
    report.timings["total_s"] = round(time.perf_counter() - job.started, 4)
    report.peak_rss_mb = round(peak_rss_mb() + job.workers_peak_rss_mb, 1)
    write_json_atomic(job.output / REPORT_FILE, report.to_json())
    return report


def _cache_hits(recipe: Recipe, names: list[str], source: dict, packages: dict, output: Path, token: str | None,
                progress: ProgressCallback, skip: bool, repos: list[str]):
    """(hits by target, cache key by target): which targets a previous export already covers."""
    keys = {name: cache_key(source, recipe.target(name), recipe.target_hash(name), packages) for name in names}
    if skip:
        return {}, keys
    with StepTimer(progress, "cache", detail="looking for exports with the same cache key"):
        return lookup(output, keys, repos, token), keys


def _mark_unchanged(target_report: TargetReport, hit) -> None:
    """A cache hit: nothing exported; the previous export's files, verification, runtimes' verdicts and variants
    (all measured on these same files), and why."""
    previous = hit.report
    target_report.status = "unchanged"
    target_report.unchanged_reason = hit.reason
    target_report.files = list(previous.files)
    target_report.total_bytes = previous.total_bytes or sum(entry["bytes"] for entry in previous.files)
    target_report.verification = previous.verification
    target_report.quantization = previous.quantization
    target_report.latency = previous.latency
    target_report.runtimes = list(previous.runtimes)
    target_report.variants = list(previous.variants)
