"""The local Hub merges a pull request as the Hub's git does: a 3-way merge from the merge base, line by line.

It used to conflict on any file both sides changed (stricter than git: an owner's edit at the top of README.md and a
PR's section at its end merge cleanly in git); it must neither be more lenient than git (overlapping or adjacent
edits, binary files, modify/delete conflict).
"""

from __future__ import annotations

import pytest
from huggingface_hub import CommitOperationAdd, CommitOperationDelete, HfApi
from huggingface_hub.errors import HfHubHTTPError

BASE = b"# Model\r\n\r\nline one\r\nline two\r\nline three\r\nline four\r\n"


@pytest.fixture
def api(hub):
    return HfApi(endpoint=hub.url, token=hub.write_token)


def _pr(hub, api, name, operations):
    repo = f"{hub.user}/{name}"
    hub.seed_repo(repo, {"README.md": BASE, "weights.bin": b"\x00\x01\x02"})
    return repo, api.create_commit(repo, operations, commit_message="pr", create_pr=True).pr_num


def test_separate_edits_of_one_text_file_merge_line_by_line(hub, api):
    theirs = BASE + b"\r\n<!-- section -->\r\n"
    repo, num = _pr(hub, api, "merge-lines", [CommitOperationAdd("README.md", theirs)])
    hub.commit(repo, add={"README.md": BASE.replace(b"# Model", b"# Model (edited by the owner)")})
    assert api.get_discussion_details(repo, num).conflicting_files in (None, [])
    api.merge_pull_request(repo, num)
    assert hub.read_file(repo, "README.md") == theirs.replace(b"# Model", b"# Model (edited by the owner)")


@pytest.mark.parametrize("name,main_change,pr_ops", [
    ("adjacent", {"README.md": BASE + b"owner's line\r\n"},
     [CommitOperationAdd("README.md", BASE + b"pr's line\r\n")]),
    ("binary", {"weights.bin": b"\x00\x01\x03"}, [CommitOperationAdd("weights.bin", b"\x00\x09\x02")]),
    ("modify-delete", {"README.md": BASE + b"owner\r\n"}, [CommitOperationDelete("README.md")]),
])
def test_what_git_cannot_merge_conflicts(hub, api, name, main_change, pr_ops):
    repo, num = _pr(hub, api, f"merge-{name}", pr_ops)
    hub.commit(repo, add=main_change)
    path = next(iter(main_change))
    assert api.get_discussion_details(repo, num).conflicting_files == [path]
    with pytest.raises(HfHubHTTPError, match=f"409.*|conflicts: {path}"):
        api.merge_pull_request(repo, num)


def test_the_same_change_on_both_sides_is_no_conflict(hub, api):
    same = BASE + b"both\r\n"
    repo, num = _pr(hub, api, "merge-same", [CommitOperationAdd("README.md", same)])
    hub.commit(repo, add={"README.md": same, "other.txt": b"owner"})
    api.merge_pull_request(repo, num)
    assert hub.read_file(repo, "README.md") == same and hub.read_file(repo, "other.txt") == b"owner"
