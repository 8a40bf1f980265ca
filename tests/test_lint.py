"""The repository's Python passes the lint rules pyproject.toml pins ([tool.ruff]): unused or shadowed names,
undefined ones, syntax errors (a shadowed helper once broke `hfexport show` with a TypeError)."""

import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent


def test_ruff_finds_nothing():
    pytest.importorskip("ruff")
    done = subprocess.run([sys.executable, "-m", "ruff", "check", "--no-cache", str(ROOT)], capture_output=True,
                          text=True, cwd=ROOT, check=False)
    assert done.returncode == 0, done.stdout[-4000:] + done.stderr[-2000:]
