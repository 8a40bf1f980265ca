"""A worker process of a job exporting in several processes (`hfexport.job.parallel`, which starts it as
`python -m hfexport.job.parallel_worker`): one request in on stdin, events out on the original stdout."""

from __future__ import annotations

import json
import logging
import os
import sys
import threading
import warnings
from dataclasses import asdict

from hfexport.gc_policy import one_shot_collection
from hfexport.job.pipeline import engine_error_message
from hfexport.job.run import export_in_worker, peak_rss_mb
from hfexport.logs import configure


def _apply_logging(settings: dict) -> None:
    """Be as quiet as the job's process (`parallel.logging_settings`)."""
    if settings.get("handler"):
        configure(settings.get("level") or None)
    if settings.get("disabled"):
        logging.disable(settings["disabled"])
        if settings["disabled"] >= logging.WARNING:
            warnings.filterwarnings("ignore")


def _exit_when_the_job_is_gone() -> None:
    """The job's process holds our stdin open until it has our results: end of input means it died (or stopped
    us), so stop now rather than go on exporting for nobody (a target being saved is left as a staging folder,
    `.<target>.partial-*`, never as a half-written target folder)."""
    for _ in sys.stdin:
        pass
    os._exit(3)


def main() -> int:
    """Read one request on stdin, export its targets, answer on the original stdout (`hfexport.job.parallel`)."""
    protocol = os.fdopen(os.dup(sys.stdout.fileno()), "w", buffering=1)
    os.dup2(sys.stderr.fileno(), sys.stdout.fileno())  # engine prints go to stderr, never into the protocol

    def send(event: dict) -> None:
        protocol.write(json.dumps(event, default=str) + "\n")
        protocol.flush()

    request = json.loads(sys.stdin.readline())
    threading.Thread(target=_exit_when_the_job_is_gone, daemon=True, name="hfexport-job-watch").start()
    _apply_logging(request.pop("logging", {}))
    try:
        with one_shot_collection(lambda step: send({"type": "step", "step": asdict(step)})) as on_step:
            export_in_worker(request, on_step,
                             lambda name, report: send({"type": "target", "name": name, "report": report}))
    except BaseException as error:  # noqa: BLE001 - Ctrl-C too: the job's process reports it
        send({"type": "failed", "error": engine_error_message(error)})
        return 1
    send({"type": "done", "peak_rss_mb": round(peak_rss_mb(), 1)})
    return 0


if __name__ == "__main__":
    sys.exit(main())
