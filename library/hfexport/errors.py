"""Errors hfexport raises on purpose (one hierarchy under `HfExportError`), the exit-code policy, token redaction
and `first_line`, the one way to show an error on one line.

Exit codes (`exit_code`): 0 ok, 1 a check failed (invalid recipe, parity, refused publication), 2 the command
could not run (a missing source, the Hub or the engine failing, an export refused as unsafe to load), 130
interrupted.
"""

from __future__ import annotations

import os
import re
from dataclasses import dataclass

EXIT_OK = 0
EXIT_CHECK_FAILED = 1
EXIT_COULD_NOT_RUN = 2

_TOKEN_PATTERN = re.compile(r"hf_[A-Za-z0-9]{8,}")
_known_secrets: set[str] = set()


def register_secret(value: str | None) -> None:
    """Remember a token so that `redact` scrubs it from any message, whatever its shape."""
    if value and len(value) >= 4:
        _known_secrets.add(value)


def redact(text: str) -> str:
    """`text` with every known token and anything shaped like a Hub token replaced by `***`."""
    for secret in sorted(_known_secrets | {os.environ.get("HF_TOKEN") or ""}, key=len, reverse=True):
        if secret and len(secret) >= 4:
            text = text.replace(secret, "***")
    return _TOKEN_PATTERN.sub("hf_***", text)


def exit_code(error: BaseException) -> int:
    """The one exit-code policy every surface (CLI, action, webhook) follows.

    An `HfExportError` carries its own code: `EXIT_CHECK_FAILED` (1) when the input was looked at and failed a check
    (an invalid recipe, a parity failure, a refused publication), `EXIT_COULD_NOT_RUN` (2) when the command could
    not do its work (a missing source, the Hub unreachable, the engine failing, an export refused as unsafe to
    load). Ctrl-C is 130, as shells expect; anything else is 2."""
    if isinstance(error, HfExportError):
        return error.exit_code
    if isinstance(error, KeyboardInterrupt):
        return 130
    return EXIT_COULD_NOT_RUN


def status_exit_code(status: str) -> int:
    """The exit code of a job or target by its report status: ok and unchanged 0, failed (parity) 1, error 2."""
    return {"ok": EXIT_OK, "unchanged": EXIT_OK, "failed": EXIT_CHECK_FAILED}.get(status, EXIT_COULD_NOT_RUN)


def killed_by(returncode: int) -> str:
    """What a child process's negative exit code says, for its error message: " (killed by signal 9: out of
    memory?)" for SIGKILL, the kernel's OOM killer's and a cgroup limit's signal; "" for a normal exit."""
    if returncode >= 0:
        return ""
    return f" (killed by signal {-returncode}{': out of memory?' if returncode == -9 else ''})"


def first_line(error: BaseException | str, limit: int | None = None) -> str:
    """The first line of an error's message (its class name when the message is empty), redacted, optionally cut.

    One line is what a CLI error, a report field or a progress line can show; an empty `OSError()` or a message
    of blank lines still yields something readable."""
    text = error if isinstance(error, str) else str(error)
    line = next((part.strip() for part in text.splitlines() if part.strip()), "")
    if not line and not isinstance(error, str):
        line = type(error).__name__
    line = redact(line)
    return line[:limit] if limit else line


class HfExportError(Exception):
    """An expected failure with a readable message: the CLI prints it on one line, no traceback.

    Besides the message, what a caller may need to act on it, where the raiser knows it (None otherwise): the recipe
    `target`, the `file` and the `json_path` (a dotted path in a recipe or manifest) concerned."""

    exit_code = EXIT_COULD_NOT_RUN
    target: str | None = None
    file: str | None = None
    json_path: str | None = None

    def __init__(self, *args: object, target: str | None = None, file: str | None = None,
                 json_path: str | None = None):
        super().__init__(*args)
        self.target, self.file, self.json_path = target, file, json_path

    def __str__(self) -> str:
        return redact(super().__str__())


@dataclass(frozen=True)
class Problem:
    """One thing wrong with a recipe: where (a dotted JSON path, `$` for the document) and what was expected."""

    path: str
    message: str

    def __str__(self) -> str:
        return f"{self.path}: {self.message}"


class RecipeError(HfExportError):
    """A recipe that is not valid: every problem, each with its JSON path."""

    exit_code = EXIT_CHECK_FAILED

    def __init__(self, problems: list[Problem] | Problem, source: str | None = None):
        self.problems = [problems] if isinstance(problems, Problem) else list(problems)
        self.source = source
        where = f" in {source}" if source else ""
        count = len(self.problems)
        header = f"invalid recipe{where} ({count} problem{'s' if count != 1 else ''})"
        super().__init__(header + ":\n" + "\n".join(f"  {problem}" for problem in self.problems))


class RecipeNotFoundError(HfExportError):
    """The model has no recipe (no `export_config.json`, no `export_config` in `config.json`)."""


class SourceError(HfExportError):
    """A model or recipe source that cannot be read: missing path, unknown repo or revision, no access."""


class PlanError(HfExportError):
    """A valid recipe that does not fit the model it is applied to (unknown input, wrong static size, ...)."""


class UnknownTargetError(HfExportError):
    """A target name the recipe does not have."""


class UnsafeExportError(HfExportError):
    """An export that would run code or read outside its folder if loaded (a crafted manifest, archive or link):
    never loaded."""

    exit_code = EXIT_COULD_NOT_RUN  # refused before loading: nothing was checked (`hfexport verify` exits 2)


class CorruptExportError(SourceError):
    """An export that is merely broken (malformed manifest, truncated or inconsistent file, a backend that cannot
    read a checked file): the message names the file and the field."""


class MissingKernelError(HfExportError):
    """A runtime that has no kernel for an op of a sound file at its dtype (ONNX Runtime's CPU provider has no
    bfloat16 `Mul`): the message names the file, the op, the dtype and the runtime; the file is not corrupt."""


class PublishError(HfExportError):
    """Publishing to the Hub failed (authentication, access, network): nothing was half-published."""


class CardError(HfExportError, ValueError):
    """A README whose hfexport markers are unbalanced: hfexport will not guess where its section ends."""


class GenerationError(HfExportError, ValueError):
    """The export cannot generate (no prefill/decode components, inputs it was not traced with, a full cache)."""


class PublishRefusedError(HfExportError):
    """A publication hfexport will not make: e.g. a target that failed parity, without `allow_failed`."""

    exit_code = EXIT_CHECK_FAILED


class SaveError(HfExportError):
    """An export that cannot be saved the way its format's runtimes read it (e.g. ONNX graphs whose cache shapes the
    loaders' contract cannot state, a graph the float16 converter cannot take)."""


class SampleError(HfExportError):
    """A sample file that cannot be used: the message names the file (its name only) and what was expected."""

    exit_code = EXIT_CHECK_FAILED


class PreflightError(HfExportError):
    """A job that would not fit in memory or on disk: what it needs, what is available, what to do."""


class SpaceError(HfExportError):
    """A request the Space refuses before calling the job API (signed out, not a repo id, nothing to publish)."""

    def __init__(self, category: str, message: str, command: str | None = None):
        self.category, self.command = category, command
        super().__init__(message)


class DuplicateKeyError(HfExportError, ValueError):
    """A JSON object names `key` twice (`hfexport.strict_json`; its callers turn it into their own error)."""

    def __init__(self, key: str):
        super().__init__(key)
        self.key = key


class RebindRefused(HfExportError):
    """Why a rebind cannot be made; the job exports instead and reports this sentence (`file`: the export's file)."""


class RuntimeClientError(HfExportError, RuntimeError):
    """A runtime's client crashed, hung, or answered nothing readable: the runtime's check fails with this message."""
