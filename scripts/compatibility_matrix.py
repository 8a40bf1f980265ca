"""Run the compatibility matrix and write docs/compatibility.md (generated) and docs/compatibility.json.

Every cell (tiny model × format × mode, `hfexport.testing.models`) runs in its own subprocess with a timeout,
`--jobs` at a time, through the same runner as tests/test_matrix.py (`hfexport.testing.matrix`).

    python scripts/compatibility_matrix.py                      # the whole matrix, then docs/ is rewritten
    python scripts/compatibility_matrix.py --models tiny-gpt2   # some cells: merged into the existing results
    python scripts/compatibility_matrix.py --zoo --fast         # the published configs (hfexport.testing.zoo) at the
                                                                # default suite's widths, merged into docs/compatibility.*
    python scripts/compatibility_matrix.py --zoo                # ... at their published widths: a document of their own,
                                                                # docs/compatibility_published.{md,json}
    python scripts/compatibility_matrix.py --update-expected    # also rewrite tests/data/compatibility_expected.json
    python scripts/compatibility_matrix.py --zoo --fast --collect DIR   # the cells a stopped run finished, merged
    python scripts/compatibility_matrix.py --render-only        # docs/compatibility.md from docs/compatibility.json
                                                                # and docs/llm_runtimes.json (scripts/llm_runtimes.py)

Exit status: 0 when no cell regressed against the expectations file, 1 otherwise.
"""

from __future__ import annotations

import argparse
import datetime as dt
import json
import os
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "library"))

from hfexport.testing.matrix import (  # noqa: E402
    committed_runtime_rows,
    DEFAULT_TIMEOUT_S,
    FORMATS,
    MODELS,
    MODES,
    PUBLISHED_DOCUMENT,
    ZOO,
    CellResult,
    all_cells,
    compare,
    expectations,
    read_results,
    render_markdown,
    results_document,
    run_matrix,
)

DOCS_JSON = ROOT / "docs" / "compatibility.json"
DOCS_MD = ROOT / "docs" / "compatibility.md"
PUBLISHED_JSON = ROOT / "docs" / "compatibility_published.json"  # the zoo at published widths: never mixed with
PUBLISHED_MD = ROOT / "docs" / "compatibility_published.md"      # the `--fast` rows, which have the same cell ids
EXPECTED = ROOT / "tests" / "data" / "compatibility_expected.json"
REGENERATE = "python scripts/compatibility_matrix.py --jobs 2 --timeout 480 --fresh --update-expected"
REGENERATE_PUBLISHED = "python scripts/compatibility_matrix.py --zoo --jobs 2 --timeout 1500 --no-latency --fresh"
CI_NOTE = (
    "The whole matrix took {cpu_min:.0f} CPU-minutes ({wall_min:.0f} min wall on a shared machine with {machine}, {jobs} "
    "cells at a time); ExecuTorch cells are {executorch_share:.0%} of the CPU time. That does not fit the CI budget "
    "next to the rest of the suite, so per pull request CI runs a subset: (1) the default test run, whose fast "
    "subset checks the bundled `examples/tiny-bert` (forward) and `examples/tiny-llama` (generation on ONNX, "
    "OpenVINO and ExecuTorch, forward on torch.export) on every format from the session's exported fixtures; "
    "(2) every cell except ExecuTorch's ({subset_cpu_min:.0f} CPU-minutes), in parallel: `python "
    "scripts/compatibility_matrix.py --formats dynamo onnx openvino --jobs 4 --timeout 480 --json "
    "$RUNNER_TEMP/matrix.json --markdown $RUNNER_TEMP/matrix.md`, which exits 1 when a cell recorded as pass in "
    "`tests/data/compatibility_expected.json` no longer passes, and prints the cells that newly pass. The whole "
    "matrix runs nightly and when the engine pin changes (the same command without `--formats`), or serially with "
    "`pytest -m slow tests/test_matrix.py` (`-k \"not executorch\"` for the per-PR subset)."
)


def ci_note(results, meta: dict) -> str:
    """The CI paragraph of the docs, with the figures of the run (`meta`: wall_s, jobs, machine)."""
    cpu = sum(result.timings.get("cpu_s", 0.0) for result in results)
    executorch = sum(result.timings.get("cpu_s", 0.0) for result in results if result.export_format == "executorch")
    return CI_NOTE.format(cpu_min=cpu / 60, wall_min=(meta.get("wall_s") or 0) / 60, jobs=meta.get("jobs", 1),
                          machine=str(meta.get("machine", "? CPU cores")).replace(" (shared)", ""),
                          executorch_share=executorch / cpu if cpu else 0, subset_cpu_min=(cpu - executorch) / 60)


def write_text_atomic(path: Path, text: str) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    handle, temporary = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
    with os.fdopen(handle, "w", encoding="utf-8") as stream:
        stream.write(text)
    os.chmod(temporary, 0o644)
    os.replace(temporary, path)


def package_versions() -> dict:
    from hfexport.report.data import package_versions as versions

    wanted = ("transformers", "torch", "onnx", "onnxruntime", "onnxscript", "openvino", "executorch")
    found = versions()
    return {name: found[name] for name in wanted if name in found}


def runtime_rows() -> dict | None:
    """The committed runtime rows (`hfexport.testing.matrix.committed_runtime_rows`)."""
    return committed_runtime_rows(ROOT / "docs")


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--models", nargs="*", choices=[*MODELS, *ZOO], help="default: all tiny models")
    parser.add_argument("--zoo", action="store_true", help="the published configs' rows (hfexport.testing.zoo) "
                        "instead of the tiny models' (with --models: those of them)")
    parser.add_argument("--formats", nargs="*", choices=list(FORMATS), help="default: all")
    parser.add_argument("--modes", nargs="*", choices=list(MODES), help="default: all")
    parser.add_argument("--jobs", type=int, default=1, help="cells run at the same time (default 1)")
    parser.add_argument("--timeout", type=float, default=DEFAULT_TIMEOUT_S, help="seconds per cell")
    parser.add_argument("--threads", type=int, help="torch threads per cell (default: torch's)")
    parser.add_argument("--fast", action="store_true", help="the zoo models narrowed as the default suite's slice "
                        "(hfexport.testing.zoo.build(fast=True): query heads and hidden size in proportion, MLP 256)")
    parser.add_argument("--no-latency", action="store_true", help="do not measure each artifact's latency (the "
                        "tables show the export time only; a generation cell's latency run can be a third of it)")
    parser.add_argument("--per-process", type=int, default=1, help="cells run one after another in one process "
                        "(a model's cells stay together; default 1: each cell in its own)")
    parser.add_argument("--workdir", type=Path, help="models and artifacts (default: a temporary folder)")
    parser.add_argument("--json", type=Path, help="default: docs/compatibility.json; with --zoo and without --fast, "
                        "docs/compatibility_published.json")
    parser.add_argument("--markdown", type=Path, help="default: beside --json's default, .md")
    parser.add_argument("--expected", type=Path, default=EXPECTED)
    parser.add_argument("--update-expected", action="store_true", help="rewrite the expectations file")
    parser.add_argument("--fresh", action="store_true", help="replace the results instead of merging into them")
    parser.add_argument("--render-only", action="store_true", help="only re-render the Markdown from the JSON")
    parser.add_argument("--collect", type=Path, metavar="WORKDIR", help="instead of running cells, merge the results "
                        "a run stopped part way left in WORKDIR/results (the cells that finished)")
    args = parser.parse_args(argv)
    published = args.zoo and not args.fast
    args.json = args.json or (PUBLISHED_JSON if published else DOCS_JSON)
    args.markdown = args.markdown or (PUBLISHED_MD if published else DOCS_MD)

    if args.render_only:  # the run's data as it is; the prose (CI paragraph, command) as this script says now
        results, meta = read_results(args.json)
        if meta.get("document") == PUBLISHED_DOCUMENT:
            meta.update(regenerate=REGENERATE_PUBLISHED, json_name=args.json.name)
        else:
            meta.update(regenerate=REGENERATE, ci=ci_note(results, meta))
        write_text_atomic(args.json, json.dumps(results_document(results, meta), indent=2, ensure_ascii=False) + "\n")
        write_text_atomic(args.markdown, render_markdown(results, meta, None if meta.get("document") else runtime_rows()))
        print(f"wrote {args.json} and {args.markdown}")
        return 0

    models = args.models or (list(ZOO) if args.zoo else None)
    cells = all_cells(models, args.formats, args.modes)
    whole = len(cells) == len(all_cells(list(ZOO) if published else None))
    workdir = args.workdir or Path(tempfile.mkdtemp(prefix="hfexport-matrix-"))
    print(f"{len(cells)} cells, {args.jobs} at a time, {args.timeout:g} s each at most; work in {workdir}",
          flush=True)
    started = time.perf_counter()
    done = []

    def report(result: CellResult) -> None:
        done.append(result)
        seconds = result.timings.get("wall_s")
        line = f"[{len(done)}/{len(cells)}] {result.id}: {result.outcome}"
        line += f" ({seconds:.0f} s)" if seconds is not None else ""
        line += f": {result.detail}" if result.detail else ""
        print(line[:300], flush=True)

    if args.collect:
        results = [CellResult.from_dict(json.loads(path.read_text(encoding="utf-8")))
                   for path in sorted((args.collect / "results").glob("*.json"))]
        results = [result for result in results if result.cell in set(cells)]
        cells = [result.cell for result in results]
        wall = sum(result.timings.get("wall_s", 0.0) for result in results) / max(1, args.jobs)
        print(f"collected {len(results)} finished cells from {args.collect}")
    else:
        results = run_matrix(cells, workdir, jobs=args.jobs, timeout=args.timeout, threads=args.threads,
                             on_result=report, per_process=args.per_process, fast=args.fast,
                             latency=not args.no_latency)
        wall = time.perf_counter() - started

    previous, previous_meta = read_results(args.json) if args.json.is_file() and not args.fresh else ([], {})
    merged = {result.id: result for result in previous}
    merged.update({result.id: result for result in results})
    from hfexport.machine import summary_line

    machine = f"{os.cpu_count()} CPU cores (shared), {summary_line()}"
    meta = {
        "generated_at": dt.datetime.now(dt.UTC).isoformat(timespec="seconds"),
        "regenerate": REGENERATE,
        "packages": package_versions(),
        "wall_s": round(wall, 1) if whole else previous_meta.get("wall_s"),
        "jobs": args.jobs if whole else previous_meta.get("jobs", args.jobs),
        "timeout_s": args.timeout,
        "machine": machine if whole else previous_meta.get("machine", machine),
    }
    zoo_cells = [cell for cell in cells if cell.model in ZOO]
    if zoo_cells and len(zoo_cells) == len(cells) and previous_meta and not published:  # the tiny rows' run stays as it was described
        meta.update({key: previous_meta[key] for key in ("generated_at", "timeout_s", "packages")
                     if key in previous_meta})
    if zoo_cells:  # the published configs' rows: when, where and how they ran
        meta["zoo_run"] = {"generated_at": dt.datetime.now(dt.UTC).isoformat(timespec="seconds"), "machine": machine,
                           "packages": package_versions(), "timeout_s": args.timeout,
                           "cells": len(zoo_cells), "wall_s": round(wall, 1), "jobs": args.jobs, "fast": args.fast,
                           "command": "python scripts/compatibility_matrix.py " + " ".join(argv or sys.argv[1:])}
        earlier = previous_meta.get("zoo_run")
        if earlier and bool(earlier.get("fast")) == args.fast:  # the rows of earlier zoo runs of the same widths stay
            meta["zoo_run"].update(
                cells=sum(1 for result in merged.values() if result.model in ZOO),
                wall_s=round(earlier["wall_s"] + wall, 1), command=f"{earlier['command']}; {meta['zoo_run']['command']}")
    elif previous_meta.get("zoo_run"):
        meta["zoo_run"] = previous_meta["zoo_run"]
    ordered = sorted(merged.values(), key=lambda r: r.cell)
    if published:  # its own document: the run's command, no CI paragraph (CI runs the --fast rows)
        meta.update(document=PUBLISHED_DOCUMENT, regenerate=REGENERATE_PUBLISHED, json_name=args.json.name)
    else:
        meta["ci"] = ci_note(ordered, meta)
    write_text_atomic(args.json, json.dumps(results_document(ordered, meta), indent=2, ensure_ascii=False) + "\n")
    write_text_atomic(args.markdown, render_markdown(ordered, meta, None if published else runtime_rows()))
    print(f"{len(results)} cells in {wall / 60:.1f} min; wrote {args.json} and {args.markdown}")

    document = json.loads(args.expected.read_text(encoding="utf-8")) if args.expected.is_file() else {}
    expected = document.get("cells", {})
    regressions, newly = compare(results, expected)
    for result in newly:
        print(f"newly passing: {result.id} (expected {expected.get(result.id, 'nothing')})")
    for result in regressions:
        print(f"REGRESSION: {result.id} was pass, now {result.outcome}: {result.detail}")
    if args.update_expected:
        cells_expected = {**expected, **expectations(results)}
        document = {
            **document,
            "about": "Outcome per matrix cell from the last full run of scripts/compatibility_matrix.py: a cell "
                     "recorded as pass must keep passing (tests/test_matrix.py). `fast_subset`: the bundled "
                     "examples checked by the default test run (HFEXPORT_UPDATE_EXPECTED=1 pytest "
                     "tests/test_matrix.py -k fast_subset rewrites it). Regenerate `cells` with: " + REGENERATE,
            "cells": dict(sorted(cells_expected.items())),
        }
        write_text_atomic(args.expected, json.dumps(document, indent=2) + "\n")
        print(f"wrote {args.expected}")
    return 1 if regressions else 0


if __name__ == "__main__":
    sys.exit(main())
