"""Warm Python runtime clients: one interpreter start and one import of the runtime for many checks.

A Python client's start is mostly its imports (optimum's: torch, transformers and onnxruntime, about 7 CPU-seconds
of a check that then runs for well under one). Inside `with warm_clients():` each client script runs through a fork
server (`warm_server.py`, in the runtime's own interpreter) that has imported what the client imports: every check is
still its own process, started as `python CLIENT FOLDER REQUEST` would be (the same arguments, working folder,
environment, no stdin; its output and exit code read as `run_client` reads them; killed at its time limit), only
forked from a process that imported the runtime once. Outside the block, and wherever a server cannot start, each
check starts its interpreter as before (`run_client`). Servers are keyed by interpreter, client and environment, and
stopped when the outermost block ends.
"""

from __future__ import annotations

import contextlib
import json
import os
import select
import signal
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Iterator
from pathlib import Path

from hfexport.deployment import client_result
from hfexport.errors import RuntimeClientError

SERVER = Path(__file__).resolve().parent / "warm_server.py"
_servers: dict[tuple, _Server | None] | None = None
_lock = threading.Lock()


class _Server:
    """One fork server: a runtime's interpreter that imported one client's modules."""

    def __init__(self, python: str, client: Path, env: dict[str, str], timeout: float):
        self.lock = threading.Lock()
        self.buffer = b""
        self.cpu_s = 0.0  # the server's and its clients' CPU seconds, as of its last answer
        self.process = subprocess.Popen([python, str(SERVER), str(client)], stdin=subprocess.PIPE,
                                        stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, env=env, text=True)
        if self._line(timeout) != "ready":  # not started within the check's own time limit: run it cold
            self.process.kill()
            self.process.wait()
            raise OSError("the runtime's fork server did not start")

    def _line(self, timeout: float | None) -> str | None:
        """The server's next stdout line: None at `timeout`, "" when the server ended."""
        deadline = None if timeout is None else time.monotonic() + timeout
        fd = self.process.stdout.fileno()
        while b"\n" not in self.buffer:
            left = None if deadline is None else max(0.0, deadline - time.monotonic())
            if not select.select([fd], [], [], left)[0]:
                return None
            chunk = os.read(fd, 65536)
            if not chunk:
                return ""
            self.buffer += chunk
        line, self.buffer = self.buffer.split(b"\n", 1)
        return line.decode().strip()

    def run(self, args: list[str], cwd: str, env: dict[str, str], timeout: float) -> dict:
        """Fork one client run; its result as `run_client` returns it."""
        with self.lock, tempfile.TemporaryDirectory(prefix="hfexport-warm-") as scratch:
            stdout, stderr = Path(scratch) / "stdout", Path(scratch) / "stderr"
            self.process.stdin.write(json.dumps({"argv": args, "cwd": cwd, "env": env, "stdout": str(stdout),
                                                 "stderr": str(stderr)}) + "\n")
            self.process.stdin.flush()
            pid = json.loads(self._line(None) or "{}").get("pid")
            if pid is None:
                raise OSError("the runtime's fork server ended")
            ended = self._line(timeout)
            if ended == "":
                raise OSError("the runtime's fork server ended")
            if ended is None:
                with contextlib.suppress(ProcessLookupError):
                    os.kill(pid, signal.SIGKILL)  # as run_client's timeout kills its client
                self._line(None)  # its exit, so that the next request reads its own lines
                raise RuntimeClientError(f"ran past its time limit of {timeout:.0f} s and was stopped")
            ended = json.loads(ended)
            code, self.cpu_s = ended["exit"], ended["cpu_s"]
            read = lambda path: path.read_text(encoding="utf-8", errors="replace") if path.is_file() else ""  # noqa: E731
            return client_result(code, read(stdout), read(stderr))

    def stop(self) -> None:
        with contextlib.suppress(OSError):
            self.process.stdin.close()
        try:
            self.process.wait(timeout=10)
        except subprocess.TimeoutExpired:
            self.process.kill()
            self.process.wait()


@contextlib.contextmanager
def warm_clients() -> Iterator[None]:
    """Run the Python runtimes' clients through fork servers until the block ends (nested blocks share the outer's)."""
    global _servers
    with _lock:
        outer = _servers is None
        if outer:
            _servers = {}
    try:
        yield
    finally:
        if outer:
            with _lock:
                servers, _servers = _servers, None
            for server in servers.values():
                if server is not None:
                    server.stop()


def cpu_seconds() -> float:
    """The CPU seconds of the open block's servers and the clients they ran (counted in this process's children only
    once a server has stopped)."""
    with _lock:
        return sum(server.cpu_s for server in (_servers or {}).values() if server is not None)


def run_warm(python: str, client: Path, args: list[str], cwd: str, timeout: float) -> dict | None:
    """`python CLIENT ARGS...` in `cwd` through the warm server of (python, client, this environment): its result as
    `run_client` returns it, or None where no `warm_clients` block is open or no server could start (run it cold)."""
    env = dict(os.environ)
    key = (python, str(client), tuple(sorted(env.items())))
    with _lock:
        if _servers is None or sys.platform == "win32":
            return None
        if key not in _servers:
            try:
                _servers[key] = _Server(python, client, env, timeout)
            except OSError:
                _servers[key] = None
        server = _servers[key]
    if server is None:
        return None
    try:
        return server.run(args, cwd, env, timeout)
    except OSError:
        return None
