"""Re-verify a saved export against its model without exporting again (`hfexport verify`), updating its report."""

from __future__ import annotations

import time
from pathlib import Path

from hfexport.errors import SourceError, register_secret
from hfexport.files import (
    MANIFEST_FILE,
    RECIPE_COPY_FILE,
    REPORT_FILE,
    file_entries,
    write_json_atomic,
)
from hfexport.job.run import resolve_source
from hfexport.models import load_model, load_processor
from hfexport.plan import build_plan
from hfexport.recipe.loading import load_recipe
from hfexport.report.data import JobReport, TargetReport
from hfexport.safety.artifacts import checked_file
from hfexport.verify.check import summary, verify_exported

# ── Re-verifying a saved target ──────────────────────────────────────────────


def reverify(folder: str | Path, model: str | Path, revision: str | None = None, token: str | None = None,
             trust_remote_code: bool = False, write_report: bool = False):
    """Verify an existing `OUTPUT/<target>/` folder against `model` again: its standalone recipe
    (`export_config.json`, saved by the job) gives the target, sample inputs and thresholds. With `write_report`,
    the target's `export_report.json` (and the job summary one folder up, when it lists the target) is rewritten
    atomically with the new verification; else the saved reports stay as they are. Returns `(JobReport, target
    name)`: the report with the new verification."""
    import datetime
    import json

    from hfexport.exported import ExportedModel


    register_secret(token)
    folder = Path(folder)
    if not (folder / MANIFEST_FILE).is_file():
        raise SourceError(f"{folder}: not an exported target folder (no export.json); pass OUTPUT/<target>")
    if not (folder / RECIPE_COPY_FILE).is_file():
        raise SourceError(f"{folder}: no {RECIPE_COPY_FILE}, the recipe target hfexport saves beside an export; "
                          "re-export it with `hfexport export`")
    # An export that cannot be loaded (tampered or corrupt) raises here, before the model loads: the command could not
    # run (exit 2); verification below then judges parity only.

    ExportedModel.from_pretrained(folder)
    recipe = load_recipe(checked_file(folder, RECIPE_COPY_FILE, source=str(folder)))
    name = recipe.default_target
    model_object = load_model(model, recipe, revision, token, trust_remote_code)
    processor = load_processor(model, revision, token)
    plan = build_plan(recipe, name, model_object, None, processor)
    started = time.perf_counter()
    verification = verify_exported(folder, model_object, plan, processor)
    seconds = time.perf_counter() - started
    verification["against"] = {"model": str(model), "revision": revision,
                               "verified_at": datetime.datetime.now(datetime.UTC).isoformat(timespec="seconds")}
    verification = json.loads(json.dumps(verification, default=str))

    report_file = folder / REPORT_FILE
    report = JobReport.read(report_file) if report_file.is_file() else None
    if report is None or name not in report.targets:
        target = recipe.target(name)
        source = {**resolve_source(model, revision, token), "recipe_source": str(folder / RECIPE_COPY_FILE),
                  "recipe_sha256": recipe.sha256}
        report = JobReport(source=source)
        report.targets[name] = TargetReport(
            target=name, export_format=target.export_format, mode=target.mode,
            recipe_target_sha256=recipe.target_hash(name),
            files=[entry for entry in file_entries(folder) if entry["path"] != REPORT_FILE],
        )
    target_report = report.targets[name]
    _apply(target_report, verification, seconds)
    if not write_report:
        return report, name
    write_json_atomic(report_file, report.to_json(only=name))
    summary_file = folder.parent / REPORT_FILE
    if summary_file.is_file():
        try:
            job = JobReport.read(summary_file)
        except Exception:  # noqa: BLE001 - a summary hfexport cannot read is left as it is
            job = None
        if job is not None and name in job.targets and job.targets[name].recipe_target_sha256 == recipe.target_hash(name):
            _apply(job.targets[name], verification, seconds)
            write_json_atomic(summary_file, job.to_json())
    return report, name


def _apply(target_report, verification: dict, seconds: float) -> None:
    target_report.verification = verification
    target_report.timings["verify_s"] = round(seconds, 4)
    if target_report.status in ("ok", "failed", "unchanged"):
        target_report.status = "ok" if verification["passed"] else "failed"
        target_report.error = None if verification["passed"] else summary(verification)
