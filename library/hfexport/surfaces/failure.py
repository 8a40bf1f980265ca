"""Any error as one category, one line and the command to reproduce it (the Space shows these; never a token)."""

from __future__ import annotations

from dataclasses import dataclass, field

from hfexport.errors import (
    HfExportError,
    PlanError,
    Problem,
    PublishError,
    PreflightError,
    PublishRefusedError,
    RecipeError,
    RecipeNotFoundError,
    SampleError,
    SourceError,
    SpaceError,
    UnknownTargetError,
    first_line,
    redact,
)


# ── Errors for people ────────────────────────────────────────────────────────


@dataclass
class Failure:
    """What the page shows for an error: a short category, one redacted line, and how to reproduce it."""

    category: str
    message: str
    command: str | None = None
    problems: list[Problem] = field(default_factory=list)

    def markdown(self) -> str:
        lines = [f"**{self.category}**: {md_escape(self.message)}"]
        if self.problems:
            lines += [""] + [f"- `{problem.path}`: {md_escape(problem.message)}" for problem in self.problems]
        if self.command:
            lines += ["", "Reproduce locally:", "", "```sh", self.command, "```"]
        return "\n".join(lines)

    def to_dict(self) -> dict:
        return {"category": self.category, "message": self.message, "command": self.command,
                "problems": [{"path": p.path, "message": p.message} for p in self.problems]}


def md_escape(text: str) -> str:
    return text.replace("<", "&lt;").replace(">", "&gt;")


def describe_failure(error: BaseException, command: str | None = None) -> Failure:
    """Any exception as a `Failure`: the category says what kind of problem it is and whose it is to fix."""
    if isinstance(error, SpaceError):
        return Failure(error.category, first_line(str(error)), error.command or command)
    if isinstance(error, RecipeError):
        count = len(error.problems)
        where = f" in {error.source}" if error.source else ""
        return Failure("Invalid recipe", f"{count} problem{'s' if count != 1 else ''}{where}", command,
                       [Problem(p.path, redact(p.message)) for p in error.problems])
    if isinstance(error, RecipeNotFoundError):
        return Failure("No recipe", first_line(str(error)), command)
    if isinstance(error, SampleError):
        return Failure("Unusable sample file", first_line(str(error)), command)
    if isinstance(error, PublishRefusedError):  # its message advises the CLI's --allow-failed: not on a page
        return Failure("Publishing refused", "a target failed the parity check, so it is not published: tick only "
                       "the targets that passed under Targets to convert, then Convert again", command)
    if isinstance(error, PublishError):
        return Failure("Publishing failed", first_line(str(error)), command)
    name = type(error).__name__
    message = first_line(str(error)) or name
    if isinstance(error, PreflightError):
        return Failure("Model too large for this Space", message, command)
    if isinstance(error, SourceError):
        lowered = message.lower()
        if "revision" in lowered and "not found" in lowered:
            category = "Revision not found"
        elif "gated" in lowered:
            category = "Gated repository"
        elif "not found" in lowered or "no such" in lowered:
            category = "Repository not found"
        else:
            category = "Hub unreachable"
        return Failure(category, message, command)
    if isinstance(error, UnknownTargetError):
        return Failure("Unknown target", message, command)
    if isinstance(error, PlanError):
        return Failure("Recipe does not fit the model", message, command)
    if isinstance(error, HfExportError):
        return Failure("Export failed", message, command)
    status = getattr(getattr(error, "response", None), "status_code", None)
    if status in (401, 403):
        return Failure("Not authorised", f"the Hub answered {status}: {message}", command)
    if status is not None:
        return Failure("Hub error", f"the Hub answered {status}: {message}", command)
    return Failure("Unexpected error", f"{name}: {message}" if message != name else name, command)


def report_failure(report, command: str | None) -> Failure | None:
    """A finished job whose targets failed: parity failures and export errors, one line per target."""
    bad = {name: target for name, target in report.targets.items() if target.status in ("failed", "error")}
    if not bad:
        return None
    category = "Export failed" if any(target.status == "error" for target in bad.values()) else "Parity check failed"
    problems = [Problem(name, first_line(target.error or f"parity {target.status}")) for name, target in bad.items()]
    return Failure(category, f"{len(bad)} of {len(report.targets)} targets did not pass", command, problems)
