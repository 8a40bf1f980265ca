"""The compatibility matrix: tiny models (`hfexport.testing.models`) × formats × modes, each cell one real job.

A cell runs `hfexport.job.run.run_job(model_dir, out, targets=["<format>-<mode>"])`, which exports, saves, reloads
the artifacts from disk and verifies them against the eager model. Its outcome is one of:

- `pass`: exported and verified;
- `parity-fail`: exported, but verification failed (the detail names the probe, output and metric);
- `error`: the plan, export, save or reload failed (the detail is the engine's error, one line);
- `timeout`: the cell's subprocess ran past its limit and was killed;
- `exported`: exported and saved, not verified (a job run with `verify=False`).

`run_cell` runs one cell in this process; `run_cells_subprocess` runs cells one after another in a child process
with a timeout per cell (so a hang or a crash in a backend costs one cell, not the run: the cells after it go on in a
fresh process), `run_cell_subprocess` one cell so; `run_matrix` runs many, optionally in parallel, optionally several
cells to a process (one interpreter start and one import of torch and the engine for all of them).
The rows are the tiny models and, beside them, the
published configs of `hfexport.testing.zoo` (2 layers, the MLP cut to `ZOO_MLP`, the published heads and head size).
`render_markdown` writes `docs/compatibility.md` from results; `compare` checks results against the expectations
file (a cell that passed must keep passing). `scripts/compatibility_matrix.py` and `tests/test_matrix.py` both
run cells through this module. As a command (what `run_cell_subprocess` runs):

    python -m hfexport.testing.matrix MODEL/FORMAT/MODE [MODEL/FORMAT/MODE ...] --workdir DIR --results DIR
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import subprocess
import sys
import time
from collections.abc import Callable, Iterable, Sequence
from concurrent.futures import ThreadPoolExecutor, as_completed
from dataclasses import asdict, dataclass, field
from pathlib import Path

from .models import FORMATS, MODELS, make_model, target_name
from .zoo import FAST_EXPERTS, FAST_HEADS, FAST_MLP, ZOO
from .zoo import build as build_zoo_model

OUTCOMES = ("pass", "parity-fail", "error", "timeout", "exported")
MODES = ("forward", "generation")
DETAIL_CHARS = 400
DEFAULT_TIMEOUT_S = 300.0
#: A zoo model's MLP width in the matrix (and its MoE experts cut): no cache or attention shape depends on it.
ZOO_MLP = 512
PUBLISHED_DOCUMENT = "published widths"  # meta["document"] of docs/compatibility_published.json


def model_modes(name: str) -> tuple[str, ...]:
    """The modes a matrix row (a tiny model or a zoo model) has targets for."""
    return MODELS[name].modes if name in MODELS else ZOO[name].modes


@dataclass(frozen=True, order=True)
class Cell:
    """One model × format × mode."""

    model: str
    export_format: str
    mode: str

    @property
    def id(self) -> str:
        return f"{self.model}/{self.export_format}/{self.mode}"

    @property
    def target(self) -> str:
        return target_name(self.export_format, self.mode)

    @classmethod
    def parse(cls, cell_id: str) -> Cell:
        parts = cell_id.split("/")
        if len(parts) != 3:
            raise ValueError(f"{cell_id!r} is not MODEL/FORMAT/MODE")
        return cls(*parts)


@dataclass
class CellResult:
    """What one cell did: outcome, one-line detail (metric or error), the failing stage, timings in seconds."""

    model: str
    export_format: str
    mode: str
    outcome: str
    detail: str | None = None
    stage: str | None = None
    timings: dict[str, float] = field(default_factory=dict)
    runtimes: list[dict] = field(default_factory=list)  # the gate's deployment runtime checks (report `runtimes`)

    @property
    def id(self) -> str:
        return Cell(self.model, self.export_format, self.mode).id

    @property
    def cell(self) -> Cell:
        return Cell(self.model, self.export_format, self.mode)

    def to_dict(self) -> dict:
        return asdict(self)

    @classmethod
    def from_dict(cls, data: dict) -> CellResult:
        return cls(**data)


def all_cells(models: Iterable[str] | None = None, formats: Iterable[str] | None = None,
              modes: Iterable[str] | None = None) -> list[Cell]:
    """Every cell that applies: each model × each format × each of the model's modes (filtered when given)."""
    models = list(models) if models else list(MODELS)
    unknown = [name for name in models if name not in MODELS and name not in ZOO]
    if unknown:
        raise ValueError(f"unknown model(s) {', '.join(unknown)}; known: {', '.join([*MODELS, *ZOO])}")
    formats = list(formats) if formats else list(FORMATS)
    modes = list(modes) if modes else list(MODES)
    return [
        Cell(name, export_format, mode)
        for name in models for mode in model_modes(name) if mode in modes
        for export_format in formats
    ]


def one_line(text: str | None, limit: int = DETAIL_CHARS) -> str | None:
    """Collapse whitespace; cut long text with an ellipsis."""
    if text is None:
        return None
    line = " ".join(str(text).split())
    return line if len(line) <= limit else line[: limit - 1] + "…"


# ── Outcome of a job report ──────────────────────────────────────────────────


def outcome_of(target_report, failed_stage: str | None = None) -> tuple[str, str | None, str | None]:
    """`(outcome, detail, stage)` of one target of a job report (the classification every cell uses)."""
    status = target_report.status
    verification = target_report.verification
    if status == "error":
        return "error", one_line(target_report.error), failed_stage or "export"
    if status == "failed":
        if verification and verification.get("error") and not verification.get("probes"):
            return "error", one_line(verification["error"]), "verify"
        failures = (verification or {}).get("failures") or [target_report.error or "failed"]
        return "parity-fail", one_line(failures[0]), "verify"
    if status in ("ok", "unchanged"):
        if verification is None:
            return "exported", None, None
        if verification.get("passed"):
            return "pass", None, None
        return "parity-fail", one_line(((verification.get("failures") or ["failed"])[0])), "verify"
    return "error", one_line(f"unexpected target status {status!r}: {target_report.error}"), failed_stage


def result_from_report(cell: Cell, report, target: str | None = None, failed_stage: str | None = None,
                       wall_s: float | None = None) -> CellResult:
    """A cell's result from the `JobReport` of a job that ran its target (`target` defaults to the cell's)."""
    target_report = report.targets[target or cell.target]
    outcome, detail, stage = outcome_of(target_report, failed_stage)
    timings = {key: value for key, value in target_report.timings.items() if isinstance(value, (int, float))}
    if wall_s is not None:
        timings["wall_s"] = round(wall_s, 2)
    runtimes = [{key: check[key] for key in ("runtime", "verdict", "version", "reason") if check.get(key)}
                for check in target_report.runtimes or []]
    return CellResult(cell.model, cell.export_format, cell.mode, outcome, detail, stage, timings, runtimes)


# ── Running cells ────────────────────────────────────────────────────────────


def model_folder(workdir: Path, name: str) -> Path:
    return Path(workdir) / "models" / name


def ensure_models(workdir: Path, names: Iterable[str], rebuild: bool = False, fast: bool = False) -> dict[str, Path]:
    """Build each model under `workdir/models/`: always with `rebuild`, else only when it is missing. A zoo model is
    built with its MLP cut to `ZOO_MLP`, or (`fast`) narrowed as the default suite's slice has it
    (`hfexport.testing.zoo.build(fast=True)`)."""
    folders = {}
    for name in dict.fromkeys(names):
        folder = model_folder(workdir, name)
        if rebuild or not (folder / "export_config.json").is_file():
            if name in MODELS:
                make_model(name, folder)
            elif fast:
                build_zoo_model(name, folder, fast=True)
            else:
                build_zoo_model(name, folder, mlp=ZOO_MLP)
        folders[name] = folder
    return folders


def run_cell(cell: Cell, workdir: str | Path, verify: bool = True, latency: bool = True,
             fast: bool = False) -> CellResult:
    """Run one cell in this process: build the model if needed (`fast`: see `ensure_models`), run the job for the
    cell's target (`latency`: with its latency measured), classify."""
    from hfexport.errors import HfExportError
    from hfexport.job.run import engine_error_message, run_job

    workdir = Path(workdir)
    started = time.perf_counter()
    failed: dict[str, str] = {}

    def progress(step) -> None:
        if step.status == "error" and step.step != "target":
            failed.setdefault("stage", step.step)

    try:
        folder = ensure_models(workdir, [cell.model], fast=fast)[cell.model]
        output = workdir / "out" / cell.model / cell.target
        kwargs = ({} if verify else {"verify": False}) | ({} if latency else {"latency": False})
        report = run_job(folder, output, targets=[cell.target], progress=progress, **kwargs)
    except HfExportError as error:
        return CellResult(*_key(cell), "error", one_line(str(error)), failed.get("stage", "job"),
                          {"wall_s": round(time.perf_counter() - started, 2)})
    except Exception as error:  # noqa: BLE001 - a job that dies outside its targets is this cell's error
        return CellResult(*_key(cell), "error", one_line(engine_error_message(error)), failed.get("stage", "job"),
                          {"wall_s": round(time.perf_counter() - started, 2)})
    return result_from_report(cell, report, failed_stage=failed.get("stage"), wall_s=time.perf_counter() - started)


def _key(cell: Cell) -> tuple[str, str, str]:
    return cell.model, cell.export_format, cell.mode


def cell_environment(threads: int | None = None) -> dict[str, str]:
    """The environment of a cell's subprocess: this one, the package importable, nothing fetched from a hub."""
    library = str(Path(__file__).resolve().parents[2])
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [library, env.get("PYTHONPATH")]))
    env.setdefault("TRANSFORMERS_VERBOSITY", "error")
    env.setdefault("TOKENIZERS_PARALLELISM", "false")
    env["HF_HUB_DISABLE_TELEMETRY"] = "1"
    if threads:
        for name in ("OMP_NUM_THREADS", "MKL_NUM_THREADS", "OPENBLAS_NUM_THREADS"):
            env[name] = str(threads)
    return env


def result_path(workdir: Path, cell: Cell, suffix: str = "json") -> Path:
    """Where a cell's subprocess writes its `CellResult` (`json`) and its output (`log`)."""
    return Path(workdir) / "results" / f"{cell.model}.{cell.export_format}.{cell.mode}.{suffix}"


def run_cell_subprocess(cell: Cell, workdir: str | Path, timeout: float = DEFAULT_TIMEOUT_S,
                        threads: int | None = None, verify: bool = True, latency: bool = True,
                        fast: bool = False) -> CellResult:
    """Run one cell in a child process; kill its whole process group after `timeout` seconds."""
    return run_cells_subprocess([cell], workdir, timeout, threads, verify, latency, fast)[0]


def run_cells_subprocess(cells: Sequence[Cell], workdir: str | Path, timeout: float = DEFAULT_TIMEOUT_S,
                         threads: int | None = None, verify: bool = True, latency: bool = True,
                         fast: bool = False, rebuild: bool = False) -> list[CellResult]:
    """Run `cells` one after another in one child process (`rebuild`: each model built afresh there first, `fast`
    as `ensure_models` says). `timeout` is each cell's: a cell that runs past it has its process group killed and is
    a `timeout`, one whose process dies an `error`; the cells after it run on in a fresh process. A cell's `wall_s`
    counts from the end of the one before (the first: from the process start, imports included), its `cpu_s` is the
    child's own and its runtimes' over the same span."""
    workdir = Path(workdir)
    cells = list(cells)
    (workdir / "results").mkdir(parents=True, exist_ok=True)
    for cell in cells:
        result_path(workdir, cell).unlink(missing_ok=True)
    log_file = result_path(workdir, cells[0], "log")
    command = [sys.executable, "-m", "hfexport.testing.matrix", *(cell.id for cell in cells),
               "--workdir", str(workdir), "--results", str(workdir / "results")]
    command += ["--threads", str(threads)] if threads else []
    command += [flag for flag, wanted in (("--no-verify", not verify), ("--no-latency", not latency),
                                          ("--fast", fast), ("--rebuild", rebuild)) if wanted]
    results: list[CellResult] = []
    with log_file.open("w", encoding="utf-8") as log:
        process = subprocess.Popen(command, stdout=log, stderr=subprocess.STDOUT, env=cell_environment(threads),
                                   start_new_session=True)
        started = time.perf_counter()
        for cell in cells:
            code, cpu = _wait(process, timeout, result_path(workdir, cell))
            wall = round(time.perf_counter() - started, 2)
            started = time.perf_counter()
            if result_path(workdir, cell).is_file():
                result = CellResult.from_dict(json.loads(result_path(workdir, cell).read_text(encoding="utf-8")))
                result.timings["wall_s"] = wall
                results.append(result)
                continue
            if code is None:
                results.append(CellResult(*_key(cell), "timeout", f"timeout after {timeout:g} s", None,
                                          {"wall_s": wall}))
            else:
                results.append(CellResult(*_key(cell), "error", one_line(
                    f"the cell's process died (exit {code}): {_last_line(log_file)}"), "process",
                    {"wall_s": wall, "cpu_s": round(cpu, 2)}))
            rest = cells[len(results):]
            return results + (run_cells_subprocess(rest, workdir, timeout, threads, verify, latency, fast, rebuild)
                              if rest else [])
        _wait(process, timeout, None)
    return results


def _wait(process: subprocess.Popen, timeout: float, result_file: Path | None) -> tuple[int | None, float]:
    """Wait until `result_file` appears or the child exits: `(its exit code, None while it runs; the CPU seconds of
    the exited child)`. At `timeout` with neither, kill its process group: `(None, 0)`."""
    deadline = time.monotonic() + timeout
    while True:
        if process.returncode is None:
            pid, status, usage = os.wait4(process.pid, os.WNOHANG)
            if pid:
                process.returncode = os.waitstatus_to_exitcode(status)
                process.cpu_s = usage.ru_utime + usage.ru_stime
        if process.returncode is not None or (result_file is not None and result_file.is_file()):
            return process.returncode, getattr(process, "cpu_s", 0.0)
        if time.monotonic() >= deadline:
            try:
                os.killpg(process.pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
            process.wait()
            return None, 0.0
        time.sleep(0.1)


def _last_line(log_file: Path) -> str:
    lines = [line for line in log_file.read_text(encoding="utf-8", errors="replace").splitlines() if line.strip()]
    return lines[-1] if lines else "no output"


def run_matrix(cells: Sequence[Cell], workdir: str | Path, jobs: int = 1, timeout: float = DEFAULT_TIMEOUT_S,
               threads: int | None = None, verify: bool = True,
               on_result: Callable[[CellResult], None] | None = None, per_process: int = 1, fast: bool = False,
               latency: bool = True) -> list[CellResult]:
    """Run `cells` in subprocesses, `jobs` at a time; results in the order of `cells`. `per_process` 1: each cell in
    its own process, the models built here first; more: a model's cells and the next models' until there are that
    many run in one process (`run_cells_subprocess`), which builds its models itself (no two processes share one)."""
    workdir = Path(workdir)
    if per_process <= 1:
        ensure_models(workdir, [cell.model for cell in cells], rebuild=True, fast=fast)  # before the cells race
        groups = [[cell] for cell in cells]
    else:
        groups = []
        for model in dict.fromkeys(cell.model for cell in cells):
            if not groups or len(groups[-1]) >= per_process:
                groups.append([])
            groups[-1].extend(cell for cell in cells if cell.model == model)
    results: dict[Cell, CellResult] = {}
    with ThreadPoolExecutor(max_workers=max(1, jobs)) as pool:
        futures = {pool.submit(run_cells_subprocess, group, workdir, timeout, threads, verify, latency, fast,
                               per_process > 1): group for group in groups}
        for future in as_completed(futures):
            for result in future.result():
                results[result.cell] = result
                if on_result:
                    on_result(result)
    return [results[cell] for cell in cells]


# ── Expectations ─────────────────────────────────────────────────────────────


def expectations(results: Iterable[CellResult]) -> dict[str, str]:
    """`{cell id: outcome}`, the content of the expectations file."""
    return {result.id: result.outcome for result in sorted(results, key=lambda r: r.cell)}


def compare(results: Iterable[CellResult], expected: dict[str, str]) -> tuple[list[CellResult], list[CellResult]]:
    """`(regressions, newly_passing)`: cells expected to pass that did not, and cells that pass but were not
    expected to. Other changes (one error for another) are neither: the matrix records them."""
    regressions, newly = [], []
    for result in results:
        before = expected.get(result.id)
        if before == "pass" and result.outcome != "pass":
            regressions.append(result)
        elif result.outcome == "pass" and before != "pass":
            newly.append(result)
    return regressions, newly


# ── Rendering ────────────────────────────────────────────────────────────────

ICONS = {"pass": "✅ pass", "parity-fail": "❌ parity-fail", "error": "⚠️ error", "timeout": "⏱️ timeout",
         "exported": "☑️ exported"}


def results_document(results: Sequence[CellResult], meta: dict) -> dict:
    """The JSON written next to the Markdown (`docs/compatibility.json`)."""
    counts = {outcome: sum(1 for r in results if r.outcome == outcome) for outcome in OUTCOMES}
    return {"matrix_version": 1, **meta, "counts": {k: v for k, v in counts.items() if v},
            "cells": [result.to_dict() for result in sorted(results, key=lambda r: r.cell)]}


def read_results(path: str | Path) -> tuple[list[CellResult], dict]:
    """Results and metadata from a document written by `results_document`."""
    data = json.loads(Path(path).read_text(encoding="utf-8"))
    meta = {key: value for key, value in data.items() if key not in ("cells", "counts", "matrix_version")}
    return [CellResult.from_dict(cell) for cell in data["cells"]], meta


def _seconds(value) -> str:
    return f"{value:.1f} s" if isinstance(value, (int, float)) else "—"


def render_markdown(results: Sequence[CellResult], meta: dict, runtimes: dict | None = None) -> str:
    """docs/compatibility.md: a header saying it is generated, a table per mode (models × formats), the deployment
    runtimes' tables (the cells' own verdicts, replaced by `runtimes`, docs/llm_runtimes.json, where it has the
    row), the notes."""
    by_id = {result.id: result for result in results}
    notes: dict[str, list[str]] = {}  # detail -> the cells that report it (one note per distinct message)
    regenerate = meta.get("regenerate", "python scripts/compatibility_matrix.py")
    data = meta.get("json_name", "compatibility.json")
    published_widths = meta.get("document") == PUBLISHED_DOCUMENT
    lines = [
        "# Compatibility matrix" + (": the published configs at their published widths" if published_widths else ""),
        "",
        "<!-- GENERATED FILE: do not edit by hand. -->",
        f"> Generated by `scripts/compatibility_matrix.py` from a run of every cell; regenerate with "
        f"`{regenerate}`. The same data is in [`{data}`]({data}).",
        "",
    ]
    if published_widths:
        lines += ["The config zoo's rows of [compatibility.md](compatibility.md) run there at the default suite's "
                  "narrower `fast` widths; here each checkpoint's own heads, key-value heads, head size and hidden size "
                  "(\"Published configs\" below says what is cut).", ""]
    packages = meta.get("packages") or {}
    if packages:
        lines.append("Run with " + ", ".join(f"{name} {version}" for name, version in packages.items()) + ".")
    run = []
    if meta.get("generated_at"):
        run.append(f"generated {meta['generated_at']}")
    if meta.get("wall_s") is not None:
        run.append(f"full run {meta['wall_s'] / 60:.1f} min wall")
    if meta.get("jobs"):
        run.append(f"{meta['jobs']} cell(s) at a time")
    if meta.get("timeout_s"):
        run.append(f"{meta['timeout_s']:g} s per cell at most")
    if meta.get("machine"):
        run.append(meta["machine"])
    if run:
        text = " · ".join(run)
        lines.append(text[:1].upper() + text[1:] + ".")
    lines += [
        "",
        "Each cell is one real job, `run_job(model, out, targets=[\"<format>-<mode>\"])`: export, save, reload "
        "from disk, verify against the eager model (probes across the dynamic dims; generation targets also "
        "decode greedily over the exported graphs and must match `model.generate` token for token). "
        "Outcomes: **pass**; **parity-fail** with the first failing metric; **error** with the engine's message "
        "(one line); **timeout**. The time is the export step alone (plan, save and verification excluded). "
        + ("Models are published configs with random weights (`hfexport.testing.zoo`, \"Published configs\" below); "
           "no downloads." if published_widths else
           "Models are tiny random checkpoints built by `hfexport.testing.models` and, marked *published*, published "
           "configs with random weights (`hfexport.testing.zoo`, \"Published configs\" below); no downloads."),
        "",
    ]
    models = list(dict.fromkeys(result.model for result in sorted(results, key=lambda r: r.cell)))
    ordered = [name for name in MODELS if name in models] + [name for name in models if name not in MODELS]
    formats = [fmt for fmt in FORMATS if any(r.export_format == fmt for r in results)]
    for mode in MODES:
        rows = [name for name in ordered if any(by_id.get(Cell(name, fmt, mode).id) for fmt in formats)]
        if not rows:
            continue
        lines += [f"## {mode.capitalize()}", "", "| model | " + " | ".join(formats) + " |",
                  "|---|" + "---|" * len(formats)]
        for name in rows:
            family = f" ({MODELS[name].family})" if name in MODELS else _published(name)
            cells = []
            for fmt in formats:
                result = by_id.get(Cell(name, fmt, mode).id)
                if result is None:
                    cells.append("—")
                    continue
                text = ICONS.get(result.outcome, result.outcome)
                if result.outcome in ("pass", "exported", "parity-fail"):
                    text += f" {_seconds(result.timings.get('export_s'))}"
                if result.detail:
                    notes.setdefault(result.detail, []).append(result.id)
                    number = list(notes).index(result.detail) + 1
                    text += f" [{number}](#note-{number})"
                cells.append(text)
            lines.append(f"| `{name}`{family} | " + " | ".join(cells) + " |")
        lines.append("")
    lines += _runtime_lines(results, ordered, notes, (runtimes or {}).get("rows"), runtimes)
    lines += ["## Models", "", "| model | class | task | recipe notes |", "|---|---|---|---|"]
    lines += [f"| `{name}` | `{MODELS[name].model_class}` | {MODELS[name].task} | {_escape(MODELS[name].note) or '—'} |"
              for name in ordered if name in MODELS]
    lines.append("")
    published = [name for name in ordered if name in ZOO]
    if published:
        run = meta.get("zoo_run")
        if run and run.get("fast"):
            widths = (f"the `fast` widths of the default suite's slice (`build(fast=True)`: the MLP cut to {FAST_MLP} "
                      f"wide, a MoE block to {FAST_EXPERTS} experts (twice its top-k where that is more), a decoder's "
                      f"query heads to twice its key-value heads or at most {FAST_HEADS} with the hidden size in "
                      "proportion: what two shared cores run in the time), the vocabulary cut to the zoo tokenizer's, "
                      "random weights saved in the published dtype; the key-value heads, the head size and its ratio to "
                      "hidden/heads, rope, windows and norms as published. The same zoo at its published widths: "
                      "[compatibility_published.md](compatibility_published.md).")
        else:
            widths = (f"the MLP cut to {ZOO_MLP} wide and a MoE block to {FAST_EXPERTS} experts (twice its top-k where "
                      "that is more), the vocabulary cut to the zoo tokenizer's, random weights saved in the published "
                      "dtype; the heads, key-value heads, head size, rope, windows and norms as published.")
        lines += ["## Published configs", "", "The rows marked *published* are `hfexport.testing.zoo`: a checkpoint's "
                  "own config.json (the fields as published, from the source named here), 2 layers, " + widths,
                  "", "The default test suite runs every zoo model's ONNX cell at the `fast` widths "
                  "(`tests/test_zoo.py`): export, the gate and, for generation, every ONNX deployment runtime "
                  "(onnxruntime-genai, optimum, transformers.js), a runtime refused by the config before the export "
                  "excepted; `pytest -m slow tests/test_zoo.py` runs every format."]
        if run:
            lines.append("")
            lines.append(f"These rows ran on {run['generated_at']} with `{run['command']}` ({run['cells']} cells, "
                         f"{run['jobs']} at a time, {run['wall_s'] / 60:.1f} min wall; {run['machine']}; "
                         + ", ".join(f"{name} {version}" for name, version in run["packages"].items()) + ").")
        lines += ["", "| model | checkpoint | task | where the fields were read |", "|---|---|---|---|"]
        lines += [f"| `{name}` | {ZOO[name].repo} | {ZOO[name].task} | {_escape(ZOO[name].source)} |"
                  for name in published]
        lines.append("")
    counts = {outcome: sum(1 for r in results if r.outcome == outcome) for outcome in OUTCOMES}
    lines += ["Totals: " + ", ".join(f"{count} {outcome}" for outcome, count in counts.items() if count)
              + f" of {len(results)} cells.", ""]
    if notes:
        lines += ["## Notes", ""]
        lines += [f"{index}. <a id=\"note-{index}\"></a>{', '.join(f'`{cell}`' for cell in cells)}: {_escape(detail)}"
                  for index, (detail, cells) in enumerate(notes.items(), 1)]
        lines.append("")
    if meta.get("ci"):
        lines += ["## In CI", "", meta["ci"], ""]
    return "\n".join(lines)


def committed_runtime_rows(docs) -> dict | None:
    """docs/llm_runtimes.json (the decoders) and docs/seq2seq_runtimes.json (the encoder-decoders), both written by
    scripts/llm_runtimes.py, as one document (None when neither is there): their rows replace the matrix cells' own
    runtime verdicts in the runtimes tables."""
    paths = [Path(docs) / "llm_runtimes.json", Path(docs) / "seq2seq_runtimes.json"]
    documents = [json.loads(path.read_text(encoding="utf-8")) for path in paths if path.is_file()]
    if not documents:
        return None
    return {**documents[0], "rows": [row for document in documents for row in document.get("rows", [])]}


#: The runtime tables beside the matrix's own formats (scripts/llm_runtimes.py's `onnx-q8`: an 8-bit target
#: published as transformers.js' q8 variant), and how each table is titled and described.
RUNTIME_TABLES = {
    "onnx": ("onnx", "greedy generation on the sample prompts in each runtime, token for token against "
                     "`model.generate` at f32 (docs/generation.md)"),
    "onnx-q8": ("onnx, 8-bit variant `onnx/model_quantized.onnx`", "the same target quantized (`ort_dynamic`), "
                "opened by the name it is published under (transformers.js `dtype: \"q8\"`, optimum "
                "`file_name=`, onnxruntime-genai's `genai_config` overlay), judged by hfexport's 8-bit token agreement "
                "floor (docs/quantization.md)"),
    "openvino": ("openvino", "greedy generation on the sample prompts in each runtime, token for token against "
                             "`model.generate` at an f32 precision hint (docs/generation.md)"),
}


def _runtime_lines(results: Sequence[CellResult], ordered: list[str], notes: dict[str, list[str]],
                   runtime_rows: Sequence[dict] | None = None, runtime_meta: dict | None = None) -> list[str]:
    """The deployment runtimes' verdicts on each generation cell that ran them (`hfexport.deployment`): a table per
    format, models x runtimes; a cell that did not pass says why in a note (and the cause, where traced). `runtime_rows`
    (docs/llm_runtimes.json's `rows`, scripts/llm_runtimes.py) replace the matrix cells' own verdicts for their
    (model, format), so the tables are re-rendered from committed JSON without rerunning the matrix."""
    lines: list[str] = []
    rows = {(row["model"], row["format"]): row["runtimes"] for row in runtime_rows or [] if row.get("runtimes")}
    # A target that failed its own gate before the runtimes ran (a quantized one below its parity floor): no verdicts,
    # its error instead.
    unrun = {(row["model"], row["format"]): row["error"] for row in runtime_rows or []
             if not row.get("runtimes") and row.get("error")}
    tables = list(dict.fromkeys([*FORMATS, *RUNTIME_TABLES, *(fmt for _, fmt in rows)]))
    for fmt in tables:
        cells = {r.model: r.runtimes for r in results if r.export_format == fmt and r.mode == "generation"
                 and r.runtimes}
        cells.update({model: checks for (model, table), checks in rows.items() if table == fmt})
        runtimes = list(dict.fromkeys(check["runtime"] for checks in cells.values() for check in checks))
        for (model, table), error in unrun.items():
            if table == fmt and model not in cells:
                cells[model] = [{"runtime": runtime, "verdict": "not_run", "reason": f"not run: the target failed "
                                 f"hfexport's own gate first ({error})"} for runtime in runtimes]
        if not runtimes:
            continue
        title, what = RUNTIME_TABLES.get(fmt, (fmt, "greedy generation on the sample prompts in each runtime"))
        source = ""
        from_rows = [model for model, table in [*rows, *unrun] if table == fmt]
        if from_rows:
            which = "Rows" if set(from_rows) == set(cells) else "The rows of " + ", ".join(
                f"`{model}`" for model in from_rows) + " (the others: the matrix run's cells)"
            source = (f" {which} from [`llm_runtimes.json`](llm_runtimes.json) and"
                      " [`seq2seq_runtimes.json`](seq2seq_runtimes.json) (`scripts/llm_runtimes.py`"
                      + (f", {runtime_meta['generated']}" if (runtime_meta or {}).get("generated") else "") + ").")
        lines += [f"## Generation in the deployment runtimes ({title})", "",
                  f"The gate's check on the saved files: {what}.{source}", "",
                  "| model | " + " | ".join(runtimes) + " |", "|---|" + "---|" * len(runtimes)]
        order = [*ordered, *sorted(model for model in cells if model not in ordered)]
        for name in [model for model in order if model in cells]:
            row = []
            by_runtime = {check["runtime"]: check for check in cells[name]}
            for runtime in runtimes:
                check = by_runtime.get(runtime)
                if check is None:
                    row.append("—")
                    continue
                verdict = check["verdict"]
                text = {"passed": "✅ pass", "failed": "❌ fail", "not_run": "➖ not run"}.get(verdict, "➖ not checked")
                for detail in (check.get("reason") if verdict != "passed" else None, check.get("cause")):
                    if not detail:
                        continue
                    detail = one_line(detail if verdict == "not_run" else f"{runtime}: {detail}", 1200)
                    cells_noted = notes.setdefault(detail, [])
                    if f"{name}/{fmt}/generation" not in cells_noted:  # the main table's note may say the same
                        cells_noted.append(f"{name}/{fmt}/generation")
                    number = list(notes).index(detail) + 1
                    text += f" [{number}](#note-{number})"
                row.append(text)
            family = f" ({MODELS[name].family})" if name in MODELS else _published(name)
            lines.append(f"| `{name}`{family} | " + " | ".join(row) + " |")
        lines.append("")
    return lines


def _published(name: str) -> str:
    """A zoo row's label: the checkpoint whose published config it is."""
    return f" (*published*: {ZOO[name].repo})" if name in ZOO else ""


def _escape(text: str) -> str:
    return text.replace("|", "\\|").replace("<", "&lt;").replace(">", "&gt;")


# ── Command line (one cell, in a subprocess) ─────────────────────────────────


def _cpu_seconds() -> float:
    """CPU seconds of this process, of its children that have exited (the runtimes' clients) and of the warm
    runtime servers still running (`hfexport.deployment.warm`)."""
    import resource

    from hfexport.deployment.warm import cpu_seconds

    return cpu_seconds() + sum(usage.ru_utime + usage.ru_stime for usage in (
        resource.getrusage(resource.RUSAGE_SELF), resource.getrusage(resource.RUSAGE_CHILDREN)))


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m hfexport.testing.matrix",
                                     description="Run matrix cells, one after another.")
    parser.add_argument("cells", nargs="+", type=Cell.parse, metavar="MODEL/FORMAT/MODE")
    parser.add_argument("--workdir", required=True, type=Path)
    parser.add_argument("--results", required=True, type=Path, help="the folder each cell's result JSON goes to")
    parser.add_argument("--threads", type=int, help="torch intra-op threads")
    parser.add_argument("--no-verify", action="store_true", help="export and save only")
    parser.add_argument("--no-latency", action="store_true", help="do not measure the artifact's latency")
    parser.add_argument("--fast", action="store_true", help="zoo models narrowed as the default suite's slice")
    parser.add_argument("--rebuild", action="store_true", help="build each model afresh before its first cell")
    args = parser.parse_args(argv)
    for cell in args.cells:
        if cell.model not in MODELS and cell.model not in ZOO:
            parser.error(f"unknown model {cell.model!r}")
    if args.threads:
        import torch

        torch.set_num_threads(args.threads)
    from hfexport.deployment.warm import warm_clients

    cpu, built = 0.0, set()
    with warm_clients():  # the process's cells share each Python runtime's start (its imports)
        for cell in args.cells:
            if args.rebuild and cell.model not in built:
                ensure_models(args.workdir, [cell.model], rebuild=True, fast=args.fast)
                built.add(cell.model)
            result = run_cell(cell, args.workdir, verify=not args.no_verify, latency=not args.no_latency,
                              fast=args.fast)
            spent, cpu = _cpu_seconds() - cpu, _cpu_seconds()
            result.timings["cpu_s"] = round(spent, 2)
            target = args.results / f"{cell.model}.{cell.export_format}.{cell.mode}.json"
            target.parent.mkdir(parents=True, exist_ok=True)
            temporary = target.with_suffix(".tmp")
            temporary.write_text(json.dumps(result.to_dict(), indent=2) + "\n", encoding="utf-8")
            os.replace(temporary, target)
            print(f"{result.id}: {result.outcome}" + (f": {result.detail}" if result.detail else ""), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
