"""An ONNX component read back from its checked file: ONNX Runtime opens the file itself, and the graph is parsed into
onnx_ir (the engine's program type) only when `.program` is read."""

from __future__ import annotations

from pathlib import Path

from transformers.exporters import ExportedComponent

from hfexport.formats.backend import backend_errors


class OnnxFileComponent(ExportedComponent):
    """An ONNX component read back from its checked file. ONNX Runtime opens the file itself (the engine's runner opens
    `program.meta["path"]` when a program has one); the graph is parsed into onnx_ir, the engine's program type, only
    when `.program` is read (saving it again, inspecting the graph): a caller who only runs the export never pays
    for the parse (benchmarks/load_published.py)."""

    def __init__(self, path: Path, metadata, data: Path | None = None, label: str | None = None):
        self.metadata, self.path, self.data, self.label = metadata, Path(path), data, label or str(path)
        self._program = None

    @property
    def program(self):
        if self._program is None:
            with backend_errors(self.label, "onnx"):
                self._program = read_onnx(self.path, self.data)
        return self._program

    @program.setter
    def program(self, value) -> None:
        self._program = value

    @property
    def parsed(self) -> bool:
        """Whether the graph has been parsed into onnx_ir (`.program` read or set)."""
        return self._program is not None

    def __repr__(self) -> str:
        return f"OnnxFileComponent(path={str(self.path)!r}, parsed={self.parsed})"


class OnnxFile:
    """What the engine's ONNX runner reads of a loaded program to open its saved file (transformers 5.23:
    `OnnxModelRunner.from_program` opens `program.meta["path"]` in ONNX Runtime and reads nothing else of it)."""

    def __init__(self, path: Path):
        self.meta = {"path": str(path)}


def read_onnx(path: Path, data: Path | None):
    """The checked `.onnx` file as an onnx_ir model that remembers its path (ONNX Runtime reads the weights beside
    it); weights in the Hub cache's blob store are pointed at there."""
    import onnx_ir

    program = onnx_ir.load(str(path))
    program.meta["path"] = str(path)
    if data is not None and data.is_symlink():
        read_weights_from_blob(program, data)
    return program


def read_weights_from_blob(program, data: Path) -> None:
    """The Hub cache links `model.onnx.data` to a blob outside the snapshot, which onnx_ir refuses to read: point the
    graph's external tensors at the blob (what the engine's `OnnxExporter.load_program` does, transformers 5.23).
    `safety.checked_file` has proven the link leads into the repo's blob store."""
    import onnx_ir

    for graph in program.graphs():
        for value in graph.initializers.values():
            tensor = value.const_value
            if isinstance(tensor, onnx_ir.ExternalTensor) and Path(tensor.path) == data:
                value.const_value = onnx_ir.ExternalTensor(data.resolve(), tensor.offset, tensor.length, tensor.dtype,
                                                           shape=tensor.shape, name=tensor.name)
