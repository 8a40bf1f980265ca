"""Strict JSON for documents hfexport reads from strangers (recipes, manifests, reports): `json.loads` hooks that
refuse duplicate keys (the last one would win, and be the one checked) and NaN/Infinity, and optionally numbers that
overflow to infinity (`1e400`). Callers turn the errors into their own (`RecipeError`, `CorruptExportError`)."""

from __future__ import annotations

import json
import math
from typing import Any

from hfexport.errors import DuplicateKeyError


def reject_duplicates(pairs: list[tuple[str, Any]]) -> dict:
    """`object_pairs_hook`: the object, or `DuplicateKeyError` for a key that appears twice."""
    seen = {}
    for key, value in pairs:
        if key in seen:
            raise DuplicateKeyError(key)
        seen[key] = value
    return seen


def reject_constant(name: str):
    """`parse_constant`: NaN, Infinity and -Infinity are not JSON."""
    raise ValueError(f"{name} is not valid JSON")


def finite_float(text: str) -> float:
    """`parse_float`: a number that overflows to infinity (`1e400`) is refused."""
    value = float(text)
    if not math.isfinite(value):
        raise ValueError(f"{text[:40]} is not a finite number")
    return value


def loads(text: str | bytes, finite: bool = False) -> Any:
    """`json.loads` with the hooks above (`finite`: also refuse numbers that overflow)."""
    return json.loads(text, object_pairs_hook=reject_duplicates, parse_constant=reject_constant,
                      parse_float=finite_float if finite else None)
