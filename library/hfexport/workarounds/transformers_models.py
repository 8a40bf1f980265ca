"""Narrow fixes of transformers' modeling code under torch.export, applied around an export (`modeling_fixes()`).

Mamba (transformers 5.23, `models/mamba/modeling_mamba.py`): without the CUDA kernels, `mamba_selective_scan` skips
its `associative_scan` path under torch.export ("There is no onnx translation for this op") and runs the recurrence
as a Python loop, `for index in range(seq_len)`. Tracing unrolls that loop, so every exported graph that sees more
than one token specializes the sequence length to the sample's: torch.export with a dynamic `seq` stops at
"Constraints violated (seq)! ... Suggested fixes: seq = 27", and the engine's `dynamic=True` (automatic axes)
silently exports a prefill that takes 27 tokens only (ONNX Runtime: "Got invalid dimensions for input:
attention_mask ... Got: 5 Expected: 27"). The fix runs the same recurrence through torch's `scan` higher-order op,
which keeps the sequence dynamic: torch.export and ONNX (`Scan`) take it. Measured on the other formats (tiny Mamba,
and a minimal scan program): OpenVINO 2026.4.1's PyTorch frontend has no conversion rule for `scan` (nor for
`while_loop` from an ExportedProgram: "Conversion is failed for: ... while_loop"), and an ExecuTorch 1.5.1 program
with `scan` fails at run time (tiny Mamba: `method->execute()` error 0x1; the minimal program: error 0x12 in
`aten::copy_`, even at its traced shape), so for those formats the engine's unrolled trace stays, with its fixed
prefill length. There a generation export has no prefill (`prefill_by_decode`): the decode step is the same
recurrence for one token, and `hfexport.generate` runs the prompt through it token by token (docs/generation.md).
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator

from hfexport.workarounds import workaround

# Formats whose lowering takes torch's `scan` (measured: see the module docstring).
SCAN_FORMATS = ("dynamo", "onnx")


def _is_mamba(model) -> bool:
    return getattr(getattr(model, "config", None), "model_type", None) == "mamba"


def prefill_by_decode(model, export_format: str) -> bool:
    """True where a Mamba prefill would keep the sample's length (the format takes no `scan`, see above): the plan
    then exports the decode alone and `hfexport.generate` runs the prompt through it, one token per step."""
    return _is_mamba(model) and str(export_format) not in SCAN_FORMATS


def unrolled_sequence(model, export_format: str) -> str | None:
    """Why a forward export of `model` in `export_format` cannot keep its sequence axis dynamic (the upstream cause,
    quoted), or None when it can: Mamba's recurrence unrolled to the sample's length where the format takes no
    `scan` (see above)."""
    if not prefill_by_decode(model, export_format):
        return None
    return (f"transformers 5.23 runs Mamba's selective scan as a Python loop over the sequence, which torch.export "
            f"unrolls to the sample's length (\"Constraints violated (seq)! ... Suggested fixes: seq = <the sample's "
            f"length>\"); hfexport runs it as torch's `scan` on {' and '.join(SCAN_FORMATS)} only, since "
            "OpenVINO 2026.4.1 has no conversion rule for `scan` and ExecuTorch 1.5.1 fails to run it (error 0x1)")


def _selective_scan(original):
    """`mamba_selective_scan` whose torch-only recurrence is a `scan` while exporting; eager calls are unchanged."""
    import torch
    from torch._higher_order_ops.scan import scan

    def selective_scan(hidden_states, dt, A, B, C, D=None, z=None, delta_bias=None, delta_softplus=False,
                       return_last_state=False, use_mambapy=False, use_associative_scan=False, **kwargs):
        if not torch.compiler.is_exporting():
            return original(hidden_states, dt, A, B, C, D=D, z=z, delta_bias=delta_bias,
                            delta_softplus=delta_softplus, return_last_state=return_last_state,
                            use_mambapy=use_mambapy, use_associative_scan=use_associative_scan, **kwargs)
        # As transformers 5.23's reference path up to its "Recurrent iteration" loop.
        input_dtype = hidden_states.dtype
        if delta_bias is not None:
            dt = dt + delta_bias.to(dt.dtype)[..., None]
        if delta_softplus:
            dt = torch.nn.functional.softplus(dt)
        B, C = B.transpose(1, 2), C.transpose(1, 2)  # [batch, seq, state]
        discrete_A = torch.exp(A[None, :, None, :] * dt[:, :, :, None])  # [batch, inner, seq, state]
        deltaB_u = dt[:, :, :, None] * B[:, None, :, :].float() * hidden_states[:, :, :, None].float()

        def step(state, inputs):
            a, bu, c = inputs  # one position: [batch, inner, state] twice, [batch, state]
            state = a * state + bu
            # state @ c as a product and a sum: a matmul in the scan's body decomposes, for ONNX, into views
            # whose sizes come back as SymInts ("'SymInt' object has no attribute 'unsqueeze'" in torch's scan).
            return state, (state.to(input_dtype) * c[:, None, :].to(input_dtype)).sum(-1)

        initial = torch.zeros_like(discrete_A[:, :, 0], dtype=input_dtype)
        ssm_state, outputs = scan(step, initial, (discrete_A.movedim(2, 0), deltaB_u.movedim(2, 0), C.movedim(1, 0)))
        scan_output = outputs.movedim(0, 2)  # [batch, inner, seq]
        if D is not None:
            scan_output = scan_output + hidden_states * D[None, :, None]
        if z is not None:
            scan_output = scan_output * torch.nn.functional.silu(z)
        return (scan_output, ssm_state) if return_last_state else scan_output

    selective_scan.__wrapped__ = original
    return selective_scan


@workaround(
    "transformers-mamba-scan",
    upstream="transformers 5.23.0 (models/mamba)",
    works_around="without CUDA kernels Mamba's selective scan is a Python loop that torch.export unrolls, "
                 "specializing the sequence length; run as torch's scan on dynamo and ONNX",
    applied="export._format_fixes around torch.export and ONNX exports of Mamba (modeling_fixes); plan.state_space "
            "reads prefill_by_decode where it cannot apply",
    canary="tests/test_modeling_fixes.py::test_without_the_fix_the_export_specializes_the_sequence")
@contextlib.contextmanager
def modeling_fixes(model, export_format: str) -> Iterator[None]:
    """Within the block, the fixes that apply to `model` on `export_format` are installed (none: a no-op)."""
    if not _is_mamba(model) or str(export_format) not in SCAN_FORMATS:
        yield
        return
    from transformers.models.mamba import modeling_mamba

    original = modeling_mamba.mamba_selective_scan
    # Parameters that require grad make the traced `scan` dispatch to its autograd implementation, which ONNX's
    # decomposition then fails in ("'SymInt' object has no attribute 'unsqueeze'", torch 2.13): an export is
    # inference only, so they are frozen for the block.
    trainable = [parameter for parameter in model.parameters() if parameter.requires_grad]
    modeling_mamba.mamba_selective_scan = _selective_scan(original)
    for parameter in trainable:
        parameter.requires_grad_(False)
    try:
        yield
    finally:
        modeling_mamba.mamba_selective_scan = original
        for parameter in trainable:
            parameter.requires_grad_(True)


@workaround(
    "transformers-rope-index-on-base-model",
    upstream="transformers 5.23.0 (exporters.utils.precompute_export_inputs)",
    works_around="the engine runs the LLM rope index (`get_rope_index`) only when the traced module has it; a "
                 "Qwen2-VL-class *ForConditionalGeneration keeps it on its base model, so a whole-model forward "
                 "traced without positions stops in the rope index's tolist()",
    applied="plan.tracing.traced_inputs (the plan's shapes, probes, the report's prepared_inputs) and "
            "export.run_plan (the forward export's inputs)",
    canary="tests/test_preparer_families.py::test_the_engine_alone_computes_no_rope_index_for_the_outer_model")
def base_rope_index(model, prepared: dict) -> dict:
    """`prepared` (the engine's `prepare_for_export` output for `model`) with the text's rope positions the engine's
    preparers compute on the base model, where they missed them on `model`.

    transformers 5.23's `precompute_export_inputs` runs the LLM rope index (`get_rope_index`: the 3-axis positions
    of a Qwen2-VL-class prompt, image tokens placed on their grid) only when the traced module itself has
    `get_rope_index`; in the `*ForConditionalGeneration` classes (Qwen2-VL, PaddleOCR-VL, ...) it lives on the base
    model (`model.model`), so a whole-model forward is traced without positions and stops in the rope index's
    `tolist()` (GuardOnDataDependentSymNode). This runs the same preparer, through `prepare_for_export`, on the base
    model and keeps its `position_ids`: the graph takes them as an input, as transformers.js feeds Qwen2-VL's."""
    import copy

    base = getattr(model, "base_model", None)
    if prepared.get("position_ids") is not None or base is None or base is model \
            or hasattr(model, "get_rope_index") or not hasattr(base, "get_rope_index"):
        return prepared
    from transformers.exporters.utils import prepare_for_export

    _, on_base, _ = prepare_for_export(base, copy.copy(dict(prepared)))
    if on_base.get("position_ids") is None:
        return prepared
    return {**prepared, "position_ids": on_base["position_ids"]}
