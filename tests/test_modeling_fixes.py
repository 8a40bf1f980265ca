"""Mamba under torch.export keeps a dynamic sequence length (hfexport.workarounds.transformers_models).

transformers 5.23's `mamba_selective_scan` runs its torch-only recurrence as `for index in range(seq_len)` while
exporting, so every traced graph of more than one token specializes seq to the sample's length. The fix runs the
same recurrence as torch's `scan` for the formats that lower it (torch.export, ONNX)."""

import pytest
import torch
from hfexport.workarounds.transformers_models import SCAN_FORMATS, modeling_fixes
from hfexport.testing.models import make_model

BATCH = torch.export.Dim("batch", min=1, max=8)
SEQ = torch.export.Dim("seq", min=2, max=64)


@pytest.fixture(scope="module")
def mamba(tmp_path_factory):
    from transformers import AutoModelForCausalLM

    folder = make_model("tiny-mamba", tmp_path_factory.mktemp("mamba") / "tiny-mamba")
    return AutoModelForCausalLM.from_pretrained(folder).eval()


class _Logits(torch.nn.Module):
    def __init__(self, model):
        super().__init__()
        self.model = model

    def forward(self, input_ids, attention_mask):
        return self.model(input_ids=input_ids, attention_mask=attention_mask, use_cache=False).logits


def _export(model):
    ids = torch.randint(3, 300, (2, 9), generator=torch.Generator().manual_seed(0))
    return torch.export.export(_Logits(model), (ids, torch.ones_like(ids)),
                               dynamic_shapes=({0: BATCH, 1: SEQ}, {0: BATCH, 1: SEQ}), strict=False)


def test_without_the_fix_the_export_specializes_the_sequence(mamba):
    # When this fails, transformers' Mamba exports a dynamic sequence itself: drop hfexport.workarounds.transformers_models.
    with pytest.raises(Exception, match=r"Constraints violated \(seq\)"):
        _export(mamba)


def test_with_the_fix_one_program_takes_any_length_and_padding(mamba):
    with modeling_fixes(mamba, "onnx"):
        program = _export(mamba)
    ids = torch.randint(3, 300, (3, 23), generator=torch.Generator().manual_seed(1))
    mask = torch.ones_like(ids)
    mask[0, :6] = 0  # left padding
    with torch.no_grad():
        eager, exported = _Logits(mamba)(ids, mask), program.module()(ids, mask)
    torch.testing.assert_close(exported, eager, atol=1e-5, rtol=1e-4)
    assert any(node.target is torch.ops.higher_order.scan for node in program.graph.nodes)


def test_the_fix_is_undone_and_leaves_eager_calls_and_other_cases_alone(mamba):
    from transformers.models.mamba import modeling_mamba

    original = modeling_mamba.mamba_selective_scan
    ids = torch.tensor([[5, 6, 7, 8]])
    with torch.no_grad():
        before = mamba(input_ids=ids).logits
        with modeling_fixes(mamba, "dynamo"):
            assert modeling_mamba.mamba_selective_scan is not original
            assert not any(p.requires_grad for p in mamba.parameters())
            torch.testing.assert_close(mamba(input_ids=ids).logits, before, atol=0, rtol=0)  # eager: unchanged
    assert modeling_mamba.mamba_selective_scan is original
    assert all(p.requires_grad for p in mamba.parameters())
    for export_format in ("openvino", "executorch"):  # they do not lower `scan` (see the module docstring)
        assert export_format not in SCAN_FORMATS
        with modeling_fixes(mamba, export_format):
            assert modeling_mamba.mamba_selective_scan is original
    with modeling_fixes(torch.nn.Linear(2, 2), "onnx"):
        assert modeling_mamba.mamba_selective_scan is original


@pytest.mark.slow
@pytest.mark.parametrize("export_format", SCAN_FORMATS)
@pytest.mark.parametrize("mode", ["forward", "generation"])
def test_mamba_cells_pass_where_the_fix_applies(tmp_path, export_format, mode):
    """The matrix cells the fix makes pass: forward probes other lengths; generation feeds `cache_params` through
    prefill and decode, token for token against `model.generate`."""
    from hfexport.testing.matrix import Cell, run_cell

    result = run_cell(Cell("tiny-mamba", export_format, mode), tmp_path)
    assert result.outcome == "pass", result.detail
