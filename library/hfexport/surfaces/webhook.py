"""Hub-native CI: a webhook receiver that re-exports a model and updates its hfexport PR when its main branch moves.

The Hub sends a webhook (JSON, with the shared secret in `X-Webhook-Secret`) for each change of a watched repo.
The receiver checks the secret in constant time (401 when missing, 403 when wrong), then acts only on content
pushes (`repo.content` updates) to the main branch of model repos: `refs/pr/*` updates (including those of its own
PR), other branches, discussions and its own commits are acknowledged and ignored, so publishing never loops.
huggingface_hub's `WebhookPayload` model loses `repo.headSha` (it reads `head_sha`), so the raw JSON is read:
the pushed commit is `updatedRefs[].newSha` of `refs/heads/<branch>`.

Bursts coalesce: a job waits `debounce_s` after its push, and a newer push to the same repo supersedes a job that
has not started (it runs after a running one); a job is taken from its repo's queue only when it can start, so
waiting never runs a stale commit. A job (`export_and_publish`, the one job function) runs the job API on the pushed
commit (a repo without a recipe is skipped), then publishes through `hfexport.publication.publish` (one PR per
model, updated in place; unchanged content is left alone), retrying transient Hub failures with backoff.
Executors: `local` runs each job in a child process (`python -m hfexport.surfaces.webhook --job`), one at a time (a
Space has few cores; a crash or a full disk ends the job, not the receiver); `hf-jobs` dispatches each as a Hugging
Face Job (`hfexport.job.dispatch`), side by side.

The Hub is the record: on `start()` and every `reconcile_s` the receiver compares each watched repo's branch head
with the source commit its open PR names (`hfexport.publication.record`) and queues the repos behind, so a push
before a restart, or a delivery that never came, is exported once. `receiver-state.json` in the workdir remembers the
watched repos and the commits handled. `GET /status` (JSON), `GET /` (HTML) and `GET /logs/<job>` show the jobs.

Run it: `python action/webhook_app.py` (a Space: see docs/ci.md), or `make_server(WebhookReceiver(config))`.
"""

from __future__ import annotations

import contextlib
import datetime as _dt
import hmac
import html
import itertools
import json
import os
import re
import shutil
import signal
import subprocess
import sys
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
    PublishError,
    PublishRefusedError,
    RecipeNotFoundError,
    first_line,
    redact,
    register_secret,
)
from hfexport.files import human_bytes, write_json_atomic
from hfexport.hub import hub_error, looks_like_repo_id
from hfexport.job.dispatch import RESULT_PREFIX, SPEC_ENV, TERMINAL, HfJobs, print_step
from hfexport.job.run import run_job
from hfexport.publication.publish import publish
from hfexport.publication.record import publication_record
from hfexport.strict_json import loads as loads_strict

SECRET_HEADER = "X-Webhook-Secret"
MAX_BODY = 1 << 20
DISCARD_LIMIT = 16 << 20  # an oversized body read away before answering 413 (beyond it the connection is dropped)
STATE_FILE = "receiver-state.json"
JOBS_DIR = "jobs"
EXECUTORS = ("local", "hf-jobs")


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
    reconcile_s: float = 600.0  # how often the Hub is compared with what was exported (0: only on start)
    retries: int = 3  # further attempts of a publication the Hub failed transiently (5xx, 429, dropped connection)
    retry_backoff_s: float = 5.0  # the first wait between attempts; doubled each time
    executor: str = "local"  # local: a child process here, one at a time; hf-jobs: one Hugging Face Job per export
    jobs_image: str | None = None  # hf-jobs: a Docker image (or Space URL) with hfexport installed
    jobs_namespace: str | None = None  # hf-jobs: whose Jobs (default: the token's user)
    jobs_timeout: str | None = "2h"  # hf-jobs: the Hub stops a Job that runs longer
    jobs_poll_s: float = 5.0  # hf-jobs: how often inspect_job is asked

    def __post_init__(self):
        if not self.secret:
            raise HfExportError("a webhook secret is required: the receiver would run jobs for anyone")
        if self.publish not in ("pr", "commit"):
            raise HfExportError(f"publish: expected pr or commit, got {self.publish!r}")
        if self.executor not in EXECUTORS:
            raise HfExportError(f"executor: expected one of {', '.join(EXECUTORS)}, got {self.executor!r}")
        if self.executor == "hf-jobs" and not self.jobs_image:
            raise HfExportError("executor hf-jobs needs jobs_image (HFEXPORT_JOBS_IMAGE): a Docker image or Space "
                                "with hfexport installed, where each Job runs `python -m hfexport.surfaces.webhook --job`")
        if self.reconcile_s < 0 or self.retries < 0 or self.retry_backoff_s < 0:
            raise HfExportError("reconcile_s, retries and retry_backoff_s must not be negative")
        self.workdir = Path(self.workdir)
        register_secret(self.token)
        register_secret(self.secret)

    @property
    def state_file(self) -> Path:
        return self.workdir / STATE_FILE


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
    via: str = "webhook"  # webhook | reconcile (found behind the Hub's branch head)
    attempts: int = 0
    hf_job: str | None = None  # hf-jobs: the Job's id
    flavor: str | None = None  # hf-jobs: the hardware chosen, and why
    received: float = field(default=0.0, repr=False)
    transient: bool = field(default=False, repr=False)  # failed for a reason worth trying again later

    def to_dict(self) -> dict:
        data = asdict(self)
        data.pop("received")
        data.pop("transient")
        return data


@dataclass
class Decision:
    """How one delivery was answered."""

    status: int
    body: dict


def _now() -> str:
    return _dt.datetime.now(_dt.UTC).isoformat(timespec="seconds")


class ReceiverState:
    """What the receiver remembers across restarts, in one small JSON file in its workdir (replaced atomically):
    the repos that sent webhooks (watched when no list is configured), per repo the last commit whose job ended
    for good (done, skipped, or failed for a reason a retry would not change), and its own recent commits.

    It is only a cache of the Hub's record: with the file lost, reconciliation still finds every repo behind its
    publication (among the configured repos), and an extra job on an unchanged model is a cache hit."""

    OWN_KEPT = 20

    def __init__(self, path: Path):
        self.path = Path(path)
        self._lock = threading.Lock()
        self.repos: dict[str, dict] = {}
        self.problem: str | None = None
        try:
            data = json.loads(self.path.read_text(encoding="utf-8"))
            repos = data.get("repos") if isinstance(data, dict) else None
            if not isinstance(repos, dict):
                raise ValueError("no repos object")
            self.repos = {name: value for name, value in repos.items() if isinstance(name, str) and isinstance(
                value, dict)}
        except FileNotFoundError:
            pass
        except (OSError, ValueError) as error:  # unreadable: start empty, reconcile from the Hub, say so
            self.problem = f"{self.path} could not be read ({first_line(error)}); starting from the Hub's record"

    def watched(self) -> list[str]:
        with self._lock:
            return sorted(self.repos)

    def handled(self, repo: str) -> str | None:
        with self._lock:
            return (self.repos.get(repo) or {}).get("handled")

    def own(self, sha: str) -> bool:
        with self._lock:
            return any(sha in (entry.get("own") or []) for entry in self.repos.values())

    def remember(self, repo: str) -> None:
        with self._lock:
            if repo in self.repos:
                return
            self.repos[repo] = {}
            self._save()

    def finished(self, repo: str, sha: str, own_commit: str | None = None) -> None:
        with self._lock:
            entry = self.repos.setdefault(repo, {})
            entry["handled"], entry["at"] = sha, _now()
            if own_commit:
                entry["own"] = ([*(entry.get("own") or []), own_commit])[-self.OWN_KEPT:]
            self._save()

    def _save(self) -> None:
        try:
            write_json_atomic(self.path, json.dumps({"version": 1, "repos": self.repos}, indent=1, sort_keys=True))
        except OSError as error:  # a full disk must not stop the receiver: the Hub stays the record
            self.problem = f"{self.path} could not be written ({first_line(error)})"
        else:
            self.problem = None


def classify(payload: Any, branch: str = "main") -> tuple[str | None, str | None, str]:
    """(repo, sha, "") for a push to `branch` of a model repo, else (None, None, why it is ignored)."""
    if not isinstance(payload, dict):
        return None, None, "not a webhook payload"
    event = payload.get("event") or {}
    repo = payload.get("repo") or {}
    if not isinstance(event, dict) or not isinstance(repo, dict):
        return None, None, "not a webhook payload"
    scope, action = event.get("scope"), event.get("action")
    if scope != "repo.content" or action != "update":
        return None, None, f"event {scope}/{action} is not a content push"
    if repo.get("type") != "model":
        return None, None, f"{repo.get('type')} repos are not exported"
    name = repo.get("name")
    if not isinstance(name, str) or not looks_like_repo_id(name):
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
            if not isinstance(sha, str) or not _SHA.fullmatch(sha):
                return None, None, f"{wanted}: newSha is not a commit id"
            return name, sha, ""
    names = [str(ref.get("ref")) for ref in refs if isinstance(ref, dict)]
    if names and all(ref.startswith("refs/pr/") for ref in names):
        return None, None, f"pull request update ({', '.join(names)})"
    return None, None, f"not the {branch} branch ({', '.join(names)})"


_SHA = re.compile(r"[0-9a-f]{40}")


class _RepoState:
    def __init__(self):
        self.running: Job | None = None
        self.pending: Job | None = None
        self.worker: threading.Thread | None = None


class WebhookReceiver:
    """Checks deliveries, queues jobs per repo (coalescing bursts) and runs them in background threads; reconciles
    with the Hub on `start()` and every `reconcile_s`.

    `run` (tests and embedders) replaces what a job does: `run(job, output) -> None` filling the job's fields.
    """

    def __init__(self, config: WebhookConfig, run: Callable[[Job, Path], None] | None = None):
        self.config = config
        self._run = run or (self._run_on_hf_jobs if config.executor == "hf-jobs" else self._run_in_process)
        self._hf_jobs: HfJobs | None = None
        self._children: set[subprocess.Popen] = set()
        self._lock = threading.Lock()
        self._run_lock = threading.Lock()
        self._repos: dict[str, _RepoState] = {}
        self._jobs: deque[Job] = deque(maxlen=config.history)
        self._ids = itertools.count(1)
        self.ignored: deque[dict] = deque(maxlen=config.history)
        self.state = ReceiverState(config.state_file)
        self.reconciled: dict = {}
        self._stop = threading.Event()
        self._reconciler: threading.Thread | None = None
        self._reconciling = threading.Event()

    # ── life cycle ──

    def start(self) -> WebhookReceiver:
        """Clear what a killed run left half-written, then reconcile now and every `reconcile_s` in the background."""
        shutil.rmtree(self.config.workdir / JOBS_DIR, ignore_errors=True)
        self._stop.clear()
        self._reconciling.set()  # until the first pass has queued what it found (wait_idle waits for it)
        self._reconciler = threading.Thread(target=self._reconcile_loop, name="hfexport:reconcile", daemon=True)
        self._reconciler.start()
        return self

    def stop(self) -> None:
        """Stop reconciling and end running exports (their commits are all or nothing: nothing half-made stays)."""
        self._stop.set()
        with self._lock:
            children = list(self._children)
        for child in children:
            child.kill()

    def _reconcile_loop(self) -> None:
        while not self._stop.is_set():
            self._reconciling.set()
            try:
                self.reconcile()
            finally:
                self._reconciling.clear()
            if self.config.reconcile_s <= 0 or self._stop.wait(self.config.reconcile_s):
                return

    def reconcile(self) -> list[Job]:
        """Compare each watched repo's branch head with what its publication was built from; queue those behind.

        Watched: the configured `repos`, else every repo that has sent a webhook (the state file). A repo is behind
        when its head is neither the commit its open hfexport PR names nor one whose job ended for good here."""
        watched = list(self.config.repos) if self.config.repos is not None else self.state.watched()
        queued, errors, current = [], {}, 0
        for repo in watched:
            if self._has(repo):
                continue  # a job is queued or running: it will end at the head, or a webhook will follow
            try:
                record = publication_record(repo, self.config.branch, self.config.token,
                                            with_pr=self.config.publish == "pr")
            except HfExportError as error:
                errors[repo] = first_line(error)
                continue
            head = record.head
            if head is None or head == self.state.handled(repo) or self.state.own(head):
                current += 1
                continue
            if not record.behind:
                self.state.finished(repo, head)  # published from this head (before a restart): remember it
                current += 1
                continue
            queued.append(self._enqueue(repo, head, via="reconcile"))
        self.reconciled = {"at": _now(), "watched": len(watched), "current": current,
                           "queued": [job.id for job in queued], "errors": errors}
        return queued

    # ── deliveries ──

    def handle(self, headers: Mapping[str, str], body: bytes) -> Decision:
        """Answer one delivery: 401/403 on the secret, 400 on bad JSON, 202 queued, 200 ignored."""
        given = next((value for key, value in headers.items() if key.lower() == SECRET_HEADER.lower()), None)
        if given is None:
            return Decision(401, {"error": f"missing {SECRET_HEADER} header"})
        if not hmac.compare_digest(given.encode("utf-8"), self.config.secret.encode("utf-8")):
            return Decision(403, {"error": f"wrong {SECRET_HEADER}"})
        if len(body) > MAX_BODY:
            return Decision(413, {"error": f"payload larger than {MAX_BODY} bytes"})
        try:
            payload = loads_strict(body.decode("utf-8"))
        except (UnicodeDecodeError, ValueError, RecursionError):
            return Decision(400, {"error": "the body is not JSON"})
        repo, sha, reason = classify(payload, self.config.branch)
        if repo and self.config.repos is not None and repo not in self.config.repos:
            repo, reason = None, f"{repo} is not in the receiver's list of repos"
        if repo and self.state.own(sha):
            repo, reason = None, f"{sha[:12]} is hfexport's own commit"
        if repo and (self._has(repo, sha) or self.state.handled(repo) == sha):
            repo, reason = None, f"{sha[:12]} of {repo} is already queued or exported (a repeated delivery)"
        if not repo:
            self.ignored.appendleft({"at": _now(), "reason": reason[:300]})
            return Decision(200, {"ignored": reason})
        self.state.remember(repo)
        job = self._enqueue(repo, sha)
        return Decision(202, {"queued": job.id, "repo": repo, "sha": sha})

    def _has(self, repo: str, sha: str | None = None) -> bool:
        """Whether `repo` has a queued or running job (for `sha`, when given)."""
        with self._lock:
            state = self._repos.get(repo)
            jobs = [job for job in (state.pending, state.running) if job is not None] if state else []
            return any(sha is None or job.sha == sha for job in jobs)

    def _enqueue(self, repo: str, sha: str, via: str = "webhook") -> Job:
        job = Job(next(self._ids), repo, sha, received_at=_now(), received=time.monotonic(), via=via)
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
            # Locally one job at a time: a Space has few cores and little memory. On Hugging Face Jobs each export
            # has its own machine, so repos run side by side. The queued job is taken only once it may run, so
            # pushes that arrive meanwhile still supersede it.
            with self._run_lock if self.config.executor == "local" else contextlib.nullcontext():
                with self._lock:
                    job = state.pending
                    if job is None or job.received + self.config.debounce_s > time.monotonic():
                        continue  # superseded by a push whose debounce has not elapsed yet
                    state.pending, state.running = None, job
                    job.state, job.started_at = "running", _now()
                self._run_job(job, state, repo)

    def _run_job(self, job: Job, state: _RepoState, repo: str) -> None:
        output = self.config.workdir / JOBS_DIR / repo.replace("/", "--") / f"{job.id}-{job.sha[:12]}"
        try:
            self._run(job, output)
            if job.state == "running":
                job.state = "done"
        except RecipeNotFoundError as error:
            job.state, job.detail = "skipped", str(error)
        except Exception as error:  # noqa: BLE001 - one job's failure is recorded; the receiver goes on
            job.state, job.detail = "failed", first_line(error)
            job.transient = job.transient or bool(getattr(error, "transient", False)) or isinstance(error, OSError)
        finally:
            job.finished_at = _now()
            if not job.transient:  # a Hub outage or a full disk is tried again on the next reconciliation
                self.state.finished(repo, job.sha, job.commit if job.action == "committed" else None)
            if not self.config.keep_outputs:
                shutil.rmtree(output, ignore_errors=True)
            with self._lock:
                state.running = None

    def _run_in_process(self, job: Job, output: Path) -> None:
        """The local executor: `export_and_publish` in a child process (`python -m hfexport.surfaces.webhook --job`),
        so that what kills an export (the OS's OOM killer; torch's archive writer aborting the process on a full
        disk) ends that job, not the receiver. The token goes through the environment, never the command line."""
        spec = {"repo": job.repo, "sha": job.sha, "output": str(output), **job_settings(self.config)}
        env = {**os.environ, "HF_TOKEN": self.config.token or os.environ.get("HF_TOKEN", "")}
        child = subprocess.Popen([sys.executable, "-m", "hfexport.surfaces.webhook", "--job"], stdin=subprocess.PIPE,
                                 stdout=subprocess.PIPE, stderr=subprocess.PIPE, env=env, text=True)
        with self._lock:
            self._children.add(child)
        try:
            out, err = child.communicate(json.dumps(spec))
        finally:
            with self._lock:
                self._children.discard(child)
        apply_result(job, out, err, child.returncode, output)

    def _run_on_hf_jobs(self, job: Job, output: Path) -> None:
        """The hf-jobs executor: dispatch the export as a Hugging Face Job (the flavor from the preflight's memory
        estimate), follow it through `inspect_job`, cancel it when a newer push to the repo is queued, and read its
        result from its logs. The Job publishes itself; its token is a Job secret."""
        def hub(call: Callable[[], Any], action: str) -> Any:
            try:
                return call()
            except Exception as error:  # noqa: BLE001 - one line, marked transient for a 5xx, 429 or lost connection
                raise hub_error(error, job.repo, action, error_class=PublishError) from None

        retries, backoff = self.config.retries, self.config.retry_backoff_s
        jobs = hub(self._jobs_client, "reaching Hugging Face Jobs")
        flavor = _retrying(job, lambda: hub(lambda: jobs.flavor(job.repo, job.sha, self.config.targets),
                                            "listing the Jobs hardware"), retries, backoff, self._stop.wait)
        job.flavor = flavor.describe()
        spec = {"repo": job.repo, "sha": job.sha, "output": "hfexport-job-output", **job_settings(self.config)}
        labels = {"hfexport-repo": job.repo.replace("/", "--"), "sha": job.sha[:12]}
        job.hf_job = _retrying(job, lambda: hub(lambda: jobs.run(spec, flavor.name, labels), "starting the Job"),
                               retries, backoff, self._stop.wait)
        state = self._repos[job.repo]
        while True:
            stage, message = _retrying(job, lambda: hub(lambda: jobs.stage(job.hf_job), "inspecting the Job"),
                                       retries, backoff, self._stop.wait)
            if stage in TERMINAL:
                break
            with self._lock:
                newer = state.pending
            if newer is not None or self._stop.is_set():
                jobs.cancel(job.hf_job)  # superseded: its commit is all or nothing, so nothing half-made stays
                job.state, job.superseded_by = "superseded", newer.id if newer else None
                job.detail = f"Job {job.hf_job} canceled: " + (f"superseded by {newer.sha[:12]}" if newer
                                                              else "the receiver stopped")
                job.transient = newer is None
                return
            self._stop.wait(self.config.jobs_poll_s)
        lines = jobs.logs(job.hf_job)
        code = 0 if stage == "COMPLETED" else 1
        apply_result(job, "\n".join(lines), "\n".join(lines), code)
        if code and job.detail and job.detail.startswith("the export process died"):
            job.detail = f"Job {job.hf_job} ended {stage}" + (f" ({message})" if message else "") + \
                job.detail.removeprefix("the export process died (exit code 1)")

    def _jobs_client(self) -> HfJobs:
        if self._hf_jobs is None:
            self._hf_jobs = HfJobs(self.config.token, self.config.jobs_namespace, self.config.jobs_image or "",
                                   self.config.jobs_timeout)
        return self._hf_jobs

    def logs(self, job_id: int) -> list[str] | None:
        """A job's Hugging Face Job logs (redacted), or None when it has no Job."""
        job = next((job for job in self.jobs() if job.id == job_id), None)
        if job is None or not job.hf_job:
            return None
        return self._jobs_client().logs(job.hf_job)

    # ── state ──


    def jobs(self) -> list[Job]:
        with self._lock:
            return list(self._jobs)

    def status(self) -> dict:
        """Recent jobs (newest first), the repos with work in progress, the last reconciliation and recently ignored
        deliveries."""
        with self._lock:
            busy = {repo: {"running": state.running.id if state.running else None,
                           "queued": state.pending.id if state.pending else None}
                    for repo, state in self._repos.items() if state.running or state.pending}
            return {"jobs": [job.to_dict() for job in self._jobs], "busy": busy, "ignored": list(self.ignored),
                    "branch": self.config.branch, "targets": self.config.targets or "all",
                    "executor": self.config.executor, "reconciled": self.reconciled,
                    "state_file": {"path": str(self.config.state_file), "repos": len(self.state.repos),
                                   "problem": self.state.problem}}

    def wait_idle(self, timeout: float = 600) -> bool:
        """Block until no job is queued or running (True), or `timeout` seconds pass (False)."""
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            with self._lock:
                if not self._reconciling.is_set() and all(state.worker is None for state in self._repos.values()):
                    return True
            time.sleep(0.05)
        return False


# ── one job: what the local executor's child process (and a Hugging Face Job) runs ──


def job_settings(config: WebhookConfig) -> dict:
    """The settings a job needs, without the token (it travels in the child's environment as HF_TOKEN)."""
    return {"targets": config.targets, "publish": config.publish, "branch": config.branch,
            "allow_failed": config.allow_failed, "retries": config.retries, "retry_backoff_s": config.retry_backoff_s}


def export_and_publish(job: Job, output: Path, settings: Mapping[str, Any], token: str | None,
                       wait: Callable[[float], Any] = time.sleep, progress: Callable[[Any], None] | None = None) -> None:
    """The job: the job API on the pushed commit, then one publication through the one-PR-per-model logic (retried
    after transient Hub failures). Fills `job`'s fields; a recipe-less repo raises `RecipeNotFoundError`."""
    targets = settings.get("targets")
    report = run_job(job.repo, output, targets=targets, all_targets=targets is None, revision=job.sha, token=token,
                     progress=progress)
    job.status, job.changed = report.status, report.changed
    # What passed is published; failed targets are left out (listed in the PR) unless allow_failed.
    try:
        result = _retrying(job, lambda: publish(output, job.repo, mode=settings.get("publish", "pr"), token=token,
                                                allow_failed=bool(settings.get("allow_failed")),
                                                revision=settings.get("branch", "main")),
                           int(settings.get("retries", 3)), float(settings.get("retry_backoff_s", 5.0)), wait)
    except PublishRefusedError as error:
        job.state, job.detail = "failed", str(error)[:500]
        return
    job.action, job.pr_url, job.commit = result.action, result.pr_url, result.commit
    if result.left_out:
        job.detail = ("not published: " + "; ".join(f"{name}: {why}" for name, why in result.left_out.items()))[:500]


def _retrying(job: Job, call: Callable[[], Any], retries: int, backoff_s: float, wait: Callable[[float], Any]) -> Any:
    """`call()`, tried again after a transient Hub failure (5xx, 429, a dropped or unanswered connection) up to
    `retries` times, waiting `backoff_s`, then twice as long each time. A commit is applied entirely or not at all,
    so a failed attempt left nothing behind. The last failure is raised, marked transient."""
    last = None
    for attempt in range(retries + 1):
        job.attempts = attempt + 1
        try:
            result = call()
        except HfExportError as error:
            if not getattr(error, "transient", False):
                raise
            if attempt == retries:
                job.transient = True
                raise type(error)(f"gave up after {attempt + 1} attempts: {error}") from None
            delay, last = backoff_s * 2 ** attempt, first_line(error, 200)
            job.detail = f"attempt {attempt + 1} failed ({last}); retrying in {delay:g} s"
            wait(delay)
        else:
            if last is not None:
                job.detail = f"succeeded on attempt {attempt + 1}, after: {last}"
            return result
    raise AssertionError("unreachable")


RESULT_FIELDS = ("state", "status", "changed", "action", "pr_url", "commit", "detail", "attempts", "transient")


def _job_main() -> int:
    """`python -m hfexport.surfaces.webhook --job`: one job from a JSON spec on stdin; its result as the last line
    of stdout (JSON). The token is HF_TOKEN. Exits when its parent (the receiver) dies, so no orphan publishes."""
    parent = os.getppid()

    def watch_parent() -> None:
        while os.getppid() == parent:
            time.sleep(0.5)
        os._exit(3)

    threading.Thread(target=watch_parent, daemon=True).start()
    spec = json.loads(os.environ.get(SPEC_ENV) or sys.stdin.read())  # a Hugging Face Job has no stdin
    token = os.environ.get("HF_TOKEN") or None
    register_secret(token)
    job = Job(0, spec["repo"], spec["sha"], state="running")
    try:
        export_and_publish(job, Path(spec["output"]), spec, token, progress=print_step)  # steps in the Job's logs
        if job.state == "running":
            job.state = "done"
    except RecipeNotFoundError as error:
        job.state, job.detail = "skipped", str(error)
    except Exception as error:  # noqa: BLE001 - one line for the receiver's status page
        job.state, job.detail = "failed", first_line(error)
        job.transient = job.transient or bool(getattr(error, "transient", False)) or isinstance(error, OSError)
    print(RESULT_PREFIX + json.dumps({name: getattr(job, name) for name in RESULT_FIELDS}), flush=True)
    return 0


def _free_bytes(path: Path) -> int | None:
    for folder in (path, *path.parents):
        if folder.exists():
            return shutil.disk_usage(folder).free
    return None


def apply_result(job: Job, stdout: str, stderr: str, returncode: int, output: Path | None = None) -> None:
    """Fill `job` from its child's last stdout line; a child that died says how (signal or exit code) in one line."""
    lines = [line[len(RESULT_PREFIX):] for line in (stdout or "").splitlines() if line.startswith(RESULT_PREFIX)]
    try:
        result = json.loads(lines[-1]) if lines and returncode == 0 else None
    except ValueError:
        result = None
    if isinstance(result, dict):
        for name in RESULT_FIELDS:
            if name in result:
                setattr(job, name, result[name])
        return
    how = f"signal {signal.Signals(-returncode).name}" if returncode < 0 else f"exit code {returncode}"
    said = [line.strip() for line in (stderr or "").splitlines() if line.strip() and not line.startswith("frame #")]
    said = [line for line in said if "what():" in line] or said
    # torch's archive writer throws from a destructor when a write comes up short (a full disk): the process
    # aborts with "unexpected pos", not ENOSPC; so the disk is measured before the job's folder is removed
    free = _free_bytes(output) if output is not None else None
    full = "No space left" in (stderr or "") or (free is not None and free < 1 << 20)
    job.state = "failed"
    job.detail = redact(f"the export process died ({how})"
                        + (f": No space left on device ({human_bytes(free)} free where it wrote {output})" if full
                           else "") + (f"; last message: {said[-1][:300]}" if said else ""))
    job.transient = full or returncode == -signal.SIGKILL  # a full disk or the OOM killer: worth another try




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
        if job.get("hf_job"):
            escaped[-1] += f' <a href="logs/{job["id"]}">Job {html.escape(job["hf_job"])} logs</a>'
            escaped[-1] += f" on {html.escape(job['flavor'])}" if job.get("flavor") else ""
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
            self._discard(length)
            return self._send(413, {"error": "payload too large"})
        decision = self.receiver.handle(dict(self.headers.items()), self.rfile.read(length))
        self._send(decision.status, decision.body)

    def _discard(self, length: int) -> None:
        """Read an oversized body away, up to a bound, so the sender gets the 413 rather than a broken pipe (it is
        still writing when a server that closes at once answers); past the bound the connection is just closed."""
        self.close_connection = True
        left = min(length, DISCARD_LIMIT)
        while left > 0:
            chunk = self.rfile.read(min(left, 1 << 16))
            if not chunk:
                break
            left -= len(chunk)

    def do_GET(self) -> None:  # noqa: N802
        path = self.path.split("?", 1)[0].rstrip("/")
        if path == "/status":
            return self._send(200, self.receiver.status())
        if path == "/health":
            return self._send(200, {"ok": True})
        if path.startswith("/logs/") and path[len("/logs/"):].isdigit():
            lines = self.receiver.logs(int(path[len("/logs/"):]))
            if lines is None:
                return self._send(404, {"error": "no Hugging Face Job for this job"})
            return self._send(200, "\n".join(lines) + "\n", "text/plain; charset=utf-8")
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


class _ReceiverServer(ThreadingHTTPServer):
    """The standard library's threading server with a listen backlog for bursts: its default of 5 pending
    connections is less than one push fanned out to 20 repos (tests/test_webhook_durable.py's burst), and a
    delivery beyond it can fail to connect."""

    request_queue_size = 128


def make_server(receiver: WebhookReceiver, host: str = "127.0.0.1", port: int = 0) -> ThreadingHTTPServer:
    """An HTTP server for `receiver` (POST / or /webhook; GET /, /status, /health); call `serve_forever()`."""
    server = _ReceiverServer((host, port), _Handler)
    server.daemon_threads = True
    server.receiver = receiver  # type: ignore[attr-defined]
    return server


if __name__ == "__main__" and sys.argv[1:] == ["--job"]:
    sys.exit(_job_main())
