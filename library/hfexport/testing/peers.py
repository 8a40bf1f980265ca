"""The ecosystem's own loaders, each in its own environment, built on demand and cached: for tests and benchmarks.

sentence-transformers, optimum(-onnx, -intel) and transformers.js pin transformers 4.x (hfexport's engine needs
5.x), so they cannot share hfexport's venv. `peer_venv()` builds a venv for them (CPU torch first, so nothing pulls
a CUDA build), `node_modules()` an npm folder for `@huggingface/transformers`. Each is cached under
`~/.cache/hfexport-tests/` (or `HFEXPORT_TEST_CACHE`) in a folder keyed by the sha256 of its requirements, and is
marked complete only after the install succeeded, so a clean CI machine builds it once and later runs reuse it.
Concurrent builders (pytest workers, a benchmark) wait on one file lock.

Client scripts that run inside those environments live in `hfexport/testing/clients/`; they never import hfexport.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
import shutil
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

try:
    import fcntl
except ImportError:  # pragma: no cover - non-POSIX
    fcntl = None  # type: ignore[assignment]

TORCH = "torch==2.13.0"
#: What the peers' venv holds: the loaders as users install them, transformers at the 4.57 line they support.
PEER_REQUIREMENTS = (
    "transformers==4.57.6",
    "sentence-transformers==5.7.0",
    "optimum==2.1.0",
    "optimum-onnx[onnxruntime]==0.1.0",
    "optimum-intel[openvino]==1.27.0",
    "onnxruntime==1.32.0",
    "openvino==2026.4.1",
)
#: onnxruntime-genai as its users install it from PyPI (it brings the ONNX Runtime it runs on; no torch, no transformers),
#: with huggingface_hub to download an export as the README shows.
GENAI_REQUIREMENTS = ("onnxruntime-genai==0.18.0", "onnxruntime==1.32.0", "huggingface_hub==0.36.2")
#: OpenVINO GenAI as its users install it (LLMPipeline with its tokenizer plugin), at hfexport's OpenVINO version:
#: openvino-genai and openvino-tokenizers must match openvino exactly. No torch, no transformers.
OPENVINO_GENAI_REQUIREMENTS = ("openvino==2026.4.1", "openvino-tokenizers==2026.4.1.0", "openvino-genai==2026.4.1.0")
#: optimum-executorch as its users install it: it pins transformers 5.0.0rc1 (and brings executorch 1.5.1, hfexport's).
OPTIMUM_EXECUTORCH_REQUIREMENTS = ("optimum-executorch==1.1.0",)
#: transformers.js from npm; onnxruntime-node bundles its CPU binary (its install script only fetches CUDA extras).
NODE_PACKAGES = {"@huggingface/transformers": "4.3.2"}
CLIENTS = Path(__file__).resolve().parent / "clients"
COMPLETE = ".hfexport-complete"


class PeerSetupError(RuntimeError):
    """A peer environment could not be built (no network to the registry, no npm, a failed install)."""


def cache_root() -> Path:
    return Path(os.environ.get("HFEXPORT_TEST_CACHE") or Path.home() / ".cache" / "hfexport-tests")


def _key(kind: str, requirements: object) -> str:
    return f"{kind}-" + hashlib.sha256(json.dumps(requirements, sort_keys=True).encode()).hexdigest()[:16]


@contextlib.contextmanager
def _locked(folder: Path) -> Iterator[None]:
    folder.parent.mkdir(parents=True, exist_ok=True)
    with open(folder.with_name(folder.name + ".lock"), "w") as lock:
        if fcntl is not None:
            fcntl.flock(lock, fcntl.LOCK_EX)
        yield


def _run(command: list[str], what: str, **kwargs) -> None:
    done = subprocess.run(command, capture_output=True, text=True, **kwargs)
    if done.returncode != 0:
        tail = "\n".join((done.stdout + done.stderr).strip().splitlines()[-15:])
        raise PeerSetupError(f"{what} failed ({' '.join(command[:4])} ... exit {done.returncode}):\n{tail}")


def _timed(folder: Path, build) -> Path:
    """Build `folder` once (under its lock) unless its completion marker exists; the marker records the seconds."""
    marker = folder / COMPLETE
    if marker.is_file():
        return folder
    with _locked(folder):
        if marker.is_file():
            return folder
        shutil.rmtree(folder, ignore_errors=True)
        started = time.perf_counter()
        build(folder)
        marker.write_text(json.dumps({"seconds": round(time.perf_counter() - started, 1)}))
    return folder


def build_seconds(folder: Path) -> float | None:
    """How long building `folder` took, as its completion marker recorded (None if it is not built)."""
    try:
        return json.loads((folder / COMPLETE).read_text())["seconds"]
    except (OSError, ValueError, KeyError):
        return None


def peer_venv(requirements: tuple[str, ...] = PEER_REQUIREMENTS, *, torch: bool = True) -> Path:
    """A venv with `requirements` (CPU torch installed first and pinned, unless `torch=False`), built once; returns
    its python."""

    def build(folder: Path) -> None:
        _run([sys.executable, "-m", "venv", str(folder)], "creating the peers' venv")
        pip = [str(folder / "bin" / "python"), "-m", "pip", "install", "-q", "--disable-pip-version-check"]
        if torch:
            _run([*pip, TORCH], f"installing {TORCH}")
            constraints = folder / "constraints.txt"
            constraints.write_text(TORCH + "\n")
            _run([*pip, "-c", str(constraints), *requirements], "installing the peers' packages")
        else:
            _run([*pip, *requirements], "installing the peers' packages")

    folder = _timed(cache_root() / _key("venv", [TORCH, *requirements] if torch else list(requirements)), build)
    return folder / "bin" / "python"


def genai_venv(requirements: tuple[str, ...] = GENAI_REQUIREMENTS) -> Path:
    """A venv with onnxruntime-genai alone (no torch: its users run it without), built once; returns its python."""

    def build(folder: Path) -> None:
        _run([sys.executable, "-m", "venv", str(folder)], "creating the onnxruntime-genai venv")
        _run([str(folder / "bin" / "python"), "-m", "pip", "install", "-q", "--disable-pip-version-check",
              *requirements], "installing onnxruntime-genai")

    folder = _timed(cache_root() / _key("venv", list(requirements)), build)
    return folder / "bin" / "python"


def openvino_genai_venv() -> Path:
    """A venv with OpenVINO GenAI (`OPENVINO_GENAI_REQUIREMENTS`), built once; returns its python."""
    return peer_venv(OPENVINO_GENAI_REQUIREMENTS, torch=False)


def optimum_executorch_venv() -> Path:
    """A venv with optimum-executorch (`OPTIMUM_EXECUTORCH_REQUIREMENTS`, on CPU torch), built once; returns its
    python."""
    return peer_venv(OPTIMUM_EXECUTORCH_REQUIREMENTS)


def node_modules(packages: dict[str, str] | None = None) -> Path:
    """A folder with `packages` installed from npm (its `node_modules/` inside), built once; returns the folder."""
    packages = dict(packages or NODE_PACKAGES)
    npm = shutil.which("npm")
    if npm is None or shutil.which("node") is None:
        raise PeerSetupError("transformers.js needs Node.js and npm (Debian: apt-get install nodejs npm)")

    def build(folder: Path) -> None:
        folder.mkdir(parents=True)
        (folder / "package.json").write_text(json.dumps(
            {"name": "hfexport-peers", "private": True, "type": "module", "dependencies": packages}, indent=2))
        env = {**os.environ, "ONNXRUNTIME_NODE_INSTALL_CUDA": "skip", "ONNXRUNTIME_NODE_INSTALL": "skip"}
        _run([npm, "install", "--no-audit", "--no-fund", "--loglevel=error"], "npm install", cwd=folder, env=env)

    return _timed(cache_root() / _key("node", packages), build)


def run_python_client(python: Path, script: str, *args: str, env: dict[str, str], timeout: float = 600) -> dict:
    """Run `clients/<script>` with the peers' python; its last stdout line is JSON, returned as a dict."""
    return _json_result([str(python), str(CLIENTS / script), *args], env, timeout, cwd=None)


def run_node_client(folder: Path, script: str, *args: str, env: dict[str, str], timeout: float = 300) -> dict:
    """Run `clients/<script>` under Node with `folder`'s node_modules; its last stdout line is JSON."""
    target = folder / script
    shutil.copyfile(CLIENTS / script, target)  # ESM resolves packages next to the script
    return _json_result(["node", str(target), *args], env, timeout, cwd=folder)


def _json_result(command: list[str], env: dict[str, str], timeout: float, cwd: Path | None) -> dict:
    done = subprocess.run(command, capture_output=True, text=True, env={**os.environ, **env}, timeout=timeout,
                          cwd=cwd)
    lines = done.stdout.strip().splitlines()
    if done.returncode != 0 or not lines:
        raise AssertionError(f"{Path(command[1]).name} exited {done.returncode}:\n{done.stdout[-3000:]}\n"
                             f"{done.stderr[-3000:]}")
    return json.loads(lines[-1])
