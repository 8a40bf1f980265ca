"""OpenVINO IR: the `Const` layers of the `.xml`, whose bytes are at `offset`/`size` in the `.bin` beside it.

Layers that share bytes (OpenVINO writes identical constants once) are one stored tensor, named by their offset.
The `.xml` is never rewritten: a weights-only update changes the `.bin` alone.
"""

from __future__ import annotations

from pathlib import Path

from hfexport.rebind.stored import OPENVINO_DTYPES, Stored, inside, mapped, write_at


def _bin(file: str) -> str:
    return file.removesuffix(".xml") + ".bin"


def read(folder: Path, file: str) -> list[Stored]:
    import xml.etree.ElementTree as ElementTree

    root = ElementTree.parse(folder / file).getroot()
    data = mapped(folder / _bin(file))
    stored: dict[int, Stored] = {}
    for layer in root.iter("layer"):
        if layer.get("type") != "Const":
            continue
        attributes = layer.find("data")
        if attributes is None or attributes.get("offset") is None:
            continue
        offset, size = int(attributes.get("offset")), int(attributes.get("size"))
        element = attributes.get("element_type", "")
        dtype = OPENVINO_DTYPES.get(element, f"openvino:{element}")
        shape = [int(dim) for dim in attributes.get("shape", "").split(",") if dim.strip()]
        if offset not in stored and inside(data, offset, size):
            stored[offset] = Stored(f"@{offset}", _bin(file), offset, size, dtype, shape, data[offset:offset + size])
    return list(stored.values())


def write(folder: Path, file: str, stored: dict[str, Stored], updates: dict[str, bytes]) -> None:
    write_at(folder / _bin(file), [(stored[name].offset, data) for name, data in updates.items()])
