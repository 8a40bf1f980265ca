"""Nothing of an export's trace stays alive once hfexport's export returns (issue 45: what the export leaves counts
beside the gate's eager reference and the artifact's runtime): torch's holders of its last trace
(`hfexport.workarounds.torch_export`) and onnxscript's rewrite matchers (`formats.onnx.onnxscript_workarounds`) let
go, each with its canary (the upstream behaviour the release works around, still there)."""

import gc
import logging
import weakref

import pytest
import torch

from hfexport.formats.onnx.onnxscript_workarounds import onnx_fixes
from hfexport.workarounds.torch_export import trace_state_released


class _Doubler(torch.nn.Module):
    def forward(self, x):
        return (x * 2).sum(dim=-1)


def _export_tiny():
    """A non-strict torch.export of a two-op module with a dynamic axis: the program and (weakly) its ShapeEnv."""
    batch = torch.export.Dim("batch", min=2, max=16)
    program = torch.export.export(_Doubler(), (torch.ones(4, 3),), dynamic_shapes=({0: batch},), strict=False)
    fake = next(node.meta["val"] for node in program.graph.nodes if node.op == "placeholder")
    return program, weakref.ref(fake.fake_mode.shape_env)


def test_torch_export_still_keeps_its_last_trace():
    """Canary of `torch-export-keeps-its-last-trace`: once the program is dropped and collected, torch 2.13 still
    holds its trace (the fake-tensor id -> node map) and its ShapeEnv (the class's caches, the tracked fakes' C++
    cycle). Fails once torch lets them go itself: the workaround can then go."""
    from torch.fx.experimental import proxy_tensor

    program, shape_env = _export_tiny()
    graph = weakref.ref(program.graph)
    del program
    gc.collect()
    assert proxy_tensor._FAKE_TENSOR_ID_TO_PROXY_MAP_FOR_EXPORT, "torch no longer keeps the last trace's nodes"
    assert graph() is not None and shape_env() is not None, "torch lets the last trace go by itself"


def test_an_export_inside_the_release_leaves_neither_its_graph_nor_its_shape_env():
    import linecache

    from torch.fx.experimental import proxy_tensor

    linecache.cache["<made at run time>"] = (3, None, ["x = 1\n"], "<made at run time>")
    with trace_state_released():
        program, shape_env = _export_tiny()
        linecache.getlines(torch.export.__file__)
    # the source files read dropped (read again from disk when asked for), a source made at run time kept
    assert torch.export.__file__ not in linecache.cache and "<made at run time>" in linecache.cache
    assert linecache.getline(torch.export.__file__, 1)
    graph = weakref.ref(program.graph)
    assert shape_env() is not None  # the program it made is still the caller's, whole
    assert program.module()(torch.ones(5, 3)).tolist() == [6.0] * 5
    del program
    gc.collect()
    gc.collect()  # the first pass frees fake tensors whose C++ sizes held the ShapeEnv's symbolic nodes
    assert not proxy_tensor._FAKE_TENSOR_ID_TO_PROXY_MAP_FOR_EXPORT
    assert graph() is None and shape_env() is None


def _no_op_cast_model():
    import onnx
    import onnx_ir

    nodes = [onnx.helper.make_node("Cast", ["x"], ["y"], to=onnx.TensorProto.FLOAT),
             onnx.helper.make_node("Relu", ["y"], ["z"])]
    graph = onnx.helper.make_graph(nodes, "g", [onnx.helper.make_tensor_value_info("x", onnx.TensorProto.FLOAT, [2])],
                                   [onnx.helper.make_tensor_value_info("z", onnx.TensorProto.FLOAT, [2])])
    return onnx_ir.from_proto(onnx.helper.make_model(graph, opset_imports=[onnx.helper.make_opsetid("", 18)]))


def _rewrite(model):
    from onnxscript import rewriter
    from onnxscript.rewriter.rules.common import _basic_rules

    rule = _basic_rules.no_op_cast_rule  # module-level, as the optimizer's default rules
    rewriter.rewrite(model, pattern_rewrite_rules=[rule])
    return rule


def test_onnxscript_matchers_still_keep_the_last_graph():
    """Canary of `onnxscript-matcher-keeps-the-last-graph`: after a rewrite, onnxscript 0.7.2's module-level rule
    still holds the graph it last matched. Fails once onnxscript forgets it itself: the workaround can then go."""
    pytest.importorskip("onnxscript")
    model = _no_op_cast_model()
    rule = _rewrite(model)
    assert vars(rule._matcher).get("_graph") is model.graph, "onnxscript's matcher no longer keeps the last graph"


def test_onnx_fixes_make_the_matchers_forget_the_graph():
    pytest.importorskip("onnxscript")
    model, reference = _no_op_cast_model(), _no_op_cast_model()
    _rewrite(reference)
    with onnx_fixes():
        rule = _rewrite(model)
    assert [node.op_type for node in model.graph] == [node.op_type for node in reference.graph] != ["Cast", "Relu"]
    graph = weakref.ref(model.graph)
    assert vars(rule._matcher).get("_graph") is None and vars(rule._matcher).get("_current_node") is None
    del model, reference
    gc.collect()
    assert graph() is None


def _traces_left(model, target: str, monkeypatch) -> list[str]:
    """hfexport's export (`run_plan`) of `target` of the example `model`, dropped: the fx GraphModules and ShapeEnvs
    its traces made that are still alive once collected."""
    from torch.fx.experimental.symbolic_shapes import ShapeEnv

    from hfexport.export import AutoHfExporter

    made: list[weakref.ref] = []
    for cls in (ShapeEnv, torch.fx.GraphModule):
        original = cls.__init__

        def noted(self, *args, _original=original, **kwargs):
            _original(self, *args, **kwargs)
            made.append(weakref.ref(self))

        monkeypatch.setattr(cls, "__init__", noted)
    exporter = AutoHfExporter.from_pretrained(model, target=target)
    disabled = logging.root.manager.disable
    # pytest keeps the test's log records: a warning logged with its traceback during the export would hold the
    # export's frames (not so in a job: its handlers keep no record)
    logging.disable(logging.WARNING)
    try:
        exported = exporter.export()
    finally:
        logging.disable(disabled)
    assert exported.components and made
    del exported
    gc.collect()
    gc.collect()  # the first pass frees fake tensors whose C++ sizes held the ShapeEnv's symbolic nodes
    return [type(reference()).__name__ for reference in made if reference() is not None]


@pytest.mark.parametrize("target", ["onnx", pytest.param("openvino", marks=pytest.mark.slow)])
def test_an_export_leaves_no_graph_and_no_shape_env_once_dropped(tiny_bert, target, monkeypatch):
    """Once the exported model is dropped, every fx GraphModule and ShapeEnv its traces made is collected (none kept
    by torch's or onnxscript's state): tiny-bert's forward targets."""
    alive = _traces_left(tiny_bert, target, monkeypatch)
    assert not alive, f"still alive after the export was dropped: {alive}"


@pytest.mark.slow
@pytest.mark.parametrize("target", ["onnx-generation", "openvino-generation"])
def test_tiny_llamas_generation_export_leaves_no_graph_and_no_shape_env_once_dropped(tiny_llama, target, monkeypatch):
    alive = _traces_left(tiny_llama, target, monkeypatch)
    assert not alive, f"still alive after the export was dropped: {alive}"
