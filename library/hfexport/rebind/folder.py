"""The weight map of an export folder: recorded into its `export.json` after a full export, read back checked, and
a previous export's folder copied with a new checkpoint's weights rebound into it."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

from hfexport.files import MANIFEST_FILE, REPORT_FILE, write_json_atomic
from hfexport.formats.programs import format_program
from hfexport.rebind.weight_map import RebindRefused, apply, build, refusal, weight_writer
from hfexport.safety.artifacts import check_manifest, check_manifest_file


def record(folder: Path, model, key: str) -> dict:
    """Build the weight map of the export just saved in `folder` from `model` and add it to its `export.json`."""
    manifest = json.loads((folder / MANIFEST_FILE).read_text(encoding="utf-8"))
    manifest["weight_map"] = build(folder, manifest, model, key)
    check_manifest(manifest, str(folder / MANIFEST_FILE))
    write_json_atomic(folder / MANIFEST_FILE, json.dumps(manifest, indent=2) + "\n")
    return manifest["weight_map"]


def previous(folder: Path, key: str, model=None) -> tuple[dict | None, str | None]:
    """(the checked manifest, None) when the export in `folder` can take `model`'s weights with rebind key `key`; else
    (None, why not)."""
    if not (folder / MANIFEST_FILE).is_file():
        return None, None
    try:
        manifest = check_manifest_file(folder / MANIFEST_FILE)
    except Exception as error:  # noqa: BLE001 - an unreadable previous export: export
        return None, f"the previous export's {MANIFEST_FILE} is unreadable: {error}"
    if weight_writer(manifest["export_format"]) is None:
        return None, f"{manifest['export_format']} exports are not rebound"
    reason = refusal(manifest.get("weight_map"), key, model)
    return (None, reason) if reason else (manifest, None)


def rebind_copy(source: Path, destination: Path, manifest: dict, model=None, tensors=None) -> int:
    """Copy the export in `source` (all but its report) to `destination`, then write `model`'s weights (or
    `tensors`': a checkpoint streamed from its shards, `hfexport.rebind.checkpoint`) into the copy through the
    manifest's weight map. Returns the bytes of weights written; raises `RebindRefused`."""
    for file in sorted(source.rglob("*")):
        relative = file.relative_to(source)
        if file.is_file() and relative.as_posix() != REPORT_FILE:
            (destination / relative).parent.mkdir(parents=True, exist_ok=True)
            shutil.copyfile(file, destination / relative)
    try:
        written = apply(destination, manifest, manifest["weight_map"], model, tensors)
        format_program(manifest["export_format"]).after_rebind(destination, model)  # files derived from the components
        return written
    except RebindRefused:
        raise
    except Exception as error:  # noqa: BLE001 - a file that does not read as the map says: no rebind
        raise RebindRefused(f"the previous export's files do not read as its weight map says: {error}") from None
