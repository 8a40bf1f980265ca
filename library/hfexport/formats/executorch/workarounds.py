"""Narrow fixes for ExecuTorch's lowering, applied around the engine's ExecuTorch export (`executorch_fixes()`).

What each of the nine fixes works around (one of outcome: a dynamic batch specialized by `to_edge`'s op
validator; one of numerics: XNNPACK's gelu for a tanh one; three of cost: XNNPACK's retraces, the second
decomposition, the pattern passes; four of memory: a shared constant's copy, each partition's copy of its weights,
the weights' serialized copies held in memory until the save, the model's mapped pages left resident once read),
and the tests that show the programs unchanged: docs/workarounds.md, "ExecuTorch's lowering".
"""

from __future__ import annotations

import contextlib
import functools
import os
import tempfile
from collections.abc import Iterator
from dataclasses import dataclass

from hfexport.files import drop_tensor_pages
from hfexport.workarounds import replaced, workaround


def _single_tensor_list_return(target) -> bool:
    import torch

    schema = getattr(target, "_schema", None)
    returns = getattr(schema, "returns", None)
    return bool(returns) and len(returns) == 1 and returns[0].type == torch.ListType.ofTensors()


_RETRACE_HOOKS = (
    "ExportTracer", "ExportInterpreter", "_fx", "inputs", "on_attr", "placeholder", "output", "call_operator",
    "call_size_operator", "call_size_operator_all", "call_sym", "call_cond", "call_while", "call_map", "call_scan",
    "call_getitem", "call_submodule", "call_delegate",
)


@dataclass
class RetraceCounts:
    """What the cost fixes did in one `executorch_fixes()` block: XNNPACK pass retraces skipped and run, `to_edge`'s
    second decomposition passes skipped and run, and XNNPACK pattern-pass runs skipped."""
    skipped: int = 0
    run: int = 0
    decompositions_skipped: int = 0
    decompositions_run: int = 0
    pattern_passes_skipped: int = 0


def _plain_retrace(pass_) -> bool:
    """Whether `pass_` is an ExportPass whose retrace only re-propagates values (no hook of the retrace overridden)."""
    from executorch.exir.pass_base import ExportPass

    return isinstance(pass_, ExportPass) and all(
        getattr(type(pass_), hook, None) is getattr(ExportPass, hook, None) for hook in _RETRACE_HOOKS)


def _value_key(value) -> str:
    """A node's value as the retrace derives it: dtype, (symbolic) shape and strides of each tensor, as text (no size
    is evaluated, so no guard is added)."""
    import torch

    if isinstance(value, torch.Tensor):
        return f"{value.dtype}{[str(size) for size in value.shape]}{[str(step) for step in value.stride()]}"
    if isinstance(value, (list, tuple)):
        return "(" + ",".join(_value_key(item) for item in value) + ")"
    return str(value) if isinstance(value, (torch.SymInt, torch.SymFloat, torch.SymBool, int, float, bool)) \
        else type(value).__name__


def _argument_key(argument) -> str:
    import torch
    from torch.fx.node import Node, map_aggregate

    def key(item):
        if isinstance(item, Node):
            return f"%{item.name}"
        if isinstance(item, torch.Tensor):
            return f"<tensor {id(item)} {_value_key(item)}>"
        return item

    return repr(map_aggregate(argument, key))


def _graph_key(graph_module, program) -> tuple:
    """Everything a retrace of `graph_module` reads: its nodes, their values' shapes, the program's tensors' shapes."""
    import torch

    nodes = tuple(
        (node.op, node.name, str(node.target), _argument_key(node.args), _argument_key(node.kwargs),
         _value_key(node.meta.get("val")))
        for node in graph_module.graph.nodes)
    tensors = tuple(
        (name, id(tensor), _value_key(tensor))
        for name, tensor in (*program.state_dict.items(), *program.constants.items())
        if isinstance(tensor, torch.Tensor))
    return nodes, tensors


@workaround(
    "executorch-xnnpack-retraces",
    upstream="executorch 1.5.1",
    works_around="(cost) XNNPACK's preprocess retraces each partition after passes that left it unchanged, "
                 "to_edge decomposes a second time with nothing left, pattern passes build patterns no partition "
                 "can match; the programs stay byte for byte the same",
    applied="export._format_fixes, around every ExecuTorch export (executorch_fixes)",
    canary="tests/test_executorch_fixes.py::test_the_cost_fixes_leave_the_program_byte_identical")
@contextlib.contextmanager
def _unchanged_retraces_skipped(counts: RetraceCounts) -> Iterator[None]:
    """Within the block, an XNNPACK pass's closing retrace of a graph the pass left as it found it is skipped."""
    try:
        from executorch.backends.xnnpack import _passes as xnnpack_passes
        from executorch.exir.pass_base import _ExportPassBase
        from torch.fx.passes.infra.pass_base import PassResult
    except ImportError:
        yield
        return
    original_transform, original_call = xnnpack_passes._transform, _ExportPassBase.call

    def transform(program, *passes, **kwargs):
        for pass_ in passes:
            if _plain_retrace(pass_):
                pass_._hfexport_entry = (program, _graph_key(program.graph_module, program))
        return original_transform(program, *passes, **kwargs)

    def call(self, graph_module):
        entry = self.__dict__.pop("_hfexport_entry", None)  # one decision per pass run: its first retrace
        if entry is not None:
            program, key = entry
            if _graph_key(graph_module, program) == key:
                counts.skipped += 1
                return PassResult(graph_module, True)
            counts.run += 1
        return original_call(self, graph_module)

    with replaced((xnnpack_passes, "_transform", transform), (_ExportPassBase, "call", call)):
        yield


def _size_queries() -> frozenset:
    import torch

    aten = torch.ops.aten
    return frozenset({aten.sym_size.int, aten.sym_numel.default, aten.sym_stride.int, aten.sym_storage_offset.default})


@contextlib.contextmanager
def _needless_second_decompositions_skipped(counts: RetraceCounts) -> Iterator[None]:
    """Within the block, `to_edge`'s second decomposition pass is skipped when no op of its table is left."""
    try:
        from executorch.exir.graph_module import contains_any_call_fn_target_op
        from executorch.exir.program import _program
        from torch.export import ExportedProgram
    except ImportError:
        yield
        return
    original_replace, original_decompose = _program._replace_aten_ops_with_transformed_ops, \
        ExportedProgram.run_decompositions

    def replace(name, program, partitioner):
        preserved = original_replace(name, program, partitioner)
        program.__dict__["_hfexport_second_pass"] = True  # the next decomposition of this program is that pass
        return preserved

    def run_decompositions(self, decomp_table=None, *args, **kwargs):
        if self.__dict__.pop("_hfexport_second_pass", False) and decomp_table is not None:
            if not contains_any_call_fn_target_op(self.graph_module, set(decomp_table) - _size_queries()):
                counts.decompositions_skipped += 1
                return self
            counts.decompositions_run += 1
        return original_decompose(self, decomp_table, *args, **kwargs)

    with replaced((_program, "_replace_aten_ops_with_transformed_ops", replace),
                   (ExportedProgram, "run_decompositions", run_decompositions)):
        yield


def _pattern_anchors() -> dict:
    """XNNPACK passes that only rewrite matches of fixed pattern graphs, with an op every one of their patterns
    contains (checked against the patterns themselves in tests/test_executorch_fixes.py)."""
    import torch
    from executorch.backends.xnnpack._passes.convert_to_sdpa import ConvertToSDPAPass
    from executorch.backends.xnnpack._passes.convert_to_upsample_bilinear2d import ConvertToUpsampleBilinear2d

    return {ConvertToUpsampleBilinear2d: torch.ops.aten.upsample_bilinear2d.vec,
            ConvertToSDPAPass: torch.ops.aten._softmax.default}


@contextlib.contextmanager
def _patternless_passes_skipped(counts: RetraceCounts) -> Iterator[None]:
    """Within the block, an XNNPACK pattern pass on a partition without its patterns' anchor op does nothing (it
    would find no match, then retrace an unchanged graph), so neither its patterns are built nor matched."""
    try:
        from executorch.exir.graph_module import contains_any_call_fn_target_op
        from torch.fx.passes.infra.pass_base import PassResult

        anchors = _pattern_anchors()
    except (ImportError, AttributeError):
        yield
        return
    def skipping(cls, original):
        def call(self, graph_module):
            if contains_any_call_fn_target_op(graph_module, {anchors[cls]}):
                return original(self, graph_module)
            self.__dict__.pop("_hfexport_entry", None)
            counts.pattern_passes_skipped += 1
            return PassResult(graph_module, False)
        return call

    with replaced(*((cls, "call", skipping(cls, cls.call)) for cls in anchors)):
        yield


@workaround(
    "executorch-split-dtype-validator",
    upstream="executorch 1.5.1",
    works_around="to_edge's EdgeOpArgValidator iterates a Tensor[] return as its first tensor, so len() adds a "
                 "guard that specializes a split's dynamic batch (any other batch then fails at run time)",
    applied="export._format_fixes, around every ExecuTorch export (executorch_fixes)",
    canary="tests/test_executorch_fixes.py::test_without_the_fix_executorch_still_specializes_the_batch")
@contextlib.contextmanager
def _split_validation_fixed() -> Iterator[None]:
    """Within the block, ExecuTorch's dtype validator no longer specializes a dynamic dim of a split's outputs."""
    try:
        from executorch.exir.verification.arg_validator import EdgeOpArgValidator
    except ImportError:  # ExecuTorch not installed: the engine reports that itself
        yield
        return
    original = EdgeOpArgValidator.call_function

    def call_function(self, target, args, kwargs):
        node = getattr(self, "node", None)
        value = node.meta.get("val") if node is not None else None
        if not (isinstance(value, list) and _single_tensor_list_return(target)):
            return original(self, target, args, kwargs)
        node.meta["val"] = [value]  # the returns: one Tensor[]
        try:
            return original(self, target, args, kwargs)
        finally:
            node.meta["val"] = value

    with replaced((EdgeOpArgValidator, "call_function", call_function)):
        yield


def _tanh_gelu(node) -> bool:
    """Whether an `aten.gelu` node asks for the tanh approximation."""
    approximate = node.kwargs.get("approximate", node.args[1] if len(node.args) > 1 else "none")
    return approximate == "tanh"


@workaround(
    "executorch-xnnpack-tanh-gelu",
    upstream="executorch 1.5.1",
    works_around="XNNPACK's partitioner delegates every aten.gelu and its GeluVisitor serializes XNNPACK's gelu, which "
                 "is the exact (erf) one: a gelu(approximate='tanh') computed the other function, up to 4.8e-4 apart "
                 "(SigLIP's last_hidden_state failed parity on 4.9% of its elements); such a gelu stays on the "
                 "portable kernel, which computes the tanh form",
    applied="export._format_fixes, around every ExecuTorch export (executorch_fixes)",
    canary="tests/test_executorch_zoo_cells.py::test_without_the_fix_xnnpack_computes_the_erf_gelu_for_a_tanh_one")
@contextlib.contextmanager
def _tanh_gelu_kept_off_xnnpack() -> Iterator[None]:
    """Within the block, XNNPACK's partitioner leaves a `gelu(approximate='tanh')` to the portable kernels."""
    try:
        from executorch.backends.xnnpack.partition.config.generic_node_configs import GeluConfig
    except ImportError:  # ExecuTorch not installed: the engine reports that itself
        yield
        return
    original = GeluConfig.check_constraints

    def check_constraints(self, node, ep) -> bool:
        return not _tanh_gelu(node) and original(self, node, ep)

    with replaced((GeluConfig, "check_constraints", check_constraints)):
        yield


class _AliasingCopy:
    """`copy` as ExecuTorch's constant duplication sees it: a tensor "copied" shares its storage (a new tensor object, a
    Parameter kept a Parameter), anything else deep-copied as before."""

    @staticmethod
    def deepcopy(value, memo=None):
        import copy

        import torch

        if isinstance(value, torch.nn.Parameter):
            return torch.nn.Parameter(value.detach(), requires_grad=value.requires_grad)
        if isinstance(value, torch.Tensor):
            return value.detach()
        return copy.deepcopy(value, memo)


@workaround(
    "executorch-duplicated-constants-shared",
    upstream="executorch 1.5.1",
    works_around="to_backend's duplicate_constant_node gives each extra user of a constant that a partition shares "
                 "with the rest of the graph a copy.deepcopy of it (a tied embedding and head: the 49152 x 576 table, "
                 "113 MB at float32 on SmolLM2, copied once more while the program is lowered and saved); the copy is "
                 "never written to, so it shares the constant's storage: the same values, the same files",
    applied="export._format_fixes, around every ExecuTorch export (executorch_fixes)",
    canary="tests/test_executorch_fixes.py::test_a_duplicated_constant_shares_its_storage_and_the_files_are_the_same")
@contextlib.contextmanager
def _duplicated_constants_shared() -> Iterator[None]:
    """Within the block, ExecuTorch's `duplicate_constant_node` duplicates a constant's placeholder without copying
    its tensor."""
    try:
        from executorch.exir.backend.canonical_partitioners import duplicate_constant_node_pass
    except ImportError:  # ExecuTorch not installed: the engine reports that itself
        yield
        return
    with replaced((duplicate_constant_node_pass, "copy", _AliasingCopy)):
        yield


#: A serialized blob at least this large is kept in a temporary file (`weights_spilled`); smaller ones stay bytes.
SPILL_BYTES = 1 << 20


@functools.cache
def _spilled_class():
    """`executorch.exir._serialize._cord.FileBackedData` (executorch's own on-disk buffer, which its Cords, named data
    store and serializers take wherever they take bytes) for a blob spilled here: its file removed once the blob is
    no longer referenced, and copied as itself (the emitter's program is deep-copied before serialization; the bytes
    never change)."""
    from executorch.exir._serialize._cord import FileBackedData

    class SpilledData(FileBackedData):
        def __copy__(self):
            return self

        def __deepcopy__(self, memo):
            return self

    return SpilledData


def spilled(data: bytes):
    """`data` written to a temporary file, as executorch's `FileBackedData` (removed when no longer referenced);
    `data` itself where it is smaller than `SPILL_BYTES`."""
    if not isinstance(data, bytes) or len(data) < SPILL_BYTES:
        return data
    handle, path = tempfile.mkstemp(prefix="hfexport-executorch-", suffix=".data")
    try:
        with os.fdopen(handle, "wb") as file:
            file.write(data)
        return _spilled_class()(path, cleanup=True)
    except BaseException:
        os.unlink(path)
        raise


@workaround(
    "executorch-serialized-weights-spilled",
    upstream="executorch 1.5.1",
    works_around="(memory) XNNPACK's preprocess hands each weight to the NamedDataStore as bytes and the emitter copies "
                 "each constant it keeps into bytes: a second copy of every weight (SmolLM2: 513 MB at float32, and the "
                 "113 MB embedding once more per emission), held in memory from lowering to the save; each such blob "
                 "is written to a temporary file as executorch's own FileBackedData instead, the same bytes in the "
                 "files",
    applied="export._format_fixes, around every ExecuTorch export (executorch_fixes), and the save's re-emission "
            "(data_file.separated)",
    canary="tests/test_executorch_fixes.py::test_the_serialized_weights_are_spilled_and_the_files_are_the_same")
@contextlib.contextmanager
def weights_spilled() -> Iterator[None]:
    """Within the block, a blob of `SPILL_BYTES` or more handed to executorch's NamedDataStore, or saved by its
    emitter as a constant, is kept in a temporary file (`spilled`), not in memory."""
    try:
        from executorch.exir._serialize._named_data_store import NamedDataStore
        from executorch.exir.emit._emitter import _Emitter
    except ImportError:  # ExecuTorch not installed: the engine reports that itself
        yield
        return
    original_add, original_save = NamedDataStore.add_named_data, _Emitter._save_new_const_tensor

    def add_named_data(self, key, data, *args, **kwargs):
        return original_add(self, key, spilled(data), *args, **kwargs)

    def save_new_const_tensor(self, spec, buffer_data, hashed, allocation_info=None, constant_tag=None):
        if allocation_info is None:  # a constant (a mutable buffer's initial state is copied at load: left as is)
            buffer_data = spilled(buffer_data)
        return original_save(self, spec, buffer_data, hashed, allocation_info, constant_tag)

    with replaced((NamedDataStore, "add_named_data", add_named_data),
                  (_Emitter, "_save_new_const_tensor", save_new_const_tensor)):
        yield


def drop_program_pages(program) -> int:
    """Hand back the resident pages of an `ExportedProgram`'s tensors (its parameters, buffers and constants: the
    model's, shared with it) that are still file pages (`hfexport.files.drop_tensor_pages`: a checkpoint's mapped
    weights, read again from the file if touched again, the same bytes). Returns the bytes dropped."""
    return drop_tensor_pages((*program.state_dict.values(), *program.constants.values()))


@workaround(
    "executorch-mapped-weights-handed-back",
    upstream="executorch 1.5.1",
    works_around="(memory) XNNPACK's preprocess and the emitter read every weight once to serialize it, leaving each "
                 "page of a mapped checkpoint (transformers maps safetensors) resident beside the serialized copy "
                 "until the process ends; the model's pages are handed back as the export starts (tracing and "
                 "lowering read no weight), and once a partition is serialized (and once a program is emitted) "
                 "those its tensors read again (read again from the file if the model runs again: the same bytes)",
    applied="export._format_fixes, around every ExecuTorch export (executorch_fixes), and the save's re-emission "
            "(data_file.separated)",
    canary="tests/test_executorch_fixes.py::test_the_mapped_weights_are_handed_back_after_serialization")
@contextlib.contextmanager
def mapped_weights_handed_back(model=None) -> Iterator[None]:
    """Within the block, the file pages of a partition's weights are handed back once XNNPACK has serialized it, and
    those of each program once `to_executorch` has emitted it; `model`'s (what planning read) as the block starts."""
    if model is not None:
        drop_tensor_pages((*model.parameters(), *model.buffers()))
    try:
        from executorch.backends.xnnpack.xnnpack_preprocess import XnnpackBackend
        from executorch.exir.program._program import EdgeProgramManager
    except ImportError:  # ExecuTorch not installed: the engine reports that itself
        yield
        return
    original_preprocess = XnnpackBackend.preprocess  # a staticmethod
    original_to_executorch = EdgeProgramManager.to_executorch

    def preprocess(edge_program, compile_specs):
        try:
            return original_preprocess(edge_program, compile_specs)
        finally:
            drop_program_pages(edge_program)

    def to_executorch(self, *args, **kwargs):
        manager = original_to_executorch(self, *args, **kwargs)
        for name in manager.methods:
            drop_program_pages(manager.exported_program(name))
        return manager

    with _declared(XnnpackBackend, "preprocess", staticmethod(preprocess)), \
            replaced((EdgeProgramManager, "to_executorch", to_executorch)):
        yield


@contextlib.contextmanager
def _declared(cls, name: str, value) -> Iterator[None]:
    """Within the block, `cls` declares `name` as `value` (a staticmethod or classmethod object); on leaving, it
    declares what it declared before, or nothing (inheriting again)."""
    before = cls.__dict__.get(name)
    setattr(cls, name, value)
    try:
        yield
    finally:
        if before is None:
            delattr(cls, name)
        else:
            setattr(cls, name, before)


@workaround(
    "executorch-xnnpack-partitions-share-weights",
    upstream="executorch 1.5.1",
    works_around="(memory) to_backend deep-copies every partition's program, its weights included, before XNNPACK's "
                 "preprocess (BackendDetails.copy_exported_program_for_preprocess), all partitions before the "
                 "first is preprocessed: a copy of every delegated weight (SmolLM2: 513 MB at float32) held through "
                 "the lowering; XNNPACK's passes replace state_dict entries, never write a tensor, so the copy shares "
                 "the tensors (executorch's own CUDA backend does so in its low-memory mode): the same files",
    applied="export._format_fixes, around every ExecuTorch export (executorch_fixes)",
    canary="tests/test_executorch_fixes.py::test_xnnpack_partitions_share_the_weights_and_the_files_are_the_same")
@contextlib.contextmanager
def _partitions_share_weights() -> Iterator[None]:
    """Within the block, the program XNNPACK preprocesses for a partition is a deep copy of the partition's program
    that shares its tensors (its state_dict's and constants') instead of copying them."""
    try:
        import torch
        from executorch.backends.xnnpack.xnnpack_preprocess import XnnpackBackend
    except ImportError:  # ExecuTorch not installed: the engine reports that itself
        yield
        return

    def copy_exported_program_for_preprocess(cls, edge_program, compile_specs):
        import copy

        shared = {id(tensor): tensor for values in (edge_program.state_dict, edge_program.constants)
                  for tensor in values.values() if isinstance(tensor, torch.Tensor)}
        return copy.deepcopy(edge_program, shared)

    with _declared(XnnpackBackend, "copy_exported_program_for_preprocess",
                   classmethod(copy_exported_program_for_preprocess)):
        yield


@contextlib.contextmanager
def executorch_fixes(model=None) -> Iterator[RetraceCounts]:
    """Within the block, every fix applies (`model`: the one exported, its mapped pages handed back first); yields
    the retrace fix's counts (for tests and benchmarks)."""
    counts = RetraceCounts()
    with _split_validation_fixed(), _tanh_gelu_kept_off_xnnpack(), _duplicated_constants_shared(), \
            _partitions_share_weights(), weights_spilled(), mapped_weights_handed_back(model), \
            _unchanged_retraces_skipped(counts), \
            _needless_second_decompositions_skipped(counts), _patternless_passes_skipped(counts):
        yield counts
