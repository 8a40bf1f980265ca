"""The receiver's hf-jobs executor: each export a Hugging Face Job, through huggingface_hub's real client against the
local Hub server's Jobs endpoints (each Job a local subprocess), publishing itself."""

from __future__ import annotations

import json
import time
import uuid

from hfexport.job.dispatch import JOB_COMMAND, SPEC_ENV, choose_flavor
from test_webhook import Receiver, config, payload, perturbed_weights
from test_webhook_durable import pr_source


def jobs_config(hub, tmp_path, **overrides):
    return config(hub, tmp_path, executor="hf-jobs", jobs_image="local/hfexport", jobs_poll_s=0.2, **overrides)


def test_each_export_is_a_job_that_publishes_itself_with_the_token_as_a_secret(hub, tiny_bert, tmp_path):
    repo = f"user/jobs-{uuid.uuid4().hex[:8]}"
    hub.seed_repo(repo, tiny_bert)
    hub.inject_fault("jobs_run", 503)  # the Hub refusing the first dispatch: retried
    server = Receiver(jobs_config(hub, tmp_path, retry_backoff_s=0.1))
    try:
        assert server.post(payload(hub, repo, hub.head(repo)))[0] == 202
        assert server.receiver.wait_idle(600)
        [job] = server.receiver.jobs()
        assert (job.state, job.action) == ("done", "opened"), job.detail
        assert job.hf_job and job.flavor.startswith("cpu-basic (")
        assert pr_source(hub, repo) == (1, hub.head(repo))
        [(job_id, spec)] = [item for item in hub.jobs.started if item[0] == job.hf_job]
        assert spec["command"] == JOB_COMMAND and spec["dockerImage"] == "local/hfexport"
        assert spec["flavor"] == "cpu-basic" and json.loads(spec["environment"][SPEC_ENV])["sha"] == hub.head(repo)
        assert hub.write_token not in json.dumps(spec)  # a secret, not in the Job's environment or command
        _, logs = server.get(f"/logs/{job.id}")
        _, status = server.get("/status")
        _, page = server.get("/")
        assert "hfexport-job-result" in logs and f"Job {job_id} logs" in page
        assert all(hub.write_token not in text for text in (logs, status, page))
    finally:
        hub.clear_faults()
        server.close()


def test_a_newer_push_cancels_the_running_job_and_only_the_newest_is_published(hub, tiny_bert, tmp_path):
    repo = f"user/jobs-cancel-{uuid.uuid4().hex[:8]}"
    hub.seed_repo(repo, tiny_bert)
    first = hub.head(repo)
    server = Receiver(jobs_config(hub, tmp_path, debounce_s=0))
    try:
        assert server.post(payload(hub, repo, first))[0] == 202
        deadline = time.monotonic() + 120
        while not server.receiver.jobs()[0].hf_job:
            assert time.monotonic() < deadline
            time.sleep(0.05)
        newer = hub.commit(repo, add={"model.safetensors": perturbed_weights(tiny_bert, 0.05)}, title="w")["oid"]
        assert server.post(payload(hub, repo, newer, first))[0] == 202
        assert server.receiver.wait_idle(600)
        jobs = {job.sha: job for job in server.receiver.jobs()}
        assert jobs[first].state == "superseded" and "canceled" in jobs[first].detail
        assert hub.jobs._jobs[jobs[first].hf_job]["canceled"]
        assert (jobs[newer].state, jobs[newer].action) == ("done", "opened"), jobs[newer].detail
        assert pr_source(hub, repo) == (1, newer)
    finally:
        server.close()


def test_the_flavor_is_the_cheapest_cpu_machine_that_holds_the_preflight_estimate(hub):
    from huggingface_hub import HfApi

    hardware = HfApi(token=hub.write_token).list_jobs_hardware()
    assert choose_flavor(None, hardware).name == "cpu-basic"
    assert choose_flavor(10 * 10**9, hardware).name == "cpu-basic"
    assert choose_flavor(20 * 10**9, hardware).name == "cpu-upgrade"
    assert choose_flavor(200 * 10**9, hardware).name == "cpu-upgrade"  # the largest; its preflight says why not


def test_the_jobs_executor_needs_an_image_and_an_unknown_executor_is_refused(tmp_path):
    import pytest
    from hfexport.errors import HfExportError
    from hfexport.surfaces.webhook import WebhookConfig

    with pytest.raises(HfExportError, match="HFEXPORT_JOBS_IMAGE"):
        WebhookConfig(secret="s", workdir=tmp_path, executor="hf-jobs")
    with pytest.raises(HfExportError, match="expected one of local, hf-jobs"):
        WebhookConfig(secret="s", workdir=tmp_path, executor="kubernetes")
