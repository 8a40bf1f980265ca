"""Hub-native CI: a webhook receiver that re-exports a model and updates its hfexport PR when its main branch moves.

The Hub sends a webhook (JSON, with the shared secret in `X-Webhook-Secret`) for each change of a watched repo.
The receiver checks the secret in constant time (401 when missing, 403 when wrong), then acts only on content
pushes (`repo.content` updates) to the main branch of model repos: `refs/pr/*` updates (including those of its own
PR), other branches, discussions and its own commits are acknowledged and ignored, so publishing never loops.
huggingface_hub's `WebhookPayload` model loses `repo.headSha` (it reads `head_sha`), so the raw JSON is read:
the pushed commit is `updatedRefs[].newSha` of `refs/heads/<branch>`.

Bursts coalesce: a job waits `debounce_s` after its push, and a newer push to the same repo supersedes a job that
has not started (it runs after a running one). Jobs run one at a time in the process (torch.export is not
thread-safe); a job is taken from its repo's queue only when it can start, so waiting never runs a stale commit. A job runs the job API on the
pushed commit (a repo without a recipe is skipped), then publishes through `hfexport.publication.publish` (one PR per model,
updated in place; unchanged content is left alone). `GET /status` (JSON) and `GET /` (HTML) list recent jobs.

Run it: `python action/webhook_app.py` (a Space: see docs/ci.md), or `make_server(WebhookReceiver(config))`.
"""

from __future__ import annotations

import datetime as _dt
import hmac
import html
import itertools
import json
import shutil
import threading
import time
from collections import deque
from collections.abc import Callable, Mapping
from dataclasses import asdict, dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

from hfexport.errors import (
    HfExportError,
    PublishRefusedError,
    RecipeNotFoundError,
    first_line,
    register_secret,
)
from hfexport.job.run import run_job
from hfexport.publication.publish import publish

SECRET_HEADER = "X-Webhook-Secret"
MAX_BODY = 1 << 20


@dataclass
class WebhookConfig:
    """What the receiver does: its secret, the token it publishes with, where jobs run, which targets."""

    secret: str
    token: str | None = None
    workdir: Path = Path("hfexport-webhook")
    targets: list[str] | None = None  # None: every target of the recipe
    branch: str = "main"
    publish: str = "pr"  # "pr" (one PR per model) or "commit" (straight to the branch)
    allow_failed: bool = False
    debounce_s: float = 5.0
    history: int = 50
    repos: list[str] | None = None  # only these repos (None: any repo that sends a webhook)
    keep_outputs: bool = False

    def __post_init__(self):
        if not self.secret:
            raise HfExportError("a webhook secret is required: the receiver would run jobs for anyone")
        if self.publish not in ("pr", "commit"):
            raise HfExportError(f"publish: expected pr or commit, got {self.publish!r}")
        self.workdir = Path(self.workdir)
        register_secret(self.token)
        register_secret(self.secret)


@dataclass
class Job:
    """One push to act on, and what became of it."""

    id: int
    repo: str
    sha: str
    state: str = "queued"  # queued | running | done | superseded | skipped | failed
    received_at: str = ""
    started_at: str | None = None
    finished_at: str | None = None
    status: str | None = None  # the job report's status
    changed: bool | None = None
    action: str | None = None  # publication: opened | updated | unchanged | committed
    pr_url: str | None = None
    commit: str | None = None
    detail: str | None = None
    superseded_by: int | None = None
    received: float = field(default=0.0, repr=False)

    def to_dict(self) -> dict:
        data = asdict(self)
        data.pop("received")
        return data


@dataclass
class Decision:
    """How one delivery was answered."""

    status: int
    body: dict


def _now() -> str:
    return _dt.datetime.now(_dt.UTC).isoformat(timespec="seconds")


def classify(payload: Any, branch: str = "main") -> tuple[str | None, str | None, str]:
    """(repo, sha, "") for a push to `branch` of a model repo, else (None, None, why it is ignored)."""
    if not isinstance(payload, dict):
        return None, None, "not a webhook payload"
    event = payload.get("event") or {}
    repo = payload.get("repo") or {}
    scope, action = event.get("scope"), event.get("action")
    if scope != "repo.content" or action != "update":
        return None, None, f"event {scope}/{action} is not a content push"
    if repo.get("type") != "model":
        return None, None, f"{repo.get('type')} repos are not exported"
    name = repo.get("name")
    if not isinstance(name, str) or "/" not in name:
        return None, None, "no repo name"
    refs = payload.get("updatedRefs")
    if not isinstance(refs, list) or not refs:
        return None, None, "no updated refs"
    wanted = f"refs/heads/{branch}"
    for ref in refs:
        if isinstance(ref, dict) and ref.get("ref") == wanted:
            sha = ref.get("newSha")
            if not sha:
                return None, None, f"{wanted} was deleted"
            return name, sha, ""
    names = [str(ref.get("ref")) for ref in refs if isinstance(ref, dict)]
    if names and all(ref.startswith("refs/pr/") for ref in names):
        return None, None, f"pull request update ({', '.join(names)})"
    return None, None, f"not the {branch} branch ({', '.join(names)})"


class _RepoState:
    def __init__(self):
        self.running: Job | None = None
        self.pending: Job | None = None
        self.worker: threading.Thread | None = None


class WebhookReceiver:
    """Checks deliveries, queues jobs per repo (coalescing bursts) and runs them in background threads.

    `run` (tests and embedders) replaces what a job does: `run(job, output) -> None` filling the job's fields.
    """

    def __init__(self, config: WebhookConfig, run: Callable[[Job, Path], None] | None = None):
        self.config = config
        self._run = run or self._export_and_publish
        self._lock = threading.Lock()
        self._run_lock = threading.Lock()
        self._repos: dict[str, _RepoState] = {}
        self._jobs: deque[Job] = deque(maxlen=config.history)
        self._ids = itertools.count(1)
        self._own_commits: set[str] = set()
        self.ignored: deque[dict] = deque(maxlen=config.history)

    # ── deliveries ──

    def handle(self, headers: Mapping[str, str], body: bytes) -> Decision:
        """Answer one delivery: 401/403 on the secret, 400 on bad JSON, 202 queued, 200 ignored."""
        given = next((value for key, value in headers.items() if key.lower() == SECRET_HEADER.lower()), None)
        if given is None:
            return Decision(401, {"error": f"missing {SECRET_HEADER} header"})
        if not hmac.compare_digest(given.encode("utf-8"), self.config.secret.encode("utf-8")):
            return Decision(403, {"error": f"wrong {SECRET_HEADER}"})
        try:
            payload = json.loads(body.decode("utf-8"))
        except (UnicodeDecodeError, ValueError):
            return Decision(400, {"error": "the body is not JSON"})
        repo, sha, reason = classify(payload, self.config.branch)
        if repo and self.config.repos is not None and repo not in self.config.repos:
            repo, reason = None, f"{repo} is not in the receiver's list of repos"
        if repo and sha in self._own_commits:
            repo, reason = None, f"{sha[:12]} is hfexport's own commit"
        if not repo:
            self.ignored.appendleft({"at": _now(), "reason": reason})
            return Decision(200, {"ignored": reason})
        job = self._enqueue(repo, sha)
        return Decision(202, {"queued": job.id, "repo": repo, "sha": sha})

    def _enqueue(self, repo: str, sha: str) -> Job:
        job = Job(next(self._ids), repo, sha, received_at=_now(), received=time.monotonic())
        with self._lock:
            state = self._repos.setdefault(repo, _RepoState())
            if state.pending is not None:
                state.pending.state, state.pending.superseded_by = "superseded", job.id
                state.pending.detail = f"superseded by {sha[:12]}"
                state.pending.finished_at = _now()
            state.pending = job
            self._jobs.appendleft(job)
            if state.worker is None:
                state.worker = threading.Thread(target=self._work, args=(repo, state), name=f"hfexport:{repo}",
                                                daemon=True)
                state.worker.start()
        return job

    def _wait(self, state: _RepoState) -> bool:
        """Sleep until the repo's queued job has waited out its debounce; False when nothing is queued."""
        while True:
            with self._lock:
                job = state.pending
                if job is None:
                    return False
                wait = job.received + self.config.debounce_s - time.monotonic()
            if wait <= 0:
                return True
            time.sleep(min(wait, 0.2))

    def _work(self, repo: str, state: _RepoState) -> None:
        while True:
            if not self._wait(state):
                with self._lock:
                    if state.pending is None:
                        state.worker = None
                        return
                continue
            # One job at a time in this process: torch.export is not thread-safe, and a Space has few cores.
            # The queued job is taken only once it may run, so pushes that arrive meanwhile still supersede it.
            with self._run_lock:
                with self._lock:
                    job = state.pending
                    if job is None or job.received + self.config.debounce_s > time.monotonic():
                        continue  # superseded by a push whose debounce has not elapsed yet
                    state.pending, state.running = None, job
                    job.state, job.started_at = "running", _now()
                self._run_job(job, state, repo)

    def _run_job(self, job: Job, state: _RepoState, repo: str) -> None:
        output = self.config.workdir / repo.replace("/", "--") / f"{job.id}-{job.sha[:12]}"
        try:
            self._run(job, output)
            if job.state == "running":
                job.state = "done"
        except RecipeNotFoundError as error:
            job.state, job.detail = "skipped", str(error)
        except Exception as error:  # noqa: BLE001 - one job's failure is recorded; the receiver goes on
            job.state, job.detail = "failed", first_line(error)
        finally:
            job.finished_at = _now()
            if job.commit:
                self._own_commits.add(job.commit)
            if not self.config.keep_outputs:
                shutil.rmtree(output, ignore_errors=True)
            with self._lock:
                state.running = None

    def _export_and_publish(self, job: Job, output: Path) -> None:
        """The job API on the pushed commit, then one publication through the one-PR-per-model logic."""
        config = self.config
        report = run_job(job.repo, output, targets=config.targets, all_targets=config.targets is None,
                         revision=job.sha, token=config.token)
        job.status, job.changed = report.status, report.changed
        # What passed is published; failed targets are left out (listed in the PR) unless allow_failed.
        try:
            result = publish(output, job.repo, mode=config.publish, token=config.token,
                             allow_failed=config.allow_failed, revision=config.branch)
        except PublishRefusedError as error:
            job.state, job.detail = "failed", str(error)[:500]
            return
        job.action, job.pr_url, job.commit = result.action, result.pr_url, result.commit
        if result.left_out:
            job.detail = ("not published: " + "; ".join(f"{name}: {why}" for name, why in result.left_out.items()))[:500]

    # ── state ──

    def jobs(self) -> list[Job]:
        with self._lock:
            return list(self._jobs)

    def status(self) -> dict:
        """Recent jobs (newest first), the repos with work in progress and recently ignored deliveries."""
        with self._lock:
            busy = {repo: {"running": state.running.id if state.running else None,
                           "queued": state.pending.id if state.pending else None}
                    for repo, state in self._repos.items() if state.running or state.pending}
            return {"jobs": [job.to_dict() for job in self._jobs], "busy": busy, "ignored": list(self.ignored),
                    "branch": self.config.branch, "targets": self.config.targets or "all"}

    def wait_idle(self, timeout: float = 600) -> bool:
        """Block until no job is queued or running (True), or `timeout` seconds pass (False)."""
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            with self._lock:
                if all(state.worker is None for state in self._repos.values()):
                    return True
            time.sleep(0.05)
        return False


# ── HTTP ─────────────────────────────────────────────────────────────────────


def status_html(status: dict) -> str:
    """The status page: recent jobs with their results, escaped."""
    rows = []
    for job in status["jobs"]:
        link = (f'<a href="{html.escape(job["pr_url"])}">{html.escape(job["action"] or "PR")}</a>'
                if job.get("pr_url") else html.escape(job.get("action") or ""))
        cells = [str(job["id"]), job["repo"], job["sha"][:12], job["state"], job.get("status") or "",
                 "" if job.get("changed") is None else str(job["changed"]).lower(), job["received_at"],
                 job.get("finished_at") or "", job.get("detail") or ""]
        escaped = [html.escape(cell) for cell in cells]
        rows.append("<tr>" + "".join(f"<td>{cell}</td>" for cell in escaped[:6]) + f"<td>{link}</td>"
                    + "".join(f"<td>{cell}</td>" for cell in escaped[6:]) + "</tr>")
    header = "".join(f"<th>{name}</th>" for name in ("job", "repo", "commit", "state", "report", "changed",
                                                       "publication", "received", "finished", "detail"))
    body = "\n".join(rows) or '<tr><td colspan="10">no jobs yet</td></tr>'
    return ("<!doctype html><html><head><meta charset=\"utf-8\"><title>hfexport webhook</title>"
            "<style>body{font-family:sans-serif;margin:2em}table{border-collapse:collapse}"
            "td,th{border:1px solid #ccc;padding:4px 8px;text-align:left}</style></head><body>"
            f"<h1>hfexport webhook</h1><p>Branch <code>{html.escape(status['branch'])}</code>; targets "
            f"<code>{html.escape(str(status['targets']))}</code>. JSON: <a href=\"status\">/status</a>.</p>"
            f"<table><thead><tr>{header}</tr></thead><tbody>{body}</tbody></table></body></html>")


class _Handler(BaseHTTPRequestHandler):
    server_version = "hfexport-webhook"

    @property
    def receiver(self) -> WebhookReceiver:
        return self.server.receiver  # type: ignore[attr-defined]

    def do_POST(self) -> None:  # noqa: N802 - http.server's naming
        if self.path.rstrip("/") not in ("", "/webhook"):
            return self._send(404, {"error": "not found"})
        length = int(self.headers.get("Content-Length") or 0)
        if length > MAX_BODY:
            return self._send(413, {"error": "payload too large"})
        decision = self.receiver.handle(dict(self.headers.items()), self.rfile.read(length))
        self._send(decision.status, decision.body)

    def do_GET(self) -> None:  # noqa: N802
        path = self.path.split("?", 1)[0].rstrip("/")
        if path == "/status":
            return self._send(200, self.receiver.status())
        if path == "/health":
            return self._send(200, {"ok": True})
        if path == "":
            return self._send(200, status_html(self.receiver.status()), "text/html; charset=utf-8")
        self._send(404, {"error": "not found"})

    def _send(self, status: int, body: Any, content_type: str = "application/json") -> None:
        data = (body if isinstance(body, str) else json.dumps(body, indent=2)).encode("utf-8")
        self.send_response(status)
        self.send_header("Content-Type", content_type)
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)

    def log_message(self, format: str, *args: Any) -> None:  # noqa: A002 - quiet; the status page is the log
        pass


def make_server(receiver: WebhookReceiver, host: str = "127.0.0.1", port: int = 0) -> ThreadingHTTPServer:
    """An HTTP server for `receiver` (POST / or /webhook; GET /, /status, /health); call `serve_forever()`."""
    server = ThreadingHTTPServer((host, port), _Handler)
    server.daemon_threads = True
    server.receiver = receiver  # type: ignore[attr-defined]
    return server
