"""torch.export's programs: a `.pt2` checked and loaded without running code (weights-only unpickling, allowlisted
tree specs), its weights rewritten in place."""

from __future__ import annotations

from pathlib import Path

from hfexport.engine import register_treespec_types
from hfexport.formats.backend import FormatProgram
from hfexport.formats.torch_export import weights
from hfexport.formats.torch_export.pt2_safety import (
    check_pt2_archive,
    pt2_unpickling_allowlist,
    weights_only_unpickling,
)


class TorchExportProgram(FormatProgram):
    name = "dynamo"
    weights = weights

    def read(self, path: Path, fetch, entry: dict, allow_unsafe_pt2: bool):
        from transformers.exporters import DynamoExporter

        # A program whose inputs hold a cache needs the (allowlisted) cache classes registered as pytree nodes first.
        for field in ("in_spec", "out_spec"):
            if entry["metadata"].get(field):
                register_treespec_types(entry["metadata"][field])
        if allow_unsafe_pt2:  # the caller trusts the source: torch's own load, its unpickling included
            import torch

            with torch.serialization.safe_globals(pt2_unpickling_allowlist()):
                return DynamoExporter.load_program(path)
        with weights_only_unpickling():
            return DynamoExporter.load_program(path)

    def check_files(self, found: list, file: str, label: str, source: str, allow_unsafe_pt2: bool) -> None:
        if not allow_unsafe_pt2:
            check_pt2_archive(found[0], label)
