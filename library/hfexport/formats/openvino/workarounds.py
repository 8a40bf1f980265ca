"""Two narrow fixes for OpenVINO 2026.4.1's CPU plugin.

`copy_returned_inputs` (runners whose output is one of their inputs are called with copies: the plugin
corrupts the heap otherwise) and `fuse_ready_cache_broadcasts` (a stateful cache's repeat put back in the form
the plugin's fused KV-cache attention matches). Why, the figures and the canaries: docs/workarounds.md,
"OpenVINO's CPU plugin".
"""

from __future__ import annotations

import functools

from hfexport.engine import runner_class
from hfexport.workarounds import workaround


@workaround(
    "openvino-returned-shared-input",
    upstream="openvino 2026.4.1 (CPU plugin)",
    works_around="a program that returns one of its inputs keeps the caller's shared input buffer bound and "
                 "writes through it once freed (heap corruption, SIGSEGV); such runners always copy their inputs",
    applied="exported.ExportedModel.to, where the runners are made: ExportedModel.__call__, runners[...] and "
            "generate are all covered",
    canary="tests/test_generate_seq2seq.py::test_openvino_corrupts_the_heap_through_a_returned_shared_input")
def copy_returned_inputs(runners: dict) -> None:
    """Replace, in place, each OpenVINO runner whose program returns one of its inputs by one that always copies its
    inputs (over the same compiled program)."""
    for name, runner in runners.items():
        if returns_an_input(runner) and not isinstance(runner, _input_copying_runner()):
            runners[name] = _input_copying_runner()(runner.compiled_model, runner.metadata)


def returns_an_input(runner) -> bool:
    """Whether an OpenVINO runner's compiled program has an output fed straight by an input: in the plugin's runtime
    model, that output's `Result` follows a `Parameter`. False for a runner of another backend; True (copy, the safe
    side) when the device's plugin cannot show its runtime model."""
    compiled = getattr(runner, "compiled_model", None)
    if compiled is None or not hasattr(compiled, "get_runtime_model"):
        return False
    try:
        results = compiled.get_runtime_model().get_results()
    except RuntimeError:
        return True
    return any(result.input_value(0).get_node().get_type_name() == "Parameter" for result in results)


@functools.cache
def _input_copying_runner() -> type:
    """The engine's OpenVINO runner, called with `share_inputs=False` always (built on first use: the engine's
    runner module imports openvino)."""

    class InputCopyingOpenVINORunner(runner_class("openvino")):
        """The engine's OpenVINO runner for a program that returns one of its inputs: its inputs are always copied
        into the request's own tensors (hfexport.formats.openvino.workarounds: OpenVINO 2026.4.1 writes through a freed shared
        input)."""

        def __call__(self, share_inputs: bool = True, share_outputs: bool = False, **kwargs):
            return super().__call__(share_inputs=False, share_outputs=share_outputs, **kwargs)

    return InputCopyingOpenVINORunner


@workaround(
    "openvino-fused-kv-cache-attention",
    upstream="transformers 5.23.0 (exporters: _use_numpy_broadcasts) with openvino 2026.4.1 (CPU plugin: "
             "StatefulSDPAFusion)",
    works_around="(cost) the engine makes repeat_kv's bidirectional Broadcast numpy, which the CPU plugin's fused "
                 "KV-cache attention does not match: a grouped-query stateful decode ran every attention unfused "
                 "(optimum-intel's runtime, GenAI's SDPA backend, hfexport's generate); put back between the "
                 "cache and the SDPA only",
    applied="export.run_plan, on every OpenVINO program the engine exports (fuse_ready_cache_broadcasts)",
    canary="tests/test_deployment_llm.py::test_the_engines_own_stateful_decode_compiles_to_unfused_attention")
def fuse_ready_cache_broadcasts(program) -> int:
    """Put back, in place, the bidirectional `Broadcast` of each key/value repeat between a stateful cache (ReadValue,
    an optional Convert, Gather, Concat, Unsqueeze) and a `ScaledDotProductAttention` that transformers 5.23's OpenVINO
    exporter made numpy (see the module docstring); the number replaced. Not an `openvino.Model`, or no such
    pattern: 0, the program unchanged."""
    try:
        import openvino
        import openvino.opset13 as ops
    except ImportError:  # pragma: no cover - no OpenVINO, no OpenVINO program
        return 0
    if not isinstance(program, openvino.Model):
        return 0
    replaced = 0
    for attention in program.get_ordered_ops():
        if attention.get_type_name() != "ScaledDotProductAttention":
            continue
        for index in (1, 2):  # keys, values
            found = _numpy_cache_repeat(attention.input_value(index).get_node())
            if found is None:
                continue
            broadcast, source, target = found
            bidirectional = ops.broadcast(source, target, broadcast_spec="BIDIRECTIONAL")
            bidirectional.set_friendly_name(broadcast.get_friendly_name())
            broadcast.output(0).replace(bidirectional.output(0))
            replaced += 1
    if replaced:
        program.validate_nodes_and_infer_types()
    return replaced


def _numpy_cache_repeat(reshape):
    """(the numpy Broadcast, its source, the frontend's target shape) when `reshape` is the engine's repeat of a
    stateful cache: Reshape <- Broadcast(numpy, Select(Equal(ShapeOf(source), 1), [Convert] target, ShapeOf(source)))
    <- Unsqueeze <- Concat <- Gather <- [Convert] <- ReadValue; else None."""
    def kind(node) -> str:
        return node.get_type_name()

    if kind(reshape) != "Reshape":
        return None
    broadcast = reshape.input_value(0).get_node()
    if kind(broadcast) != "Broadcast" or broadcast.get_attributes().get("mode") != "numpy":
        return None
    source, shape = broadcast.input_value(0), broadcast.input_value(1).get_node()
    if kind(shape) != "Select" or kind(source.get_node()) != "Unsqueeze":
        return None
    target = shape.input_value(1)
    if kind(target.get_node()) == "Convert":
        target = target.get_node().input_value(0)
    concat = source.get_node().input_value(0).get_node()
    if kind(concat) != "Concat":
        return None
    gather = concat.input_value(0).get_node()
    if kind(gather) != "Gather":
        return None
    state = gather.input_value(0).get_node()
    if kind(state) == "Convert":
        state = state.input_value(0).get_node()
    return (broadcast, source, target) if kind(state) == "ReadValue" else None
