"""The one adapter between hfexport and huggingface_hub for reading: repo ids, single-file downloads, and the mapping
of huggingface_hub's errors to hfexport's (`hub_error`).
"""

from __future__ import annotations

import re
from pathlib import Path

from hfexport.errors import HfExportError, PublishError, SourceError, first_line, redact


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
        message = f"cannot reach the Hub for {repo_id} while {action}, and nothing is in the local cache"
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
    elif isinstance(error, (OSError, ValueError)) and status is None:
        message = f"cannot reach the Hub for {repo_id} while {action}: {first_line(error)}"
    else:
        message = f"Hub error while {action} on {repo_id}: {first_line(error)}"
    mapped = error_class(prefix + redact(message))
    # Worth trying again later (the Hub overloaded, rate-limiting, or the connection failing), not a refusal.
    mapped.transient = status in TRANSIENT_STATUS or (status is None and is_transport_error(error))
    return mapped


def is_transport_error(error: BaseException) -> bool:
    """Whether `error` (or what caused it) is the connection failing, not the Hub answering."""
    current: BaseException | None = error
    while current is not None:
        if {cls.__name__ for cls in type(current).__mro__} & TRANSPORT_ERRORS:
            return True
        current = current.__cause__ or current.__context__
    return False


def hub_file(repo_id: str, filename: str, revision: str | None, token: str | None) -> bytes | None:
    """One small file of a Hub model repo through huggingface_hub (None when the repo has no such file)."""
    from huggingface_hub import hf_hub_download
    from huggingface_hub.errors import EntryNotFoundError, LocalEntryNotFoundError

    try:
        path = hf_hub_download(repo_id, filename, revision=revision, token=token)
    except EntryNotFoundError as error:
        if isinstance(error, LocalEntryNotFoundError):
            raise hub_error(error, repo_id, f"reading {filename}", revision=revision, token=token) from None
        return None
    except Exception as error:  # noqa: BLE001 - every Hub failure becomes one readable line
        raise hub_error(error, repo_id, f"reading {filename}", revision=revision, token=token) from None
    return Path(path).read_bytes()


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
