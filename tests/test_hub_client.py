"""The one Hub client (hfexport.hub.HubRepo) and every caller of it: a file the Hub says is absent is None, an
unreachable or failing Hub is an error (one line, no token, exit code 2), never "absent".

Real huggingface_hub over HTTP against the local Hub server: "unreachable" is a closed port on 127.0.0.1, a
connection the server drops, or the server answering 5xx for one file (`LocalHub.inject_fault(..., path=...)`).
"""

from __future__ import annotations

import json
import shutil
import socket
import types
import uuid
from pathlib import Path

import pytest
from hfexport.errors import PlanError, PublishError, RecipeNotFoundError, SourceError, exit_code
from hfexport.hub import HubRepo, marker_line, parse_marker

EXAMPLES = Path(__file__).resolve().parent.parent / "examples"
SECRET = "hf_" + "Unreachable" * 3
# A Hub behind a CDN whose origin is down answers 52x ("origin is unreachable"). huggingface_hub retries downloads
# that got 500-504 or a refused connection for about 23 s before it gives up; a 52x or a dropped connection fails at
# once, which keeps these tests fast (one closed-port download shows the slow path, its waits skipped: `no_waits`).
DOWN = 523


def unique(name: str) -> str:
    return f"user/{name}-{uuid.uuid4().hex[:8]}"


def closed_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


@pytest.fixture
def no_waits(monkeypatch) -> list[float]:
    """huggingface_hub's retries without their waits: every attempt is still made (a refused connection is retried 5
    times), only the 1 + 2 + 4 + 8 + 8 s of back-off between them is skipped. Returns the waits it asked for."""
    from huggingface_hub.utils import _http

    waits: list[float] = []
    monkeypatch.setattr(_http, "time", types.SimpleNamespace(sleep=waits.append))
    return waits


@pytest.fixture
def faults(hub):
    """The local Hub, its injected faults cleared after the test (they would hit the next test's requests)."""
    hub.clear_faults()
    yield hub
    hub.clear_faults()


def assert_unreachable(error: BaseException, *named: str) -> str:
    """An unreachable Hub: one readable line naming what was read, exit code 2, no token."""
    message = str(error)
    assert "\n" not in message and "Traceback" not in message, message
    assert SECRET not in message and "hf_" not in message.replace("hf_***", ""), message
    assert exit_code(error) == 2, (type(error), message)
    assert any(phrase in message for phrase in ("cannot reach the Hub", "connection to the Hub dropped")), message
    for name in named:
        assert name in message, message
    return message


# ── HubRepo ──────────────────────────────────────────────────────────────────


def test_an_optional_file_is_none_only_when_the_hub_says_it_is_absent(hub):
    repo_id = unique("client")
    hub.seed_repo(repo_id, {"config.json": "{}", "sub/a.txt": "a"})
    repo = HubRepo(repo_id)
    assert repo.read("config.json") == b"{}" and repo.read_text("sub/a.txt") == "a"
    assert repo.read("export_config.json") is None
    assert {"config.json", "sub/a.txt"} <= set(repo.files())
    with pytest.raises(SourceError, match=f"no file export_config.json in {repo_id}") as raised:
        repo.read("export_config.json", required=True)
    assert exit_code(raised.value) == 2


def test_a_closed_port_is_an_error_never_absent(hub, no_waits):
    repo = HubRepo(unique("closed"), token=SECRET, endpoint=f"http://127.0.0.1:{closed_port()}")
    with pytest.raises(SourceError) as raised:
        repo.read("export_config.json")
    assert no_waits, "huggingface_hub gave up on a refused connection without retrying"
    assert_unreachable(raised.value, repo.repo_id, "export_config.json")
    assert raised.value.transient  # worth trying again later
    for call in (repo.files, repo.head, repo.info):  # not "no files", not "no such branch"
        with pytest.raises(SourceError) as raised:
            call()
        assert_unreachable(raised.value, repo.repo_id)


@pytest.mark.parametrize("mode", [DOWN, 521, "drop"])
def test_a_failing_hub_is_an_error_never_absent(faults, mode):
    repo_id = unique("failing")
    faults.seed_repo(repo_id, {"config.json": "{}"})
    faults.inject_fault("resolve", mode, path="export_config.json")
    with pytest.raises(SourceError) as raised:
        HubRepo(repo_id, token=faults.write_token).read("export_config.json")
    assert_unreachable(raised.value, "export_config.json")


def test_a_rejected_token_and_an_unknown_revision_are_errors_without_the_token(hub):
    repo_id = unique("auth")
    hub.seed_repo(repo_id, {"config.json": "{}"}, private=True)
    with pytest.raises(SourceError, match="rejected the token") as raised:
        HubRepo(repo_id, token=SECRET).read("config.json")
    assert SECRET not in str(raised.value) and exit_code(raised.value) == 2
    with pytest.raises(SourceError, match="revision 'nope' not found"):
        HubRepo(repo_id, "nope", hub.write_token).read("config.json")
    assert HubRepo(repo_id, None, hub.write_token).head("nope") is None  # the Hub says: no such branch
    with pytest.raises(SourceError, match="not found or not accessible"):
        HubRepo(repo_id, token=False).read("config.json")  # anonymous: a private repo is not shown


def test_markers_round_trip_bare_and_with_fields():
    assert marker_line("recipe-proposal") == "<!-- hfexport:recipe-proposal -->"
    assert parse_marker("text\n<!-- hfexport:recipe-proposal -->\nmore", "recipe-proposal") == {}
    line = marker_line("publication", {"key": "a/b@main", "content": "c"})
    assert parse_marker(f"x {line} y", "publication") == {"content": "c", "key": "a/b@main"}
    assert parse_marker(line, "recipe-proposal") is None and parse_marker(None, "publication") is None
    assert parse_marker("<!-- hfexport:publication {broken -->", "publication") is None


# ── recipe loading (hfexport.recipe.loading, the CLI's annotations) ──────────


def test_recipe_loading_reports_an_unreachable_hub_not_no_recipe(faults):
    from hfexport.recipe.loading import load_recipe, model_config
    from hfexport.surfaces.annotations import read_recipe_text

    repo = unique("recipe")
    faults.seed_repo(repo, {"config.json": "{}"})  # no recipe at all: absent would be RecipeNotFoundError
    with pytest.raises(RecipeNotFoundError):
        load_recipe(repo)
    faults.inject_fault("resolve", DOWN, path="export_config.json")
    with pytest.raises(SourceError) as raised:
        load_recipe(repo)
    assert_unreachable(raised.value, "export_config.json")
    faults.inject_fault("resolve", "drop", path="export_config.json")
    with pytest.raises(SourceError) as raised:
        read_recipe_text(repo, None, None)
    assert_unreachable(raised.value)
    other = unique("model-config")  # config.json not in the cache yet (huggingface_hub falls back to a cached copy)
    faults.seed_repo(other, {"config.json": "{}"})
    faults.inject_fault("resolve", DOWN, path="config.json")
    with pytest.raises(SourceError) as raised:
        model_config(other)
    assert_unreachable(raised.value, "config.json")


# ── loading an export (hfexport.load) ────────────────────────────────────────


@pytest.fixture(scope="module")
def onnx_files(exported_bert) -> dict[str, bytes]:
    output, report = exported_bert
    assert report.targets["onnx"].status == "ok", report.targets["onnx"].error
    return {f"exports/onnx/{p.name}": p.read_bytes() for p in (output / "onnx").iterdir() if p.is_file()}


def test_load_reports_an_unreachable_manifest_not_an_unexported_model(faults, onnx_files, tmp_path):
    import hfexport

    repo = unique("load-manifest")
    faults.seed_repo(repo, onnx_files)
    faults.inject_fault("resolve", DOWN, path="exports/onnx/export.json")
    with pytest.raises(SourceError) as raised:
        hfexport.load(repo, target="onnx", cache_dir=tmp_path / "cache")
    message = assert_unreachable(raised.value, "export.json")
    assert "not an exported model" not in message


def test_load_never_skips_an_optional_file_it_could_not_reach(faults, onnx_files, tmp_path):
    """`config.json` beside the export is optional (a 404 loads without it); the Hub failing on it is an error."""
    import hfexport

    assert "exports/onnx/config.json" in onnx_files
    repo = unique("load-optional")
    faults.seed_repo(repo, onnx_files)
    faults.inject_fault("resolve", DOWN, path="exports/onnx/config.json")
    with pytest.raises(SourceError) as raised:
        hfexport.load(repo, target="onnx", cache_dir=tmp_path / "cache")
    assert_unreachable(raised.value, "config.json")
    faults.clear_faults()
    assert hfexport.load(repo, target="onnx", cache_dir=tmp_path / "cache") is not None


def test_load_reports_an_unreachable_target_listing(faults, onnx_files, tmp_path):
    import hfexport

    repo = unique("load-listing")
    faults.seed_repo(repo, onnx_files)
    faults.inject_fault("repo_info", 500)
    with pytest.raises(SourceError) as raised:
        hfexport.load(repo, target="onnx", cache_dir=tmp_path / "cache")
    assert "no target" not in str(raised.value) and exit_code(raised.value) == 2


# ── calibration (hfexport.quantization.calibration) ──────────────────────────


def test_calibration_files_on_an_unreachable_hub_are_errors_not_missing_files(faults):
    from hfexport.quantization.calibration import load_texts

    repo = unique("calibration")
    faults.seed_repo(repo, {"config.json": "{}", "calibration.txt": "one\ntwo\n"})
    dataset = unique("calibration-data")
    faults.seed_repo(dataset, {"data/train.txt": "one\ntwo\n"}, repo_type="dataset")
    section = {"source": "repo_file", "path": "calibration.txt"}
    with pytest.raises(PlanError, match="no file missing.txt"):
        load_texts({**section, "path": "missing.txt"}, None, "t", source=repo)
    faults.inject_fault("resolve", DOWN, path="calibration.txt")
    with pytest.raises(SourceError) as raised:
        load_texts(section, None, "t", source=repo)
    assert_unreachable(raised.value, "calibration.txt")
    assert str(raised.value).startswith("targets.t.quantization.calibration: ")
    faults.inject_fault("resolve", "drop", path="data/train.txt")
    with pytest.raises(SourceError) as raised:
        load_texts({"source": "dataset", "repo": dataset, "path": "data/train.txt"}, None, "t")
    assert_unreachable(raised.value, "data/train.txt")
    faults.clear_faults()
    assert load_texts(section, None, "t", source=repo)[0] == ["one", "two"]


# ── publication (hfexport.publication) ───────────────────────────────────────


def test_publish_refuses_when_the_readme_cannot_be_read_instead_of_replacing_it(faults, exported_bert, tmp_path):
    from hfexport.publication.publish import publish

    output, _ = exported_bert
    out = tmp_path / "out"
    shutil.copytree(output / "onnx", out / "onnx")
    repo = unique("publish-readme")
    faults.seed_repo(repo, EXAMPLES / "tiny-bert")
    faults.commit(repo, add={"README.md": "# The owner's card\n"})
    before = faults.refs(repo)
    faults.inject_fault("resolve", DOWN, path="README.md")
    with pytest.raises(PublishError) as raised:
        publish(out, repo, token=faults.write_token)
    assert_unreachable(raised.value, "README.md")
    assert faults.refs(repo) == before and faults.discussions(repo) == []  # nothing half-made, the card untouched
    faults.clear_faults()
    result = publish(out, repo, token=faults.write_token)
    assert result.action == "opened"
    readme = faults.read_file(repo, "README.md", f"refs/pr/{result.pr_num}").decode()
    assert "# The owner's card" in readme


def test_the_publication_record_and_the_webhook_never_take_a_failing_hub_for_no_branch_or_no_pr(faults, tiny_bert,
                                                                                               tmp_path):
    from hfexport.publication.record import publication_record
    from hfexport.surfaces.webhook import WebhookReceiver
    from test_webhook import config

    repo = unique("record")
    faults.seed_repo(repo, tiny_bert)
    assert publication_record(repo, token=faults.write_token).behind  # nothing published yet
    assert publication_record(repo, "no-branch", faults.write_token).head is None
    faults.inject_fault("repo_info", 500)
    with pytest.raises(SourceError, match=r"the Hub failed \(500\)") as raised:
        publication_record(repo, token=faults.write_token)
    assert exit_code(raised.value) == 2 and raised.value.transient and faults.write_token not in str(raised.value)
    faults.inject_fault("discussions", "drop")
    with pytest.raises(SourceError) as raised:
        publication_record(repo, token=faults.write_token)
    assert_unreachable(raised.value, repo)

    receiver = WebhookReceiver(config(faults, tmp_path, repos=[repo]))
    faults.inject_fault("repo_info", 503)
    assert receiver.reconcile() == []  # not queued as "no branch", not counted as current
    assert receiver.reconciled["current"] == 0 and repo in receiver.reconciled["errors"]
    assert faults.write_token not in receiver.reconciled["errors"][repo]


# ── the Space (hfexport.surfaces.space) ──────────────────────────────────────


def test_the_space_reads_and_proposes_recipes_only_from_a_hub_it_reached(faults):
    from hfexport.surfaces import space

    recipe = json.loads((EXAMPLES / "tiny-bert" / "export_config.json").read_text())
    repo = unique("space")
    faults.seed_repo(repo, EXAMPLES / "tiny-bert")
    faults.inject_fault("resolve", DOWN, path="config.json")  # the recipe reads; the model config fails
    with pytest.raises(SourceError) as raised:
        space.fetch_recipe(repo, None, None)
    assert_unreachable(raised.value, "config.json")
    faults.clear_faults()

    repo = unique("space-propose")
    faults.seed_repo(repo, {"config.json": "{}"})
    first = space.propose_recipe(repo, recipe, faults.write_token)
    assert (first.action, first.pr_num) == ("opened", 1)
    refs, events = faults.refs(repo), faults.discussions(repo)[0]["events"]
    faults.inject_fault("resolve", DOWN, path="export_config.json")
    with pytest.raises(PublishError) as raised:  # the PR's recipe unreadable: not taken for "no recipe yet"
        space.propose_recipe(repo, recipe, faults.write_token)
    assert_unreachable(raised.value, "export_config.json")
    assert faults.refs(repo) == refs and faults.discussions(repo)[0]["events"] == events
    faults.clear_faults()
    assert space.propose_recipe(repo, recipe, faults.write_token).action == "unchanged"
    changed = {**recipe, "default_target": "pt2"}
    updated = space.propose_recipe(repo, changed, faults.write_token)
    assert (updated.action, updated.pr_num) == ("updated", 1) and len(faults.discussions(repo)) == 1
    assert parse_marker(faults.discussions(repo)[0]["events"][0]["data"]["latest"]["raw"], "recipe-proposal") == {}


# ── the memory preflight (hfexport.job.preflight) ────────────────────────────


def test_the_preflight_reads_weights_only_from_a_hub_it_reached(faults, tiny_bert):
    from hfexport.job.preflight import weights_metadata

    repo = unique("preflight")
    faults.seed_repo(repo, tiny_bert)
    weights, counts = weights_metadata(repo, None, None)
    assert weights > 0 and counts
    faults.inject_fault("resolve", DOWN, path="model.safetensors")
    with pytest.raises(SourceError) as raised:  # not "not a safetensors repo", then sized from the file list
        weights_metadata(repo, None, None)
    assert exit_code(raised.value) == 2 and f"the Hub failed ({DOWN})" in str(raised.value)
