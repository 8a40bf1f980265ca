"""A memory limit for a child process: a cgroup v1 memory cgroup (the tests' "inside N GB" runs; root only).

    with memory_cgroup(3 << 30) as group:
        subprocess.run(command, preexec_fn=group.enter)
    group.max_usage, group.failcnt  # its peak in bytes (RSS and page cache), how often it hit the limit

A file's page cache is charged to the cgroup of the process that first read or wrote it: `evict(folder)` before the
run, so a checkpoint the test just wrote is charged to the job that reads it, not to the test's process.

`available()` says whether this machine lets the tests make one (cgroup v1's memory controller, writable).
"""

from __future__ import annotations

import contextlib
import os
import uuid
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

ROOT = Path("/sys/fs/cgroup/memory")


def available() -> bool:
    return (ROOT / "cgroup.procs").is_file() and os.access(ROOT, os.W_OK)


@dataclass
class MemoryCgroup:
    folder: Path
    max_usage: int = 0
    failcnt: int = 0  # how many times its processes hit the limit (memory.failcnt)

    def enter(self) -> None:
        """Move the calling process into the cgroup (a `preexec_fn`: the child, before it runs the command)."""
        (self.folder / "cgroup.procs").write_text(str(os.getpid()))


def evict(folder: Path) -> None:
    """Write back and drop the page cache of every file under `folder`."""
    for path in sorted(Path(folder).rglob("*")):
        if path.is_file():
            fd = os.open(path, os.O_RDONLY)
            try:
                os.fsync(fd)
                os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
            finally:
                os.close(fd)


@contextlib.contextmanager
def memory_cgroup(limit: int) -> Iterator[MemoryCgroup]:
    """A fresh memory cgroup limited to `limit` bytes (no swap beyond it where the kernel lets that be set), removed
    on exit, any process still in it (a child's children after a timeout killed the child) killed first; `max_usage`
    and `failcnt` are read then."""
    folder = ROOT / f"hfexport-test-{uuid.uuid4().hex[:12]}"
    folder.mkdir()
    group = MemoryCgroup(folder)
    try:
        (folder / "memory.limit_in_bytes").write_text(str(limit))
        with contextlib.suppress(OSError):
            (folder / "memory.memsw.limit_in_bytes").write_text(str(limit))
        yield group
    finally:
        with contextlib.suppress(OSError, ValueError):
            group.max_usage = int((folder / "memory.max_usage_in_bytes").read_text())
            group.failcnt = int((folder / "memory.failcnt").read_text())
        _end_processes(folder)
        with contextlib.suppress(OSError):
            folder.rmdir()


def _end_processes(folder: Path, wait_s: float = 10.0) -> None:
    """SIGKILL every process left in the cgroup `folder` and wait (up to `wait_s`) until it is empty."""
    import signal
    import time

    deadline = time.monotonic() + wait_s
    while time.monotonic() < deadline:
        try:
            pids = [int(pid) for pid in (folder / "cgroup.procs").read_text().split()]
        except (OSError, ValueError):
            return
        if not pids:
            return
        for pid in pids:
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.kill(pid, signal.SIGKILL)
        time.sleep(0.05)
