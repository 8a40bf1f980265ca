"""ExecuTorch `.pte`: not rebindable yet (no stored tensors listed), so its weight map leaves every parameter
uncovered and a rebind falls back to a full export."""

from __future__ import annotations

from pathlib import Path

from hfexport.rebind.stored import Stored


def read(folder: Path, file: str) -> list[Stored]:
    return []


def write(folder: Path, file: str, stored: dict[str, Stored], updates: dict[str, bytes]) -> None:
    raise NotImplementedError
