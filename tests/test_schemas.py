"""The JSON Schemas shipped in the package are valid Draft 2020-12 schemas (checked here once, not per process)."""

from __future__ import annotations

import pytest
from hfexport.schema import load_schema
from jsonschema import Draft202012Validator


@pytest.mark.parametrize("name", ["export_config", "export_report", "export_manifest"])
def test_shipped_schema_is_valid(name):
    Draft202012Validator.check_schema(load_schema(name))
