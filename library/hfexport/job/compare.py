"""Size and latency of a job's quantized targets against an unquantized reference (a sibling target, or a throwaway
fp32 export when that is cheap); the result lands in `TargetReport.quantization["comparison"]`.
"""

from __future__ import annotations

import copy
import json
import shutil
import statistics
import time
import uuid
from pathlib import Path
from typing import Any

from hfexport.formats import format_traits
from hfexport.errors import first_line
from hfexport.files import MANIFEST_FILE
from hfexport.models import on_empty_cache
from hfexport.plan import build_plan
from hfexport.progress import Step
from hfexport.recipe.data import Recipe
from hfexport.recipe.validation import validate_document
from hfexport.report.markdown import comparison_summary

# ── Size and latency against the unquantized target ──────────────────────────

CHEAP_REFERENCE_PARAMETERS = 50_000_000
LATENCY_ROUNDS = 10
WARMUP_ROUNDS = 2


def program_bytes(folder: Path) -> int:
    """Bytes of an export's programs (the files its manifest names, external weights included)."""
    manifest = json.loads((folder / MANIFEST_FILE).read_text(encoding="utf-8"))
    files = {file for entry in manifest["components"].values()
             for file, _ in format_traits(manifest["export_format"]).program_files(entry["file"])}
    return sum((folder / file).stat().st_size for file in files if (folder / file).is_file())


def sibling_reference(recipe, name: str, candidates) -> str | None:
    """An unquantized target of the same format and mode (the closest one: same options and shapes first)."""
    target = recipe.target(name)
    matches = []
    for other in candidates:
        if other == name:
            continue
        candidate = recipe.target(other)
        if candidate.quantization or candidate.export_format != target.export_format or candidate.mode != target.mode:
            continue
        same = (candidate.options == target.options) + (candidate.dynamic_shapes == target.dynamic_shapes)
        matches.append((-same, other))
    return min(matches)[1] if matches else None


def unquantized_recipe(recipe, name: str):
    """A copy of `recipe` whose target `name` has no quantization (the fp32 reference)."""
    data = copy.deepcopy(recipe.data)
    data["targets"][name].pop("quantization", None)
    return Recipe(validate_document(data, recipe.source), recipe.source, recipe.document)


def _latency_inputs(plan, model) -> dict[str, dict]:
    """What to time per component: the forward inputs (forward mode), or the prefill's captured inputs."""
    if plan.mode == "forward":
        return {"model": dict(plan.inputs)}
    from transformers.exporters.utils import decompose_for_generation

    stages = decompose_for_generation(model, dict(plan.inputs), generation_config=plan.generation_config,
                                      multi_token_decode=plan.multi_token_decode)
    first = next(iter(stages))
    if plan.single_graph:  # the prompt runs on the decode, from an empty cache
        return {"decode": on_empty_cache(stages[first][1], model)}
    return {first: stages[first][1]}


def measure_latency(folders: dict[str, Path], inputs: dict[str, dict], rounds: int = LATENCY_ROUNDS) -> dict[str, float]:
    """Median seconds per call of each export on the same inputs, runs interleaved so load changes hit both alike."""
    from hfexport.exported import ExportedModel
    from hfexport.generate import run_component

    loaded = {key: ExportedModel.from_pretrained(folder) for key, folder in folders.items()}
    (component, sample), = inputs.items()

    def call(exported):
        runner = exported.runners[component]
        traced = runner.metadata.kwargs  # what the graph was traced with (flags such as use_cache are not inputs)
        return run_component(runner, {key: value for key, value in copy.deepcopy(sample).items() if key in traced})

    for _ in range(WARMUP_ROUNDS):
        for exported in loaded.values():
            call(exported)
    times: dict[str, list[float]] = {key: [] for key in loaded}
    for _ in range(rounds):
        for key, exported in loaded.items():
            start = time.perf_counter()
            call(exported)
            times[key].append(time.perf_counter() - start)
    return {key: statistics.median(values) for key, values in times.items()}


def _shapes(sample: dict) -> dict:
    import torch

    return {key: list(value.shape) for key, value in sample.items() if isinstance(value, torch.Tensor)}


def compare_to_reference(recipe, name: str, folder: Path, model, plan, reference_folder: Path | None = None,
                         reference_name: str | None = None, processor=None, inputs=None, samples=None) -> dict:
    """Size and latency of the quantized export in `folder` against an unquantized one.

    The reference is an unquantized target of the same format and mode exported in the same job
    (`reference_folder`). Without one, a throwaway fp32 reference is exported when that is cheap (a model of at most
    `CHEAP_REFERENCE_PARAMETERS` parameters) and deleted afterwards; otherwise the comparison says why it is absent.
    """
    from hfexport.export import run_plan
    result: dict[str, Any] = {"reference": None, "bytes": program_bytes(folder)}
    temporary = None
    try:
        if reference_folder is None:
            parameters = sum(parameter.numel() for parameter in model.parameters())
            if parameters > CHEAP_REFERENCE_PARAMETERS:
                result["reason"] = (
                    f"no unquantized {plan.target.export_format}/{plan.mode} target in this job, and the model "
                    f"({parameters / 1e6:.0f}M parameters) is too large for a throwaway fp32 export; add one to compare"
                )
                return result

            reference_plan = build_plan(unquantized_recipe(recipe, name), name, model, inputs, processor,
                                        samples=samples)
            exported = run_plan(reference_plan, model)
            temporary = folder.parent / f".{name}.reference-{uuid.uuid4().hex[:8]}"
            exported.save_pretrained(temporary)
            reference_folder, reference_name = temporary, None
        result["reference"] = reference_name or "fp32 export of this target without quantization (made for this comparison, not kept)"
        result["reference_bytes"] = program_bytes(reference_folder)
        result["size_ratio"] = round(result["bytes"] / max(result["reference_bytes"], 1), 4)
        try:
            samples = _latency_inputs(plan, model)
            latency = measure_latency({"quantized": folder, "reference": reference_folder}, samples)
        except Exception as error:  # noqa: BLE001 - a runtime that cannot time this component: say so, keep sizes
            result["latency_error"] = first_line(error, 300)
            return result
        (component, sample), = samples.items()
        result.update({
            "latency_component": component,
            "latency_inputs": _shapes(sample),
            "latency_rounds": LATENCY_ROUNDS,
            "latency_ms": round(latency["quantized"] * 1000, 3),
            "reference_latency_ms": round(latency["reference"] * 1000, 3),
            "latency_ratio": round(latency["quantized"] / max(latency["reference"], 1e-9), 4),
        })
        return result
    finally:
        if temporary is not None:
            shutil.rmtree(temporary, ignore_errors=True)


def compare_job_targets(report, recipe, output: Path, model, plans: dict, processor=None, inputs=None,
                        progress=None, samples=None) -> list[str]:
    """Compare every quantized target a job saved with its reference; return the targets whose report changed.

    The reference is an unquantized target of the same format and mode saved by the same job, else a throwaway
    fp32 export when that is cheap (see `compare_to_reference`). The result goes to `TargetReport.quantization`
    under `comparison`; a comparison that cannot run says why there and never changes the target's status.
    """
    progress = progress or (lambda step: None)
    saved = [name for name, entry in report.targets.items() if entry.status in ("ok", "failed")]
    updated = []
    for name, plan in plans.items():
        target_report = report.targets[name]
        if target_report.status not in ("ok", "failed") or target_report.quantization is None:
            continue
        reference = sibling_reference(recipe, name, saved)
        progress(Step("compare", "start", name, f"size and latency against {reference or 'an fp32 export'}"))
        started = time.perf_counter()
        try:
            comparison = compare_to_reference(recipe, name, output / name, model, plan,
                                              output / reference if reference else None, reference, processor, inputs,
                                              samples)
        except Exception as error:  # noqa: BLE001 - a comparison that cannot run is reported, not fatal
            comparison = {"error": first_line(error)[:500]}
        seconds = time.perf_counter() - started
        target_report.quantization["comparison"] = json.loads(json.dumps(comparison, default=str))
        target_report.timings["compare_s"] = round(seconds, 4)
        progress(Step("compare", "error" if "error" in comparison else "done", name, comparison_summary(comparison),
                      seconds))
        updated.append(name)
    return updated
