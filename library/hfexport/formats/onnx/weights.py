"""ONNX: the initializers of a saved graph (and Constant nodes' tensors), in the external data file or inline.

An external initializer is rewritten in place in its data file; an inline one (a small tensor in the `.onnx`
itself) by rewriting the graph's protobuf. Names are only locators: the map was made by value, so a renamed,
folded (`pkg.onnxscript.optimizer.folded_from`) or fused (`packed_matmul_N`) initializer maps the same way.
"""

from __future__ import annotations

from pathlib import Path

from hfexport.rebind.stored import ONNX_DTYPES, Stored, inside, mapped, plain_file, write_at


def _tensors(graph):
    """(locator, TensorProto) for every initializer and Constant-node tensor of the main graph."""
    for tensor in graph.initializer:
        yield tensor.name, tensor
    for node in graph.node:
        for attribute in node.attribute:
            if attribute.HasField("t"):
                yield f"{node.name or node.output[0]}#{attribute.name}", attribute.t


def read(folder: Path, file: str) -> list[Stored]:
    import onnx

    model = onnx.load(str(folder / file), load_external_data=False)
    views: dict[str, memoryview] = {}
    stored = []
    for name, tensor in _tensors(model.graph):
        dtype = ONNX_DTYPES.get(tensor.data_type, f"onnx:{tensor.data_type}")
        shape = list(tensor.dims)
        if tensor.data_location == onnx.TensorProto.EXTERNAL:
            entries = {entry.key: entry.value for entry in tensor.external_data}
            if not plain_file(entries.get("location", "")) or "length" not in entries:
                continue  # outside the folder, or of unknown size: never read nor written (and unmapped)
            location = str(Path(file).parent / entries["location"]) if Path(file).parent != Path(".") \
                else entries["location"]
            if location not in views:
                if not (folder / location).is_file() or (folder / location).is_symlink():
                    continue
                views[location] = mapped(folder / location)
            offset, length = int(entries.get("offset", 0)), int(entries["length"])
            if not inside(views[location], offset, length):
                continue
            stored.append(Stored(name, location, offset, length, dtype, shape, views[location][offset:offset + length]))
        elif tensor.HasField("raw_data"):
            stored.append(Stored(name, file, None, len(tensor.raw_data), dtype, shape, tensor.raw_data))
    return stored


def write(folder: Path, file: str, stored: dict[str, Stored], updates: dict[str, bytes]) -> None:
    """Write the new bytes of `updates` (by locator): external ones in place, inline ones through the protobuf."""
    import onnx

    by_file: dict[str, list[tuple[int, bytes]]] = {}
    inline = {}
    for name, data in updates.items():
        entry = stored[name]
        if entry.offset is None:
            inline[name] = data
        else:
            by_file.setdefault(entry.file, []).append((entry.offset, data))
    for location, writes in by_file.items():
        write_at(folder / location, writes)
    if inline:
        model = onnx.load(str(folder / file), load_external_data=False)
        for name, tensor in _tensors(model.graph):
            if name in inline:
                tensor.raw_data = inline[name]
        (folder / file).write_bytes(model.SerializeToString())
