"""The `hfexport` command: a thin surface over the recipe and job APIs.

Exit codes: 0 ok, 1 a check failed (invalid recipe, parity), 2 the command could not run. Errors are one
readable message on stderr, never a traceback (`--debug` shows it) and never a token.
"""

from __future__ import annotations

import argparse
import contextlib
import dataclasses
import json
import os
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from hfexport.gc_policy import one_shot_collection
from hfexport.errors import (
    EXIT_CHECK_FAILED,
    EXIT_COULD_NOT_RUN,
    EXIT_OK,
    HfExportError,
    PublishRefusedError,
    RecipeError,
    SourceError,
    exit_code,
    first_line,
    redact,
    register_secret,
    status_exit_code,
)
from hfexport.files import MANIFEST_FILE, REPORT_FILE, human_bytes
from hfexport.formats import formats
from hfexport.hub import looks_like_repo_id
from hfexport.layout import canonical_format, format_label
from hfexport.logs import original_stream, quiet_engine_logs
from hfexport.progress import RUNNING, Heartbeat
from hfexport.recipe.loading import check_against_model, load_recipe
from hfexport.surfaces.annotations import check_recipe
from hfexport.version import __version__

# Each command imports what it runs: `validate` and `show` read the recipe only, so the job stack (job, publication,
# report, surfaces.ci) is imported inside the commands that run it (benchmarks/show.py measures the difference).

COMMANDS: dict[str, Callable[[argparse.Namespace], int]] = {}


def command(name: str):
    def register(function):
        COMMANDS[name] = function
        return function

    return register


def escape(text: str) -> str:
    from rich.markup import escape as rich_escape

    return rich_escape(text)


def _console(stderr: bool = True):
    from rich.console import Console


    # The terminal itself, not fd 1/2: while the engine runs, those are redirected into logging (hfexport.logs).
    return Console(file=original_stream("stderr" if stderr else "stdout"), highlight=False, soft_wrap=True)


def _token(args) -> str | None:
    """The token for Hub calls (--token, else HF_TOKEN), remembered so that every message redacts it."""
    token = getattr(args, "token", None) or os.environ.get("HF_TOKEN") or None
    register_secret(token)
    return token


# ── validate ─────────────────────────────────────────────────────────────────


@command("validate")
def cmd_validate(args) -> int:

    if args.format == "github":
        return _validate_github(args)
    args.json = args.json or args.format == "json"
    try:
        try:
            recipe = load_recipe(args.source, revision=args.revision, token=_token(args))
        except SourceError as error:  # `examples/tiny-bert` typed in another folder: say the folder is missing first
            if not isinstance(error, RecipeError) and not Path(args.source).exists() and "no such" not in str(error):
                raise SourceError(f"{args.source}: no such folder here; as a Hub repo id: {error}") from None
            raise
        check_against_model(recipe, args.source, revision=args.revision, token=_token(args))
    except RecipeError as error:
        if args.json:
            print(json.dumps({"valid": False, "source": error.source,
                              "problems": [{"path": p.path, "message": p.message} for p in error.problems]}, indent=2))
        else:
            _console().print(f"[red]✗[/red] {escape(str(error))}", markup=True, highlight=False)
        return EXIT_CHECK_FAILED
    if args.json:
        print(json.dumps({"valid": True, "source": recipe.source, "targets": recipe.target_names}, indent=2))
    else:
        targets = ", ".join(f"{name} ({format_label(t.export_format)}/{t.mode})" for name, t in recipe.targets.items())
        print(f"✓ valid recipe ({recipe.source}): {len(recipe.target_names)} target(s): {targets}")
    return EXIT_OK


def _validate_github(args) -> int:
    """Problems as GitHub annotations (`::error file=...,line=...,col=...::`), shown inline in pull requests."""
    annotations = check_recipe(args.source, revision=args.revision, token=_token(args))
    for annotation in annotations:
        print(annotation.command())
    if not annotations:
        print(f"valid recipe: {args.source}")
    return EXIT_CHECK_FAILED if annotations else EXIT_OK


# ── plan ─────────────────────────────────────────────────────────────────────


@command("plan")
def cmd_plan(args) -> int:
    """The targets a job would export, as a GitHub Actions matrix (`{"include": [...]}`): reads only the recipe."""
    from hfexport.surfaces.ci import matrix

    include = matrix(args.model, targets=args.target, revision=args.revision, token=_token(args), recipe=args.recipe)
    if args.json:
        print(json.dumps(include, separators=(",", ":")))  # one line: `echo "matrix=$(...)" >> $GITHUB_OUTPUT`
    else:
        for entry in include["include"]:
            print(f"{entry['target']}: {format_label(entry['export_format'])} / {entry['mode']}")
    return EXIT_OK


# ── show ─────────────────────────────────────────────────────────────────────


@command("show")
def cmd_show(args) -> int:
    """A target as its recipe states it (recipe only: no torch, about a second), or with `--resolve` / `--json` the
    resolved plan (loads the model: engine defaults, sample shapes, the components of a generation target)."""
    if args.json or args.resolve:
        return _show_resolved(args)

    recipe = load_recipe(args.recipe or args.source, revision=args.revision, token=_token(args))
    target = recipe.target(args.target)
    console = _console(stderr=False)
    task = recipe.task or "from the model's config"
    console.print(f"target [bold]{escape(target.name)}[/bold]: {format_label(target.export_format)} / {target.mode} "
                  f"(task {task})")
    if recipe.dims:
        console.print(f"dims: {_dims_line(recipe.dims)}")
    if target.mode == "forward":
        console.print("component [bold]model[/bold]")
        components = {"model": {"options": target.options, "dynamic_shapes": target.dynamic_shapes}}
    else:
        console.print("components: found in the model (prefill/decode, encoders, ...); --resolve lists them")
        components = {"(every component)": {"options": target.options, "dynamic_shapes": target.dynamic_shapes},
                      **{name: {"options": {**target.options, **override.get("options", {})},
                                "dynamic_shapes": override.get("dynamic_shapes")}
                         for name, override in target.components.items()}}
        if target.generation:
            console.print(f"generation: {json.dumps(target.generation)}", markup=False)
    for name, component in components.items():
        if name != "model":
            console.print(f"component [bold]{escape(name)}[/bold]")
        console.print(f"  options: {json.dumps(component['options'])}", markup=False)
        shapes = component["dynamic_shapes"]
        if shapes is None:
            console.print("  dynamic: every axis left to torch.export (dynamic=True)", markup=False)
        for input_name, spec in (shapes or {}).items():
            console.print(f"  {input_name} dynamic: {_axes_line(spec, recipe.dims)}", markup=False)
    if target.quantization:
        console.print(f"quantization: {json.dumps(target.quantization)}", markup=False)
    if target.parity:
        console.print(f"parity: {json.dumps(target.parity)}", markup=False)
    print("(as the recipe states it; --resolve loads the model for engine defaults and sample shapes)")
    return EXIT_OK


def _dims_line(dims: dict) -> str:
    return ", ".join(f"{name} [{b.get('min', '-')}, {b.get('max', '-')}]" for name, b in dims.items())


def _axes_line(spec, dims: dict) -> str:
    """One input's declared axes, with each named dim's bounds: `{0: batch [1, 8], 1: seq [2, 64]}`."""
    def axis(value):
        if isinstance(value, str) and value in dims:
            return f"{value} [{dims[value].get('min', '-')}, {dims[value].get('max', '-')}]"
        return str(value)

    if isinstance(spec, dict):
        return "{" + ", ".join(f"{key}: {_axes_line(value, dims) if isinstance(value, dict) else axis(value)}"
                               for key, value in spec.items()) + "}"
    if isinstance(spec, list):
        return "[" + ", ".join(_axes_line(item, dims) for item in spec) + "]"
    return axis(spec)


def _show_resolved(args) -> int:
    """The resolved plan: loads the model (plans resolve dims against real inputs) but traces nothing."""
    from hfexport.report.markdown import quantization_markdown
    from hfexport.export import AutoHfExporter

    exporter = AutoHfExporter.from_pretrained(args.source, target=args.target, revision=args.revision,
                                              token=_token(args), recipe=args.recipe)
    with _console().status(f"loading {args.source}"):
        model = exporter.load_model()
        plan = exporter.plan(model)
    described = plan.describe()
    if args.json:
        print(json.dumps(described, indent=2, default=str))
        return EXIT_OK
    console = _console(stderr=False)
    console.print(f"target [bold]{described['target']}[/bold]: {format_label(described['export_format'])} / {described['mode']}"
                  f" (task {described['task']})")
    if described["dims"]:
        console.print(f"dims: {_dims_line(described['dims'])}")
    for name, component in described["components"].items():
        console.print(f"component [bold]{name}[/bold]")
        options = {k: v for k, v in component["options"].items() if v not in (None, False)}
        console.print(f"  options: {json.dumps(options, default=str)}")
        for input_name, shape in component["input_shapes"].items():
            axes = _resolved_axes(component["dynamic_axes"], input_name, shape)
            console.print(f"  {input_name}: {shape.get('shape', shape)} dynamic: {axes or 'static'}")
    quantization = described.get("quantization")
    if quantization:
        console.print(quantization_markdown(quantization).replace("**", ""), markup=False, highlight=False)
    return EXIT_OK


def _resolved_axes(dynamic_axes: dict, input_name: str, shape: dict):
    """What `show` prints for one input's dynamic axes: the recipe's, or what hfexport left to torch.export."""
    if "*" not in dynamic_axes:
        return dynamic_axes.get(input_name)
    if "container" in shape and "cache" in dynamic_axes:
        return dynamic_axes["cache"]
    return "auto (torch.export decides)"


# ── export ───────────────────────────────────────────────────────────────────


class _JobProgress:
    """Job steps as a person reads them, with elapsed times. On a terminal (rich): one live line per running step,
    a spinner and its elapsed time ticking, then a ✓/✗ line with the step's seconds. Elsewhere (a CI log, a pipe):
    plain lines only, each led by the job's elapsed time: one per step, at its end, and a "still running" line at
    each heartbeat (`hfexport.progress.Heartbeat` re-sends a long step). `verbose` (`-v`) adds each step's start
    line and one line per verification probe (a tiny model's job is then 70-80 lines instead of ~20)."""

    def __init__(self, console, verbose: bool = False):
        self.console = console
        self.verbose = verbose
        self.live = console.is_terminal
        self.started = time.perf_counter()
        self.display = None  # rich's live Progress, while a step runs on a terminal
        self.tasks: dict[tuple[str, str | None], Any] = {}

    def _clock(self) -> str:
        elapsed = time.perf_counter() - self.started
        return f"[{int(elapsed // 60):02d}:{elapsed % 60:04.1f}]"

    def _print(self, text: str) -> None:
        self.console.print(text if self.live else f"{self._clock()} {text}", highlight=False)

    def __call__(self, step) -> None:
        label = f"{step.target}: {step.step}" if step.target else step.step
        key = (step.step, step.target)
        if step.step == "target":
            if step.status == "start":
                self._print(f"[bold]▶ {escape(step.target)}[/bold] ({escape(step.detail or '')})")
            return
        detail = escape(step.detail or "")
        if step.status == "start":
            if self.live:
                self.tasks[key] = self._live().add_task(f"{escape(label)} {detail}".strip())
            elif self.verbose:
                self._print(f"  … {escape(label)}" + (f" ({detail})" if detail else ""))
            return
        if step.status == RUNNING:
            if not self.live:
                self._print(f"  … {escape(label)}: still running, {step.seconds:.0f} s")
            return
        if step.step == "probe":  # one verification probe: its own line, under the verify step
            if self.live and ("verify", step.target) in self.tasks:
                self.display.update(self.tasks[("verify", step.target)], description=f"{escape(step.target)}: "
                                    f"verify — {detail}")
            if self.verbose or step.status != "done":  # a failing probe is always shown
                mark = "[green]✓[/green]" if step.status == "done" else "[red]✗[/red]"
                self._print(f"    {mark} {escape(label)} {detail}" + (f" {step.seconds:.1f}s" if step.seconds else ""))
            return
        task = self.tasks.pop(key, None)
        if task is not None and self.display is not None:
            self.display.remove_task(task)
            if not self.tasks:
                self.display.stop()
                self.display = None
        mark = "[green]✓[/green]" if step.status == "done" else "[red]✗[/red]"
        seconds = f" {step.seconds:.1f}s" if step.seconds is not None else ""
        failure = f" — {detail}" if step.status == "error" and detail else ""
        self._print(f"  {mark} {escape(label)}{seconds}{failure}")

    def _live(self):
        """rich's Progress (spinner, description, elapsed time), started when the first step of a run starts."""
        if self.display is None:
            from rich.progress import Progress, SpinnerColumn, TextColumn, TimeElapsedColumn

            self.display = Progress(SpinnerColumn(), TextColumn("{task.description}"), TimeElapsedColumn(),
                                    console=self.console, transient=True)
            self.display.start()
        return self.display

    def close(self):
        if self.display is not None:
            self.display.stop()
            self.display = None


def _workers(value: str) -> int | str:
    """`--workers`: "auto" or a number of processes (1 or more)."""
    from hfexport.job.parallel import workers_number

    if value == "auto":
        return value
    try:
        return workers_number(value)
    except ValueError as error:
        raise argparse.ArgumentTypeError(str(error).replace("workers=", "")) from None


def _max_memory(value: str) -> float:
    """`--max-memory`: a memory budget in MB (`hfexport.job.memory.parse_memory_size`)."""
    from hfexport.job.memory import parse_memory_size

    try:
        return parse_memory_size(value)
    except ValueError as error:
        raise argparse.ArgumentTypeError(str(error)) from None


def workers_arg(parser) -> None:
    parser.add_argument("--workers", type=_workers, default="auto", metavar="N|auto",
                        help="processes exporting targets at once (default auto: one per core, as many as fit in "
                             "memory; 1: this process only)")


HEARTBEAT_S = 30.0  # a plain log gets a "still running" line this often while a step runs


def _heartbeat(progress):
    """The progress callback with a heartbeat (`hfexport.progress.Heartbeat`), or nothing for --quiet."""
    return Heartbeat(progress, every=HEARTBEAT_S) if progress is not None else contextlib.nullcontext(None)


# The mode gave its column to parity (the table fits 80 columns); the Markdown report keeps both.
SUMMARY_COLUMNS = ("target", "format", "status", "parity", "size", "export", "verify")


def _parity_cell(target) -> str:
    """The parity verdict in one short word (the table fits 80 columns): pass, FAIL, skip, or - (not verified)."""
    verification = target.verification or {}
    if not verification:
        return "-"
    if verification.get("skipped"):
        return "skip"
    return "pass" if verification.get("passed") else "FAIL"


def _summary_rows(report) -> tuple[list[tuple[str, ...]], list[str]]:
    """The summary table's rows (short cells only) and the notes that go below it, each led by its target's name:
    one per target with an error, a parity failure or an unchanged reason."""
    rows, notes = [], []
    for name, target in report.targets.items():
        message = target.error or (target.unchanged_reason if target.status == "unchanged" else None)
        if message:
            notes.append(f"{name}: {redact(message)}")
        size = target.total_bytes or sum(f["bytes"] for f in target.files)
        rows.append((
            name, format_label(target.export_format), target.status, _parity_cell(target),
            human_bytes(size) if target.files else "-",
            f"{target.timings['export_s']:.1f}s" if "export_s" in target.timings else "-",
            f"{target.timings['verify_s']:.1f}s" if "verify_s" in target.timings else "-",
        ))
    return rows, notes


def plain_table(headers, rows) -> str:
    """Whitespace-aligned columns: what a log file or a pipe gets (no box drawing, no colour codes)."""
    widths = [max(len(str(row[i])) for row in [headers, *rows]) for i in range(len(headers))]
    lines = ["  ".join(str(cell).ljust(width) for cell, width in zip(row, widths)).rstrip() for row in [headers, *rows]]
    lines.insert(1, "  ".join("-" * width for width in widths))
    return "\n".join(lines)


def print_summary(report, console=None) -> None:
    """The job's results: a table that fits the terminal (80 columns included) with long messages as numbered
    notes below it; plain aligned text when stdout is not a terminal (CI logs, pipes)."""
    from rich import box
    from rich.table import Table

    from hfexport.report.markdown import memory_line

    console = console or _console(stderr=False)
    rows, notes = _summary_rows(report)
    notes += [line for line in (memory_line(report),) if line]  # per stage, the preflight's estimate beside
    title = f"hfexport · {report.source['model']}"
    if not console.is_terminal:
        console.file.write(f"{title}\n{plain_table(SUMMARY_COLUMNS, rows)}\n" + "".join(f"{n}\n" for n in notes))
        console.file.flush()
        return
    table = Table(title=title, box=box.SIMPLE_HEAD, padding=(0, 1, 0, 0), pad_edge=False, show_edge=False,
                  title_justify="left")
    for column in SUMMARY_COLUMNS:
        table.add_column(column, no_wrap=column != "target", overflow="fold")
    colours = {"ok": "green", "unchanged": "cyan", "failed": "red", "error": "red"}
    for row in rows:
        colour = colours.get(row[2], "white")
        table.add_row(*map(escape, row[:2]), f"[{colour}]{escape(row[2])}[/{colour}]", *map(escape, row[3:]))
    console.print(table)
    for note in notes:
        console.print(escape(note), soft_wrap=False, markup=True, highlight=False)


def _sample_files(args) -> dict[str, str] | None:
    """`--sample-image` / `--sample-audio` as run_job's `sample_files`."""
    files = {kind: path for kind, path in (("image", args.sample_image), ("audio", args.sample_audio)) if path}
    return files or None


@command("export")
def cmd_export(args) -> int:

    from hfexport.job.run import run_job

    console = _console()
    progress = _JobProgress(console, verbose=getattr(args, "verbose", False)) if not args.quiet else None
    try:
        # engine prints stay off stdout (--json is parsed from it); one_shot_collection: see hfexport.gc_policy
        with contextlib.redirect_stdout(sys.stderr), _heartbeat(progress) as beat, one_shot_collection(beat) as on_step:
            report = run_job(
                args.model, args.output, targets=args.target, all_targets=args.all_targets, revision=args.revision,
                token=_token(args), recipe=args.recipe, trust_remote_code=args.trust_remote_code, progress=on_step,
                force=args.force, preflight=not args.no_preflight, publish_repo=_push_repo(args) if args.push else None,
                verify=not args.no_verify, workers=args.workers, rebind=not args.no_rebind,
                latency=not args.no_latency, sample_files=_sample_files(args), max_memory_mb=args.max_memory,
            )
    finally:
        if progress:
            progress.close()
    if args.json:
        print(report.to_json(), end="")
    else:
        for name, target in report.targets.items():
            target.total_bytes = target.total_bytes or sum(entry["bytes"] for entry in target.files)
        print_summary(report)
        print(f"report: {os.path.join(args.output, 'export_report.json')}")
    code = status_exit_code(report.status)
    if args.push:
        exported = [name for name in report.targets if os.path.isfile(os.path.join(args.output, name, REPORT_FILE))]
        publish_code = _publish(args, _push_repo(args), exported or list(report.targets))
        code = max(code, publish_code) if publish_code != EXIT_OK else code
    return code


# ── verify, report, init ─────────────────────────────────────────────────────


@command("verify")
def cmd_verify(args) -> int:
    """Re-verify an exported target folder (or every target of an OUTPUT folder) against the model its report
    names (`--model` overrides); exit 1 when parity fails."""
    from hfexport.job.reverify import reverify
    from hfexport.report.markdown import target_verification_markdown
    from hfexport.report.text import verification_text

    folders = _target_folders(Path(args.folder))
    status = EXIT_OK
    for folder in folders:
        model, revision = _source_model(folder, args)
        with contextlib.redirect_stdout(sys.stderr), _console().status(f"verifying {folder} against {model}"):
            report, name = reverify(folder, model, revision=revision, token=_token(args),
                                    trust_remote_code=args.trust_remote_code, write_report=args.write_report)
        target = report.targets[name]
        if args.json:
            print(report.to_json(only=name), end="")
        elif args.format == "markdown":
            print(f"### `{name}` ({format_label(target.export_format)} / {target.mode}) vs {model}\n")
            print(target_verification_markdown(target))
        else:
            print(verification_text(name, target, str(model)) + "\n")
        if target.status != "ok":
            status = EXIT_CHECK_FAILED
    return status


def _target_folders(folder: Path) -> list[Path]:
    """OUTPUT/<target> itself, or each exported target of an OUTPUT folder (the targets its report lists)."""
    from hfexport.report.data import JobReport

    if not folder.is_dir():
        raise SourceError(f"{folder}: no such folder")
    if (folder / MANIFEST_FILE).is_file():
        return [folder]
    names = list(JobReport.read(folder).targets) if (folder / REPORT_FILE).is_file() else []
    found = [folder / name for name in names if (folder / name / MANIFEST_FILE).is_file()]
    if not found:
        raise SourceError(f"{folder}: neither an exported target folder (no export.json) nor an OUTPUT folder "
                          "with exported targets")
    return found


def _source_model(folder: Path, args) -> tuple[str, str | None]:
    """(model, revision) to verify against: `--model`/`--revision`, else what the target's report records (the
    commit it was exported from)."""
    from hfexport.report.data import JobReport

    if args.model:
        return args.model, args.revision
    source = JobReport.read(folder).source if (folder / REPORT_FILE).is_file() else {}
    model = source.get("model")
    if not model:
        raise SourceError(f"{folder}: its report names no source model; pass --model")
    local = not source.get("commit") and source.get("content_hash")  # a local folder: it has no Hub commit
    if not Path(model).is_dir() and (local or not looks_like_repo_id(model)):
        raise SourceError(f"{folder}: exported from the folder {model}, which is not here (no such folder); "
                          "pass --model")
    return model, args.revision or source.get("commit") or source.get("revision")


@command("report")
def cmd_report(args) -> int:
    """Print a job report (OUTPUT/, OUTPUT/<target>/ or the JSON file) as Markdown."""
    from hfexport.report.markdown import report_markdown
    from hfexport.report.data import JobReport

    report = JobReport.read(args.path)
    print(report.to_json() if args.json else report_markdown(report), end="")
    return EXIT_OK


@command("init")
def cmd_init(args) -> int:
    """Propose a recipe, export and verify each target, write the ones that passed."""
    from hfexport.job.propose import default_output, init_recipe

    output = args.output or default_output(args.model)
    if os.path.exists(output) and not args.force:
        raise HfExportError(f"{output} exists; pass --force to replace it, or -o to write elsewhere")
    console = _console()
    progress = _JobProgress(console, verbose=getattr(args, "verbose", False)) if not args.quiet else None
    try:
        with contextlib.redirect_stdout(sys.stderr), _heartbeat(progress) as beat, one_shot_collection(beat) as on_step:
            result = init_recipe(args.model, formats=args.format, output=output, revision=args.revision,
                                 token=_token(args), trust_remote_code=args.trust_remote_code, progress=on_step,
                                 exports=args.exports, workers=args.workers)
    finally:
        if progress:
            progress.close()
    for name, reason in result.failed.items():
        console.print(f"[red]✗[/red] {escape(name)}: {escape(reason)}", markup=True, highlight=False)
    if args.json:
        formats = {name: target["export_format"] for name, target in result.proposed["targets"].items()}
        print(json.dumps({"output": str(result.output) if result.output else None, "proposed": result.proposed,
                          "passed": result.passed, "formats": formats, "failed": result.failed}, indent=2))
    if not result.passed:
        console.print("[red]no target passed[/red]: nothing written", markup=True, highlight=False)
        return EXIT_CHECK_FAILED
    if args.json:
        return EXIT_OK
    print(f"wrote {output}: {len(result.passed)} verified target(s): {', '.join(result.passed)}"
          + (f"; left out: {', '.join(result.failed)}" if result.failed else ""))
    return EXIT_OK


# ── publish ──────────────────────────────────────────────────────────────────


def _push_repo(args) -> str:
    """Where `export --push` publishes: --repo, else the model's own repo (a local folder needs --repo)."""
    if args.repo:
        return args.repo

    if os.path.isdir(args.model) or "/" not in args.model or not looks_like_repo_id(args.model):
        raise HfExportError(f"--push: {args.model} is a local folder; name the Hub repo to publish to with --repo")
    return args.model


def _publish(args, repo: str, targets: list[str] | None) -> int:
    """Publish OUTPUT to `repo` and print what happened (the PR URL); a refused publication exits 1."""
    from hfexport.publication.publish import publish

    try:
        result = publish(args.output, repo, mode="commit" if args.commit else "pr", token=_token(args),
                         allow_failed=args.allow_failed, targets=targets, revision=getattr(args, "branch", None))
    except PublishRefusedError as error:
        _console().print(f"[red]not published:[/red] {escape(str(error))}", markup=True, highlight=False)
        return EXIT_CHECK_FAILED
    where = result.pr_url or (f"{repo}@{result.commit[:12]}" if result.commit else repo)
    message = {
        "opened": f"opened pull request {where}",
        "updated": f"pushed {result.commit[:12] if result.commit else ''} to pull request {where}",
        "committed": f"committed {where}",
        "unchanged": f"nothing to publish: {where} already holds these exports",
    }[result.action]
    stream = sys.stderr if getattr(args, "json", False) and args.command == "export" else sys.stdout
    if getattr(args, "json", False) and args.command == "publish":
        print(json.dumps(dataclasses.asdict(result), indent=2))
    else:
        print(message, file=stream)
        for name, why in result.left_out.items():
            print(f"not published: {name}: {why}", file=stream)
    return EXIT_OK


@command("publish")
def cmd_publish(args) -> int:
    return _publish(args, args.repo, args.target)


# ── parser and entry point ───────────────────────────────────────────────────


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="hfexport", description="Export Hugging Face models the way their owners' recipes say.",
    )
    parser.add_argument("--debug", action="store_true", help="show tracebacks and every log record")
    parser.add_argument("-v", "--verbose", action="store_true",
                        help="show what the engine and backends print (also: HFEXPORT_LOG=info)")
    parser.add_argument("--version", action="store_true", help="print the version and exit")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND")

    def source_args(p, name="source", help_text="a recipe file, a model folder or a Hub repo id"):
        p.add_argument(name, help=help_text)
        p.add_argument("--revision", help="Hub revision (branch, tag, commit or refs/pr/N)")
        p.add_argument("--token", help="Hub token (default: HF_TOKEN or the saved login)")

    p = sub.add_parser("validate", help="check a recipe; exit 1 listing every problem with its JSON path")
    source_args(p)
    p.add_argument("--json", action="store_true", help="print the result as JSON")
    p.add_argument("--format", choices=("text", "json", "github"), default="text",
                   help="github: one `::error file=,line=,col=::` annotation per problem (for CI)")

    p = sub.add_parser("plan", help="list the targets a job would export; --json: a GitHub Actions matrix")
    source_args(p, "model", "a model folder or a Hub repo id")
    p.add_argument("--target", action="append", help="a target to include (repeatable, or comma-separated; default: all)")
    p.add_argument("--recipe", help="a recipe file to use instead of the model's own")
    p.add_argument("--json", action="store_true", help='print {"include": [{"target", "export_format", "mode"}]}')

    p = sub.add_parser("show", help="print a target as the recipe states it (--resolve: the plan against the model)")
    source_args(p, help_text="a model folder or a Hub repo id")
    p.add_argument("--target", help="the target (default: the recipe's default target)")
    p.add_argument("--recipe", help="a recipe file to use instead of the model's own")
    p.add_argument("--resolve", action="store_true", help="load the model and print the resolved plan (engine "
                                                           "defaults, sample shapes, generation components)")
    p.add_argument("--json", action="store_true", help="print the resolved plan as JSON (loads the model)")

    p = sub.add_parser("export", help="export recipe targets to OUTPUT/<target>/")
    source_args(p, "model", "a model folder or a Hub repo id")
    group = p.add_mutually_exclusive_group()
    group.add_argument("--target", action="append", help="a target to export (repeatable; default: the recipe's default)")
    group.add_argument("--all-targets", action="store_true", help="export every target of the recipe")
    p.add_argument("--recipe", help="a recipe file to use instead of the model's own")
    p.add_argument("-o", "--output", required=True, help="output folder")
    p.add_argument("--json", action="store_true", help="print the job report as JSON on stdout")
    p.add_argument("--quiet", action="store_true", help="no progress output")
    p.add_argument("--trust-remote-code", action="store_true", help="allow model code from the repo (off by default)")
    p.add_argument("--force", action="store_true", help="export even targets whose cache key matches an existing export (and never rebind)")
    p.add_argument("--no-preflight", action="store_true", help="skip the memory/disk estimate before loading weights")
    p.add_argument("--max-memory", type=_max_memory, metavar="SIZE",
                   help="refuse the job before any weight is read when the preflight estimates a stage above SIZE "
                        "(3000, 3000MB, 3GB)")
    p.add_argument("--no-verify", action="store_true", help="skip parity verification (on by default; exit 1 on failure)")
    p.add_argument("--no-latency", action="store_true",
                   help="skip timing each verified target against eager torch (information, not a check)")
    p.add_argument("--no-rebind", action="store_true",
                   help="always export: never rebind a checkpoint's new weights into the previous export's graphs")
    p.add_argument("--sample-image", metavar="FILE",
                   help="your own image (PNG, JPEG, WebP, ...) in place of the recipe's synthesized sample images: the "
                        "export is traced and verified on it (no cache hit, no rebind; the report names the file)")
    p.add_argument("--sample-audio", metavar="FILE.wav",
                   help="your own clip (WAV, PCM 8-32 bits; resampled to the model's rate) in place of the recipe's "
                        "synthesized sample audio, as --sample-image")
    workers_arg(p)
    p.add_argument("--push", action="store_true", help="publish the exports to the Hub (a PR by default)")
    p.add_argument("--repo", help="with --push: the repo to publish to (default: the model's repo)")
    publish_args(p)

    p = sub.add_parser("verify", help="re-verify an exported OUTPUT/<target> folder against the model; exit 1 on failure")
    p.add_argument("folder", help="an exported target folder (OUTPUT/<target>) or an OUTPUT folder (every target)")
    p.add_argument("--model", help="the source model, a model folder or a Hub repo id (default: the one the "
                   "target's report names, at the commit it was exported from)")
    p.add_argument("--revision", help="Hub revision of the model")
    p.add_argument("--token", help="Hub token (default: HF_TOKEN or the saved login)")
    p.add_argument("--trust-remote-code", action="store_true", help="allow model code from the repo (off by default)")
    p.add_argument("--json", action="store_true", help="print the target's report, with this verification, as JSON")
    p.add_argument("--format", choices=("text", "markdown"), default="text",
                   help="text for a terminal (default), or Markdown (a PR comment, a job summary)")
    p.add_argument("--write-report", action="store_true",
                   help="update the saved export_report.json files with this verification (default: leave them)")

    p = sub.add_parser("report", help="print an export report as Markdown")
    p.add_argument("path", help="an OUTPUT folder, an OUTPUT/<target> folder or an export_report.json")
    p.add_argument("--json", action="store_true", help="print the (validated) JSON instead")

    p = sub.add_parser("init", help="propose a recipe for a model, export and verify it, write the targets that pass")
    source_args(p, "model", "a model folder or a Hub repo id")
    # the registered formats; a target name that is not its format's (pt2, pte) is accepted as an alias, and the
    # default is job.propose's DEFAULT_FORMATS (the job stack is not imported here)
    renamed = [backend for backend in formats() if backend.target_name != backend.name]
    p.add_argument("--format", action="append", type=canonical_format, choices=[b.name for b in formats()],
                   help="a format to propose a target for (repeatable; default: onnx; "
                        f"{' and '.join(b.target_name for b in renamed)} are accepted for "
                        f"{' and '.join(b.name for b in renamed)})")
    p.add_argument("-o", "--output", help="where to write the recipe (default: MODEL/export_config.json for a "
                                          "folder, else ./export_config.json)")
    p.add_argument("--force", action="store_true", help="replace an existing recipe file")
    p.add_argument("--exports", help="keep the exports made while validating in this folder (default: discarded)")
    p.add_argument("--json", action="store_true", help='print {"output", "proposed", "passed", "formats", "failed"} '
                                                       "(target -> reason) as JSON on stdout")
    p.add_argument("--quiet", action="store_true", help="no progress output")
    p.add_argument("--trust-remote-code", action="store_true", help="allow model code from the repo (off by default)")
    workers_arg(p)

    p = sub.add_parser("publish", help="publish an OUTPUT folder to a Hub repo, each target where the loaders look "
                                       "(onnx/, openvino/, ...; one PR per model)")
    p.add_argument("output", help="an `hfexport export` OUTPUT folder")
    p.add_argument("--repo", required=True, help="the Hub repo to publish to")
    p.add_argument("--target", action="append", help="a target folder to publish (repeatable; default: all)")
    p.add_argument("--branch", help="the branch the PR targets, or --commit commits to (default: main)")
    p.add_argument("--token", help="Hub token with write access (default: HF_TOKEN or the saved login)")
    p.add_argument("--json", action="store_true", help="print the result as JSON")
    publish_args(p)
    return parser


def publish_args(p) -> None:
    mode = p.add_mutually_exclusive_group()
    mode.add_argument("--pr", action="store_true", help="open or update the model's hfexport pull request (default)")
    mode.add_argument("--commit", action="store_true", help="commit directly to the branch instead of a PR")
    p.add_argument("--allow-failed", action="store_true", help="publish targets that failed parity (the PR says so)")


def _configure_logging(args) -> None:
    quiet_engine_logs(args.debug, getattr(args, "verbose", False))


def main(argv: list[str] | None = None) -> int:
    parser = build_parser()
    try:
        args = parser.parse_args(argv)
    except SystemExit as exit_:
        return EXIT_COULD_NOT_RUN if exit_.code not in (0, None) else EXIT_OK
    if args.version:
        print(f"hfexport {__version__}")
        return EXIT_OK
    if not args.command:
        parser.print_help()
        return EXIT_COULD_NOT_RUN
    _configure_logging(args)
    try:
        return COMMANDS[args.command](args)
    except HfExportError as error:
        if args.debug:
            raise
        _console().print(f"[red]error:[/red] {escape(str(error))}", markup=True, highlight=False)
        return exit_code(error)
    except KeyboardInterrupt as interrupt:
        _console().print("[red]interrupted[/red]: no partial output was kept")
        return exit_code(interrupt)
    except Exception as error:  # noqa: BLE001 - one readable line; --debug shows the traceback
        if args.debug:
            raise
        text = first_line(str(error))
        _console().print(f"[red]error:[/red] {type(error).__name__}: {escape(text)} (run with --debug for the traceback)",
                         markup=True, highlight=False)
        return exit_code(error)


if __name__ == "__main__":
    sys.exit(main())
