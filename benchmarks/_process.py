"""One measured fresh process, as every benchmark here times its runs: wall, CPU and peak RSS, and the load around it.

CPU and peak RSS come from `wait4`, so they are the process's own (with the children it waited for), not the sum of
everything this benchmark has reaped so far. Scripts import it as `from _process import run_measured` (Python puts
the script's folder, benchmarks/, first on sys.path).
"""

from __future__ import annotations

import os
import platform
import subprocess
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent


def run_measured(command: list[str], stdout: Path, stderr: Path, env: dict[str, str] | None = None,
                 cwd: Path = ROOT) -> dict:
    """Run `command` to completion with its output in the two files; return its figures and its exit code."""
    load_before = os.getloadavg()[0]
    with stdout.open("wb") as out, stderr.open("wb") as err:
        start = time.perf_counter()
        process = subprocess.Popen(command, stdout=out, stderr=err, env=env, cwd=cwd)
        _, status, usage = os.wait4(process.pid, 0)
        wall = time.perf_counter() - start
    return {
        "returncode": os.waitstatus_to_exitcode(status),
        "wall_s": round(wall, 3),
        "cpu_s": round(usage.ru_utime + usage.ru_stime, 3),
        "peak_rss_mb": round(usage.ru_maxrss / 1024, 1),
        "load_avg_1m_before": round(load_before, 2),
        "load_avg_1m_after": round(os.getloadavg()[0], 2),
    }


ENGINE_PACKAGES = ("torch", "transformers", "executorch", "openvino", "onnxscript", "onnxruntime")


def machine_and_versions(packages=ENGINE_PACKAGES) -> dict:
    """What a result names besides its figures: this CPU (`hfexport.runtime.cpu_info`), and the packages' versions."""
    from importlib.metadata import version

    from hfexport.runtime import cpu_info

    return {
        "machine": {"cpu": cpu_info(), "cpus": os.cpu_count(), "python": platform.python_version(),
                    "note": "2 cores shared with other jobs while measured: see each run's load average"},
        "versions": {name: version(name) for name in packages},
    }
