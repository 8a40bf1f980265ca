"""onnxscript's multi-output pattern matcher must not scan the whole graph for every node (hfexport.formats.onnx.onnxscript_workarounds).

onnxscript 0.7.2's `SlicesSplit` rule indexed every node of the graph by op type before looking at the node it was
asked about, once per node: the optimizer's rewrite pass was quadratic in the graph's size (minutes on a 30-layer
decoder; benchmarks/onnx_optimizer.py). With the fix a node whose op cannot start the pattern is answered at once,
and the optimized graph is the same."""

import pytest

pytest.importorskip("onnxscript")

import onnx_ir as ir  # noqa: E402
import onnxscript.optimizer  # noqa: E402

from hfexport.formats.onnx.onnxscript_workarounds import onnx_fixes  # noqa: E402


@pytest.fixture(scope="module")
def unoptimized() -> bytes:
    """Llama's `rotate_half` as two 4-input slices of one value (what `SlicesSplit` turns into one `Split`), then a
    chain of 30 elementwise nodes, so that the graph has many nodes that are no Slice."""
    import numpy as np
    from onnx import TensorProto, helper, numpy_helper

    constants = {name: numpy_helper.from_array(np.array(value, dtype=np.int64), name)
                 for name, value in {"zero": [0], "half": [4], "end": [8], "last": [-1]}.items()}
    nodes = [helper.make_node("Slice", ["x", "zero", "half", "last"], ["first"]),
             helper.make_node("Slice", ["x", "half", "end", "last"], ["second"]),
             helper.make_node("Neg", ["second"], ["negated"]),
             helper.make_node("Concat", ["negated", "first"], ["h0"], axis=-1)]
    nodes += [helper.make_node("Mul" if index % 2 else "Add", [f"h{index}", f"h{index}"], [f"h{index + 1}"])
              for index in range(30)]
    graph = helper.make_graph(nodes, "rotate_half", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [2, 3, 8])],
                              [helper.make_tensor_value_info("h30", TensorProto.FLOAT, [2, 3, 8])],
                              initializer=list(constants.values()))
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 18)]).SerializeToString()


def _optimized(serialized: bytes, scans: list[int]) -> bytes:
    """Optimize a copy with onnxscript's default passes, counting how often a whole graph is iterated."""
    import onnx

    model = ir.serde.deserialize_model(onnx.load_from_string(serialized))
    original = ir.Graph.__iter__

    def counted(self):
        scans.append(1)
        return original(self)

    ir.Graph.__iter__ = counted
    try:
        onnxscript.optimizer.optimize_ir(model)
    finally:
        ir.Graph.__iter__ = original
    return ir.serde.serialize_model(model).SerializeToString()


def test_the_fix_keeps_the_optimized_graph_and_drops_the_per_node_scans(unoptimized):
    plain_scans, fixed_scans = [], []
    plain = _optimized(unoptimized, plain_scans)
    with onnx_fixes():
        fixed = _optimized(unoptimized, fixed_scans)
    assert fixed == plain
    import onnx

    nodes = len(onnx.load_from_string(unoptimized).graph.node)
    # Without the fix the SlicesSplit rule scans the graph once per node it visits (every node, every iteration).
    assert len(plain_scans) - len(fixed_scans) >= nodes - 2


def test_the_pattern_still_matches_where_its_first_node_can(unoptimized):
    import onnx
    from onnxscript import rewriter

    model = ir.serde.deserialize_model(onnx.load_from_string(unoptimized))
    rule = next(rule for rule in rewriter._DEFAULT_REWRITE_RULES if rule.name == "SlicesSplit")
    graph = model.graph
    by_op = {node.op_type: node for node in reversed(list(graph))}
    with onnx_fixes():
        assert rule._matcher.match(model, graph, by_op["Slice"])  # a Slice goes on to the graph-wide matching
        assert not rule._matcher.match(model, graph, by_op["Neg"])  # a Neg is answered at once


def test_the_fix_is_undone_after_the_block():
    from onnxscript.rewriter import _matcher

    before = _matcher.SimplePatternMatcher.match
    with onnx_fixes():
        assert _matcher.SimplePatternMatcher.match is not before
    assert _matcher.SimplePatternMatcher.match is before
