"""`.pt2`: the archive's weight and constant storages (`*/data/weights/*`, `*/data/constants/*`), each a stored,
uncompressed zip entry holding a tensor's raw bytes. A rebind overwrites an entry's bytes in place and puts its new
CRC-32 where the zip keeps it (the local header, a data descriptor, the central directory), so the archive is the
same zip with other weights; torch.export's own loader and hfexport's archive check read it as any other."""

from __future__ import annotations

import struct
import zipfile
import zlib
from pathlib import Path

from hfexport.rebind.stored import Stored, inside, mapped, write_at

_LOCAL, _CENTRAL, _DESCRIPTOR = 0x04034B50, 0x02014B50, 0x08074B50


def _is_tensor(name: str) -> bool:
    parts = name.split("/")
    return len(parts) >= 3 and parts[-2] in ("weights", "constants") and parts[-3] == "data" \
        and not parts[-1].endswith(".json")


def _data_offset(view: memoryview, info: zipfile.ZipInfo) -> int:
    signature, = struct.unpack_from("<L", view, info.header_offset)
    if signature != _LOCAL:
        raise ValueError(f"{info.filename}: no local file header")
    name_length, extra_length = struct.unpack_from("<HH", view, info.header_offset + 26)
    return info.header_offset + 30 + name_length + extra_length


def read(folder: Path, file: str) -> list[Stored]:
    view = mapped(folder / file)
    stored = []
    with zipfile.ZipFile(folder / file) as archive:
        for info in archive.infolist():
            if not _is_tensor(info.filename) or info.compress_type != zipfile.ZIP_STORED:
                continue
            offset = _data_offset(view, info)
            if not inside(view, offset, info.file_size):
                continue
            stored.append(Stored(info.filename, file, offset, info.file_size, None, None,
                                 view[offset:offset + info.file_size]))
    return stored


def write(folder: Path, file: str, stored: dict[str, Stored], updates: dict[str, bytes]) -> None:
    path = folder / file
    write_at(path, [(stored[name].offset, data) for name, data in updates.items()])
    crcs = {name: zlib.crc32(data) for name, data in updates.items()}
    with zipfile.ZipFile(path) as archive:
        infos = {info.filename: info for info in archive.infolist() if info.filename in crcs}
        central = archive.start_dir
    patches = []
    with open(path, "rb") as handle:
        for name, info in infos.items():
            entry = stored[name]
            flags = info.flag_bits
            if not flags & 0x08 or info.CRC:  # the local header's CRC field (zero when a descriptor follows)
                handle.seek(info.header_offset + 14)
                if struct.unpack("<L", handle.read(4))[0] != 0 or not flags & 0x08:
                    patches.append((info.header_offset + 14, struct.pack("<L", crcs[name])))
            if flags & 0x08:
                at = entry.offset + entry.nbytes
                handle.seek(at)
                signature, = struct.unpack("<L", handle.read(4))
                patches.append((at + 4 if signature == _DESCRIPTOR else at, struct.pack("<L", crcs[name])))
        handle.seek(central)
        directory = handle.read()
    at = 0
    while at + 46 <= len(directory) and struct.unpack_from("<L", directory, at)[0] == _CENTRAL:
        name_length, extra_length, comment_length = struct.unpack_from("<HHH", directory, at + 28)
        name = directory[at + 46:at + 46 + name_length].decode("utf-8")
        if name in crcs:
            patches.append((central + at + 16, struct.pack("<L", crcs[name])))
        at += 46 + name_length + extra_length + comment_length
    write_at(path, patches)
