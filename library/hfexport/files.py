"""File names and writes every stage shares: the recipe copy saved beside each export, atomic JSON writes and
atomic target folders, file listings with sizes and hashes.
"""

from __future__ import annotations

import contextlib
import functools
import hashlib
import json
import os
import shutil
import tempfile
import threading
import time
import uuid
from collections.abc import Callable
from pathlib import Path

RECIPE_FILE = "export_config.json"  # the owner's recipe, next to the weights
RECIPE_COPY_FILE = RECIPE_FILE  # the recipe target saved beside each export: a one-target recipe of its own
MANIFEST_FILE = "export.json"  # the engine's manifest (transformers.exporters.base.EXPORT_MANIFEST_FILE)
REPORT_FILE = "export_report.json"  # a job's report, and each target's beside its files
EXPORTS_DIR = "exports"  # where publications before hfexport.layout put each target (exports/<target>/); still read


def write_json_atomic(path: Path, text: str) -> None:
    """Write a file aside, then rename it over the target: readers never see half a file."""
    path.parent.mkdir(parents=True, exist_ok=True)
    handle, temporary = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
    try:
        with os.fdopen(handle, "w", encoding="utf-8") as stream:
            stream.write(text)
        os.chmod(temporary, 0o644)
        os.replace(temporary, path)
    except BaseException:
        Path(temporary).unlink(missing_ok=True)
        raise


def file_entries(folder: Path) -> list[dict]:
    """Every file under a target folder with its size, paths relative to the folder, sorted."""
    return [
        {"path": file.relative_to(folder).as_posix(), "bytes": file.stat().st_size}
        for file in sorted(folder.rglob("*"))
        if file.is_file()
    ]


def human_bytes(count: int) -> str:
    for unit in ("B", "KB", "MB", "GB"):
        if count < 1000 or unit == "GB":
            return f"{count:.0f} {unit}" if unit == "B" else f"{count:.1f} {unit}"
        count /= 1000
    return f"{count} B"


def file_sha256(path: Path) -> str:
    from huggingface_hub.utils.sha import sha_fileobj

    with path.open("rb") as stream:
        return sha_fileobj(stream).hex()


def git_blob_sha1(path: Path) -> str:
    digest = hashlib.sha1(b"blob %d\0" % path.stat().st_size)
    with path.open("rb") as stream:
        for chunk in iter(lambda: stream.read(1 << 20), b""):
            digest.update(chunk)
    return digest.hexdigest()




def save_atomically(output: Path, name: str, write: Callable[[Path], None]) -> Path:
    """Run `write(staging_folder)`, then rename the folder to `output/name`; on any failure nothing is left."""
    output.mkdir(parents=True, exist_ok=True)
    final = output / name
    staging = output / f".{name}.partial-{uuid.uuid4().hex[:8]}"
    old = output / f".{name}.old-{uuid.uuid4().hex[:8]}"
    try:
        staging.mkdir()
        write(staging)
        if final.exists():
            os.replace(final, old)
        os.replace(staging, final)
    except BaseException:
        shutil.rmtree(staging, ignore_errors=True)
        if old.exists() and not final.exists():
            os.replace(old, final)  # put the previous export back
        raise
    shutil.rmtree(old, ignore_errors=True)
    return final


def keep_variant_folder(stage: Path, folder: Path, file_name: str) -> list[str]:
    """Move the variant in `stage` into `folder` as the folder of `file_name` (`int4/openvino_model.xml`), every file
    a real copy (no links); the names written, relative to `folder`. It is assembled aside and renamed into place,
    so `folder` never holds half of one."""
    stage, folder = Path(stage), Path(folder)
    name = Path(file_name).parent.name
    partial = folder / f".{name}.partial"
    shutil.rmtree(partial, ignore_errors=True)
    partial.mkdir()
    for path in sorted(stage.iterdir()):
        if path.is_symlink():
            shutil.copy2(path.resolve(), partial / path.name)
        elif path.is_file():
            os.replace(path, partial / path.name)
    remove_variant_folder(folder, file_name)
    os.replace(partial, folder / name)
    return sorted(f"{name}/{path.name}" for path in (folder / name).iterdir())


def remove_variant_folder(folder: Path, file_name: str) -> None:
    """The variant folder of `file_name` removed from `folder` (a previous export's)."""
    shutil.rmtree(Path(folder) / Path(file_name).parent.name, ignore_errors=True)


def read_json_object(path: Path) -> dict:
    """The JSON object in `path`, or {} where it is missing, unreadable or not an object (optional settings)."""
    try:
        value = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return {}
    return value if isinstance(value, dict) else {}


PAGE_SIZE = os.sysconf("SC_PAGE_SIZE") if hasattr(os, "sysconf") else 4096
_MADV_DONTNEED = 4


def current_rss() -> int:
    """This process's resident set size now, in bytes (0 where /proc does not say)."""
    try:
        with open("/proc/self/statm", "rb") as handle:
            return int(handle.read().split()[1]) * PAGE_SIZE
    except (OSError, ValueError, IndexError):
        return 0


def drop_file_pages(start: int, end: int) -> int:
    """Hand back this process's resident pages in [start, end) (addresses; whole pages inside only) that are still
    file pages (`/proc/self/pagemap`: present and file-backed, never copied on write): MADV_DONTNEED on those runs
    only, so they leave the resident set and are read again from the file (or the page cache), the same bytes, if
    touched again; a page the process wrote stays. Returns the bytes dropped (0 where /proc or libc does not allow)."""
    import ctypes
    import struct

    first, last = -(-start // PAGE_SIZE), end // PAGE_SIZE
    if first >= last:
        return 0
    try:
        madvise = ctypes.CDLL("libc.so.6", use_errno=True).madvise
        with open("/proc/self/pagemap", "rb") as pagemap:
            pagemap.seek(first * 8)
            entries = struct.unpack(f"{last - first}Q", pagemap.read((last - first) * 8))
    except (OSError, AttributeError, struct.error):
        return 0
    madvise.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int]
    dropped, run = 0, None
    for index, entry in enumerate([*entries, 0]):
        file_page = entry >> 63 & 1 and entry >> 61 & 1
        if file_page and run is None:
            run = index
        elif not file_page and run is not None:
            if madvise((first + run) * PAGE_SIZE, (index - run) * PAGE_SIZE, _MADV_DONTNEED) == 0:
                dropped += (index - run) * PAGE_SIZE
            run = None
    return dropped


def drop_tensor_pages(tensors) -> int:
    """`drop_file_pages` over the storages of `tensors` (CPU torch tensors; anything else skipped, each storage
    once): a mapped checkpoint's weights (transformers maps safetensors) leave the resident set and are read again
    from the file if touched, the same bytes; a page the process wrote stays. Returns the bytes dropped."""
    import torch

    dropped, seen = 0, set()
    for tensor in tensors:
        if not isinstance(tensor, torch.Tensor) or tensor.device.type != "cpu":
            continue
        storage = tensor.untyped_storage()
        start = storage.data_ptr()
        if start and start not in seen:
            seen.add(start)
            dropped += drop_file_pages(start, start + storage.nbytes())
    return dropped


def drop_mapped_folder(folder: Path, read_only: bool = False) -> int:
    """`drop_file_pages` on every mapping of a file inside `folder` (/proc/self/maps): a runtime that mapped an
    artifact's weights and made its own copy when it compiled (OpenVINO's CPU plugin repacks them) keeps only what
    it reads again. `read_only`: only the mappings no one can write (safe while the runtime still runs). Returns the
    bytes dropped."""
    root = os.path.realpath(folder) + os.sep
    dropped = 0
    try:
        with open("/proc/self/maps", encoding="utf-8", errors="replace") as maps:
            lines = maps.read().splitlines()
    except OSError:
        return 0
    for line in lines:
        fields = line.split(maxsplit=5)
        if len(fields) == 6 and fields[5].startswith(root) and not (read_only and "w" in fields[1]):
            low, high = (int(value, 16) for value in fields[0].split("-"))
            dropped += drop_file_pages(low, high)
    return dropped


@contextlib.contextmanager
def dropping_mapped_folder(folder: Path, every: float = 0.05):
    """`drop_mapped_folder` while the block runs (a runtime compiling an artifact it mapped): on `folder`'s read-only
    mappings every `every` seconds from a thread, then on all of them once the block ends. The pages OpenVINO's CPU
    plugin already repacked leave the resident set while it reads the next ones, instead of the whole `.bin` staying
    resident beside its copy until the compile ends (the gate's peak, issue 45); a page read again is read again from
    the page cache, the same bytes (a read-only mapping holds no page the process wrote)."""
    try:
        with repeating(functools.partial(drop_mapped_folder, folder, read_only=True), every, "hfexport-drop-mapped"):
            yield
    finally:
        drop_mapped_folder(folder)


@contextlib.contextmanager
def repeating(action, every: float, name: str):
    """`action()` every `every` seconds from a thread named `name` while the block runs, the pause growing by twice
    each call's time (a large file's scan: a third of a core at most); the thread joined when the block ends."""
    done = threading.Event()

    def run() -> None:
        pause = every
        while not done.wait(pause):
            started = time.perf_counter()
            action()
            pause = every + 2 * (time.perf_counter() - started)

    thread = threading.Thread(target=run, name=name, daemon=True)
    thread.start()
    try:
        yield
    finally:
        done.set()
        thread.join()
