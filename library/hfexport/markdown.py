"""Markdown rendering of a job report: the text of PR descriptions, job summaries and the Space's results."""

from __future__ import annotations

from .report import JobReport, human_bytes

STATUS_ICONS = {"ok": "✅ ok", "failed": "❌ failed", "error": "⚠️ error", "unchanged": "➖ unchanged"}


def _seconds(value) -> str:
    return f"{value:.1f} s" if isinstance(value, (int, float)) else "—"


def report_markdown(report: JobReport) -> str:
    """A summary table of targets, then a section per target (files; verification when it ran)."""
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
            f"| `{name}` | {target.export_format} | {target.mode} | {STATUS_ICONS.get(target.status, target.status)} "
            f"| {human_bytes(target.total_bytes) if target.files else '—'} | {_seconds(target.timings.get('export_s'))} "
            f"| {_seconds(target.timings.get('verify_s'))} |"
        )
    for name, target in report.targets.items():
        lines += ["", f"### `{name}`", ""]
        if target.error:
            lines += [f"**Error:** {target.error}", ""]
        if target.unchanged_reason:
            lines += [f"Unchanged: {target.unchanged_reason}", ""]
        section = target_verification_markdown(target)
        if section:
            lines += [section, ""]
        if target.files:
            lines += ["<details><summary>files</summary>", "", "| file | size |", "|---|---|"]
            lines += [f"| `{entry['path']}` | {human_bytes(entry['bytes'])} |" for entry in target.files]
            lines += ["", "</details>"]
    return "\n".join(lines).rstrip() + "\n"


def target_verification_markdown(target) -> str:
    """The parity section of one target (empty when verification did not run)."""
    verification = target.verification
    if not verification:
        return ""
    return f"Verification: {'passed' if verification.get('passed') else 'failed'}"
