"""File names and writes every stage shares: the recipe copy saved beside each export, atomic JSON writes and
atomic target folders, file listings with sizes and hashes.
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import tempfile
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
