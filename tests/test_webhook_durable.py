"""The webhook receiver survives restarts and faults: it reconciles with the Hub (the record of what was exported),
retries what the Hub failed transiently, and refuses bad deliveries. Real jobs on tiny-bert over real HTTP against
the local Hub server, which injects the faults; the burst uses a controllable job (no export)."""

from __future__ import annotations

import json
import os
import random
import signal
import subprocess
import sys
import threading
import time
import tracemalloc
import urllib.request
import uuid
from pathlib import Path

import pytest
from hfexport.publication.publish import parse_marker
from hfexport.publication.record import publication_record
from hfexport.surfaces.webhook import MAX_BODY, STATE_FILE, Job, WebhookReceiver
from test_webhook import SECRET, Receiver, config, in_process, payload, perturbed_weights

ROOT = Path(__file__).resolve().parent.parent


def new_repo(hub, tiny_bert, prefix: str) -> str:
    repo = f"user/{prefix}-{uuid.uuid4().hex[:8]}"
    hub.seed_repo(repo, tiny_bert)
    return repo


def pr_source(hub, repo: str) -> tuple[int, str | None]:
    """(number of PRs, the source commit the one open hfexport PR's marker names)."""
    prs = hub.discussions(repo)
    marker = parse_marker(prs[0]["events"][0]["data"]["latest"]["raw"]) if prs else None
    return len(prs), (marker or {}).get("source")


def served(settings) -> Receiver:
    return Receiver(settings, in_process(settings))


def push(hub, repo: str, tiny_bert, delta: float) -> str:
    return hub.commit(repo, add={"model.safetensors": perturbed_weights(tiny_bert, delta)}, title=f"w {delta}")["oid"]


# ── reconciliation: the Hub is the record ────────────────────────────────────


def test_a_push_missed_while_down_is_exported_on_start_once(hub, tiny_bert, tmp_path):
    repo = new_repo(hub, tiny_bert, "missed")
    first = served(config(hub, tmp_path))
    assert first.post(payload(hub, repo, hub.head(repo)))[0] == 202
    first.close()
    assert pr_source(hub, repo) == (1, hub.head(repo))
    state = json.loads((tmp_path / "jobs" / STATE_FILE).read_text())
    assert state["repos"][repo]["handled"] == hub.head(repo)

    new_head = push(hub, repo, tiny_bert, 0.02)  # while the receiver is down: its webhook is never delivered
    second = served(config(hub, tmp_path))
    try:
        second.receiver.start()
        assert second.receiver.wait_idle(600)
        [job] = second.receiver.jobs()
        assert (job.via, job.sha, job.state, job.action) == ("reconcile", new_head, "done", "updated"), job.detail
        assert pr_source(hub, repo) == (1, new_head)
        assert second.receiver.reconcile() == []  # current now: nothing queued twice
        assert json.loads(second.get("/status")[1])["reconciled"]["current"] == 1
    finally:
        second.close()


def test_a_configured_repo_whose_webhook_never_arrived_is_exported_and_the_record_survives_a_lost_state_file(
        hub, tiny_bert, tmp_path):
    repo = new_repo(hub, tiny_bert, "nohook")
    server = served(config(hub, tmp_path / "a", repos=[repo]))
    try:
        server.receiver.start()
        assert server.receiver.wait_idle(600)
        [job] = server.receiver.jobs()
        assert (job.via, job.state, job.action) == ("reconcile", "done", "opened"), job.detail
    finally:
        server.close()
    # A fresh workdir (a Space without persistent storage): the open PR's marker says the head is exported.
    fresh = WebhookReceiver(config(hub, tmp_path / "b", repos=[repo]))
    assert fresh.reconcile() == [] and fresh.reconciled["current"] == 1
    assert publication_record(repo, token=hub.write_token).behind is False
    assert pr_source(hub, repo) == (1, hub.head(repo))


def test_a_receiver_killed_during_an_export_redoes_it_on_restart_once(hub, tiny_bert, tmp_path):
    """SIGKILL while the job runs (its commit request held by the Hub, unanswered): no PR; the restarted app
    reconciles from its state file and publishes exactly one PR from the pushed commit."""
    repo = new_repo(hub, tiny_bert, "killed")
    env = {**os.environ, "PYTHONPATH": str(ROOT / "library"), "PORT": "0", "HOST": "127.0.0.1",
           "HFEXPORT_WORKDIR": str(tmp_path), "HFEXPORT_TARGETS": "pt2", "HFEXPORT_DEBOUNCE": "0",
           "WEBHOOK_SECRET": SECRET, "HF_TOKEN": hub.write_token}

    def start() -> tuple[subprocess.Popen, str]:
        app = subprocess.Popen([sys.executable, str(ROOT / "action" / "webhook_app.py")], env=env,
                               stdout=subprocess.PIPE, text=True)
        return app, app.stdout.readline().split(" on ", 1)[1].split(" ", 1)[0]

    def status(url: str) -> dict:
        with urllib.request.urlopen(url + "/status", timeout=30) as response:
            return json.loads(response.read())

    hub.timeout_s = 60.0
    hub.inject_fault("commit", "timeout")
    app, url = start()
    try:
        request = urllib.request.Request(url + "/webhook", data=json.dumps(payload(hub, repo, hub.head(repo))).encode(),
                                         headers={"X-Webhook-Secret": SECRET}, method="POST")
        assert urllib.request.urlopen(request, timeout=30).status == 202
        deadline = time.monotonic() + 300
        while hub.fail_next_commit is not None:  # the held commit request has not arrived yet
            assert time.monotonic() < deadline and app.poll() is None
            time.sleep(0.05)
        assert status(url)["jobs"][0]["state"] == "running"
        app.send_signal(signal.SIGKILL)
        app.wait(30)
    finally:
        if app.poll() is None:
            app.kill()
    assert hub.discussions(repo) == [] and (tmp_path / STATE_FILE).is_file()

    app, url = start()
    try:
        deadline = time.monotonic() + 300
        while not any(job["state"] in ("done", "failed") for job in status(url)["jobs"]):
            assert time.monotonic() < deadline and app.poll() is None
            time.sleep(0.2)
        [job] = status(url)["jobs"]
        assert (job["via"], job["state"], job["action"]) == ("reconcile", "done", "opened"), job
        assert pr_source(hub, repo) == (1, hub.head(repo))
        [pr] = hub.discussions(repo)
        assert len(hub.commits(repo, f"refs/pr/{pr['num']}")) == len(hub.commits(repo)) + 1
        assert not any(path.is_file() for path in (tmp_path / "jobs").rglob("*"))  # the killed job's files: gone
    finally:
        app.terminate()
        app.wait(30)
        hub.timeout_s = 5.0


def test_an_unreadable_state_file_is_said_and_the_configured_repos_are_still_reconciled(hub, tiny_bert, tmp_path):
    repo = new_repo(hub, tiny_bert, "badstate")
    (tmp_path / STATE_FILE).write_text("{not json")
    ran = []
    receiver = WebhookReceiver(config(hub, tmp_path, workdir=tmp_path, repos=[repo]),
                               run=lambda job, output: ran.append(job.sha))
    assert "could not be read" in receiver.status()["state_file"]["problem"]
    [job] = receiver.reconcile()
    assert receiver.wait_idle(30) and ran == [hub.head(repo)] and job.via == "reconcile"
    saved = json.loads((tmp_path / STATE_FILE).read_text())  # rewritten whole (aside, then renamed over)
    assert saved["repos"][repo]["handled"] == hub.head(repo)
    assert receiver.status()["state_file"]["problem"] is None
    assert [path.name for path in tmp_path.iterdir() if path.name.startswith(".")] == []  # no temporary left


# ── the Hub failing: bounded retries, then a clear failed state ──────────────


@pytest.mark.parametrize("faults", [[("discussions", 503), ("commit", 500), ("commit", 429)], [("commit", "timeout")]],
                         ids=["500-429-503", "timeout"])
def test_transient_hub_failures_are_retried_with_backoff(hub, tiny_bert, tmp_path, faults):
    """PR listing answered 503, PR creation 500 then 429 (or held unanswered until the connection closes)."""
    repo = new_repo(hub, tiny_bert, "flaky")
    hub.timeout_s = 1.0
    for endpoint, fault in faults:
        hub.inject_fault(endpoint, fault, times=1 if len(faults) > 1 else 2)
    server = served(config(hub, tmp_path, retries=3, retry_backoff_s=0.1))
    try:
        assert server.post(payload(hub, repo, hub.head(repo)))[0] == 202
        assert server.receiver.wait_idle(600)
        [job] = server.receiver.jobs()
        # huggingface_hub retries some reads itself (1 s backoff): the receiver's own attempts are 2 or 3
        assert (job.state, job.action) == ("done", "opened") and job.attempts >= 2, (job.detail, job.attempts)
        assert pr_source(hub, repo) == (1, hub.head(repo))
    finally:
        hub.clear_faults()
        hub.timeout_s = 5.0
        server.close()


def test_a_hub_that_keeps_failing_ends_in_a_clear_failed_state_and_the_next_reconciliation_publishes(
        hub, tiny_bert, tmp_path):
    repo = new_repo(hub, tiny_bert, "down")
    hub.inject_fault("commit", 500, times=3)
    server = served(config(hub, tmp_path, retries=2, retry_backoff_s=0.1))
    try:
        assert server.post(payload(hub, repo, hub.head(repo)))[0] == 202
        assert server.receiver.wait_idle(600)
        [job] = server.receiver.jobs()
        assert job.state == "failed" and job.attempts == 3, job.detail
        assert "gave up after 3 attempts" in job.detail and "500" in job.detail and hub.write_token not in job.detail
        assert hub.discussions(repo) == [] and len(hub.refs(repo)["pulls"]) == 0  # no half-made PR
        assert server.receiver.state.handled(repo) is None  # tried again later, unlike a parity failure
        [again] = server.receiver.reconcile()
        assert server.receiver.wait_idle(600)
        assert (again.state, again.action) == ("done", "opened"), again.detail
        assert pr_source(hub, repo) == (1, hub.head(repo))
    finally:
        hub.clear_faults()
        server.close()


# ── a full disk ──────────────────────────────────────────────────────────────


@pytest.fixture
def small_disk(tmp_path):
    """A 2 MiB tmpfs (needs root, as in this project's CI container); skipped where mounting is not allowed."""
    mount = tmp_path / "disk"
    mount.mkdir()
    made = subprocess.run(["mount", "-t", "tmpfs", "-o", "size=2m", "tmpfs", str(mount)], capture_output=True)
    if made.returncode != 0:
        pytest.skip(f"cannot mount a small tmpfs here: {made.stderr.decode().strip()}")
    yield mount
    subprocess.run(["umount", "-l", str(mount)], check=False)


def test_a_full_disk_fails_one_job_clearly_leaves_nothing_and_the_next_job_runs(hub, tiny_bert, small_disk):
    repo = new_repo(hub, tiny_bert, "fulldisk")
    filler = small_disk / "filler"
    # 460 KB left: the preflight (weights x 1.1 + the download: 418 KB) passes, the 603 KB .pt2 does not fit
    with open(filler, "wb") as stream:
        stream.write(b"\0" * (2 * 1024 * 1024 - 460 * 1024))
    server = Receiver(config(hub, small_disk, workdir=small_disk / "work"))
    try:
        assert server.post(payload(hub, repo, hub.head(repo)))[0] == 202
        assert server.receiver.wait_idle(600)
        [job] = server.receiver.jobs()
        assert job.state == "failed" and "No space left on device" in job.detail, job.detail
        assert "\n" not in job.detail and hub.discussions(repo) == []
        assert not any(path.is_file() for path in (small_disk / "work" / "jobs").rglob("*"))  # nothing half-written
        filler.unlink()
        new_head = push(hub, repo, tiny_bert, 0.03)
        assert server.post(payload(hub, repo, new_head))[0] == 202
        assert server.receiver.wait_idle(600)
        assert (server.receiver.jobs()[0].state, server.receiver.jobs()[0].action) == ("done", "opened")
        assert pr_source(hub, repo) == (1, new_head)
    finally:
        server.close()


# ── bad deliveries and a burst ───────────────────────────────────────────────


def test_malformed_oversized_and_replayed_deliveries_are_refused_and_nothing_is_queued(hub, tmp_path):
    ran = []
    server = Receiver(config(hub, tmp_path, debounce_s=0), run=lambda job, output: ran.append(job.sha))
    try:
        sha = "ab" * 20
        valid = payload(hub, "user/replayed", sha)
        bad = {
            "not json": b"{",
            "a list": b"[1, 2]",
            "deep nesting": b"[" * 100_000 + b"]" * 100_000,
            "duplicate keys": b'{"event": {"scope": "repo.content", "action": "update"}, "event": {}}',
            "not utf-8": b"\xff\xfe",
            "event not an object": json.dumps({**valid, "event": "push"}).encode(),
            "sha not a commit id": json.dumps({**valid, "updatedRefs": [{"ref": "refs/heads/main",
                                                                          "newSha": "$(rm -rf /)"}]}).encode(),
            "repo name not an id": json.dumps({**valid, "repo": {**valid["repo"], "name": "../../etc"}}).encode(),
        }
        for name, body in bad.items():
            code, answer = server.post(body)
            assert code in (200, 400) and "queued" not in answer, name
        code, answer = server.post(b'{"pad": "' + b"x" * MAX_BODY + b'"}')
        assert code == 413, answer
        assert server.receiver.wait_idle(30) and server.receiver.jobs() == [] and ran == []

        assert server.post(valid)[0] == 202
        assert server.post(valid) == (200, {"ignored": f"{sha[:12]} of user/replayed is already queued or exported "
                                                       "(a repeated delivery)"})
        assert server.receiver.wait_idle(30)
        assert server.post(valid)[0] == 200  # after it ran, too
        assert server.receiver.wait_idle(30) and ran == [sha] and len(server.receiver.jobs()) == 1
    finally:
        server.close()


def test_a_burst_of_200_webhooks_across_20_repos_exports_each_newest_commit_once(hub, tmp_path):
    """200 deliveries in under 10 s from 8 threads, pushes in order per repo; a job takes 50 ms. Each repo's newest
    commit runs exactly once, the receiver's memory stays bounded and the status page answers throughout."""
    ran: dict[str, list[str]] = {}
    lock = threading.Lock()

    def run(job: Job, output: Path) -> None:
        with lock:
            ran.setdefault(job.repo, []).append(job.sha)
        time.sleep(0.05)

    server = Receiver(config(hub, tmp_path, debounce_s=0.5, history=50), run=run)
    repos = [f"user/burst-{index:02d}" for index in range(20)]
    pushes = {repo: [uuid.uuid4().hex + uuid.uuid4().hex[:8] for _ in range(10)] for repo in repos}
    order = [(repo, sha) for index in range(10) for repo in random.Random(0).sample(repos, 20)
             for sha in [pushes[repo][index]]]
    slowest, stop = [0.0], threading.Event()

    def watch_status() -> None:
        while not stop.is_set():
            began = time.monotonic()
            assert server.get("/status")[0] == 200 and server.get("/")[0] == 200
            slowest[0] = max(slowest[0], time.monotonic() - began)
            time.sleep(0.05)

    tracemalloc.start()
    watcher = threading.Thread(target=watch_status, daemon=True)
    watcher.start()
    try:
        began = time.monotonic()
        for start in range(0, len(order), 20):  # the Hub delivers each repo's pushes in order, repos in parallel
            results: list[int] = []
            threads = [threading.Thread(target=lambda r=repo, s=sha: results.append(server.post(payload(hub, r, s))[0]))
                       for repo, sha in order[start:start + 20]]
            for thread in threads:
                thread.start()
            for thread in threads:
                thread.join()
            assert results.count(202) == 20
        assert time.monotonic() - began < 10
        assert server.receiver.wait_idle(120)
        _, peak = tracemalloc.get_traced_memory()
    finally:
        stop.set()
        watcher.join(10)
        tracemalloc.stop()
        server.close()
    for repo in repos:
        assert ran[repo].count(pushes[repo][-1]) == 1, repo
        assert len(ran[repo]) == len(set(ran[repo])), repo  # no commit ran twice
    assert len(server.receiver.jobs()) == 50 and len(server.receiver.ignored) <= 50  # bounded history
    assert peak < 20 * 1024 * 1024, peak
    assert slowest[0] < 2.0, slowest[0]
