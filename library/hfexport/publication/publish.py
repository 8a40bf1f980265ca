"""Publishing an OUTPUT folder to the Hub: one commit per publication, one pull request per model.

Each target folder `OUTPUT/<target>/` is uploaded to `exports/<target>/` of the repo, together with the README's
hfexport card section (`hfexport.report.card`), in a single `HfApi.create_commit` (the Hub applies a commit entirely or
not at all, so a failure leaves no half-made PR). In `mode="pr"` the PR description carries a marker
`<!-- hfexport:publication {"key": ..., "content": ...} -->`; the next publication finds the open PR with the same
key and pushes one commit onto its `refs/pr/N` (with a comment saying what changed), or does nothing when the
PR head already holds the same artifacts built from the same source, recipe and package versions.
"""

from __future__ import annotations

import hashlib
import json
import os
import re
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

from hfexport.errors import (
    CardError,
    PublishError,
    PublishRefusedError,
    register_secret,
)
from hfexport.files import EXPORTS_DIR, REPORT_FILE, file_sha256, git_blob_sha1
from hfexport.hub import hub_error, looks_like_repo_id
from hfexport.progress import Step
from hfexport.recipe.validation import canonical_json
from hfexport.report.card import format_tags, render_section, update_card
from hfexport.report.markdown import report_markdown
from hfexport.report.model import JobReport, TargetReport

README = "README.md"
TITLE_PREFIX = "hfexport:"
MARKER = "hfexport:publication"
_MARKER_RE = re.compile(r"<!--\s*hfexport:publication\s+(\{.*?\})\s*-->", re.S)
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


@dataclass
class OpenPublication:
    """An open hfexport pull request: its number, URL, first comment (the description) and marker."""

    num: int
    url: str
    description_id: str | None
    marker: dict


@dataclass
class _Target:
    name: str
    folder: Path
    report: JobReport
    files: dict[str, Path]  # path relative to the target folder -> local file

    @property
    def target(self) -> TargetReport:
        return self.report.targets[self.name]


def publication_key(repo_id: str, base: str) -> str:
    """What identifies one model's publication: the repo and the branch its PR targets."""
    return f"{repo_id}@{base}"


def marker_line(key: str, content: str) -> str:
    return f"<!-- {MARKER} {json.dumps({'key': key, 'content': content}, sort_keys=True)} -->"


def parse_marker(text: str | None) -> dict | None:
    """The publication marker of a PR description, or None."""
    match = _MARKER_RE.search(text or "")
    if not match:
        return None
    try:
        value = json.loads(match.group(1))
    except ValueError:
        return None
    return value if isinstance(value, dict) and isinstance(value.get("key"), str) else None


def resolve_token(token: str | None) -> str | None:
    """The token argument, else HF_TOKEN, else the saved login (huggingface_hub's lookup); registered for redaction."""
    if not token:
        from huggingface_hub import get_token

        token = os.environ.get("HF_TOKEN") or get_token()
    register_secret(token)
    return token or None


def find_open_publication(repo_id: str, base: str = "main", token: str | None = None, api=None) -> OpenPublication | None:
    """The open hfexport PR of `repo_id` whose marker has this publication's key, or None."""
    from huggingface_hub import HfApi

    api = api or HfApi()
    key = publication_key(repo_id, base)
    for discussion in api.get_repo_discussions(repo_id, discussion_type="pull_request", discussion_status="open",
                                               token=token):
        if not discussion.title.startswith(TITLE_PREFIX):
            continue
        details = api.get_discussion_details(repo_id, discussion.num, token=token)
        first = next((event for event in details.events if event.type == "comment"), None)
        marker = parse_marker(getattr(first, "content", None))
        if marker and marker["key"] == key and (details.target_branch or f"refs/heads/{base}").endswith(base):
            return OpenPublication(discussion.num, details.url, getattr(first, "id", None), marker)
    return None


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

    from huggingface_hub import HfApi

    api = HfApi(token=token)
    emit(Step("publish", "start", detail=f"{repo_id} ({mode})"))
    try:
        result = _publish(api, output, repo_id, chosen, mode=mode, base=base, token=token, allow_failed=allow_failed,
                          left_out=left_out)
    except PublishError as error:
        emit(Step("publish", "error", detail=str(error)))
        raise
    result.left_out = dict(left_out)
    emit(Step("publish", "done", detail=f"{result.action}: {result.pr_url or result.commit or repo_id}"
              + (f" (left out: {', '.join(left_out)})" if left_out else "")))
    return result


# ── the steps ────────────────────────────────────────────────────────────────


def _publish(api, output: Path, repo_id: str, chosen: list[_Target], *, mode: str, base: str, token: str,
             allow_failed: bool, left_out: dict[str, str]) -> PublishResult:
    what = f"publishing to {repo_id}"
    _ensure_repo(api, repo_id, base, mode, token)
    open_pr = _call(lambda: find_open_publication(repo_id, base, token, api), repo_id, "looking for an open hfexport PR") \
        if mode == "pr" else None
    if not chosen:  # every target was a cache hit against the Hub: nothing local to publish
        return PublishResult("unchanged", open_pr.url if open_pr else None, open_pr.num if open_pr else None,
                             None, repo_id, [])
    head_revision = f"refs/pr/{open_pr.num}" if open_pr else base
    head = _call(lambda: api.repo_info(repo_id, revision=head_revision, token=token).sha, repo_id,
                 f"reading {head_revision}")
    remote = _remote_files(api, repo_id, head, token)

    changed, changes, deletions = [], [], []
    for item in chosen:
        prefix = f"{EXPORTS_DIR}/{item.name}/"
        theirs = {path[len(prefix):]: entry for path, entry in remote.items() if path.startswith(prefix)}
        old = _remote_report(repo_id, head, item.name, token) if REPORT_FILE in theirs else None
        if _same_artifacts(item, theirs) and _same_inputs(item, old):
            continue
        changed.append(item)
        changes.append(_describe_change(item, old))
        deletions += [prefix + path for path in theirs if path not in item.files]
    content = _content_hash(chosen)
    if not changed:
        return PublishResult("unchanged", open_pr.url if open_pr else None, open_pr.num if open_pr else None, head,
                             repo_id, [])

    from huggingface_hub import CommitOperationAdd, CommitOperationDelete

    operations, files = [], []
    for item in changed:
        for relative, local in sorted(item.files.items()):
            path = f"{EXPORTS_DIR}/{item.name}/{relative}"
            operations.append(CommitOperationAdd(path_in_repo=path, path_or_fileobj=str(local)))
            files.append(path)
    operations += [CommitOperationDelete(path_in_repo=path) for path in sorted(deletions)]
    card_report = _card_report(repo_id, head, chosen, remote, token)
    readme = _readme(repo_id, head, token)

    try:
        new_readme = update_card(readme, render_section(repo_id, card_report, left_out=left_out),
                                 format_tags(card_report.targets))
    except CardError as error:
        raise PublishError(f"{repo_id}: {error}") from None
    if new_readme != readme:
        operations.append(CommitOperationAdd(path_in_repo=README, path_or_fileobj=new_readme.encode("utf-8")))
        files.append(README)

    failed = [item.name for item in chosen if item.target.status == "failed"] if allow_failed else []
    key = publication_key(repo_id, base)
    names = ", ".join(item.name for item in changed)
    description = _description(key, content, card_report, failed, changes, left_out)
    if mode == "commit":
        info = _call(lambda: api.create_commit(repo_id, operations, commit_message=f"hfexport: export {names}",
                                               commit_description=description, revision=base, parent_commit=head,
                                               token=token), repo_id, f"committing to {base}")
        return PublishResult("committed", None, None, info.oid, repo_id, files)
    if open_pr is None:
        info = _call(lambda: api.create_commit(repo_id, operations, commit_message=f"{TITLE_PREFIX} add exports ({names})",
                                               commit_description=description, revision=base, create_pr=True,
                                               parent_commit=head, token=token), repo_id, "opening a pull request")
        return PublishResult("opened", info.pr_url, info.pr_num, info.oid, repo_id, files)
    info = _call(lambda: api.create_commit(repo_id, operations, commit_message=f"{TITLE_PREFIX} update {names}",
                                           commit_description=marker_line(key, content) + "\n\n" + "\n".join(changes),
                                           revision=f"refs/pr/{open_pr.num}", parent_commit=head, token=token),
                 repo_id, f"pushing to refs/pr/{open_pr.num}")
    _after_update(api, repo_id, open_pr, info.oid, description, changes, failed, token)
    return PublishResult("updated", open_pr.url, open_pr.num, info.oid, repo_id, files)


def _after_update(api, repo_id: str, open_pr: OpenPublication, commit: str, description: str, changes: list[str],
                  failed: list[str], token: str) -> None:
    """Comment what changed on the PR and refresh its description; the commit is already in, so these only warn."""
    warning = _failed_banner(failed) + "\n\n" if failed else ""
    comment = warning + f"hfexport pushed {commit[:12]}:\n\n" + "\n".join(f"- {line}" for line in changes)
    for action in (lambda: api.comment_discussion(repo_id, open_pr.num, comment, token=token),
                   lambda: open_pr.description_id and api.edit_discussion_comment(
                       repo_id, open_pr.num, open_pr.description_id, description, token=token)):
        try:
            action()
        except Exception:  # noqa: BLE001 - the publication itself succeeded; the comment is a courtesy
            pass


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


def _sha256(path: Path) -> str:

    return file_sha256(path)


def _content_hash(chosen: list[_Target]) -> str:
    """What a publication holds: each artifact's git blob id, and each target's cache key and status."""
    entries = []
    for item in sorted(chosen, key=lambda i: i.name):
        entries.append([item.name, item.target.cache_key, item.target.status])
        entries += [[item.name, rel, git_blob_sha1(p)] for rel, p in sorted(item.files.items()) if rel != REPORT_FILE]
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
            raise hub_error(error, repo_id, "reading the repo", error_class=PublishError) from None
    if mode != "commit":
        raise PublishError(f"repository {repo_id} not found, or the token cannot see it: a pull request needs an "
                           "existing repo (use --commit to create one)")
    _call(lambda: api.create_repo(repo_id, exist_ok=True, token=token), repo_id, "creating the repo")


def _remote_files(api, repo_id: str, revision: str, token: str) -> dict[str, dict]:
    """`exports/**` at `revision`: path -> {"oid": git blob id, "sha256": LFS sha256 or None, "size"}."""
    from huggingface_hub.errors import EntryNotFoundError

    try:
        entries = list(api.list_repo_tree(repo_id, path_in_repo=EXPORTS_DIR, recursive=True, revision=revision, token=token))
    except EntryNotFoundError:
        return {}
    except Exception as error:  # noqa: BLE001
        raise hub_error(error, repo_id, f"listing {EXPORTS_DIR}/", error_class=PublishError) from None
    return {
        entry.path: {"oid": entry.blob_id, "sha256": entry.lfs.sha256 if entry.lfs else None, "size": entry.size}
        for entry in entries if hasattr(entry, "blob_id")
    }


def _download_text(repo_id: str, path: str, revision: str, token: str) -> str | None:
    from huggingface_hub import hf_hub_download
    from huggingface_hub.errors import EntryNotFoundError

    try:
        return Path(hf_hub_download(repo_id, path, revision=revision, token=token)).read_text(encoding="utf-8")
    except EntryNotFoundError:
        return None
    except Exception as error:  # noqa: BLE001
        raise hub_error(error, repo_id, f"reading {path}", error_class=PublishError) from None


def _remote_report(repo_id: str, revision: str, name: str, token: str) -> JobReport | None:
    """`exports/<name>/export_report.json` at `revision` (None when absent, unreadable, or not about `name`)."""
    text = _download_text(repo_id, f"{EXPORTS_DIR}/{name}/{REPORT_FILE}", revision, token)
    try:
        report = JobReport.from_dict(json.loads(text)) if text else None
    except Exception:  # noqa: BLE001 - an unreadable remote report means "changed"
        return None
    return report if report is not None and name in report.targets else None


def _readme(repo_id: str, revision: str, token: str) -> str | None:
    return _download_text(repo_id, README, revision, token)


def _same_artifacts(item: _Target, theirs: dict[str, dict]) -> bool:
    ours = {rel for rel in item.files if rel != REPORT_FILE}
    if ours != {rel for rel in theirs if rel != REPORT_FILE}:
        return False
    for rel in ours:
        entry, local = theirs[rel], item.files[rel]
        if entry["size"] != local.stat().st_size:
            return False
        if entry["sha256"] and entry["sha256"] != _sha256(local) or not entry["sha256"] and entry["oid"] != git_blob_sha1(local):
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
        return f"`{item.name}`: added ({new.export_format} / {new.mode})"
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


def _card_report(repo_id: str, head: str, chosen: list[_Target], remote: dict[str, dict], token: str) -> JobReport:
    """One report for the card: the published targets, plus targets already in `exports/` but not republished."""
    first = chosen[0].report
    report = JobReport(source=first.source, packages=first.packages, created_at=first.created_at,
                       hfexport_version=first.hfexport_version)
    names = {item.name for item in chosen}
    others = sorted({path.split("/")[1] for path in remote if path.count("/") >= 2} - names)
    for name in others:
        old = _remote_report(repo_id, head, name, token)
        if old is not None:
            report.targets[name] = old.targets[name]
    for item in chosen:
        report.targets[item.name] = item.target
    report.targets = dict(sorted(report.targets.items()))
    return report


def _failed_banner(failed: list[str]) -> str:
    return (f"> [!WARNING]\n> **Parity verification failed** for {', '.join(f'`{n}`' for n in failed)}: published "
            "anyway with `--allow-failed`. Check the report below before merging.")


def _description(key: str, content: str, report: JobReport, failed: list[str], changes: list[str],
                 left_out: dict[str, str] | None = None) -> str:
    lines = [marker_line(key, content), ""]
    if failed:
        lines += [_failed_banner(failed), ""]
    if left_out:
        lines += ["Not published (they did not pass here; the targets above did):", "",
                  *[f"- `{name}`: {why}" for name, why in left_out.items()], ""]
    lines += [
        "This pull request adds exported artifacts of this model, made by hfexport from the repo's export recipe, "
        f"under `{EXPORTS_DIR}/<target>/`, and a section of the model card that lists them. Each target folder holds the "
        "artifacts, the recipe target used (`export_config.json`) and its report (`export_report.json`).",
        "",
        "Changes:",
        "",
        *[f"- {line}" for line in changes],
        "",
        report_markdown(report).rstrip("\n"),
    ]
    return "\n".join(lines) + "\n"


# ── errors ───────────────────────────────────────────────────────────────────


def _call(function, repo_id: str, action: str):
    try:
        return function()
    except PublishError:
        raise
    except Exception as error:  # noqa: BLE001 - every Hub failure becomes one readable line
        raise hub_error(error, repo_id, action, error_class=PublishError) from None
