"""What the Gradio Space does, without Gradio: so `space/app.py` stays a thin layout and this stays unit-testable.

The Space holds no export logic. It reads a repo's recipe (`recipe.load_recipe`), proposes one when there is
none (`job.propose`), runs jobs (`job.run_job`), publishes them (`publish.publish`) and renders the report's Markdown.

What it adds around those calls for a multi-user web page (workspaces, the job runner, failures, the recipe
editor's checks, Jobs, quantized variants, the recipe's pull request, the visitor's samples): docs/space.md, "The
Space's logic, without Gradio".
"""

from __future__ import annotations

import contextlib
import json
import os
import re
import shlex
import shutil
import threading
import time
import uuid
import zipfile
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from hfexport.errors import (
    HfExportError,
    Problem,
    PublishError,
    RecipeError,
    RecipeNotFoundError,
    first_line,
    redact,
    register_secret,
)
from hfexport.files import RECIPE_FILE, human_bytes
from hfexport.hub import HubRepo, looks_like_repo_id, marker_line, search_models
from hfexport.job import propose
from hfexport.job.dispatch import TERMINAL, HfJobs, estimate_memory, job_result, job_steps
from hfexport.job.preflight import available_memory
from hfexport.plan.dry import model_problems, warm_up
from hfexport.progress import Step
from hfexport.publication.publish import find_open_publication, publish
from hfexport.recipe.loading import CONFIG_FIELD, CONFIG_FILE, load_recipe, model_config
from hfexport.recipe.data import Recipe, recipe_from_document
from hfexport.recipe.validation import canonical_json, config_problems, json_path, parse_recipe_text
from hfexport.report.data import JobReport
from hfexport.report.markdown import memory_line
from hfexport.samples import KINDS, SampleFile, display_name, processor_kinds, read_sample
from hfexport.surfaces.failure import Failure, SpaceError, md_escape, report_failure
from hfexport.surfaces.worker import JobWorker, settings_from

GRADIO_MOCK_OAUTH_TOKEN = "mock-oauth-token-for-local-dev"
RECIPE_PR_TITLE = "Add an hfexport export recipe (export_config.json)"
RECIPE_PR_KIND = "recipe-proposal"
RECIPE_PR_MARKER = marker_line(RECIPE_PR_KIND)  # "<!-- hfexport:recipe-proposal -->"


# ── Settings ─────────────────────────────────────────────────────────────────


@dataclass
class SpaceSettings:
    """Operational limits of one Space process; `from_env` reads the `HFEXPORT_SPACE_*` variables."""

    workdir: Path
    queue_size: int = 8  # waiting Convert requests beyond the running one; more are refused with "queue full"
    session_ttl_s: float = 3600.0  # a session's artifacts are removed this long after its last job at the latest
    verify: bool = True
    keep_downloads: bool = False  # False: a model's downloaded weights leave the Hub cache after its job
    use_hf_token_for_mock_login: bool = False  # local runs against a real Hub: see `hub_token`
    job_timeout_s: float = 3600.0  # a job running longer is stopped (its process killed) and reported
    jobs_image: str | None = None  # "Run on my Hugging Face Jobs": an image with hfexport (default: this Space)
    jobs_timeout: str = "2h"  # the Hub stops a user's Job that runs longer
    jobs_poll_s: float = 5.0  # how often the page asks the Job's state and logs

    @classmethod
    def from_env(cls, environ: dict | None = None) -> SpaceSettings:
        env = os.environ if environ is None else environ
        import tempfile

        workdir = Path(env.get("HFEXPORT_SPACE_WORKDIR") or Path(tempfile.gettempdir()) / "hfexport-space")
        return cls(
            workdir=workdir,
            queue_size=int(env.get("HFEXPORT_SPACE_QUEUE_SIZE", "8")),
            session_ttl_s=float(env.get("HFEXPORT_SPACE_SESSION_TTL_S", "3600")),
            verify=env.get("HFEXPORT_SPACE_VERIFY", "1") != "0",
            keep_downloads=env.get("HFEXPORT_SPACE_KEEP_DOWNLOADS", "0") == "1",
            use_hf_token_for_mock_login=env.get("HFEXPORT_SPACE_USE_HF_TOKEN", "0") == "1",
            job_timeout_s=float(env.get("HFEXPORT_SPACE_JOB_TIMEOUT_S", "3600")),
            jobs_image=env.get("HFEXPORT_SPACE_JOBS_IMAGE") or (f"hf.co/spaces/{env['SPACE_ID']}"
                                                               if env.get("SPACE_ID") else None),
            jobs_timeout=env.get("HFEXPORT_SPACE_JOBS_TIMEOUT", "2h"),
            jobs_poll_s=float(env.get("HFEXPORT_SPACE_JOBS_POLL_S", "5")),
        )


def hub_token(oauth_token: str | None, settings: SpaceSettings) -> str | None:
    """The token every Hub call of a session uses: the signed-in user's OAuth token, never the Space's own.

    Outside a Space, Gradio mocks the login and injects `mock-oauth-token-for-local-dev`; the local test Hub
    accepts it. Against another endpoint, `HFEXPORT_SPACE_USE_HF_TOKEN=1` swaps it for the developer's HF_TOKEN.
    """
    if not oauth_token:
        return None
    if oauth_token == GRADIO_MOCK_OAUTH_TOKEN and settings.use_hf_token_for_mock_login and not os.environ.get("SPACE_ID"):
        oauth_token = os.environ.get("HF_TOKEN") or oauth_token
    register_secret(oauth_token)
    return oauth_token


def local_sign_in_problem() -> str | None:
    """Outside a Space, Gradio mocks "Sign in with Hugging Face" with the machine's own login and raises at launch
    when there is none (a traceback for a new user). None when sign-in can work here, else the sentence to print:
    the Space then starts signed out (recipes can be loaded and checked)."""
    if os.environ.get("SPACE_ID"):
        return None  # a real Space: OAuth
    from huggingface_hub import get_token, whoami

    token = get_token()
    if not token:
        return ("no Hugging Face login on this machine, so the Space starts signed out (load and check recipes "
                "only): set HF_TOKEN=hf_... (or run `hf auth login`) to sign in, convert and open pull requests")
    register_secret(token)
    try:
        user = whoami(token=token)
    except Exception as error:  # noqa: BLE001 - any failure means Gradio's mocked sign-in would fail too
        endpoint = os.environ.get("HF_ENDPOINT", "https://huggingface.co")
        return (f"HF_TOKEN was not accepted by {endpoint} ({redact(first_line(str(error)) or type(error).__name__)}),"
                " so the Space starts signed out (load and check recipes only)")
    if user.get("type") != "user":
        return "HF_TOKEN belongs to an organisation, not a user, so the Space starts signed out"
    return None


# ── Input checks ─────────────────────────────────────────────────────────────


def check_model_id(model_id: str | None) -> str:
    """A Hub repo id (`name` or `namespace/name`). Local paths are refused: the Space only reads from the Hub."""
    model_id = (model_id or "").strip()
    if not model_id:
        raise SpaceError("Missing model", "enter a model repo id, e.g. `org/model`")
    if not looks_like_repo_id(model_id) or Path(model_id).exists():
        raise SpaceError("Invalid model id", f"{model_id!r} is not a Hub repo id (expected `org/model`)")
    return model_id


def check_revision(revision: str | None) -> str | None:
    revision = (revision or "").strip()
    if not revision:
        return None
    if len(revision) > 200 or any(char.isspace() for char in revision) or ".." in revision:
        raise SpaceError("Invalid revision", f"{revision!r} is not a branch, tag, commit or refs/pr/N")
    return revision


def require_token(token: str | None, action: str) -> str:
    if not token:
        raise SpaceError("Sign in required", f"sign in with Hugging Face to {action}")
    return token


# ── Reproducing commands ─────────────────────────────────────────────────────


def _command(*parts: str | None) -> str:
    return " ".join(shlex.quote(part) for part in parts if part)


def validate_command(model: str, revision: str | None = None) -> str:
    return _command("hfexport", "validate", model, *(("--revision", revision) if revision else ()))


def export_command(model: str, revision: str | None = None, targets: Sequence[str] = (), *,
                   edited_recipe: bool = False, push: bool = False, samples: dict[str, str] | None = None) -> str:
    """The `hfexport export` line that runs the same job locally (`--recipe` when the editor's recipe was used,
    `--sample-image NAME` / `--sample-audio NAME` with the name of the visitor's sample file)."""
    parts = ["hfexport", "export", model]
    if revision:
        parts += ["--revision", revision]
    for target in targets:
        parts += ["--target", target]
    if edited_recipe:
        parts += ["--recipe", RECIPE_FILE]
    for kind, name in (samples or {}).items():
        parts += [f"--sample-{kind}", name]
    parts += ["-o", "out"]
    if push:
        parts += ["--push", "--pr"]
    return _command(*parts)


def init_command(model: str, formats: Sequence[str] = (), revision: str | None = None) -> str:
    parts = ["hfexport", "init", model]
    if revision:
        parts += ["--revision", revision]
    for export_format in formats:
        parts += ["--format", export_format]
    return _command(*parts, "-o", RECIPE_FILE)


# ── Recipe editor ────────────────────────────────────────────────────────────


def pretty_json(document: Any) -> tuple[str, dict[str, int]]:
    """`json.dumps(document, indent=2)` and the line on which each JSON path (as `json_path` spells it) starts."""
    lines: list[str] = []
    where: dict[str, int] = {}

    def emit(value: Any, path: list, prefix: str, suffix: str, indent: str) -> None:
        where.setdefault(json_path(path), len(lines))
        items = list(value.items()) if isinstance(value, dict) else list(enumerate(value)) if isinstance(value, list) else None
        if not items:
            lines.append(f"{indent}{prefix}{json.dumps(value, ensure_ascii=False)}{suffix}")
            return
        opening, closing = ("{", "}") if isinstance(value, dict) else ("[", "]")
        lines.append(f"{indent}{prefix}{opening}")
        for index, (key, item) in enumerate(items):
            key_prefix = f"{json.dumps(key, ensure_ascii=False)}: " if isinstance(value, dict) else ""
            emit(item, [*path, key], key_prefix, "," if index < len(items) - 1 else "", indent + "  ")
        lines.append(f"{indent}{closing}{suffix}")

    emit(document, [], "", "", "")
    return "\n".join(lines) + "\n", where


def _locate(path: str, where: dict[str, int]) -> int:
    """The line of `path`, or of its deepest ancestor present in the document (a missing key is its parent's)."""
    candidate = path
    while candidate not in where and candidate not in ("", "$"):
        candidate = candidate.rpartition(".")[0] or "$"
    return where.get(candidate, 0)


@dataclass
class RecipeCheck:
    """The result of validating the editor's text: valid or not, problems with JSON paths and line numbers."""

    text: str
    recipe: Recipe | None = None
    problems: list[Problem] = field(default_factory=list)
    lines: dict[int, list[Problem]] = field(default_factory=dict)  # 0-based line of the pretty text -> problems
    pretty: str | None = None
    parsed: bool = False
    syntax_line: int | None = None  # 0-based line of a JSON syntax error in `text`, as the parser reported it

    @property
    def valid(self) -> bool:
        return self.recipe is not None

    @property
    def targets(self) -> list[str]:
        return self.recipe.target_names if self.recipe else []

    @property
    def document(self) -> Any:
        return self.recipe.document if self.recipe else None

    def markdown(self) -> str:
        if self.valid:
            names = ", ".join(f"`{name}`" for name in self.targets)
            return f"✓ **Valid recipe**: targets {names} (default `{self.recipe.default_target}`)"
        count = len(self.problems)
        lines = [f"✗ **Invalid recipe**: {count} problem{'s' if count != 1 else ''}", ""]
        for problem in self.problems:
            line = next((number for number, found in self.lines.items() if problem in found), None)
            at = f" (line {line + 1})" if line is not None and (self.parsed or self.syntax_line is not None) else ""
            lines.append(f"- `{problem.path}`{at}: {md_escape(problem.message)}")
        return "\n".join(lines)

    def highlighted(self, context: int | None = None) -> list[tuple[str, str | None]]:
        """The recipe as (text, label) segments, each line with its number: each problem's line labelled with its
        JSON path (a syntax error's line, in the text as typed, with "JSON syntax").

        With `context`, only the lines within `context` lines of a problem are kept (gaps become `…`); a recipe
        that cannot be parsed and has no located line shows nothing (its problem is in the status).
        """
        source = self.pretty if self.pretty is not None else self.text if self.syntax_line is not None else None
        if source is None:
            return []
        lines = source.splitlines()
        keep = set(range(len(lines)))
        if context is not None and self.lines:
            keep = {n for line in self.lines for n in range(line - context, line + context + 1) if 0 <= n < len(lines)}
        width = len(str(len(lines)))
        segments: list[tuple[str, str | None]] = []
        for number, line in enumerate(lines):
            if number not in keep:
                if number - 1 in keep or number == 0:
                    segments.append((f"{'…':>{width}}\n", None))
                continue
            found = self.lines.get(number)
            label = None
            if found:
                label = "; ".join(dict.fromkeys("JSON syntax" if p.path == "$" else p.path for p in found))
            segments.append((f"{number + 1:>{width}} │ {line}\n", label))
        return segments


def check_recipe_text(text: str | None, source: str = "editor", config: tuple[dict, str] | None = None) -> RecipeCheck:
    """Parse and validate recipe text (strict JSON, schema, semantics; with the model's `config`, (config.json as a
    dict, where it was read), its dims against what the model admits, and each target's mode and inputs against the
    model itself, built from that config without weights: `plan.dry`); never raises for bad input."""
    text = text or ""
    check = RecipeCheck(text=text)
    try:
        document = parse_recipe_text(text, source)
    except RecipeError as error:
        check.problems = list(error.problems)
        position = _SYNTAX_POSITION.search(check.problems[0].message) if check.problems else None
        if position and int(position.group(1)) <= len(text.splitlines()) + 1:
            check.syntax_line = min(int(position.group(1)), max(len(text.splitlines()), 1)) - 1
            check.lines = {check.syntax_line: list(check.problems)}
        return check
    check.parsed = True
    check.pretty, where = pretty_json(document)
    try:
        check.recipe = recipe_from_document(document, source)
        if config is not None:  # the model's own limits, and a dry plan against the model built from its config
            problems = config_problems(check.recipe.data, *config) + model_problems(check.recipe, *config)
            if problems:
                check.recipe = None
                raise RecipeError(problems, source)
    except RecipeError as error:
        check.problems = list(error.problems)
        for problem in check.problems:
            check.lines.setdefault(_locate(problem.path, where), []).append(problem)
    return check


def warm_up_live_check() -> None:
    """Import what `check_recipe_text`'s dry plan needs in the background (a server calls this at start)."""
    warm_up()


_SYNTAX_POSITION = re.compile(r"\(line (\d+), column (\d+)\)")


def recipe_text(recipe: Recipe) -> str:
    """A recipe as the editor shows it: the document as published, pretty-printed."""
    return pretty_json(recipe.document if recipe.document is not None else recipe.data)[0]


@dataclass
class FetchedRecipe:
    """A repo's recipe as the editor shows it; `check` is None when the repo has no recipe."""

    source: str
    text: str = ""
    check: RecipeCheck | None = None
    config: tuple[dict, str] | None = None  # the model's config.json (as a dict, where): dims are checked against it


def fetch_recipe(model: str, revision: str | None, token: str | None) -> FetchedRecipe:
    """Read `model`'s recipe from the Hub (only `export_config.json`/`config.json`) and validate it, its dims against
    the model's config.json (`config_problems`).

    An invalid recipe is not an error here: its text is returned with the problems located on its lines.
    Unknown repos and revisions raise `SourceError`. Signed out, reads are anonymous (never the Space's token).
    """
    read_token = token or False  # False: huggingface_hub must not fall back to a token of the Space itself
    at = f"{model}@{revision}" if revision else model
    try:
        recipe, invalid = load_recipe(model, revision=revision, token=read_token), None
    except RecipeNotFoundError:
        return FetchedRecipe(source=at)
    except RecipeError as error:
        recipe, invalid = None, error
    try:
        config = model_config(model, revision, read_token)
    except RecipeError:  # an unreadable config.json: the recipe is still checked on its own (the Hub failing raises)
        config = None
    if recipe is not None:
        check = check_recipe_text(recipe_text(recipe), recipe.source or at, config)
        return FetchedRecipe(source=recipe.source or at, text=check.pretty or check.text, check=check, config=config)
    raw = HubRepo(model, revision, read_token).read(RECIPE_FILE)
    source = f"{at}/{RECIPE_FILE}"
    if raw is None:  # the recipe is the `export_config` field of config.json
        source = f"{at}/{CONFIG_FILE} ({CONFIG_FIELD})"
        document = json.loads(HubRepo(model, revision, read_token).read(CONFIG_FILE) or b"{}")
        raw = pretty_json(document.get(CONFIG_FIELD))[0].encode() if isinstance(document, dict) else b""
    text = raw.decode("utf-8", errors="replace")
    check = check_recipe_text(text, source)
    if check.valid:  # cannot happen (same validator); keep the loader's verdict rather than guess
        check = RecipeCheck(text=text, problems=list(invalid.problems))
    return FetchedRecipe(source=source, text=check.pretty or text, check=check, config=config)


@dataclass
class Draft:
    """A recipe proposed for a model without one (`hfexport init`'s logic, without exporting)."""

    text: str
    check: RecipeCheck
    note: str | None = None


def draft_recipe(model: str, revision: str | None, formats: Sequence[str], token: str | None) -> Draft:
    """The recipe `hfexport init` would start from for `formats`, ready for the editor (validated)."""
    document = propose.propose_recipe(model, formats=list(formats), revision=revision, token=token or False)
    # init's description says every target was exported and verified, which `hfexport init` makes true; here the
    # draft is not exported yet (Convert does that, and `validated_with` records it: see `finalize_proposal`).
    document["description"] = f"Proposed by hfexport for {model}: the formats and settings its artifacts are made with."
    text = pretty_json(document)[0]
    check = check_recipe_text(text, "proposed recipe")
    note = None
    if check.valid:
        names = ", ".join(f"`{name}`" for name in check.targets)
        note = (f"✓ **Proposed recipe** for {', '.join(formats)}: targets {names}. It is not validated by an export "
                f"yet: **Convert** checks parity. Locally: `{init_command(model, formats, revision)}`.")
    return Draft(text=text, check=check, note=note)


def recipe_for_job(text: str | None, repo_recipe: str | None) -> tuple[dict | None, bool]:
    """The recipe a Convert runs: (None, False) for the repo's own, or (document, True) for the editor's.

    `repo_recipe` is the canonical JSON of the repo's valid recipe, when one was loaded. Raises `RecipeError`
    (with JSON paths) when the editor's text is not a valid recipe.
    """
    if not (text or "").strip():
        return None, False
    check = check_recipe_text(text)
    if not check.valid:
        raise RecipeError(check.problems, "editor")
    if repo_recipe is not None and canonical_json(check.document) == repo_recipe:
        return None, False
    return check.document, True


# ── The visitor's sample file ────────────────────────────────────────────────

PROCESSOR_FILES = ("processor_config.json", "preprocessor_config.json")
SAMPLE_LABELS = {"image": "Sample image", "audio": "Sample audio (WAV)"}
# The upload areas take any file (no Gradio `file_types`): Gradio refuses a type it was told to before any handler
# runs, with a toast, leaving the refused file shown beside the previous sample still kept for Convert. Every file
# reaches `check_sample`, which judges its content (not its name) and names it in one line.


def sample_kinds(model: str, revision: str | None, token: str | None) -> list[str]:
    """The sample kinds ("image", "audio") the model's processor takes, read from its saved processor files on the
    Hub (`hfexport.samples.processor_kinds`; nothing is loaded): the page offers an upload for each. [] when the
    files cannot be read (the upload is then not offered; the job itself still runs)."""
    documents = []
    for name in PROCESSOR_FILES:
        try:
            raw = HubRepo(model, revision, token or False).read(name)
            documents.append(json.loads(raw) if raw else None)
        except (HfExportError, ValueError):
            continue
    return processor_kinds(documents)


def check_sample(path: str | Path | None, kind: str) -> SampleFile | None:
    """The visitor's upload of `kind`, checked and decoded (`hfexport.samples.read_sample`: its type, size and that
    it decodes); None for no file. Raises SampleError naming the file by its name (never the server's path)."""
    if not path:
        return None
    return read_sample(path, kind)


def sample_markdown(samples: dict[str, dict]) -> str:
    """The line under the upload areas: which sample files Convert will use."""
    if not samples:
        return ""
    described = "; ".join(f"{SAMPLE_LABELS[kind].split(' (')[0].lower()} {entry['describe']}"
                          for kind, entry in samples.items())
    return f"✓ Convert traces and verifies the export on your {described}."


def stage_samples(samples: dict[str, dict], folder: Path) -> dict[str, str]:
    """The visitor's sample files checked again and copied into the job's folder (`<job>/samples/<name>`, so the
    job reads its own copy, removed with the job's folder): {kind: path} for `JobRequest.sample_files`."""
    staged = {}
    for kind, entry in samples.items():
        if kind not in KINDS:
            continue
        check_sample(entry["path"], kind)
        destination = folder / "samples" / display_name(entry["path"])
        destination.parent.mkdir(parents=True, exist_ok=True)
        shutil.copyfile(entry["path"], destination)
        staged[kind] = str(destination)
    return staged


# ── Quantized variants ───────────────────────────────────────────────────────


@dataclass(frozen=True)
class QuantizedVariant:
    """A quantized copy the page offers of every unquantized target of one format: its `quantization` section."""

    export_format: str
    suffix: str  # the new target is named `<target>-<suffix>`
    label: str
    quantization: dict


# Data-free methods only: a variant needs nothing but the recipe it is added to (docs/quantization.md). Each is
# published under the name its loaders look for (`layout.artifact_name`) where one exists: ONNX Runtime's dynamic int8
# is transformers.js' `model_quantized.onnx` ("q8"); OpenVINO int8 weight compression (optimum-intel's
# `--weight-format int8`) has no conventional file name, so it goes to `openvino/<target>/`.
QUANTIZED_VARIANTS = {
    "onnx-int8": QuantizedVariant("onnx", "int8", "ONNX int8 (ONNX Runtime dynamic quantization)",
                                  {"method": "ort_dynamic"}),
    "openvino-int8": QuantizedVariant("openvino", "int8", "OpenVINO int8 weights (NNCF weight compression)",
                                      {"method": "nncf_weights", "params": {"mode": "int8_asym"}}),
}
_NOT_COPIED = ("quantization", "parity", "path", "file_name", "description")  # the base's own, not its variant's


def _variant_spec(base: str, spec: dict, variant: QuantizedVariant) -> dict:
    copied = {key: value for key, value in spec.items() if key not in _NOT_COPIED}
    return {**copied, "description": f"{base}, quantized: {variant.label}.",
            "quantization": json.loads(json.dumps(variant.quantization))}


def _variant_bases(targets: dict, variant: QuantizedVariant) -> list[str]:
    return [name for name, spec in targets.items() if isinstance(spec, dict) and not spec.get("quantization")
            and spec.get("export_format") == variant.export_format]


def quantized_variant_choices(document: Any) -> list[tuple[str, str]]:
    """(label, key) of the variants a recipe can take: those whose format it has an unquantized target of. A flat
    recipe (one unnamed target) takes none: variants are named targets."""
    targets = document.get("targets") if isinstance(document, dict) else None
    if not isinstance(targets, dict):
        return []
    return [(variant.label, key) for key, variant in QUANTIZED_VARIANTS.items() if _variant_bases(targets, variant)]


def variant_targets(document: Any, kinds: Sequence[str] | None = None) -> list[str]:
    """The names of the targets of `document` that are the variants `kinds` (default: all) would add, as added."""
    targets = document.get("targets") if isinstance(document, dict) else None
    if not isinstance(targets, dict):
        return []
    found = []
    for key in kinds if kinds is not None else QUANTIZED_VARIANTS:
        variant = QUANTIZED_VARIANTS[key]
        for base in _variant_bases(targets, variant):
            wanted = _variant_spec(base, targets[base], variant)
            found += [name for name, spec in targets.items() if spec == wanted]
    return found


def _variant_name(base: str, suffix: str, taken: dict) -> str:
    """`<base>-<suffix>`, then `-2`, `-3`...: the first name no target has, within the 64 characters of a name."""
    number = 1
    while True:
        tail = f"-{suffix}" + (f"-{number}" if number > 1 else "")
        name = base[: 64 - len(tail)] + tail
        if name not in taken:
            return name
        number += 1


def ticked_variants(document: Any) -> list[str]:
    """The variants `document` holds for every target they apply to (the page's ticks after an edit or a load)."""
    targets = (document or {}).get("targets") if isinstance(document, dict) else None
    ticked = []
    for label, key in quantized_variant_choices(document):
        bases = _variant_bases(targets, QUANTIZED_VARIANTS[key])
        if len(variant_targets(document, [key])) >= len(bases):
            ticked.append(key)
    return ticked


def with_quantized_variants(document: dict, kinds: Sequence[str]) -> dict:
    """`document` with the quantized variants `kinds` (keys of `QUANTIZED_VARIANTS`) as targets of their own, and
    those of the other kinds, unchanged since they were added, taken out; never edits `document` in place.

    Each unquantized target of a variant's format gets a copy named `<target>-<suffix>` (`onnx` -> `onnx-int8`;
    `-2`, `-3`... when that name is another target's) with the variant's `quantization` section, without the base's
    `parity` (a quantized target is judged by the quantized defaults, `quantization.default_parity`), `path` and
    `file_name` (the publication names it where its loaders look). A variant already present is left as it is.
    Raises SpaceError for an unknown kind."""
    unknown = [kind for kind in kinds if kind not in QUANTIZED_VARIANTS]
    if unknown:
        raise SpaceError("Unknown quantized variant", f"{', '.join(map(repr, unknown))}; the page offers: "
                         f"{', '.join(QUANTIZED_VARIANTS)}")
    document = json.loads(json.dumps(document))
    targets = document.get("targets")
    if not isinstance(targets, dict):
        return document
    for key in [key for key in QUANTIZED_VARIANTS if key not in kinds]:
        for name in variant_targets(document, [key]):
            del targets[name]
    for key in kinds:
        variant = QUANTIZED_VARIANTS[key]
        for base in _variant_bases(targets, variant):
            wanted = _variant_spec(base, targets[base], variant)
            if wanted not in targets.values():
                targets[_variant_name(base, variant.suffix, targets)] = wanted
    return document


# ── Per-session folders ──────────────────────────────────────────────────────


class Workspace:
    """Per-session temp folders under one root: `<root>/<session>/<job>/` (artifacts) and its zip.

    Each new job of a session removes the session's previous one; `release` removes a session; `sweep` removes
    sessions idle for longer than the time-to-live (a tab closed without the page telling us).
    """

    def __init__(self, root: str | Path, ttl_s: float = 3600.0):
        self.root = Path(root)
        self.ttl_s = ttl_s
        self.root.mkdir(parents=True, exist_ok=True)

    def _session(self, session: str) -> Path:
        safe = "".join(char for char in session if char.isalnum() or char in "-_")[:64] or "anonymous"
        return self.root / safe

    def new_job(self, session: str) -> Path:
        """A fresh, empty folder for the session's next job; the session's earlier jobs are removed."""
        self.sweep()
        folder = self._session(session)
        if folder.exists():
            for child in folder.iterdir():
                _remove(child)
        job = folder / uuid.uuid4().hex[:12]
        job.mkdir(parents=True)
        return job

    def release(self, session: str) -> None:
        _remove(self._session(session))

    def sweep(self) -> list[Path]:
        """Remove sessions whose newest file is older than the time-to-live; returns what was removed."""
        removed = []
        now = time.time()
        for folder in self.root.iterdir() if self.root.exists() else ():
            try:
                newest = max((entry.stat().st_mtime for entry in [folder, *folder.iterdir()]), default=now)
            except OSError:
                continue
            if now - newest > self.ttl_s:
                _remove(folder)
                removed.append(folder)
        return removed

    def sessions(self) -> list[str]:
        return sorted(entry.name for entry in self.root.iterdir()) if self.root.exists() else []


def _remove(path: Path) -> None:
    if path.is_dir() and not path.is_symlink():
        shutil.rmtree(path, ignore_errors=True)
    else:
        with contextlib.suppress(FileNotFoundError):
            path.unlink()


def zip_artifacts(output: Path, destination: Path) -> Path:
    """Every file of a job's output folder (targets and the job report) in one zip, paths relative to it."""
    destination.parent.mkdir(parents=True, exist_ok=True)
    with zipfile.ZipFile(destination, "w", compression=zipfile.ZIP_DEFLATED, compresslevel=1) as archive:
        for file in sorted(output.rglob("*")):
            relative = file.relative_to(output)
            if file.is_file() and not any(part.startswith(".") for part in relative.parts):
                archive.write(file, relative.as_posix())
    return destination


# ── Jobs ─────────────────────────────────────────────────────────────────────


@dataclass
class JobRequest:
    """One Convert click: what to export, from where, with which recipe, as whom."""

    model: str
    output: Path
    targets: list[str]
    revision: str | None = None
    token: str | None = None
    recipe: dict | None = None  # None: the repo's own recipe; else the editor's (validated) document
    recipe_origin: str | None = None  # the editor's recipe: "proposed" (as hfexport drafted it) or "edited"
    sample_files: dict[str, str] = field(default_factory=dict)  # kind -> the visitor's sample, copied for this job

    @property
    def command(self) -> str:
        return export_command(self.model, self.revision, self.targets, edited_recipe=self.recipe is not None,
                              samples={kind: display_name(path) for kind, path in self.sample_files.items()})


@dataclass
class Finished:
    """The last event of a job: its report (or the failure that stopped it) and the total wall time."""

    report: Any = None
    failure: Failure | None = None
    seconds: float = 0.0
    waited_s: float = 0.0  # time spent waiting for the process-wide job lock


class JobRunner:
    """Runs one job at a time and streams its progress events; the job itself runs in a child process.

    `run(request)` yields `job.Step` events as the job reports them (cache, preflight, load_model,
    plan/export/save/verify per target, target) and finally one `Finished`. The child (`hfexport.surfaces.worker`) keeps
    the engine imported between jobs and leaves the web server's interpreter free while a job traces and optimizes.
    """

    def __init__(self, settings: SpaceSettings):
        self._lock = threading.Lock()
        self.settings = settings
        # Jobs act with the visitor's token only: the Space's own (HF_TOKEN, a saved login) stays out of the child.
        self.worker = JobWorker(env={"HF_TOKEN": None, "HUGGING_FACE_HUB_TOKEN": None,
                                     "HF_HUB_DISABLE_IMPLICIT_TOKEN": "1"})

    @property
    def busy(self) -> bool:
        return self._lock.locked()

    def start(self) -> None:
        self.worker.start()

    def close(self) -> None:
        self.worker.close()

    def run(self, request: JobRequest, cancel: threading.Event | None = None) -> Iterator[Any]:
        """`request`'s progress events, then one `Finished`; setting `cancel` stops the job (its child is killed,
        nothing of it is kept) and ends it as the failure "Cancelled"."""
        started = time.perf_counter()
        message = {
            "model": request.model, "output": str(request.output), "targets": request.targets or None,
            "revision": request.revision, "token": request.token, "recipe": request.recipe,
            "recipe_origin": request.recipe_origin if request.recipe is not None else None,
            "verify": self.settings.verify, "command": request.command, "keep_downloads": self.settings.keep_downloads,
            "env": settings_from(), "sample_files": dict(request.sample_files) or None,
        }
        finished = Finished()
        with self._lock:
            finished.waited_s = time.perf_counter() - started
            if cancel is not None and cancel.is_set():  # cancelled while it waited for its turn
                events: Iterator[dict] = iter([{"type": "cancelled"}])
            else:
                events = self.worker.run(message, timeout_s=self.settings.job_timeout_s, cancel=cancel)
            for event in events:
                kind = event.get("type")
                if kind == "step":
                    yield Step(**event["step"])
                elif kind == "done":
                    finished.report = JobReport.from_dict(event["report"])
                elif kind == "failed":
                    failure = event["failure"]
                    finished.failure = Failure(failure["category"], failure["message"], failure.get("command"),
                                               [Problem(p["path"], p["message"]) for p in failure.get("problems", [])])
                elif kind == "cancelled":
                    finished.failure = Failure("Cancelled", f"the conversion of {request.model} was stopped before it "
                                               "finished; nothing of it was kept")
                else:
                    finished.failure = Failure("Export crashed", redact(event.get("message", "")), request.command)
        finished.seconds = time.perf_counter() - started
        if finished.report is None:
            _remove(request.output)
        else:
            finished.failure = report_failure(finished.report, request.command)
        yield finished


@dataclass
class Conversion:
    """A session's running conversion: the model it converts and the event that cancels it."""

    model: str
    cancel: threading.Event = field(default_factory=threading.Event)


class Conversions:
    """The conversion each session runs (one at most). A conversion belongs to the model it started with: while it
    runs, the page refuses to load another model (`load_refusal`) and offers Cancel (`cancel`)."""

    def __init__(self):
        self._lock = threading.Lock()
        self._running: dict[str, Conversion] = {}

    def start(self, session: str, model: str) -> Conversion:
        with self._lock:
            conversion = self._running[session] = Conversion(model)
            return conversion

    def running(self, session: str | None) -> Conversion | None:
        with self._lock:
            return self._running.get(session) if session else None

    def cancel(self, session: str | None) -> Conversion | None:
        """Stop the session's running conversion (returned), if any."""
        conversion = self.running(session)
        if conversion is not None:
            conversion.cancel.set()
        return conversion

    def end(self, session: str, conversion: Conversion) -> None:
        with self._lock:
            if self._running.get(session) is conversion:
                del self._running[session]


def load_refusal(conversion: Conversion | None, model: str | None) -> str | None:
    """Why loading `model` is refused now (a conversion of another model runs in this session), or None."""
    if conversion is None:
        return None
    asked = f"`{model.strip()}`" if (model or "").strip() else "another model"
    return (f"Not loading {asked}: the conversion of `{conversion.model}` is still running, and its results belong "
            f"to `{conversion.model}`. **Cancel** it, or wait until it ends, then load {asked}.")


# ── Progress rendering ───────────────────────────────────────────────────────

_STEP_TITLES = {
    "cache": "look for an identical earlier export",
    "preflight": "preflight (memory and disk)",
    "load_model": "download and load the model",
    "plan": "plan",
    "export": "export",
    "save": "save",
    "verify": "verify parity",
    "probe": "parity probe",
    "runtimes": "generate in the deployment runtimes",
    "variants": "make and gate the variants",
    "latency": "time against eager torch",
    "unchanged": "already exported",
    "publish": "publish",
}


_STATUS_ICONS = {"start": "…", "running": "…", "done": "✓", "error": "✗"}


class ProgressLog:
    """Progress events folded into one Markdown checklist (one line per step and target), updated in place."""

    def __init__(self, title: str = "Progress"):
        self.title = title
        self.entries: dict[tuple[str, str | None], Any] = {}
        self.note: str | None = None

    def add(self, step) -> None:
        if step.step == "target":  # per-target bracket: shown only when the target was a cache hit
            if step.status == "done" and (step.detail or "").startswith("unchanged"):
                reason = step.detail.removeprefix("unchanged").lstrip(": ")
                self.entries[("unchanged", step.target)] = type(step)("unchanged", "done", step.target, reason)
            return
        if step.status == "running":  # a heartbeat: the open step's line shows how long it has been running
            if (step.step, step.target) in self.entries and self.entries[(step.step, step.target)].status == "start":
                self.entries[(step.step, step.target)] = step
            return
        self.entries[(step.step, step.target)] = step

    def collapsed(self) -> str:
        """The finished log: its title and note on one line, the steps folded under it (the outcome comes first)."""
        body = self.markdown().split("\n", 2)[2] if self.entries else ""
        if self.note:
            body = body.rsplit("\n\n", 1)[0]
        head = f"**{self.title}**" + (f" · {self.note}" if self.note else "")
        return f"{head}\n\n<details><summary>Step log ({len(self.entries)} steps)</summary>\n\n{body}\n\n</details>"

    def markdown(self) -> str:
        lines = [f"**{self.title}**", ""]
        for (name, target), step in self.entries.items():
            title = _STEP_TITLES.get(name, name) + (f" `{target}`" if target else "")
            seconds = f" ({step.seconds:.1f} s)" if step.seconds is not None else ""
            if step.status == "running":
                seconds = f" (running, {step.seconds:.0f} s)"
            detail = f": {md_escape(step.detail)}" if step.detail and step.status not in ("start", "running") else ""
            if step.status in ("start", "running") and step.detail and name not in ("load_model",):
                detail = f": {md_escape(step.detail)}"
            lines.append(f"- {_STATUS_ICONS.get(step.status, '•')} {title}{seconds}{detail}")
        if self.note:
            lines += ["", self.note]
        return "\n".join(lines)


# ── Publishing ───────────────────────────────────────────────────────────────


def publish_message(result) -> str:
    """One line for a `publish.PublishResult`: opened / updated / unchanged (up to date) / committed, and the
    targets left out because they did not pass, each with its reason."""
    line = _publish_line(result)
    left_out = getattr(result, "left_out", None) or {}
    if left_out:
        line += " Not published (did not pass): " + "; ".join(
            f"`{name}`: {md_escape(why)}" for name, why in left_out.items()) + "."
    return line


def _publish_line(result) -> str:
    link = f"[#{result.pr_num}]({result.pr_url})" if getattr(result, "pr_url", None) else ""
    if result.action == "opened":
        return f"✓ Opened pull request {link} on `{result.repo_id}`."
    if result.action == "updated":
        return f"✓ Pushed a new commit to pull request {link} on `{result.repo_id}`."
    if result.action == "unchanged":
        return f"= Pull request {link} on `{result.repo_id}` is up to date: nothing changed, so no new pull request."
    return f"✓ Committed to `{result.repo_id}`" + (f" ({result.commit[:12]})" if getattr(result, "commit", None) else "") + "."


PUBLISHABLE = ("ok", "unchanged")


def publishable_targets(report) -> list[str]:
    """The targets of a finished job that may be published: exported (or already exported) and passed parity."""
    if report is None:
        return []
    return [name for name, target in report.targets.items() if target.status in PUBLISHABLE]


def find_models(query: str, token: str | bool | None) -> list[str]:
    """The search box: model repo ids on the Hub matching `query` (signed out: anonymously)."""
    return search_models(query, token or False)


def convert_blocker(state: dict | None, token: str | None) -> str | None:
    """Why Convert cannot succeed now (the page disables it and says this), or None: no model loaded, signed out,
    or a recipe in the editor that does not validate."""
    state = state or {}
    if not state.get("model"):
        return "Load a model to convert it."
    if not token:
        return "Sign in to convert."
    if not state.get("recipe_valid"):
        return "Fix the recipe's problems to convert."
    return None


def propose_blocker(state: dict | None, token: str | None) -> str | None:
    """Why "Propose recipe" cannot succeed now, or None: no model loaded, signed out, or a recipe in the editor that
    does not validate (against the loaded model too)."""
    state = state or {}
    if not state.get("model"):
        return "Load a model to propose a recipe for it."
    if not token:
        return "Sign in to propose a recipe."
    if not state.get("recipe_valid"):
        return "Fix the recipe's problems to propose it."
    return None


def open_pr_number(model: str, token: str | None) -> int | None:
    """The number of `model`'s open hfexport pull request, or None (none, or the Hub cannot say)."""
    try:
        found = find_open_publication(model, token=token or False)
    except Exception:  # noqa: BLE001 - the button's label only: "Open PR" when in doubt
        return None
    return found.num if found else None


def pr_button_label(state: dict | None) -> str:
    """"Update PR #N" once the model has an hfexport pull request, "Open PR" before."""
    number = (state or {}).get("pr")
    return f"Update PR #{number}" if number else "Open PR"


def outcome_markdown(report, pr_url: str | None = None, pr_num: int | None = None, failure: str | None = None,
                     model: str | None = None) -> str:
    """The outcome of a job, first on the page: a status line, per target passed/failed and why and its size, what
    the zip holds (only targets that passed) and the pull request (its link once opened; "Update PR #N" offered
    only when something passed); then the failure, when the job had one."""
    passed = publishable_targets(report)
    total = len(report.targets)
    of = f" of `{model}`" if model else ""
    if total and len(passed) == total:
        status = f"### Outcome{of}: ✅ {'all ' if total > 1 else ''}{total} target{'s' if total > 1 else ''} passed"
    elif passed:
        status = f"### Outcome{of}: ⚠️ {len(passed)} of {total} targets passed, {total - len(passed)} failed"
    else:
        status = f"### Outcome{of}: ❌ {'no target passed' if total != 1 else 'the target failed'}"
    lines = [status, "", "| target | result | why | size |", "|---|---|---|---|"]
    for name, target in report.targets.items():
        verification = target.verification or {}
        if target.status in ("ok", "unchanged"):
            result = "✅ passed" if target.status == "ok" else "➖ unchanged"
            why = ("parity verified" if verification.get("passed") else target.unchanged_reason or
                   "exported (not verified)")
        else:
            result = "❌ failed" if target.status == "failed" else "⚠️ error"
            failures = verification.get("failures") or []
            why = failures[0] if failures and not target.error else (target.error or "parity check failed")
        size = human_bytes(target.total_bytes) if target.files and target.total_bytes else "—"
        why = md_escape(first_line(str(why), 200)).replace("|", "\\|")  # a table cell: its pipes escaped
        lines.append(f"| `{name}` | {result} | {why} | {size} |")
    memory = memory_line(report)  # each stage's peak beside the preflight's estimate (hfexport.job.memory)
    lines += ["", memory, ""] if memory else [""]
    lines.append(f"Download: the zip below holds {', '.join(f'`{name}`' for name in passed)}." if passed
                 else "Nothing to download: no target passed.")
    if pr_url:
        lines.append(f"Pull request: [#{pr_num}]({pr_url}).")
    elif pr_num and passed:
        lines.append(f"This model's hfexport pull request is #{pr_num}: **Update PR #{pr_num}** publishes these "
                     "targets to it.")
    if failure:
        lines += ["", failure]
        if passed:
            lines += ["", f"**Open PR** publishes the targets that passed ({', '.join(passed)}); the others stay out."]
    return "\n".join(lines)


def can_publish(state: dict | None) -> bool:
    """Whether Open PR has something to publish for this session (the page enables the button only then)."""
    state = state or {}
    return bool(state.get("output") and state.get("targets") and Path(state["output"]).is_dir())


def new_repo_name(username: str, model: str) -> str:
    """The repo under the signed-in user that "Publish to my repo" commits to: `<user>/<model name>-hfexport`."""
    return f"{username}/{model.rsplit('/', 1)[-1]}-hfexport"


def publish_job(state: dict, token: str, repo: str | None = None):
    """Publish a session's converted job through hfexport's one-PR-per-model logic (or, with `repo`, as one commit
    to that repo, created when missing); returns the PublishResult. Only the targets that passed are published
    (`state["targets"]`, from `publishable_targets`)."""
    output = state.get("output")
    if state.get("left_out") and not state.get("targets"):
        raise SpaceError("Nothing to publish", "no target passed the parity check: change the recipe in the editor "
                         "(its parity thresholds, or other targets), then Convert again")
    if not output or not Path(output).is_dir() or not state.get("targets"):
        raise SpaceError("Nothing to publish", "Convert the model first; a session's artifacts are kept until it "
                         "ends, loads another model or converts again")
    if repo is not None:
        return publish(output, repo, mode="commit", token=token, targets=state.get("targets"))
    return publish(output, state["model"], mode="pr", token=token, targets=state.get("targets"),
                   revision=state.get("revision"))


@dataclass
class Proposal:
    """The outcome of `propose_recipe`."""

    action: str  # "opened" | "updated" | "unchanged"
    repo_id: str
    pr_num: int
    pr_url: str

    def markdown(self) -> str:
        link = f"[#{self.pr_num}]({self.pr_url})"
        if self.action == "opened":
            return f"✓ Opened pull request {link} adding `{RECIPE_FILE}` to `{self.repo_id}`."
        if self.action == "updated":
            return f"✓ Updated the recipe in pull request {link} on `{self.repo_id}`."
        return f"= Pull request {link} on `{self.repo_id}` already proposes this recipe: nothing changed."


def propose_recipe(repo_id: str, document: dict, token: str, revision: str | None = None) -> Proposal:
    """Open (or update) the pull request that adds `export_config.json` with the validated `document`.

    One open proposal per repo: it is found by its marker, gets a new commit when the recipe differs, and is left
    alone when it already holds these exact bytes. The recipe is validated again here; an invalid one is refused.
    """
    from huggingface_hub import CommitOperationAdd

    recipe_from_document(document, "proposed recipe")  # raises RecipeError with every problem
    repo = HubRepo(repo_id, None, token, error_class=PublishError)
    content = pretty_json(document)[0].encode("utf-8")
    open_pr = repo.find_pull_request(RECIPE_PR_KIND, title_prefix=RECIPE_PR_TITLE)
    if open_pr is not None and repo.read(RECIPE_FILE, revision=f"refs/pr/{open_pr.num}") == content:
        return Proposal("unchanged", repo_id, open_pr.num, open_pr.url)
    description = "\n".join([
        RECIPE_PR_MARKER,
        f"This pull request adds `{RECIPE_FILE}`, an export recipe for hfexport: which formats this model "
        "exports to, with which settings, and the parity thresholds its artifacts must meet.",
        "",
        f"Check it locally with `{validate_command(repo_id, revision)}`.",
    ])
    done = repo.open_or_update_pull_request([CommitOperationAdd(RECIPE_FILE, content)], title=RECIPE_PR_TITLE,
                                            description=description, pull_request=open_pr,
                                            update_message="Update the export recipe")
    if open_pr is not None:
        repo.comment(open_pr.num, "Updated the proposed export recipe.")
    return Proposal(done.action, repo_id, int(done.num), done.url)


def verified_recipe(recipe_document: dict | None, report) -> dict | None:
    """What a finished job proved about a recipe: its canonical JSON and the targets that passed parity."""
    if recipe_document is None or report is None:
        return None
    passed = [name for name, target in report.targets.items() if target.status == "ok"
              and (target.verification or {}).get("passed")]
    return {"recipe": canonical_json(recipe_document), "passed": passed}


def finalize_proposal(document: dict, verified: dict | None) -> tuple[dict, bool]:
    """The recipe to propose: with `validated_with` (package versions, as `hfexport init` writes it) only when this
    session exported and verified every one of its targets with exactly this recipe; else as it is."""
    bare = {key: value for key, value in document.items() if key != "validated_with"}
    if not verified or verified.get("recipe") not in (canonical_json(document), canonical_json(bare)):
        return document, False
    targets = document.get("targets") or {}  # a flat recipe is an engine config: it has no `validated_with`
    if not targets or not set(targets) <= set(verified.get("passed") or ()):
        return document, False
    formats = [target.get("export_format") for target in targets.values()]
    return {**bare, "validated_with": propose.validated_with(formats)}, True


# ── Run on my Hugging Face Jobs ──────────────────────────────────────────────


@dataclass
class JobsFit:
    """The preflight's memory estimate for all of a model's targets against what this Space has."""

    memory: int | None
    available: int | None

    @property
    def fits(self) -> bool:
        return self.memory is None or self.available is None or self.memory <= self.available

    def markdown(self) -> str:
        if self.memory is None:
            return "**Run on my Hugging Face Jobs** exports on a machine of your own account (no memory estimate)."
        numbers = f"{human_bytes(self.memory)} estimated" + (f", {human_bytes(self.available)} available here"
                                                              if self.available is not None else "")
        if self.fits:
            return f"Fits this Space ({numbers}); **Run on my Hugging Face Jobs** also works."
        return (f"**Too large for this Space** ({numbers}): **Run on my Hugging Face Jobs** exports it on a machine "
                "of your own account that holds it, and opens the pull request from there.")


def jobs_fit(model: str, revision: str | None, token: str | None) -> JobsFit:
    """Whether exporting every target of `model` fits this Space, from the preflight's estimate (reads the recipe
    and the weights' sizes from the Hub; loads nothing)."""
    try:
        memory = estimate_memory(model, revision or "main", None, token)
    except Exception:  # noqa: BLE001 - advice only: without an estimate the Job's own preflight decides
        memory = None
    return JobsFit(memory, available_memory())


def jobs_blocker(state: dict | None, token: str | None, settings: SpaceSettings, recipe_text: str | None) -> str | None:
    """Why "Run on my Hugging Face Jobs" cannot run now, or None. The Job exports with the model repo's own
    recipe, so an edited or proposed recipe cannot go there (propose it first, or Convert here)."""
    state = state or {}
    if not state.get("model"):
        return "Load a model to run it on your Hugging Face Jobs."
    if not token:
        return "Sign in to run on your Hugging Face Jobs."
    if not settings.jobs_image:
        return "This Space has no Jobs image (HFEXPORT_SPACE_JOBS_IMAGE) to run exports on Hugging Face Jobs."
    if state.get("recipe_source") != "repo" or not state.get("repo_recipe"):
        return "A Job exports with the repo's own recipe: propose this recipe first (or Convert here)."
    if (recipe_text or "").strip() != (state.get("loaded_text") or "").strip():
        return "A Job exports with the repo's own recipe, not the editor's changes: Convert here to try them."
    if state.get("samples"):
        return "A Job exports with the recipe's own sample inputs, not your sample file: Convert here to use it."
    return None


@dataclass
class JobsUpdate:
    """One look at the user's Job: its id, hardware, stage and logs so far; at the end its outcome."""

    model: str
    job_id: str
    flavor: str
    stage: str
    message: str | None = None
    logs: list[str] = field(default_factory=list)
    result: dict | None = None
    tail: int = 40

    @property
    def finished(self) -> bool:
        return self.stage in TERMINAL

    @property
    def pr_num(self) -> int | None:
        match = re.search(r"/discussions/(\d+)", (self.result or {}).get("pr_url") or "")
        return int(match[1]) if match else None

    def outcome(self) -> str:
        result = self.result or {}
        url = result.get("pr_url")
        link = f"[#{self.pr_num}]({url})" if url else ""
        detail = f" ({md_escape(redact(result['detail']))})" if result.get("detail") else ""
        if result.get("action") == "opened":
            return f"✓ The Job opened pull request {link} on `{self.model}`.{detail}"
        if result.get("action") == "updated":
            return f"✓ The Job pushed a new commit to pull request {link} on `{self.model}`.{detail}"
        if result.get("action") == "unchanged":
            return f"= Pull request {link} on `{self.model}` is up to date: nothing changed.{detail}"
        if result.get("action") == "committed":
            return f"✓ The Job committed to `{self.model}`.{detail}"
        if result:
            return f"✗ The Job ended {result.get('state', 'failed')}{detail}."
        return f"✗ The Job ended {self.stage}" + (f" ({md_escape(redact(self.message))})" if self.message else "") + \
            " without a result: its logs above say why."

    def markdown(self) -> str:
        """The outcome (once finished), the Job's steps as the Convert checklist, then its other log lines."""
        steps, other = job_steps(self.logs)
        log = ProgressLog(f"Hugging Face Job `{self.job_id}` on {md_escape(self.flavor)} · {self.stage}")
        for step in steps:
            log.add(step)
        shown = [redact(line) for line in other[-self.tail:]]
        body = "\n".join(shown).replace("```", "ʼʼʼ")
        lines = [log.markdown(), "", f"<details><summary>Job logs (last {len(shown)} lines)</summary>", "",
                 "```text", body, "```", "", "</details>"]
        if self.finished:
            lines = [self.outcome(), "", *lines]
        return "\n".join(lines)


def run_on_jobs(model: str, revision: str | None, targets: Sequence[str], token: str,
                settings: SpaceSettings) -> Iterator[JobsUpdate]:
    """Export and publish `model` as a Hugging Face Job under the signed-in user's account, through
    `job.dispatch.HfJobs` (the hardware chosen from the preflight's estimate, the token a Job secret): yields the
    Job's state and logs every `jobs_poll_s` until it ends, the last update with its outcome (the pull request).
    Ticked `targets` are exported; none: every target of the recipe."""
    register_secret(token)
    jobs = HfJobs(token, image=settings.jobs_image or "", timeout=settings.jobs_timeout)
    sha = jobs.api.model_info(model, revision=revision, token=token).sha
    chosen = list(targets) or None
    flavor = jobs.flavor(model, sha, chosen)
    branch = revision if revision and not re.fullmatch(r"[0-9a-f]{40}", revision) else "main"
    spec = {"repo": model, "sha": sha, "output": "hfexport-job-output", "targets": chosen, "publish": "pr",
            "branch": branch, "allow_failed": False, "retries": 3, "retry_backoff_s": 5.0}
    job_id = jobs.run(spec, flavor.name, {"hfexport-space": "1", "hfexport-repo": model.replace("/", "--")})
    while True:
        stage, message = jobs.stage(job_id)
        logs = jobs.logs(job_id)
        update = JobsUpdate(model, job_id, flavor.describe(), stage, message, logs)
        if update.finished:
            update.result = job_result(logs)
            yield update
            return
        yield update
        time.sleep(settings.jobs_poll_s)
