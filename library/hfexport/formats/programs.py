"""Each format's programs (`FormatProgram`, the artifacts layer), by the format's name, and what every format's files
go through the same way: the checks of a loaded export's program files."""

from __future__ import annotations

from pathlib import Path

from hfexport.files import MANIFEST_FILE
from hfexport.formats.backend import FormatProgram, format_traits
from hfexport.formats.executorch.program import ExecutorchProgram
from hfexport.formats.onnx.program import OnnxProgram
from hfexport.formats.openvino.program import OpenvinoProgram
from hfexport.formats.torch_export.program import TorchExportProgram
from hfexport.safety.artifacts import check_manifest_file, checked_file

_PROGRAMS: dict[str, FormatProgram] = {}


def register_program(program: type[FormatProgram] | FormatProgram):
    """Register a format's programs under its name (a class is instantiated); usable as a class decorator."""
    instance = program() if isinstance(program, type) else program
    _PROGRAMS[instance.name] = instance
    return program


def unregister_program(name: str) -> None:
    """Take a format's programs out of the registry (a test's stub format)."""
    _PROGRAMS.pop(name, None)


for _program in (OnnxProgram, OpenvinoProgram, ExecutorchProgram, TorchExportProgram):
    register_program(_program)


def format_program(export_format) -> FormatProgram:
    """The programs of the format named `export_format`; a bare `FormatProgram` (no hooks, reads nothing) for a format
    hfexport has none for."""
    return _PROGRAMS.get(str(getattr(export_format, "value", export_format))) or FormatProgram()


def check_program_files(manifest: dict, fetch, source: str, allow_unsafe_pt2: bool = False) -> dict[str, Path]:
    """Check every program file of a checked manifest (`fetch(name, required)` gives each one's checked path) the
    way its format needs; the checked paths by component."""
    export_format = manifest["export_format"]
    program = format_program(export_format)
    paths = {}
    for name, entry in manifest["components"].items():
        file = entry["file"]
        found = [fetch(member, required) for member, required in format_traits(export_format).program_files(file)]
        program.check_files(found, file, f"{source}/{file}", source, allow_unsafe_pt2)
        paths[name] = found[0]
    return paths


def check_export_folder(folder: str | Path) -> dict:
    """Check a local export folder without loading it: `export.json`, then every file it names and the files the
    loader reads beside them. Returns the manifest."""
    folder = Path(folder)
    source = str(folder)
    manifest = check_manifest_file(checked_file(folder, MANIFEST_FILE, source=source), f"{source}/{MANIFEST_FILE}")

    def fetch(name: str, required: bool) -> Path | None:
        return checked_file(folder, name, source=source, required=required)

    check_program_files(manifest, fetch, source)
    return manifest
