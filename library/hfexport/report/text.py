"""Plain-text rendering of a target's verification, for a terminal (`hfexport verify`): aligned columns, words for
verdicts, no Markdown or HTML. The Markdown of PRs, job summaries and the Space is `hfexport.report.markdown`."""

from __future__ import annotations

from hfexport.layout import format_label
from hfexport.report.markdown import generation_settings, probe_rows, thresholds_text


def verification_text(name: str, target, against: str) -> str:
    """One target's verification: a heading line (target, format, mode, model), the verdict and its settings, a row
    per probe and output (max abs, max rel, cosine, top-1, result), the generation check, and the failures."""
    lines = [f"{name} ({format_label(target.export_format)} / {target.mode}) vs {against}"]
    verification = target.verification
    if not verification:
        return "\n".join([*lines, "  parity: not verified"])
    if verification.get("skipped"):
        return "\n".join([*lines, f"  parity: skipped ({verification.get('reason', '')})"])
    probes = verification.get("probes") or []
    verdict = "passed" if verification.get("passed") else "FAILED"
    lines.append(f"  parity: {verdict}: artifacts reloaded from disk vs the eager model, {len(probes)} probe(s)"
                 + (f"; thresholds: {thresholds_text(verification['thresholds'])}".replace("`", "")
                    if verification.get("thresholds") else ""))
    rows = _probe_rows(probes)
    check = verification.get("runtime_check") or {}
    if check.get("probes"):
        rows += _probe_rows(check["probes"], f" at {check.get('precision')}")
    if rows:
        header = ("probe", "output", "max abs", "max rel", "cosine", "top-1", "result")
        widths = [max(len(row[column]) for row in [header, *rows]) for column in range(len(header) - 1)]
        for row in [header, *rows]:
            lines.append("  " + "  ".join(cell.ljust(width) for cell, width in zip(row, widths)) + "  " + row[-1])
    for generation in (verification.get("generation"), check.get("generation")):
        if generation:
            lines.append("  " + _generation_line(generation))
    failures = verification.get("failures") or []
    if failures and not verification.get("passed"):
        lines += ["  failures:", *[f"    - {' '.join(str(failure).split())}" for failure in failures]]
    return "\n".join(lines)


def _probe_rows(probes: list[dict], suffix: str = "") -> list[tuple[str, ...]]:
    rows = []
    for row in probe_rows(probes):
        label = str(row.probe.get("name", "")) + suffix
        if row.probe.get("component"):
            label += f" [{row.probe['component']}]"
        result = {"passed": "passed", "failed": "FAILED: " + row.detail, "skipped": "skipped: " + row.detail,
                  "rejected": "rejected: " + " ".join(row.detail.split())}[row.outcome]
        rows.append((label, "—" if row.output is None else row.output, *row.cells, result))
    return rows


def _generation_line(generation: dict) -> str:
    settings = generation_settings(generation)
    if generation.get("error"):
        return f"generation ({settings}): FAILED: {generation['error']}"
    agreement = generation.get("token_agreement", 0.0)
    verdict = "passed" if generation.get("passed") else "FAILED"
    return f"generation ({settings}): {verdict}, token agreement {agreement:.1%} with model.generate"
