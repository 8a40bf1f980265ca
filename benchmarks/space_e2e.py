"""The Space end to end in headless Chromium: click Convert to PR link on the tiny example, and queue responsiveness.

1. Reference, same process: the Python API does the same work directly (`run_job` of tiny-bert's `onnx` target with
   verification, then `publish` as a PR) on a local Hub.
2. The Space (launched in this process, driven by Playwright + Debian's Chromium), signed in with the mocked login:
   click **Convert** -> report shown -> click **Open PR** -> PR link shown. Wall time split into the job (the
   report's `total_s`), publishing (time inside `space_logic.publish_job`) and the rest (the UI: queue, streaming
   updates, zip, rendering, browser). Ratio to the reference.
   The same job through the Space's job process with no page open separates the process hop from the cost of
   the browser rendering the live page on the same cores.
3. While a conversion runs, a second browser session opens the page, clicks Convert, and waits for its queue
   position; target: visible within 2 s of the click.

A warm-up job runs first in this process and in the Space's job process, so that one-time costs (imports, the
engine's first export) are not charged to either side.
Run: `.venv/bin/python benchmarks/space_e2e.py` -> benchmarks/results/space_e2e.json
"""

from __future__ import annotations

import json
import os
import re
import sys
import tempfile
import time
import uuid
import zipfile
from pathlib import Path

from _process import machine  # noqa: E402 - the benchmarks' harness

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent
sys.path.insert(0, str(ROOT / "library"))

from hfexport.testing.hub import LocalHub  # noqa: E402 - stdlib only; starts before huggingface_hub is imported

WORK = Path(tempfile.mkdtemp(prefix="space-bench-"))
HUB = LocalHub(WORK / "hub")
HUB.start()
os.environ.update(HUB.env(token=False, hf_home=WORK / "hf_home"))
os.environ.pop("HF_TOKEN", None)
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")

EXAMPLE = ROOT / "examples" / "tiny-bert"
TARGET = "onnx"
TIMEOUT_MS = 600_000


def seed(name: str) -> str:
    repo = f"user/{name}-{uuid.uuid4().hex[:6]}"
    HUB.seed_repo(repo, EXAMPLE)
    return repo


def reference() -> dict:
    """The same job and publication through the Python API, no UI."""
    from hfexport.job.run import run_job
    from hfexport.publication.publish import publish

    repo = seed("bench-api")
    start = time.perf_counter()
    report = run_job(repo, WORK / "api-out", targets=[TARGET], token=HUB.write_token, verify=True)
    job_s = time.perf_counter() - start
    start = time.perf_counter()
    result = publish(WORK / "api-out", repo, mode="pr", token=HUB.write_token, targets=[TARGET])
    publish_s = time.perf_counter() - start
    assert report.status == "ok" and result.action == "opened", (report.status, result)
    return {"job_s": round(job_s, 2), "report_total_s": report.timings["total_s"], "publish_s": round(publish_s, 2),
            "total_s": round(job_s + publish_s, 2)}


def main() -> None:
    from hfexport.job.run import run_job
    from hfexport.surfaces import space as space_logic
    from hfexport.testing.space import browser_missing, launch_chromium, running_space
    from playwright.sync_api import sync_playwright

    missing = browser_missing()
    if missing:
        raise SystemExit(missing)

    warm = seed("bench-warm")
    run_job(warm, WORK / "warm-out", targets=[TARGET], token=HUB.write_token, verify=True)
    api = reference()

    publish_times: list[float] = []
    original_publish = space_logic.publish_job

    def timed_publish(*args, **kwargs):
        start = time.perf_counter()
        try:
            return original_publish(*args, **kwargs)
        finally:
            publish_times.append(time.perf_counter() - start)

    space_logic.publish_job = timed_publish
    settings = space_logic.SpaceSettings(workdir=WORK / "space-work")
    results: dict = {"reference_api": api}
    with running_space(settings, login_token=HUB.read_token) as space, sync_playwright() as playwright:
        browser = launch_chromium(playwright)
        # The Space's jobs run in its worker process: warm that one up too (first-export costs of the engine).
        warm_request = space_logic.JobRequest(seed("bench-warm-space"), WORK / "warm-space" / "out", [TARGET],
                                              token=HUB.write_token)
        warm_events = list(space.demo.hfexport_runner.run(warm_request))
        assert warm_events[-1].report is not None, warm_events[-1].failure
        # The same job in the Space's job process, no browser open: separates the process hop from UI contention.
        start = time.perf_counter()
        events = list(space.demo.hfexport_runner.run(space_logic.JobRequest(
            seed("bench-worker"), WORK / "worker-job" / "out", [TARGET], token=HUB.write_token)))
        assert events[-1].report is not None, events[-1].failure
        results["job_process_no_browser"] = {"wall_s": round(time.perf_counter() - start, 2),
                                             "report_total_s": events[-1].report.timings["total_s"]}

        def session():
            context = browser.new_context(viewport={"width": 1280, "height": 1000}, accept_downloads=True)
            context.set_default_timeout(60_000)
            page = context.new_page()
            start = time.perf_counter()
            page.goto(space.url)
            page.locator("#model input, #model textarea").first.wait_for()
            return page, time.perf_counter() - start

        def sign_in_and_load(page, repo: str) -> None:
            page.get_by_role("button", name="Sign in with Hugging Face").click()
            page.get_by_role("button", name=re.compile(r"Logout")).wait_for()
            page.locator("#model input, #model textarea").first.fill(repo)
            page.locator("#load").click()
            page.locator("#recipe-status", has_text="Valid recipe").wait_for()

        # 2. click Convert -> PR link
        repo = seed("bench-space")
        page, page_load_s = session()
        sign_in_and_load(page, repo)
        start = time.perf_counter()
        page.locator("#convert").click()
        page.locator("#progress", has_text="Finished in").wait_for(timeout=TIMEOUT_MS)
        converted = time.perf_counter()
        page.locator("#results", has_text="Parity").wait_for()
        page.locator("#open-pr").click()
        page.locator("#pr-result a").first.wait_for(timeout=TIMEOUT_MS)
        done = time.perf_counter()
        with page.expect_download() as download:
            page.locator("#download a").first.click()
        report = json.loads(zipfile.ZipFile(download.value.path()).read("export_report.json"))
        assert report["status"] == "ok" and "#1" in page.locator("#pr-result").inner_text()
        total = done - start
        job = report["timings"]["total_s"]
        publish = publish_times[-1]
        ui = total - job - publish
        results["space"] = {
            "click_to_pr_link_s": round(total, 2),
            "convert_click_to_report_s": round(converted - start, 2),
            "open_pr_click_to_link_s": round(done - converted, 2),
            "job_s": job,
            "publish_s": round(publish, 2),
            "ui_s": round(ui, 2),
            "share_job": round(job / total, 3),
            "share_publish": round(publish / total, 3),
            "share_ui": round(ui / total, 3),
            "first_page_load_s": round(page_load_s, 2),
            "ratio_to_reference_api": round(total / api["total_s"], 3),
            "job_ratio_to_reference_api_job": round(job / api["report_total_s"], 3),
        }

        # 3. a second session while a job runs
        repo2 = seed("bench-queue")
        page.locator("#model input, #model textarea").first.fill(repo2)
        page.locator("#load").click()
        page.locator("#recipe-status", has_text=repo2).wait_for()
        page.locator("#convert").click()
        page.locator("#progress", has_text="download and load the model").wait_for(timeout=TIMEOUT_MS)
        other, other_load_s = session()
        other.get_by_role("button", name="Sign in with Hugging Face").click()
        other.get_by_role("button", name=re.compile(r"Logout")).wait_for()
        other.locator("#model input, #model textarea").first.fill(f"user/missing-{uuid.uuid4().hex[:6]}")
        start = time.perf_counter()
        other.locator("#convert").click()
        other.get_by_text(re.compile(r"queue:\s*\d+\s*/\s*\d+")).first.wait_for(timeout=30_000)
        queue_visible_s = time.perf_counter() - start
        still_running = "Finished in" not in page.locator("#progress").inner_text()
        position = other.get_by_text(re.compile(r"queue:\s*\d+\s*/\s*\d+")).first.inner_text()
        page.locator("#progress", has_text="Finished in").wait_for(timeout=TIMEOUT_MS)
        other.locator("#results", has_text="Repository not found").wait_for(timeout=TIMEOUT_MS)
        results["responsiveness"] = {
            "page_load_during_job_s": round(other_load_s, 2),
            "convert_click_to_queue_position_s": round(queue_visible_s, 2),
            "queue_text": position.strip(),
            "job_still_running_when_measured": still_running,
            "target_s": 2.0,
            "meets_target": queue_visible_s <= 2.0 and still_running,
        }
        browser.close()

    results.update({
        "model": "examples/tiny-bert", "target": TARGET, "verify": True,
        "machine": machine(),
        "notes": "2 shared CPU cores: compare shares and ratios, not absolute seconds. ui_s = click-to-link wall minus "
                 "the job's own total_s and the time inside publish_job (queue, streamed updates, zip, rendering, "
                 "browser round trips). job_process_no_browser: the same job through the Space's job process with no "
                 "page open; the Space's job_s is higher when Chromium renders the live page on the same 2 cores.",
    })
    out = HERE / "results" / "space_e2e.json"
    out.parent.mkdir(exist_ok=True)
    out.write_text(json.dumps(results, indent=2) + "\n")
    print(json.dumps(results, indent=2))


if __name__ == "__main__":
    try:
        main()
    finally:
        HUB.stop()
