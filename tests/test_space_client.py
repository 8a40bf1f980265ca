"""The Space through `gradio_client`: the API a script uses (`Client(url, oauth_token=...)` + named endpoints).

Same app, same flows as the browser tests, without a browser: load a recipe, convert, open one PR and find it up
to date the second time, see the queue position while another job runs, and the error paths.
"""

from __future__ import annotations

import json
import time
import uuid
import zipfile
from pathlib import Path

import pytest
from hfexport.testing.space import running_space

ROOT = Path(__file__).resolve().parent.parent
EXAMPLES = ROOT / "examples"
JOB_TIMEOUT_S = 300


@pytest.fixture(scope="module")
def space(hub, tmp_path_factory):
    from hfexport.surfaces.space import SpaceSettings

    settings = SpaceSettings(workdir=tmp_path_factory.mktemp("space-client-work"), queue_size=4)
    with running_space(settings, login_token=hub.read_token) as running:
        yield running


@pytest.fixture
def client(space, tmp_path):
    """`client(token)`: a new API session; `token` is the Hugging Face token the Space acts with (None: anonymous)."""
    from gradio_client import Client

    def make(token: str | None):
        return Client(space.url, oauth_token=token, verbose=False, analytics_enabled=False,
                      download_files=str(tmp_path / f"downloads-{uuid.uuid4().hex[:6]}"))

    return make


def seed(hub, name: str, files) -> str:
    repo = f"user/{name}-{uuid.uuid4().hex[:8]}"
    hub.seed_repo(repo, files)
    return repo


def test_load_convert_open_pr_then_up_to_date_with_a_queue(space, hub, client):
    repo = seed(hub, "client-bert", EXAMPLES / "tiny-bert")
    api = client(hub.write_token)  # a script passes an ordinary token with write access
    status, text, problems, targets = api.predict(repo, "", api_name="/load_recipe")
    assert "Valid recipe" in status and json.loads(text)["default_target"] == "onnx"
    assert [choice[0] for choice in targets["choices"]] == ["onnx", "openvino", "pt2", "pte"]
    assert problems["visible"] is False

    running = api.submit(repo, "", text, ["pt2"], api_name="/convert")
    deadline = time.monotonic() + JOB_TIMEOUT_S
    while running.status().code.name not in ("PROCESSING", "ITERATING") and not running.done():
        assert time.monotonic() < deadline
        time.sleep(0.1)
    # Another session converts while the job runs (a repo that does not exist: it waits its turn, then fails fast).
    waiting = client(hub.write_token).submit(f"user/missing-{uuid.uuid4().hex[:8]}", "", "", [], api_name="/convert")
    ranks = []
    while not waiting.done() and time.monotonic() < deadline:
        update = waiting.status()
        if update.code.name == "IN_QUEUE" and update.rank is not None:
            ranks.append((update.rank, update.queue_size))
        time.sleep(0.1)
    assert ranks and ranks[0] == (0, 1), ranks  # first (and only) in line behind the running job

    progress, outcome, results, archive = running.result(timeout=JOB_TIMEOUT_S)
    assert outcome.startswith("### Outcome") and "✅ passed" in outcome  # the outcome first, then the report
    assert "Finished in" in progress and "✓ export `pt2`" in progress and "verify parity `pt2`" in progress
    assert "hfexport report" in results and "Parity" in results and "max abs" in results
    names = zipfile.ZipFile(archive).namelist()
    assert "export_report.json" in names and any(name.startswith("pt2/") and name.endswith(".pt2") for name in names)
    _, queued_outcome, _, queued_archive = waiting.result(timeout=JOB_TIMEOUT_S)
    assert "Repository not found" in queued_outcome and queued_archive is None

    message = api.predict(api_name="/open_pr")
    assert "Opened pull request [#1](" in message and f"/{repo}/discussions/1)" in message
    files = hub.list_files(repo, "refs/pr/1")
    assert "torch-export/export_report.json" in files and any(f.endswith(".pt2") for f in files)
    head = hub.head(repo, "refs/pr/1")
    assert "up to date" in api.predict(api_name="/open_pr")
    assert hub.head(repo, "refs/pr/1") == head and len(hub.discussions(repo)) == 1


def test_signed_out_calls_ask_to_sign_in(space, hub, client):
    repo = seed(hub, "client-signed-out", EXAMPLES / "tiny-bert")
    anonymous = client(None)
    status, *_ = anonymous.predict(repo, "", api_name="/load_recipe")
    assert "Valid recipe" in status  # public recipes are readable signed out
    progress, outcome, results, archive = anonymous.predict(repo, "", "", [], api_name="/convert")
    assert "Sign in required" in outcome and archive is None
    assert "Sign in required" in anonymous.predict(api_name="/open_pr")
    recipe = (EXAMPLES / "tiny-bert" / "export_config.json").read_text()
    assert "Sign in required" in anonymous.predict(repo, recipe, api_name="/propose_recipe")
    assert hub.discussions(repo) == []


def test_error_paths_are_categories_with_commands(space, hub, client, monkeypatch):
    api = client(hub.write_token)
    missing = f"user/missing-{uuid.uuid4().hex[:8]}"
    status, *_ = api.predict(missing, "", api_name="/load_recipe")
    assert "Repository not found" in status and f"hfexport validate {missing}" in status

    repo = seed(hub, "client-errors", EXAMPLES / "tiny-bert")
    status, *_ = api.predict(repo, "no-such-branch", api_name="/load_recipe")
    assert "Revision not found" in status and "--revision no-such-branch" in status

    recipe = json.loads((EXAMPLES / "tiny-bert" / "export_config.json").read_text())
    recipe["targets"]["pt2"]["mode"] = "sideways"
    status, problems, _ = api.predict(json.dumps(recipe), api_name="/validate_recipe")
    assert "Invalid recipe" in status and "`targets.pt2.mode`" in status
    labelled = [item for item in problems["value"] if item["class_or_confidence"]]
    assert [(item["token"].split(" │ ", 1)[1], item["class_or_confidence"]) for item in labelled] == \
        [('      "mode": "sideways",\n', "targets.pt2.mode")]
    progress, outcome, results, archive = api.predict(repo, "", json.dumps(recipe), [], api_name="/convert")
    assert "Invalid recipe" in outcome and "targets.pt2.mode" in outcome
    assert f"hfexport export {repo} --recipe export_config.json -o out" in outcome

    monkeypatch.setenv("HFEXPORT_MEMORY_LIMIT_MB", "64")
    progress, outcome, results, archive = api.predict(repo, "", "", ["onnx"], api_name="/convert")
    assert "Model too large for this Space" in outcome and "available" in outcome and archive is None
    assert "Nothing to publish" in api.predict(api_name="/open_pr")


def test_propose_recipe_opens_one_pr_then_says_it_is_there(space, hub, client):
    repo = seed(hub, "client-propose", {"config.json": (EXAMPLES / "tiny-bert" / "config.json").read_bytes()})
    api = client(hub.write_token)
    status, *_ = api.predict(repo, "", api_name="/load_recipe")
    assert "No recipe" in status
    recipe = (EXAMPLES / "tiny-bert" / "export_config.json").read_text()
    message = api.predict(repo, recipe, api_name="/propose_recipe")
    assert "Opened pull request [#1](" in message and "export_config.json" in message
    assert json.loads(hub.read_file(repo, "export_config.json", "refs/pr/1")) == json.loads(recipe)
    assert "already proposes" in api.predict(repo, recipe, api_name="/propose_recipe")
    assert "Invalid recipe" in api.predict(repo, '{"targets": {}}', api_name="/propose_recipe")
    assert len(hub.discussions(repo)) == 1


def test_propose_with_a_broken_editor_points_at_the_editors_text(space, hub, client):
    """It suggested `hfexport validate org/model`, which checks the repo's recipe, not the editor's."""
    api = client(hub.write_token)
    repo = seed(hub, "client-propose-broken", EXAMPLES / "tiny-bert")
    text = (EXAMPLES / "tiny-bert" / "export_config.json").read_text().rstrip() + ",,broken"
    message = api.predict(repo, text, api_name="/propose_recipe")
    assert "Invalid recipe" in message and "not valid JSON" in message
    assert "hfexport validate export_config.json" in message and f"hfexport validate {repo}" not in message
    assert hub.discussions(repo) == []
