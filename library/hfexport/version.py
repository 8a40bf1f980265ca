"""The package version (one place: pyproject reads it, reports record it)."""

__version__ = "0.2.0"
