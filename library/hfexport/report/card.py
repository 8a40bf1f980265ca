"""The model card section hfexport maintains in a repo's README.md, between `<!-- hfexport:start -->` and
`<!-- hfexport:end -->`: targets and their folders, formats, sizes, parity, how to load each target with each loader
that reads it, format tags, and `base_model` for a publication into another repo.

The card is parsed and its metadata edited with huggingface_hub's `ModelCard`. Text outside the markers is kept
byte for byte: the section is replaced in place (or appended once), and the YAML header is re-written only when
a format tag has to be added (then its other keys are kept, though the YAML layout is huggingface_hub's).
"""

from __future__ import annotations

import logging
import re
from pathlib import PurePath

from hfexport.errors import CardError
from hfexport.files import EXPORTS_DIR, human_bytes
from hfexport.formats import find_format, format_traits, formats
from hfexport.formats.backend import CardTarget
from hfexport.latency import latency_markdown
from hfexport.layout import DEFAULT_NAMES, Place, format_label
from hfexport.report.markdown import report_markdown, verified_on_line
from hfexport.report.data import JobReport, TargetReport

START = "<!-- hfexport:start -->"
END = "<!-- hfexport:end -->"
PARITY = {True: "✅ passed", False: "❌ failed", None: "— not verified"}
#: The card's sections of the ecosystem's loaders, in order: the loader (`FormatBackend.loading_snippets`' key), the
#: section's heading, its code block's language and opening lines, and the lines between two formats' code.
LOADER_SECTIONS = (
    ("sentence-transformers", "sentence-transformers:", "python",
     ("from sentence_transformers import SentenceTransformer", ""), ()),
    ("optimum", "optimum (optimum-onnx / optimum-intel):", "python", (), ()),
    ("transformers.js", "transformers.js (`dtype` picks the file in `onnx/`: `q8` is `model_quantized.onnx`; weights in "
     "`*.onnx_data`, hence `use_external_data_format`):", "js",
     ('import { pipeline } from "@huggingface/transformers";', ""), ()),
    ("plain", "Plain ONNX Runtime / OpenVINO:", "python", (), ("",)),
)


def format_tags(reports: dict[str, TargetReport]) -> list[str]:
    """`hfexport` plus one tag per exported format (`onnx`, `openvino`, `executorch`, `torch-export`)."""
    tags = ["hfexport"]
    for report in reports.values():
        tag = find_format(report.export_format).hub_tag if find_format(report.export_format) else report.export_format
        if tag not in tags:
            tags.append(tag)
    return tags


def _parity(report: TargetReport) -> str:
    if report.status == "failed":
        return PARITY[False]
    verification = report.verification or None
    return PARITY[None if verification is None else bool(verification.get("passed"))]


def _places(report: JobReport, folders: dict[str, str | Place] | None) -> dict[str, Place]:
    places = {}
    for name in report.targets:
        where = (folders or {}).get(name) or f"{EXPORTS_DIR}/{name}"
        places[name] = where if isinstance(where, Place) else Place(where)
    return places


def artifact_path(place: Place, export_format: str) -> str:
    """The repo path of a target's (one-component) artifact: `onnx/model.onnx`, `onnx/model_quantized.onnx`."""
    default = DEFAULT_NAMES.get(export_format, "model")
    name = f"{place.stem}.{default.rsplit('.', 1)[-1]}" if place.stem else default
    return f"{place.folder}/{name}"


def render_section(repo_id: str, report: JobReport, folders: dict[str, str | Place] | None = None,
                   left_out: dict[str, str] | None = None, stale: dict[str, str] | None = None) -> str:
    """The Markdown between the markers (markers included) for the targets of `report`, published in `repo_id`
    at `folders` (target -> folder or `layout.Place`; default `exports/<target>`, the layout of older publications);
    `left_out` lists targets that were not published, with the reason; `stale` targets built from an older source,
    with it."""
    places = _places(report, folders)
    stale = stale or {}
    lines = [
        START,
        "## Exported artifacts",
        "",
        (f"Exported by hfexport {report.hfexport_version} from {recipe_origin(report)}. Each target is where the usual "
        "loaders look for its format, under the file name they use for what it is (`model.onnx`, "
        "`model_quantized.onnx`, ...); hfexport's manifest (`export.json`), recipe copy (`export_config.json`) and "
        "report (`export_report.json`) sit beside the files (a variant's named after it: "
        "`model_quantized.export.json`)."),
        "",
        "| target | folder | format | mode | files | size | parity |",
        "|---|---|---|---|---|---|---|",
    ]
    for name, target in report.targets.items():
        size = sum(entry["bytes"] for entry in target.files)
        parity = _parity(target) + (f" ⚠️ stale: {stale[name]}" if name in stale else "")
        place = places[name]
        where = artifact_path(place, target.export_format) if place.stem else place.folder
        shown = where if place.stem else f"{where}/"
        lines.append(
            f"| `{name}` | [`{shown}`]({where}) | {format_label(target.export_format)} | {target.mode} "
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
    lines += ["", "### Loading", ""] + loading_snippets(repo_id, report, places)
    lines += [
        "<details><summary>Export report (parity, sizes, provenance)</summary>",
        "",
        report_markdown(report, publication=True).rstrip("\n"),
        "",
        "</details>",
        END,
    ]
    return "\n".join(lines)


def _task(target: TargetReport) -> str | None:
    return (target.plan or {}).get("task")


def card_target(name: str, target: TargetReport, place: Place) -> CardTarget:
    """A published target as its format's loading snippets see it."""
    return CardTarget(name, place.folder, place.stem, artifact_path(place, target.export_format), _task(target),
                      tuple(str(entry.get("path", "")) for entry in target.files))


def _forward(report: JobReport, places: dict[str, Place], export_format: str) -> list[CardTarget]:
    """The forward targets of `export_format`, with their places, default targets first."""
    found = [card_target(name, target, places[name]) for name, target in report.targets.items()
             if target.export_format == export_format and target.mode == "forward"]
    return sorted(found, key=lambda target: (target.stem is not None, target.name))


def recipe_origin(report: JobReport) -> str:
    """Where the job's recipe came from, in words, with its hash: the repo's own, one hfexport proposed (the repo has
    none), one edited in the Space, or another given to the job."""
    source = report.source or {}
    digest = f"sha256 `{str(source.get('recipe_sha256', ''))[:12]}`"
    origin, where = source.get("recipe_origin"), str(source.get("recipe_source") or "")
    if origin == "proposed":
        return f"a recipe hfexport proposed for this model, which has none yet ({digest})"
    if origin == "edited":
        return f"a recipe edited in the hfexport Space, not the recipe in the repo ({digest})"
    model = str(source.get("model") or "")
    own = model and (where.startswith((model.rstrip("/") + "/", model.rstrip("/") + "@"))
                     or PurePath(where).parent == PurePath(model))  # a Hub repo's file, or a local folder's
    if own:
        return f"this repo's export recipe (`{where.rsplit('/', 1)[-1]}`, {digest})"
    if where and where != "<dict>":
        return f"the recipe `{where}`, not the repo's ({digest})"
    return f"a recipe given to the exporter, not the repo's ({digest})"


def loading_snippets(repo_id: str, report: JobReport, folders: dict[str, str | Place]) -> list[str]:
    """How to load the published targets with each loader that reads them (tests/test_ecosystem_clients.py runs
    these loaders on a publication): hfexport, sentence-transformers, optimum, transformers.js, plain ONNX Runtime /
    OpenVINO; and, for generation targets, why the ecosystem's decoder loaders cannot open them. A variant
    (`onnx/model_quantized.onnx`) is opened by its file name: sentence-transformers' `file_name`, optimum's
    `file_name`, transformers.js' `dtype` (or `model_file_name`)."""
    places = _places(report, folders)
    lines: list[str] = []
    names = list(report.targets)
    first = names[0] if names else "TARGET"
    lines += ["hfexport (any target; the manifest is checked before anything is loaded):", "", "```python",
              "import hfexport", "",
              f'model = hfexport.load("{repo_id}", target="{first}")', "```", ""]
    if len(names) > 1:
        lines += ["Other targets: " + ", ".join(f'`target="{name}"`' for name in names[1:]), ""]
    forward = {backend.name: _forward(report, places, backend.name) for backend in formats()}
    for loader, heading, language, opening, between in LOADER_SECTIONS:
        code: list[str] = []
        for backend in formats():
            found = backend.loading_snippets(loader, repo_id, forward[backend.name])
            if found:
                code += (list(between) if code else []) + found
        if code:
            lines += [heading, "", f"```{language}", *opening, *code, "```", ""]
    lines += runtime_snippets(repo_id, report, places)
    generation = [name for name, target in report.targets.items()  # in the engine's layout, not the loaders'
                  if target.mode == "generation" and not _passed_runtimes(target)
                  and not any(str(entry.get("path", "")).endswith(format_traits(target.export_format).contract_files)
                              for entry in target.files)]
    if generation:
        lines += [", ".join(f"`{name}`" for name in generation) + " hold the engine's generation graphs (a prefill "
                  "and a decode, or with `generation.single_graph` one decode that also runs the prompt; cache tensors "
                  "named `past_key_values.layers.N.keys`): optimum's `ORTModelForCausalLM` / "
                  "`OVModelForCausalLM` and transformers.js load one merged decoder (`model.onnx`, "
                  "`decoder_model_merged.onnx`, `openvino_model.xml`) with `past_key_values.N.key` inputs, which these "
                  "graphs are not, so load them with `hfexport.load(...).generate(...)`. A forward target of a "
                  "decoder loads with `ORTModelForCausalLM` / `OVModelForCausalLM` and `use_cache=False`.", ""]
    return lines


def _passed_runtimes(target: TargetReport) -> list[str]:
    return [check["runtime"] for check in (target.runtimes or []) if check.get("verdict") == "passed"]


def runtime_snippets(repo_id: str, report: JobReport, places: dict[str, Place]) -> list[str]:
    """For each generation target, loading snippets of the deployment runtimes that generated `model.generate`'s
    tokens from its files in the gate (its report's `runtimes`), and of those only (README's section shows them);
    each format writes its runtimes' (`FormatBackend.runtime_snippets`)."""
    lines: list[str] = []
    for name, target in report.targets.items():
        passed = _passed_runtimes(target)
        if target.mode != "generation" or not passed:
            continue
        lines += [f"`{name}` generated `model.generate`'s tokens in {', '.join(passed)} (hfexport's gate):", ""]
        lines += format_traits(target.export_format).runtime_snippets(repo_id, card_target(name, target, places[name]),
                                                                      passed)
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
    into another repo than the model's, `base_model` (the Hub links derivatives by it). Bytes outside the section are
    kept exactly (CRLF included); so is every line of the owner's YAML header: what is missing is added as lines
    (`header_with`), and only a header that cannot be edited that way is rewritten by huggingface_hub's `ModelCard`."""
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
    missing = [tag for tag in tags if tag not in existing]
    add_base = bool(base_model) and not card.data.get("base_model")
    header = original[: len(original) - len(body)] if original else ""
    if original and not missing and not add_base:
        return header + new_body  # header bytes untouched
    card.data.tags = existing + missing
    if add_base:
        card.data.base_model = base_model
    edited = header_with(header, missing, base_model if add_base else None)
    if edited is not None and _metadata(edited) == card.data.to_dict():
        if new_body and not edited.endswith(("\n", "\r")):  # a README that ends at its closing `---`
            edited += "\r\n" if "\r\n" in edited else "\n"
        return edited + new_body
    card.text = new_body
    return card.content


_BLOCK_KEY = re.compile(r"^tags:[ \t]*(#.*)?$")  # `tags:` opening a block list (nothing after the colon)
_ITEM = re.compile(r"^([ \t]*)-([ \t]|$)")
_PLAIN = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._/+-]*$")


def header_with(header: str, tags: list[str], base_model: str | None) -> str | None:
    """`header` (the README's YAML block, `---` lines included) with `tags` appended to its block-style `tags:` list
    (in that list's indentation) or, without a `tags:` key, as a new `tags:` list at its end, and `base_model: ...`
    at its end; every existing line kept byte for byte, line endings the header's own. None when the header cannot
    be edited that way: no header, a flow-style (`tags: [a, b]`) or scalar `tags:`, more than one `tags:` key."""
    from huggingface_hub.repocard import REGEX_YAML_BLOCK

    match = REGEX_YAML_BLOCK.search(header)
    if not match or match.end() != len(header):
        return None
    newline = "\r\n" if "\r\n" in header else "\r" if "\r" in header and "\n" not in header else "\n"
    lines = match.group(2).splitlines(keepends=True)
    closing = match.group(3)  # the line break ending the last YAML line, then `---` and its own line break
    if lines:
        brk = closing[:2] if closing.startswith("\r\n") else closing[:1]
        lines[-1] += brk
        closing = closing[len(brk):]
    keys = [index for index, line in enumerate(lines) if line.startswith("tags:")]
    if len(keys) > 1 or keys and not _BLOCK_KEY.match(lines[keys[0]].rstrip("\r\n")):
        return None
    added = []
    if tags and keys:
        last, indent = keys[0], "- "
        for index in range(keys[0] + 1, len(lines)):
            text = lines[index].rstrip("\r\n")
            item = _ITEM.match(text)
            if item:
                last, indent = index, item.group(1) + "-" + (item.group(2) or " ")
            elif not text.strip() or not text[:1].isspace():
                break
            else:
                last = index
        indent = indent if indent.endswith((" ", "\t")) else indent + " "
        lines[last + 1:last + 1] = [f"{indent}{_scalar(tag)}{newline}" for tag in tags]
    elif tags:
        added += [f"tags:{newline}"] + [f"- {_scalar(tag)}{newline}" for tag in tags]
    if base_model:
        added.append(f"base_model: {_scalar(base_model)}{newline}")
    return match.group(1) + "".join(lines + added) + closing


def _scalar(value: str) -> str:
    """A YAML scalar for a tag or repo id: plain where that reads back as the same string, else JSON-quoted."""
    import json

    return value if _PLAIN.match(value) and value.lower() not in ("true", "false", "null", "yes", "no", "on", "off",
                                                                  "~") else json.dumps(value)


def _metadata(header: str) -> dict | None:
    """The card metadata huggingface_hub reads from a header (what ModelCard would give), or None when unreadable."""
    from huggingface_hub import ModelCard

    try:
        return ModelCard(header, ignore_metadata_errors=True).data.to_dict()
    except Exception:  # noqa: BLE001 - an edit that does not parse is rejected (the rewrite is used instead)
        return None


def _latency_lines(report: JobReport) -> list[str]:
    """Which format is fastest where the job ran: the latency chart (hfexport.latency), shown outside the details;
    never figures of an unreliable measurement."""
    section = latency_markdown(report, publication=True)
    return ["", section] if section else []
