"""`TargetPipeline`: one target of a job through its stages, plan -> produce (export, or rebind into a previous
export) -> save -> gate (parity, then the deployment runtimes) -> report, and, once the job's exports are done,
latency. `hfexport.job.run` makes one per target and runs it (in a worker process too: `export_in_worker`); export
and rebind share the save, the gate and the report. The walk through the stages: docs/architecture.md, "Following
one recipe through `hfexport export`".
"""

from __future__ import annotations

import contextlib
import functools
import json
import os
import re
import shutil
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from hfexport.deployment.gate import answered_request, check_runtimes, has_runtimes
from hfexport.deployment.warm import warm_clients
from hfexport.errors import HfExportError, redact
from hfexport.files import RECIPE_COPY_FILE, REPORT_FILE, file_entries, save_atomically, write_json_atomic
from hfexport.formats.programs import format_program
from hfexport.latency import measure_latency
from hfexport.layout import format_label
from hfexport.job.memory import drop_mapped_weights
from hfexport.job.preflight import check_memory_plan, disk_full_hint, runtime_refusals
from hfexport.job.structure import (QUANTIZED_KEY, export_structure, gate_releases, load_reference, load_weights,
                                    quantize_written, release_weights, structure_export)
from hfexport.logs import engine_output
from hfexport.plan import build_plan
from hfexport.progress import Step, StepTimer
from hfexport.publication.cache import fetch_published_export, target_packages
from hfexport.rebind.folder import previous, rebind_copy, record
from hfexport.rebind.placeholders import StructureRefused, write_weights
from hfexport.rebind.streaming import placeholders_in_blocks
from hfexport.rebind.weight_map import RebindRefused, rebind_key
from hfexport.report.data import JobReport, TargetReport
from hfexport.verify.check import summary, verify_exported
from hfexport.verify.variants import check_variants


class TargetPipeline:
    """One target of `job` (`hfexport.job.run`'s running job: its recipe, options, model, report and output folder)
    through the stages; each stage records its outcome in the target's report, `job.report.targets[name]`."""

    def __init__(self, job, name: str):
        self.job, self.name = job, name
        self.target = job.recipe.target(name)
        self.target_report: TargetReport = job.report.targets[name]
        self.folder: Path = job.output / name

    # ── the stages ───────────────────────────────────────────────────────────

    def run(self) -> None:
        """Plan, produce (rebind when a previous export has the same rebind key, else export), save, gate, report. A
        failure before the save is the target's error (nothing saved, no report beside it); a gate that fails keeps
        the files, reported "failed"."""
        job, target_report, label = self.job, self.target_report, format_label(self.target.export_format)
        job.progress(Step("target", "start", self.name, f"{label} / {self.target.mode}"))
        import hfexport.export  # noqa: F401 - torch, for the export stage: a failure to import it is no target's error
        plan = None
        try:
            plan = self.plan()
            key = self.rebind_key(plan)
            if key and job.options.rebind and not job.options.force and self.rebind(key, plan):
                return
            try:
                self.save(self.export(plan, key), "save", None, "save_s")
            except StructureRefused:  # the export traced without weights cannot take them: made from the weights
                self.save(self.export(plan, key, structure=False), "save", None, "save_s")
            target_report.status = "ok"
        except (KeyboardInterrupt, SystemExit):
            raise
        except HfExportError as error:
            target_report.status, target_report.error = "error", str(error)
        except Exception as error:  # noqa: BLE001 - the engine's failure, recorded per target, one line
            target_report.status = "error"
            target_report.error = engine_error_message(error) + disk_full_hint(self.folder)
        if target_report.status == "ok" and job.options.verify:
            self.gate(self.folder, plan)
        self.report()

    def plan(self):
        """The plan stage: the target resolved against the job's model (`hfexport.plan.build_plan`), described in
        the report; kept for its latency and, when quantized, its comparison with a reference target."""
        job, target_report = self.job, self.target_report
        with StepTimer(job.progress, "plan", self.name) as timer, engine_output(f"plan {self.name}"):
            plan = self._build_plan()
        job.plans[self.name] = plan
        if job.samples and job.options.inputs is None:
            target_report.sample_files = [sample.record() for sample in job.samples.values()]
        target_report.plan = jsonable(plan.describe())
        target_report.prepared_inputs = jsonable(plan.prepared_inputs())
        if plan.quantization:
            job.quantized_plans[self.name] = plan
            target_report.quantization = jsonable(plan.quantization)
        target_report.timings["plan_s"] = round(timer.seconds, 4)
        if job.options.preflight:
            check_memory_plan(plan, self.name)  # a program planned for its bounds that would not load here
        # a runtime that cannot run this config is said so now, before the export (the gate answers the same)
        if refused := runtime_refusals(self.target, job.model_object.config.to_dict()):
            target_report.runtimes = refused
        return plan

    def export(self, plan, key: str | None, structure: bool = True) -> Callable[[Path], None]:
        """The produce stage of an export: the engine's export of the plan (`hfexport.export.run_plan`); returns what
        the save stage writes: the artifacts, the recipe target used, the processor where the format's runtimes read
        it, and (with a rebind key) the weight map a later rebind needs. Where the format traces without weights
        (`structure_for`), the export is made from the model's structure and the weights written through the map."""
        from hfexport.export import run_plan  # imports torch: not for a job whose targets are all cache hits

        job, target_report = self.job, self.target_report
        with StepTimer(job.progress, "export", self.name,
                       f"{format_label(self.target.export_format)} / {self.target.mode}") as timer, \
                engine_output(f"export {self.name}"):
            traced, twin, weights = structure_export(self, plan, key, structure)  # the twin, where it can be
            exported = export_structure(job, plan, traced, twin) if twin is not None else \
                run_plan(traced, job.model_object)
        target_report.timings["export_s"] = round(timer.seconds, 4)

        def write(folder: Path) -> None:
            program = format_program(self.target.export_format)
            with program.structure_save() if twin is not None else contextlib.nullcontext():
                exported.save_pretrained(folder, tokenizer=job.processor)
            write_json_atomic(folder / RECIPE_COPY_FILE, pretty(job.recipe.standalone(self.name)))
            program.save_processor(folder, job.processor)  # ONNX: in its contract
            if twin is not None:
                write_weights(folder, twin, weights, key or QUANTIZED_KEY)
                quantize_written(folder, plan)  # a quantized target: its own quantizer, on the written files
            elif key:
                self._record_weight_map(folder, key)

        return write

    def save(self, write: Callable[[Path], None], step: str, detail: str | None, timing: str) -> tuple[Path, float]:
        """The save stage, for an export and a rebind alike: `write` into `OUTPUT/<target>/` atomically
        (`hfexport.files.save_atomically`), timed as `step` (the report's `timings[timing]`), the files listed in the
        report. Returns the folder and the seconds it took."""
        with StepTimer(self.job.progress, step, self.name, detail) as timer, engine_output(f"{step} {self.name}"):
            final = save_atomically(self.job.output, self.name, write)
        target_report = self.target_report
        target_report.timings[timing] = round(timer.seconds, 4)
        target_report.files = file_entries(final)
        target_report.total_bytes = sum(entry["bytes"] for entry in target_report.files)
        return final, timer.seconds

    def gate(self, folder: Path, plan) -> None:
        """The gate of a saved target, exported or rebound: its report beside the artifacts (there even if verifying
        dies), parity against the eager model, then (a generation target that passed) its format's deployment
        runtimes, then (a target with `variants`) each variant made from the gated files and gated itself; each Python
        runtime started once for all of them (`warm_clients`)."""
        self.report(folder)
        load_reference(self.job, plan, folder)  # a job exported from its structure: the model now (or streamed), for the gate
        release = gate_releases(self.job, plan)  # and let go before the artifact's runtime opens (job/structure)
        runs = self.job.options.runtimes and plan.target.mode == "generation" and has_runtimes(str(plan.target.export_format))
        request = answered_request(self.job.model_object, plan, self.job.processor) if release and runs else None
        if release:
            self._verify(folder, plan, functools.partial(release_weights, self.job))
        else:  # the model stays (runtimes, variants, latency, the next target): its pages still the checkpoint's go
            self._verify(folder, plan, functools.partial(drop_mapped_weights, self.job.model_object), lean=False)
        with warm_clients():
            if self.target_report.status == "ok" and runs:
                self._check_runtimes(folder, plan, request)
            if self.target_report.status == "ok" and plan.target.variants:  # made from the gated files, each gated
                check_variants(self.target_report, folder, self.job.model_object, plan, self.job.processor,
                               self.job.progress, self.job.options.runtimes)

    def report(self, folder: Path | None = None) -> None:
        """The report stage: `OUTPUT/<target>/export_report.json` (`folder`: the target's folder by default), for a
        target that has files there ("ok" or "failed"); not listed among the target's files (it cannot contain
        itself). Every write of a target's report is this one."""
        if self.target_report.status in ("ok", "failed"):
            write_json_atomic((folder or self.folder) / REPORT_FILE, self.job.report.to_json(only=self.name))

    def complete(self) -> None:
        """After the target's export (with workers: after every export of the job, the cores free): time the target
        when it passed, say it is done, write its report again."""
        job, target_report = self.job, self.target_report
        if job.options.verify and job.options.latency and target_report.status == "ok":
            self._measure_latency()
            if (target_report.latency or {}).get("points"):  # which run: a table of several runs' rows says so per row
                source = job.report.source
                target_report.latency.update(run=job.report.created_at,
                                             run_source=str(source.get("commit") or source.get("content_hash") or
                                                            "")[:12])
        job.progress(Step("target", "done" if target_report.status == "ok" else "error", self.name,
                          target_report.error))
        self.report()

    def known_plan(self):
        """The target's plan: the one it was exported with, or (a worker's target) made again here, as cheaply."""
        if self.name not in self.job.plans:
            with engine_output(f"plan {self.name}"):
                self.job.plans[self.name] = self._build_plan()
        return self.job.plans[self.name]

    # ── produce by rebinding ─────────────────────────────────────────────────

    def rebind_key(self, plan) -> str | None:
        """The target's rebind key (`hfexport.rebind.weight_map.rebind_key`); None for a quantized target (its weights
        are computed, not copied), or a model the job did not load from its source."""
        job, target = self.job, self.target
        if plan.quantization or target.quantization:
            if job.options.rebind and (self.folder / "export.json").is_file():
                self.target_report.rebind = {"from": None, "seconds": 0.0, "fallback": "the target is quantized: "
                                             "its weights are computed by the quantizer, not copied"}
            return None
        if job.options.inputs is not None or job.samples:
            return None
        if not target.rebind:  # the recipe turned it off: no map, no rebind
            return None
        packages = {package: job.report.packages.get(package) for package in target_packages(target)}
        try:
            return rebind_key(job.model_object, job.recipe.target_hash(self.name), packages)
        except Exception:  # noqa: BLE001 - a model whose state cannot be described is exported, never rebound
            return None

    def rebind(self, key: str, plan) -> bool:
        """The produce stage of a rebind: the new weights into the previous export of the target (in OUTPUT, else
        published in the job's repos: the open hfexport PR, then the branch), saved and gated; True when that passed.
        Otherwise the reason goes to the report's `rebind.fallback` and the caller exports."""
        job = self.job
        if not job.options.verify:
            if (self.folder / "export.json").is_file():
                self.target_report.rebind = {"from": None, "seconds": 0.0, "fallback": "verification is off: a "
                                             "rebound artifact is only kept once the gate passed"}
            return False
        if not (self.folder / "export.json").is_file() and job.repos:
            downloaded = job.output / f".{self.name}.previous-{os.getpid()}"
            try:
                with StepTimer(job.progress, "rebind", self.name,
                               "looking for a published export with the same rebind key"):
                    where = fetch_published_export(job.repos, self.name, key, downloaded, job.options.token)
                if where:
                    return self._rebind_from(key, plan, downloaded, where)
            finally:
                shutil.rmtree(downloaded, ignore_errors=True)
        return self._rebind_from(key, plan, self.folder, str(self.folder))

    def _rebind_from(self, key: str, plan, source: Path, where: str) -> bool:
        """`rebind` from the previous export in `source` (described as `where` in the report)."""
        job, target_report = self.job, self.target_report
        started = time.perf_counter()
        if (source / "export.json").is_file():
            load_weights(job)  # a job exported from its structure: the previous export takes the model's weights

        def fallback(reason: str | None) -> bool:
            target_report.rebind = None if reason is None else {
                "from": where, "seconds": round(time.perf_counter() - started, 4), "fallback": reason}
            return False

        manifest, reason = previous(source, key, job.model_object)
        if manifest is None:
            return fallback(reason)
        try:
            before = JobReport.read(source).targets.get(self.name)
        except HfExportError:
            before = None
        if before is None or before.status != "ok":
            return fallback("the previous export did not pass its gate")
        written = {}

        def write(folder: Path) -> None:
            written["bytes"] = rebind_copy(source, folder, manifest, job.model_object)

        try:
            final, seconds = self.save(write, "rebind", f"new weights into the graphs of {where}", "rebind_s")
        except RebindRefused as error:
            return fallback(str(error))
        target_report.status, target_report.error, target_report.method = "ok", None, "rebind"
        target_report.rebind = {"from": where, "seconds": round(seconds, 4), "fallback": None,
                                "bytes_written": written.get("bytes", 0)}
        self.gate(final, plan)  # the same gate as an export's: the deployment runtimes run on rebound files too
        self.report(final)  # a failure stays "failed" beside the rebound files until the export replaces them
        if target_report.status == "ok":
            return True
        reason = f"the rebound artifact failed the gate: {target_report.error}"
        target_report.status, target_report.error, target_report.method = "ok", None, "export"
        target_report.verification, target_report.files, target_report.total_bytes = None, [], 0
        target_report.timings.pop("verify_s", None)
        target_report.rebind = {"from": where, "seconds": round(time.perf_counter() - started, 4),
                                "fallback": reason[:2000]}
        job.progress(Step("rebind", "error", self.name, f"falling back to a full export: {reason}"))
        return False

    # ── inside the stages ────────────────────────────────────────────────────

    def _build_plan(self):
        """The target's plan on the job's model; on the twin its vocabulary's head run a block of rows at a time
        (`placeholders_in_blocks`: never its whole placeholder copied)."""
        job = self.job
        with placeholders_in_blocks(job.model_object):
            return build_plan(job.recipe, self.name, job.model_object, job.options.inputs, job.processor,
                              source=job.model, revision=job.revision_to_load, token=job.options.token,
                              samples=job.samples)

    def _record_weight_map(self, folder: Path, key: str) -> None:
        """The export's weight map into its export.json; a map that cannot be made leaves none (no rebind from it)."""
        started = time.perf_counter()
        try:
            with engine_output("weight map"):
                record(folder, self.job.model_object, key)
        except Exception as error:  # noqa: BLE001 - the map only enables later rebinds; the export stands without it
            self.target_report.rebind = {"from": None, "seconds": 0.0,
                                         "fallback": f"no weight map recorded: {engine_error_message(error)[:300]}"}
        self.target_report.timings["weight_map_s"] = round(time.perf_counter() - started, 4)

    def _verify(self, folder: Path, plan, release=None, lean: bool | None = None) -> None:
        """Parity of the saved artifacts (reloaded from `folder`) against the eager model (`release`: called once the
        eager side is done, `verify_exported`; `lean`: the artifact opened so, by default with `release`); a failure
        marks the target."""
        job, name, target_report, progress = self.job, self.name, self.target_report, self.job.progress
        progress(Step("verify", "start", name, "reloading from disk, comparing with the eager model"))
        started = time.perf_counter()
        try:
            with engine_output(f"verify {name}"):
                verification = verify_exported(folder, job.model_object, plan, job.processor, progress=progress,
                                               release=release, lean=lean)
        except (KeyboardInterrupt, SystemExit):
            raise
        except Exception as error:  # noqa: BLE001 - a verification that cannot run is not a pass
            message = f"verification could not run: {engine_error_message(error)}"
            verification = {"passed": False, "error": message, "probes": [], "failures": [message]}
        seconds = time.perf_counter() - started
        target_report.timings["verify_s"] = round(seconds, 4)
        target_report.verification = jsonable(verification)
        if not verification["passed"]:
            target_report.status, target_report.error = "failed", summary(verification)
        progress(Step("verify", "done" if verification["passed"] else "error", name, summary(verification), seconds))
        _count_artifact_process(target_report, verification)

    def _check_runtimes(self, folder: Path, plan, request=None) -> None:
        """The deployment runtimes of the target's format on its saved files (`hfexport.deployment.gate`); a runtime
        that generated other tokens than `model.generate` (or crashed) fails the target, one not installed is
        `not_checked`."""
        if not has_runtimes(str(plan.target.export_format)):
            return
        job, name, target_report = self.job, self.name, self.target_report
        with StepTimer(job.progress, "runtimes", name, "generating in the deployment runtimes") as timer, \
                engine_output(f"runtimes {name}"):
            try:
                checks = check_runtimes(folder, job.model_object, plan, job.processor, request)
            except (KeyboardInterrupt, SystemExit):
                raise
            except Exception as error:  # noqa: BLE001 - the expected tokens could not be made: say so, do not pass
                target_report.status = "failed"
                target_report.error = f"runtime checks could not run: {engine_error_message(error)}"
                return
        target_report.timings["runtimes_s"] = round(timer.seconds, 4)
        target_report.runtimes = [check.to_dict() for check in checks]
        failed = [check for check in checks if check.verdict == "failed"]
        if failed:
            target_report.status = "failed"
            target_report.error = "; ".join(f"{check.runtime}: {check.reason}" for check in failed)

    def _measure_latency(self) -> None:
        """The saved artifact's latency next to eager torch (`hfexport.latency`); a measurement that cannot run is
        recorded as such and never changes the target's verdict."""
        job, name, target_report = self.job, self.name, self.target_report
        plan = self.known_plan()
        load_weights(job)  # the gate may have let the model go (job/structure)
        try:
            with StepTimer(job.progress, "latency", name, "artifact vs eager torch, batch 1 and the largest "
                           "declared") as timer, engine_output(f"latency {name}"):
                target_report.latency = jsonable(measure_latency(self.folder, job.model_object, plan,
                                                                 eager_timings=job.eager_timings))
        except (KeyboardInterrupt, SystemExit):
            raise
        except Exception as error:  # noqa: BLE001 - latency is information, not a gate
            target_report.latency = {"error": engine_error_message(error)[:500]}
            return
        target_report.timings["latency_s"] = round(timer.seconds, 4)


def _count_artifact_process(target_report: TargetReport, verification: dict) -> None:
    """The verify stage's peak with the artifact's own process counted (`hfexport.verify.artifact`): the exporting
    process's resident set while it ran plus its own peak, where that is more than the stage measured here (the two
    are in memory together, and the preflight's `verify` estimate is for both)."""
    runtime = verification.get("runtime") or {}
    child, parent = runtime.get("process_peak_rss_mb"), runtime.get("process_parent_rss_mb")
    peaks = (target_report.memory or {}).get("peak_rss_mb")
    if child is None or parent is None or peaks is None:
        return
    peaks["verify"] = round(max(peaks.get("verify", 0.0), parent + child), 1)


def engine_error_message(error: BaseException) -> str:
    """One line naming the engine's failure, following the cause chain to the root message (a cause that repeats
    the previous message is left out). torch.export's suggested fixes for a dim's range are kept: they say which
    recipe bound to change (`Dim('seq', min=3, max=64)` -> `dims.seq.min` 3)."""
    messages: list[str] = []
    previous_line = None
    current: BaseException | None = error
    for _ in range(4):
        if current is None:
            break
        lines = [line.strip() for line in str(current).strip().splitlines()]
        first = lines[0] if lines else ""
        if first != previous_line or not first:
            fixes = _suggested_fixes(lines)
            messages.append(f"{type(current).__name__}: {first}".strip() + (f" Suggested fixes: {fixes}" if fixes else ""))
        previous_line = first
        current = current.__cause__ or current.__context__
    line = " <- ".join(messages)
    return redact(_recipe_field_hint(line) + line)[:2000]


_VIOLATED = re.compile(r"Constraints violated \(([^)]*)\)")
_FIX = re.compile(r"(\w+) = (?:Dim\('\w+'((?:, (?:min|max)=\d+)*)\)|(\d+))")


def _recipe_field_hint(line: str) -> str:
    """torch.export's shape-constraint error as the recipe fields that cause it: each violated dim is `dims.<name>`
    (each recipe dim becomes one torch.export.Dim of that name), with its suggested bounds ('' for other errors)."""
    violated = _VIOLATED.search(line)
    if not violated:
        return ""
    names = [name.strip() for name in violated.group(1).split(",") if name.strip()]
    fixes = []
    for name, bounds, constant in _FIX.findall(line.partition("Suggested fixes:")[2]):
        if constant:
            fixes.append(f"`dims.{name}` can only be {constant} for this model (make that axis static)")
        else:
            fixes += [f"`dims.{name}.{key}` {value}" for key, value in re.findall(r"(min|max)=(\d+)", bounds)]
    fields = ", ".join(f"`dims.{name}`" for name in names)
    advice = f"; set {', '.join(fixes)}" if fixes else "; narrow its min/max to what the model supports"
    return f"Recipe {fields}: the model cannot be traced over that range{advice}. "


def _suggested_fixes(lines: list[str]) -> str:
    """The `Suggested fixes:` block of a torch.export constraint violation, on one line ('' when absent)."""
    if "Suggested fixes:" not in lines:
        return ""
    fixes = []
    for line in lines[lines.index("Suggested fixes:") + 1:]:
        if not line:
            break
        fixes.append(line)
    return "; ".join(fixes)


def jsonable(value: Any) -> Any:
    """`value` as plain JSON data (what JSON cannot hold as its `str`)."""
    return json.loads(json.dumps(value, default=str))


def pretty(value: Any) -> str:
    """`value` as indented JSON text, one newline at the end."""
    return json.dumps(value, indent=2) + "\n"
