"""Logging: hfexport is quiet unless asked; the engine's and the backends' chatter goes to logging, not the terminal.

What the engine and its backends print on their own (torch.onnx's `[torch.onnx] Run decompositions...` lines,
ExecuTorch's C++ `[cpuinfo_utils.cpp:71] ...` lines on file descriptor 2, torchao's "Failed to load ... .so" and
transformers.exporters' "Version drift detected" warnings, "Loading weights" progress bars, Python warnings) is
captured while the engine runs (`engine_output`) and logged on the `hfexport.engine` logger at INFO, one record per
line. Nothing is shown by default (INFO is below Python's default WARNING; an application's own logging configuration
applies, as for any library logger); `HFEXPORT_LOG=info` (or `debug`), or the CLI's `--verbose`, shows the engine's
lines on stderr.

`engine_output` redirects file descriptors 1 and 2 (C++ code writes there, not to `sys.stdout`), so while it is active
only this module's `original_stream` (a duplicate of the terminal's descriptor, made before any redirection) reaches
the terminal: the CLI's console and this logger's handler write there.
"""

from __future__ import annotations

import atexit
import contextlib
import ctypes
import io
import logging
import os
import sys
import tempfile
import threading
import warnings
from collections.abc import Iterator


def quiet_engine_logs(debug: bool, verbose: bool = False) -> None:
    """Quiet by default: engine chatter (progress lines, version-drift notes, tracing warnings) is logged on
    `hfexport.engine` at INFO and not shown. `--verbose` or HFEXPORT_LOG=info shows it on stderr, `--debug` (or
    HFEXPORT_LOG=debug) everything."""
    import logging
    import warnings


    wanted = "debug" if debug else "info" if verbose else None
    level = configure(wanted)
    if wanted or parse_level(os.environ.get(ENV)) is not None and level < logging.WARNING:
        return
    os.environ.setdefault("TRANSFORMERS_VERBOSITY", "error")
    os.environ.setdefault("TORCH_LOGS", "-all")
    os.environ.setdefault("TQDM_DISABLE", "1")
    warnings.filterwarnings("ignore")
    logging.disable(logging.WARNING)  # engine loggers are named by file path, outside "transformers"


LOGGER = logging.getLogger("hfexport")
ENGINE = logging.getLogger("hfexport.engine")
ENV = "HFEXPORT_LOG"
LEVELS = {"debug": logging.DEBUG, "info": logging.INFO, "warning": logging.WARNING, "error": logging.ERROR}
_handler: logging.Handler | None = None
_originals: dict[str, io.TextIOBase] = {}
_lock = threading.RLock()
_depth = 0


def original_stream(name: str = "stderr"):
    """The terminal's stdout/stderr as it was before any `engine_output` redirection. When `sys.<name>` has been
    replaced (pytest's capture, a notebook, `contextlib.redirect_stdout`), that replacement: it is not a descriptor."""
    current = getattr(sys, name)
    if current is not getattr(sys, f"__{name}__") or current is None:
        return current
    with _lock:
        if name not in _originals:
            try:
                fd = current.fileno()
            except (AttributeError, OSError, ValueError):
                return current
            _originals[name] = os.fdopen(os.dup(fd), "w", buffering=1, encoding=current.encoding,
                                         errors="backslashreplace")
            atexit.register(_originals[name].close)
        return _originals[name]


class _OriginalStderrHandler(logging.StreamHandler):
    """A StreamHandler that writes to `original_stream("stderr")` at each record (the stream is looked up late, so
    pytest's capture and redirections made after configuration are honoured)."""

    def __init__(self):
        super().__init__(sys.stderr)

    def emit(self, record):
        self.stream = original_stream("stderr")
        super().emit(record)


def parse_level(value: str | int | None) -> int | None:
    """`debug`/`info`/`warning`/`error` (any case) or a number; None for unset or unknown values."""
    if value is None or value == "":
        return None
    if isinstance(value, int):
        return value
    text = str(value).strip().lower()
    if text.isdigit():
        return int(text)
    return LEVELS.get(text)


def configure(level: str | int | None = None) -> int:
    """Set the `hfexport` logger's level (`level`, else `HFEXPORT_LOG`, else WARNING) and give it one handler on
    stderr (`hfexport: message` lines). Returns the level set."""
    global _handler
    resolved = parse_level(level) or parse_level(os.environ.get(ENV)) or logging.WARNING
    LOGGER.setLevel(resolved)
    if _handler is None:
        _handler = _OriginalStderrHandler()
        _handler.setFormatter(logging.Formatter("%(name)s: %(message)s"))
        LOGGER.addHandler(_handler)
        LOGGER.propagate = False
    return resolved


_env_checked = False


def _configure_from_env() -> None:
    """A library call: HFEXPORT_LOG, when set, gets its handler; else the `hfexport` logger is left to the
    application's logging configuration (records propagate; INFO is below Python's default WARNING: quiet)."""
    global _env_checked
    if _env_checked:
        return
    _env_checked = True
    if _handler is None and parse_level(os.environ.get(ENV)) is not None:
        configure()


def _log_lines(text: str, what: str) -> None:
    previous = None
    for raw in text.replace("\r", "\n").splitlines():
        line = raw.rstrip()
        if line and line != previous:
            ENGINE.info("%s%s", f"{what}: " if what else "", line)
        previous = line


class _Warnings:
    """`warnings.showwarning` while the engine runs: the warning becomes an engine log line when the block ends
    (logged meanwhile, it would be written into the redirected streams and captured again)."""

    def __init__(self):
        self.lines: list[str] = []

    def __call__(self, message, category, filename, lineno, file=None, line=None):
        self.lines.append(f"{category.__name__}: {message} ({os.path.basename(filename)}:{lineno})")


def _flush_c_stdio() -> None:
    try:
        ctypes.CDLL(None).fflush(None)
    except (OSError, AttributeError):
        pass


@contextlib.contextmanager
def engine_output(what: str = "") -> Iterator[None]:
    """Run engine code with everything it prints (Python or C++, stdout or stderr) and every warning it raises sent
    to the `hfexport.engine` logger at INFO (`what` prefixes each line: `export onnx`). Re-entrant: an inner call
    adds nothing. The records are logged when the block ends, also when it raises."""
    global _depth
    with _lock:
        _depth += 1
        outer = _depth == 1
    if not outer:
        try:
            yield
        finally:
            with _lock:
                _depth -= 1
        return
    _configure_from_env()
    # The terminal's descriptors are duplicated before they are redirected, so that the CLI and the logger can
    # still reach them (original_stream).
    original_stream("stdout"), original_stream("stderr")
    python_out = io.StringIO()
    raised = _Warnings()
    captured = tempfile.TemporaryFile(mode="w+b")
    saved: list[tuple[int, int]] = []
    for stream in (sys.__stdout__, sys.__stderr__):
        with contextlib.suppress(AttributeError, OSError, ValueError):
            stream.flush()
    _flush_c_stdio()
    for fd in (1, 2):
        with contextlib.suppress(OSError):
            saved.append((fd, os.dup(fd)))
            os.dup2(captured.fileno(), fd)
    try:
        with contextlib.ExitStack() as stack:
            # Python-level streams are swapped only where they are not the descriptors captured above (pytest's
            # capture, a notebook's kernel stream): a logging handler created meanwhile keeps the real sys.stderr.
            if sys.stdout is not sys.__stdout__:
                stack.enter_context(contextlib.redirect_stdout(python_out))
            if sys.stderr is not sys.__stderr__:
                stack.enter_context(contextlib.redirect_stderr(python_out))
            stack.enter_context(warnings.catch_warnings())
            warnings.simplefilter("default")
            warnings.showwarning = raised
            yield
    finally:
        for stream in (sys.__stdout__, sys.__stderr__):
            with contextlib.suppress(AttributeError, OSError, ValueError):
                stream.flush()
        _flush_c_stdio()
        for fd, copy in saved:
            os.dup2(copy, fd)
            os.close(copy)
        captured.seek(0)
        _log_lines(captured.read().decode("utf-8", errors="replace"), what)
        captured.close()
        _log_lines(python_out.getvalue(), what)
        _log_lines("\n".join(raised.lines), what)
        with _lock:
            _depth -= 1


def import_engine() -> None:
    """Import the engine's exporter modules with their import-time chatter (torchao's `.so` load failures, torch's
    pytree deprecation warnings) sent to logging. Cheap once imported."""
    if "transformers.exporters.base" in sys.modules:
        return
    with engine_output("import"):
        import transformers.exporters.base  # noqa: F401
