"""ExecuTorch's dtype validator must not specialize a dynamic dim of a split's outputs (hfexport.executorch_fixes).

executorch 1.5.1's `to_edge` evaluated `len()` of the first output tensor of a `Tensor[]`-returning op, which
guarded the batch to its traced size: GPT-2's `c_attn(...).split(...)` then made every ExecuTorch GPT-2 program
run at the traced batch only (`method->execute() failed with error 0x12` at batch 1)."""

import pytest
import torch

pytest.importorskip("executorch")

from executorch.exir import to_edge  # noqa: E402

from hfexport.executorch_fixes import executorch_fixes  # noqa: E402


class _Split(torch.nn.Module):
    def forward(self, x):
        first, second = x.split(4, dim=2)  # as GPT-2's attention splits q/k/v
        return first * second + torch.arange(x.shape[0])[:, None, None]


def _edge_batch():
    """The batch dim of the input placeholder after `to_edge` of a program exported with a dynamic batch."""
    batch = torch.export.Dim("batch", min=1, max=8)
    program = torch.export.export(_Split(), (torch.randn(2, 3, 8),), dynamic_shapes=({0: batch},))
    edge = to_edge(program).exported_program()
    return next(node for node in edge.graph.nodes if node.op == "placeholder").meta["val"].shape[0]


def test_to_edge_keeps_a_split_input_batch_dynamic():
    with executorch_fixes():
        assert isinstance(_edge_batch(), torch.SymInt)


def test_without_the_fix_executorch_still_specializes_the_batch():
    # When this fails, ExecuTorch fixed its validator: drop hfexport.executorch_fixes.
    assert _edge_batch() == 2


def test_the_fix_is_undone_after_the_block():
    from executorch.exir.verification.arg_validator import EdgeOpArgValidator

    before = EdgeOpArgValidator.call_function
    with executorch_fixes():
        assert EdgeOpArgValidator.call_function is not before
    assert EdgeOpArgValidator.call_function is before


@pytest.mark.slow
@pytest.mark.parametrize("mode", ["forward", "generation"])
def test_gpt2_on_executorch_passes_at_every_probed_batch(tmp_path, mode):
    """The matrix cell that failed with error 0x12 at batch 1: forward probes batch 1..8, generation decodes a
    batch of 2 and probes the components at other batches."""
    from hfexport.testing.matrix import Cell, run_cell

    result = run_cell(Cell("tiny-gpt2", "executorch", mode), tmp_path)
    assert result.outcome == "pass", result.detail

