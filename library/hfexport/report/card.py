"""The model card section hfexport maintains in a repo's README.md, between `<!-- hfexport:start -->` and
`<!-- hfexport:end -->`: targets and their folders, formats, sizes, parity, how to load each target with each loader
that reads it, format tags, and `base_model` for a publication into another repo.

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


def render_section(repo_id: str, report: JobReport, folders: dict[str, str] | None = None,
                   left_out: dict[str, str] | None = None, stale: dict[str, str] | None = None) -> str:
    """The Markdown between the markers (markers included) for the targets of `report`, published in `repo_id`
    at `folders` (target -> folder; default `exports/<target>`, the layout of older publications); `left_out` lists
    targets that were not published, with the reason; `stale` targets built from an older source, with it."""
    folders = {name: (folders or {}).get(name) or f"{EXPORTS_DIR}/{name}" for name in report.targets}
    stale = stale or {}
    lines = [
        START,
        "## Exported artifacts",
        "",
        f"Exported by hfexport {report.hfexport_version} from this repo's export recipe. Each target is a folder "
        "where the usual loaders look for its format; hfexport's manifest (`export.json`), recipe copy "
        "(`export_config.json`) and report (`export_report.json`) sit beside the files.",
        "",
        "| target | folder | format | mode | files | size | parity |",
        "|---|---|---|---|---|---|---|",
    ]
    for name, target in report.targets.items():
        size = sum(entry["bytes"] for entry in target.files)
        parity = _parity(target) + (f" ⚠️ stale: {stale[name]}" if name in stale else "")
        lines.append(
            f"| `{name}` | [`{folders[name]}/`]({folders[name]}) | {target.export_format} | {target.mode} "
            f"| {len(target.files)} | {human_bytes(size)} | {parity} |"
        )
    if stale:
        lines += ["", "Stale (built from an older revision of the model; re-export to refresh): "
                  + "; ".join(f"`{name}`: {why}" for name, why in stale.items())]
    if left_out:
        lines += ["", "Not published (did not pass verification): "
                  + "; ".join(f"`{name}`: {_short(why)}" for name, why in left_out.items())]
    verified_on = verified_on_line(report)
    if verified_on:
        lines += ["", verified_on]
    lines += _latency_lines(report)
    lines += ["", "### Loading", ""] + loading_snippets(repo_id, report, folders)
    lines += [
        "<details><summary>Export report (parity, sizes, provenance)</summary>",
        "",
        report_markdown(report).rstrip("\n"),
        "",
        "</details>",
        END,
    ]
    return "\n".join(lines)


def _task(target: TargetReport) -> str | None:
    return (target.plan or {}).get("task")


def _first(report: JobReport, folders: dict[str, str], export_format: str, tasks: tuple[str, ...] | None = None):
    """The first forward target of `export_format` (and one of `tasks`), with its folder, or (None, None)."""
    for name, target in report.targets.items():
        if target.export_format == export_format and target.mode == "forward" and (
                tasks is None or _task(target) in tasks):
            return name, folders[name]
    return None, None


EMBEDDING_TASKS = ("feature-extraction", "sentence-similarity")
CAUSAL_TASKS = ("text-generation",)


def loading_snippets(repo_id: str, report: JobReport, folders: dict[str, str]) -> list[str]:
    """How to load the published targets with each loader that reads them (tests/test_ecosystem_clients.py runs
    these loaders on a publication): hfexport, sentence-transformers, optimum, transformers.js, plain ONNX Runtime /
    OpenVINO; and, for generation targets, why the ecosystem's decoder loaders cannot open them."""
    lines: list[str] = []
    names = list(report.targets)
    first = names[0] if names else "TARGET"
    lines += ["hfexport (any target; the manifest is checked before anything is loaded; a pull request: "
              '`revision="refs/pr/N"`):', "", "```python", "import hfexport", "",
              f'model = hfexport.load("{repo_id}", target="{first}")', "```", ""]
    if len(names) > 1:
        lines += ["Other targets: " + ", ".join(f'`target="{name}"`' for name in names[1:]), ""]
    onnx_name, onnx_folder = _first(report, folders, "onnx", EMBEDDING_TASKS)
    ov_name, ov_folder = _first(report, folders, "openvino", EMBEDDING_TASKS)
    if onnx_name or ov_name:
        lines += ["sentence-transformers:", "", "```python", "from sentence_transformers import SentenceTransformer", ""]
        if onnx_name:
            extra = "" if onnx_folder == "onnx" else f', model_kwargs={{"file_name": "{onnx_folder}/model.onnx"}}'
            lines.append(f'model = SentenceTransformer("{repo_id}", backend="onnx"{extra})')
        if ov_name:
            extra = "" if ov_folder == "openvino" else \
                f', model_kwargs={{"file_name": "{ov_folder}/openvino_model.xml"}}'
            lines.append(f'model = SentenceTransformer("{repo_id}", backend="openvino"{extra})')
        lines += ["```", ""]
    optimum = []
    for export_format, module, prefix in (("onnx", "optimum.onnxruntime", "ORTModel"), ("openvino", "optimum.intel", "OVModel")):
        for tasks, suffix, kwargs in ((EMBEDDING_TASKS, "ForFeatureExtraction", ""),
                                      (CAUSAL_TASKS, "ForCausalLM", ", use_cache=False")):
            name, folder = _first(report, folders, export_format, tasks)
            if name:
                optimum += [f"from {module} import {prefix}{suffix}",
                            f'model = {prefix}{suffix}.from_pretrained("{repo_id}", subfolder="{folder}"{kwargs})']
    if optimum:
        lines += ["optimum (optimum-onnx / optimum-intel):", "", "```python", *optimum, "```", ""]
    if onnx_name:
        sub = "" if onnx_folder == "onnx" else f', subfolder: "{onnx_folder}"'
        lines += ["transformers.js (the weights are in `model.onnx_data`, hence `use_external_data_format`):", "",
                  "```js", 'import { pipeline } from "@huggingface/transformers";', "",
                  f'const extractor = await pipeline("feature-extraction", "{repo_id}", '
                  f'{{ dtype: "fp32", use_external_data_format: true{sub} }});', "```", ""]
    plain = []
    name, folder = _first(report, folders, "onnx")
    if name:
        plain += ["import onnxruntime as ort", "from huggingface_hub import snapshot_download", "",
                  f'local = snapshot_download("{repo_id}", allow_patterns=["{folder}/*"])',
                  f'session = ort.InferenceSession(f"{{local}}/{folder}/model.onnx")']
    name, folder = _first(report, folders, "openvino")
    if name:
        plain += ([""] if plain else []) + [
            "import openvino as ov", "from huggingface_hub import snapshot_download", "",
            f'local = snapshot_download("{repo_id}", allow_patterns=["{folder}/*"])',
            f'compiled = ov.Core().compile_model(f"{{local}}/{folder}/openvino_model.xml", "CPU")']
    if plain:
        lines += ["Plain ONNX Runtime / OpenVINO:", "", "```python", *plain, "```", ""]
    generation = [name for name, target in report.targets.items() if target.mode == "generation"]
    if generation:
        lines += [", ".join(f"`{name}`" for name in generation) + " hold the engine's separate prefill and decode "
                  "graphs (cache tensors named `past_key_values.layers.N.keys`): optimum's `ORTModelForCausalLM` / "
                  "`OVModelForCausalLM` and transformers.js load one merged decoder (`model.onnx`, "
                  "`decoder_model_merged.onnx`, `openvino_model.xml`) with `past_key_values.N.key` inputs, which these "
                  "graphs are not, so load them with `hfexport.load(...).generate(...)`. A forward target of a "
                  "decoder loads with `ORTModelForCausalLM` / `OVModelForCausalLM` and `use_cache=False`.", ""]
    return lines


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


def update_card(original: str | None, section: str, tags: list[str], base_model: str | None = None) -> str:
    """The README text with the hfexport section set, `tags` present in the card metadata and, for a publication
    into another repo than the model's, `base_model` (the Hub links derivatives by it). Bytes outside the section
    and an unchanged YAML header are kept exactly (CRLF included)."""
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
    add_base = bool(base_model) and not card.data.get("base_model")
    if original and merged == existing and not add_base:
        return original[: len(original) - len(body)] + new_body  # header bytes untouched
    card.data.tags = merged
    if add_base:
        card.data.base_model = base_model
    card.text = new_body
    return card.content



def _latency_lines(report: JobReport) -> list[str]:
    """Which format is fastest where the job ran: the latency chart (hfexport.latency), shown outside the details."""
    section = latency_markdown(report)
    return ["", section] if section else []
