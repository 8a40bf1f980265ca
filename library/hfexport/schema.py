"""The JSON Schemas shipped in `hfexport/schemas/` (recipes, reports, export manifests) and their validators."""

from __future__ import annotations

import json
from functools import lru_cache
from importlib import resources


@lru_cache(maxsize=None)
def load_schema(name: str = "export_config") -> dict:
    """A JSON Schema shipped inside the package (`hfexport/schemas/<name>.schema.json`)."""
    text = resources.files("hfexport").joinpath("schemas").joinpath(f"{name}.schema.json").read_text(encoding="utf-8")
    return json.loads(text)


@lru_cache(maxsize=None)
def schema_validator(name: str):
    from jsonschema import Draft202012Validator

    # The shipped schemas are checked against the metaschema by tests/test_schemas.py, not here: that check costs
    # about a second per process, a no-op re-export's largest cost.
    return Draft202012Validator(load_schema(name))
