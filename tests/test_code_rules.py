"""Rules of the package's code that an AST walk can check (issue 42): every exception class hfexport defines is an
`HfExportError` (so that `hfexport.errors.exit_code` and the surfaces treat it as one readable line), and no module
uses another module's private names (a name used outside its module is that module's interface: a public name),
and no docstring is longer than a screen (longer reasoning lives in docs/)."""

import ast
import builtins
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
PACKAGE = ROOT / "library" / "hfexport"
# hfexport.testing is the test harness (the local Hub server's HTTP answers, the local action runner, the peers'
# environments): its errors reach the tests, never a user of hfexport.
HARNESS = PACKAGE / "testing"


def _sources() -> list[Path]:
    return sorted(path for path in PACKAGE.rglob("*.py") if HARNESS not in path.parents)


def _label(path: Path) -> str:
    return f"hfexport/{path.relative_to(PACKAGE)}" if PACKAGE in path.parents else path.name


def _base_name(node: ast.expr) -> str:
    """`ValueError` and `strict_json.DuplicateKeyError` as their last name."""
    return node.attr if isinstance(node, ast.Attribute) else getattr(node, "id", "")


def exceptions_outside_the_hierarchy(paths: list[Path]) -> list[str]:
    """`file:line: Class` for each exception class in `paths` that does not derive from `HfExportError`."""
    classes: dict[str, list[str]] = {}
    where: dict[str, str] = {}
    for path in paths:
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.ClassDef):
                classes.setdefault(node.name, []).extend(_base_name(base) for base in node.bases)
                where[node.name] = f"{_label(path)}:{node.lineno}"

    def reaches(name: str, goal, seen=()) -> bool:
        if goal(name):
            return True
        return name not in seen and any(reaches(base, goal, (*seen, name)) for base in classes.get(name, ()))

    def builtin_exception(name: str) -> bool:
        value = getattr(builtins, name, None)
        return isinstance(value, type) and issubclass(value, BaseException) and not issubclass(value, Warning)

    def foreign_exception(name: str) -> bool:  # a base from another library, by its name (`HTTPError`)
        return name not in classes and not hasattr(builtins, name) and name.endswith(("Error", "Exception"))

    return [f"{where[name]}: {name}" for name in sorted(classes)
            if reaches(name, lambda base: builtin_exception(base) or foreign_exception(base))
            and not reaches(name, lambda base: base == "HfExportError")]


def test_every_exception_class_is_an_hfexport_error():
    offenders = exceptions_outside_the_hierarchy(_sources())
    assert not offenders, "exception classes outside hfexport.errors.HfExportError:\n" + "\n".join(offenders)


@pytest.mark.parametrize("source", [
    "class Refused(Exception):\n    pass\n",
    "class Odd(ValueError):\n    pass\nclass Odder(Odd):\n    pass\n",
    "import requests\nclass Remote(requests.HTTPError):\n    pass\n",
])
def test_the_hierarchy_check_sees_an_exception_outside_it(tmp_path, source):
    path = tmp_path / "module.py"
    path.write_text(source)
    assert exceptions_outside_the_hierarchy([path])
    path.write_text("from hfexport.errors import HfExportError\nclass Fine(HfExportError, ValueError):\n    pass\n"
                    "class Plain:\n    pass\n")
    assert not exceptions_outside_the_hierarchy([path])


def test_the_errors_keep_their_exit_codes_and_say_where():
    from hfexport import errors
    from hfexport.layout import LayoutError, assign_places, check_file_name
    from hfexport.formats.onnx.decoder_contract import ContractError

    assert errors.exit_code(errors.SampleError("x.wav: not a WAV file")) == errors.EXIT_CHECK_FAILED
    for error in (errors.PreflightError("x"), errors.DuplicateKeyError("k"), errors.RebindRefused("x"),
                  errors.RuntimeClientError("x"), LayoutError("x"), ContractError("x")):
        assert errors.exit_code(error) == errors.EXIT_COULD_NOT_RUN
    for error in (errors.DuplicateKeyError("k"), LayoutError("x"), ContractError("x")):
        assert isinstance(error, ValueError)  # what they were before they joined the hierarchy
    assert isinstance(errors.RuntimeClientError("x"), RuntimeError)
    with pytest.raises(LayoutError) as raised:
        check_file_name("model.xml", "onnx", "targets.a.file_name")
    assert raised.value.json_path == "targets.a.file_name" and raised.value.target is None
    assert str(raised.value).startswith("targets.a.file_name: 'model.xml' is not a file name for onnx")
    with pytest.raises(LayoutError) as raised:
        assign_places({name: {"export_format": "onnx", "path": "onnx"} for name in ("a", "b")}, {}, set())
    assert raised.value.target in ("a", "b")


def _module_name(path: Path, package: Path) -> str:
    parts = path.relative_to(package.parent).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def _private(name: str) -> bool:
    return name.startswith("_") and not (name.startswith("__") and name.endswith("__"))


def private_cross_module_uses(package: Path) -> list[str]:
    """`file:line: module._name` for each `from module import _name` and `module._name` that reaches into another of
    the package's modules."""
    modules = {_module_name(path, package) for path in package.rglob("*.py")}
    found = []
    for path in sorted(package.rglob("*.py")):
        own = _module_name(path, package)
        tree = ast.parse(path.read_text())
        bound = {}  # a local name -> the package module it is bound to
        for node in ast.walk(tree):
            if isinstance(node, ast.ImportFrom):
                if node.level:
                    base = own.split(".") if path.name == "__init__.py" else own.split(".")[:-1]
                    source = ".".join(base[: len(base) - node.level + 1] + ([node.module] if node.module else []))
                else:
                    source = node.module or ""
                if source.split(".")[0] != package.name:
                    continue
                for alias in node.names:
                    if f"{source}.{alias.name}" in modules:
                        bound[alias.asname or alias.name] = f"{source}.{alias.name}"
                    if _private(alias.name) and source != own:
                        found.append(f"{path.relative_to(package.parent)}:{node.lineno}: {source}.{alias.name}")
            elif isinstance(node, ast.Import):
                bound.update({alias.asname or alias.name: alias.name for alias in node.names
                              if alias.name.split(".")[0] == package.name})
        for node in ast.walk(tree):
            if isinstance(node, ast.Attribute) and _private(node.attr):
                chain, value = [], node.value
                while isinstance(value, ast.Attribute):
                    chain.append(value.attr)
                    value = value.value
                if isinstance(value, ast.Name) and value.id in bound:
                    source = ".".join([bound[value.id], *reversed(chain)])
                    if source in modules and source != own:
                        found.append(f"{path.relative_to(package.parent)}:{node.lineno}: {source}.{node.attr}")
    return found


def test_no_module_uses_another_modules_private_names():
    offenders = private_cross_module_uses(PACKAGE)
    assert not offenders, "private names used outside their module (make them public, or move the code):\n" + \
        "\n".join(offenders)


def test_the_private_name_check_sees_both_forms(tmp_path):
    package = tmp_path / "hfexport"
    (package / "plan").mkdir(parents=True)
    (package / "__init__.py").write_text("")
    (package / "plan" / "__init__.py").write_text("")
    (package / "plan" / "shapes.py").write_text("def _resolve():\n    pass\n\ndef resolve():\n    _resolve()\n")
    (package / "plan" / "build.py").write_text("from hfexport.plan.shapes import _resolve, resolve\n"
                                               "from . import shapes\nimport hfexport.plan.shapes as named\n"
                                               "shapes._resolve()\nnamed._resolve()\nresolve()\n")
    assert sorted(private_cross_module_uses(package)) == [
        "hfexport/plan/build.py:1: hfexport.plan.shapes._resolve",
        "hfexport/plan/build.py:4: hfexport.plan.shapes._resolve",
        "hfexport/plan/build.py:5: hfexport.plan.shapes._resolve",
    ]


# A docstring is a screen at most: 25 lines (of at most 120 characters, the line length ruff enforces). Longer
# reasoning, measurements and argument references go to docs/, and the docstring points there.
DOCSTRING_MAX_LINES = 25


def long_docstrings(paths: list[Path]) -> list[str]:
    """`file:line: name (N lines)` for each module, class or function docstring in `paths` over the bound."""
    found = []
    for path in paths:
        tree = ast.parse(path.read_text())
        for node in ast.walk(tree):
            if isinstance(node, (ast.Module, ast.ClassDef, ast.FunctionDef, ast.AsyncFunctionDef)):
                docstring = ast.get_docstring(node)  # cleaned: indentation and the closing line aside
                if docstring and len(docstring.splitlines()) > DOCSTRING_MAX_LINES:
                    name = getattr(node, "name", "(module)")
                    found.append(f"{_label(path)}:{getattr(node, 'lineno', 1)}: {name} "
                                 f"({len(docstring.splitlines())} lines)")
    return found


def test_no_docstring_is_longer_than_a_screen():
    offenders = long_docstrings(sorted(PACKAGE.rglob("*.py")))  # the test harness (hfexport.testing) included
    assert not offenders, (f"docstrings over {DOCSTRING_MAX_LINES} lines (move the reasoning to docs/):\n"
                           + "\n".join(offenders))


@pytest.mark.parametrize("where", ["module", "class", "function", "method"])
def test_the_docstring_check_sees_a_long_one(tmp_path, where):
    def source(lines: int) -> str:
        doc = '"""' + "\n".join(f"line {i}" for i in range(lines)) + '\n"""'
        indented = "\n".join("    " + line if line else line for line in doc.splitlines())
        return {"module": doc + "\n",
                "class": f"class C:\n{indented}\n",
                "function": f"def f():\n{indented}\n",
                "method": "class C:\n    def m(self):\n" + "\n".join("    " + line for line in indented.splitlines())
                + "\n"}[where]
    path = tmp_path / "module.py"
    path.write_text(source(DOCSTRING_MAX_LINES + 1))
    assert long_docstrings([path]) and f"({DOCSTRING_MAX_LINES + 1} lines)" in long_docstrings([path])[0]
    path.write_text(source(DOCSTRING_MAX_LINES))
    assert not long_docstrings([path])
