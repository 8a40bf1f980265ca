"""`AutoHfExporter.from_pretrained("org/model", revision=..., token=...)` over HTTP against the local Hub:
branches, `refs/pr/N` revisions, private repos with a token, and clear errors without one."""

from __future__ import annotations

import json
import uuid
from pathlib import Path

import pytest
from hfexport import AutoHfExporter
from hfexport.errors import SourceError
from hfexport.job.run import resolve_source
from huggingface_hub import CommitOperationAdd, HfApi

EXAMPLE = Path(__file__).resolve().parents[1] / "examples" / "tiny-bert"


def _seed(hub, private: bool = False) -> str:
    repo = f"user/recipes-{uuid.uuid4().hex[:8]}"
    hub.seed_repo(repo, EXAMPLE, private=private)
    return repo


def _open_pr_changing_default_target(hub, repo: str, target: str = "pt2") -> int:
    recipe = json.loads((EXAMPLE / "export_config.json").read_text())
    recipe["default_target"] = target
    info = HfApi().create_commit(
        repo, [CommitOperationAdd("export_config.json", json.dumps(recipe, indent=2).encode())],
        commit_message="Export pt2 by default", create_pr=True, token=hub.write_token,
    )
    return info.pr_num


def test_public_repo_recipe_over_http(hub):
    repo = _seed(hub)
    exporter = AutoHfExporter.from_pretrained(repo)
    assert exporter.target.name == "onnx" and exporter.recipe.source == f"{repo}/export_config.json"
    assert AutoHfExporter.from_pretrained(repo, target="pt2").target.export_format == "dynamo"


def test_pull_request_revision_is_read_and_loaded(hub):
    repo = _seed(hub)
    num = _open_pr_changing_default_target(hub, repo)
    revision = f"refs/pr/{num}"
    exporter = AutoHfExporter.from_pretrained(repo, revision=revision)
    assert exporter.target.name == "pt2" and exporter.recipe.source == f"{repo}@{revision}/export_config.json"
    assert AutoHfExporter.from_pretrained(repo).target.name == "onnx"  # main is unchanged
    model = exporter.load_model()  # the weights, over HTTP at refs/pr/N
    assert type(model).__name__ == "BertModel"
    assert exporter.plan(model).describe()["export_format"] == "dynamo"
    source = resolve_source(repo, revision, None)
    assert source["commit"] == hub.refs(repo)["pulls"][str(num)] and source["revision"] == revision


def test_private_repo_needs_a_token_and_works_with_one(hub):
    repo = _seed(hub, private=True)
    with pytest.raises(SourceError) as error:
        AutoHfExporter.from_pretrained(repo)
    assert str(error.value) == (f"repository {repo} not found or not accessible (for a private repo, pass a token or "
                                "set HF_TOKEN)")
    exporter = AutoHfExporter.from_pretrained(repo, token=hub.read_token)
    assert exporter.target.name == "onnx"
    assert type(exporter.load_model()).__name__ == "BertModel"


def test_private_pull_request_with_a_token(hub):
    repo = _seed(hub, private=True)
    num = _open_pr_changing_default_target(hub, repo)
    # Before anything is cached (huggingface_hub serves files it already downloaded for a revision when a request fails).
    with pytest.raises(SourceError, match="not found or not accessible"):
        AutoHfExporter.from_pretrained(repo, revision=f"refs/pr/{num}")
    exporter = AutoHfExporter.from_pretrained(repo, revision=f"refs/pr/{num}", token=hub.read_token)
    assert exporter.target.name == "pt2"


def test_bad_token_and_unknown_revision_are_clear(hub):
    repo = _seed(hub, private=True)
    with pytest.raises(SourceError) as error:
        AutoHfExporter.from_pretrained(repo, token="hf_thisisnotavalidtoken")
    assert "hf_thisisnotavalidtoken" not in str(error.value) and repo in str(error.value)
    with pytest.raises(SourceError, match="revision 'refs/pr/99' not found in"):
        AutoHfExporter.from_pretrained(repo, revision="refs/pr/99", token=hub.read_token)


def test_cli_reads_private_repos_with_a_token(hub, cli):
    repo = _seed(hub, private=True)
    denied = cli("validate", repo)
    assert denied.returncode == 2 and "pass a token or set HF_TOKEN" in denied.stderr
    allowed = cli("validate", repo, "--json", env={"HF_TOKEN": hub.read_token})
    assert allowed.returncode == 0, allowed.stderr
    assert json.loads(allowed.stdout)["valid"] is True
    num = _open_pr_changing_default_target(hub, repo)
    shown = cli("validate", repo, "--revision", f"refs/pr/{num}", "--token", hub.read_token, "--json")
    assert shown.returncode == 0 and hub.read_token not in shown.stdout + shown.stderr
