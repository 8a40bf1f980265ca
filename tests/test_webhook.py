"""Hub-native CI: the webhook receiver over real HTTP, running real jobs and publishing to the local Hub."""

from __future__ import annotations

import json
import threading
import urllib.error
import urllib.request
import uuid
from pathlib import Path

import pytest
from hfexport.surfaces.webhook import (
    Job,
    WebhookConfig,
    WebhookReceiver,
    classify,
    export_and_publish,
    job_settings,
    make_server,
)

SECRET = "webhook-secret-for-tests"


def payload(hub, repo: str, new_sha: str | None, old_sha: str | None = None, ref: str = "refs/heads/main",
            scope: str = "repo.content", action: str = "update", repo_type: str = "model") -> dict:
    """A Hub webhook (v3) body as the Hub sends it."""
    return {
        "event": {"action": action, "scope": scope},
        "repo": {"type": repo_type, "name": repo, "id": uuid.uuid4().hex[:24], "private": False, "headSha": new_sha,
                 "owner": {"id": uuid.uuid4().hex[:24]},
                 "url": {"web": f"{hub.url}/{repo}", "api": f"{hub.url}/api/models/{repo}"}},
        "updatedRefs": [{"ref": ref, "oldSha": old_sha, "newSha": new_sha}],
        "webhook": {"id": uuid.uuid4().hex[:24], "version": 3},
    }


def discussion_payload(hub, repo: str) -> dict:
    body = payload(hub, repo, None, scope="discussion", action="create")
    del body["updatedRefs"]
    body["discussion"] = {"id": "d1", "num": 7, "author": {"id": "a"}, "title": "Question", "isPullRequest": False,
                          "status": "open", "url": {"web": f"{hub.url}/{repo}/discussions/7"}}
    return body


class Receiver:
    """A receiver served over HTTP on 127.0.0.1 for one test module or test."""

    def __init__(self, config: WebhookConfig, run=None):
        self.receiver = WebhookReceiver(config, run)
        self.server = make_server(self.receiver)
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}"
        self.thread = threading.Thread(target=self.server.serve_forever, kwargs={"poll_interval": 0.05}, daemon=True)
        self.thread.start()

    def post(self, body: dict | bytes, secret: str | None = SECRET, path: str = "/webhook") -> tuple[int, dict]:
        data = body if isinstance(body, bytes) else json.dumps(body).encode()
        headers = {"Content-Type": "application/json"}
        if secret is not None:
            headers["X-Webhook-Secret"] = secret
        request = urllib.request.Request(self.url + path, data=data, headers=headers, method="POST")
        try:
            with urllib.request.urlopen(request, timeout=30) as response:
                return response.status, json.loads(response.read())
        except urllib.error.HTTPError as error:
            return error.code, json.loads(error.read())

    def get(self, path: str) -> tuple[int, str]:
        with urllib.request.urlopen(self.url + path, timeout=30) as response:
            return response.status, response.read().decode()

    def close(self):
        self.receiver.wait_idle(600)
        self.server.shutdown()
        self.server.server_close()


def config(hub, tmp_path: Path, **overrides) -> WebhookConfig:
    settings = {"secret": SECRET, "token": hub.write_token, "workdir": tmp_path / "jobs", "targets": ["pt2"],
                "debounce_s": 0.2}
    return WebhookConfig(**{**settings, **overrides})


def in_process(settings: WebhookConfig):
    """The receiver's job function run in the test's process. The local executor runs it in a child process (the
    `published` fixture, and the kill and full-disk tests of test_webhook_durable.py, go through that); the other
    tests save the child's start-up (imports, ~5-20 s on a loaded 2-core machine) this way."""
    return lambda job, output: export_and_publish(job, output, job_settings(settings), settings.token)


def perturbed_weights(folder: Path, delta: float) -> bytes:
    from safetensors.torch import load_file, save

    tensors = load_file(folder / "model.safetensors")
    name = sorted(tensors)[0]
    tensors[name] = tensors[name] + delta
    return save(tensors, metadata={"format": "pt"})


# ── end to end: real jobs, real publications ─────────────────────────────────


@pytest.fixture(scope="module")
def published(hub, tiny_bert, tmp_path_factory):
    """One valid push to a seeded repo, handled to the end: (receiver, repo, answer to the push)."""
    repo = f"user/webhook-{uuid.uuid4().hex[:8]}"
    hub.seed_repo(repo, tiny_bert)
    server = Receiver(config(hub, tmp_path_factory.mktemp("webhook")))
    answer = server.post(payload(hub, repo, hub.head(repo)))
    assert server.receiver.wait_idle(600)
    yield server, repo, answer
    server.close()


def test_valid_push_opens_exactly_one_pr_with_the_report(hub, published):
    server, repo, (status, body) = published
    assert status == 202 and body["repo"] == repo and body["sha"] == hub.head(repo)
    [job] = server.receiver.jobs()
    assert job.state == "done", job.detail
    assert (job.status, job.changed, job.action) == ("ok", True, "opened")
    [pr] = hub.discussions(repo)
    assert pr["isPullRequest"] and pr["status"] == "open" and job.pr_url.endswith(f"/discussions/{pr['num']}")
    description = pr["events"][0]["data"]["latest"]["raw"]
    assert "## hfexport report" in description and "`pt2`" in description
    files = hub.list_files(repo, f"refs/pr/{pr['num']}")
    assert "torch-export/model.pt2" in files and "torch-export/export_report.json" in files
    report = json.loads(hub.read_file(repo, "torch-export/export_report.json", f"refs/pr/{pr['num']}"))
    assert report["source"]["commit"] == hub.head(repo)

    code, text = server.get("/status")
    status_json = json.loads(text)
    assert code == 200 and status_json["jobs"][0]["pr_url"] == job.pr_url and status_json["busy"] == {}
    code, page = server.get("/")
    assert code == 200 and repo in page and job.pr_url in page and "opened" in page


def test_its_own_pr_ref_update_is_ignored(hub, published):
    server, repo, _ = published
    [pr] = hub.discussions(repo)
    pr_ref = f"refs/pr/{pr['num']}"
    before = (hub.refs(repo), len(server.receiver.jobs()))
    status, body = server.post(payload(hub, repo, hub.refs(repo)["pulls"][str(pr["num"])], ref=pr_ref))
    assert status == 200 and "pull request" in body["ignored"]
    assert server.receiver.wait_idle(30)
    assert (hub.refs(repo), len(server.receiver.jobs())) == before
    assert len(hub.discussions(repo)) == 1


def test_missing_or_wrong_secret_is_refused_and_nothing_happens(hub, published):
    server, repo, _ = published
    jobs, refs, discussions = len(server.receiver.jobs()), hub.refs(repo), hub.discussions(repo)
    assert server.post(payload(hub, repo, hub.head(repo)), secret=None)[0] == 401
    assert server.post(payload(hub, repo, hub.head(repo)), secret="wrong-secret")[0] == 403
    assert server.post(payload(hub, repo, hub.head(repo)), secret=SECRET[:-1])[0] == 403
    assert server.post(b"not json", secret="")[0] == 403  # the secret is checked before the body is read
    assert server.receiver.wait_idle(30)
    assert (len(server.receiver.jobs()), hub.refs(repo), hub.discussions(repo)) == (jobs, refs, discussions)


def test_irrelevant_events_are_ignored(hub, published):
    server, repo, _ = published
    jobs, refs = len(server.receiver.jobs()), hub.refs(repo)
    head = hub.head(repo)
    cases = {
        "discussion": discussion_payload(hub, repo),
        "other branch": payload(hub, repo, head, ref="refs/heads/dev"),
        "tag": payload(hub, repo, head, ref="refs/tags/v1"),
        "deleted branch": payload(hub, repo, None, head),
        "settings": payload(hub, repo, head, scope="repo.config"),
        "dataset": payload(hub, repo, head, repo_type="dataset"),
    }
    for name, body in cases.items():
        status, answer = server.post(body)
        assert status == 200 and "ignored" in answer, name
    assert server.post(b"{not json")[0] == 400
    assert server.receiver.wait_idle(30)
    assert (len(server.receiver.jobs()), hub.refs(repo)) == (jobs, refs)
    assert len(server.receiver.status()["ignored"]) >= len(cases)


def test_a_burst_of_pushes_makes_one_pr_from_the_newest_commit(hub, tiny_bert, tmp_path):
    repo = f"user/burst-{uuid.uuid4().hex[:8]}"
    hub.seed_repo(repo, tiny_bert)
    shas = [hub.head(repo)]
    for index in range(1, 6):  # five pushes, each with new weights
        shas.append(hub.commit(repo, add={"model.safetensors": perturbed_weights(tiny_bert, 0.01 * index)},
                               title=f"weights {index}")["oid"])
    settings = config(hub, tmp_path, debounce_s=3.0)
    server = Receiver(settings, in_process(settings))
    try:
        for old, new in zip(shas[:-1], shas[1:]):
            assert server.post(payload(hub, repo, new, old))[0] == 202
        assert server.receiver.wait_idle(600)
        jobs = {job.sha: job for job in server.receiver.jobs()}
        newest = jobs[shas[-1]]
        assert newest.state == "done" and newest.action == "opened", newest.detail
        superseded = [job for job in jobs.values() if job.state == "superseded"]
        assert len(superseded) == 4 and all(job.superseded_by is not None for job in superseded)
        [pr] = hub.discussions(repo)
        report = json.loads(hub.read_file(repo, "torch-export/export_report.json", f"refs/pr/{pr['num']}"))
        assert report["source"]["commit"] == shas[-1]
        assert len(hub.commits(repo, f"refs/pr/{pr['num']}")) == len(hub.commits(repo)) + 1
    finally:
        server.close()


def test_a_repo_without_recipe_is_skipped(hub, tiny_bert, tmp_path):
    repo = f"user/norecipe-{uuid.uuid4().hex[:8]}"
    hub.seed_repo(repo, {"config.json": (tiny_bert / "config.json").read_bytes()})
    server = Receiver(config(hub, tmp_path))
    try:
        assert server.post(payload(hub, repo, hub.head(repo)))[0] == 202
        assert server.receiver.wait_idle(120)
        [job] = server.receiver.jobs()
        assert job.state == "skipped" and "no recipe" in job.detail
        assert hub.discussions(repo) == []
    finally:
        server.close()


# ── the queue, with a controllable job (no export) ───────────────────────────


def test_queue_runs_one_job_per_repo_and_a_newer_push_supersedes_a_queued_one(hub, tmp_path):
    gate, started, ran = threading.Event(), threading.Event(), []

    def run(job: Job, output: Path) -> None:
        ran.append(job.sha)
        started.set()
        assert gate.wait(30)
        job.commit, job.action = "9" * 39 + job.sha[0], "committed"

    receiver = WebhookReceiver(config(hub, tmp_path, debounce_s=0), run)
    decide = lambda sha, repo="user/q": receiver.handle({"x-webhook-secret": SECRET},  # noqa: E731
                                                        json.dumps(payload(hub, repo, sha)).encode())
    assert decide("a" * 40).status == 202
    assert started.wait(30)
    for sha in ("b" * 40, "c" * 40, "d" * 40):
        assert decide(sha).status == 202
    assert decide("e" * 40, repo="user/other").status == 202  # queued behind: one job at a time per process
    busy = receiver.status()["busy"]
    assert busy == {"user/q": {"running": 1, "queued": 4}, "user/other": {"running": None, "queued": 5}}
    gate.set()
    assert receiver.wait_idle(30)
    assert ran.count("a" * 40) == 1 and ran.count("d" * 40) == 1 and "b" * 40 not in ran and "c" * 40 not in ran
    states = {job.sha[0]: job.state for job in receiver.jobs()}
    assert states == {"a": "done", "b": "superseded", "c": "superseded", "d": "done", "e": "done"}
    # its own commits (a `commit`-mode publication to main) never trigger a job
    decision = decide("9" * 39 + "d")
    assert decision.status == 200 and "own commit" in decision.body["ignored"]


def test_classify_reads_the_pushed_sha_from_updated_refs(hub):
    body = payload(hub, "org/m", "f" * 40)
    body["repo"].pop("headSha")
    assert classify(body) == ("org/m", "f" * 40, "")
    body["updatedRefs"] = [{"ref": "refs/pr/3", "newSha": "1" * 40}, {"ref": "refs/heads/main", "newSha": "2" * 40}]
    assert classify(body)[1] == "2" * 40
    assert classify(body, branch="release")[0] is None


def test_huggingface_hub_payload_model_loses_the_head_sha_so_the_raw_json_is_read(hub):
    """Why classify() reads the raw JSON: the client's model declares `head_sha`, the Hub sends `headSha`."""
    pytest.importorskip("pydantic")  # huggingface_hub's WebhookPayload needs it (gradio brings it)
    from huggingface_hub import WebhookPayload

    body = payload(hub, "org/m", "f" * 40)
    assert WebhookPayload.model_validate(body).repo.head_sha is None
    assert classify(body)[1] == "f" * 40


def test_config_requires_a_secret(tmp_path):
    from hfexport.errors import HfExportError

    with pytest.raises(HfExportError, match="secret"):
        WebhookConfig(secret="", workdir=tmp_path)


def test_status_page_escapes_what_it_shows(hub, tmp_path):
    def run(job: Job, output: Path) -> None:
        raise RuntimeError("<script>alert(1)</script> in the engine's message")

    server = Receiver(config(hub, tmp_path, debounce_s=0), run)
    try:
        assert server.post(payload(hub, "user/escape", "a" * 40))[0] == 202
        assert server.receiver.wait_idle(30)
        [job] = server.receiver.jobs()
        assert job.state == "failed" and "<script>" in job.detail
        _, page = server.get("/")
        assert "<script>" not in page and "&lt;script&gt;alert(1)&lt;/script&gt;" in page
    finally:
        server.close()


def test_the_app_serves_from_its_environment_and_needs_a_secret(hub, tmp_path):
    import os
    import subprocess
    import sys

    root = Path(__file__).resolve().parent.parent
    env = {**os.environ, "PYTHONPATH": str(root / "library"), "PORT": "0", "HOST": "127.0.0.1",
           "HFEXPORT_WORKDIR": str(tmp_path), "HFEXPORT_TARGETS": "pt2"}
    env.pop("WEBHOOK_SECRET", None)
    refused = subprocess.run([sys.executable, str(root / "action" / "webhook_app.py")], env=env, capture_output=True,
                             text=True, timeout=60)
    assert refused.returncode == 2 and "secret is required" in refused.stderr
    app = subprocess.Popen([sys.executable, str(root / "action" / "webhook_app.py")],
                           env={**env, "WEBHOOK_SECRET": SECRET}, stdout=subprocess.PIPE, text=True)
    try:
        line = app.stdout.readline()
        url = line.split(" on ", 1)[1].split(" ", 1)[0]
        with urllib.request.urlopen(url + "/status", timeout=30) as response:
            status = json.loads(response.read())
        assert status["targets"] == ["pt2"] and status["jobs"] == []
        request = urllib.request.Request(url + "/webhook", data=b"{}", method="POST")
        with pytest.raises(urllib.error.HTTPError) as refused_post:
            urllib.request.urlopen(request, timeout=30)
        assert refused_post.value.code == 401
    finally:
        app.terminate()
        app.wait(timeout=30)
