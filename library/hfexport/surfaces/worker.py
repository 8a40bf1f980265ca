"""Jobs in a child process: `JobWorker` keeps one `python -m hfexport.surfaces.worker` alive and runs jobs in it.

Why a process and not a thread: tracing and the ONNX optimizer are Python-heavy and hold the GIL, so a job in a
thread of a web server slows every request of that server; an engine crash (or a model that eats all memory)
would take the server down with it. The child imports the engine once and then serves one job at a time.

Protocol, one JSON object per line: the parent writes a request on the child's stdin (the token travels there,
never in argv or the environment); the child answers on its original stdout (the engine's own prints are sent to
stderr) with `{"type": "step", ...}` events, then `{"type": "done", "report": {...}}` (the report's validated JSON)
or `{"type": "failed", "failure": {...}}` (`space_logic.Failure`: category, one redacted line, command).
A child that exits mid-job, a job past its time limit, or a job its caller cancelled (the child is killed) ends as
a failure (`crashed`, or `cancelled`); the next job starts a fresh child.
"""

from __future__ import annotations

import atexit
import contextlib
import json
import os
import queue
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from dataclasses import asdict
from pathlib import Path

from hfexport.hub import drop_cached_downloads
from hfexport.job.run import run_job
from hfexport.progress import Heartbeat, Step
from hfexport.surfaces.failure import describe_failure

READY = "ready"
FINAL = ("done", "failed", "crashed", "cancelled")
HEARTBEAT_S = 5.0  # how often a running step is re-sent to the page
CANCEL_POLL_S = 0.25  # how often a waiting `run` looks at its cancel event


ENV_PREFIX = "HFEXPORT_"


class JobWorker:
    """A persistent child process that runs jobs sent to it, one at a time, streaming their events."""

    def __init__(self, env: dict[str, str | None] | None = None, warm: bool = True):
        self.env = env  # overrides of the child's environment; None removes a variable
        self.warm = warm
        self._process: subprocess.Popen | None = None
        self._lock = threading.Lock()
        atexit.register(self.close)

    def start(self) -> None:
        """Start the child now (it imports the engine while the page loads), if it is not running."""
        with self._lock:
            self._ensure()

    def _ensure(self) -> subprocess.Popen:
        if self._process is not None and self._process.poll() is None:
            return self._process
        env = {**os.environ, **(self.env or {})}
        env = {key: value for key, value in env.items() if value is not None}
        env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(Path(__file__).resolve().parents[1]),
                                                          env.get("PYTHONPATH")]))
        args = [sys.executable, "-m", "hfexport.surfaces.worker"] + (["--warm"] if self.warm else [])
        process = subprocess.Popen(args, stdin=subprocess.PIPE, stdout=subprocess.PIPE, env=env, text=True, bufsize=1)
        # A reader thread turns the child's lines into a queue: waiting on the queue (with a time limit) cannot miss
        # lines already read into a buffer, as select() on a buffered pipe can.
        process.lines = queue.Queue()  # type: ignore[attr-defined]
        threading.Thread(target=_read_lines, args=(process.stdout, process.lines), daemon=True,  # type: ignore[attr-defined]
                         name=f"hfexport-worker-{process.pid}").start()
        self._process = process
        return process

    def run(self, request: dict, timeout_s: float | None = None,
            cancel: threading.Event | None = None) -> Iterator[dict]:
        """Send `request` (run_job's arguments as JSON, plus `command`, `env` and `keep_downloads`) and yield the
        child's events until the last one (`done`, `failed`, `crashed` when the child died or timed out, or
        `cancelled` once `cancel` is set: the child is killed then, and the next job starts a fresh one)."""
        with self._lock:
            process = self._ensure()
            deadline = None if timeout_s is None else time.monotonic() + timeout_s
            try:
                process.stdin.write(json.dumps(request) + "\n")
                process.stdin.flush()
            except (BrokenPipeError, OSError):
                yield self._crashed("the export process could not be reached")
                return
            answered = False
            try:
                for event in self._events(process, deadline, timeout_s, cancel):
                    answered = event.get("type") in FINAL
                    yield event
            finally:
                if not answered:  # the caller stopped listening mid-job: its events must not reach the next job
                    self._kill()

    def _events(self, process: subprocess.Popen, deadline: float | None, timeout_s: float | None,
                cancel: threading.Event | None = None) -> Iterator[dict]:
        while True:
            if cancel is not None and cancel.is_set():
                self._kill()
                yield {"type": "cancelled"}
                return
            remaining = None if deadline is None else max(deadline - time.monotonic(), 0)
            wait = remaining if cancel is None else min(CANCEL_POLL_S, CANCEL_POLL_S if remaining is None else remaining)
            try:
                line = process.lines.get(timeout=wait)  # type: ignore[attr-defined]
            except queue.Empty:
                if deadline is not None and time.monotonic() >= deadline:
                    self._kill()
                    yield self._crashed(f"the job ran past its {timeout_s:.0f} s limit and was stopped")
                    return
                continue
            if not line:
                code = process.wait()
                self._process = None
                yield self._crashed(f"the export process exited (code {code}) before the job finished")
                return
            try:
                event = json.loads(line)
            except ValueError:
                continue  # not a protocol line (cannot happen: the child's stdout is reserved)
            if event.get("type") == READY:
                continue
            yield event
            if event.get("type") in FINAL:
                return

    @staticmethod
    def _crashed(message: str) -> dict:
        return {"type": "crashed", "message": message}

    def _kill(self) -> None:
        if self._process is not None:
            self._process.kill()
            self._process.wait()
            self._process = None

    def close(self) -> None:
        """Stop the child (its current job, if any, is abandoned)."""
        process, self._process = self._process, None
        if process is None or process.poll() is not None:
            return
        with contextlib.suppress(OSError):
            process.stdin.close()  # the child's loop ends at the end of its input
        try:
            process.wait(timeout=1)
        except subprocess.TimeoutExpired:
            process.terminate()  # still importing the engine, or in a job
            try:
                process.wait(timeout=2)
            except subprocess.TimeoutExpired:
                process.kill()
                process.wait()


def _read_lines(stream, lines: queue.Queue) -> None:
    """Every line of the child's protocol stream into `lines`; "" at the end (the child exited)."""
    try:
        for line in stream:
            lines.put(line)
    except (OSError, ValueError):
        pass
    lines.put("")


# ── the child ────────────────────────────────────────────────────────────────


def _serve(protocol) -> None:

    def send(event: dict) -> None:
        protocol.write(json.dumps(event, default=str) + "\n")
        protocol.flush()

    send({"type": READY, "pid": os.getpid()})
    for line in sys.stdin:
        if not line.strip():
            continue
        request = json.loads(line)
        model = request.pop("model")
        command = request.pop("command", None)
        keep_downloads = request.pop("keep_downloads", False)
        with _environment(request.pop("env", None) or {}):
            def progress(step: Step) -> None:
                send({"type": "step", "step": asdict(step)})

            try:
                # the heartbeat re-sends a long step every few seconds: the page shows it running, and for how long
                with Heartbeat(progress, every=HEARTBEAT_S) as beat:
                    report = run_job(model, request.pop("output"), progress=beat, **request)
                send({"type": "done", "report": report.to_dict()})
            except Exception as error:  # noqa: BLE001 - every failure goes back as a category + one line
                send({"type": "failed", "failure": describe_failure(error, command).to_dict()})
            finally:
                if not keep_downloads:
                    with contextlib.suppress(Exception):
                        drop_cached_downloads(model)


@contextlib.contextmanager
def _environment(settings: dict[str, str]):
    """The parent's `HFEXPORT_*` settings for one job (e.g. the preflight limits), restored afterwards."""
    saved = {key: value for key, value in os.environ.items() if key.startswith(ENV_PREFIX)}
    for key in saved:
        del os.environ[key]
    os.environ.update({key: value for key, value in settings.items() if key.startswith(ENV_PREFIX)})
    try:
        yield
    finally:
        for key in [key for key in os.environ if key.startswith(ENV_PREFIX)]:
            del os.environ[key]
        os.environ.update(saved)


def settings_from(environ: dict[str, str] | None = None) -> dict[str, str]:
    """The `HFEXPORT_*` variables a job request carries to the child."""
    return {key: value for key, value in (os.environ if environ is None else environ).items()
            if key.startswith(ENV_PREFIX)}


def main(argv: list[str] | None = None) -> None:
    argv = sys.argv[1:] if argv is None else argv
    protocol = os.fdopen(os.dup(sys.stdout.fileno()), "w", buffering=1)
    os.dup2(sys.stderr.fileno(), sys.stdout.fileno())  # engine prints and progress bars go to stderr
    if "--warm" in argv:  # import the engine before the first job, not during it
        import transformers.exporters  # noqa: F401

    _serve(protocol)


if __name__ == "__main__":
    main()
