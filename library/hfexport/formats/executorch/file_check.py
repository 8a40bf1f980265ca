"""What an ExecuTorch program's files must be before the runtime opens them (`ExecutorchProgram.check_files`): the
`.pte`'s file identifier (the runtime verifies the flatbuffer itself), the `.ptd` beside it a well-formed FlatTensor
(docs/security.md)."""

from __future__ import annotations

import mmap
import os
from pathlib import Path

from hfexport.errors import CorruptExportError
from hfexport.formats.executorch.ptd import read_flat_tensor
from hfexport.safety.artifacts import read_checked_prefix


def check_pte_file(path: Path, label: str) -> None:
    """An ExecuTorch program: the flatbuffer's `ET` file identifier; the runtime then verifies the whole flatbuffer
    (`Verification.InternalConsistency`, the engine's default) before it runs anything."""
    head = read_checked_prefix(path, label, 8)
    if len(head) < 8 or head[4:6] != b"ET":
        raise CorruptExportError(f"{label}: not an ExecuTorch program (no ET file identifier)")


def check_ptd_file(path: Path, label: str) -> None:
    """An ExecuTorch data file (`.ptd`, beside its `.pte`): plain data, a FlatTensor whose index
    (`ptd.read_flat_tensor`) is well-formed and places every named entry inside the file. It names no other
    file: the loader passes it to the runtime as the program's data map, and nothing in it runs."""
    try:
        with open(Path(path).resolve(strict=True), "rb") as file:
            data = mmap.mmap(file.fileno(), 0, access=mmap.ACCESS_READ) if os.fstat(file.fileno()).st_size else b""
    except OSError as error:
        raise CorruptExportError(f"{label}: cannot be read ({error.strerror or error})") from None
    read_flat_tensor(memoryview(data), label)  # the map closes when collected (a refusal's traceback holds views)
