"""A stored tensor: where one tensor of an artifact keeps its bytes (a file, an offset) and what it is, as far as
the format says (dtype, shape). Each format module lists them; the weight map and the rebind read and write them."""

from __future__ import annotations

import mmap
from dataclasses import dataclass
from pathlib import Path

#: dtype names (torch's) by each format's own names.
ONNX_DTYPES = {1: "float32", 10: "float16", 16: "bfloat16", 11: "float64", 2: "uint8", 3: "int8", 5: "int16",
               6: "int32", 7: "int64", 9: "bool"}
OPENVINO_DTYPES = {"f32": "float32", "f16": "float16", "bf16": "bfloat16", "f64": "float64", "u8": "uint8",
                   "i8": "int8", "i16": "int16", "i32": "int32", "i64": "int64", "boolean": "bool"}
FLOAT_DTYPES = ("float32", "float16", "bfloat16", "float64")


@dataclass
class Stored:
    """One stored tensor. `name` is unique within its component's program (the locator the map records); `file` is
    the file holding the bytes, relative to the export folder, `offset` their place in it (None: inside a structure
    the format module rewrites itself); `dtype`/`shape` None where the format does not say (a `.pt2` storage)."""

    name: str
    file: str
    offset: int | None
    nbytes: int
    dtype: str | None
    shape: list[int] | None
    data: object  # bytes or a memoryview of the file

    @property
    def floating(self) -> bool:
        return self.dtype is None or self.dtype in FLOAT_DTYPES


def inside(view: memoryview, offset: int, nbytes: int) -> bool:
    """Whether a stored tensor's declared bytes lie inside its file (a hostile or truncated file's do not: such a
    tensor is not listed, so nothing is read or written outside the file)."""
    return 0 <= offset and 0 <= nbytes and offset + nbytes <= len(view)


def plain_file(name: str) -> bool:
    """A file name in the export's own folder: no folder part, no `..`, not hidden (ONNX external-data locations are
    read from the graph, which may come from someone else's publication)."""
    return bool(name) and "/" not in name and "\\" not in name and not name.startswith(".")


def mapped(path: Path) -> memoryview:
    """A read-only view of a file's bytes (mmap: a 500 MB weights file is not read into memory)."""
    with open(path, "rb") as handle:
        if path.stat().st_size == 0:
            return memoryview(b"")
        return memoryview(mmap.mmap(handle.fileno(), 0, access=mmap.ACCESS_READ))


def release(entry: Stored) -> None:
    """Hand back the pages of a stored tensor that was read through `mapped` (MADV_DONTNEED: the pages leave this
    process's resident set and are read again from the file, or the page cache, if touched again), so reading a whole
    export's tensors one after another holds one tensor's pages, not the file's (issue 45: the weight map and the
    weights written into a 4 GB export). Nothing for a tensor held in memory (bytes) or where mmap cannot advise."""
    view = entry.data
    mapping = getattr(view, "obj", None) if isinstance(view, memoryview) else None
    if not isinstance(mapping, mmap.mmap) or entry.offset is None or not entry.nbytes or \
            not hasattr(mapping, "madvise") or not hasattr(mmap, "MADV_DONTNEED"):
        return
    page = mmap.PAGESIZE
    start = entry.offset // page * page
    end = min(len(mapping), -(-(entry.offset + entry.nbytes) // page) * page)
    if start < end:
        mapping.madvise(mmap.MADV_DONTNEED, start, end - start)


def write_at(path: Path, updates: list[tuple[int, bytes]]) -> None:
    """Overwrite byte ranges of a file in place (same lengths: nothing moves)."""
    with open(path, "r+b") as handle:
        for offset, data in updates:
            handle.seek(offset)
            handle.write(data)
