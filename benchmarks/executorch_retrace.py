"""Issue 16 benchmark: ExecuTorch export with and without hfexport's cost fixes of the lowering.

`hfexport.formats.executorch.workarounds` skips (1) the closing retrace of an XNNPACK preprocess pass that left its partition's
graph as it found it, (2) `to_edge`'s second decomposition pass when no op of its table is left in the program but
size queries, and (3) XNNPACK's two pattern passes (upsampling, attention) on partitions without their anchor op. For each case below, one ExecuTorch target is exported (`run_job`, verification off: the export
alone) in fresh processes, alternately as released (the cost fixes replaced by no-ops; the correctness fix stays)
and fixed, ROUNDS times; the `.pte` files of the two sides are compared byte for byte, and the fixed side's counts
(retraces and decompositions skipped / run) are recorded.

Cases: the bundled tiny Llama (`examples/tiny-llama`, pte-generation: prefill + decode, ~29 XNNPACK partitions
each) and tiny matrix models (`hfexport.testing.models`) that exercise other XNNPACK passes, forward: Whisper
(conv1d, which `Conv1dUnsqueezePass` rewrites, so that retrace must run), ViT (conv2d, channels-last) and BERT.

Run: `.venv/bin/python benchmarks/executorch_retrace.py` -> benchmarks/results/executorch_retrace.json
(`ROUNDS=`, `CASES=tiny-llama,tiny-whisper:generation,...`).
"""

from __future__ import annotations

import hashlib
import json
import os
import platform
import statistics
import sys
import tempfile
from pathlib import Path

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent
sys.path.insert(0, str(ROOT / "library"))

from _process import run_measured  # noqa: E402

ROUNDS = int(os.environ.get("ROUNDS", "2"))
CASES = os.environ.get("CASES", "tiny-llama,tiny-whisper:forward,tiny-vit:forward,tiny-bert:forward").split(",")

CHILD = """
import contextlib, json, sys
from pathlib import Path
sys.path.insert(0, {library!r})
import hfexport.formats.executorch.workarounds as fixes
from hfexport.job.run import run_job
counts = {{}}
if {released!r}:
    fixes._unchanged_retraces_skipped = lambda counts: contextlib.nullcontext()
    fixes._needless_second_decompositions_skipped = lambda counts: contextlib.nullcontext()
    fixes._patternless_passes_skipped = lambda counts: contextlib.nullcontext()
else:
    original = fixes.executorch_fixes
    @contextlib.contextmanager
    def counted():
        with original() as found:
            yield found
        for key, value in vars(found).items():
            counts[key] = counts.get(key, 0) + value
    fixes.executorch_fixes = counted
    import hfexport.export
    hfexport.export.executorch_fixes = counted
report = run_job({folder!r}, {output!r}, targets=[{target!r}], verify=False, force=True)
target = report.targets[{target!r}]
Path({result!r}).write_text(json.dumps({{"status": target.status, "error": target.error,
                                        "export_s": target.timings.get("export_s"), "counts": counts}}))
"""


def _case(name: str, workdir: Path) -> tuple[Path, str]:
    """The model folder and ExecuTorch target of a case: `tiny-llama` (the example) or `<matrix model>:<mode>`."""
    if name == "tiny-llama":
        return ROOT / "examples" / "tiny-llama", "pte-generation"
    from hfexport.testing.matrix import ensure_models
    from hfexport.testing.models import target_name

    model, mode = name.split(":")
    return ensure_models(workdir, [model])[model], target_name("executorch", mode)


def _digests(folder: Path) -> dict[str, str]:
    return {path.name: hashlib.sha256(path.read_bytes()).hexdigest() for path in sorted(folder.glob("*.pte"))}


def run(name: str, folder: Path, target: str, released: bool, workdir: Path, round_: int) -> dict:
    side = "released" if released else "fixed"
    output = workdir / f"out-{name.replace(':', '-')}-{side}-{round_}"
    result = workdir / f"result-{name.replace(':', '-')}-{side}-{round_}.json"
    script = CHILD.format(library=str(ROOT / "library"), released=released, folder=str(folder),
                          output=str(output), target=target, result=str(result))
    figures = run_measured([sys.executable, "-c", script], workdir / "stdout.log", workdir / "stderr.log")
    if figures["returncode"] != 0 or not result.is_file():
        raise SystemExit(f"{name} ({side}) failed: {(workdir / 'stderr.log').read_text()[-3000:]}")
    outcome = json.loads(result.read_text())
    if outcome["status"] != "ok":
        raise SystemExit(f"{name} ({side}): {outcome['error']}")
    return {**figures, **outcome, "pte_sha256": _digests(output / target)}


def main() -> None:
    from importlib.metadata import version

    import torch
    import transformers

    from hfexport.machine import cpu_info

    results = {}
    with tempfile.TemporaryDirectory(prefix="hfexport-et-retrace-") as tmp:
        workdir = Path(tmp)
        for name in CASES:
            folder, target = _case(name, workdir)
            runs = {"released": [], "fixed": []}
            for round_ in range(ROUNDS):
                for released in ((True, False) if round_ % 2 == 0 else (False, True)):
                    side = "released" if released else "fixed"
                    runs[side].append(run(name, folder, target, released, workdir, round_))
                    print(name, side, runs[side][-1]["cpu_s"], "CPU s", flush=True)
            digests = {side: {json.dumps(r["pte_sha256"], sort_keys=True) for r in rows} for side, rows in runs.items()}
            medians = {side: {key: round(statistics.median(r[key] for r in rows), 2)
                              for key in ("wall_s", "cpu_s", "export_s")} for side, rows in runs.items()}
            results[name] = {
                "target": target,
                "medians": medians,
                "ratio_cpu_fixed_vs_released": round(medians["fixed"]["cpu_s"] / medians["released"]["cpu_s"], 3),
                "ratio_export_fixed_vs_released": round(
                    medians["fixed"]["export_s"] / medians["released"]["export_s"], 3),
                "pte_identical": len(digests["released"] | digests["fixed"]) == 1,
                "retraces_fixed_side": runs["fixed"][0]["counts"],
                "runs": runs,
            }
    document = {
        "benchmark": "ExecuTorch export (run_job, verify off) with hfexport's cost fixes (no-op XNNPACK "
                     "retraces, needless second decomposition, patternless pattern passes) vs without, "
                     "fresh processes alternated",
        "machine": {"cpu": cpu_info(), "cores": os.cpu_count(), "platform": platform.platform(),
                    "python": platform.python_version()},
        "versions": {"torch": torch.__version__, "executorch": version("executorch"),
                     "transformers": transformers.__version__},
        "rounds": ROUNDS,
        "cases": results,
    }
    path = HERE / "results" / "executorch_retrace.json"
    path.write_text(json.dumps(document, indent=2) + "\n")
    for name, case in results.items():
        print(name, case["medians"], "cpu ratio", case["ratio_cpu_fixed_vs_released"], "identical",
              case["pte_identical"], case["retraces_fixed_side"])


if __name__ == "__main__":
    main()
