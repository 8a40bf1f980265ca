""".pt2 programs whose strings torch 2.13 turns into code are refused before torch reads them.

`guards_code` is compiled with `exec` by `ExportedProgram.module()`, symbolic expressions are parsed by
`sympy.sympify` (which evaluates Python) at `torch.export.load`: a crafted `models/model.json` runs code even when
every pickle in the archive is inert. Each control test shows the crafted archive does run its payload under the
engine's own loader; hfexport refuses the same archive and the marker is never created.
"""

from __future__ import annotations

import json
import shutil
import uuid
import zipfile
from pathlib import Path

import pytest
from hfexport.errors import UnsafeExportError
from hfexport.formats.torch_export.pt2_safety import check_pt2_program


@pytest.fixture
def pt2_folder(exported_bert, tmp_path) -> Path:
    output, _ = exported_bert
    folder = tmp_path / "pt2"
    shutil.copytree(output / "pt2", folder)
    return folder


@pytest.fixture
def marker(tmp_path) -> Path:
    return tmp_path / f"pwned-{uuid.uuid4().hex[:8]}"


def _edit_program(archive: Path, edit) -> None:
    """Rewrite `*/models/model.json` of a .pt2 archive with `edit(document)`."""
    with zipfile.ZipFile(archive) as source:
        items = [(info, source.read(info.filename)) for info in source.infolist()]
    with zipfile.ZipFile(archive, "w") as target:
        for info, data in items:
            if info.filename.endswith("/models/model.json"):
                document = json.loads(data)
                edit(document)
                data = json.dumps(document).encode()
            target.writestr(info, data)


def _inputs():
    import torch

    return {"input_ids": torch.ones(1, 5, dtype=torch.long), "attention_mask": torch.ones(1, 5, dtype=torch.long)}


def _guard_payload(marker: Path):
    def edit(document):
        guards = document["guards_code"]
        assert guards, "the export has no guards to tamper with"
        guards[0] = f"__import__('os').mkdir({str(marker)!r}) or ({guards[0]})"
    return edit


def _expression_payload(marker: Path):
    def edit(document):
        for node in _dicts(document):
            if isinstance(node.get("expr_str"), str) and node["expr_str"].startswith("Symbol("):
                node["expr_str"] = f"(__import__('os').mkdir({str(marker)!r}), {node['expr_str']})[1]"
                return
        raise AssertionError("the export has no symbolic expression to tamper with")
    return edit


def _dicts(value):
    stack = [value]
    while stack:
        current = stack.pop()
        if isinstance(current, dict):
            yield current
            stack.extend(current.values())
        elif isinstance(current, list):
            stack.extend(current)


@pytest.mark.parametrize("payload", [_guard_payload, _expression_payload], ids=["guards_code", "expr_str"])
def test_control_the_engine_runs_the_crafted_program(pt2_folder, marker, payload):
    from transformers.exporters import ExportedModel as EngineExportedModel

    _edit_program(pt2_folder / "model.pt2", payload(marker))
    EngineExportedModel.from_pretrained(pt2_folder)(**_inputs())
    assert marker.exists()


@pytest.mark.parametrize(("payload", "expected"), [(_guard_payload, r"guards_code\[0\]: refusing the guard"),
                                                    (_expression_payload, "expr_str: refusing the symbolic")],
                         ids=["guards_code", "expr_str"])
def test_hfexport_refuses_the_crafted_program_and_nothing_runs(pt2_folder, marker, payload, expected, hub):
    import hfexport

    _edit_program(pt2_folder / "model.pt2", payload(marker))
    with pytest.raises(UnsafeExportError, match=expected):
        hfexport.ExportedModel.from_pretrained(pt2_folder)
    repo = f"user/pt2-{uuid.uuid4().hex[:8]}"
    hub.seed_repo(repo, {f"exports/pt2/{p.name}": p.read_bytes() for p in pt2_folder.iterdir()})
    with pytest.raises(UnsafeExportError, match="model/models/model.json"):
        hfexport.load(repo, target="pt2")
    assert not marker.exists()


def test_real_programs_pass_and_still_load(exported_bert):
    import hfexport

    output, _ = exported_bert
    model = hfexport.load(output, target="pt2")
    assert model(**_inputs()).last_hidden_state.shape[:2] == (1, 5)


def _program(**fields) -> dict:
    base = {"graph_module": {"graph": {"nodes": [{"target": "torch.ops.aten.add.Tensor"},
                                                 {"target": "torch.ops.aten.__and__.Tensor"},
                                                 {"target": "_operator.getitem"},
                                                 {"target": "torch.ops.higher_order.cond"}]}},
            "range_constraints": {"s43": {"min_val": 1, "max_val": 8}},
            "guards_code": ["L['input_ids'].size()[1] == L['attention_mask'].size()[1]",
                            "min(16 + 16*L['past_key_values'][0].size()[2], 32) == 32"]}
    base.update(fields)
    return base


def test_what_torch_export_writes_passes():
    check_pt2_program(_program(), "a.pt2", "model/models/model.json")


def test_a_relation_between_unbacked_sizes_passes():
    """torch 2.13 names sympy's relational class (`Equality`, what `Eq` builds) for a relation between unbacked
    sizes: Idefics3's image encoder, whose boolean image index makes the image count data-dependent."""
    expression = "Equality(Symbol('u1', integer=True), Symbol('u0', integer=True))"
    program = _program(graph_module={"graph": {"nodes": [], "sym_bool_values": {"eq_12": {"as_expr": {
        "expr_str": expression}}}}})
    check_pt2_program(program, "a.pt2", "model/models/model.json")


@pytest.mark.parametrize(
    ("fields", "expected"),
    [
        ({"graph_module": {"graph": {"nodes": [{"target": "torch.os.system"}]}}}, "call target 'torch.os.system'"),
        ({"graph_module": {"graph": {"nodes": [{"target": "torch.ops.aten.__class__.__init__"}]}}}, "__class__"),
        ({"graph_module": {"graph": {"nodes": [{"target": "builtins.exec"}]}}}, "builtins.exec"),
        ({"graph_module": {"graph": {"nodes": [{"target": "_operator.attrgetter"}]}}}, "attrgetter"),
        ({"guards_code": ["L['x'].size()[0] == 1 or exec('import os')"]}, "refusing the guard"),
        ({"guards_code": ["L['x\"); import os; (\"'].size()[0] == 1"]}, "refusing the guard"),
        ({"guards_code": ["L['x'].__class__ == 1"]}, "refusing the guard"),
        ({"range_constraints": {"__import__('os').getpid()": {}}}, "refusing the symbolic expression"),
        ({"graph_module": {"graph": {"nodes": [{"expr_str": "Symbol('s1').__class__"}]}}}, "symbolic expression"),
        ({"graph_module": {"graph": {"nodes": [{"expr_str": "eval(chr(49))"}]}}}, "symbolic expression"),
        ({"graph_module": {"signature": {"out_spec": json.dumps(
            [1, {"type": "os.system", "context": "null", "children_spec": []}])}}}, "'os.system'"),
    ],
)
def test_code_like_strings_outside_the_grammar_are_refused(fields, expected):
    with pytest.raises(UnsafeExportError, match=expected) as error:
        check_pt2_program(_program(**fields), "a.pt2", "model/models/model.json")
    assert str(error.value).startswith("a.pt2: model/models/model.json")
