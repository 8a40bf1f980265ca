"""The gate of a target's variants (`hfexport.quantization.variants`), once its full-precision files have passed theirs.

Each variant is made from the saved export by its format (`FormatProgram.write_variant`, in a stage beside the
target's folder), then judged against the float32 export on the recipe's sample texts (the plan's token rows):

- quality: the perplexity ratio, exp(mean NLL of the variant - mean NLL of the float32 export) over every next token
  of the texts, at most `max_nll_ratio`; and the share of positions whose most likely next token is the float32
  export's (each prefix a prompt's first generated token), at least `min_top1_agreement` (`DEFAULT_BOUNDS`);
- its runtimes: each deployment runtime of the format opens the variant by its published name (transformers.js by
  `dtype`, LLMPipeline and optimum-intel by the variant's folder) and generates greedily on the sample prompts,
  judged by hfexport's token agreement floor for its kind (4-bit 0.5, 8-bit 0.75, float16 0.75:
  `hfexport.verify.thresholds`); a runtime not installed is not_checked.

A variant that passes is kept in the target's folder under its published name (`onnx/model_q4.onnx`,
`openvino/int4/`); one that fails is kept too (as a target that fails parity keeps its files) and fails the target,
by name.
"""

from __future__ import annotations

import math
import os
import shutil
import time
from pathlib import Path

from hfexport.deployment import FAILED, run_checks
from hfexport.deployment.gate import generation_request
from hfexport.files import REPORT_FILE, file_entries
from hfexport.formats import format_backend
from hfexport.formats.programs import format_program
from hfexport.progress import StepTimer
from hfexport.quantization.variants import LOW_BIT, settings
from hfexport.verify.thresholds import RUNTIME_MIN_TOKEN_AGREEMENT, default_parity


def token_rows(plan) -> list[list[int]]:
    """The plan's sample prompts as unpadded token rows (the recipe's sample texts, tokenized)."""
    input_ids, mask = plan.inputs.get("input_ids"), plan.inputs.get("attention_mask")
    if input_ids is None:
        return []
    keep = mask.tolist() if mask is not None else [[1] * input_ids.shape[1]] * input_ids.shape[0]
    return [[int(token) for token, kept in zip(row, flags, strict=True) if kept]
            for row, flags in zip(input_ids.tolist(), keep, strict=True)]


def runtime_floor(name: str) -> float:
    """The greedy token agreement a variant's runtimes must reach: hfexport's floors for quantized generation (4-bit,
    8-bit) and for a float16 runtime."""
    if name == "fp16":
        return RUNTIME_MIN_TOKEN_AGREEMENT["f16"]
    weights = "int4" if name in LOW_BIT else "int8"
    return default_parity("ort_dynamic", "generation", {"weight_type": weights})["generate"]["min_token_agreement"]


def quality(reference: list[tuple[list[float], list[int]]], scores: list[tuple[list[float], list[int]]]) -> dict:
    """The perplexity ratio and the next-token agreement of `scores` against `reference` (per row: next-token
    log-likelihoods, argmax per position)."""
    nll = [-value for row, _ in scores for value in row]
    reference_nll = [-value for row, _ in reference for value in row]
    pairs = [(a, b) for (_, mine), (_, theirs) in zip(scores, reference, strict=True)
             for a, b in zip(mine, theirs, strict=True)]
    mean, reference_mean = sum(nll) / max(len(nll), 1), sum(reference_nll) / max(len(reference_nll), 1)
    return {"mean_nll": round(mean, 6), "reference_mean_nll": round(reference_mean, 6),
            "nll_ratio": round(math.exp(mean - reference_mean), 6), "tokens": len(nll),
            "top1_agreement": round(sum(a == b for a, b in pairs) / max(len(pairs), 1), 6), "positions": len(pairs)}


def gate_variants(folder: Path, plan, model, processor=None, runtimes: bool = True) -> list[dict]:
    """Make, judge and keep each of the plan's target's variants in `folder` (its saved, gated export); one report
    entry per variant (`verdict` passed or failed, the measures, the runtimes' checks)."""
    folder = Path(folder)
    target = plan.target
    export_format = str(target.export_format)
    program, backend = format_program(export_format), format_backend(export_format)
    for name in backend.variants:  # a previous export's (rebound: copied with it) are made again or go
        program.remove_variant(folder, backend.variant_file(name))
    rows = [row for row in token_rows(plan) if len(row) > 1]
    reference = program.next_token_scores(folder, rows)
    request = generation_request(model, plan, processor) if runtimes else None
    entries = []
    for item in target.variants:
        variant = settings(item)
        name, file_name = variant["name"], backend.variant_file(variant["name"])
        started = time.perf_counter()
        stage = folder.parent / f".{folder.name}.variant-{name}-{os.getpid()}"
        shutil.rmtree(stage, ignore_errors=True)
        entry = {"name": name, "file": file_name,
                 "settings": {key: value for key, value in variant.items() if key != "name"}}
        try:
            entry["settings"].update(program.write_variant(folder, variant, stage, model) or {})  # resolved from the model
            entry.update(quality(reference, program.next_token_scores(stage, rows)))
            failures = []
            if entry["nll_ratio"] > variant["max_nll_ratio"]:
                failures.append(f"perplexity ratio {entry['nll_ratio']:.4f} to float32 above {variant['max_nll_ratio']:g}")
            if entry["top1_agreement"] < variant["min_top1_agreement"]:
                failures.append(f"next-token agreement {entry['top1_agreement']:.3f} with float32 below "
                                f"{variant['min_top1_agreement']:g}")
            if request is not None:
                request.file_name, request.min_token_agreement = file_name, runtime_floor(name)
                checks = run_checks(export_format, stage, request)
                entry["runtimes"] = [check.to_dict() for check in checks]
                failures += [f"{check.runtime}: {check.reason}" for check in checks if check.verdict == FAILED]
            names = program.keep_variant(stage, folder, file_name)
            entry["bytes"] = sum((folder / kept).stat().st_size for kept in names)
            entry["verdict"] = "failed" if failures else "passed"
            if failures:
                entry["reason"] = "; ".join(failures)[:2000]
        except (KeyboardInterrupt, SystemExit):
            raise
        except Exception as error:  # noqa: BLE001 - a variant that cannot be made fails, by name; the job goes on
            entry.update(verdict="failed", reason=f"could not be made: {type(error).__name__}: {error}"[:2000])
        finally:
            shutil.rmtree(stage, ignore_errors=True)
        entry["seconds"] = round(time.perf_counter() - started, 3)
        entries.append(entry)
    return entries


def check_variants(target_report, folder: Path, model, plan, processor, progress, runtimes: bool = True) -> None:
    """`gate_variants` for a job's target: its entries in the target's report, its files listed again, and a variant
    that failed fails the target, by name."""
    name = target_report.target
    with StepTimer(progress, "variants", name, ", ".join(settings(item)["name"] for item in plan.target.variants)) \
            as timer:
        target_report.variants = gate_variants(folder, plan, model, processor, runtimes)
    target_report.timings["variants_s"] = round(timer.seconds, 4)
    target_report.files = [entry for entry in file_entries(folder) if entry["path"] != REPORT_FILE]
    target_report.total_bytes = sum(entry["bytes"] for entry in target_report.files)
    failed = [entry for entry in target_report.variants if entry["verdict"] == "failed"]
    if failed:
        target_report.status = "failed"
        target_report.error = "; ".join(f"variant {entry['name']}: {entry['reason']}" for entry in failed)
