"""Publishing an OUTPUT folder to the Hub: one commit per publication, one pull request per model.

Each target folder `OUTPUT/<target>/` is uploaded where the ecosystem's loaders look for its format
(hfexport.layout: `onnx/`, `openvino/`, ..., or the recipe's `path`; ONNX external data renamed `model.onnx_data`,
the name optimum and transformers.js download), together with the README's hfexport card section (`hfexport.card`),
in a single `HfApi.create_commit` (the Hub applies a commit entirely or not at all, so a failure leaves no half-made
PR). In `mode="pr"` the PR description carries a marker `<!-- hfexport:publication {"key": ..., "content": ...} -->`;
the next publication finds the open PR with the same key and pushes one commit onto its `refs/pr/N` (with a comment
saying what changed), or does nothing when the PR head already holds the same artifacts built from the same source,
recipe and package versions. Every update is computed against the current head of the branch the PR targets: the
README is that head's, byte for byte, with the section set; when the owner changed the README since the PR was
opened, the update opens a fresh PR from that head (carrying every target the old one held) and closes the old one,
so the PR on the Hub always merges.
"""

from __future__ import annotations

import hashlib
import json
import os
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

from hfexport.errors import (
    CardError,
    PublishError,
    PublishRefusedError,
    register_secret,
)
from hfexport.files import MANIFEST_FILE, RECIPE_COPY_FILE, REPORT_FILE, file_sha256, git_blob_sha1
from hfexport.hub import HubRepo, PullRequest, looks_like_repo_id
from hfexport.hub import marker_line as hub_marker_line
from hfexport.hub import parse_marker as hub_marker
from hfexport.layout import (
    DEFAULT_NAMES,
    LayoutError,
    Place,
    artifact_name,
    assign_places,
    export_folders,
    format_label,
    place_files,
    published_name,
    target_places,
)
from hfexport.formats import format_backend
from hfexport.formats.onnx.backend import IMAGE_TEXT_FILES, transformers_js_config
from hfexport.formats.onnx.decoder_contract import GENAI_CONFIG_FILE
from hfexport.formats.onnx.seq2seq_contract import DECODER_FILE
from hfexport.formats.programs import format_program
from hfexport.progress import Step
from hfexport.recipe.validation import canonical_json
from hfexport.report.card import format_tags, recipe_origin, render_section, update_card
from hfexport.report.markdown import report_markdown
from hfexport.report.data import JobReport, TargetReport

README = "README.md"
ROOT_CONFIG = "config.json"
PREPROCESSOR_CONFIG = "preprocessor_config.json"
TITLE_PREFIX = "hfexport:"
MARKER_KIND = "publication"  # the PR description's `<!-- hfexport:publication {...} -->` (hfexport.hub.marker_line)
MODES = ("pr", "commit")


@dataclass
class PublishResult:
    action: str  # "opened" | "updated" | "unchanged" | "committed"
    pr_url: str | None
    pr_num: int | None
    commit: str | None
    repo_id: str
    files: list[str] = field(default_factory=list)
    left_out: dict[str, str] = field(default_factory=dict)  # target -> why it was not published


OpenPublication = PullRequest  # an open hfexport pull request: number, URL, description and marker fields


@dataclass
class _Target:
    name: str
    folder: Path
    report: JobReport
    files: dict[str, Path]  # path relative to the target folder -> local file
    place: Place = field(default_factory=lambda: Place(""))  # where it is published (hfexport.layout)
    published: dict[str, Path | bytes] = field(default_factory=dict)  # name in place.folder -> content

    @property
    def target(self) -> TargetReport:
        return self.report.targets[self.name]

    @property
    def repo_folder(self) -> str:
        return self.place.folder


@dataclass
class _RemoteTarget:
    """A target a revision already holds: its place, its files there (name in its folder -> tree entry) and its
    report."""

    name: str
    place: Place
    files: dict[str, dict]
    report: JobReport | None

    @property
    def folder(self) -> str:
        return self.place.folder


def publication_key(repo_id: str, base: str) -> str:
    """What identifies one model's publication: the repo and the branch its PR targets."""
    return f"{repo_id}@{base}"


def marker_line(key: str, content: str, source: str | None = None) -> str:
    """The PR description's hidden marker: the publication's key, its content hash and the source commit it was built
    from (what the webhook receiver compares the branch head with when it reconciles)."""
    return hub_marker_line(MARKER_KIND, {"key": key, "content": content, **({"source": source} if source else {})})


def parse_marker(text: str | None) -> dict | None:
    """The publication marker of a PR description, or None."""
    value = hub_marker(text, MARKER_KIND)
    return value if value is not None and isinstance(value.get("key"), str) else None


def resolve_token(token: str | None) -> str | None:
    """The token argument, else HF_TOKEN, else the saved login (huggingface_hub's lookup); registered for redaction."""
    if not token:
        from huggingface_hub import get_token

        token = os.environ.get("HF_TOKEN") or get_token()
    register_secret(token)
    return token or None


def find_open_publication(repo_id: str, base: str = "main", token: str | None = None,
                          repo: HubRepo | None = None) -> OpenPublication | None:
    """The open hfexport PR of `repo_id` whose marker has this publication's key, or None (`repo`: the client to use;
    the Hub failing raises its `error_class`, never None)."""
    key = publication_key(repo_id, base)
    return (repo or HubRepo(repo_id, base, token)).find_pull_request(
        MARKER_KIND, title_prefix=TITLE_PREFIX, base=base, matches=lambda marker: marker.get("key") == key)


def publish(
    output: str | Path,
    repo_id: str,
    *,
    mode: str = "pr",
    token: str | None = None,
    allow_failed: bool = False,
    targets: list[str] | None = None,
    revision: str | None = None,
    progress: Callable | None = None,
) -> PublishResult:
    """Publish a job's output to the Hub as one commit: the target folders, the report and the card section.

    Targets that failed (parity, or their export) are left out and listed, with their reason, in the description
    and the card, so what passed still gets published.

    Args:
        output (`str` or `Path`): a job's output folder (`OUTPUT/<target>/` and `OUTPUT/export_report.json`).
        repo_id (`str`): the model repo (or another repo, created when missing).
        mode (`str`): `"pr"` opens a pull request against `revision`, or updates the open hfexport one;
            `"commit"` commits to `revision` directly.
        token (`str`, *optional*): a Hub token with write access (default: the logged-in one); never logged.
        allow_failed (`bool`): include the failed targets' artifacts too (the PR then says so at the top).
        targets (`list[str]`, *optional*): publish only these targets (default: every target in `output`).
        revision (`str`, *optional*): the branch the PR targets or the commit goes to (default `main`).
        progress (*optional*): called with a `Step` per phase.

    Returns:
        `PublishResult`: what was done (`opened`, `updated`, `committed` or `unchanged`), the PR's URL and number,
        and the targets left out with their reason.

    Raises:
        PublishRefusedError: no target passed (and not `allow_failed`), or `output` holds nothing to publish.
        PublishError: the Hub refused or failed (authentication, access, network); nothing was half-published.
    """
    emit = progress or (lambda _step: None)
    if mode not in MODES:
        raise PublishError(f"unknown publish mode {mode!r}; expected one of {', '.join(MODES)}")
    if not isinstance(repo_id, str) or "/" not in repo_id or not looks_like_repo_id(repo_id):
        raise PublishError(f"{repo_id!r} is not a Hub repo id (expected `namespace/name`)")
    base = revision or "main"
    output = Path(output)
    token = resolve_token(token)
    chosen, left_out = split_failed(_local_targets(output, targets), allow_failed)
    if not token:
        raise PublishError("publishing needs a Hub token with write access: pass --token, set HF_TOKEN or run "
                           "`hf auth login`")

    repo = HubRepo(repo_id, base, token, error_class=PublishError)
    emit(Step("publish", "start", detail=f"{repo_id} ({mode})"))
    try:
        result = _publish(repo, output, repo_id, chosen, mode=mode, base=base, token=token, allow_failed=allow_failed,
                          left_out=left_out)
    except PublishError as error:
        emit(Step("publish", "error", detail=str(error)))
        raise
    result.left_out = dict(left_out)
    emit(Step("publish", "done", detail=f"{result.action}: {result.pr_url or result.commit or repo_id}"
              + (f" (left out: {', '.join(left_out)})" if left_out else "")))
    return result


# ── the steps ────────────────────────────────────────────────────────────────


def _publish(repo: HubRepo, output: Path, repo_id: str, chosen: list[_Target], *, mode: str, base: str, token: str,
             allow_failed: bool, left_out: dict[str, str]) -> PublishResult:
    api = repo.api
    _ensure_repo(api, repo_id, base, mode, token)
    open_pr = find_open_publication(repo_id, base, token, repo) if mode == "pr" else None
    if not chosen:  # every target was a cache hit against the Hub: nothing local to publish
        return PublishResult("unchanged", open_pr.url if open_pr else None, open_pr.num if open_pr else None,
                             None, repo_id, [])
    base_head = _call(lambda: api.repo_info(repo_id, revision=base, token=token).sha, repo_id, f"reading {base}")
    base_tree = _remote_tree(api, repo_id, base_head, token)
    head, tree, carry = base_head, base_tree, {}
    superseded = None
    if open_pr is not None:
        pr_head = _call(lambda: api.repo_info(repo_id, revision=f"refs/pr/{open_pr.num}", token=token).sha, repo_id,
                        f"reading refs/pr/{open_pr.num}")
        pr_tree = _remote_tree(api, repo_id, pr_head, token)
        if _owner_edited_readme(api, repo_id, open_pr.num, base, base_tree, token):
            superseded, open_pr = open_pr, None  # a fresh PR from the branch head: it merges whatever the owner did
            held = _remote_targets(repo_id, pr_head, pr_tree, token)
            on_base = _remote_targets(repo_id, base_head, base_tree, token)
            carry = {name: held[name] for name in held
                     if name not in {item.name for item in chosen} and not _same_remote(held[name], on_base.get(name))}
        else:
            head, tree = pr_head, pr_tree
    remote = _remote_targets(repo_id, head, tree, token)
    foreign = {path.rsplit("/", 1)[0] for path in tree if "/" in path} - export_folders(tree)
    try:
        places = assign_places({item.name: _layout_spec(item) for item in chosen},
                               {name: target.place for name, target in {**remote, **carry}.items()}, foreign)
    except LayoutError as error:
        raise PublishError(f"{repo_id}: {error}") from None
    for item in chosen:
        item.place = places[item.name]
        item.published = _published_files(item)

    changed, changes, deletions = [], [], []
    for item in chosen:
        old = remote.get(item.name)
        theirs = old.files if old is not None and old.place == item.place else {}
        if theirs and _same_artifacts(item, theirs) and _same_inputs(item, old.report):
            continue
        changed.append(item)
        change = _describe_change(item, old.report if old else None)
        if old is not None and old.place != item.place:
            change += f" (moved from `{old.place.label()}` to `{item.place.label()}`)"
            deletions += [f"{old.folder}/{name}" for name in old.files]
        else:
            deletions += [f"{item.repo_folder}/{name}" for name in theirs if name not in item.published]
        changes.append(change)
    content = _content_hash(chosen)
    if not changed and superseded is None:
        return PublishResult("unchanged", open_pr.url if open_pr else None, open_pr.num if open_pr else None, head,
                             repo_id, [])

    from huggingface_hub import CommitOperationAdd, CommitOperationDelete

    operations, files = [], []
    for item in changed:
        for relative, content_of in sorted(item.published.items()):
            path = f"{item.repo_folder}/{relative}"
            operations.append(CommitOperationAdd(path_in_repo=path, path_or_fileobj=content_of if isinstance(
                content_of, bytes) else str(content_of)))
            files.append(path)
    for name, target in sorted(carry.items()):
        for relative in sorted(target.files):
            path = f"{target.folder}/{relative}"
            local = _call(lambda path=path: _download(repo_id, path, f"refs/pr/{superseded.num}", token), repo_id,
                          f"reading {path} of refs/pr/{superseded.num}")
            operations.append(CommitOperationAdd(path_in_repo=path, path_or_fileobj=str(local)))
            files.append(path)
        changes.append(f"`{name}`: carried over from #{superseded.num} unchanged")
    operations += [CommitOperationDelete(path_in_repo=path) for path in sorted(set(deletions) - set(files))
                   if path in tree]  # a file another target writes in this commit is replaced, not deleted
    card_report, card_places, sources = _card_report(chosen, {**remote, **carry})
    stale = _stale(sources, chosen)
    readme = _readme(repo_id, base_head, token)  # the branch head's README, byte for byte

    try:
        new_readme = update_card(readme, render_section(repo_id, card_report, card_places, left_out=left_out,
                                                        stale=stale),
                                 format_tags(card_report.targets), base_model=_base_model(chosen[0].report, repo_id))
    except CardError as error:
        raise PublishError(f"{repo_id}: {error}") from None
    pr_readme = _readme(repo_id, head, token) if head != base_head else readme
    if new_readme != pr_readme:
        operations.append(CommitOperationAdd(path_in_repo=README, path_or_fileobj=new_readme.encode("utf-8")))
        files.append(README)
    config = _root_config(repo_id, chosen, base_head, head, base_tree, (set(tree) - set(deletions)) | set(files), token)
    if config is not None:
        operations.append(CommitOperationAdd(path_in_repo=ROOT_CONFIG, path_or_fileobj=config))
        files.append(ROOT_CONFIG)
    preprocessor = _root_preprocessor_config(repo_id, chosen, base_head, head, base_tree,
                                             (set(tree) - set(deletions)) | set(files), token)
    if preprocessor is not None:
        operations.append(CommitOperationAdd(path_in_repo=PREPROCESSOR_CONFIG, path_or_fileobj=preprocessor))
        files.append(PREPROCESSOR_CONFIG)
    if not operations:
        return PublishResult("unchanged", open_pr.url if open_pr else None, open_pr.num if open_pr else None, head,
                             repo_id, [])

    failed = [item.name for item in chosen if item.target.status == "failed"] if allow_failed else []
    key = publication_key(repo_id, base)
    names = ", ".join(item.name for item in changed) or ", ".join(sorted(card_report.targets))
    source = chosen[0].report.source.get("commit")
    description = _description(key, content, card_report, card_places, failed, changes, left_out, stale, source,
                               open_pr.num if open_pr is not None else None)
    if mode == "commit":
        info = _call(lambda: api.create_commit(repo_id, operations, commit_message=f"hfexport: export {names}",
                                               commit_description=description, revision=base, parent_commit=head,
                                               token=token), repo_id, f"committing to {base}")
        return PublishResult("committed", None, None, info.oid, repo_id, files)
    done = repo.open_or_update_pull_request(
        operations, title=f"{TITLE_PREFIX} add exports ({names})", description=description, pull_request=open_pr,
        update_message=f"{TITLE_PREFIX} update {names}",
        update_description=marker_line(key, content, source) + "\n\n" + "\n".join(changes), parent_commit=head)
    if open_pr is None:
        if superseded is not None:
            _close_superseded(repo, superseded, done.num)
        if done.num:  # the number is known now: the description's snippet names this PR's revision
            repo.set_description(done.num, _description(key, content, card_report, card_places, failed, changes,
                                                        left_out, stale, source, done.num))
        return PublishResult("opened", done.url, done.num, done.commit, repo_id, files)
    _after_update(repo, open_pr, done.commit, description, changes, failed)
    return PublishResult("updated", open_pr.url, open_pr.num, done.commit, repo_id, files)


def _root_config(repo_id: str, chosen: list[_Target], base_head: str, head: str, base_tree: dict, after: set[str],
                 token: str) -> bytes | None:
    """The repo's root config.json with `transformers.js_config` naming the external data of every graph in `onnx/`
    (`hfexport.formats.onnx.backend.transformers_js_config`), so transformers.js opens `onnx/model.onnx` or a dtype variant
    (`model_quantized.onnx`, `model_fp16.onnx`) with `dtype` alone; None when nothing changes, the repo has no
    config.json (a publication into another repo), or no ONNX generation target in the loaders' contract (nor in
    transformers.js' image-text-to-text layout, whose config may also need its text settings at the top level:
    `with_flat_text_settings`) is published in `onnx/` (forward targets' cards pass `use_external_data_format`
    instead). The owner's keys are kept."""
    onnx_folder = format_backend("onnx").folder  # transformers.js reads the root config for the graphs in `onnx/`
    if ROOT_CONFIG not in base_tree or not any(item.place.folder == onnx_folder and (
            (item.folder / GENAI_CONFIG_FILE).is_file() or _in_image_text_layout(item)) for item in chosen):
        return None
    text = _download_text(repo_id, ROOT_CONFIG, base_head, token)
    try:
        config = json.loads(text or "")
    except ValueError:
        return None
    if not isinstance(config, dict):
        return None
    onnx_files = [path.split("/", 1)[1] for path in after if path.startswith(f"{onnx_folder}/") and path.count("/") == 1]
    return _changed_json(repo_id, ROOT_CONFIG, base_head, head, text, transformers_js_config(config, onnx_files), token)


def _in_image_text_layout(item: _Target) -> bool:
    """Whether the target's folder holds transformers.js' image-text-to-text graphs (IMAGE_TEXT_FILES)."""
    return all((item.folder / name).is_file() for name in IMAGE_TEXT_FILES)


def _changed_json(repo_id: str, path: str, base_head: str, head: str, base_text: str | None, updated: dict,
                  token: str) -> bytes | None:
    """`updated` as the bytes of `path`, None where the publication's head already holds that JSON (the base's
    `base_text` where the head is the base)."""
    current = _download_text(repo_id, path, head, token) if head != base_head else base_text
    try:
        unchanged = json.loads(current or "") == updated
    except ValueError:
        unchanged = False
    return None if unchanged else (json.dumps(updated, indent=2) + "\n").encode("utf-8")


def _root_preprocessor_config(repo_id: str, chosen: list[_Target], base_head: str, head: str, base_tree: dict,
                              after: set[str], token: str) -> bytes | None:
    """The repo's root `preprocessor_config.json` as transformers.js' AutoProcessor reads it, for a VLM target
    published in transformers.js' image-text-to-text layout in `onnx/`; None where nothing changes or no such target
    is published there. AutoProcessor (src/models/auto/processing_auto.js, 4.3.2) reads that file alone, at the root:
    the image settings, and `processor_class`, which picks the processor that expands the image placeholder (without
    it a generic Processor hands the text to the image processor). A root without the file (transformers 5 keeps the
    image settings inside `processor_config.json`: "Could not locate file: .../preprocessor_config.json", measured on
    tiny LLaVA's pull request) gets the target's flat one; an owner's without `processor_class` gets the processor's
    (tiny Qwen2-VL's); the owner's other keys are kept."""
    onnx_folder = format_backend("onnx").folder
    flat = next((item.folder / PREPROCESSOR_CONFIG for item in chosen if item.place.folder == onnx_folder
                 and (item.folder / PREPROCESSOR_CONFIG).is_file() and _in_image_text_layout(item)), None)
    if flat is None:
        return None
    if PREPROCESSOR_CONFIG not in base_tree:
        return None if PREPROCESSOR_CONFIG in after else flat.read_bytes()
    text = _download_text(repo_id, PREPROCESSOR_CONFIG, base_head, token)
    try:
        own = json.loads(text or "")
        processor_class = json.loads(flat.read_text(encoding="utf-8")).get("processor_class")
    except ValueError:
        return None
    if not isinstance(own, dict) or own.get("processor_class") or not isinstance(processor_class, str):
        return None
    return _changed_json(repo_id, PREPROCESSOR_CONFIG, base_head, head, text, {**own, "processor_class": processor_class},
                         token)


def _layout_spec(item: _Target) -> dict:
    """What hfexport.layout needs to place a target: format, mode, the recipe's `path` and `file_name` (from the saved
    copy) and the conventional file name of what it is (its quantization, the dtype it was exported at)."""
    spec: dict = {}
    copy = item.folder / RECIPE_COPY_FILE
    if copy.is_file():
        try:
            spec = (json.loads(copy.read_text(encoding="utf-8")).get("targets") or {}).get(item.name, {})
        except (ValueError, AttributeError):
            spec = {}
    spec = spec if isinstance(spec, dict) else {}
    export_format = item.target.export_format
    return {"export_format": export_format, "mode": item.target.mode, "path": spec.get("path"),
            "file_name": spec.get("file_name"),
            "artifact": artifact_name(export_format, spec.get("quantization"), _export_dtype(item)),
            "loaders_contract": (item.folder / GENAI_CONFIG_FILE).is_file() or (item.folder / DECODER_FILE).is_file()
            or _deployable(item)}


def _deployable(item: _Target) -> bool:
    """A generation target saved in its runtimes' contract: one program under its format's loaders' name
    (`hfexport.formats.openvino.genai_layout`: OpenVINO's stateful `openvino_model.xml`), published in the format's folder."""
    try:
        components = json.loads((item.folder / MANIFEST_FILE).read_text(encoding="utf-8"))["components"]
    except (OSError, ValueError, KeyError, TypeError):
        return False
    files = [entry.get("file") for entry in components.values() if isinstance(entry, dict)]
    return item.target.mode == "generation" and files == [DEFAULT_NAMES.get(item.target.export_format)]


def _export_dtype(item: _Target) -> str | None:
    """The dtype the target's one component was exported at (the engine's manifest: `metadata.export_dtype`)."""
    try:
        components = json.loads((item.folder / MANIFEST_FILE).read_text(encoding="utf-8"))["components"]
    except (OSError, ValueError, KeyError, TypeError):
        return None
    dtypes = {str((entry.get("metadata") or {}).get("export_dtype")) for entry in components.values()}
    return dtypes.pop() if len(dtypes) == 1 else None


def _published_files(item: _Target) -> dict[str, Path | bytes]:
    """A target's files as published in its place (`layout.published_name`): ONNX external data `X.onnx.data` (what
    the engine writes) becomes `X.onnx_data`, the name optimum's `ORTModel*` and transformers.js download beside
    `X.onnx`, and the graph's external-data locations are rewritten to match (only those strings change; the weights
    are the same bytes). A variant's files get its stem (`model_quantized.onnx`, `model_quantized.export.json`, ...),
    and its manifest names the renamed artifact."""
    export_format, place = item.target.export_format, item.place
    names = {relative: published_name(place, relative, export_format) for relative in item.files}
    published: dict[str, Path | bytes] = {names[relative]: path for relative, path in item.files.items()}
    # ONNX: a graph names its external data's published name (the engine's `X.onnx.data`, or the contract's
    # `model.onnx_data` of a variant)
    published.update(format_program(export_format).published(item.files, names))
    if place.stem and MANIFEST_FILE in item.files:
        manifest = json.loads(item.files[MANIFEST_FILE].read_text(encoding="utf-8"))
        for entry in manifest.get("components", {}).values():
            entry["file"] = published_name(place, entry["file"], export_format)
        published[names[MANIFEST_FILE]] = (json.dumps(manifest, indent=2, sort_keys=True) + "\n").encode("utf-8")
    return published


def _owner_edited_readme(api, repo_id: str, num: int, base: str, base_tree: dict[str, dict], token: str) -> bool:
    """Whether README.md on `base` changed since the PR forked from it: then an update in place would need a merge
    of two README edits, which may conflict; a fresh PR from the branch head never does."""
    pr_commits = _call(lambda: [c.commit_id for c in api.list_repo_commits(repo_id, revision=f"refs/pr/{num}",
                                                                           token=token)],
                       repo_id, f"listing the commits of refs/pr/{num}")
    base_commits = _call(lambda: {c.commit_id for c in api.list_repo_commits(repo_id, revision=base, token=token)},
                         repo_id, f"listing the commits of {base}")
    fork = next((commit for commit in pr_commits if commit in base_commits), None)
    if fork is None:
        return True
    at_fork = _remote_tree(api, repo_id, fork, token, paths=[README])
    return (at_fork.get(README) or {}).get("oid") != (base_tree.get(README) or {}).get("oid")


def _close_superseded(repo: HubRepo, old: OpenPublication, new_num: int | None) -> None:
    """Close the PR a fresh one replaced, saying which; the new PR is already open, so this only warns."""
    repo.close_pull_request(old.num, f"Superseded by #{new_num}: the README changed on the target branch since this "
                            "pull request was opened, so hfexport opened a fresh one from the branch's current head "
                            "(it merges cleanly) with every target this one held.")


def _after_update(repo: HubRepo, open_pr: OpenPublication, commit: str, description: str, changes: list[str],
                  failed: list[str]) -> None:
    """Comment what changed on the PR and refresh its description; the commit is already in, so these only warn."""
    warning = _failed_banner(failed) + "\n\n" if failed else ""
    repo.comment(open_pr.num, warning + f"hfexport pushed {commit[:12]}:\n\n" + "\n".join(f"- {line}" for line in changes))
    if open_pr.description_id:
        repo.set_description(open_pr.num, description, open_pr.description_id)


# ── local side ───────────────────────────────────────────────────────────────


def _local_targets(output: Path, names: list[str] | None) -> list[_Target]:
    """The target folders of OUTPUT to publish (all with a report, or `names`), with their reports and files."""
    if not output.is_dir():
        raise PublishError(f"{output}: no such folder (expected an `hfexport export` OUTPUT folder)")
    if names:
        folders = []
        for name in dict.fromkeys(names):
            folder = output / name
            if not (folder / REPORT_FILE).is_file():
                if _unchanged_in_summary(output, name):
                    continue  # a cache hit against the Hub: nothing local to publish
                raise PublishError(f"no export of target {name!r} in {output} (expected {folder / REPORT_FILE})")
            folders.append(folder)
    else:
        folders = sorted(p.parent for p in output.glob(f"*/{REPORT_FILE}") if not p.parent.name.startswith("."))
        if not folders and not (output / REPORT_FILE).is_file():
            raise PublishError(f"nothing to publish in {output}: no <target>/{REPORT_FILE} (run `hfexport export` first)")
    chosen = []
    for folder in folders:
        report = JobReport.read(folder)
        if folder.name not in report.targets:
            raise PublishError(f"{folder / REPORT_FILE} does not describe target {folder.name!r}")
        files = {p.relative_to(folder).as_posix(): p for p in sorted(folder.rglob("*"))
                 if p.is_file() and not p.name.startswith(".")}
        chosen.append(_Target(folder.name, folder, report, files))
    return chosen


def _unchanged_in_summary(output: Path, name: str) -> bool:
    try:
        summary = JobReport.read(output)
    except Exception:  # noqa: BLE001 - no summary: not a cache hit
        return False
    return name in summary.targets and summary.targets[name].status == "unchanged"


def split_failed(chosen: list[_Target], allow_failed: bool) -> tuple[list[_Target], dict[str, str]]:
    """(targets to publish, {target: why it is left out}). A target whose export failed has no artifacts and is
    always left out; one that failed parity is left out unless `allow_failed`. When targets were chosen but every
    one is left out, there is nothing to publish: `PublishRefusedError` naming each reason."""
    publish, left_out = [], {}
    for item in chosen:
        status = item.target.status
        if status == "error":
            left_out[item.name] = f"its export failed: {item.target.error or 'no artifacts'}"
        elif status == "failed" and not allow_failed:
            left_out[item.name] = f"failed parity verification: {item.target.error or 'see its report'}"
        else:
            publish.append(item)
    if chosen and not publish:
        reasons = "; ".join(f"{name} {why}" for name, why in left_out.items())
        raise PublishRefusedError(
            f"nothing to publish: every target failed ({reasons}); fix the export, or publish the failed artifacts "
            "anyway, flagged at the top of the PR (--allow-failed / allow_failed=True)")
    return publish, left_out


def _size(content: Path | bytes) -> int:
    return len(content) if isinstance(content, bytes) else content.stat().st_size


def _git_blob_sha1(content: Path | bytes) -> str:
    if isinstance(content, bytes):
        return hashlib.sha1(b"blob %d\0" % len(content) + content).hexdigest()
    return git_blob_sha1(content)


def _sha256(content: Path | bytes) -> str:
    if isinstance(content, bytes):
        return hashlib.sha256(content).hexdigest()

    return file_sha256(content)


def _content_hash(chosen: list[_Target]) -> str:
    """What a publication holds: each published file's git blob id, where it lies, and each target's cache key and
    status."""
    entries = []
    for item in sorted(chosen, key=lambda i: i.name):
        where = item.place.label() if item.place.stem else item.place.folder
        entries.append([item.name, where, item.target.cache_key, item.target.status])
        entries += [[item.name, rel, _git_blob_sha1(content)] for rel, content in sorted(item.published.items())
                    if rel != item.place.prefix + REPORT_FILE]
    return hashlib.sha256(canonical_json(entries).encode()).hexdigest()


# ── remote side ──────────────────────────────────────────────────────────────


def _ensure_repo(api, repo_id: str, base: str, mode: str, token: str) -> None:
    from huggingface_hub.errors import RepositoryNotFoundError, RevisionNotFoundError

    try:
        api.repo_info(repo_id, revision=base, token=token)
        return
    except RevisionNotFoundError:
        raise PublishError(f"branch {base!r} not found in {repo_id}") from None
    except Exception as error:  # noqa: BLE001 - mapped to one readable line
        status = getattr(getattr(error, "response", None), "status_code", None)
        if not isinstance(error, RepositoryNotFoundError) or status == 401:
            raise HubRepo(repo_id, error_class=PublishError).error(error, "reading the repo", base) from None
    if mode != "commit":
        raise PublishError(f"repository {repo_id} not found, or the token cannot see it: a pull request needs an "
                           "existing repo (use --commit to create one)")
    _call(lambda: api.create_repo(repo_id, exist_ok=True, token=token), repo_id, "creating the repo")


def _remote_tree(api, repo_id: str, revision: str, token: str, paths: list[str] | None = None) -> dict[str, dict]:
    """Every file at `revision` (or only `paths`): path -> {"oid": git blob id, "sha256": LFS sha256 or None, "size"}."""
    try:
        entries = api.get_paths_info(repo_id, paths, revision=revision, token=token) if paths is not None else \
            api.list_repo_tree(repo_id, recursive=True, revision=revision, token=token)
        entries = list(entries)
    except Exception as error:  # noqa: BLE001
        raise HubRepo(repo_id, error_class=PublishError).error(error, f"listing the files of {revision[:12]}") from None
    return {
        entry.path: {"oid": entry.blob_id, "sha256": entry.lfs.sha256 if entry.lfs else None, "size": entry.size}
        for entry in entries if hasattr(entry, "blob_id")
    }


def _remote_targets(repo_id: str, revision: str, tree: dict[str, dict], token: str) -> dict[str, _RemoteTarget]:
    """The targets `revision` holds (hfexport.layout finds their folders), each with its files and report."""
    found = target_places(set(tree), lambda path: _download_text(repo_id, path, revision, token))
    targets = {}
    for name, place in found.items():
        files = {relative: tree[f"{place.folder}/{relative}"] for relative in place_files(place, tree)}
        targets[name] = _RemoteTarget(name, place, files, _remote_report(repo_id, revision, place, name, token)
                                      if place.prefix + REPORT_FILE in files else None)
    return targets


def _same_remote(a: _RemoteTarget | None, b: _RemoteTarget | None) -> bool:
    return a is not None and b is not None and a.place == b.place and \
        {k: v["oid"] for k, v in a.files.items()} == {k: v["oid"] for k, v in b.files.items()}


def _download(repo_id: str, path: str, revision: str, token: str) -> Path:
    return HubRepo(repo_id, revision, token, error_class=PublishError).download(path, required=True)


def _download_text(repo_id: str, path: str, revision: str, token: str) -> str | None:
    """A text file at `revision`, decoded from its exact bytes (CRLF kept), or None when absent (a 404: the Hub
    failing or unreachable raises `PublishError`, so a README is never taken for missing and overwritten)."""
    return HubRepo(repo_id, revision, token, error_class=PublishError).read_text(path)


def _remote_report(repo_id: str, revision: str, place: Place, name: str, token: str) -> JobReport | None:
    """The target's `export_report.json` at `revision` (None when absent, unreadable, or not about `name`)."""
    text = _download_text(repo_id, place.path(REPORT_FILE), revision, token)
    try:
        report = JobReport.from_dict(json.loads(text)) if text else None
    except Exception:  # noqa: BLE001 - an unreadable remote report means "changed"
        return None
    return report if report is not None and name in report.targets else None


def _readme(repo_id: str, revision: str, token: str) -> str | None:
    return _download_text(repo_id, README, revision, token)


def _same_artifacts(item: _Target, theirs: dict[str, dict]) -> bool:
    report = item.place.prefix + REPORT_FILE
    ours = {rel for rel in item.published if rel != report}
    if ours != {rel for rel in theirs if rel != report}:
        return False
    for rel in ours:
        entry, content = theirs[rel], item.published[rel]
        if entry["size"] != _size(content):
            return False
        if entry["sha256"] and entry["sha256"] != _sha256(content) or not entry["sha256"] and entry["oid"] != _git_blob_sha1(content):
            return False
    return True


def _same_inputs(item: _Target, old_job: JobReport | None) -> bool:
    ours, old = item.target, old_job.targets[item.name] if old_job else None
    return old is not None and ours.cache_key is not None and old.cache_key == ours.cache_key and old.status == ours.status


def _source_id(report: JobReport) -> str | None:
    return report.source.get("content_hash") or report.source.get("commit")


def _describe_change(item: _Target, old_job: JobReport | None) -> str:
    """One line saying why a target is published again: new, model files, recipe, packages, status or artifacts."""
    new = item.target
    if old_job is None:
        return f"`{item.name}`: added ({format_label(new.export_format)} / {new.mode})"
    old, reasons = old_job.targets[item.name], []
    before, after = _source_id(old_job), _source_id(item.report)
    if before and after and before != after:
        reasons.append(f"model files changed ({before[:12]} → {after[:12]})")
    if old.recipe_target_sha256 != new.recipe_target_sha256:
        reasons.append(f"recipe target changed ({old.recipe_target_sha256[:12]} → {new.recipe_target_sha256[:12]})")
    versions = sorted(name for name in set(old_job.packages) | set(item.report.packages)
                      if old_job.packages.get(name) != item.report.packages.get(name))
    if versions:
        reasons.append("package versions changed (" + ", ".join(
            f"{name} {old_job.packages.get(name, '-')} → {item.report.packages.get(name, '-')}" for name in versions) + ")")
    if old.status != new.status:
        reasons.append(f"status {old.status} → {new.status}")
    if not reasons:
        reasons.append("artifacts changed")
    return f"`{item.name}`: " + "; ".join(reasons)


def _card_report(chosen: list[_Target], remote: dict[str, _RemoteTarget]
                 ) -> tuple[JobReport, dict[str, Place], dict[str, dict]]:
    """One report for the card and the description: every target the publication holds (the published ones, and
    those already there and not republished), with each one's place."""
    first = chosen[0].report
    # the job's own memory (its load's peak, the preflight's estimate per stage) beside the targets' stages: the
    # description's and summary's memory line (hfexport.report.markdown.memory_line)
    report = JobReport(source=first.source, packages=first.packages, created_at=first.created_at,
                       hfexport_version=first.hfexport_version, memory=first.memory)
    folders, sources = {}, {}
    for name, target in remote.items():
        if target.report is not None:
            held = {relative: int(entry.get("size") or 0) for relative, entry in target.files.items()}
            report.targets[name] = _as_published(_with_run(target.report, name), held)
            folders[name] = target.place
            sources[name] = target.report.source
    for item in chosen:
        published = {relative: _size(content) for relative, content in item.published.items()}
        report.targets[item.name], folders[item.name] = _as_published(item.target, published), item.place
        sources.pop(item.name, None)
    report.targets = dict(sorted(report.targets.items()))
    return report, folders, sources


def _as_published(target: TargetReport, files: dict[str, int]) -> TargetReport:
    """`target` listing the files its folder holds in the publication (`files`: name -> bytes), as uploaded: the
    loaders' names (`model.onnx_data`), its report and manifest included; the card and the description count and
    list these, not the job's own file names."""
    if not files:
        return target
    entries = [{"path": name, "bytes": size} for name, size in sorted(files.items())]
    return TargetReport.from_dict({**target.to_dict(), "files": entries, "total_bytes": sum(files.values())})


def _with_run(report: JobReport, name: str) -> TargetReport:
    """`report`'s target, its latency naming the run that measured it (a report from before runs were recorded gets
    its job's time and source): a card's latency table then never mixes runs unsaid."""
    target = report.targets[name]
    latency = target.latency or {}
    if not latency.get("points") or latency.get("run"):
        return target
    source = report.source or {}
    run = {"run": report.created_at, "run_source": str(source.get("commit") or source.get("content_hash") or "")[:12]}
    return TargetReport.from_dict({**target.to_dict(), "latency": {**latency, **run}})


def _stale(sources: dict[str, dict], chosen: list[_Target]) -> dict[str, str]:
    """Targets held but not republished (`sources`: their reports' sources) built from other model files than this
    publication's: {target: what built it}."""
    now = _source_id(chosen[0].report)
    stale = {}
    for name, source in sorted(sources.items()):
        before = source.get("content_hash") or source.get("commit")
        if now and before and before != now:
            revision = source.get("commit") or source.get("revision")
            stale[name] = (f"built from model files {before[:12]}" + (f" (revision {revision[:12]})" if revision else "")
                           + f", not the {now[:12]} the other targets were built from")
    return stale


def _base_model(report: JobReport, repo_id: str) -> str | None:
    """The source model's repo id when publishing into another repo (the card's `base_model`), else None."""
    model = str(report.source.get("model") or "")
    return model if model != repo_id and looks_like_repo_id(model) and not Path(model).exists() else None


def _failed_banner(failed: list[str]) -> str:
    return (f"> [!WARNING]\n> **Parity verification failed** for {', '.join(f'`{n}`' for n in failed)}: published "
            "anyway with `--allow-failed`. Check the report below before merging.")


def _description(key: str, content: str, report: JobReport, folders: dict[str, Place], failed: list[str],
                 changes: list[str], left_out: dict[str, str] | None = None, stale: dict[str, str] | None = None,
                 source: str | None = None, pr_num: int | None = None) -> str:
    """The PR's description; `pr_num` fills its revision in the snippet (a new PR's is filled in once opened)."""
    lines = [marker_line(key, content, source), ""]
    if failed:
        lines += [_failed_banner(failed), ""]
    if left_out:
        lines += ["Not published (they did not pass here; the targets above did):", "",
                  *[f"- `{name}`: {why}" for name, why in left_out.items()], ""]
    if stale:
        lines += ["Stale (built from an older revision of the model; re-export them to refresh):", "",
                  *[f"- `{name}`: {why}" for name, why in stale.items()], ""]
    lines += [
        f"This pull request adds exported artifacts of this model, made by hfexport from {recipe_origin(report)}, "
        "each in the folder and under the file name where the usual loaders of its format look, and a section of the "
        "model card that lists them with how to load each. Beside each target's files are hfexport's manifest "
        "(`export.json`), the recipe target used (`export_config.json`) and its report (`export_report.json`); a "
        "variant's start with its file's stem (`model_quantized.export.json`).",
        "",
        "Targets in this pull request:",
        "",
        *[f"- `{name}` → `{folders[name].label()}` ({format_label(target.export_format)} / {target.mode})"
          for name, target in report.targets.items()],
        "",
        *(["Try it before merging (this PR's revision):", "", "```python", "import hfexport", "",
           f'model = hfexport.load("{key.split("@")[0]}", target="{next(iter(report.targets))}", '
           f'revision="refs/pr/{pr_num}")', "```", ""] if pr_num else []),
        "Changes:",
        "",
        *[f"- {line}" for line in changes],
        "",
        report_markdown(report, publication=True).rstrip("\n"),
    ]
    return "\n".join(lines) + "\n"


# ── errors ───────────────────────────────────────────────────────────────────


def _call(function, repo_id: str, action: str):
    """`function()` (an `HfApi` call), its failure raised as one readable `PublishError` line."""
    return HubRepo(repo_id, error_class=PublishError).call(function, action)
