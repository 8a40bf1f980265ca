"""ExecuTorch's `.ptd` (a FlatTensor file: the weights a `.pte` keeps outside itself), read and checked in Python.

A `.ptd` is data, never code: a flatbuffer (file identifier `FT01`) with an extended header (`FH01`: where the
flatbuffer ends and where the segments start, and their total size), a list of segments (offset, size), and named
entries (a key, a segment index, optionally the tensor's dtype and shape) that the program's delegates and external
constants look up by key (executorch 1.5.1, `extension/flat_tensor/flat_tensor.fbs` and `serialize.py`). This
module reads that index with explicit bounds (no flatc, no generated code): every offset must lie inside the
flatbuffer, every segment inside the file, every entry's segment must exist. `read_flat_tensor` is what the loader
checks (`formats.executorch.file_check.check_ptd_file`) and what the rebind reads (`formats.executorch.weights`).
"""

from __future__ import annotations

import struct
from dataclasses import dataclass

from hfexport.errors import CorruptExportError

HEADER_MAGIC = b"FH01"
FILE_IDENTIFIER = b"FT01"
HEADER_LENGTH = 40  # magic, length, flatbuffer offset and size, segment base offset and size (serialize.py)
MAX_ENTRIES = 1 << 22


@dataclass(frozen=True)
class NamedEntry:
    """One named blob: its key, where its bytes lie in the file, and its dtype/shape when the writer recorded them
    (ExecuTorch's scalar type number and sizes; None for a delegate's opaque blob)."""

    key: str
    offset: int
    size: int
    scalar_type: int | None
    sizes: tuple[int, ...] | None


class _Buffer:
    """Little-endian flatbuffer reads that fail (`ValueError`) instead of reading outside `end`."""

    def __init__(self, data, end: int):
        self.data, self.end = data, end

    def _unpack(self, fmt: str, at: int):
        size = struct.calcsize(fmt)
        if at < 0 or at + size > self.end:
            raise ValueError(f"offset {at} is outside the flatbuffer ({self.end} bytes)")
        return struct.unpack_from(fmt, self.data, at)[0]

    def u8(self, at: int) -> int:
        return self._unpack("<B", at)

    def i8(self, at: int) -> int:
        return self._unpack("<b", at)

    def u16(self, at: int) -> int:
        return self._unpack("<H", at)

    def u32(self, at: int) -> int:
        return self._unpack("<I", at)

    def i32(self, at: int) -> int:
        return self._unpack("<i", at)

    def u64(self, at: int) -> int:
        return self._unpack("<Q", at)

    def field(self, table: int, slot: int) -> int | None:
        """The position of field number `slot` of the table at `table`, or None when it is absent."""
        vtable = table - self.i32(table)
        if 4 + 2 * slot + 2 > self.u16(vtable):
            return None
        offset = self.u16(vtable + 4 + 2 * slot)
        return table + offset if offset else None

    def indirect(self, at: int) -> int:
        return at + self.u32(at)

    def vector(self, at: int) -> tuple[int, int]:
        start = self.indirect(at)
        count = self.u32(start)
        if count > MAX_ENTRIES or start + 4 + 4 * count > self.end:
            raise ValueError(f"a vector of {count} entries does not fit the flatbuffer")
        return start + 4, count

    def string(self, at: int) -> str:
        start = self.indirect(at)
        length = self.u32(start)
        if start + 4 + length > self.end:
            raise ValueError("a string runs past the flatbuffer")
        return bytes(self.data[start + 4:start + 4 + length]).decode("utf-8")


def read_flat_tensor(data, label: str) -> list[NamedEntry]:
    """The named entries of a `.ptd`'s bytes (`bytes` or a memoryview of the file), each located in the file;
    `CorruptExportError` naming `label` for anything that is not a well-formed FlatTensor."""
    size = len(data)
    if size < 8 + HEADER_LENGTH or bytes(data[4:8]) != FILE_IDENTIFIER:
        raise CorruptExportError(f"{label}: not an ExecuTorch data file (no {FILE_IDENTIFIER.decode()} file identifier)")
    if bytes(data[8:12]) != HEADER_MAGIC:
        raise CorruptExportError(f"{label}: no {HEADER_MAGIC.decode()} extended header")
    length, flatbuffer_offset, flatbuffer_size, segment_base, segment_size = struct.unpack_from("<IQQQQ", data, 12)
    if length < HEADER_LENGTH or flatbuffer_offset + flatbuffer_size > size or segment_base + segment_size > size \
            or (segment_size and segment_base < flatbuffer_offset + flatbuffer_size):
        raise CorruptExportError(f"{label}: its header places the index or the weights outside the file's {size} bytes")
    buffer = _Buffer(data, flatbuffer_offset + flatbuffer_size)
    try:
        root = buffer.indirect(0)
        version = buffer.field(root, 0)
        if version is not None and buffer.u32(version) > 0:
            raise CorruptExportError(f"{label}: FlatTensor version {buffer.u32(version)}, newer than ExecuTorch 1.5.1 "
                                     "reads (0)")
        segments = []
        at = buffer.field(root, 1)
        if at is not None:
            start, count = buffer.vector(at)
            for index in range(count):
                table = buffer.indirect(start + 4 * index)
                offset_at, size_at = buffer.field(table, 0), buffer.field(table, 1)
                offset = buffer.u64(offset_at) if offset_at is not None else 0
                nbytes = buffer.u64(size_at) if size_at is not None else 0
                if offset + nbytes > segment_size:
                    raise CorruptExportError(f"{label}: segment {index} ({nbytes} bytes at {offset}) lies outside the "
                                             f"file's {segment_size} bytes of weights")
                segments.append((segment_base + offset, nbytes))
        entries = []
        at = buffer.field(root, 2)
        if at is not None:
            start, count = buffer.vector(at)
            for index in range(count):
                table = buffer.indirect(start + 4 * index)
                key_at, segment_at, layout_at = (buffer.field(table, slot) for slot in (0, 1, 2))
                if key_at is None:
                    raise CorruptExportError(f"{label}: named_data[{index}] has no key")
                key = buffer.string(key_at)
                segment = buffer.u32(segment_at) if segment_at is not None else 0
                if segment >= len(segments):
                    raise CorruptExportError(f"{label}: named_data[{index}] ({key[:80]!r}) names segment {segment}, "
                                             f"but the file has {len(segments)}")
                scalar_type = sizes = None
                if layout_at is not None:
                    layout = buffer.indirect(layout_at)
                    type_at, sizes_at = buffer.field(layout, 0), buffer.field(layout, 1)
                    scalar_type = buffer.i8(type_at) if type_at is not None else 0
                    if sizes_at is not None:
                        first, rank = buffer.vector(sizes_at)
                        sizes = tuple(buffer.i32(first + 4 * i) for i in range(min(rank, 64)))
                entries.append(NamedEntry(key, *segments[segment], scalar_type, sizes))
        return entries
    except (ValueError, UnicodeDecodeError) as error:
        raise CorruptExportError(f"{label}: a malformed FlatTensor index ({error})") from None
