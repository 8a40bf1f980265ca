"""The JSON Schemas shipped in `hfexport/schemas/` (recipes, reports, export manifests) and their validators."""

from __future__ import annotations

import copy
import json
from functools import lru_cache
from importlib import resources

from hfexport.formats import formats

#: Where a shipped schema lists the export formats, and whether it lists their aliases too (a recipe's spellings).
FORMAT_ENUMS = {"export_config": (("$defs", "format"), True), "export_manifest": (("properties", "export_format"), False)}


@lru_cache(maxsize=None)
def load_schema(name: str = "export_config") -> dict:
    """A JSON Schema shipped inside the package (`hfexport/schemas/<name>.schema.json`)."""
    text = resources.files("hfexport").joinpath("schemas").joinpath(f"{name}.schema.json").read_text(encoding="utf-8")
    return json.loads(text)


def format_enum(schema: dict, name: str) -> list:
    """The list of format names in schema `name` (`FORMAT_ENUMS`; empty for a schema that names no formats)."""
    if name not in FORMAT_ENUMS:
        return []
    node = schema
    for key in FORMAT_ENUMS[name][0]:
        node = node[key]
    return node["enum"]


def schema_validator(name: str):
    """The validator of a shipped schema. The format registry (`hfexport.formats`) says which formats exist: the
    shipped files list the built-in ones, and a format registered beside them (a test's stub) is accepted too."""
    listed = format_enum(load_schema(name), name)
    with_aliases = name in FORMAT_ENUMS and FORMAT_ENUMS[name][1]
    registered = [spelling for backend in formats()
                  for spelling in (backend.name, *(backend.aliases if with_aliases else ()))]
    return _validator(name, tuple(spelling for spelling in registered if spelling not in listed))


@lru_cache(maxsize=None)
def _validator(name: str, unlisted_formats: tuple[str, ...]):
    from jsonschema import Draft202012Validator

    schema = load_schema(name)
    if unlisted_formats:
        schema = copy.deepcopy(schema)
        format_enum(schema, name).extend(unlisted_formats)
    # The shipped schemas are checked against the metaschema by tests/test_schemas.py, not here: that check costs
    # about a second per process, a no-op re-export's largest cost.
    return Draft202012Validator(schema)
