"""Latency of a saved target on the verifying machine, next to eager torch: which format is fastest here.

For each batch size (1 and the largest the target declares: `dims.batch.max` when its batch axis is a named dim,
8 when torch.export decides the axes, else the sample's), the target is reloaded from disk and it and the eager
model run the sample inputs resized to that batch (the sample's sequence length), alternately, after one warm-up
call each; the report keeps the median of `runs` calls (milliseconds) and the ratio eager / artifact (above 1: the
artifact is faster). Generation targets are timed the same way over a whole greedy generation of
`GENERATION_TOKENS` new tokens (one GenerationConfig for both, `min_new_tokens` holding EOS back, so both sides make
every token): `hfexport.generate` over the exported prefill/decode graphs vs `model.generate`, and the point adds
milliseconds per new token. Within one job, eager torch is timed once per input set (`EagerTimings`): the first
target that needs it alternates with it, later targets on the same inputs time only their artifact and say whose
eager figure they compare with (`eager_measured_with`).

The figures describe this machine (its CPU and thread count are recorded), so they say which artifact is fastest
for the person who ran the job, not everywhere.
"""

from __future__ import annotations

import copy
import os
import statistics
import time
from pathlib import Path

from hfexport.runtime import cpu_info
from hfexport.verify.probes import (
    AxisRef,
    probe_axes,
    probe_tensors,
    resize_inputs,
    shapes_of,
)

DEFAULT_RUNS = 5
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


def measure_latency(folder: str | Path, model, plan, runs: int = DEFAULT_RUNS,
                    eager_timings: EagerTimings | None = None) -> dict:
    """The target in `folder` and `model` on the plan's sample inputs at batch 1 and the largest declared batch:
    `{"runs", "cpu", "threads", "points": [{"batch", "shapes", "artifact_ms", "eager_ms", "speedup"}]}`.
    `eager_timings` (a job's): eager figures already taken on the same inputs are reused, not re-measured."""
    import torch

    from hfexport.exported import ExportedModel


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
    points = []
    was_training = model.training
    model.eval()
    try:
        with torch.inference_mode():
            for batch in sizes:
                inputs = resize_inputs(plan.inputs, refs, {"batch": batch}) if refs else dict(plan.inputs)
                eager_inputs = copy.deepcopy(inputs)
                key = EagerTimings.key(inputs, generation, config)
                shared = eager_timings.get(key) if eager_timings is not None else None
                exported_call(inputs)  # warm-up: first-call allocations, lazy compilation
                if shared is None:
                    eager_call(eager_inputs)
                artifact, eager = [], []
                for _ in range(runs):  # alternated, so that load on the machine weighs on both alike
                    artifact.append(_time_ms(lambda: exported_call(inputs)))
                    if shared is None:
                        eager.append(_time_ms(lambda: eager_call(eager_inputs)))
                if shared is None and eager_timings is not None:
                    eager_timings.put(key, eager, plan.target.name)
                eager, eager_from = shared if shared is not None else (eager, plan.target.name)
                artifact_ms, eager_ms = statistics.median(artifact), statistics.median(eager)
                point = {"batch": batch, "shapes": shapes_of(inputs), "artifact_ms": round(artifact_ms, 3),
                         "eager_ms": round(eager_ms, 3),
                         "speedup": round(eager_ms / artifact_ms, 3) if artifact_ms > 0 else None}
                if eager_from != plan.target.name:
                    point["eager_measured_with"] = eager_from
                if generation:
                    point.update(new_tokens=GENERATION_TOKENS,
                                 artifact_ms_per_token=round(artifact_ms / GENERATION_TOKENS, 3),
                                 eager_ms_per_token=round(eager_ms / GENERATION_TOKENS, 3))
                points.append(point)
    finally:
        model.train(was_training)
    return {"runs": runs, "cpu": cpu_info()["model"], "threads": torch.get_num_threads(), "cores": os.cpu_count(),
            "points": points}


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


def latency_rows(report) -> list[tuple[str, dict]]:
    """(target, point) for every measured point of a job report, in target order."""
    rows = []
    for name, target in report.targets.items():
        latency = getattr(target, "latency", None) or {}
        for point in latency.get("points", []):
            rows.append((name, point))
    return rows


def chart_rows(report) -> list[dict]:
    """The latency as plot rows (the Space's bar chart): per batch size, eager torch (the median over the job's
    measurements) and each artifact; `run` is the bar's label, `ms` its height."""
    rows, eager = [], {}
    for name, point in latency_rows(report):
        rows.append({"run": f"{name} · batch {point['batch']}", "ms": point["artifact_ms"],
                     "batch": f"batch {point['batch']}"})
        eager.setdefault((point["batch"], bool(point.get("new_tokens"))), []).append(point["eager_ms"])
    for (batch, generation), values in eager.items():
        what = "eager generate" if generation else "eager torch"
        rows.append({"run": f"{what} · batch {batch}", "ms": round(statistics.median(values), 3),
                     "batch": f"batch {batch}"})
    return sorted(rows, key=lambda row: (int(row["batch"].split()[-1]), row["ms"]))


def latency_markdown(report, bar_width: int = 24) -> str:
    """A table of each target's latency next to eager torch, per batch size, with a bar chart in text (one bar per
    artifact, scaled to the slowest figure of its batch size, so the shortest bar is the fastest format). Empty
    when nothing was measured."""
    rows = latency_rows(report)
    if not rows:
        return ""
    first = next(target.latency for target in report.targets.values() if getattr(target, "latency", None)
                 and target.latency.get("points"))
    slowest: dict[tuple, float] = {}  # per batch size and kind: a whole generation is not scaled with forwards
    for _, point in rows:
        key = (point["batch"], bool(point.get("new_tokens")))
        slowest[key] = max(slowest.get(key, 0.0), point["artifact_ms"], point["eager_ms"])
    lines = [f"### Latency on the verifying machine ({first['cpu']}, {first['threads']} threads; median of "
             f"{first['runs']} runs)", "",
             "| target | batch | artifact ms | eager torch ms | vs eager | |", "|---|---:|---:|---:|---:|---|"]
    for name, point in sorted(rows, key=lambda row: (row[1]["batch"], row[1]["artifact_ms"])):
        bar = _bar(point["artifact_ms"], slowest[(point["batch"], bool(point.get("new_tokens")))], bar_width)
        speedup = point.get("speedup")
        versus = "—" if speedup is None else f"{speedup:.2f}x {'faster' if speedup >= 1 else 'slower'}"
        label = f"`{name}`" + (f" (generate, {point['new_tokens']} tokens)" if point.get("new_tokens") else "")
        lines.append(f"| {label} | {point['batch']} | {point['artifact_ms']:.2f} | {point['eager_ms']:.2f} "
                     f"| {versus} | `{bar}` |")
    return "\n".join(lines)


def _bar(value: float, scale: float, width: int) -> str:
    filled = 0 if scale <= 0 else max(1, round(width * value / scale))
    return "█" * filled + "·" * (width - filled)
