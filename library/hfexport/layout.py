"""Where each published target lives in a repo: the folders the ecosystem's own loaders look in.

sentence-transformers and optimum's `ORTModel*` read `onnx/model.onnx` (+ `onnx/model.onnx_data`), transformers.js
`onnx/model.onnx`, sentence-transformers and optimum-intel's `OVModel*` `openvino/openvino_model.xml/.bin`. So a
forward-mode target is published by default into the folder of its format (`onnx/`, `openvino/`, `executorch/`,
`torch-export/`), with hfexport's own files (`export.json`, `export_config.json`, `export_report.json`) beside the
artifacts, where no loader reads them. A second target of the same format, and every generation target (the engine
writes prefill/decode graphs, which no ONNX or OpenVINO loader of the ecosystem opens), goes into
`<format folder>/<target>/`. A recipe may set a target's `path` (relative, no `..`). Publications made before this
layout hold `exports/<target>/`, which stays readable.

Pure names and rules: no Hub, no engine (the file names themselves are `hfexport.files`').
"""

from __future__ import annotations

import posixpath
import re

from hfexport.files import EXPORTS_DIR, MANIFEST_FILE, RECIPE_COPY_FILE

LEGACY_FOLDER = EXPORTS_DIR
FORMAT_FOLDERS = {"onnx": "onnx", "openvino": "openvino", "executorch": "executorch", "dynamo": "torch-export"}
#: The external data file name the loaders download next to `model.onnx` (optimum, transformers.js: `<file>_data`).
ONNX_DATA_SUFFIX = "_data"
_PART = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]*$")


class LayoutError(ValueError):
    """A target path that is not a plain relative folder, or two targets that would share one."""


def check_path(path: object, where: str = "path") -> str:
    """`path` as a normalized relative folder: POSIX parts of letters, digits, `._-`, none starting with a dot (no
    `..`, no hidden folder), not absolute, not the repo root, not `exports/` (the legacy folder is hfexport's)."""
    if not isinstance(path, str) or not path.strip():
        raise LayoutError(f"{where}: expected a relative folder such as 'onnx' or 'onnx/int8', got {path!r}")
    text = path.strip().strip("/") if not path.startswith("/") else path
    parts = text.split("/")
    if path.startswith("/") or "\\" in path or any(not _PART.match(part) for part in parts):
        raise LayoutError(f"{where}: {path!r} is not a relative folder (parts of letters, digits, '._-', none "
                          "starting with '.'; no '..', no leading '/')")
    if parts[0] == LEGACY_FOLDER:
        raise LayoutError(f"{where}: {path!r} is inside {LEGACY_FOLDER}/, the folder of older publications")
    return "/".join(parts)


def format_folder(export_format: str) -> str:
    return FORMAT_FOLDERS.get(export_format, export_format)


def legacy_folder(target: str) -> str:
    return f"{LEGACY_FOLDER}/{target}"


def assign_folders(targets: dict[str, dict], existing: dict[str, str] | None = None,
                   foreign: set[str] = frozenset()) -> dict[str, str]:
    """{target: folder} for the targets being published.

    `targets`: name -> {"export_format", "mode", "path" (the recipe's, or None)}; `existing`: name -> folder of the
    targets the repo (or the pull request) already holds. A recipe's path wins; a target already published in the
    new layout keeps its folder; otherwise forward targets claim their format's folder in name order when no other
    target holds it and it holds no other files (`foreign`: folders with files that are no hfexport target's, such
    as an `onnx/` another tool wrote), and the rest go to `<format folder>/<target>`. Two targets never share a
    folder.
    """
    existing = {name: folder for name, folder in (existing or {}).items()
                if not folder.startswith(LEGACY_FOLDER + "/")}
    assigned: dict[str, str] = {}
    for name, spec in targets.items():
        if spec.get("path"):
            assigned[name] = check_path(spec["path"], f"targets.{name}.path")
        elif name in existing:
            assigned[name] = existing[name]

    def taken(folder: str, name: str) -> bool:
        held = {**existing, **assigned}
        return any(other != name and where == folder for other, where in held.items())

    for name in sorted(targets, key=lambda n: (targets[n].get("mode", "forward") != "forward", n)):
        if name in assigned:
            continue
        spec = targets[name]
        base = format_folder(spec["export_format"])
        forward = spec.get("mode", "forward") == "forward"
        free = not taken(base, name) and base not in foreign
        assigned[name] = base if forward and free else posixpath.join(base, name)
    held = {**existing, **assigned}
    for name, folder in assigned.items():
        clash = [other for other, where in held.items() if other != name and where == folder]
        if clash:
            raise LayoutError(f"targets {name!r} and {clash[0]!r} would both be published to {folder}/: give one "
                              "of them another `path` in the recipe")
    return assigned


def onnx_data_name(model_file: str) -> str:
    """`model.onnx` -> `model.onnx_data`: the external data name optimum and transformers.js download."""
    return model_file + ONNX_DATA_SUFFIX


MANIFEST = MANIFEST_FILE
RECIPE_COPY = RECIPE_COPY_FILE


def export_folders(paths) -> set[str]:
    """The folders among repo `paths` that hold a published target (an `export.json` manifest), `""` for the root."""
    return {path.rsplit("/", 1)[0] if "/" in path else "" for path in paths
            if path == MANIFEST or path.endswith("/" + MANIFEST)}


def in_export_folder(path: str, folders: set[str]) -> bool:
    """Whether `path` is one of a published target's own files (directly in its folder) or under `exports/`."""
    parent = path.rsplit("/", 1)[0] if "/" in path else ""
    return path.startswith(LEGACY_FOLDER + "/") or parent in folders


def target_of_recipe_copy(text: str) -> str | None:
    """The one target a saved recipe copy (`export_config.json` beside an export) describes, or None."""
    import json

    try:
        targets = json.loads(text).get("targets")
    except (ValueError, AttributeError):
        return None
    return next(iter(targets)) if isinstance(targets, dict) and len(targets) == 1 else None


def target_folders(paths, read_text) -> dict[str, str]:
    """{target: folder} of the targets published among repo `paths`; `read_text(path)` reads a (small) recipe copy.
    Legacy `exports/<target>/` folders are named by the folder; a target found twice keeps the new-layout folder."""
    found: dict[str, str] = {}
    for folder in sorted(export_folders(paths), key=lambda f: (f.startswith(LEGACY_FOLDER + "/"), f)):
        if folder.startswith(LEGACY_FOLDER + "/") and folder.count("/") == 1:
            name = folder.split("/", 1)[1]
        else:
            copy = f"{folder}/{RECIPE_COPY}" if folder else RECIPE_COPY
            name = target_of_recipe_copy(read_text(copy) or "") if copy in paths else None
        if name and name not in found:
            found[name] = folder
    return found
