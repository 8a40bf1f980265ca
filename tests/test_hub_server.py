"""The local Hub server (`hfexport.testing.hub`) driven by the real `huggingface_hub` client over HTTP.

Every client call passes `endpoint=` explicitly: HF_ENDPOINT is read when huggingface_hub is first imported, which
another test module may already have done.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import httpx2
import pytest
from hfexport.testing.hub import (
    DEFAULT_USER,
    GRADIO_MOCK_OAUTH_TOKEN,
    LocalHub,
    Token,
    git_blob_oid,
)
from huggingface_hub import (
    CommitOperationAdd,
    CommitOperationDelete,
    HfApi,
    hf_hub_download,
    snapshot_download,
)
from huggingface_hub.errors import (
    EntryNotFoundError,
    HfHubHTTPError,
    RepositoryNotFoundError,
    RevisionNotFoundError,
)

LIBRARY = Path(__file__).resolve().parents[1] / "library"


@pytest.fixture
def hub(tmp_path):
    with LocalHub(tmp_path / "hub") as server:
        yield server


@pytest.fixture
def api(hub):
    return HfApi(endpoint=hub.url, token=hub.write_token)


def _download(hub, tmp_path, repo_id, filename, **kwargs):
    kwargs.setdefault("token", hub.write_token)
    return Path(hf_hub_download(repo_id, filename, endpoint=hub.url, cache_dir=tmp_path / "cache", **kwargs))


def test_whoami_roles_and_mock_oauth_token(hub):
    me = HfApi(endpoint=hub.url).whoami(token=hub.write_token)
    assert me["name"] == DEFAULT_USER and me["type"] == "user"
    assert me["auth"]["accessToken"]["role"] == "write"
    assert HfApi(endpoint=hub.url).whoami(token=hub.read_token)["auth"]["accessToken"]["role"] == "read"
    # Gradio's locally mocked LoginButton hands this token to the app: it acts as the first write token's user.
    assert HfApi(endpoint=hub.url).whoami(token=GRADIO_MOCK_OAUTH_TOKEN)["name"] == DEFAULT_USER
    with pytest.raises(HfHubHTTPError) as err:
        HfApi(endpoint=hub.url).whoami(token="hf_not_a_token")
    assert err.value.response.status_code == 401


def test_create_repo_exist_ok_and_conflict_carries_url(hub, api):
    url = api.create_repo("user/model")
    assert url == f"{hub.url}/user/model" and url.repo_id == "user/model"
    assert api.create_repo("user/model", exist_ok=True).repo_id == "user/model"
    with pytest.raises(HfHubHTTPError) as err:
        api.create_repo("user/model")
    assert err.value.response.status_code == 409
    assert err.value.response.json()["url"] == f"{hub.url}/user/model"
    # A new repo holds the Hub's initial commit, made by "system".
    assert api.list_repo_files("user/model") == [".gitattributes"]
    assert [c.authors for c in api.list_repo_commits("user/model")] == [["system"]]
    api.delete_repo("user/model")
    assert not api.repo_exists("user/model")


def test_upload_folder_then_download_by_branch_and_commit(hub, api, tmp_path):
    folder = tmp_path / "src"
    (folder / "sub").mkdir(parents=True)
    (folder / "config.json").write_text('{"model_type": "bert"}')
    (folder / "sub" / "weights.bin").write_bytes(bytes(range(256)) * 4)
    api.create_repo("user/model")
    info = api.upload_folder(folder_path=folder, repo_id="user/model", commit_message="Upload model")
    sha = info.oid
    assert api.model_info("user/model").sha == sha == hub.head("user/model")
    assert api.model_info("user/model").config == {"model_type": "bert"}

    path = _download(hub, tmp_path, "user/model", "sub/weights.bin")
    assert path.read_bytes() == bytes(range(256)) * 4
    assert path.parent.parent.name == sha  # snapshots/<commit>/sub/weights.bin: X-Repo-Commit was honoured
    assert _download(hub, tmp_path, "user/model", "config.json", revision=sha).read_text() == '{"model_type": "bert"}'

    snapshot = Path(snapshot_download("user/model", endpoint=hub.url, cache_dir=tmp_path / "snap",
                                      token=hub.write_token))
    assert sorted(p.relative_to(snapshot).as_posix() for p in snapshot.rglob("*") if p.is_file()) == [
        ".gitattributes", "config.json", "sub/weights.bin"]

    head = httpx2.head(f"{hub.url}/user/model/resolve/main/config.json")
    assert head.headers["X-Repo-Commit"] == sha
    etag = git_blob_oid(b'{"model_type": "bert"}')
    assert head.headers["ETag"] == f'"{etag}"'
    assert head.headers["Content-Length"] == "22" and "X-Xet-Hash" not in head.headers
    ranged = httpx2.get(f"{hub.url}/user/model/resolve/main/config.json", headers={"Range": "bytes=2-11"})
    assert ranged.status_code == 206 and ranged.content == b"model_type"


def test_tree_paths_info_and_existence_helpers(hub, api):
    hub.seed_repo("user/model", {"a.txt": "a", "d/b.txt": "b", "d/e/c.txt": "c"})
    top = {(e.path, type(e).__name__) for e in api.list_repo_tree("user/model")}
    assert top == {(".gitattributes", "RepoFile"), ("a.txt", "RepoFile"), ("d", "RepoFolder")}
    assert sorted(e.path for e in api.list_repo_tree("user/model", path_in_repo="d", recursive=True)) == [
        "d/b.txt", "d/e", "d/e/c.txt"]
    assert [e.path for e in api.get_paths_info("user/model", ["a.txt", "d", "missing"])] == ["a.txt", "d"]
    assert api.file_exists("user/model", "d/e/c.txt") and not api.file_exists("user/model", "nope.txt")
    assert api.revision_exists("user/model", "main") and not api.revision_exists("user/model", "nope")
    with pytest.raises(EntryNotFoundError):
        list(api.list_repo_tree("user/model", path_in_repo="missing"))


def test_errors_map_to_client_exceptions(hub, api, tmp_path):
    hub.seed_repo("user/model", {"config.json": "{}"})
    with pytest.raises(RepositoryNotFoundError):
        api.model_info("user/missing")
    with pytest.raises(RepositoryNotFoundError):
        _download(hub, tmp_path, "user/missing", "config.json")
    with pytest.raises(RevisionNotFoundError):
        api.model_info("user/model", revision="no-such-branch")
    with pytest.raises(RevisionNotFoundError):
        _download(hub, tmp_path, "user/model", "config.json", revision="no-such-branch")
    with pytest.raises(EntryNotFoundError):
        _download(hub, tmp_path, "user/model", "missing.json")
    response = httpx2.get(f"{hub.url}/user/model/resolve/main/missing.json")
    assert response.headers["X-Error-Code"] == "EntryNotFound" and "error" in response.json()


def test_private_repo_needs_a_valid_token(hub, tmp_path):
    hub.seed_repo("user/secret", {"config.json": "{}"}, private=True)
    anonymous = HfApi(endpoint=hub.url, token=False)
    with pytest.raises(RepositoryNotFoundError) as err:
        anonymous.model_info("user/secret")
    assert err.value.response.status_code == 401
    with pytest.raises(RepositoryNotFoundError):
        _download(hub, tmp_path, "user/secret", "config.json", token=False)
    with pytest.raises(RepositoryNotFoundError):
        snapshot_download("user/secret", endpoint=hub.url, cache_dir=tmp_path / "snap", token=False)
    reader = HfApi(endpoint=hub.url, token=hub.read_token)
    assert reader.model_info("user/secret").private is True
    assert _download(hub, tmp_path, "user/secret", "config.json", token=hub.read_token).read_text() == "{}"


def test_read_token_cannot_write(hub):
    hub.seed_repo("user/model", {"config.json": "{}"})
    reader = HfApi(endpoint=hub.url, token=hub.read_token)
    with pytest.raises(HfHubHTTPError) as err:
        reader.upload_file(path_or_fileobj=b"x", path_in_repo="x.txt", repo_id="user/model")
    assert err.value.response.status_code == 403
    with pytest.raises(HfHubHTTPError) as err:
        reader.create_commit("user/model", [CommitOperationAdd("x.txt", b"x")], commit_message="PR", create_pr=True)
    assert err.value.response.status_code == 403
    with pytest.raises(HfHubHTTPError) as err:
        reader.create_repo("user/other")
    assert err.value.response.status_code == 403
    assert hub.list_files("user/model") == [".gitattributes", "config.json"]


def test_pull_request_lifecycle(hub, api, tmp_path):
    base = hub.seed_repo("org/model", {"config.json": "{}"})
    pr = api.create_commit("org/model", [CommitOperationAdd("model.onnx", b"onnx-v1")],
                           commit_message="Add ONNX export", commit_description="Exported by hfexport", create_pr=True)
    assert pr.pr_url == f"{hub.url}/org/model/discussions/1" and pr.pr_revision == "refs/pr/1"
    assert hub.head("org/model") == base  # main untouched
    # Commit onto the PR ref: the revision travels URL-encoded (refs%2Fpr%2F1).
    update = api.upload_file(path_or_fileobj=b"onnx-v2", path_in_repo="model.onnx", repo_id="org/model",
                             revision=pr.pr_revision, commit_message="Refresh ONNX export")
    assert _download(hub, tmp_path, "org/model", "model.onnx", revision="refs/pr/1").read_bytes() == b"onnx-v2"

    refs = api.list_repo_refs("org/model", include_pull_requests=True)
    assert [(r.ref, r.target_commit) for r in refs.pull_requests] == [("refs/pr/1", update.oid)]
    assert [r.target_commit for r in refs.branches] == [base]

    (listed,) = api.get_repo_discussions("org/model")
    assert (listed.num, listed.title, listed.is_pull_request, listed.status) == (1, "Add ONNX export", True, "open")
    api.comment_discussion("org/model", 1, "Parity report attached")
    api.change_discussion_status("org/model", 1, "closed", comment="superseded")
    assert api.get_discussion_details("org/model", 1).status == "closed"
    api.change_discussion_status("org/model", 1, "open")

    details = api.get_discussion_details("org/model", 1)
    assert details.target_branch == "refs/heads/main" and details.conflicting_files == []
    assert [e.type for e in details.events] == [
        "comment", "commit", "commit", "comment", "comment", "status-change", "status-change"]
    assert details.events[0].content == "Exported by hfexport"
    assert [e.summary for e in details.events if e.type == "commit"] == ["Add ONNX export", "Refresh ONNX export"]
    assert "model.onnx" in details.diff

    api.merge_pull_request("org/model", 1)
    merged = api.get_discussion_details("org/model", 1)
    assert merged.status == "merged" and merged.merge_commit_oid == update.oid  # fast-forward
    assert hub.read_file("org/model", "model.onnx") == b"onnx-v2"
    assert [c.title for c in api.list_repo_commits("org/model")][:3] == [
        "Refresh ONNX export", "Add ONNX export", "Upload folder"]


def test_merge_after_main_moved_creates_merge_commit(hub, api):
    hub.seed_repo("user/model", {"config.json": "{}", "README.md": "v1"})
    pr = api.create_commit("user/model", [CommitOperationAdd("model.onnx", b"onnx")], commit_message="Add ONNX",
                           create_pr=True)
    hub.commit("user/model", add={"README.md": "v2"}, title="Edit README")
    api.merge_pull_request("user/model", pr.pr_num)
    assert hub.files("user/model")["README.md"] == b"v2" and hub.files("user/model")["model.onnx"] == b"onnx"
    assert len(hub.commits("user/model")[0]["parents"]) == 2


def test_draft_pull_request_and_discussions(hub, api):
    hub.seed_repo("user/model", {"config.json": "{}"})
    draft = api.create_pull_request("user/model", title="Add exports", description="WIP")
    assert draft.status == "draft" and draft.git_reference == "refs/pr/1"
    api.create_commit("user/model", [CommitOperationAdd("a.pte", b"pte")], commit_message="Add PTE",
                      revision=draft.git_reference)
    assert api.get_discussion_details("user/model", 1).status == "open"
    question = api.create_discussion("user/model", title="Which opset?")
    assert question.num == 2 and not question.is_pull_request
    assert [d.num for d in api.get_repo_discussions("user/model", discussion_type="pull_request")] == [1]
    assert [d.num for d in api.get_repo_discussions("user/model")] == [2, 1]
    with pytest.raises(HfHubHTTPError):
        api.merge_pull_request("user/model", 2)


def test_dropped_commit_connection_leaves_no_partial_pr(hub, api):
    base = hub.seed_repo("user/model", {"config.json": "{}"})
    hub.fail_next_commit = "drop"
    operations = [CommitOperationAdd(f"part{i}.bin", os.urandom(1000)) for i in range(3)]
    with pytest.raises((httpx2.TransportError, HfHubHTTPError)):
        api.create_commit("user/model", operations, commit_message="Add exports", create_pr=True)
    assert hub.refs("user/model") == {"branches": {"main": base}, "tags": {}, "pulls": {}}
    assert hub.discussions("user/model") == []
    assert hub.fail_next_commit is None  # one-shot
    retry = api.create_commit("user/model", [CommitOperationAdd("part0.bin", b"x")], commit_message="Add exports",
                              create_pr=True)
    assert retry.pr_num == 1


def test_fault_after_apply_and_injected_status(hub, api):
    hub.seed_repo("user/model", {"config.json": "{}"})
    hub.inject_fault("commit", "drop_after_apply")
    with pytest.raises(httpx2.TransportError):
        api.create_commit("user/model", [CommitOperationAdd("x.txt", b"x")], commit_message="Lost reply",
                          create_pr=True)
    assert list(hub.refs("user/model")["pulls"]) == ["1"]  # applied although the client saw an error
    hub.inject_fault("discussions", 503)
    with pytest.raises(HfHubHTTPError) as err:
        list(api.get_repo_discussions("user/model"))
    assert err.value.response.status_code == 503


def test_commits_are_atomic_and_check_parent(hub, api):
    base = hub.seed_repo("user/model", {"config.json": "{}", "keep/a.txt": "a", "keep/b.txt": "b"})
    with pytest.raises(EntryNotFoundError):
        api.create_commit("user/model", [CommitOperationAdd("new.txt", b"n"), CommitOperationDelete("missing.txt")],
                          commit_message="Half-valid")
    assert hub.head("user/model") == base
    with pytest.raises(HfHubHTTPError) as err:
        api.create_commit("user/model", [CommitOperationAdd("new.txt", b"n")], commit_message="Stale",
                          parent_commit="0" * 40)
    assert err.value.response.status_code == 412
    api.create_commit("user/model", [CommitOperationDelete("keep/"), CommitOperationAdd("new.txt", b"n")],
                      commit_message="Replace", parent_commit=base)
    assert hub.list_files("user/model") == [".gitattributes", "config.json", "new.txt"]
    # Re-uploading identical content is skipped client-side thanks to preupload's `oid`.
    again = api.upload_file(path_or_fileobj=b"n", path_in_repo="new.txt", repo_id="user/model")
    assert again.oid == hub.head("user/model")


def test_branches_and_tags(hub, api, tmp_path):
    base = hub.seed_repo("user/model", {"config.json": "{}"})
    api.create_tag("user/model", tag="v1")
    api.create_branch("user/model", branch="exports")
    api.upload_file(path_or_fileobj=b"e", path_in_repo="e.onnx", repo_id="user/model", revision="exports",
                    commit_message="On branch")
    assert hub.head("user/model", "v1") == base == hub.head("user/model")
    assert "e.onnx" in hub.list_files("user/model", revision="exports")
    assert _download(hub, tmp_path, "user/model", "config.json", revision="v1").read_text() == "{}"
    with pytest.raises(RevisionNotFoundError):
        api.upload_file(path_or_fileobj=b"e", path_in_repo="e.onnx", repo_id="user/model", revision="missing")


def test_dataset_repo_download(hub, tmp_path):
    hub.seed_repo("user/calib", {"data/calibration.jsonl": '{"text": "hello"}\n'}, repo_type="dataset")
    path = _download(hub, tmp_path, "user/calib", "data/calibration.jsonl", repo_type="dataset")
    assert json.loads(path.read_text()) == {"text": "hello"}
    api = HfApi(endpoint=hub.url, token=hub.write_token)
    assert api.dataset_info("user/calib").sha == hub.head("user/calib", repo_type="dataset")
    assert "data/calibration.jsonl" in api.list_repo_files("user/calib", repo_type="dataset")
    with pytest.raises(RepositoryNotFoundError):
        api.model_info("user/calib")  # a dataset is not a model


def test_strict_namespaces(tmp_path):
    tokens = [Token("hf_alice", "alice", "write", ("acme",)), Token("hf_bob", "bob", "write")]
    with LocalHub(tmp_path / "hub", tokens=tokens, strict=True) as hub:
        hub.seed_repo("acme/model", {"config.json": "{}"})
        alice, bob = (HfApi(endpoint=hub.url, token=t) for t in ("hf_alice", "hf_bob"))
        with pytest.raises(HfHubHTTPError) as err:
            bob.upload_file(path_or_fileobj=b"x", path_in_repo="x", repo_id="acme/model")
        assert err.value.response.status_code == 403
        pr = bob.create_commit("acme/model", [CommitOperationAdd("x", b"x")], commit_message="Outside PR",
                               create_pr=True)
        bob.upload_file(path_or_fileobj=b"y", path_in_repo="y", repo_id="acme/model", revision=pr.pr_revision)
        with pytest.raises(HfHubHTTPError):
            bob.merge_pull_request("acme/model", pr.pr_num)
        alice.merge_pull_request("acme/model", pr.pr_num)
        assert {"x", "y"} <= set(hub.list_files("acme/model"))


def test_env_drives_a_subprocess_client(hub, tmp_path):
    hub.seed_repo("user/model", {"config.json": '{"ok": true}'})
    script = ("from huggingface_hub import hf_hub_download; "
              "print(open(hf_hub_download('user/model', 'config.json')).read())")
    env = {**os.environ, **hub.env(hf_home=tmp_path / "hf_home")}
    env.pop("HF_HUB_OFFLINE", None)
    out = subprocess.run([sys.executable, "-c", script], env=env, capture_output=True, text=True, timeout=60)
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == '{"ok": true}'


def test_command_line_server(tmp_path):
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(filter(None, [str(LIBRARY), os.environ.get("PYTHONPATH")]))}
    proc = subprocess.Popen(
        [sys.executable, "-m", "hfexport.testing.hub", "--root", str(tmp_path / "root"), "--port", "0",
         "--token", "alice=hf_alice:write", "--token", "carol=hf_carol:read"],
        stdout=subprocess.PIPE, text=True, env=env)
    try:
        url = proc.stdout.readline().strip()
        assert url.startswith("http://127.0.0.1:")
        api = HfApi(endpoint=url, token="hf_alice")
        assert api.whoami()["name"] == "alice"
        assert api.create_repo("demo").repo_id == "alice/demo"
        assert HfApi(endpoint=url).whoami(token="hf_carol")["auth"]["accessToken"]["role"] == "read"
    finally:
        proc.terminate()
        assert proc.wait(timeout=10) == 0
