"""A narrow fix of OpenVINO's CPU plugin writing through a freed input, applied to every OpenVINO runner hfexport's
`ExportedModel` loads (`copy_returned_inputs`).

OpenVINO 2026.4.1 (CPU plugin): when a compiled program's output is one of its inputs (an encoder-decoder's prefill
and decode return `encoder_last_hidden_state`, a stateless decode its cross-attention cache, through a no-op
`ConvertLike` the plugin removes, so that a `Result` follows a `Parameter`), an input shared with the infer request
(`infer(..., share_inputs=True)`, the default of the engine's runner and of `ExportedModel.__call__`) stays bound to
that output after `infer` returns. Once the caller frees the array, the next `infer` at another shape writes through
the freed buffer: glibc aborts ("corrupted double-linked list") or the process gets SIGSEGV. Copies of the inputs
(`share_inputs=False`) live as long as the request, so such runners are called with copies, whatever the caller
passes; runners without a pass-through output keep the zero-copy default. tests/test_generate_seq2seq.py keeps a
canary that fails once OpenVINO no longer corrupts the heap: then this module can go.
"""

from __future__ import annotations

import functools

from hfexport.engine import runner_class


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
        into the request's own tensors (hfexport.workarounds.openvino: OpenVINO 2026.4.1 writes through a freed shared
        input)."""

        def __call__(self, share_inputs: bool = True, share_outputs: bool = False, **kwargs):
            return super().__call__(share_inputs=False, share_outputs=share_outputs, **kwargs)

    return InputCopyingOpenVINORunner
