"""A narrow fix of the ONNX optimizer's cost, applied around the engine's ONNX export (`onnx_fixes()`).

onnxscript 0.7.2: `torch.onnx.export(..., optimize=True)`, which the engine calls for every ONNX component, runs
`onnxscript.optimizer.optimize_ir`, whose rewrite pass tries each default rule on each node of the graph. For a
rule whose pattern has more than one output node (`SlicesSplit`: two `Slice`s of one value into one `Split`),
`SimplePatternMatcher.match` first indexes every node of the graph by op type and only then finds that the node it
was given is not a `Slice`. That is a full scan of the graph per node, so the pass is quadratic in the graph's size:
on SmolLM2-135M's architecture it is most of the optimizer's time at 12 layers and grows to minutes at 30
(benchmarks/onnx_optimizer.py). The fix answers "no match" before that scan when the node's op cannot be the
pattern's first output node, which is the first thing the scan's every combination would check; the optimized
graph is the same (benchmarks/onnx_optimizer.py and tests/test_onnx_fixes.py compare them).

Noticed on the way: in 0.7.2 that rule never rewrites anything. The matcher returns the first combination that
matches structurally, which pairs a `Slice` with itself, and the rule's check then fails ("End0 is not equal to
Begin1") without another combination being tried; the engine's graphs keep their two `Slice`s either way.

And a release of what the rewrite pass leaves (`forget_matched`, on leaving `onnx_fixes()`): each rule's matcher keeps
the graph, node and match it last tried, and the default rules are module-level objects, so after an export the
last graph the optimizer rewrote stayed alive, and through its nodes' metadata the fx graph it was translated from
(SmolLM2-135M-Instruct: its 2,157-node graph and, with torch's own holders, `hfexport.workarounds.torch_export`, the
35,456-node fx graph, at the gate's start; docs/publishing.md, "Memory").
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator

from hfexport.workarounds import workaround


@workaround(
    "onnxscript-multi-output-matcher",
    upstream="onnxscript 0.7.2",
    works_around="(cost) SimplePatternMatcher indexes the whole graph for every node before checking its op, "
                 "so the optimizer's rewrite pass is quadratic in the graph's size",
    applied="export._format_fixes, around every ONNX export (onnx_fixes)",
    canary="tests/test_onnx_fixes.py::test_the_fix_keeps_the_optimized_graph_and_drops_the_per_node_scans")
@contextlib.contextmanager
def onnx_fixes() -> Iterator[None]:
    """Within the block, onnxscript's multi-output pattern matcher skips nodes its pattern cannot start from; on
    leaving, the matchers that ran forget what they last matched (`forget_matched`)."""
    try:
        from onnxscript.rewriter import _basics, _matcher

        matcher = _matcher.SimplePatternMatcher
        original = matcher.match
    except (ImportError, AttributeError):  # another onnxscript layout: its matcher runs unchanged
        yield
        return

    used = {}  # the matchers that ran in the block, by id

    def match(self, model, graph_or_function, node, **kwargs):
        used[id(self)] = self
        if not self.pattern.has_single_output_node:
            # The op and domain test `NodePattern.matches` applies first to the combination's first node.
            first = self.pattern.output_nodes[0]
            if not (first.op.matches(node.op_type) and first.domain.matches(node.domain)):
                return _basics.MatchResult().fail("No match found.")
        return original(self, model, graph_or_function, node, **kwargs)

    matcher.match = match
    try:
        yield
    finally:
        matcher.match = original
        forget_matched(used.values())


@workaround(
    "onnxscript-matcher-keeps-the-last-graph",
    upstream="onnxscript 0.7.2",
    works_around="(memory) a rewrite rule's SimplePatternMatcher keeps the graph, node and match it last tried, "
                 "and the default rules are module-level: after an export the last graph the optimizer rewrote "
                 "stays alive, and through its nodes' metadata the fx graph it was translated from",
    applied="export._format_fixes, on leaving every ONNX export (onnx_fixes)",
    canary="tests/test_export_leftovers.py::test_onnxscript_matchers_still_keep_the_last_graph")
def forget_matched(matchers) -> None:
    """Each of `matchers` (onnxscript pattern matchers) made to forget its last graph, node and match, as it does
    itself before its next match."""
    for matcher in matchers:
        state = vars(matcher)
        for name in ("_graph", "_current_node", "_tracer"):
            if name in state:
                state[name] = None
        if "_match" in state:
            state["_match"] = type(state["_match"])()
