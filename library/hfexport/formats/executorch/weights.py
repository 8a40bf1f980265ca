"""ExecuTorch `.pte`: the program's constant buffers (in its constant segment) and the named data its delegates
read (XNNPACK's weights, one segment each, keyed by the bytes' sha256 when exported), located through the
program's flatbuffer and extended header (executorch 1.5.1's `exir._serialize._program` readers: the layout the
runtime reads); and, where the weights are kept apart (`hfexport.formats.executorch.data_file`), every named entry of the
program's `.ptd` (`ptd:<key>`: the constants by their parameter name, the delegates' blobs by their key), located
through its FlatTensor index (`formats.executorch.ptd`). A rebind overwrites those bytes in place: the program, its delegates'
graphs and the keys stay as they are, so the runtime finds every weight where it did, and a `.pte` whose weights
are all in its `.ptd` is not written at all. The delegates' keys then no longer hash their bytes; nothing checks
that (the runtime looks data up by key)."""

from __future__ import annotations

from pathlib import Path

from hfexport.formats.executorch.data_file import data_name
from hfexport.rebind.stored import Stored, inside, mapped, write_at
from hfexport.formats.executorch.ptd import read_flat_tensor

#: ExecuTorch's ScalarType numbers (exir/scalar_type.py) by torch dtype name.
SCALAR_TYPES = {0: ("uint8", 1), 1: ("int8", 1), 2: ("int16", 2), 3: ("int32", 4), 4: ("int64", 8),
                5: ("float16", 2), 6: ("float32", 4), 7: ("float64", 8), 11: ("bool", 1), 15: ("bfloat16", 2)}


#: `TensorDataLocation.EXTERNAL` (exir/schema.py): a tensor whose bytes are in the program's data file.
EXTERNAL = 1


def _program(view: memoryview):
    from executorch.exir._serialize._program import _flatbuffer_to_program, _get_extended_header

    header = _get_extended_header(bytes(view[:64]))  # the extended header sits at bytes 8-40
    if header is None or not header.is_valid():
        return _flatbuffer_to_program(bytes(view)), None
    return _flatbuffer_to_program(bytes(view[:header.program_size])), header.segment_base_offset


def _data(folder: Path, file: str) -> list[Stored]:
    """The named entries of the program's `.ptd`, if it has one."""
    name = data_name(file)
    if not (folder / name).is_file():
        return []
    view = mapped(folder / name)
    stored = []
    for entry in read_flat_tensor(view, name):
        dtype, size = SCALAR_TYPES.get(entry.scalar_type, (None, 0)) if entry.scalar_type is not None else (None, 0)
        shape = list(entry.sizes) if entry.sizes is not None and dtype is not None else None
        if shape is not None and size * _count(shape) != entry.size:
            dtype = shape = None  # a layout that does not describe the bytes: treat them as untyped
        stored.append(Stored(f"ptd:{entry.key}", name, entry.offset, entry.size, dtype if shape is not None else None,
                             shape, view[entry.offset:entry.offset + entry.size]))
    return stored


def _count(shape: list[int]) -> int:
    count = 1
    for dim in shape:
        count *= dim
    return count


def read(folder: Path, file: str) -> list[Stored]:
    view = mapped(folder / file)
    program, base = _program(view)
    stored = _data(folder, file)
    if base is None:  # no segments: constants inline in the flatbuffer, which a rebind does not rewrite
        return stored
    for entry in program.named_data or []:
        segment = program.segments[entry.segment_index]
        offset = base + segment.offset
        if not inside(view, offset, segment.size):
            continue
        stored.append(Stored(f"named:{entry.key}", file, offset, segment.size, None, None,
                             view[offset:offset + segment.size]))
    constants = program.constant_segment
    if constants is not None and constants.offsets:
        start = base + program.segments[constants.segment_index].offset
        seen = set()
        for plan in program.execution_plan:
            for value in plan.values:
                tensor = value.val
                index = getattr(tensor, "data_buffer_idx", 0)
                if type(tensor).__name__ != "Tensor" or not index or index in seen or index >= len(constants.offsets):
                    continue
                info = getattr(tensor, "extra_tensor_info", None)
                if info is not None and int(getattr(info, "location", 0) or 0) == EXTERNAL:
                    continue  # its data_buffer_idx counts the external constants: its bytes are the .ptd's
                seen.add(index)
                dtype, size = SCALAR_TYPES.get(int(tensor.scalar_type), (f"executorch:{int(tensor.scalar_type)}", 0))
                shape = [int(dim) for dim in tensor.sizes]
                nbytes = size
                for dim in shape:
                    nbytes *= dim
                offset = start + constants.offsets[index]
                if nbytes and inside(view, offset, nbytes):
                    stored.append(Stored(f"constant:{index}", file, offset, nbytes, dtype, shape,
                                         view[offset:offset + nbytes]))
    return stored


def write(folder: Path, file: str, stored: dict[str, Stored], updates: dict[str, bytes]) -> None:
    """Overwrite the updated entries in the file holding each (the `.pte` or its `.ptd`)."""
    by_file: dict[str, list[tuple[int, bytes]]] = {}
    for name, data in updates.items():
        by_file.setdefault(stored[name].file, []).append((stored[name].offset, data))
    for holder, changes in by_file.items():
        write_at(folder / holder, changes)
