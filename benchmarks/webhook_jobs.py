"""Issue 29 benchmark: the webhook receiver with its two executors, 20 repos pushed at once.

A local Hub server (hfexport.testing.hub) serves 20 repos and the Jobs API (each Job a local subprocess running the
real Job command, `python -m hfexport.surfaces.webhook --job`). One push per repo is delivered at once, then the
receiver is timed until idle, alternately with `executor: local` (each job a child process here, one after another)
and `executor: hf-jobs` (each job a Job, dispatched side by side), ROUNDS times each.

The 20 repos hold a config but no recipe, so every job is real end to end (a process starts, imports hfexport, reads
the Hub, finds no recipe, reports `skipped`) but exports nothing: on this 2-core machine 20 concurrent exports would
only share the same 2 cores (and 20 torch processes would not fit beside four other engineers' work), which says
nothing about 20 Hub machines. One real export (tiny-bert, `pt2`) through a Job is timed separately: with one machine
per Job, 20 such pushes take about that plus the dispatch overhead measured here.

Run: `.venv/bin/python benchmarks/webhook_jobs.py` -> benchmarks/results/webhook_jobs.json
"""

from __future__ import annotations

import json
import os
import statistics
import sys
import tempfile
import time
import uuid
from pathlib import Path

from _process import machine  # noqa: E402 - the benchmarks' harness

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent
REPOS = int(os.environ.get("REPOS", "20"))
ROUNDS = int(os.environ.get("ROUNDS", "2"))
sys.path.insert(0, str(ROOT / "library"))

from hfexport.testing.hub import LocalHub  # noqa: E402 - stdlib only; HF_ENDPOINT must be set before huggingface_hub

WORK = Path(tempfile.mkdtemp(prefix="bench-webhook-jobs-"))
HUB = LocalHub(WORK / "hub")
HUB.start()
os.environ.update(HUB.env(token=False, hf_home=WORK / "hf_home"))
os.environ.pop("HF_TOKEN", None)
os.environ["PYTHONPATH"] = str(ROOT / "library")

from hfexport.surfaces.webhook import WebhookConfig, WebhookReceiver  # noqa: E402


def push_payload(repo: str, sha: str) -> bytes:
    return json.dumps({"event": {"action": "update", "scope": "repo.content"},
                       "repo": {"type": "model", "name": repo, "headSha": sha},
                       "updatedRefs": [{"ref": "refs/heads/main", "oldSha": None, "newSha": sha}]}).encode()


def round_of(executor: str, repos: list[str], folder: Path) -> dict:
    config = WebhookConfig(secret="s", token=HUB.write_token, workdir=folder, targets=["pt2"], debounce_s=0,
                           executor=executor, jobs_image="local/hfexport", jobs_poll_s=0.25, reconcile_s=0)
    receiver = WebhookReceiver(config)
    before = {job_id for job_id, _ in HUB.jobs.started}
    load = os.getloadavg()[0]
    start = time.monotonic()
    for repo in repos:
        decision = receiver.handle({"X-Webhook-Secret": "s"}, push_payload(repo, HUB.head(repo)))
        assert decision.status == 202, decision
    assert receiver.wait_idle(1800)
    wall = time.monotonic() - start
    jobs = receiver.jobs()
    assert all(job.state == "skipped" for job in jobs), [(job.state, job.detail) for job in jobs]
    result = {"executor": executor, "wall_s": round(wall, 2), "load_avg_1m_before": round(load, 2),
              "load_avg_1m_after": round(os.getloadavg()[0], 2)}
    if executor == "hf-jobs":
        runs = [HUB.jobs._jobs[job_id] for job_id, _ in HUB.jobs.started if job_id not in before]
        durations = [run["ended"] - run["started"] for run in runs]
        dispatch = sorted(run["started"] - start for run in runs)
        result.update({"jobs": len(runs), "job_s_slowest": round(max(durations), 2),
                       "job_s_median": round(statistics.median(durations), 2), "job_s_sum": round(sum(durations), 2),
                       "last_job_created_after_s": round(dispatch[-1], 2),
                       "overhead_s": round(wall - max(durations), 2),
                       "overhead_per_job_s": round((wall - max(durations)) / len(runs), 3)})
    return result


def real_export_job(folder: Path) -> dict:
    repo = f"user/bench-export-{uuid.uuid4().hex[:6]}"
    HUB.seed_repo(repo, ROOT / "examples" / "tiny-bert")
    config = WebhookConfig(secret="s", token=HUB.write_token, workdir=folder, targets=["pt2"], debounce_s=0,
                           executor="hf-jobs", jobs_image="local/hfexport", jobs_poll_s=0.25, reconcile_s=0)
    receiver = WebhookReceiver(config)
    load = os.getloadavg()[0]
    start = time.monotonic()
    receiver.handle({"X-Webhook-Secret": "s"}, push_payload(repo, HUB.head(repo)))
    assert receiver.wait_idle(1800)
    wall = time.monotonic() - start
    [job] = receiver.jobs()
    assert (job.state, job.action) == ("done", "opened"), job.detail
    run = HUB.jobs._jobs[job.hf_job]
    return {"wall_s": round(wall, 2), "job_s": round(run["ended"] - run["started"], 2), "flavor": job.flavor,
            "load_avg_1m_before": round(load, 2), "load_avg_1m_after": round(os.getloadavg()[0], 2)}


def main() -> int:
    try:
        repos = []
        for index in range(REPOS):
            repo = f"user/bench-{index:02d}-{uuid.uuid4().hex[:6]}"
            HUB.seed_repo(repo, {"config.json": (ROOT / "examples" / "tiny-bert" / "config.json").read_bytes()})
            repos.append(repo)
        rounds = []
        for index in range(ROUNDS):  # alternated: local, hf-jobs, local, hf-jobs
            for executor in ("local", "hf-jobs"):
                rounds.append(round_of(executor, repos, WORK / f"{executor}-{index}"))
                print(json.dumps(rounds[-1]), flush=True)
        export = real_export_job(WORK / "export")
        print(json.dumps(export), flush=True)
        local = statistics.median(r["wall_s"] for r in rounds if r["executor"] == "local")
        jobs = [r for r in rounds if r["executor"] == "hf-jobs"]
        result = {
            "what": f"{REPOS} repos pushed at once, receiver until idle; jobs are real but find no recipe (skipped)",
            "machine": machine(), "repos": REPOS, "rounds": rounds,
            "local_wall_s_median": local,
            "hf_jobs_wall_s_median": statistics.median(r["wall_s"] for r in jobs),
            "hf_jobs_over_local": round(statistics.median(r["wall_s"] for r in jobs) / local, 3),
            "overhead_per_job_s_median": statistics.median(r["overhead_per_job_s"] for r in jobs),
            "one_real_export_job": export,
        }
        (HERE / "results").mkdir(exist_ok=True)
        (HERE / "results" / "webhook_jobs.json").write_text(json.dumps(result, indent=2) + "\n")
        print(json.dumps({k: v for k, v in result.items() if k != "rounds"}, indent=2))
    finally:
        HUB.stop()
    return 0


if __name__ == "__main__":
    sys.exit(main())
