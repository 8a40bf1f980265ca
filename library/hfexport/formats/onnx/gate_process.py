"""ONNX's side of the gate's artifact process (`hfexport.verify.artifact`): each component a CPU session of ONNX Runtime
opened as the lean in-process gate opens it, fed by leaf path and answering by leaf path, without torch.

The process asks a format's module for `open_component(entry, precision)` (`entry`: the request's `path` and
`out_paths`; ONNX computes at the graph's own types, so `precision` is only what `read` reports: the caller's "f16"
for a float16 graph, else "f32"), `opening(folder)` and `running(folder)` (what holds while the components open and
run: nothing here, the lean session computes from its mapping).
"""

from __future__ import annotations

import contextlib

from hfexport.formats.onnx.decoder_contract import leaf_path
from hfexport.formats.onnx.program import generation_session_options

#: ONNX Runtime's type names of the tensors a NumPy array holds (as `formats.onnx.file_runner.NUMPY_TYPES`)
NUMPY_TYPES = frozenset(f"tensor({name})" for name in (
    "float", "float16", "double", "int8", "int16", "int32", "int64", "uint8", "uint16", "uint32", "uint64", "bool"))


def opening(folder):
    """Nothing to hold while the sessions open: ONNX Runtime's lean session maps the external data it computes from."""
    return contextlib.nullcontext()


def running(folder):
    return contextlib.nullcontext()


def open_component(entry: dict, precision: str | None) -> OnnxGateComponent:
    return OnnxGateComponent(entry["path"], entry["out_paths"], precision or "f32")


class OnnxGateComponent:
    """One ONNX file's CPU session, fed by leaf path and returning its outputs by leaf path, as
    `formats.onnx.file_runner.OnnxFileRunner` feeds and unflattens them. `unsupported`: why the process does not run
    it (a non-NumPy type, a merged encoder-decoder decoder): the caller then checks it in process."""

    def __init__(self, path: str, out_paths: list[str], precision: str):
        import onnxruntime

        self.session = onnxruntime.InferenceSession(path, generation_session_options(prepacking=False),
                                                    providers=["CPUExecutionProvider"])
        self.input_names = [spec.name for spec in self.session.get_inputs()]
        self.output_names = [spec.name for spec in self.session.get_outputs()]
        self.half_inputs = frozenset(spec.name for spec in self.session.get_inputs() if spec.type == "tensor(float16)")
        self.out_paths, self.precision = out_paths, precision
        specs = [*self.session.get_inputs(), *self.session.get_outputs()]
        self.unsupported = next((f"{spec.name} is a {spec.type}" for spec in specs if spec.type not in NUMPY_TYPES),
                                None)
        if self.unsupported is None and "use_cache_branch" in self.input_names:
            self.unsupported = "a merged encoder-decoder decoder"

    def read(self) -> dict:
        """What `hfexport.machine.read_back` reports of the component: its device, providers and precision."""
        providers = self.session.get_providers()
        return {"device": "cpu" if providers == ["CPUExecutionProvider"] else "accelerator",
                "providers": list(providers), "precision": self.precision}

    def reset(self) -> None:
        """A new generation: nothing is kept between calls (the cache is fed)."""

    def __call__(self, leaves: dict, kwargs: list[str]) -> dict:
        """`{leaf path: array}` of the outputs for the inputs `leaves` (`kwargs`: the call's kwarg names)."""
        import numpy

        paths = [leaf_path(name) for name in self.input_names]
        missing = [name for name, path in zip(self.input_names, paths, strict=True) if path not in leaves]
        if missing:
            raise ValueError(f"The graph takes {missing}, which {kwargs} don't hold.")
        feeds = {}
        for name, path in zip(self.input_names, paths, strict=True):
            value = numpy.ascontiguousarray(leaves[path])
            if name in self.half_inputs and value.dtype.kind == "f" and value.dtype != numpy.float16:
                value = value.astype(numpy.float16)
            feeds[name] = value
        outputs = self.session.run(self.output_names, feeds)
        flat = outputs[len(outputs) - len(self.out_paths):]
        return dict(zip(self.out_paths, flat, strict=True))
