"""Run the Gradio Space (`space/app.py` of a source checkout) in this process, and drive it with Chromium.

For the Space's tests and benchmark. HF_ENDPOINT must already point at the Hub to use (a `LocalHub`) before
gradio or huggingface_hub are imported. Outside a Space, Gradio mocks `gr.LoginButton`: building the app reads
the local login once (`HF_TOKEN`, checked with whoami), and a click on "Sign in" then injects the token
`mock-oauth-token-for-local-dev` into handlers, which the local Hub accepts as a write token. `running_space`
sets HF_TOKEN only while the app is built, so handlers cannot lean on it by accident.

Browsers: Playwright drives Debian's `/usr/bin/chromium` (`playwright install` cannot download here).
"""

from __future__ import annotations

import contextlib
import importlib.util
import os
import shutil
import socket
import sys
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

SPACE_DIR = Path(__file__).resolve().parents[3] / "space"
CHROMIUM_ARGS = ["--no-sandbox", "--disable-gpu", "--disable-background-networking", "--disable-component-update",
                 "--disable-sync", "--no-first-run"]


def chromium_path() -> str | None:
    """Debian's Chromium (or CHROMIUM_PATH), or None when it is not installed."""
    for candidate in (os.environ.get("CHROMIUM_PATH"), "/usr/bin/chromium", shutil.which("chromium")):
        if candidate and Path(candidate).is_file() and os.access(candidate, os.X_OK):
            return candidate
    return None


def browser_missing() -> str | None:
    """Why the browser tests cannot run here (no Chromium, no Playwright), or None when they can."""
    if chromium_path() is None:
        return "Chromium is not installed: `apt-get install chromium` (or `make system-deps`)"
    if importlib.util.find_spec("playwright") is None:
        return "the Playwright package is not installed: `pip install -c constraints.txt playwright` (test extra)"
    return None


def launch_chromium(playwright):
    """A headless Chromium from a `sync_playwright()` context."""
    return playwright.chromium.launch(executable_path=chromium_path(), headless=True, args=CHROMIUM_ARGS)


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def load_app_module(space_dir: Path = SPACE_DIR):
    """`space/app.py` as a module (it is a Space's entry point, not part of the installed package)."""
    name = "hfexport_space_app"
    if name in sys.modules:
        return sys.modules[name]
    spec = importlib.util.spec_from_file_location(name, space_dir / "app.py")
    if spec is None or spec.loader is None:
        raise FileNotFoundError(f"no Space app at {space_dir / 'app.py'}")
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module
    spec.loader.exec_module(module)
    return module


@dataclass
class RunningSpace:
    url: str
    demo: Any
    settings: Any


@contextlib.contextmanager
def running_space(settings=None, *, login_token: str, **launch_kwargs) -> Iterator[RunningSpace]:
    """Launch the Space on a free port of 127.0.0.1 in this process; close it on exit.

    `login_token`: the local login Gradio's mocked sign-in is checked against (whoami) while the app is built.
    """
    app = load_app_module()
    previous = os.environ.get("HF_TOKEN")
    os.environ["HF_TOKEN"] = login_token
    try:
        demo = app.launch(settings, prevent_thread_lock=True, server_name="127.0.0.1", server_port=free_port(),
                          quiet=True, **launch_kwargs)
    finally:
        if previous is None:
            os.environ.pop("HF_TOKEN", None)
        else:
            os.environ["HF_TOKEN"] = previous
    try:
        yield RunningSpace(demo.local_url.rstrip("/"), demo, demo.hfexport_settings)
    finally:
        demo.close()
        demo.hfexport_runner.close()
