"""Every workaround of an upstream project's bug or cost, in one registry: what it works around, the version it was
checked against, where it lives, and its canary (a test that fails when upstream fixes it, so the workaround can go).

Each workaround registers itself where it is defined (`@workaround(...)` on the function that applies it, or
`register_workaround` beside the data it is), so its entry changes with its code. Someone upgrading transformers,
onnxscript, OpenVINO or ExecuTorch reads `WORKAROUNDS` (or docs/architecture.md's table, generated from it), runs
each entry's canary and the tests beside it, and removes what upstream fixed. A format's fixes live in its package
(`formats.executorch.workarounds`, `formats.onnx.onnxscript_workarounds`, `formats.onnx.onnxruntime_workarounds`,
`formats.openvino.workarounds`), the model code's in `workarounds.transformers_models`; the engine internals hfexport reads (transformers.exporters names that are not its
public API) are listed in `workarounds.transformers_exporters.INTERNALS` and reached through `hfexport.engine`. This
module imports none of them when imported: reading `WORKAROUNDS` imports `DEFINING_MODULES`, so the registry is whole
whatever was imported before (tests/test_workarounds.py checks that every module that registers one is listed there).
"""

from __future__ import annotations

import contextlib
import importlib
from collections.abc import Iterator
from dataclasses import dataclass


@dataclass(frozen=True)
class Workaround:
    name: str
    upstream: str  # the project and the version it was checked against
    works_around: str
    module: str  # where it lives, under hfexport
    applied: str  # where hfexport applies it
    canary: str  # pytest node id: fails once upstream no longer has the problem


#: The modules that register workarounds (under hfexport), imported when `WORKAROUNDS` is read.
DEFINING_MODULES = ("engine", "formats.executorch.workarounds", "formats.onnx.onnxruntime_workarounds",
                    "formats.onnx.onnxscript_workarounds", "formats.openvino.workarounds",
                    "workarounds.torch_export", "workarounds.transformers_exporters", "workarounds.transformers_models")
_REGISTERED: dict[str, Workaround] = {}


def register_workaround(entry: Workaround) -> Workaround:
    """Add `entry` to the registry (again: the same entry, as when a module is reloaded)."""
    if _REGISTERED.setdefault(entry.name, entry) != entry:
        raise ValueError(f"two different workarounds are named {entry.name!r}")
    return entry


def workaround(name: str, *, upstream: str, works_around: str, applied: str, canary: str):
    """Decorator: register the decorated function (or class) as the workaround `name`, living in its module."""
    def register(defined):
        module = defined.__module__.removeprefix("hfexport.")
        register_workaround(Workaround(name, upstream, works_around, module, applied, canary))
        return defined

    return register


@contextlib.contextmanager
def replaced(*replacements) -> Iterator[None]:
    """Within the block, each `(owner, attribute, value)` is set (an upstream function wrapped, a method replaced);
    on leaving, every attribute gets its original back."""
    originals = [(owner, name, getattr(owner, name)) for owner, name, _ in replacements]
    for owner, name, value in replacements:
        setattr(owner, name, value)
    try:
        yield
    finally:
        for owner, name, original in originals:
            setattr(owner, name, original)


def __getattr__(attribute: str):
    if attribute == "WORKAROUNDS":  # every registered workaround, by name
        for module in DEFINING_MODULES:
            importlib.import_module(f"hfexport.{module}")
        return tuple(sorted(_REGISTERED.values(), key=lambda entry: entry.name))
    raise AttributeError(f"module {__name__!r} has no attribute {attribute!r}")


def markdown_table(entries) -> str:
    """docs/architecture.md's table of `entries` (tests/test_workarounds.py compares the two)."""
    def cell(text: str) -> str:
        return text.replace("|", "\\|")

    rows = ["| workaround | upstream, checked | works around | where | canary |", "|---|---|---|---|---|"]
    rows += [f"| `{entry.name}` | {cell(entry.upstream)} | {cell(entry.works_around)} | `{entry.module}`; "
             f"{cell(entry.applied)} | `{entry.canary}` |" for entry in entries]
    return "\n".join(rows) + "\n"
