"""The report's latency figures against a plain `timeit` of the same calls, and against the measurement they replace
(issue 30: eager batch 1 read slower than batch 8).

tiny-bert's ONNX target and tiny-llama's ONNX generation target are exported once (verification off); then, ROUNDS
times, alternated in this one process so that load weighs on all alike, for batch 1 and 8 on the report's inputs:
- `report`: `hfexport.latency.measure_latency` (warm-up, alternated timing, median and 25th-75th percentiles);
- `before`: the measurement it replaces (one warm-up call each, the median of 5 alternated calls);
- `timeit`: `timeit.Timer(call).repeat(5, number)` per side, each call's best and median (`timeit`'s autorange
  picks `number`).
Each round records the load average. The eager "batch 1 > batch 8" inversion is counted per method.

Run: `.venv/bin/python benchmarks/latency_vs_timeit.py` -> benchmarks/results/latency_vs_timeit.json
"""

from __future__ import annotations

import copy
import json
import os
import statistics
import sys
import tempfile
import time
import timeit
from pathlib import Path

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent
ROUNDS = int(os.environ.get("ROUNDS", "3"))
CASES = (("tiny-bert", "onnx"), ("tiny-llama", "onnx-generation"))


def _old_measurement(artifact, eager, runs=5):
    """The replaced measurement: one warm-up call each, then `runs` alternated calls, medians in ms."""
    def once(call):
        started = time.perf_counter()
        call()
        return (time.perf_counter() - started) * 1000

    artifact(), eager()
    a, e = [], []
    for _ in range(runs):
        a.append(once(artifact))
        e.append(once(eager))
    return round(statistics.median(a), 3), round(statistics.median(e), 3)


def _timeit(call) -> dict:
    timer = timeit.Timer(call)
    number, _ = timer.autorange()
    per_call = [seconds / number * 1000 for seconds in timer.repeat(repeat=5, number=number)]
    return {"best_ms": round(min(per_call), 3), "median_ms": round(statistics.median(per_call), 3), "number": number}


def main() -> dict:
    import torch
    from _process import machine_and_versions
    from hfexport.exported import ExportedModel
    from hfexport.job.run import run_job
    from hfexport.latency import _generation_calls, batch_sizes, measure_latency
    from hfexport.models import load_model
    from hfexport.plan import build_plan
    from hfexport.recipe.loading import load_recipe
    from hfexport.verify.probes import AxisRef, resize_inputs

    scratch = Path(tempfile.mkdtemp(prefix="latency-vs-timeit-"))
    cases = []
    for example, target in CASES:
        folder = ROOT / "examples" / example
        report = run_job(folder, scratch / example, targets=[target], verify=False)
        assert report.targets[target].status == "ok", report.targets[target].error
        recipe = load_recipe(folder)
        model = load_model(folder, recipe).eval()
        plan = build_plan(recipe, target, model, source=str(folder))
        exported = ExportedModel.from_pretrained(scratch / example / target)
        if plan.target.mode == "generation":
            artifact_call, eager_call, _ = _generation_calls(exported, model, plan)
        else:
            artifact_call, eager_call = (lambda i, e=exported: e(**i)), (lambda i, m=model: m(**i))
        sizes, refs = batch_sizes(plan)
        refs = [AxisRef(ref.input, ref.axis, "batch", ref.scale, ref.offset) for ref in refs]
        inputs = {batch: resize_inputs(plan.inputs, refs, {"batch": batch}) for batch in sizes}
        cases.append((example, target, model, plan, artifact_call, eager_call, inputs))

    rounds = []
    with torch.inference_mode():
        for index in range(ROUNDS):
            for example, target, model, plan, artifact_call, eager_call, inputs in cases:
                row = {"round": index, "case": f"{example}/{target}", "load_avg_1m": round(os.getloadavg()[0], 2)}
                report = measure_latency(scratch / example / target, model, plan)
                row["report"] = {point["batch"]: {key: point[key] for key in (
                    "artifact_ms", "artifact_spread", "eager_ms", "eager_spread", "runs", "verdict")}
                    for point in report["points"]}
                row["before"], row["timeit"] = {}, {}
                for batch, batch_inputs in inputs.items():
                    eager_inputs = copy.deepcopy(batch_inputs)
                    artifact_ms, eager_ms = _old_measurement(lambda: artifact_call(batch_inputs),
                                                             lambda: eager_call(eager_inputs))
                    row["before"][batch] = {"artifact_ms": artifact_ms, "eager_ms": eager_ms}
                    row["timeit"][batch] = {"artifact": _timeit(lambda: artifact_call(batch_inputs)),
                                            "eager": _timeit(lambda: eager_call(eager_inputs))}
                rounds.append(row)
                print(json.dumps(row), file=sys.stderr)

    def inversions(method, read):
        return sum(1 for row in rounds if read(row[method][1]) > read(row[method][8]))

    summary = {
        "eager batch 1 slower than batch 8 (rounds of all cases)": {
            "report": inversions("report", lambda point: point["eager_ms"]),
            "before": inversions("before", lambda point: point["eager_ms"]),
            "timeit best": inversions("timeit", lambda point: point["eager"]["best_ms"]),
            "timeit median": inversions("timeit", lambda point: point["eager"]["median_ms"]),
            "of": len(rounds)},
        "report eager median / timeit eager best (median over rounds)": {
            f"batch {batch}": round(statistics.median(row["report"][batch]["eager_ms"]
                                                      / row["timeit"][batch]["eager"]["best_ms"] for row in rounds), 3)
            for batch in (1, 8)},
        "before eager / timeit eager best (median over rounds)": {
            f"batch {batch}": round(statistics.median(row["before"][batch]["eager_ms"]
                                                      / row["timeit"][batch]["eager"]["best_ms"] for row in rounds), 3)
            for batch in (1, 8)},
    }
    return {**machine_and_versions(), "threads": torch.get_num_threads(), "rounds": rounds, "summary": summary}


if __name__ == "__main__":
    result = main()
    out = HERE / "results" / "latency_vs_timeit.json"
    out.write_text(json.dumps(result, indent=1) + "\n")
    print(json.dumps(result["summary"], indent=1))
