"""Latency of a saved target on the verifying machine, next to eager torch: which format is fastest here.

Batches, generation targets, how both sides are timed and why (`time_alternately`), and when a measurement is
"unreliable" (`soundness`): docs/parity.md, "How latency is measured".
"""

from __future__ import annotations

import copy
import os
import statistics
import time
from pathlib import Path

from hfexport.machine import cpu_info
from hfexport.verify.probes import (
    AxisRef,
    probe_axes,
    probe_tensors,
    resize_inputs,
    shapes_of,
)

DEFAULT_RUNS = 7  # the fewest timed calls per side and batch size
MAX_RUNS = 100
BUDGET_S = 1.0  # timing goes on past DEFAULT_RUNS until both sides together ran this long
WARMUP_CALLS = 3  # untimed calls per side and batch size, first calls of a shape pay allocations and set-up
WARMUP_S = 0.2  # ... and at least this long, whichever is more
# BUDGET_S, WARMUP_S, DEFAULT_RUNS and WARMUP_CALLS can be set per process (HFEXPORT_LATENCY_BUDGET_S,
# HFEXPORT_LATENCY_WARMUP_S, HFEXPORT_LATENCY_RUNS, HFEXPORT_LATENCY_WARMUP_CALLS): the test suite shortens them,
# since its jobs' figures describe nothing.


def _seconds_setting(name: str, default: float) -> float:
    try:
        return max(0.0, float(os.environ.get(name, default)))
    except ValueError:
        return default


def _count_setting(name: str, default: int, least: int) -> int:
    try:
        return max(least, int(os.environ.get(name, default)))
    except ValueError:
        return default


GENERATION_TOKENS = 8
AUTO_MAX_BATCH = 8  # the batch verification probes when torch.export decides the axes


def batch_sizes(plan) -> tuple[list[int], list]:
    """(the batch sizes to measure, the axis refs that follow the batch) for a forward plan."""
    refs, auto = probe_axes(plan)
    batch_refs = [ref for ref in refs if ref.dim == "batch" or (auto and ref.axis == 0)]
    tensors = probe_tensors(plan.inputs)
    sample = next((tensor.shape[0] for tensor in tensors.values() if tensor.dim() > 0), 1)
    if not batch_refs:
        return [sample], []
    declared = plan.recipe.dims.get("batch", {}).get("max") if not auto else AUTO_MAX_BATCH
    largest = int(declared or sample)
    return sorted({1, largest}), batch_refs


def _time_ms(call) -> float:
    started = time.perf_counter()
    call()
    return (time.perf_counter() - started) * 1000


def _warm_up(call) -> None:
    """`call` run untimed `WARMUP_CALLS` times and for at least `WARMUP_S` seconds."""
    started, calls, warmup_s = time.perf_counter(), 0, _seconds_setting("HFEXPORT_LATENCY_WARMUP_S", WARMUP_S)
    warmup_calls = _count_setting("HFEXPORT_LATENCY_WARMUP_CALLS", WARMUP_CALLS, 0)
    while calls < warmup_calls or time.perf_counter() - started < warmup_s:
        call()
        calls += 1


def runnable_threads() -> int | None:
    """The threads of the whole machine ready to run now (this one included), or None where the system does not
    say (no /proc/loadavg)."""
    try:
        return int(Path("/proc/loadavg").read_text().split()[3].split("/")[0])
    except (OSError, IndexError, ValueError):
        return None


def time_alternately(calls: dict, runs: int = DEFAULT_RUNS, budget_s: float | None = None,
                     max_runs: int = MAX_RUNS, runnable: list[int] | None = None) -> dict[str, list[float]]:
    """Milliseconds per call of each of `calls` (name: a no-argument callable): each warmed up (`_warm_up`), then
    all timed one after the other in rounds, for at least `runs` rounds and `budget_s` seconds, at most `max_runs`.
    `runnable`: a list that gets the machine's runnable threads after every round (`runnable_threads`)."""
    if budget_s is None:
        budget_s = _seconds_setting("HFEXPORT_LATENCY_BUDGET_S", BUDGET_S)
    for call in calls.values():
        _warm_up(call)
    samples: dict[str, list[float]] = {name: [] for name in calls}
    started = time.perf_counter()
    while True:
        for name, call in calls.items():
            samples[name].append(_time_ms(call))
        if runnable is not None and (count := runnable_threads()) is not None:
            runnable.append(count)
        done = len(next(iter(samples.values())))
        if done >= max_runs or (done >= runs and time.perf_counter() - started >= budget_s):
            return samples


def summary(samples: list[float]) -> dict:
    """`{"ms": median, "spread": [25th, 75th percentile]}` of a side's samples, rounded to microseconds."""
    ordered = sorted(samples)
    if len(ordered) >= 2:
        low, _, high = statistics.quantiles(ordered, n=4, method="inclusive")
    else:
        low = high = ordered[0]
    return {"ms": round(statistics.median(ordered), 3), "spread": [round(low, 3), round(high, 3)]}


UNRELIABLE = "unreliable"


def verdict(point: dict) -> str:
    """"faster"/"slower" (the artifact against eager torch) when their spreads do not overlap, else "within spread".
    A point without spreads (a report from before they were recorded) is "unknown"; a point of an unsound
    measurement (`soundness`) is "unreliable"."""
    if point.get("verdict") == UNRELIABLE:
        return UNRELIABLE
    artifact, eager = point.get("artifact_spread"), point.get("eager_spread")
    if not artifact or not eager:
        return "unknown"
    if artifact[1] < eager[0]:
        return "faster"
    if artifact[0] > eager[1]:
        return "slower"
    return "within spread"


def soundness(points: list[dict], runnable: list[int], cores: int | None, threads: int = 1,
              load_average: float | None = None) -> str | None:
    """Why a measurement cannot support a speed claim, or None when it can.

    Busy: while timed, more threads of the machine were ready to run than it has cores (the median of the counts
    taken after each round, less the timing side's own threads beyond one, which the count includes when they
    spin), or its 1-minute load average was above its cores when the timing ended. Inconsistent: eager torch measured faster per call at a larger batch than at a smaller one, with the two
    spreads apart: the same model doing more work in less time means waits, not work, were timed."""
    if runnable and cores:
        others = statistics.median(runnable) - max(0, min(threads, cores) - 1)
        if others > cores:
            return (f"the machine was busy: {statistics.median(runnable):g} threads ready to run on {cores} cores "
                    "while timed")
    if load_average is not None and cores and load_average > cores:
        return f"the machine was busy: load average {load_average:.2f} on {cores} cores when timed"
    by_batch = sorted((point["batch"], point) for point in points if point.get("eager_spread"))
    for (small, lower), (large, higher) in zip(by_batch, by_batch[1:]):
        if large > small and higher["eager_spread"][1] < lower["eager_spread"][0]:
            return (f"eager torch measured faster at batch {large} ({higher['eager_ms']:.2f} ms) than at batch {small} "
                    f"({lower['eager_ms']:.2f} ms): more work in less time")
    return None


class EagerTimings:
    """The eager model's timings within one job, shared by its targets: the same model on the same inputs (shapes,
    mode, generation settings) is timed once, alternated with the first target that needs it, and later targets
    time only their artifact. A job's targets usually share their sample inputs, so a 4-target job times eager
    torch once per batch size instead of four times; each point says which target its eager figure came from."""

    def __init__(self):
        self._timings: dict[tuple, tuple[list[float], str]] = {}

    @staticmethod
    def key(inputs: dict, generation: bool, config=None) -> tuple:
        """Inputs equal in name, shape, dtype and bytes, the same mode and generation settings: the same timing."""
        import hashlib

        import torch

        tensors = sorted((name, value) for name, value in inputs.items() if isinstance(value, torch.Tensor))
        contents = tuple((name, tuple(value.shape), str(value.dtype), hashlib.sha256(
            value.detach().contiguous().reshape(-1).view(torch.uint8).numpy().tobytes()).hexdigest())
            for name, value in tensors)
        return contents, generation, repr(config.to_dict()) if config is not None else None

    def get(self, key: tuple) -> tuple[list[float], str] | None:
        return self._timings.get(key)

    def put(self, key: tuple, timings: list[float], target: str) -> None:
        self._timings.setdefault(key, (timings, target))


def measure_latency(folder: str | Path, model, plan, runs: int | None = None,
                    eager_timings: EagerTimings | None = None) -> dict:
    """The target in `folder` and `model` on the plan's sample inputs at batch 1 and the largest declared batch:
    `{"runs", "cpu", "threads", "points": [{"batch", "shapes", "artifact_ms", "eager_ms", "speedup"}]}`.
    `eager_timings` (a job's): eager figures already taken on the same inputs are reused, not re-measured.
    `runs`: the fewest timed calls per side and batch size (default `DEFAULT_RUNS`, or HFEXPORT_LATENCY_RUNS)."""
    import torch

    from hfexport.exported import ExportedModel

    if runs is None:
        runs = _count_setting("HFEXPORT_LATENCY_RUNS", DEFAULT_RUNS, 1)
    exported = ExportedModel.from_pretrained(Path(folder))
    generation = plan.target.mode == "generation"
    config = None
    if generation:
        exported_call, eager_call, config = _generation_calls(exported, model, plan)
    else:
        exported_call, eager_call = (lambda inputs: exported(**inputs)), (lambda inputs: model(**inputs))
    sizes, refs = batch_sizes(plan)
    # Every axis that follows the batch (attention_mask after input_ids) is resized with it; "batch" names the dim.
    refs = [AxisRef(ref.input, ref.axis, "batch", ref.scale, ref.offset) for ref in refs]
    points, runnable = [], []
    was_training = model.training
    model.eval()
    try:
        with torch.inference_mode():
            for batch in sizes:
                inputs = resize_inputs(plan.inputs, refs, {"batch": batch}) if refs else dict(plan.inputs)
                eager_inputs = copy.deepcopy(inputs)
                key = EagerTimings.key(inputs, generation, config)
                shared = eager_timings.get(key) if eager_timings is not None else None
                calls = {"artifact": lambda: exported_call(inputs)}
                if shared is None:
                    calls["eager"] = lambda: eager_call(eager_inputs)
                # alternated: load on the machine weighs on both alike
                samples = time_alternately(calls, runs, runnable=runnable)
                if shared is None and eager_timings is not None:
                    eager_timings.put(key, samples["eager"], plan.target.name)
                eager, eager_from = shared if shared is not None else (samples["eager"], plan.target.name)
                artifact, eager_side = summary(samples["artifact"]), summary(eager)
                artifact_ms, eager_ms = artifact["ms"], eager_side["ms"]
                point = {"batch": batch, "shapes": shapes_of(inputs), "artifact_ms": artifact_ms,
                         "eager_ms": eager_ms, "artifact_spread": artifact["spread"],
                         "eager_spread": eager_side["spread"], "runs": len(samples["artifact"]),
                         "eager_runs": len(eager),
                         "speedup": round(eager_ms / artifact_ms, 3) if artifact_ms > 0 else None}
                point["verdict"] = verdict(point)
                if eager_from != plan.target.name:
                    point["eager_measured_with"] = eager_from
                if generation:
                    point.update(new_tokens=GENERATION_TOKENS,
                                 artifact_ms_per_token=round(artifact_ms / GENERATION_TOKENS, 3),
                                 eager_ms_per_token=round(eager_ms / GENERATION_TOKENS, 3))
                points.append(point)
    finally:
        model.train(was_training)
    cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count()  # usable here
    latency = {"runs": runs, "cpu": cpu_info()["model"], "threads": torch.get_num_threads(), "cores": cores,
               "load_average": round(os.getloadavg()[0], 2), "points": points}
    if runnable:
        latency["runnable"] = statistics.median(runnable)
    unsound = soundness(points, runnable, cores, torch.get_num_threads(), latency["load_average"])
    if unsound:
        latency[UNRELIABLE] = unsound
        for point in points:
            point["verdict"] = UNRELIABLE
    return latency


def _generation_calls(exported, model, plan):
    """(artifact call, eager call, their GenerationConfig) that each make exactly `GENERATION_TOKENS` greedy tokens from a prompt batch."""
    from hfexport.generate import generate

    config = copy.deepcopy(plan.generation_config or model.generation_config)
    config.do_sample, config.num_beams = False, 1
    config.max_new_tokens = config.min_new_tokens = GENERATION_TOKENS  # min_new_tokens: EOS cannot end it early

    def artifact(inputs):  # the same settings as the eager side (hfexport.generate takes a GenerationConfig)
        return generate(exported, inputs["input_ids"], inputs.get("attention_mask"), generation_config=config)

    def eager(inputs):
        return model.generate(**inputs, generation_config=config)

    return artifact, eager, config


# ── rendering (Markdown for the report, the Space and the card) ──────────────


def latency_rows(report, sound_only: bool = False) -> list[tuple[str, dict]]:
    """(target, point) for every measured point of a job report, in target order (`sound_only`: only those of
    measurements `soundness` did not find unreliable)."""
    rows = []
    for name, target in report.targets.items():
        latency = getattr(target, "latency", None) or {}
        if sound_only and latency.get(UNRELIABLE):
            continue
        for point in latency.get("points", []):
            rows.append((name, point))
    return rows


def chart_rows(report) -> list[dict]:
    """The latency as plot rows (the Space's bar chart): per batch size, eager torch (the median over the job's
    measurements) and each artifact; `run` is the bar's label, `ms` its height. Unreliable measurements are left
    out: a bar chart says which is faster."""
    rows, eager = [], {}
    for name, point in latency_rows(report, sound_only=True):
        rows.append({"run": f"{name} · batch {point['batch']}", "ms": point["artifact_ms"],
                     "batch": f"batch {point['batch']}"})
        eager.setdefault((point["batch"], bool(point.get("new_tokens"))), []).append(point["eager_ms"])
    for (batch, generation), values in eager.items():
        what = "eager generate" if generation else "eager torch"
        rows.append({"run": f"{what} · batch {batch}", "ms": round(statistics.median(values), 3),
                     "batch": f"batch {batch}"})
    return sorted(rows, key=lambda row: (int(row["batch"].split()[-1]), row["ms"]))


def latency_markdown(report, bar_width: int = 24, publication: bool = False) -> str:
    """A table of each target's latency next to eager torch, per batch size, with a bar chart in text (one bar per
    artifact, scaled to the slowest figure of its batch size, so the shortest bar is the fastest format). Empty
    when nothing was measured. An unreliable measurement (`soundness`) claims nothing ("not measured reliably
    here"); with `publication` (the card, the PR) its figures are left out, and one line says why."""
    unsound = {name: target.latency[UNRELIABLE] for name, target in report.targets.items()
               if (getattr(target, "latency", None) or {}).get(UNRELIABLE) and target.latency.get("points")}
    rows = latency_rows(report, sound_only=publication)
    if not rows:
        if publication and unsound:
            return _left_out(unsound)
        return ""
    first = next(target.latency for name, target in report.targets.items() if getattr(target, "latency", None)
                 and target.latency.get("points") and not (publication and name in unsound))
    slowest: dict[tuple, float] = {}  # per batch size and kind: a whole generation is not scaled with forwards
    for _, point in rows:
        key = (point["batch"], bool(point.get("new_tokens")))
        slowest[key] = max(slowest.get(key, 0.0), point["artifact_ms"], point["eager_ms"])
    load = first.get("load_average")
    runs = {name: _run_label(target.latency) for name, target in report.targets.items()
            if (getattr(target, "latency", None) or {}).get("points") and not (publication and name in unsound)}
    mixed = len(set(runs.values())) > 1  # rows of several jobs (a PR holding targets of earlier runs): each says which
    lines = [f"### Latency on the verifying machine ({first['cpu']}, {first['threads']} threads"
             + (f", load average {load:.2f}" if load is not None and not mixed else "")
             + f"; median of {first['runs']}+ runs, 25th-75th percentile in brackets"
             + ("; rows of different runs, each with its own eager baseline" if mixed else "") + ")", "",
             *([f"The machine was busy while timed (load average {load:.2f} on {first['cores']} cores): times "
                "include waits for cores; a difference within the spreads is not claimed.", ""]
               if load is not None and first.get("cores") and load > first["cores"] and not mixed
               and not first.get(UNRELIABLE) else []),
             *[line for reason in dict.fromkeys(unsound.values()) if not publication
               for line in (f"Not measured reliably here ({reason}): no speed is claimed.", "")],
             "| target | batch | artifact ms | eager torch ms | vs eager | |" + (" run |" if mixed else ""),
             "|---|---:|---:|---:|---:|---|" + ("---|" if mixed else "")]
    for name, point in sorted(rows, key=lambda row: (row[1]["batch"], row[1]["artifact_ms"])):
        bar = _bar(point["artifact_ms"], slowest[(point["batch"], bool(point.get("new_tokens")))], bar_width)
        label = f"`{name}`" + (f" (generate, {point['new_tokens']} tokens)" if point.get("new_tokens") else "")
        lines.append(f"| {label} | {point['batch']} | {_ms(point['artifact_ms'], point.get('artifact_spread'))} "
                     f"| {_ms(point['eager_ms'], point.get('eager_spread'))} | {versus(point)} | `{bar}` |"
                     + (f" {runs[name]} |" if mixed else ""))
    if publication and unsound:
        lines += ["", _left_out(unsound)]
    return "\n".join(lines)


def _left_out(unsound: dict[str, str]) -> str:
    """The line a published report has in place of unreliable latency figures."""
    names = ", ".join(f"`{name}`" for name in unsound)
    reasons = "; ".join(dict.fromkeys(unsound.values()))
    return (f"Latency of {names} not published: not measured reliably on the machine that ran the job ({reasons}). "
            "An export on an idle machine measures it.")


def _run_label(latency: dict) -> str:
    """The run a target's figures come from: its job's time and model files (`run`, `run_source`)."""
    run, source = latency.get("run"), latency.get("run_source")
    if not run:
        return "unknown run"
    return str(run)[:16].replace("T", " ") + (f" · `{source}`" if source else "")


def versus(point: dict) -> str:
    """The artifact against eager torch in words: `2.10x faster` only when the spreads do not overlap, `within
    spread (1.05x)` when they do; a point from before spreads were recorded shows its ratio alone."""
    speedup = point.get("speedup")
    if speedup is None:
        return "—"
    said = verdict(point)
    if said == UNRELIABLE:
        return "not measured reliably here"
    if said == "within spread":
        return f"within spread ({speedup:.2f}x)"
    if said == "unknown":
        return f"{speedup:.2f}x"
    return f"{speedup:.2f}x {said}" if said == "faster" else f"{1 / speedup:.2f}x slower"


def _ms(value: float, spread: list | None) -> str:
    return f"{value:.2f}" + (f" ({spread[0]:.2f}–{spread[1]:.2f})" if spread else "")


def _bar(value: float, scale: float, width: int) -> str:
    filled = 0 if scale <= 0 else max(1, round(width * value / scale))
    return "█" * filled + "·" * (width - filled)
