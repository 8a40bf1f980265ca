"""The package's structure stays true (docs/architecture.md): imports only go down the layers, no import cycles,
function-level imports of hfexport's own modules only where they defer torch, one place for engine internals, and
docs/parity.md's threshold table matches the thresholds module."""

import ast
import importlib
import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
PACKAGE = ROOT / "library" / "hfexport"


def _layer_map() -> list[tuple[str, list[str]]]:
    """docs/architecture.md's layer map (its ```layers block), bottom to top: [(layer, module paths)]. A line that
    starts with spaces continues the layer above."""
    text = (ROOT / "docs" / "architecture.md").read_text()
    block = re.search(r"^```layers\n(.*?)^```", text, re.S | re.M)
    assert block, "docs/architecture.md has no ```layers block (the layer map this test enforces)"
    layers: list[tuple[str, list[str]]] = []
    for line in block.group(1).splitlines():
        if line.startswith(" ") and layers:
            layers[-1][1].extend(line.split())
        elif line.strip():
            name, _, paths = line.partition(":")
            layers.append((name.strip(), paths.split()))
    return layers[::-1]


# Bottom to top, as docs/architecture.md's layer map draws them. A module may import from its own layer or any below;
# a `*` stands for one name (any format's package), and the most specific entry names a module's layer.
LAYERS = _layer_map()
# The modules that import torch (through the engine) when imported: lighter modules import them inside functions,
# so that `import hfexport`, the CLI and the Space start without torch.
DEFERRED = {"export", "exported", "generate", "formats.onnx.file_runner", "formats.onnx.file_component"}
# The CLI imports what each command runs: the job stack inside the commands that run it, so that `validate` and
# `show` (the recipe only) start without it (tests/test_cli_imports.py).
DEFERRED_IN = {"surfaces.cli": ("job", "publication", "report", "surfaces.ci")}


def _deferred(module: str, target: str) -> bool:
    return target in DEFERRED or any(target == prefix or target.startswith(prefix + ".")
                                     for prefix in DEFERRED_IN.get(module, ()))


def _modules() -> dict[str, Path]:
    found = {}
    for path in PACKAGE.rglob("*.py"):
        parts = path.relative_to(PACKAGE).with_suffix("").parts
        name = ".".join(parts[:-1] if parts[-1] == "__init__" and len(parts) > 1 else parts)
        found[name] = path
    return found


def _layer(module: str) -> int:
    """The layer of the most specific LAYERS entry that `module` is in (or under): the most names, then the fewest `*`."""
    best = None
    names = module.split(".")
    for index, (_, prefixes) in enumerate(LAYERS):
        for prefix in prefixes:
            parts = prefix.split(".")
            if len(parts) <= len(names) and all(part in ("*", name) for part, name in zip(parts, names)):
                rank = (len(parts), -parts.count("*"))
                if best is None or rank > best[1]:
                    best = (index, rank)
    assert best is not None, f"hfexport.{module} is in no layer: add it to LAYERS and docs/architecture.md"
    return best[0]


def _imports(module: str, path: Path) -> list[tuple[str, bool, int]]:
    """(imported hfexport module, at function level?, line) for every import of hfexport's own modules."""
    tree = ast.parse(path.read_text())
    top = {id(node) for node in tree.body}
    modules = _modules()
    found = []
    for node in ast.walk(tree):
        if not isinstance(node, ast.ImportFrom):
            continue
        if node.level:
            base = module.split(".")[:-1] if path.name != "__init__.py" else module.split(".")
            base = base[: len(base) - node.level + 1]
            target = ".".join(base + ([node.module] if node.module else []))
        elif (node.module or "").split(".")[0] == "hfexport":
            target = node.module.removeprefix("hfexport").removeprefix(".")
        else:
            continue
        for alias in node.names:  # `from hfexport.job import propose` imports the module hfexport.job.propose
            name = f"{target}.{alias.name}" if target else alias.name
            found.append((name if name in modules else target or "__init__", id(node) not in top, node.lineno))
    return found


def test_every_import_goes_down_the_layers_and_defers_only_torch():
    problems = []
    for module, path in _modules().items():
        for target, nested, line in _imports(module, path):
            where = f"hfexport/{path.relative_to(PACKAGE)}:{line}"
            if _layer(target) > _layer(module):
                problems.append(f"{where}: {module} ({LAYERS[_layer(module)][0]}) imports {target} "
                                f"({LAYERS[_layer(target)][0]}), a layer above")
            if nested and not _deferred(module, target) and not module.startswith(("testing", "__init__")):
                problems.append(f"{where}: function-level import of {target}; only {sorted(DEFERRED)} (torch) are "
                                f"deferred, and in the CLI the job stack ({DEFERRED_IN})")
    assert not problems, "\n".join(problems)


def test_no_import_cycles():
    graph = {module: {target for target, _, _ in _imports(module, path) if target != module}
             for module, path in _modules().items()}
    index, low, stack, on_stack, cycles = {}, {}, [], set(), []

    def visit(node):  # Tarjan's strongly connected components
        index[node] = low[node] = len(index)
        stack.append(node)
        on_stack.add(node)
        for successor in graph.get(node, ()):
            if successor not in index:
                visit(successor)
                low[node] = min(low[node], low[successor])
            elif successor in on_stack:
                low[node] = min(low[node], index[successor])
        if low[node] == index[node]:
            component = set()
            while True:
                member = stack.pop()
                on_stack.discard(member)
                component.add(member)
                if member == node:
                    break
            if len(component) > 1:
                cycles.append(sorted(component))

    for node in graph:
        if node not in index:
            visit(node)
    assert not cycles, cycles


def test_the_checker_sees_a_cycle_and_an_upward_import(tmp_path, monkeypatch):
    """The two tests above can fail: an upward import from errors.py and a cycle it makes are both reported."""
    fake = tmp_path / "hfexport"
    (fake / "job").mkdir(parents=True)
    (fake / "errors.py").write_text("from hfexport.job.run import run_job\n")
    (fake / "job" / "__init__.py").write_text("")
    (fake / "job" / "run.py").write_text("from hfexport.errors import HfExportError\n")
    monkeypatch.setattr(__import__(__name__), "PACKAGE", fake)
    with pytest.raises(AssertionError, match="imports job.run"):
        test_every_import_goes_down_the_layers_and_defers_only_torch()
    with pytest.raises(AssertionError, match="errors"):
        test_no_import_cycles()


def test_engine_internals_are_named_once_and_still_exist():
    """Every engine internal hfexport uses is listed in hfexport.engine and still exists in the installed engine;
    no other module imports from the engine's submodules (its public names come from `transformers.exporters`)."""
    from hfexport.workarounds import transformers_exporters as engine

    for name, (module, attribute) in engine.INTERNALS.items():
        assert hasattr(importlib.import_module(module), attribute), (
            f"{module}.{attribute} is gone from the engine (hfexport.workarounds.transformers_exporters checked it "
            f"with {engine.CHECKED_WITH})")
    public_utils = "transformers.exporters.utils import (decompose_for_generation|get_leaf_tensors|prepare_for_export)"
    offenders = []
    for module, path in _modules().items():
        if module in ("engine", "workarounds.transformers_exporters", "logs", "__init__") or module.startswith("testing"):
            continue
        for number, line in enumerate(path.read_text().splitlines(), start=1):
            if re.search(r"from transformers\.exporters\.\w+", line) and not re.search(public_utils, line):
                offenders.append(f"hfexport/{path.relative_to(PACKAGE)}:{number}: {line.strip()}")
    assert not offenders, "engine internals outside hfexport.engine:\n" + "\n".join(offenders)


def test_parity_doc_table_matches_the_thresholds_module():
    """docs/parity.md's default-threshold table is the thresholds module's values, row by row."""
    from hfexport.verify.thresholds import default_parity, default_tolerance

    text = (ROOT / "docs" / "parity.md").read_text()
    rows = {}
    for line in text.splitlines():
        cells = [cell.strip() for cell in line.strip().strip("|").split("|")]
        if len(cells) == 5 and cells[0] and cells[0] != "artifact" and not set(cells[1]) <= {"-"}:
            if all(re.fullmatch(r"—|[0-9.e-]+", cell) for cell in cells[1:]):
                rows[cells[0]] = tuple(None if cell == "—" else float(cell) for cell in cells[1:])
    keys = ("atol", "rtol", "min_cosine", "min_top1")

    def row(thresholds):
        return tuple(None if thresholds[key] is None else float(thresholds[key]) for key in keys)

    expected = {
        "dynamo (`.pt2`), float32": row(default_tolerance("dynamo")),
        "onnx, openvino, executorch, float32": row(default_tolerance("onnx")),
        "openvino with `compress_to_fp16`": row(default_tolerance("openvino", options={"compress_to_fp16": True})),
        "any format, float16 / bfloat16": row(default_tolerance("onnx", "float16")),
        "quantized target, 8-bit (`quantization` set)": row(default_parity("ort_dynamic", "forward")),
        "quantized target, low-bit weights (int4, nf4, ...)": row(default_parity("nncf_weights", "forward",
                                                                                 {"mode": "int4_sym"})),
        "a float32 graph that the runtime runs at **bf16** (OpenVINO; see below)":
            row(default_tolerance("openvino", precision="bf16")),
        "a float32 graph that the runtime runs at **f16** (OpenVINO)": row(default_tolerance("openvino", precision="f16")),
        "an ONNX target converted to float16 (`dtype`) from a float32 model":
            row(default_tolerance("onnx", "float16", precision="f16")),
    }
    for fmt in ("openvino", "executorch"):
        assert default_tolerance(fmt) == default_tolerance("onnx")
    assert rows == expected


FORMAT_NAMES = {"onnx", "openvino", "executorch", "dynamo"}


def _format_name_branches(path: Path) -> list[str]:
    """Where a module compares a value with a format's name (`== "onnx"`, `in ("onnx", "openvino")`, a `case "onnx"`)
    or keeps a table keyed by format names: what the format's backend should be asked instead."""
    def names_a_format(node) -> bool:
        items = node.elts if isinstance(node, (ast.Tuple, ast.List, ast.Set)) else [node]
        return any(isinstance(item, ast.Constant) and item.value in FORMAT_NAMES for item in items)

    found = []
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Compare) and any(map(names_a_format, [node.left, *node.comparators])):
            found.append(f"{node.lineno}: a comparison with a format's name")
        elif isinstance(node, ast.Dict) and any(key is not None and names_a_format(key) for key in node.keys):
            found.append(f"{node.lineno}: a table keyed by format names")
        elif isinstance(node, ast.MatchValue) and names_a_format(node.value):
            found.append(f"{node.lineno}: a case on a format's name")
    return found


def test_no_branch_on_a_format_name_outside_formats():
    """Outside `hfexport/formats/` (and the test helpers), nothing branches on a format's name: the job, the gate, the
    report, publication and verify ask the format's backend (`hfexport.formats`) instead."""
    problems = [f"hfexport/{path.relative_to(PACKAGE)}:{line}"
                for module, path in _modules().items() if not module.startswith(("formats", "testing"))
                for line in _format_name_branches(path)]
    assert not problems, "branches on a format's name outside hfexport.formats:\n" + "\n".join(problems)


def test_the_format_name_check_sees_each_form(tmp_path):
    """The check above fails on a comparison, a membership test, a table keyed by format names and a match case."""
    source = tmp_path / "module.py"
    source.write_text('if fmt == "onnx":\n    pass\nok = fmt in ("openvino", "x")\nT = {"dynamo": 1}\n'
                      'match fmt:\n    case "executorch":\n        pass\nfine = fmt == "tflite" or {"a": "onnx"}\n')
    assert sorted(int(line.split(":")[0]) for line in _format_name_branches(source)) == [1, 3, 4, 6]


def test_the_layer_table_names_the_layers_of_the_map():
    """docs/architecture.md's layer table has one row per layer of the map this test enforces, in its order."""
    text = (ROOT / "docs" / "architecture.md").read_text()
    table = text[text.index("| layer | modules | what it holds |"):].split("\n\n", 1)[0].splitlines()[2:]
    assert [row.split("|")[1].strip() for row in table] == [name for name, _ in reversed(LAYERS)]


def test_a_format_package_imports_no_other_format_package():
    """One home per format: `formats/<format>/` imports its own package and what every format shares (`formats`,
    `formats.backend`, layers below), never another format's package; what two formats share moves down a layer."""
    formats = {path.parent.name for path in (PACKAGE / "formats").glob("*/backend.py")}
    problems = []
    for module, path in _modules().items():
        parts = module.split(".")
        if len(parts) < 2 or parts[0] != "formats" or parts[1] not in formats:
            continue
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.ImportFrom) and node.module and node.module.startswith("hfexport.formats."):
                other = node.module.split(".")[2]
                if other in formats and other != parts[1]:
                    problems.append(f"hfexport.{module}:{node.lineno} imports {node.module}")
    assert not problems, "a format's package imports another's:\n" + "\n".join(problems)
