"""The repository's Python passes the lint rules pyproject.toml pins ([tool.ruff]): unused or shadowed names,
undefined ones, syntax errors (a shadowed helper once broke `hfexport show` with a TypeError); and no patch or editor
leftover is tracked (a `check.py.rej` once shipped inside the package and its wheel)."""

import re
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


STRAY = re.compile(r"(\.(rej|orig|swp|swo|bak|tmp)|~|\.DS_Store|#)$")


def test_no_stray_files_are_tracked():
    done = subprocess.run(["git", "ls-files", "-z"], capture_output=True, text=True, cwd=ROOT, check=False)
    if done.returncode != 0:
        pytest.skip("not a git checkout (an sdist): nothing is tracked")
    stray = [name for name in done.stdout.split("\0") if name and STRAY.search(name)]
    assert not stray, f"patch or editor leftovers are tracked: {stray}"
