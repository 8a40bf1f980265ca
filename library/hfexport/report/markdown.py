"""Markdown rendering of a job report: the text of PR descriptions, job summaries and the Space's results."""

from __future__ import annotations

from collections.abc import Iterator
from typing import NamedTuple

from hfexport.files import human_bytes
from hfexport.latency import latency_markdown
from hfexport.layout import format_label
from hfexport.report.data import JobReport
from hfexport.machine import summary_line
from hfexport.progress import STAGE_LABELS
from hfexport.samples import describe
from hfexport.verify.thresholds import EXACT_TOKEN_AGREEMENT

STATUS_ICONS = {"ok": "✅ ok", "failed": "❌ failed", "error": "⚠️ error", "unchanged": "➖ unchanged"}


def _seconds(value) -> str:
    return f"{value:.1f} s" if isinstance(value, (int, float)) else "—"


def report_markdown(report: JobReport, publication: bool = False) -> str:
    """A summary table of targets, then a section per target (files; verification when it ran). `publication`: for
    the Hub (the card, the PR): unreliable latency figures are left out (`latency_markdown`)."""
    source = report.source
    where = source["model"] + (f"@{source['revision']}" if source.get("revision") else "")
    commit = source.get("commit") or source.get("content_hash") or ""
    lines = [
        "## hfexport report",
        "",
        f"Source: `{where}`" + (f" (`{commit[:12]}`)" if commit else "") + f" · recipe `{source['recipe_sha256'][:12]}`"
        + f" · hfexport {report.hfexport_version} · transformers {report.packages.get('transformers', '?')}"
        + f" · torch {report.packages.get('torch', '?')}",
        "",
        "| target | format | mode | status | size | export | verify |",
        "|---|---|---|---|---|---|---|",
    ]
    for name, target in report.targets.items():
        lines.append(
            f"| `{name}` | {format_label(target.export_format)} | {target.mode} | {STATUS_ICONS.get(target.status, target.status)} "
            f"| {human_bytes(target.total_bytes) if target.files else '—'} | {_seconds(target.timings.get('export_s'))} "
            f"| {_seconds(target.timings.get('verify_s'))} |"
        )
    verified_on = verified_on_line(report)
    if verified_on:
        lines += ["", verified_on]
    memory = memory_line(report)
    if memory:
        lines += ["", memory]
    lines += _latency_lines(report, publication)
    for name, target in report.targets.items():
        lines += ["", f"### `{name}`", ""]
        timings = " · ".join(f"{key.removesuffix('_s')} {_seconds(value)}" for key, value in target.timings.items())
        size = human_bytes(target.total_bytes or sum(entry["bytes"] for entry in target.files)) if target.files else None
        if size or timings:
            lines += [" · ".join(part for part in (f"Size {size}" if size else "", timings) if part), ""]
        if target.error:
            lines += [f"**Error:** {target.error}", ""]
        if target.unchanged_reason:
            lines += [f"Unchanged: {target.unchanged_reason}", ""]
        if target.method == "rebind" and target.rebind:
            lines += [f"Rebound: this checkpoint's weights written into the graphs of the previous export "
                      f"({target.rebind['from']}) in {_seconds(target.rebind['seconds'])}, then verified as any export.", ""]
        elif target.rebind and target.rebind.get("fallback"):
            lines += [f"Exported in full, not rebound: {target.rebind['fallback']}", ""]
        if target.quantization:
            lines += [quantization_markdown(target.quantization), ""]
        if target.sample_files:
            lines += [sample_files_markdown(target.sample_files, target.mode), ""]
        if target.prepared_inputs:
            lines += [prepared_inputs_markdown(target.prepared_inputs), ""]
        section = target_verification_markdown(target)
        if section:
            lines += [section, ""]
        if target.runtimes:
            lines += [runtimes_markdown(target.runtimes), ""]
        if target.variants:
            lines += [variants_markdown(target.variants), ""]
        if target.files:
            lines += ["<details><summary>files</summary>", "", "| file | size |", "|---|---|"]
            lines += [f"| `{entry['path']}` | {human_bytes(entry['bytes'])} |" for entry in target.files]
            lines += ["", "</details>"]
    return "\n".join(lines).rstrip() + "\n"


def _mb(value: float) -> str:
    return human_bytes(int(value * (1 << 20)))


def _stages(peaks: dict, plan: bool = False) -> str:
    return ", ".join(f"{STAGE_LABELS.get(stage, stage)} {_mb(mb)}" for stage, mb in peaks.items()
                     if plan or stage != "plan")


def memory_line(report: JobReport) -> str | None:
    """One line: the peak memory (RSS) of each stage, per target, the runtimes' own processes apart, and the
    preflight's estimate beside them (`hfexport.job.memory`); None when nothing was measured. The plan stage only
    where the preflight estimated it (a job exported from its structure: it runs the twin)."""
    job = report.memory or {}
    plan = "plan" in (job.get("estimate_mb") or {})
    parts = []
    if job.get("peak_rss_mb"):
        parts.append(_stages(job["peak_rss_mb"], plan))
    for name, target in report.targets.items():
        block = target.memory or {}
        if block.get("peak_rss_mb"):
            children = block.get("children_peak_rss_mb") or {}
            parts.append(f"{name}: {_stages(block['peak_rss_mb'], plan)}"
                         + (f" (runtime processes up to {_mb(max(children.values()))})" if children else ""))
    if not parts:
        return None
    line = "Peak memory: " + " · ".join(parts)
    if job.get("estimate_mb"):
        line += f" · preflight estimate: {_stages(job['estimate_mb'], True)}"
        if job.get("max_memory_mb"):
            line += f" (budget {_mb(job['max_memory_mb'])})"
    return line


def sample_files_markdown(records: list[dict], mode: str = "forward") -> str:
    """One line: the sample files the job was given, which the export was traced and verified on."""
    kinds = " and ".join(f"{record['kind']} {describe(record)}" for record in records)
    places = " and ".join("images" if record["kind"] == "image" else "audio clips" for record in records)
    checks = "every parity probe and the generation check were" if mode == "generation" else "every parity probe was"
    return (f"**Sample input:** the given {kinds}, in place of the recipe's synthesized {places}: the export was "
            f"traced on it, and {checks} built from it.")


def prepared_inputs_markdown(prepared: dict) -> str:
    """One line: what transformers' export input preparers computed from the sample inputs, per component."""
    parts = []
    for component, inputs in prepared.items():
        described = []
        for name, entry in inputs.items():
            shape = "x".join(map(str, entry["shape"])) if "shape" in entry else entry.get("python", "")
            described.append(f"`{name}` {entry['kind']} ({shape}{' ' + entry['dtype'] if 'dtype' in entry else ''})")
        parts.append(f"{component}: {', '.join(described)}")
    return "Computed by the engine's input preparers before tracing: " + "; ".join(parts) + "."


def quantization_markdown(quantization: dict) -> str:
    """One line: method, preset/params, calibration source and samples, size and latency against the reference."""
    what = quantization["method"] + (f" `{quantization['preset']}`" if quantization.get("preset") else "")
    params = ", ".join(f"{key}={value}" for key, value in (quantization.get("params") or {}).items())
    line = f"**Quantization:** {what}" + (f" ({_cell(params)})" if params else "")
    calibration = quantization.get("calibration")
    if calibration:
        line += (f" · calibration: {calibration['samples']} sample(s) from {_cell(calibration.get('origin') or calibration['source'])}"
                 f" in {calibration['batches']} batch(es)")
    elif quantization.get("data") == "none":
        line += " · data-free"
    comparison = quantization.get("comparison") or {}
    if comparison.get("size_ratio") is not None:
        line += (f" · size {human_bytes(comparison['bytes'])} = {comparison['size_ratio']:.2f}x of "
                 f"{human_bytes(comparison['reference_bytes'])}")
        if comparison.get("latency_ratio") is not None:
            shapes = ", ".join(f"{key} {'x'.join(map(str, shape))}" for key, shape in comparison["latency_inputs"].items())
            line += (f" · latency {comparison['latency_ms']:.1f} ms = {comparison['latency_ratio']:.2f}x of "
                     f"{comparison['reference_latency_ms']:.1f} ms ({_cell(shapes)})")
        line += f" · reference: {_cell(comparison.get('reference'))}"
    elif comparison.get("reason") or comparison.get("error"):
        line += f" · not compared: {_cell(comparison.get('reason') or comparison.get('error'))}"
    return line


def _cell(text) -> str:
    """Text safe inside a table cell: one line, pipes escaped."""
    return " ".join(str(text).split()).replace("|", "\\|")


def metric_text(value, digits: int = 2) -> str:
    return "—" if value is None else f"{value:.{digits}e}" if value else "0"


def ratio_text(value) -> str:
    return "—" if value is None else f"{value:.6f}"


def thresholds_text(thresholds: dict) -> str:
    default = thresholds.get("default", {})
    names = {"atol": "atol", "rtol": "rtol", "min_cosine": "min cosine", "min_top1": "min top-1"}
    parts = [f"{label} {default[key]:g}" for key, label in names.items() if default.get(key) is not None]
    text = ", ".join(parts) or "none"
    for output, values in (thresholds.get("outputs") or {}).items():
        text += f"; `{output}`: " + ", ".join(f"{names[k]} {v:g}" for k, v in values.items() if v is not None)
    return text + (f" ({thresholds['basis']})" if thresholds.get("basis") else "")


def runtime_cell(verification: dict | None) -> str:
    """Where and at what precision a target was checked, short: `CPU f32`, `CPU f32 (graph) + bf16 (default)`."""
    runtime = (verification or {}).get("runtime") or {}
    checks = runtime.get("checks") or []
    if not checks:
        return "—"
    device = runtime.get("device") or "cpu"
    if len(checks) == 1:
        return f"{device} {checks[0].get('precision')}"
    graph, user = checks[0], checks[-1]
    why = "pinned" if runtime.get("requested") not in (None, "auto") else "default"
    if user.get("same_as") == "graph":
        return f"{device} {graph.get('precision')} (graph = {why})"
    return (f"{device} {graph.get('precision')} (graph, {'passed' if graph.get('passed') else 'failed'}) + "
            f"{user.get('precision')} ({why}, {'passed' if user.get('passed') else 'failed'})")


def verified_on_line(report: JobReport) -> str | None:
    """One line: the CPU(s) the verdicts were reached on, and the precision each target's runtime computed at."""
    cpus, cells = [], []
    for name, target in report.targets.items():
        runtime = (target.verification or {}).get("runtime")
        if not runtime:
            continue
        line = summary_line(runtime.get("cpu") or {})
        if line not in cpus:
            cpus.append(line)
        cells.append(f"`{name}` {runtime_cell(target.verification)}")
    if not cpus:
        return None
    return f"Verified on {'; '.join(cpus)}: " + ", ".join(cells) + "."


def _runtime_markdown(verification: dict) -> str:
    """The runtime paragraph of a target: CPU, backend, device, and each check's precision (read back)."""
    runtime = verification["runtime"]
    cpu = runtime.get("cpu") or {}
    parts = [f"**Runtime:** {runtime.get('backend', '?')} on {runtime.get('device', 'cpu')} · {summary_line(cpu)}"]
    for check in runtime.get("checks") or []:
        verdict = "passed" if check.get("passed") else "failed"
        if check.get("name") == "graph":
            parts.append(f"graph checked at {check.get('precision')} ({verdict})")
        elif check.get("same_as") == "graph":
            parts.append(f"`hfexport.load` runs it at {check.get('precision')} here "
                         f"({'the recipe pins it' if check.get('requested') not in (None, 'auto') else 'the device default'}"
                         "): the graph check covers it")
        else:
            requested = check.get("requested")
            why = f"the recipe pins {requested}" if requested not in (None, "auto") else "the device default"
            parts.append(f"`hfexport.load` runs it at **{check.get('precision')}** here ({why}): {verdict}")
    for component in (runtime.get("checks") or [{}])[-1].get("components", {}).values():
        if component.get("int8_path"):
            parts.append(f"ONNX Runtime int8 path: {component['int8_path']}")
            break
    return " · ".join(parts)


def target_verification_markdown(target) -> str:
    """The parity section of one target: a line of verdict and settings, then a table with a row per probe and
    output (max abs, max rel, cosine, top-1, pass/fail), the generation check and the failures. Empty when
    verification did not run."""
    verification = target.verification
    if not verification:
        return ""
    if verification.get("skipped"):
        return f"**Parity: ➖ skipped** ({_cell(verification.get('reason', ''))})"
    verdict = "✅ passed" if verification.get("passed") else "❌ failed"
    probes = verification.get("probes", [])
    header = f"**Parity: {verdict}** — artifacts reloaded from disk vs the eager model, {len(probes)} probe run(s)"
    if verification.get("thresholds"):
        header += f" · thresholds: {thresholds_text(verification['thresholds'])}"
    bound = verification.get("cost_bound") or {}
    if bound:
        header += f" · probe cost bound {bound['max_probe_elements']:,} input elements"
        if bound.get("auto_axes"):
            header += " (axes auto: batch 1 and 8 probed)"
    if verification.get("seconds") is not None:
        header += f" · {verification['seconds']:.1f} s"
    lines = [header]
    if verification.get("runtime"):
        lines += ["", _runtime_markdown(verification)]
    if verification.get("representative"):
        lines += ["", f"Quality judged on {_cell(verification['representative']['source'])}; the other probes check "
                      "that the artifact runs at each declared size (shapes, finite values)."]
    lines += _probe_rows(probes)
    generation = verification.get("generation")
    if generation:
        lines += ["", _generation_markdown(generation)]
    runtime_check = verification.get("runtime_check")
    if runtime_check:
        lines += ["", f"At **{runtime_check.get('precision')}** (what `hfexport.load` gives here) · thresholds: "
                      f"{thresholds_text(runtime_check.get('thresholds') or {})}"]
        lines += _probe_rows(runtime_check.get("probes") or [])
        if runtime_check.get("generation"):
            lines += ["", _generation_markdown(runtime_check["generation"])]
    failures = verification.get("failures") or []
    if failures and not verification.get("passed"):
        lines += ["", "Failures:", ""] + [f"- {_cell(failure)}" for failure in failures]
    return "\n".join(lines)


RUNTIME_VERDICTS = {"passed": "✅ passed", "failed": "❌ failed", "not_checked": "➖ not checked"}


def runtimes_markdown(runtimes: list[dict]) -> str:
    """The deployment runtimes' verdicts (hfexport.deployment): a row per runtime, with its version and why."""
    lines = ["**Deployment runtimes** — greedy generation on the sample prompts against `model.generate`: token for "
             "token, or for a quantized or fp16 variant (detail: `at q8`, `at fp16`) within the target's token agreement "
             "floor", "", "| runtime | version | verdict | batch | detail |", "|---|---|---|---|---|"]
    for check in runtimes:
        batches = ", ".join(map(str, check.get("batch_sizes") or [])) or "—"
        detail = check.get("reason") or (f"at {check['precision']}" if check.get("precision") else "")
        lines.append(f"| {check['runtime']} | {check.get('version') or '—'} | "
                     f"{RUNTIME_VERDICTS.get(check['verdict'], check['verdict'])} | {batches} | {_cell(detail)} |")
    return "\n".join(lines)


class ProbeRow(NamedTuple):
    """One row of a parity table, as the Markdown (`target_verification_markdown`) and the terminal
    (`hfexport.report.text`) render it."""

    probe: dict  # the probe's record (name, component, capped)
    output: str | None  # None: a probe with no outputs (rejected or skipped)
    metrics: dict  # the output's metrics (empty without an output)
    cells: tuple[str, str, str, str]  # max abs, max rel, cosine, top-1 as text
    outcome: str  # "passed", "failed", "rejected" (the artifact refused the probe) or "skipped"
    detail: str  # the failures (joined by "; "), the rejection's error or why it was skipped


NO_METRICS = ("—", "—", "—", "—")


def probe_rows(probes: list[dict]) -> Iterator[ProbeRow]:
    """A row per probe and output: its metrics as text and its outcome; a probe rejected or skipped is one row."""
    for probe in probes:
        if probe.get("error"):
            yield ProbeRow(probe, None, {}, NO_METRICS, "rejected", str(probe["error"]))
            continue
        if probe.get("skipped"):
            yield ProbeRow(probe, None, {}, NO_METRICS, "skipped", str(probe["skipped"]))
            continue
        for output, metrics in (probe.get("outputs") or {}).items():
            top1 = "—" if metrics.get("top1") is None else f"{metrics['top1']:.4f}"
            cells = (metric_text(metrics.get("max_abs")), metric_text(metrics.get("max_rel")),
                     ratio_text(metrics.get("cosine")), top1)
            yield ProbeRow(probe, output, metrics, cells, "passed" if metrics.get("passed") else "failed",
                           "; ".join(metrics.get("failures", [])))


def variants_markdown(variants: list[dict]) -> str:
    """The target's variants (hfexport.verify.variants): a row per variant, its file, size, quality against the
    float32 export and its runtimes' verdicts."""
    lines = ["**Variants** — made from this export; perplexity ratio and next-token agreement with the float32 export "
             "on the sample texts, and each runtime's greedy tokens within the variant's token agreement floor", "",
             "| variant | file | size | perplexity ratio | next-token agreement | runtimes | verdict |",
             "|---|---|---|---|---|---|---|"]
    for entry in variants:
        bounds = entry.get("settings") or {}
        ratio = f"{entry['nll_ratio']:.4f} (≤ {bounds.get('max_nll_ratio', '—')})" if "nll_ratio" in entry else "—"
        top1 = f"{entry['top1_agreement']:.3f} (≥ {bounds.get('min_top1_agreement', '—')})" \
            if "top1_agreement" in entry else "—"
        runtimes = ", ".join(f"{check['runtime']} {RUNTIME_VERDICTS.get(check['verdict'], check['verdict'])}"
                             for check in entry.get("runtimes") or []) or "—"
        verdict = "✅ passed" if entry["verdict"] == "passed" else f"❌ {_cell(entry.get('reason') or 'failed')}"
        size = human_bytes(entry["bytes"]) if entry.get("bytes") else "—"
        lines.append(f"| {entry['name']} | `{entry['file']}` | {size} | {ratio} | {top1} | {_cell(runtimes)} | "
                     f"{verdict} |")
    return "\n".join(lines)


def _probe_rows(probes: list[dict]) -> list[str]:
    """A table row per probe and output: max abs, max rel, cosine, top-1, pass/fail (rejections with the message)."""
    lines: list[str] = []
    if probes:  # collapsed: the verdict line above says the outcome, the rows are for who wants them
        lines += ["", f"<details><summary>{len(probes)} probe{'s' if len(probes) != 1 else ''}: max abs, max rel, "
                      "cosine, top-1 per output</summary>", "",
                  "| probe | component | output | max abs | max rel | cosine | top-1 | result |",
                  "|---|---|---|---|---|---|---|---|"]
    for row in probe_rows(probes):
        label = _cell(row.probe.get("name", ""))
        if row.probe.get("capped"):
            label += " (capped: " + ", ".join(f"{d} {c['requested']}→{c['probed']}"
                                              for d, c in row.probe["capped"].items()) + ")"
        component = row.probe.get("component") or "—"
        output = "—" if row.output is None else f"`{row.output}`" + (
            f" ({row.metrics['leaves']} leaves)" if row.metrics.get("leaves") else "")
        # A word with each mark: where no emoji font exists the marks render as empty boxes.
        result = {"passed": "✅ passed", "failed": "❌ failed: ", "rejected": "❌ rejected: ", "skipped": "➖ "}[
            row.outcome] + ("" if row.outcome == "passed" else _cell(row.detail))
        lines.append(f"| {label} | {component} | {output} | {' | '.join(row.cells)} | {result} |")
    if probes:
        lines += ["", "</details>"]
    return lines


def generation_settings(generation: dict) -> str:
    """How a verification generated, as the terminal and the Markdown both say it."""
    return f"greedy, {generation.get('max_new_tokens')} new tokens, {generation.get('prompts', '?')} prompt(s)"


def _generation_markdown(generation: dict) -> str:
    settings = generation_settings(generation)
    if generation.get("error"):
        return f"Generation ({settings}): ❌ failed: {_cell(generation['error'])}"
    agreement = generation.get("token_agreement", 0.0)
    line = (f"Generation ({settings}): {'✅ passed' if generation.get('passed') else '❌ failed'}, token agreement {agreement:.1%}"
            f" (needs {generation.get('min_token_agreement', EXACT_TOKEN_AGREEMENT):.0%}) with `model.generate(do_sample=False)`")
    first = generation.get("first_divergence")
    if first:
        def token(side):
            text = first.get(f"{side}_text")
            return f"{first.get(f'{side}_token')}" + (f" ({_cell(repr(text))})" if text is not None else "")

        line += (f"; first divergence: prompt {first['prompt']}, generated position {first['position']}: "
                 f"eager {token('eager')} vs exported {token('exported')}")
    return line


def _latency_lines(report: JobReport, publication: bool = False) -> list[str]:
    """The latency table and chart (hfexport.latency) below the summary, when the job measured any."""
    section = latency_markdown(report, publication=publication)
    return ["", section] if section else []


def comparison_summary(comparison: dict | None) -> str:
    """One line: `size 0.26x, latency 0.61x vs onnx` (or why there is no comparison)."""
    if not comparison:
        return "not compared"
    if "error" in comparison:
        return f"comparison failed: {comparison['error']}"
    if comparison.get("size_ratio") is None:
        return comparison.get("reason", "no reference")
    text = f"size {comparison['size_ratio']:.2f}x"
    if comparison.get("latency_ratio") is not None:
        text += f", latency {comparison['latency_ratio']:.2f}x"
    reference = comparison.get("reference") or ""
    return text + (f" vs {reference}" if not reference.startswith("fp32 export") else " vs fp32 (throwaway export)")
