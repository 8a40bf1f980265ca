"""The model card section hfexport maintains in a repo's README.md, between `<!-- hfexport:start -->` and
`<!-- hfexport:end -->`: targets, formats, sizes, parity, how to load each target, and format tags.

The card is parsed and its metadata edited with huggingface_hub's `ModelCard`. Text outside the markers is kept
byte for byte: the section is replaced in place (or appended once), and the YAML header is re-written only when
a format tag has to be added (then its other keys are kept, though the YAML layout is huggingface_hub's).
"""

from __future__ import annotations

import logging

from hfexport.errors import CardError
from hfexport.files import EXPORTS_DIR, human_bytes
from hfexport.latency import latency_markdown
from hfexport.report.markdown import report_markdown, verified_on_line
from hfexport.report.model import JobReport, TargetReport

START = "<!-- hfexport:start -->"
END = "<!-- hfexport:end -->"
FORMAT_TAGS = {"onnx": "onnx", "openvino": "openvino", "executorch": "executorch", "dynamo": "torch-export"}
PARITY = {True: "✅ passed", False: "❌ failed", None: "— not verified"}


def format_tags(reports: dict[str, TargetReport]) -> list[str]:
    """`hfexport` plus one tag per exported format (`onnx`, `openvino`, `executorch`, `torch-export`)."""
    tags = ["hfexport"]
    for report in reports.values():
        tag = FORMAT_TAGS.get(report.export_format, report.export_format)
        if tag not in tags:
            tags.append(tag)
    return tags


def _parity(report: TargetReport) -> str:
    if report.status == "failed":
        return PARITY[False]
    verification = report.verification or None
    return PARITY[None if verification is None else bool(verification.get("passed"))]


def render_section(repo_id: str, report: JobReport, folder: str = EXPORTS_DIR,
                   left_out: dict[str, str] | None = None) -> str:
    """The Markdown between the markers (markers included) for the targets of `report`, published in `repo_id`;
    `left_out` lists targets that were not published, with the reason."""
    lines = [
        START,
        "## Exported artifacts",
        "",
        f"Exported by hfexport {report.hfexport_version} from this repo's export recipe; each target is a folder "
        f"under `{folder}/`.",
        "",
        "| target | format | mode | files | size | parity |",
        "|---|---|---|---|---|---|",
    ]
    for name, target in report.targets.items():
        size = sum(entry["bytes"] for entry in target.files)
        lines.append(
            f"| [`{name}`]({folder}/{name}) | {target.export_format} | {target.mode} | {len(target.files)} "
            f"| {human_bytes(size)} | {_parity(target)} |"
        )
    if left_out:
        lines += ["", "Not published (did not pass verification): "
                  + "; ".join(f"`{name}`: {_short(why)}" for name, why in left_out.items())]
    verified_on = verified_on_line(report)
    if verified_on:
        lines += ["", verified_on]
    lines += _latency_lines(report)
    first = next(iter(report.targets), "TARGET")
    lines += [
        "",
        "Load a target (the manifest is checked before anything is loaded):",
        "",
        "```python",
        "import hfexport",
        "",
        f'model = hfexport.load("{repo_id}", target="{first}")',
        "# or, with the exported-model class:",
        f'model = hfexport.ExportedModel.from_pretrained("{repo_id}", subfolder="{folder}/{first}")',
        "```",
        "",
    ]
    if len(report.targets) > 1:
        lines += ["Other targets: " + ", ".join(f'`target="{name}"`' for name in list(report.targets)[1:]), ""]
    lines += [
        "<details><summary>Export report (parity, sizes, provenance)</summary>",
        "",
        report_markdown(report).rstrip("\n"),
        "",
        "</details>",
        END,
    ]
    return "\n".join(lines)


def _short(text: str, limit: int = 200) -> str:
    text = " ".join(str(text).split())
    return text if len(text) <= limit else text[: limit - 1] + "…"


def replace_section(body: str, section: str) -> str:
    """`body` with the marked section replaced by `section` (appended when absent); nothing else changes."""
    newline = "\r\n" if "\r\n" in body else "\n"
    section = section.replace("\r\n", "\n").replace("\n", newline)
    start = body.find(START)
    end = body.find(END, start + len(START)) if start >= 0 else -1
    if start >= 0 and end >= 0:
        if body.find(START, start + len(START), end) >= 0 or body.find(START, end) >= 0:
            raise CardError(f"README.md holds more than one `{START}`: keep one hfexport section")
        return body[:start] + section + body[end + len(END):]
    if start >= 0 or body.find(END) >= 0:
        raise CardError(f"README.md has one of `{START}` / `{END}` without the other: fix the card first")
    if not body:
        return section + newline
    separator = newline if body.endswith(newline) else newline * 2  # one blank line before the section
    return body + separator + section + newline


def update_card(original: str | None, section: str, tags: list[str]) -> str:
    """The README text with the hfexport section set and `tags` present in the card metadata."""
    from huggingface_hub import ModelCard

    logger = logging.getLogger("huggingface_hub.repocard")
    level = logger.level
    logger.setLevel(logging.ERROR)  # "metadata block was not found" is expected for a card without YAML
    try:
        card = ModelCard(original or "", ignore_metadata_errors=True)
    finally:
        logger.setLevel(level)
    body = card.text
    new_body = replace_section(body, section)
    existing = list(card.data.tags or [])
    merged = existing + [tag for tag in tags if tag not in existing]
    if original and merged == existing:
        return original[: len(original) - len(body)] + new_body  # header bytes untouched
    card.data.tags = merged
    card.text = new_body
    return card.content



def _latency_lines(report: JobReport) -> list[str]:
    """Which format is fastest where the job ran: the latency chart (hfexport.latency), shown outside the details."""
    section = latency_markdown(report)
    return ["", section] if section else []
