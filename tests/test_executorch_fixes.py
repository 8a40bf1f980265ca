"""ExecuTorch's dtype validator must not specialize a dynamic dim of a split's outputs (hfexport.formats.executorch.workarounds).

executorch 1.5.1's `to_edge` evaluated `len()` of the first output tensor of a `Tensor[]`-returning op, which
guarded the batch to its traced size: GPT-2's `c_attn(...).split(...)` then made every ExecuTorch GPT-2 program
run at the traced batch only (`method->execute() failed with error 0x12` at batch 1)."""

import contextlib

import pytest
import torch

pytest.importorskip("executorch")

from executorch.exir import to_edge  # noqa: E402

from hfexport.formats.executorch.workarounds import executorch_fixes  # noqa: E402


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
    # When this fails, ExecuTorch fixed its validator: drop hfexport.formats.executorch.workarounds.
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



# ── XNNPACK's no-op retraces (a cost fix: the program must stay byte for byte the same) ──────────────────────────


class _ConvNormLinear(torch.nn.Module):
    """Conv1d (which XNNPACK's `Conv1dUnsqueezePass` rewrites: its retrace must run), batch norm, ReLU, linear."""

    def __init__(self):
        super().__init__()
        self.conv = torch.nn.Conv1d(4, 8, 3, padding=1)
        self.norm = torch.nn.BatchNorm1d(8)
        self.linear = torch.nn.Linear(8, 8)

    def forward(self, x):
        return self.linear(torch.relu(self.norm(self.conv(x))).transpose(1, 2))


def _lowered_program() -> bytes:
    from executorch.backends.xnnpack.partition.xnnpack_partitioner import XnnpackPartitioner
    from executorch.exir import to_edge_transform_and_lower

    torch.manual_seed(0)
    model = _ConvNormLinear().eval()
    seq = torch.export.Dim("seq", min=2, max=64)
    program = torch.export.export(model, (torch.randn(2, 4, 16),), dynamic_shapes=({2: seq},))
    return to_edge_transform_and_lower(program, partitioner=[XnnpackPartitioner()]).to_executorch().buffer


def test_the_cost_fixes_leave_the_program_byte_identical():
    from hfexport.formats.executorch.workarounds import (
        RetraceCounts,
        _needless_second_decompositions_skipped,
        _patternless_passes_skipped,
        _unchanged_retraces_skipped,
    )

    released = _lowered_program()
    counts = RetraceCounts()
    with _unchanged_retraces_skipped(counts), _needless_second_decompositions_skipped(counts), \
            _patternless_passes_skipped(counts):
        fixed = _lowered_program()
    assert fixed == released
    assert counts.pattern_passes_skipped == 2  # no upsampling, no attention: neither pattern pass had work
    assert counts.skipped > 0  # the passes that found nothing to do (batch norm fusion, upsample, PReLU, ...)
    assert counts.run > 0  # the conv1d rewrite changed the graph: its retrace ran
    assert counts.decompositions_skipped == 1  # only size queries (the dynamic seq) were left for the second pass


def test_a_second_decomposition_with_work_left_still_runs():
    from executorch.exir.program._program import _default_decomposition_table

    from hfexport.formats.executorch.workarounds import RetraceCounts, _needless_second_decompositions_skipped

    def flagged(module, sample):
        program = torch.export.export(module, (sample,), dynamic_shapes=({0: torch.export.Dim("batch", max=8)},))
        program.__dict__["_hfexport_second_pass"] = True  # as `_replace_aten_ops_with_transformed_ops` leaves it
        return program

    counts = RetraceCounts()
    with _needless_second_decompositions_skipped(counts):
        with_linear = flagged(torch.nn.Linear(4, 4), torch.randn(2, 4))
        decomposed = with_linear.run_decompositions(_default_decomposition_table())
        sizes_only = flagged(_Batch(), torch.randn(2, 4))
        kept = sizes_only.run_decompositions(_default_decomposition_table())
    assert counts.decompositions_run == 1 and counts.decompositions_skipped == 1
    targets = {str(node.target) for node in decomposed.graph.nodes if node.op == "call_function"}
    assert "aten.linear.default" not in targets and "aten.addmm.default" in targets
    assert kept is sizes_only


class _Batch(torch.nn.Module):
    def forward(self, x):
        return x * x.shape[0]  # a size query of the dynamic batch, no op to decompose


def test_every_pattern_of_a_skipped_pattern_pass_contains_its_anchor_op():
    """The pattern passes are skipped on partitions without the anchor op: that holds only while every pattern the
    pass matches contains it. When this fails, ExecuTorch changed the patterns: update `_pattern_anchors`."""
    from executorch.backends.xnnpack.partition.graphs import bilinear_2d, sdpa
    from executorch.exir.graph_module import contains_any_call_fn_target_op

    from hfexport.formats.executorch.workarounds import _pattern_anchors

    patterns = {"ConvertToUpsampleBilinear2d": bilinear_2d.get_graphs(), "ConvertToSDPAPass": sdpa.get_graphs()}
    anchors = {cls.__name__: anchor for cls, anchor in _pattern_anchors().items()}
    assert set(anchors) == set(patterns)
    for name, graphs in patterns.items():
        assert graphs
        for graph in graphs:
            assert contains_any_call_fn_target_op(graph, {anchors[name]}), name


def test_a_pass_that_rewrites_during_its_retrace_is_never_skipped():
    """A pass whose work is in a retrace hook (`call_operator`) changes nothing before the retrace: it must run."""
    from executorch.exir.dialects._ops import ops as exir_ops
    from executorch.exir.pass_base import ExportPass

    from hfexport.formats.executorch.workarounds import _plain_retrace

    class ReluToSigmoid(ExportPass):
        def call_operator(self, op, args, kwargs, meta):
            if op == exir_ops.edge.aten.relu.default:
                op = exir_ops.edge.aten.sigmoid.default
            return super().call_operator(op, args, kwargs, meta)

    class Plain(ExportPass):
        def call(self, graph_module):
            return super().call(graph_module)

    assert not _plain_retrace(ReluToSigmoid())
    assert _plain_retrace(Plain())


def test_the_retrace_fix_is_undone_after_the_block():
    from executorch.backends.xnnpack import _passes as xnnpack_passes
    from executorch.exir.pass_base import _ExportPassBase

    from executorch.exir.program import _program

    from executorch.backends.xnnpack._passes.convert_to_sdpa import ConvertToSDPAPass

    def patched():
        return (xnnpack_passes._transform, _ExportPassBase.call, _program._replace_aten_ops_with_transformed_ops,
                torch.export.ExportedProgram.run_decompositions, ConvertToSDPAPass.call)

    before = patched()
    with executorch_fixes() as counts:
        assert all(now is not then for now, then in zip(patched(), before))
        assert not any(vars(counts).values())
    assert patched() == before


# ── a constant shared by a partition and the rest of the graph (a cost fix: the same program, no copy) ──────────────


class _TiedHead(torch.nn.Module):
    """An embedding (a portable op) and a head (delegated to XNNPACK) sharing one weight, as a tied LLM's."""

    def __init__(self):
        super().__init__()
        self.embed = torch.nn.Embedding(64, 16)
        self.head = torch.nn.Linear(16, 64, bias=False)
        self.head.weight = self.embed.weight

    def forward(self, ids):
        return self.head(self.embed(ids))


def _lowered_tied(model):
    """The tied model lowered to XNNPACK: (the program's bytes, whether a duplicated constant of the edge program
    shares the tied weight's storage)."""
    from executorch.backends.xnnpack.partition.xnnpack_partitioner import XnnpackPartitioner
    from executorch.exir import to_edge_transform_and_lower

    program = torch.export.export(model, (torch.randint(0, 64, (1, 5)),))
    edge = to_edge_transform_and_lower(program, partitioner=[XnnpackPartitioner()])
    copies = [tensor for name, tensor in edge.exported_program().state_dict.items() if "_copy_" in name]
    assert copies  # to_backend duplicated the shared weight's placeholder
    shared = all(tensor.untyped_storage().data_ptr() == model.embed.weight.untyped_storage().data_ptr()
                 for tensor in copies)
    return edge.to_executorch().buffer, shared


def test_a_duplicated_constant_shares_its_storage_and_the_files_are_the_same():
    from hfexport.formats.executorch.workarounds import _duplicated_constants_shared

    torch.manual_seed(0)
    model = _TiedHead().eval()
    released, copied = _lowered_tied(model)
    with _duplicated_constants_shared():
        fixed, shared = _lowered_tied(model)
    assert not copied  # when this fails, ExecuTorch no longer copies the duplicate: drop the workaround
    assert shared  # the duplicate is the tied weight's storage, not a copy
    assert fixed == released


# ── the weights' copies while lowering and saving (fixes of memory: the same files, fewer copies in memory) ─────────


class _BigTiedHead(torch.nn.Module):
    """`_TiedHead` with a table above `SPILL_BYTES` (1024 x 512 float32: 2 MiB) and a delegated layer before the head."""

    def __init__(self):
        super().__init__()
        self.embed = torch.nn.Embedding(1024, 512)
        self.inner = torch.nn.Linear(512, 512, bias=False)
        self.head = torch.nn.Linear(512, 1024, bias=False)
        self.head.weight = self.embed.weight

    def forward(self, ids):
        return self.head(torch.relu(self.inner(self.embed(ids))))


def _lowered_files(model, tmp_path, name: str):
    """The model lowered to XNNPACK and saved with its weights apart (`data_file.separated`, as the save does): the
    `.pte` and `.ptd` bytes, and the types of the named data store's buffers and the emitted constants."""
    from executorch.backends.xnnpack.partition.xnnpack_partitioner import XnnpackPartitioner
    from executorch.exir import to_edge_transform_and_lower

    from hfexport.formats.executorch.data_file import separated, write_data

    program = torch.export.export(model, (torch.randint(0, 1024, (1, 5)),))
    manager = to_edge_transform_and_lower(program, partitioner=[XnnpackPartitioner()]).to_executorch()
    kinds = {type(buffer).__name__ for buffer in manager._named_data.buffers if len(buffer) >= 1 << 20}
    kinds |= {type(buffer.storage).__name__ for buffer in manager.executorch_program.constant_buffer
              if len(buffer.storage) >= 1 << 20}
    split = separated(manager, "model")
    with open(tmp_path / f"{name}.pte", "wb") as file:
        split.write_to_file(file)
    write_data(split, tmp_path / f"{name}.ptd")
    return (tmp_path / f"{name}.pte").read_bytes(), (tmp_path / f"{name}.ptd").read_bytes(), kinds, \
        manager.buffer


def test_the_serialized_weights_are_spilled_and_the_files_are_the_same(tmp_path):
    from hfexport.formats.executorch.workarounds import weights_spilled

    torch.manual_seed(0)
    model = _BigTiedHead().eval()
    *released, kinds_released, inline_released = _lowered_files(model, tmp_path, "released")
    with weights_spilled():
        *fixed, kinds_fixed, inline_fixed = _lowered_files(model, tmp_path, "fixed")
    assert kinds_released == {"bytes"}  # when this fails, ExecuTorch no longer holds the weights as bytes
    assert kinds_fixed == {"SpilledData"}  # every blob of 1 MiB or more (XNNPACK's and the emitter's) on disk
    assert fixed == released
    assert inline_fixed == inline_released  # the in-memory program (weights inside) too


def test_xnnpack_partitions_share_the_weights_and_the_files_are_the_same():
    from executorch.backends.xnnpack.xnnpack_preprocess import XnnpackBackend

    from hfexport.formats.executorch.workarounds import _partitions_share_weights

    torch.manual_seed(0)
    model = _BigTiedHead().eval()
    weights = {model.inner.weight.untyped_storage().data_ptr(), model.embed.weight.untyped_storage().data_ptr()}
    seen = []
    original = XnnpackBackend.__dict__["preprocess"]

    def lowered():
        program = torch.export.export(model, (torch.randint(0, 1024, (1, 5)),))
        from executorch.backends.xnnpack.partition.xnnpack_partitioner import XnnpackPartitioner
        from executorch.exir import to_edge_transform_and_lower

        return to_edge_transform_and_lower(program, partitioner=[XnnpackPartitioner()]).to_executorch().buffer

    def preprocess(edge_program, compile_specs):
        seen.extend(tensor.untyped_storage().data_ptr() for tensor in edge_program.state_dict.values())
        return original.__func__(edge_program, compile_specs)

    XnnpackBackend.preprocess = staticmethod(preprocess)
    try:
        released = lowered()
        copied, seen[:] = set(seen), []
        with _partitions_share_weights():
            fixed = lowered()
        shared = set(seen)
    finally:
        XnnpackBackend.preprocess = original
    assert not copied & weights  # when this fails, ExecuTorch no longer copies a partition's weights
    assert weights <= shared  # the partitions' programs read the model's own tensors
    assert fixed == released
    assert "copy_exported_program_for_preprocess" not in XnnpackBackend.__dict__  # inherited again after the block


def _resident_pages(tensor) -> int:
    """How many of the pages of `tensor`'s storage are resident (/proc/self/pagemap's present bit)."""
    import struct

    storage = tensor.untyped_storage()
    start, end = storage.data_ptr(), storage.data_ptr() + storage.nbytes()
    first, last = -(-start // 4096), end // 4096
    with open("/proc/self/pagemap", "rb") as pagemap:
        pagemap.seek(first * 8)
        entries = struct.unpack(f"{last - first}Q", pagemap.read((last - first) * 8))
    return sum(entry >> 63 & 1 for entry in entries)


def test_the_mapped_weights_are_handed_back_after_serialization(tmp_path):
    from executorch.backends.xnnpack.partition.xnnpack_partitioner import XnnpackPartitioner
    from executorch.exir import to_edge_transform_and_lower
    from safetensors.torch import load_file, save_file

    from hfexport.formats.executorch.workarounds import _partitions_share_weights, mapped_weights_handed_back

    torch.manual_seed(0)
    model = _BigTiedHead().eval()
    save_file({"inner": model.inner.weight.detach().contiguous()}, tmp_path / "model.safetensors")

    def lowered(fixed: bool) -> tuple[int, bytes]:
        with torch.no_grad():  # the weight mapped from the file (copy-on-write), as transformers loads a checkpoint
            model.inner.weight = torch.nn.Parameter(load_file(tmp_path / "model.safetensors")["inner"],
                                                    requires_grad=False)
        if _resident_pages(model.inner.weight) == 0:
            pytest.skip("safetensors did not map the file here")
        # the partitions read the model's tensors (as in executorch_fixes), else a copy of them is what XNNPACK reads
        with _partitions_share_weights(), mapped_weights_handed_back() if fixed else contextlib.nullcontext():
            program = torch.export.export(model, (torch.randint(0, 1024, (1, 5)),))
            buffer = to_edge_transform_and_lower(program, partitioner=[XnnpackPartitioner()]).to_executorch().buffer
        return _resident_pages(model.inner.weight), buffer

    kept, released = lowered(False)
    dropped, fixed = lowered(True)
    assert kept > 0  # when this fails, ExecuTorch no longer leaves the pages it read resident
    assert dropped == 0  # XNNPACK serialized the weight, then its pages were handed back
    assert fixed == released
