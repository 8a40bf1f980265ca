"""Running a loaded ONNX file on ONNX Runtime's CPU provider without importing onnx_ir.

transformers 5.23's ONNX runner module imports onnx_ir (and, through it, onnx) when it is imported, and reads onnx_ir's
dtype table on every call to bind its inputs: ~70 ms of CPU of a ~0.3 s load to first output
(benchmarks/load_published.py) that a loaded export never needs to run. An export loaded from its checked files
(`formats.onnx.file_component.OnnxFileComponent`, never parsed) on the CPU runs here instead: the session opens the checked file with the
caller's session options, as the engine's runner opens a loaded program's file, and runs on NumPy arrays that share
the tensors' memory. Anything else keeps the engine's runner (`engine.runner_class("onnx")`): a GPU or explicit
providers (the engine picks and binds them), and a graph with an input or output NumPy cannot hold (bf16, float8,
int4), which gets the engine's runner over the session already opened.
"""

from __future__ import annotations

import re
from typing import Any

import torch
from transformers.exporters import ModelRunner

from hfexport.engine import onnx_inputs, runner_class
from hfexport.errors import MissingKernelError
from hfexport.formats.onnx import seq2seq_contract as onnx_seq2seq
from hfexport.formats.onnx.decoder_contract import leaf_path

# ONNX Runtime's type names of the tensors a NumPy array holds (`NodeArg.type`); others go to the engine's runner.
NUMPY_TYPES = frozenset(f"tensor({name})" for name in (
    "float", "float16", "double", "int8", "int16", "int32", "int64", "uint8", "uint16", "uint32", "uint64", "bool"))


def runs_here(device=None, providers=None) -> bool:
    """Whether a session for `device`/`providers` is one this module runs: ONNX Runtime's CPU provider, chosen by
    `device="cpu"` or by default on a machine without CUDA (where the engine would pick the CPU provider too)."""
    if providers is not None:
        return False
    if device is None:
        return not torch.cuda.is_available()
    return torch.device(device).type == "cpu"


class OnnxFileRunner(ModelRunner):
    """Runs a checked `.onnx` file in an ONNX Runtime CPU session: `runner(**kwargs)` returns what the source model
    returns, as the engine's ONNX runner does (same inputs by name, same outputs, `.session`, `.metadata`)."""

    def __init__(self, metadata, session):
        super().__init__(metadata)
        self.session = session
        self.input_names = [spec.name for spec in session.get_inputs()]
        self.output_names = [spec.name for spec in session.get_outputs()]
        #: the float16 inputs of a float16 graph (`hfexport.formats.onnx.float16`): fed at float16, as its runtimes feed them
        self.half_inputs = frozenset(spec.name for spec in session.get_inputs() if spec.type == "tensor(float16)")
        self.merged = onnx_seq2seq.is_merged(self.input_names)  # decoder_model_merged.onnx (both prefill and decode)

    @property
    def device(self) -> torch.device:
        return torch.device("cpu")

    @classmethod
    def from_program(cls, program, metadata, device=None, providers: list | None = None,
                     session_options=None) -> ModelRunner:
        """A runner for the file `program.meta["path"]` names (`formats.onnx.file_component.OnnxFile`), with the engine's `from_program`
        options: on the CPU here, else (a GPU, explicit providers) the engine's runner."""
        if not runs_here(device, providers):  # the engine's runner module imports onnx_ir: only on these paths
            return runner_class("onnx").from_program(program, metadata, device, providers=providers,
                                              session_options=session_options)
        import onnxruntime

        try:
            session = onnxruntime.InferenceSession(program.meta["path"], session_options,
                                                   providers=["CPUExecutionProvider"])
        except Exception as error:  # noqa: BLE001 - a missing kernel said as such; anything else as ONNX Runtime said it
            raise missing_kernel(error, program.meta["path"]) or error
        specs = [*session.get_inputs(), *session.get_outputs()]
        if any(spec.type not in NUMPY_TYPES for spec in specs):
            return runner_class("onnx")(metadata, session)
        return cls(metadata, session)

    def __call__(self, share_inputs: bool = True, share_outputs: bool = False, **kwargs) -> Any:
        """Run on the traced forward's kwargs (inputs by ONNX name, as `onnx_inputs` maps them). The inputs are read in
        place (NumPy views of the tensors) and the outputs are ONNX Runtime's fresh arrays, so `share_inputs` and
        `share_outputs` change nothing. A graph in the loaders' contract (`past_key_values.{i}.key`,
        `hfexport.formats.onnx.decoder_contract`) is fed the same leaves as the engine's names (`leaf_path`)."""
        if self.merged:
            return self._run_merged(kwargs)
        paths = [leaf_path(name) for name in self.input_names]
        leaves = onnx_inputs(paths, kwargs)
        inputs = {name: leaves[path] for name, path in zip(self.input_names, paths, strict=True) if path in leaves}
        missing = [name for name in self.input_names if name not in inputs]
        if missing:
            raise ValueError(f"The graph takes {missing}, which {list(kwargs)} don't hold.")
        feeds = {name: _at(tensor, name in self.half_inputs) for name, tensor in inputs.items()}
        outputs = self.session.run(self.output_names, feeds)
        return self.unflatten([torch.from_numpy(output) for output in outputs])

    def _run_merged(self, kwargs) -> Any:
        """A merged encoder-decoder decoder (`hfexport.formats.onnx.seq2seq_contract`) run as the engine's prefill or decode: the decode
        when `kwargs` hold a cache (`use_cache_branch` true), else the prefill, fed an empty past of length 0 as the
        loaders feed it; its outputs returned in the engine's order (the passed-through encoder output included)."""
        import numpy

        names = [name for name in self.input_names if name != onnx_seq2seq.USE_CACHE_BRANCH]
        paths = [onnx_seq2seq.leaf_path(name) for name in names]
        leaves = onnx_inputs(paths, kwargs)
        feeds = {name: _at(leaves[path], name in self.half_inputs)
                 for name, path in zip(names, paths, strict=True) if path in leaves}
        pasts = [spec for spec in self.session.get_inputs() if spec.name.startswith("past_key_values.")]
        use_cache = any(spec.name in feeds for spec in pasts)
        batch = feeds["input_ids"].shape[0]
        for spec in pasts:
            if spec.name not in feeds:  # the first step: an empty past, as optimum and transformers.js feed it
                dtype = numpy.float16 if spec.type == "tensor(float16)" else numpy.float32
                feeds[spec.name] = numpy.zeros((batch, spec.shape[1], 0, spec.shape[3]), dtype=dtype)
        feeds[onnx_seq2seq.USE_CACHE_BRANCH] = numpy.array([use_cache])
        missing = [name for name in self.input_names if name not in feeds]
        if missing:
            raise ValueError(f"The graph takes {missing}, which {list(kwargs)} don't hold.")
        found = dict(zip(self.output_names, self.session.run(self.output_names, feeds), strict=True))
        wanted = onnx_seq2seq.engine_outputs(self.session.get_modelmeta().custom_metadata_map, use_cache)
        outputs = [found.get(name, feeds.get(name)) for name in map(onnx_seq2seq.contract_output, wanted)]
        return self.unflatten([torch.from_numpy(numpy.ascontiguousarray(output)) for output in outputs])


_NO_KERNEL = re.compile(r"NOT_IMPLEMENTED\s*:\s*Could not find an implementation for (\w+)\((\d+)\) node with name "
                        r"'([^']*)'")


def missing_kernel(error: BaseException, path) -> MissingKernelError | None:
    """ONNX Runtime's "NOT_IMPLEMENTED : Could not find an implementation for Mul(14) node with name '...'" when it
    opens the file at `path`, as a `MissingKernelError` naming the op, its opset, the dtype the node computes at (read
    off the graph) and ONNX Runtime's version; None for any other error."""
    import onnx
    import onnxruntime

    match = _NO_KERNEL.search(str(error))
    if match is None:
        return None
    op, version, node_name = match.groups()
    dtype = "an unsupported dtype"
    try:
        graph = onnx.load(str(path), load_external_data=False).graph
    except Exception:  # noqa: BLE001 - the op alone, without its dtype
        graph = None
    if graph is not None:
        types = {value.name: value.type.tensor_type.elem_type for value in (*graph.input, *graph.value_info,
                                                                             *graph.output)}
        types.update({tensor.name: tensor.data_type for tensor in graph.initializer})
        node = next((node for node in graph.node if node.name == node_name), None)
        known = [types[name] for name in (node.input if node is not None else ()) if types.get(name)]
        if known:
            name = onnx.TensorProto.DataType.Name(known[0]).lower()
            dtype = {"float": "float32", "double": "float64"}.get(name, name)
    return MissingKernelError(
        f"{path}: ONNX Runtime {onnxruntime.__version__} has no CPU kernel for {op} (opset {version}) at {dtype} "
        f"(node {node_name!r}): the file is not corrupt, onnxruntime lacks that op for that dtype; export the target "
        "at float32 (the default) or at a dtype ONNX Runtime runs on the CPU (`\"dtype\": \"float16\"`)")


def _at(tensor, half: bool):
    """A tensor as the NumPy array fed to the session: a float32 tensor given to a float16 input (a float32 model's
    cache or pixels, fed to a graph converted to float16) cast to float16, as the graph's runtimes hold it."""
    if half and tensor.is_floating_point() and tensor.dtype != torch.float16:
        tensor = tensor.to(torch.float16)
    return tensor.detach().cpu().contiguous().numpy()
