"""Every upstream workaround is in `hfexport.workarounds.WORKAROUNDS`, naming its upstream project and version, what
it works around, where it lives, and a canary test that exists (the test that fails once upstream fixes it)."""

import ast
import re
from pathlib import Path

from hfexport.workarounds import WORKAROUNDS

ROOT = Path(__file__).resolve().parent.parent
PACKAGE = ROOT / "library" / "hfexport"


def _test_names(path: Path) -> set[str]:
    return {node.name for node in ast.walk(ast.parse(path.read_text()))
            if isinstance(node, ast.FunctionDef) and node.name.startswith("test_")}


def test_every_entry_names_its_upstream_version_module_and_an_existing_canary():
    problems = []
    for entry in WORKAROUNDS:
        if not re.search(r"\d+\.\d+", entry.upstream):
            problems.append(f"{entry.name}: upstream {entry.upstream!r} names no version")
        if not entry.works_around.strip() or not entry.applied.strip():
            problems.append(f"{entry.name}: says neither what it works around nor where it applies")
        module = PACKAGE.joinpath(*entry.module.split("."))
        if not module.with_suffix(".py").is_file() and not (module / "__init__.py").is_file():
            problems.append(f"{entry.name}: no module hfexport.{entry.module}")
        file, _, name = entry.canary.partition("::")
        if not (ROOT / file).is_file() or name not in _test_names(ROOT / file):
            problems.append(f"{entry.name}: canary {entry.canary} does not exist")
    assert not problems, "\n".join(problems)
    assert len({entry.name for entry in WORKAROUNDS}) == len(WORKAROUNDS)


def test_every_workaround_module_is_in_the_registry():
    listed = {entry.module for entry in WORKAROUNDS}
    modules = {f"workarounds.{path.stem}" for path in (PACKAGE / "workarounds").glob("*.py") if path.stem != "__init__"}
    modules |= {".".join(path.relative_to(PACKAGE).with_suffix("").parts)  # a format's own, in its package
                for path in (PACKAGE / "formats").glob("*/*workarounds.py")}
    assert modules <= listed, f"not in WORKAROUNDS: {sorted(modules - listed)}"


def test_the_checker_sees_a_missing_canary(monkeypatch):
    import dataclasses

    import hfexport.workarounds as registry

    broken = dataclasses.replace(WORKAROUNDS[0], canary="tests/test_workarounds.py::test_that_does_not_exist")
    monkeypatch.setattr(__import__(__name__), "WORKAROUNDS", (broken,))
    try:
        test_every_entry_names_its_upstream_version_module_and_an_existing_canary()
    except AssertionError as error:
        assert "does not exist" in str(error)
    else:
        raise AssertionError("a missing canary was not reported")
    assert registry.WORKAROUNDS[0].canary != broken.canary


def test_every_module_that_registers_a_workaround_is_read_with_the_registry():
    """`WORKAROUNDS` imports `DEFINING_MODULES` before it answers: a module that registers a workaround and is not
    listed there would be missing whenever nothing else had imported it."""
    from hfexport.workarounds import DEFINING_MODULES

    registering = set()
    for path in PACKAGE.rglob("*.py"):
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.Call) and getattr(node.func, "id", None) in ("workaround", "register_workaround"):
                parts = path.relative_to(PACKAGE).with_suffix("").parts
                registering.add(".".join(parts[:-1] if parts[-1] == "__init__" else parts))
    registering.discard("workarounds")  # the registry's own `workaround` decorator calls `register_workaround`
    assert registering == set(DEFINING_MODULES)
    assert {entry.module for entry in WORKAROUNDS} == registering


def test_the_docs_table_is_the_registry():
    """docs/architecture.md's workarounds table is `markdown_table(WORKAROUNDS)`, row by row (write it with
    `python scripts/workarounds_table.py`)."""
    from hfexport.workarounds import markdown_table

    lines = (ROOT / "docs" / "architecture.md").read_text().splitlines()
    first = next(index for index, line in enumerate(lines) if line.startswith("| workaround |"))
    end = next((index for index in range(first, len(lines)) if not lines[index].startswith("|")), len(lines))
    assert lines[first:end] == markdown_table(WORKAROUNDS).splitlines()
    assert len(lines[first:end]) == 2 + len(WORKAROUNDS)
