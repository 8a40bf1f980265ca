"""Where each published target lives in a repo: the folders and file names the ecosystem's own loaders look for.

sentence-transformers and optimum's `ORTModel*` read `onnx/model.onnx` (+ `onnx/model.onnx_data`), transformers.js
`onnx/model.onnx` and, by `dtype`, `onnx/model_quantized.onnx` ("q8"), `onnx/model_q4.onnx` ("q4"),
`onnx/model_fp16.onnx` ("fp16"); sentence-transformers and optimum-intel's `OVModel*` read
`openvino/openvino_model.xml/.bin`, and sentence-transformers names its static int8 OpenVINO model
`openvino/openvino_model_qint8_quantized.xml`. So a forward-mode target is published by default into the folder of
its format (`onnx/`, `openvino/`, `executorch/`, `torch-export/`) under the file name that says what it is
(`artifact_name`): several targets of one format share the folder when their names differ.

Places, variants, the generation contracts' folders and a recipe's `path`: docs/publishing.md, "Where each target
lives". Pure names and rules: no Hub, no engine (the file names themselves are `hfexport.files`').
"""

from __future__ import annotations

import posixpath
import re
from dataclasses import dataclass

from hfexport.errors import HfExportError
from hfexport.files import EXPORTS_DIR, MANIFEST_FILE, RECIPE_COPY_FILE, REPORT_FILE
from hfexport.formats import find_format, formats
from hfexport.formats.onnx.backend import ONNX_DATA_SUFFIX, onnx_data_name  # noqa: F401 - re-exported

LEGACY_FOLDER = EXPORTS_DIR
FORMAT_FOLDERS = {backend.name: backend.folder for backend in formats()}
#: One user-facing name per format, wherever a person reads it (the Space, the CLI, the report, the card):
#: `format_label`, each format's `label`. The recipe's `export_format` holds the engine's name (`dynamo`,
#: `executorch`); every other spelling people use (each format's `aliases`) is accepted where a format is typed (a
#: recipe's `export_format`, the CLI's `--format`) and means that format: `canonical_format`. Published folders keep
#: the loaders' conventions (`FORMAT_FOLDERS`).
FORMAT_LABELS = {backend.name: backend.label for backend in formats()}
FORMAT_ALIASES = {alias: backend.name for backend in formats() for alias in backend.aliases}


def canonical_format(name: str) -> str:
    """`name` as the engine's format name (`pt2` -> `dynamo`); an unknown name is returned as it is."""
    text = str(name).strip().lower()
    return text if find_format(text) else FORMAT_ALIASES.get(text, str(name))


def format_label(name: str) -> str:
    """The one name people read for a format (`dynamo`, `pt2` -> `torch.export`); an unknown name as it is."""
    return FORMAT_LABELS.get(canonical_format(name), str(name))


#: The artifact file name each format's engine writes for a forward target, and its loaders' default name.
DEFAULT_NAMES = {backend.name: backend.default_file for backend in formats()}
#: A variant's stem: no dot, so `<stem>.` names its files unambiguously; never one that would claim the default
#: target's files (`export.json` starts with `export.`).
_STEM = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_-]{0,99}$")
RESERVED_STEMS = frozenset({"export", "export_config", "export_report", "config", "generation_config", "model",
                            "openvino_model", "README", "tokenizer", "tokenizer_config", "special_tokens_map"})
_PART = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]*$")

class LayoutError(HfExportError, ValueError):
    """A target path or file name that is not a plain relative one (`json_path`: the recipe field), or two targets
    that would share one (`target`: one of them)."""


@dataclass(frozen=True)
class Place:
    """Where one target is published: its folder and, for a variant, its artifact's stem (None: the folder's default
    target, whose hfexport files have their plain names)."""

    folder: str
    stem: str | None = None

    @property
    def prefix(self) -> str:
        """What the names of this target's files start with in the repo (`""` for the folder's default target)."""
        return f"{self.stem}." if self.stem else ""

    @property
    def manifest(self) -> str:
        return self.path(MANIFEST_FILE)

    def path(self, name: str) -> str:
        """The repo path of one of hfexport's per-target files (`export_report.json`, `export_config.json`, ...)."""
        return f"{self.folder}/{self.prefix}{name}" if self.folder else f"{self.prefix}{name}"

    def label(self) -> str:
        """How the card and the PR description name it: `onnx/` or `onnx/model_quantized.*`."""
        return f"{self.folder}/{self.stem}.*" if self.stem else f"{self.folder}/"

    @property
    def legacy(self) -> bool:
        return self.folder.startswith(LEGACY_FOLDER + "/")


def check_path(path: object, where: str = "path") -> str:
    """`path` as a normalized relative folder: POSIX parts of letters, digits, `._-`, none starting with a dot (no
    `..`, no hidden folder), not absolute, not the repo root, not `exports/` (the legacy folder is hfexport's)."""
    if not isinstance(path, str) or not path.strip():
        raise LayoutError(f"{where}: expected a relative folder such as 'onnx' or 'onnx/int8', got {path!r}",
                          json_path=where)
    text = path.strip().strip("/") if not path.startswith("/") else path
    parts = text.split("/")
    if path.startswith("/") or "\\" in path or any(not _PART.match(part) for part in parts):
        raise LayoutError(f"{where}: {path!r} is not a relative folder (parts of letters, digits, '._-', none "
                          "starting with '.'; no '..', no leading '/')", json_path=where)
    if parts[0] == LEGACY_FOLDER:
        raise LayoutError(f"{where}: {path!r} is inside {LEGACY_FOLDER}/, the folder of older publications",
                          json_path=where)
    return "/".join(parts)


def check_file_name(name: object, export_format: str, where: str = "file_name") -> str:
    """A recipe's `file_name`: a plain name with its format's suffix (`.onnx`, `.xml`, `.pte`, `.pt2`) whose stem is
    letters, digits, `_-` (no dot, no folder), not one of hfexport's or the loaders' own names."""
    backend = find_format(export_format)
    suffix = backend.suffix if backend else None
    if not isinstance(name, str) or suffix is None or not name.endswith(suffix):
        raise LayoutError(f"{where}: {name!r} is not a file name for {export_format} (expected '<name>{suffix}', "
                          f"e.g. {backend.default_file if backend else 'model' + str(suffix)!r})", json_path=where)
    stem = name[: -len(suffix)]
    if name != backend.default_file and (not _STEM.match(stem) or stem in RESERVED_STEMS):
        raise LayoutError(f"{where}: {name!r}: the part before {suffix} must be letters, digits, '_' or '-' (no dot, "
                          f"no folder) and none of {', '.join(sorted(RESERVED_STEMS))}", json_path=where)
    return name


def format_folder(export_format: str) -> str:
    backend = find_format(export_format)
    return backend.folder if backend else export_format


def legacy_folder(target: str) -> str:
    return f"{LEGACY_FOLDER}/{target}"


def artifact_name(export_format: str, quantization: dict | None = None, dtype: str | None = None) -> str | None:
    """The file name the loaders use for a forward target of this kind, None where they have none.

    ONNX: `model.onnx`; 8-bit quantized (ONNX Runtime dynamic or static int8/uint8, NNCF int8, the x86 Inductor PT2E
    preset): `model_quantized.onnx`, transformers.js' `dtype: "q8"` file (sentence-transformers opens it with
    `file_name`); 4-bit weights (NNCF int4, ONNX Runtime static int4/uint4): `model_q4.onnx` (`dtype: "q4"`); a
    float16 graph (a checkpoint stored in float16, exported at its own dtype): `model_fp16.onnx` (`dtype: "fp16"`).
    OpenVINO: `openvino_model.xml`; int8 weights and activations (NNCF quantize, the x86 Inductor PT2E preset):
    `openvino_model_qint8_quantized.xml`, sentence-transformers' name for its static int8 model. Everything else
    quantized (fp8 modes, OpenVINO weight-only compression, quantized ExecuTorch and torch.export programs) has no
    name the loaders look for: None."""
    backend = find_format(export_format)
    return backend.artifact_name(quantization, dtype) if backend else None


def place_for(folder: str, export_format: str, name: str | None) -> Place:
    """The place of a target named `name` (an artifact file name) in `folder`: a variant unless it is the default."""
    if not name or name == _default_name(export_format):
        return Place(folder)
    return Place(folder, name[: -len(find_format(export_format).suffix)])


def assign_places(targets: dict[str, dict], existing: dict[str, Place] | None = None,
                  foreign: set[str] = frozenset()) -> dict[str, Place]:
    """{target: Place} for the targets being published.

    `targets`: name -> {"export_format", "mode", "path" (the recipe's, or None), "file_name" (the recipe's, or None),
    "artifact" (`artifact_name` of what it is, or None)}; `existing`: name -> Place of the targets the repo (or the
    pull request) already holds. A recipe's path or file name wins; a target already published in the new layout keeps
    its place; otherwise a forward target with a conventional name claims it in its format's folder, in name order,
    when no other target holds that name there and the folder holds no other tool's files (`foreign`: folders with
    files that are no hfexport target's, such as an `onnx/` another tool wrote), and the rest go to
    `<format folder>/<target>/`. Two targets never share a place.
    """
    existing = {name: place for name, place in (existing or {}).items() if not place.legacy}
    assigned: dict[str, Place] = {}
    for name, spec in targets.items():
        if spec.get("path") or spec.get("file_name"):
            folder = check_path(spec["path"], f"targets.{name}.path") if spec.get("path") else None
            file_name = check_file_name(spec["file_name"], spec["export_format"], f"targets.{name}.file_name") \
                if spec.get("file_name") else None
            if folder is None:
                folder = format_folder(spec["export_format"])
            assigned[name] = place_for(folder, spec["export_format"], file_name)
        elif name in existing:
            assigned[name] = existing[name]

    def taken(place: Place, name: str) -> bool:
        held = {**existing, **assigned}
        return any(other != name and where == place for other, where in held.items())

    for name in sorted(targets, key=lambda n: (targets[n].get("mode", "forward") != "forward", n)):
        if name in assigned:
            continue
        spec = targets[name]
        base = format_folder(spec["export_format"])
        # A generation target in its loaders' contract claims the folder like a forward target; an ONNX one also
        # under a variant's name (`model_quantized.onnx`, `model_fp16.onnx`: transformers.js opens it by `dtype`).
        artifact = spec.get("artifact") if spec.get("mode", "forward") == "forward" or \
            spec.get("loaders_contract") and (spec.get("artifact") == _default_name(spec["export_format"])
                                              or _generation_variants(spec["export_format"])) else None
        wanted = place_for(base, spec["export_format"], artifact)
        free = artifact is not None and not taken(wanted, name) and base not in foreign
        assigned[name] = wanted if free else Place(posixpath.join(base, name))
    held = {**existing, **assigned}
    for name, place in assigned.items():
        clash = [other for other, where in held.items() if other != name and where == place]
        if clash:
            raise LayoutError(f"targets {name!r} and {clash[0]!r} would both be published to {place.label()}: give "
                              "one of them another `path` or `file_name` in the recipe", target=name)
    return assigned


def _default_name(export_format: str) -> str | None:
    backend = find_format(export_format)
    return backend.default_file if backend else None


def _generation_variants(export_format: str) -> bool:
    backend = find_format(export_format)
    return backend is not None and backend.generation_variants


def published_name(place: Place, relative: str, export_format: str) -> str:
    """The name in `place.folder` of a target's file `relative` (as the job saved it in `OUTPUT/<target>/`).

    The default target keeps its names, but ONNX external data `X.onnx.data` (what the engine writes) becomes
    `X.onnx_data`. A variant's artifact `model.onnx` becomes `<stem>.onnx` (`<stem>.onnx_data`; OpenVINO
    `<stem>.xml/.bin`; ExecuTorch `<stem>.pte/.ptd`, ...), and its other files `<stem>.<name>` (`<stem>.export.json`, `<stem>.config.json`, ...)."""
    backend = find_format(export_format)
    default = backend.default_file if backend else ""
    stem_default, _, suffix = default.rpartition(".")
    if backend is not None:
        relative = backend.published_file(relative)
    if not place.stem:
        return relative
    if default and relative == default:
        return f"{place.stem}.{suffix}"
    if backend is not None and relative in backend.companion_files:  # `model.onnx_data` -> `<stem>.onnx_data`
        return place.stem + relative.removeprefix(stem_default)
    return place.prefix + relative


MANIFEST = MANIFEST_FILE
RECIPE_COPY = RECIPE_COPY_FILE


def _manifest_place(path: str) -> Place | None:
    """The Place whose manifest is repo path `path` (`<folder>/export.json` or `<folder>/<stem>.export.json`)."""
    folder, _, name = path.rpartition("/")
    if name == MANIFEST:
        return Place(folder)
    stem = name.removesuffix("." + MANIFEST)
    if stem != name and _STEM.match(stem) and stem not in RESERVED_STEMS:
        return Place(folder, stem)
    return None


def export_places(paths) -> set[Place]:
    """The places among repo `paths` that hold a published target (a manifest); folder `""` for the root."""
    return {place for place in map(_manifest_place, paths) if place is not None}


def export_folders(paths) -> set[str]:
    """The folders among repo `paths` that hold a published target (a manifest), `""` for the root."""
    return {place.folder for place in export_places(paths)}


def in_export_folder(path: str, folders: set[str]) -> bool:
    """Whether `path` is one of a published target's own files (directly in its folder or in one of its variants'
    folders, `openvino/int4/`) or under `exports/`."""
    parent = path.rsplit("/", 1)[0] if "/" in path else ""
    if "/" in parent and parent.rsplit("/", 1)[1] in variant_folders() and parent.rsplit("/", 1)[0] in folders:
        return True
    return path.startswith(LEGACY_FOLDER + "/") or parent in folders


def variant_folders() -> set[str]:
    """The folders a target's `variants` are made in inside its own (OpenVINO's `int8/`, `int4/`): each format's
    `variant_file` that names a folder."""
    return {name.split("/")[0] for backend in formats() for name in map(backend.variant_file, backend.variants)
            if "/" in name}


def place_files(place: Place, paths) -> list[str]:
    """The names (in `place.folder`) of the files among repo `paths` that belong to the target at `place`: a variant's
    start with its stem and a dot; the default target's are the folder's others, less every variant's, and the files
    of its `variants`' folders (`int4/openvino_model.xml`)."""
    nested = variant_folders()
    names = [path[len(place.folder) + 1:] for path in paths
             if "/" in path and (path.rsplit("/", 1)[0] == place.folder or
                                 not place.stem and path.rsplit("/", 2)[0] == place.folder and
                                 path.count("/") >= 2 and path.rsplit("/", 2)[1] in nested)]
    if place.stem:
        return sorted(name for name in names if name.startswith(place.prefix))
    variants = tuple(other.prefix for other in export_places(paths) if other.folder == place.folder and other.stem)
    return sorted(name for name in names if not variants or not name.startswith(variants))


def target_of_recipe_copy(text: str) -> str | None:
    """The one target a saved recipe copy (`export_config.json` beside an export) describes, or None."""
    import json

    try:
        targets = json.loads(text).get("targets")
    except (ValueError, AttributeError):
        return None
    return next(iter(targets)) if isinstance(targets, dict) and len(targets) == 1 else None


def target_places(paths, read_text) -> dict[str, Place]:
    """{target: Place} of the targets published among repo `paths`; `read_text(path)` reads a (small) recipe copy.
    Legacy `exports/<target>/` folders are named by the folder; a target found twice keeps the new-layout place."""
    found: dict[str, Place] = {}
    paths = set(paths)
    for place in sorted(export_places(paths), key=lambda p: (p.legacy, p.folder, p.stem or "")):
        if place.legacy and place.folder.count("/") == 1 and not place.stem:
            name = place.folder.split("/", 1)[1]
        else:
            copy = place.path(RECIPE_COPY)
            name = target_of_recipe_copy(read_text(copy) or "") if copy in paths else None
        if name and name not in found:
            found[name] = place
    return found


def target_folders(paths, read_text) -> dict[str, str]:
    """{target: folder} of the targets published among repo `paths` (`target_places`' folders)."""
    return {name: place.folder for name, place in target_places(paths, read_text).items()}


REPORT = REPORT_FILE
