"""The one adapter between hfexport and huggingface_hub for reading: repo ids, single-file downloads, and the mapping
of huggingface_hub's errors to hfexport's (`hub_error`).
"""

from __future__ import annotations

import re
from pathlib import Path

from hfexport.errors import SourceError, redact


def looks_like_repo_id(value: str) -> bool:
    return bool(re.fullmatch(r"[A-Za-z0-9][A-Za-z0-9_.-]*(/[A-Za-z0-9][A-Za-z0-9_.-]*)?", value)) and ".." not in value


def hub_file(repo_id: str, filename: str, revision: str | None, token: str | None) -> bytes | None:
    """One small file of a Hub model repo through huggingface_hub (None when the repo has no such file)."""
    from huggingface_hub import hf_hub_download
    from huggingface_hub.errors import (
        EntryNotFoundError,
        GatedRepoError,
        HfHubHTTPError,
        LocalEntryNotFoundError,
        RepositoryNotFoundError,
        RevisionNotFoundError,
    )

    try:
        path = hf_hub_download(repo_id, filename, revision=revision, token=token)
    except LocalEntryNotFoundError:
        # A subclass of EntryNotFoundError that means "the Hub could not be reached and nothing is cached", not
        # "the repo has no such file": taking it for the latter reported an unreachable Hub as "no recipe".
        raise SourceError(f"cannot reach the Hub for {repo_id} (and {filename} is not in the local cache)") from None
    except EntryNotFoundError:
        return None
    except RevisionNotFoundError:
        raise SourceError(f"revision {revision!r} not found in {repo_id}") from None
    except GatedRepoError:
        raise SourceError(f"{repo_id} is gated: request access on the Hub, then pass a token") from None
    except RepositoryNotFoundError:
        hint = "" if token else " (for a private repo, pass a token or set HF_TOKEN)"
        raise SourceError(f"repository {repo_id} not found or not accessible{hint}") from None
    except HfHubHTTPError as error:
        raise SourceError(f"cannot read {filename} from {repo_id}: {redact(str(error).splitlines()[0])}") from None
    except (OSError, ValueError) as error:
        raise SourceError(f"cannot reach the Hub for {repo_id}: {redact(str(error).splitlines()[0] if str(error) else type(error).__name__)}") from None
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
