"""Refusing unsafe or corrupt exports before any backend reads them.

An export is a folder (`export.json` and the files it names) that may come from a stranger. Three things are
checked here, each before the engine or a backend sees the file:
- every file hfexport or a backend opens resolves inside the export folder (for a Hub download: inside that
  revision's snapshot folder and the repo's blob store the cache links to), is a regular file (no device, FIFO or
  directory) and is no larger than its kind allows (`checked_file`);
- `export.json` is strict JSON (no duplicate keys, NaN or infinities, bounded size), valid against
  `schemas/export_manifest.schema.json`, and names only allowlisted classes: the engine's manifest stores pytree
  specs (`in_spec`/`out_spec`, written by `treespec_dumps`) whose node types it imports and registers, and cache
  contexts (`{"_t": "seq"|"map"|"obj"|"type", "p": "module:Class", ...}`) whose classes it imports and *calls*
  when it rebuilds outputs (transformers 5.23, `exporters.exporter_dynamo`): a crafted
  `{"_t": "seq", "p": "os:system", "v": ["..."]}` runs a shell command on the first call of a loaded export;
- each program file is what its exporter writes: checked by its format's program (`FormatProgram.check_files`,
  called by `hfexport.formats.programs.check_program_files`) with this module's readers; the checks live in the
  formats' packages (`formats/onnx/file_check`, `formats/openvino/file_check`, `formats/executorch/file_check`,
  `formats/torch_export/pt2_safety`).

What would run code or read outside the folder raises `UnsafeExportError`; what is merely broken raises
`CorruptExportError`. Both name the file and the field. See docs/security.md.
"""

from __future__ import annotations

import json
import os
import stat
from pathlib import Path
from typing import Any

from hfexport.errors import CorruptExportError, UnsafeExportError
from hfexport.files import MANIFEST_FILE
from hfexport.formats import formats
from hfexport.safety.treespec import (
    TREESPEC_FIELDS,
    check_file_name,
    check_treespec,
    loads_checked,
)
from hfexport.schema import schema_validator

MAX_MANIFEST_BYTES = 16 << 20
MAX_JSON_BYTES = 64 << 20  # configs, tokenizer files, the recipe copy
MAX_ARTIFACT_BYTES = 1 << 40  # weights (`.data`, `.bin`, `.pt2`, `.pte`, `.ptd`): 1 TiB, then bounded by the file's own index


# ── files: inside the folder, regular, bounded ───────────────────────────────


def size_bound(name: str) -> int:
    """The largest file of this kind hfexport opens: JSON documents are small, a format's program file as large as its
    backend allows (`FormatBackend.max_program_bytes`), weights are bounded later by the index their program keeps
    (ONNX external data, OpenVINO `Const` layers, the `.pt2` zip directory)."""
    if name.endswith(".json"):
        return MAX_MANIFEST_BYTES if name.rsplit("/", 1)[-1] == MANIFEST_FILE else MAX_JSON_BYTES
    for backend in formats():
        if backend.max_program_bytes is not None and name.endswith(backend.suffix):
            return backend.max_program_bytes
    return MAX_ARTIFACT_BYTES


def checked_file(folder: Path, name: str, *, source: str, roots: tuple[Path, ...] = (), required: bool = True,
                 max_bytes: int | None = None) -> Path | None:
    """`folder/name` once it is proven to be a regular file inside `folder` (or inside one of `roots`, e.g. the Hub
    cache's blob store), no larger than `max_bytes` (default: `size_bound(name)`); None for a missing optional file.

    Links are followed only to check where they lead: one that leaves the folder (the file, or any folder on the
    way) raises `UnsafeExportError`, as do device files, FIFOs, sockets and directories."""
    label = f"{source}/{name}"
    check_file_name(name, source)
    path = Path(folder) / name
    try:
        real = path.resolve(strict=True)
    except FileNotFoundError:
        if os.path.lexists(path):  # a dangling link: where it points is outside anything we checked
            raise UnsafeExportError(f"{label}: a link to a missing file: refused") from None
        if required:
            raise CorruptExportError(f"{label}: missing (named by {MANIFEST_FILE})") from None
        return None
    except (OSError, RuntimeError) as error:  # a link loop, a permission error
        raise CorruptExportError(f"{label}: cannot be resolved ({getattr(error, 'strerror', None) or error})") from None
    allowed = [Path(folder).resolve(), *(Path(root).resolve() for root in roots)]
    if not any(real == root or real.is_relative_to(root) for root in allowed):
        raise UnsafeExportError(f"{label}: resolves to {real}, outside the export folder: refused (a link leaving "
                                "the folder could make a loader read any file)")
    mode = os.stat(real).st_mode
    if not stat.S_ISREG(mode):
        kind = "a directory" if stat.S_ISDIR(mode) else "a FIFO" if stat.S_ISFIFO(mode) else \
            "a device" if stat.S_ISCHR(mode) or stat.S_ISBLK(mode) else "a socket" if stat.S_ISSOCK(mode) else \
            "not a regular file"
        raise UnsafeExportError(f"{label}: {kind}, not a regular file: refused")
    bound = size_bound(name) if max_bytes is None else max_bytes
    size = os.stat(real).st_size
    if size > bound:
        raise CorruptExportError(f"{label}: {size} bytes, more than the {bound} a {Path(name).suffix or 'such'} file "
                                 "of an export may have: refused")
    return path


def read_checked(path: Path, label: str, max_bytes: int) -> bytes:
    """The bytes of a file `checked_file` returned, read without following a link swapped in meanwhile at the last
    step (`O_NOFOLLOW` on the resolved path) and never more than `max_bytes`."""
    try:
        fd = os.open(Path(path).resolve(strict=True), os.O_RDONLY | getattr(os, "O_NOFOLLOW", 0)
                     | getattr(os, "O_NONBLOCK", 0))
    except OSError as error:
        raise CorruptExportError(f"{label}: cannot be read ({error.strerror or error})") from None
    with os.fdopen(fd, "rb") as file:
        info = os.fstat(file.fileno())
        if not stat.S_ISREG(info.st_mode):
            raise UnsafeExportError(f"{label}: not a regular file: refused")
        data = file.read(max_bytes + 1)
    if len(data) > max_bytes:
        raise CorruptExportError(f"{label}: more than {max_bytes} bytes: refused")
    return data


def read_json(path: Path, label: str, max_bytes: int = MAX_JSON_BYTES) -> Any:
    """A small JSON file of an export (a config, the recipe copy), strictly parsed: for loaders that take a dict."""
    return loads_checked(read_checked(path, label, max_bytes), label, "$")


# ── export.json ──────────────────────────────────────────────────────────────


def _manifest_validator():
    return schema_validator("export_manifest")  # the formats registered, a test's stub included


def check_manifest(manifest: Any, source: str = MANIFEST_FILE) -> None:
    """Refuse a manifest that is not valid against `export_manifest.schema.json` (`CorruptExportError`), or that names
    anything but allowlisted classes or files outside its folder (`UnsafeExportError`)."""
    errors = sorted(_manifest_validator().iter_errors(manifest), key=lambda e: (len(e.absolute_path), e.json_path))
    if errors:
        raise CorruptExportError(f"{source}: {_schema_message(errors[0])}")
    for name, entry in manifest["components"].items():
        where = f"components.{name}"
        check_file_name(entry["file"], source, f"{where}.file")
        metadata = entry["metadata"]
        for field in TREESPEC_FIELDS:
            if metadata.get(field) is not None:
                check_treespec(metadata[field], source, f"{where}.metadata.{field}")


def _schema_message(error) -> str:
    """One line for a schema error: its JSON path and what was expected (inside a `oneOf`, the branch that got
    furthest)."""
    if error.validator in ("oneOf", "anyOf") and error.context:
        deepest = max(error.context, key=lambda sub: len(sub.absolute_path))
        if len(deepest.absolute_path) > len(error.absolute_path):
            return _schema_message(deepest)
    path = "$" + "".join(f"[{part}]" if isinstance(part, int) else f".{part}" for part in error.absolute_path)
    value = json.dumps(error.instance, default=str)
    value = value if len(value) <= 60 else value[:57] + "..."
    if error.validator == "enum":
        expected = ", ".join(json.dumps(option) for option in error.validator_value[:8])
        more = ", ..." if len(error.validator_value) > 8 else ""
        return f"{path}: {value} is not allowed (expected one of {expected}{more})"
    if error.validator in ("oneOf", "anyOf"):
        return f"{path}: {value} is not valid here" + (f" ({error.schema['description']})"
                                                        if "description" in error.schema else "")
    return f"{path}: {error.message if len(error.message) <= 160 else error.message[:157] + '...'}"


def check_manifest_file(path: str | Path, source: str | None = None) -> dict:
    """Read an `export.json` (a regular file, bounded size, strict JSON), check it, and return it."""
    path = Path(path)
    source = source or str(path)
    manifest = loads_checked(read_checked(path, source, MAX_MANIFEST_BYTES), source, "$")
    check_manifest(manifest, source)
    return manifest


ALIGNMENT_SLACK = 4096  # a writer may pad a weights file to a page


def read_checked_prefix(path: Path, label: str, count: int) -> bytes:
    """The first `count` bytes of a file `checked_file` returned (a file identifier)."""
    try:
        with open(Path(path).resolve(strict=True), "rb") as file:
            return file.read(count)
    except OSError as error:
        raise CorruptExportError(f"{label}: cannot be read ({error.strerror or error})") from None
