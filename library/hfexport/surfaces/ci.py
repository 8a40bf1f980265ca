"""The GitHub Action's steps, so that `action/action.yml` stays a thin list of `python -m hfexport.surfaces.ci STEP` calls.

Each step reads its inputs from `INPUT_*` environment variables (the action passes them explicitly: composite
actions do not export inputs), calls the job and publishing APIs, and talks back to GitHub through its files and
workflow commands: outputs in `GITHUB_OUTPUT`, the Markdown report in `GITHUB_STEP_SUMMARY`, `::error` annotations
(recipe problems on the recipe file's line and column, parity failures per target). Outside GitHub (no such
variables) outputs go to stdout, so the steps also run by hand.

Steps (`python -m hfexport.surfaces.ci STEP`; the action's `command` input picks export, plan or gather):
    export   validate the recipe (annotations), run the job into OUTPUT_DIR, write the report (JSON + Markdown),
             set outputs; exit 1 on an invalid recipe or (with fail-on-parity) a parity failure, 2 if a target
             could not be exported.
    plan     the recipe's targets as a matrix (output `matrix`), for a fan-out over several jobs.
    gather   merge the outputs of a fan-out's jobs (GATHER_FROM: one folder per downloaded artifact) into
             OUTPUT_DIR: their target folders and one job report, so that `publish` makes one PR of them.
    publish  publish OUTPUT_DIR as one pull request per model (or a commit) through `hfexport.publication.publish`.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import re
import sys
import uuid
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

from hfexport.errors import (
    EXIT_CHECK_FAILED,
    EXIT_OK,
    HfExportError,
    exit_code,
    first_line,
    register_secret,
    status_exit_code,
)
from hfexport.files import REPORT_FILE, write_json_atomic
from hfexport.hub import looks_like_repo_id
from hfexport.job.memory import parse_memory_size
from hfexport.job.run import run_job, select_targets
from hfexport.logs import quiet_engine_logs
from hfexport.publication.publish import publish
from hfexport.recipe.loading import load_recipe
from hfexport.report.markdown import report_markdown
from hfexport.report.data import JobReport
from hfexport.surfaces.annotations import Annotation, check_recipe

MARKDOWN_FILE = "export_report.md"
PUBLISH_MODES = ("none", "pr", "commit")
TRUE = ("true", "1", "yes", "on")
FALSE = ("false", "0", "no", "off", "")


# ── targets and the fan-out matrix ───────────────────────────────────────────


def parse_targets(value: str | Sequence[str] | None) -> tuple[list[str] | None, bool]:
    """The action's `targets` input: "all" -> every target; "" -> the recipe's default; "a, b c" -> those."""
    items = [value] if isinstance(value, str) or value is None else list(value)
    names = [name for item in items for name in re.split(r"[\s,]+", item or "") if name]
    if names == ["all"]:
        return None, True
    if "all" in names:
        raise HfExportError(f"targets: 'all' cannot be combined with target names ({', '.join(names)})")
    return names or None, False


def matrix(model: str | Path, targets: str | Sequence[str] | None = None, *, revision: str | None = None,
           token: str | None = None, recipe: str | Path | None = None) -> dict:
    """A GitHub Actions matrix of the recipe's targets (all of them unless named): reads only the recipe."""
    loaded = load_recipe(recipe if recipe else model, revision=revision, token=token)
    names, _ = parse_targets(targets)
    selected = select_targets(loaded, names, all_targets=not names)
    return {"include": [{"target": name, "export_format": loaded.target(name).export_format,
                         "mode": loaded.target(name).mode} for name in selected]}


# ── GitHub's files ───────────────────────────────────────────────────────────


def set_output(name: str, value: str) -> None:
    """One step output (multi-line safe, with a random delimiter); printed when not on GitHub."""
    path = os.environ.get("GITHUB_OUTPUT")
    if not path:
        print(f"{name}={value}")
        return
    delimiter = f"ghadelimiter_{uuid.uuid4().hex}"
    with open(path, "a", encoding="utf-8") as stream:
        stream.write(f"{name}<<{delimiter}\n{value}\n{delimiter}\n")


def add_summary(markdown: str) -> None:
    """Append Markdown to the job summary page (nothing outside GitHub)."""
    path = os.environ.get("GITHUB_STEP_SUMMARY")
    if path:
        with open(path, "a", encoding="utf-8") as stream:
            stream.write(markdown.rstrip() + "\n\n")


def command(level: str, message: str, title: str | None = None) -> None:

    print(Annotation(message, title=title or "", level=level).command(), flush=True)


# ── inputs ───────────────────────────────────────────────────────────────────


@dataclass
class Inputs:
    """The action's inputs, read from `INPUT_<NAME>` (hyphens as underscores)."""

    model: str
    revision: str | None
    recipe: str | None
    targets: str
    publish: str
    repo: str | None
    token: str | None
    fail_on_parity: bool
    force: bool
    output_dir: Path
    workspace: Path
    gather_from: Path | None = None
    rebind: bool = True
    max_memory_mb: float | None = None  # a job that would need more is refused before any weight is read

    @classmethod
    def from_env(cls, environ: Mapping[str, str] | None = None) -> Inputs:
        environ = os.environ if environ is None else environ

        def get(name: str, default: str = "") -> str:
            return (environ.get(f"INPUT_{name.upper().replace('-', '_')}") or default).strip()

        def flag(name: str, default: bool) -> bool:
            value = get(name, "true" if default else "false").lower()
            if value not in TRUE + FALSE:
                raise HfExportError(f"input {name}: expected true or false, got {value!r}")
            return value in TRUE

        workspace = Path(environ.get("GITHUB_WORKSPACE") or os.getcwd())
        publish = get("publish", "none").lower()
        if publish not in PUBLISH_MODES:
            raise HfExportError(f"input publish: expected one of {', '.join(PUBLISH_MODES)}, got {publish!r}")
        model = get("model")
        if not model:
            raise HfExportError("input model is required: a Hub repo id or a folder of this repository")
        temp = environ.get("RUNNER_TEMP") or "/tmp"
        gather_from = get("gather-from")
        max_memory = get("max-memory")
        try:
            max_memory_mb = parse_memory_size(max_memory) if max_memory else None
        except ValueError as error:
            raise HfExportError(f"input max-memory: {error}") from None
        return cls(
            model=model, revision=get("revision") or None, recipe=get("recipe") or None, targets=get("targets", "all"),
            publish=publish, repo=get("repo") or None, token=get("hf-token") or environ.get("HF_TOKEN") or None,
            fail_on_parity=flag("fail-on-parity", True), force=flag("force", False),
            output_dir=Path(get("output-dir") or os.path.join(temp, "hfexport-output")), workspace=workspace,
            gather_from=workspace / gather_from if gather_from else None, rebind=flag("rebind", True),
            max_memory_mb=max_memory_mb,
        )

    def model_source(self) -> str:
        """A folder of the checked-out repository if one exists at that path, else the Hub repo id."""
        local = self.workspace / self.model
        if local.is_dir():
            return str(local)
        if looks_like_repo_id(self.model):
            return self.model
        raise HfExportError(f"input model: {self.model!r} is neither a folder of the workspace nor a Hub repo id")

    def recipe_source(self) -> str | None:
        if not self.recipe:
            return None
        path = self.workspace / self.recipe
        if not path.is_file():
            raise HfExportError(f"input recipe: no file {self.recipe} in the workspace")
        return str(path)

    def publish_repo(self) -> str:
        if self.repo:
            return self.repo
        if Path(self.model_source()).is_dir():
            raise HfExportError("input repo is required to publish an export of a local folder")
        return self.model


# ── steps ────────────────────────────────────────────────────────────────────


class _LogProgress:
    """Job progress as plain log lines on the step's stdout (GitHub's log viewer has no live spinner)."""

    def __init__(self, stream=None):
        self.stream = stream or sys.stdout

    def print(self, text: str) -> None:
        print(text, file=self.stream, flush=True)

    def __call__(self, step) -> None:
        if step.step == "target":
            if step.status == "start":
                self.print(f"▶ {step.target} ({step.detail})")
            return
        if step.status == "start":
            return
        mark = "✓" if step.status == "done" else "✗"
        label = f"{step.target}: {step.step}" if step.target else step.step
        seconds = f" {step.seconds:.1f}s" if step.seconds is not None else ""
        detail = f" — {step.detail}" if step.status == "error" and step.detail else ""
        self.print(f"  {mark} {label}{seconds}{detail}")


def step_export(inputs: Inputs) -> int:
    """Validate the recipe (annotations), run the job, write the report and the outputs."""
    register_secret(inputs.token)
    if inputs.token:
        print(f"::add-mask::{inputs.token}", flush=True)
    output = inputs.output_dir
    set_output("output-dir", str(output))
    model = inputs.model_source()
    recipe = inputs.recipe_source()
    problems = check_recipe(recipe or model, revision=None if recipe else inputs.revision, token=inputs.token,
                            workspace=inputs.workspace)
    if problems:
        for annotation in problems:
            print(annotation.command(), flush=True)
        add_summary("## hfexport: invalid recipe\n\n" + "\n".join(
            f"- `{a.file or 'recipe'}` line {a.line}, column {a.col}: {a.message}" for a in problems))
        set_output("status", "invalid")
        set_output("changed", "false")
        return EXIT_CHECK_FAILED
    names, all_targets = parse_targets(inputs.targets)
    progress = _LogProgress(sys.stdout)
    with contextlib.redirect_stdout(sys.stderr):  # engine prints stay out of the command stream
        report = run_job(model, output, targets=names, all_targets=all_targets, revision=inputs.revision,
                         token=inputs.token, recipe=recipe, progress=progress, force=inputs.force,
                         publish_repo=inputs.repo, workers="auto", rebind=inputs.rebind,
                         max_memory_mb=inputs.max_memory_mb)
    return _finish(report, output, inputs.fail_on_parity)


def _finish(report: JobReport, output: Path, fail_on_parity: bool) -> int:
    """Report files, summary and outputs of a job; its exit code."""
    markdown = report_markdown(report)
    write_json_atomic(output / MARKDOWN_FILE, markdown)
    add_summary(markdown)
    set_output("report-json", str(output / REPORT_FILE))
    set_output("report-markdown", str(output / MARKDOWN_FILE))
    set_output("changed", "true" if report.changed else "false")
    set_output("status", report.status)
    print(f"hfexport: {report.status}; changed: {str(report.changed).lower()}; report: {output / REPORT_FILE}")
    for name, target in report.targets.items():
        if target.status == "error":
            command("error", f"{name}: {target.error}", title=f"hfexport: {name} could not be exported")
        elif target.status == "failed":
            command("error" if fail_on_parity else "warning", f"{name}: {_failure(target)}",
                    title=f"hfexport: {name} failed parity")
    if report.status == "failed" and not fail_on_parity:
        return EXIT_OK  # the action's `fail-on-parity: false`: report the failure, keep the workflow green
    return status_exit_code(report.status)


def _failure(target) -> str:
    verification = target.verification or {}
    return str(verification.get("summary") or target.error or "exported outputs differ from the model's")


def step_publish(inputs: Inputs) -> int:
    """Publish the export step's output: one PR per model (updated in place) or a commit."""
    register_secret(inputs.token)
    output = inputs.output_dir
    report = JobReport.read(output)
    with contextlib.redirect_stdout(sys.stderr):
        result = publish(output, inputs.publish_repo(), mode=inputs.publish, token=inputs.token,
                         allow_failed=not inputs.fail_on_parity, revision=inputs.revision)
    set_output("pr-url", result.pr_url or "")
    set_output("publish-action", result.action)
    set_output("commit", result.commit or "")
    where = result.pr_url or (f"{result.repo_id}@{result.commit}" if result.commit else result.repo_id)
    print(f"hfexport: publication {result.action}: {where}")
    add_summary(f"**Publication:** {result.action} — {where}" + ("" if report.changed else " (cache hit)"))
    return EXIT_OK


def step_plan(inputs: Inputs) -> int:
    """The recipe's targets (the `targets` input; all by default) as a one-line JSON matrix output."""
    register_secret(inputs.token)
    include = matrix(inputs.model_source(), inputs.targets, revision=inputs.revision, token=inputs.token,
                     recipe=inputs.recipe_source())
    text = json.dumps(include, separators=(",", ":"))
    set_output("matrix", text)
    print(f"hfexport: {len(include['include'])} target(s): {', '.join(e['target'] for e in include['include'])}")
    return EXIT_OK


def gather_reports(into: str | Path, sources: Sequence[str | Path] = ()) -> JobReport:
    """One job report from the outputs of a fan-out's jobs, written to `INTO/export_report.json`.

    Each source is one job's OUTPUT folder (a downloaded artifact): its job report is merged and its target
    folders are copied into `into` (a target that was a cache hit has a report entry but no folder). With no
    sources, `into` already holds the target folders (`INTO/<target>/export_report.json`). All parts must come
    from the same model files and recipe.
    """
    import shutil

    into = Path(into)
    parts: list[JobReport] = []
    if sources:
        for source in map(Path, sources):
            parts.append(JobReport.read(source))
            for name in parts[-1].targets:
                if (source / name / REPORT_FILE).is_file() and source.resolve() != into.resolve():
                    shutil.rmtree(into / name, ignore_errors=True)
                    shutil.copytree(source / name, into / name)
    else:
        parts = [JobReport.read(path) for path in sorted(into.glob(f"*/{REPORT_FILE}"))]
    if not parts:
        raise HfExportError(f"nothing to gather: no reports in {', '.join(map(str, sources)) or into}")
    first = parts[0]

    def origin(report: JobReport) -> tuple:
        source = report.source
        return source.get("model"), source.get("content_hash") or source.get("commit"), source.get("recipe_sha256")

    for report in parts[1:]:
        if origin(report) != origin(first):
            raise HfExportError(f"the reports to gather come from different sources: {origin(first)} and {origin(report)}")
    merged = JobReport(source=first.source, packages=first.packages, hfexport_version=first.hfexport_version,
                       peak_rss_mb=max((part.peak_rss_mb or 0 for part in parts), default=None) or None,
                       memory=_merged_memory(parts))
    for report in parts:
        merged.targets.update(report.targets)
        for key, value in report.timings.items():
            merged.timings[key] = round(merged.timings.get(key, 0.0) + value, 4)
    into.mkdir(parents=True, exist_ok=True)
    write_json_atomic(into / REPORT_FILE, merged.to_json())
    return merged


def _merged_memory(parts: Sequence[JobReport]) -> dict | None:
    """The fan-out jobs' own memory blocks as one (hfexport.job.memory): each stage's largest peak and largest
    estimate over the jobs (each ran on a machine of its own: the largest is what one machine needs), the budget
    and what was available as the first job had them."""
    blocks = [part.memory for part in parts if part.memory]
    if not blocks:
        return None
    merged = dict(blocks[0])
    for key in ("peak_rss_mb", "estimate_mb"):
        stages: dict = {}
        for block in blocks:
            for stage, value in (block.get(key) or {}).items():
                stages[stage] = max(stages.get(stage, 0.0), value)
        if stages:
            merged[key] = stages
    return merged


def step_gather(inputs: Inputs) -> int:
    """Merge the fan-out's artifacts (one folder each under GATHER_FROM) into OUTPUT_DIR; report as `export`."""
    set_output("output-dir", str(inputs.output_dir))
    sources = []
    if inputs.gather_from is not None:
        if not inputs.gather_from.is_dir():
            raise HfExportError(f"input gather-from: no folder {inputs.gather_from}")
        sources = sorted(p for p in inputs.gather_from.iterdir() if (p / REPORT_FILE).is_file())
        if not sources:
            raise HfExportError(f"input gather-from: no job outputs (folders with {REPORT_FILE}) in {inputs.gather_from}")
    report = gather_reports(inputs.output_dir, sources)
    return _finish(report, inputs.output_dir, inputs.fail_on_parity)


STEPS = {"export": step_export, "plan": step_plan, "gather": step_gather, "publish": step_publish}


# ── entry point ──────────────────────────────────────────────────────────────


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m hfexport.surfaces.ci", description=__doc__.split("\n\n")[0])
    parser.add_argument("step", choices=sorted(STEPS), help="the action step to run (inputs from INPUT_* variables)")
    parser.add_argument("--debug", action="store_true", help="show tracebacks")
    args = parser.parse_args(argv)

    quiet_engine_logs(args.debug)
    try:
        return STEPS[args.step](Inputs.from_env())
    except HfExportError as error:
        if args.debug:
            raise
        return _failed(args.step, str(error), exit_code(error))
    except Exception as error:  # noqa: BLE001 - one readable line; --debug shows the traceback
        if args.debug:
            raise
        text = first_line(str(error))
        return _failed(args.step, f"{type(error).__name__}: {text}", exit_code(error))


def _failed(step: str, message: str, code: int) -> int:
    """A step that could not run: one annotation and a line in the job summary."""
    command("error", message, title=f"hfexport {step}")
    add_summary(f"## hfexport {step} could not run\n\n{message}")
    return code


if __name__ == "__main__":
    sys.exit(main())
