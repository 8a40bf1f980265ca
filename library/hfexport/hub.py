"""The one adapter between hfexport and huggingface_hub: `HubRepo` (read a file, list files, open or update
hfexport's pull request, on one repo at one revision), repo ids, and the mapping of huggingface_hub's errors to
hfexport's (`hub_error`). An unreachable Hub is an error everywhere, never a file that is absent.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass, field
from pathlib import Path

from hfexport.errors import HfExportError, PublishError, SourceError, first_line, redact, register_secret


def looks_like_repo_id(value: str) -> bool:
    return bool(re.fullmatch(r"[A-Za-z0-9][A-Za-z0-9_.-]*(/[A-Za-z0-9][A-Za-z0-9_.-]*)?", value)) and ".." not in value


PRIVATE_REPO_HINT = " (for a private repo, pass a token or set HF_TOKEN)"
TRANSPORT_ERRORS = {"TransportError", "ConnectionError", "RemoteProtocolError", "TimeoutException"}
TRANSIENT_STATUS = {408, 429, 500, 502, 503, 504}


def hub_error(error: BaseException, repo_id: str, action: str, *, revision: str | None = None,
              token: str | None = None, error_class: type[HfExportError] = SourceError,
              where: str | None = None) -> HfExportError:
    """A huggingface_hub failure as one readable hfexport error: what was being done, what it means, what to do.

    The one mapping from huggingface_hub's error hierarchy (and HTTP status codes) to hfexport's; every module that
    calls the Hub raises what this returns. Never carries the token.

    Args:
        error: what huggingface_hub (or the transport under it) raised.
        repo_id: the repo the call was about.
        action: what was being done, as a phrase: "reading export.json", "opening the pull request".
        revision: the revision asked for, named when it does not exist.
        token: the token used (only whether there was one matters: the hint for private repos).
        error_class: `SourceError` for reads (the default), `PublishError` for writes.
        where: a prefix naming what asked (a recipe path such as `targets.onnx.quantization.calibration`).

    Returns:
        An instance of `error_class` (raise it `from None`: the message says everything).
    """
    from huggingface_hub.errors import (
        GatedRepoError,
        LocalEntryNotFoundError,
        RepositoryNotFoundError,
        RevisionNotFoundError,
    )

    prefix = f"{where}: " if where else ""
    # A commit is applied entirely or not at all, so a failed write left nothing behind: say so.
    writing = issubclass(error_class, PublishError)
    nothing_written = "nothing was published" if writing else "nothing was written"
    status = getattr(getattr(error, "response", None), "status_code", None)
    if isinstance(error, LocalEntryNotFoundError):
        # A subclass of EntryNotFoundError that means "the Hub could not be reached and nothing is cached", not
        # "the repo has no such file": taking it for the latter reported an unreachable Hub as "no recipe".
        cause = getattr(getattr(error.__cause__, "response", None), "status_code", None)
        answered = f" (it answered {cause})" if cause else ""
        message = f"cannot reach the Hub for {repo_id} while {action}{answered}, and nothing is in the local cache"
    elif isinstance(error, RevisionNotFoundError):
        message = f"revision {revision!r} not found in {repo_id}" if revision else f"revision not found in {repo_id}"
    elif isinstance(error, GatedRepoError):
        message = f"{repo_id} is gated: request access on the Hub, then pass a token"
    elif isinstance(error, RepositoryNotFoundError) and not writing:
        # The Hub answers 401 for a repo it will not show (missing, or private to others): not a token problem.
        message = f"repository {repo_id} not found or not accessible{'' if token else PRIVATE_REPO_HINT}"
    elif status == 401:
        message = (f"the Hub rejected the token while {action} on {repo_id} (401 unauthorized): pass a valid token with "
                   "--token, set HF_TOKEN or run `hf auth login`")
    elif status == 403:
        message = (f"the token may not write to {repo_id} (403 forbidden) while {action}: use a token with write "
                   "access to this repo")
    elif isinstance(error, RepositoryNotFoundError) or status == 404:
        message = f"repository {repo_id} not found or not accessible{'' if token else PRIVATE_REPO_HINT}"
    elif status == 412:
        message = f"{repo_id} changed while {action} (412): {nothing_written}; run again"
    elif is_transport_error(error):
        message = (f"the connection to the Hub dropped while {action} on {repo_id}: {nothing_written} (a commit is "
                   "applied entirely or not at all); run the command again")
    elif status is not None and status >= 500:
        message = (f"the Hub failed ({status}) while {action} on {repo_id}"
                   + (f": {nothing_written}" if writing else "") + "; try again later")
    elif isinstance(error, (OSError, ValueError)) and status is None:
        message = f"cannot reach the Hub for {repo_id} while {action}: {first_line(error)}"
    else:
        message = f"Hub error while {action} on {repo_id}: {first_line(error)}"
    mapped = error_class(prefix + redact(message))
    # Worth trying again later (the Hub overloaded, rate-limiting, or the connection failing), not a refusal.
    mapped.transient = status in TRANSIENT_STATUS or (status or 0) >= 500 or (
        status is None and is_transport_error(error)) or (
        isinstance(error, LocalEntryNotFoundError) and error.__cause__ is not None)  # a download that reached nothing
    return mapped


def is_transport_error(error: BaseException) -> bool:
    """Whether `error` (or what caused it) is the connection failing, not the Hub answering."""
    current: BaseException | None = error
    while current is not None:
        if {cls.__name__ for cls in type(current).__mro__} & TRANSPORT_ERRORS:
            return True
        current = current.__cause__ or current.__context__
    return False


# ── one repo ─────────────────────────────────────────────────────────────────


@dataclass
class PullRequest:
    """An open pull request hfexport made: its number, URL, description (first comment) and marker fields."""

    num: int
    url: str
    description_id: str | None = None
    description: str = ""
    marker: dict = field(default_factory=dict)


@dataclass
class Proposed:
    """What `HubRepo.open_or_update_pull_request` did: `opened` or `updated`, the PR's number and URL, the commit."""

    action: str
    num: int | None
    url: str | None
    commit: str | None


def marker_line(kind: str, fields: dict | None = None) -> str:
    """The hidden marker by which hfexport finds its own pull request again: `<!-- hfexport:<kind> {json} -->`."""
    return f"<!-- hfexport:{kind} {json.dumps(fields, sort_keys=True)} -->" if fields else f"<!-- hfexport:{kind} -->"


def parse_marker(text: str | None, kind: str) -> dict | None:
    """The fields of `text`'s `kind` marker ({} for a bare one), or None when it has none (or its JSON is broken)."""
    match = re.search(rf"<!--\s*hfexport:{re.escape(kind)}(?:\s+(\{{.*?\}}))?\s*-->", text or "", re.S)
    if not match:
        return None
    if match.group(1) is None:
        return {}
    try:
        value = json.loads(match.group(1))
    except ValueError:
        return None
    return value if isinstance(value, dict) else None


class HubRepo:
    """One Hub repo at one revision, through huggingface_hub's own client (`HfApi`, `hf_hub_download`): the one
    place hfexport reads files from the Hub, lists them and opens or updates its pull request.

    A file the Hub answers 404 for is absent (`None`, or `error_class` naming it when required). Anything else (the
    Hub unreachable or failing, a rejected token, an unknown repo or revision) raises `error_class` through
    `hub_error`: one line, no token, exit code 2 — never `None`.

    Args:
        repo_id: the repo.
        revision: the branch, tag, commit or `refs/pr/N` read by default (None: the repo's default branch).
        token: a token, None for the saved login, or False for anonymous reads (never a token of the machine's own).
        repo_type: "model" or "dataset".
        cache_dir: huggingface_hub's cache folder (default: its own).
        error_class: `SourceError` for reads, `PublishError` when publishing.
        where: a prefix for messages (a recipe path such as `targets.onnx.quantization.calibration`).
        endpoint: the Hub's URL (default: HF_ENDPOINT, as huggingface_hub reads it).
    """

    def __init__(self, repo_id: str, revision: str | None = None, token: str | bool | None = None, *,
                 repo_type: str = "model", cache_dir=None, error_class: type[HfExportError] = SourceError,
                 where: str | None = None, endpoint: str | None = None):
        self.repo_id, self.revision, self.token, self.repo_type = repo_id, revision, token, repo_type
        self.cache_dir, self.error_class, self.where, self.endpoint = cache_dir, error_class, where, endpoint
        self._api = None
        if isinstance(token, str):
            register_secret(token)

    @property
    def api(self):
        """huggingface_hub's `HfApi` with this repo's token and endpoint (made on first use)."""
        if self._api is None:
            from huggingface_hub import HfApi

            self._api = HfApi(token=self.token, endpoint=self.endpoint)
        return self._api

    def error(self, error: BaseException, action: str, revision: str | None = None) -> HfExportError:
        """`error` as this repo's `error_class` (see `hub_error`)."""
        return hub_error(error, self.repo_id, action, revision=revision or self.revision,
                         token=self.token if isinstance(self.token, str) else None, error_class=self.error_class,
                         where=self.where)

    def call(self, function, action: str):
        """`function()` (an `HfApi` call), its failure raised as one readable `error_class` line."""
        try:
            return function()
        except HfExportError:
            raise
        except Exception as error:  # noqa: BLE001 - every Hub failure becomes one readable line
            raise self.error(error, action) from None

    def label(self, revision: str | None = None) -> str:
        revision = revision or self.revision
        kind = "dataset repo " if self.repo_type == "dataset" else ""
        return f"{kind}{self.repo_id}" + (f"@{revision}" if revision else "")

    # ── reading ──

    def download(self, path: str, *, revision: str | None = None, required: bool = False,
                 force_download: bool = False, local_files_only: bool = False) -> Path | None:
        """`path` in the local Hub cache (downloaded when needed); None when the repo has no such file (a 404), or
        `error_class` naming it when `required`. With `local_files_only` (offline by the caller's choice) an optional
        file the cache lacks is None too."""
        from huggingface_hub import hf_hub_download
        from huggingface_hub.errors import LocalEntryNotFoundError, RemoteEntryNotFoundError

        revision = revision or self.revision
        if not required and not force_download and self.known_absent(path, revision):
            return None
        try:
            return Path(hf_hub_download(self.repo_id, path, repo_type=self.repo_type, revision=revision,
                                        token=self.token, cache_dir=self.cache_dir, force_download=force_download,
                                        local_files_only=local_files_only, endpoint=self.endpoint))
        except RemoteEntryNotFoundError:  # the Hub answered: no such file (LocalEntryNotFoundError is not this)
            if required:
                raise self.error_class(f"{self.where + ': ' if self.where else ''}no file {path} in "
                                       f"{self.label(revision)}") from None
            return None
        except LocalEntryNotFoundError as error:  # the Hub not reached (or not asked) and nothing cached
            if local_files_only and not required:
                return None
            raise self.error(error, f"reading {path}", revision) from None
        except Exception as error:  # noqa: BLE001 - every Hub failure becomes one readable line
            raise self.error(error, f"reading {path}", revision) from None

    def read(self, path: str, *, revision: str | None = None, required: bool = False) -> bytes | None:
        """The bytes of `path` (see `download`): None when absent, never when the Hub fails."""
        file = self.download(path, revision=revision, required=required)
        return None if file is None else file.read_bytes()

    def read_text(self, path: str, *, revision: str | None = None, required: bool = False) -> str | None:
        """`read`, decoded as UTF-8 from the exact bytes (CRLF kept); `error_class` when it is not UTF-8."""
        data = self.read(path, revision=revision, required=required)
        try:
            return None if data is None else data.decode("utf-8")
        except UnicodeDecodeError:
            raise self.error_class(f"{self.where + ': ' if self.where else ''}{path} in "
                                   f"{self.label(revision)} is not UTF-8 text") from None

    def known_absent(self, path: str, revision: str | None) -> bool:
        """Whether the Hub cache records `path` as absent at commit `revision`: huggingface_hub notes each 404 it got
        for a file at a commit (`.no_exist/<commit>/`), and a commit never changes, so an optional file is not asked
        for again. Only at a full commit id: a branch may gain the file."""
        from huggingface_hub import _CACHED_NO_EXIST, try_to_load_from_cache

        return bool(revision and re.fullmatch(r"[0-9a-f]{40}", revision)) and try_to_load_from_cache(
            self.repo_id, path, cache_dir=self.cache_dir, revision=revision, repo_type=self.repo_type) is _CACHED_NO_EXIST

    def files(self, revision: str | None = None) -> list[str]:
        """Every file path at `revision`."""
        revision = revision or self.revision
        return self.call(lambda: self.api.list_repo_files(self.repo_id, revision=revision, repo_type=self.repo_type),
                         f"listing the files of {revision or 'the default branch'}")

    def info(self, revision: str | None = None, *, action: str | None = None, **kwargs):
        """huggingface_hub's `repo_info` (its commit `sha`, its `siblings`); `kwargs` such as `files_metadata`."""
        revision = revision or self.revision
        return self.call(lambda: self.api.repo_info(self.repo_id, revision=revision, repo_type=self.repo_type,
                                                    **kwargs), action or f"reading {revision or 'the repo'}")

    def head(self, revision: str | None = None) -> str | None:
        """The commit `revision` points at; None when the repo has no such branch (the Hub answered so)."""
        from huggingface_hub.errors import RevisionNotFoundError

        revision = revision or self.revision
        try:
            return self.api.repo_info(self.repo_id, revision=revision, repo_type=self.repo_type).sha
        except RevisionNotFoundError:
            return None
        except Exception as error:  # noqa: BLE001 - every Hub failure becomes one readable line
            raise self.error(error, f"reading {revision or 'the default branch'}", revision) from None

    # ── hfexport's pull request ──

    def find_pull_request(self, kind: str, *, title_prefix: str, base: str | None = None,
                          matches=lambda marker: True) -> PullRequest | None:
        """The open pull request whose title starts with `title_prefix` and whose description carries the `kind`
        marker (`marker_line`) with fields that `matches`, targeting `base` when given; None when there is none."""
        api = self.api

        def find() -> PullRequest | None:
            for discussion in api.get_repo_discussions(self.repo_id, discussion_type="pull_request",
                                                       discussion_status="open", repo_type=self.repo_type):
                if not discussion.title.startswith(title_prefix):
                    continue
                details = api.get_discussion_details(self.repo_id, discussion.num, repo_type=self.repo_type)
                first = next((event for event in details.events if getattr(event, "type", None) == "comment"), None)
                content = getattr(first, "content", None) or ""
                marker = parse_marker(content, kind)
                if marker is None or not matches(marker):
                    continue
                if base is None or (details.target_branch or f"refs/heads/{base}").endswith(base):
                    return PullRequest(discussion.num, details.url, getattr(first, "id", None), content, marker)
            return None

        return self.call(find, "looking for an open hfexport PR")

    def open_or_update_pull_request(self, operations: list, *, title: str, description: str,
                                    pull_request: PullRequest | None = None, update_message: str | None = None,
                                    update_description: str | None = None,
                                    parent_commit: str | None = None) -> Proposed:
        """One commit of `operations`: a new pull request against `revision` (`title`, `description`) when
        `pull_request` is None, else pushed onto its `refs/pr/N` (`update_message`, `update_description`). The Hub
        applies a commit entirely or not at all, so a failure leaves nothing half-made."""
        api = self.api
        if pull_request is None:
            info = self.call(lambda: api.create_commit(
                self.repo_id, operations, commit_message=title, commit_description=description,
                revision=self.revision, create_pr=True, parent_commit=parent_commit, repo_type=self.repo_type),
                "opening a pull request")
            return Proposed("opened", info.pr_num, info.pr_url, info.oid)
        ref = f"refs/pr/{pull_request.num}"
        info = self.call(lambda: api.create_commit(
            self.repo_id, operations, commit_message=update_message or title, commit_description=update_description,
            revision=ref, parent_commit=parent_commit, repo_type=self.repo_type), f"pushing to {ref}")
        return Proposed("updated", pull_request.num, pull_request.url, info.oid)

    def comment(self, num: int, text: str) -> None:
        """Comment on PR `num`; it follows a commit already made, so a failure only warns."""
        self.courtesy(lambda: self.api.comment_discussion(self.repo_id, num, text, repo_type=self.repo_type))

    def set_description(self, num: int, description: str, comment_id: str | None = None) -> None:
        """Rewrite PR `num`'s description (its first comment, `comment_id` when known); the PR is already open, so
        a failure only warns."""
        def edit() -> None:
            first_id = comment_id
            if first_id is None:
                details = self.api.get_discussion_details(self.repo_id, num, repo_type=self.repo_type)
                first_id = next((event.id for event in details.events if event.type == "comment"), None)
            if first_id is not None:
                self.api.edit_discussion_comment(self.repo_id, num, first_id, description, repo_type=self.repo_type)

        self.courtesy(edit)

    def close_pull_request(self, num: int, comment: str) -> None:
        """Comment on PR `num`, then close it; only a courtesy (its replacement is already open)."""
        self.comment(num, comment)
        self.courtesy(lambda: self.api.change_discussion_status(self.repo_id, num, "closed",
                                                                repo_type=self.repo_type))

    @staticmethod
    def courtesy(function) -> None:
        """Run a call that follows a commit already made (a comment, a description): its failure changes nothing."""
        try:
            function()
        except Exception:  # noqa: BLE001 - the commit itself succeeded
            pass


def snapshot_commit(file: Path) -> str | None:
    """The commit a file of the Hub cache belongs to: huggingface_hub stores it under `snapshots/<commit>/`."""
    for parent in file.parents:
        if parent.parent.name == "snapshots":
            return parent.name
    return None


def drop_cached_downloads(repo_id: str) -> int:
    """Remove `repo_id`'s files from the local Hub cache (the Space's disk is small); returns bytes freed."""
    from huggingface_hub import scan_cache_dir

    try:
        cache = scan_cache_dir()
    except Exception:  # noqa: BLE001 - no cache folder yet, or unreadable: nothing to free
        return 0
    hashes = [revision.commit_hash for repo in cache.repos if repo.repo_id == repo_id and repo.repo_type == "model"
              for revision in repo.revisions]
    if not hashes:
        return 0
    strategy = cache.delete_revisions(*hashes)
    strategy.execute()
    return strategy.expected_freed_size


def search_models(query: str, token: str | bool | None = None, limit: int = 20) -> list[str]:
    """Model repo ids matching `query` on the Hub (its own search), at most `limit`; [] for an empty query."""
    from huggingface_hub import HfApi

    query = (query or "").strip()
    if not query:
        return []
    try:
        return [model.id for model in HfApi().list_models(search=query, limit=limit, token=token)]
    except Exception as error:  # noqa: BLE001 - every Hub failure becomes one readable line
        raise hub_error(error, query, "searching models", token=token if isinstance(token, str) else None) from None
