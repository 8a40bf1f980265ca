"""Packaging: the wheel (built directly, and from the sdist) ships the JSON Schemas inside `hfexport/schemas/`
exactly once, and an installed wheel reads them through importlib.resources with no source tree around; the
editable install maps the package to `library/`, where `hfexport/schemas` links to the top-level `schemas/`."""

from __future__ import annotations

import importlib.util
import json
import subprocess
import sys
import tarfile
import zipfile
from collections import Counter
from importlib import resources
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
SCHEMAS = ("export_config.schema.json", "export_report.schema.json", "export_manifest.schema.json")


def _require_hatchling() -> None:
    if importlib.util.find_spec("hatchling") is None:
        pytest.fail("hatchling is not installed (it is in the `test` extra): pip install 'hfexport[test]'")


def build_wheel(source: Path, into: Path) -> Path:
    _require_hatchling()
    result = subprocess.run(
        [sys.executable, "-m", "pip", "wheel", "--no-deps", "--no-build-isolation", "--no-index", "-q", "-w",
         str(into), str(source)], capture_output=True, text=True, timeout=600,
    )
    assert result.returncode == 0, result.stderr[-3000:]
    (wheel,) = into.glob("hfexport-*.whl")
    return wheel


@pytest.fixture(scope="module")
def wheel(tmp_path_factory) -> Path:
    return build_wheel(ROOT, tmp_path_factory.mktemp("wheel"))


@pytest.fixture(scope="module")
def sdist(tmp_path_factory) -> Path:
    _require_hatchling()
    folder = tmp_path_factory.mktemp("sdist")
    code = f"from hatchling.build import build_sdist; print(build_sdist({str(folder)!r}))"
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=ROOT, timeout=600)
    assert result.returncode == 0, result.stderr[-3000:]
    return folder / result.stdout.strip().splitlines()[-1]


def test_wheel_ships_the_schemas_once(wheel):
    with zipfile.ZipFile(wheel) as archive:
        names = archive.namelist()
        assert not [name for name, count in Counter(names).items() if count > 1]
        for schema in SCHEMAS:
            assert f"hfexport/schemas/{schema}" in names
            assert archive.read(f"hfexport/schemas/{schema}") == (ROOT / "schemas" / schema).read_bytes()
        assert "hfexport/surfaces/cli.py" in names
        entry_points = archive.read(next(n for n in names if n.endswith("entry_points.txt"))).decode()
    assert "hfexport = hfexport.surfaces.cli:main" in entry_points


def test_installed_wheel_reads_its_schemas_through_importlib_resources(wheel, tmp_path):
    """The wheel's files alone (no source tree, no symlink): the package loads its schemas and validates a recipe."""
    site = tmp_path / "site"
    with zipfile.ZipFile(wheel) as archive:
        archive.extractall(site)
    assert not (site / "hfexport" / "schemas").is_symlink()
    recipe = tmp_path / "recipe.json"
    recipe.write_text(json.dumps({"export_format": "onnx", "opset_version": 18}))
    code = (
        "import json, sys, hfexport, hfexport.schema as r; "
        "from hfexport.surfaces.cli import main; "
        f"assert hfexport.__file__.startswith({str(site)!r}), hfexport.__file__; "
        "print(json.dumps([r.load_schema(n)['title'] for n in ('export_config', 'export_report')])); "
        f"sys.exit(main(['validate', {str(recipe)!r}]))"
    )
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=tmp_path, timeout=300,
                            env={"PYTHONPATH": str(site), "PATH": "/usr/bin:/bin"})
    assert result.returncode == 0, result.stderr
    titles = json.loads(result.stdout.splitlines()[0])
    assert titles == ["hfexport export recipe", "hfexport job report"]
    assert "valid recipe" in result.stdout


def test_sdist_carries_the_schemas_and_builds_the_same_wheel(sdist, tmp_path):
    with tarfile.open(sdist) as archive:
        names = archive.getnames()
        archive.extractall(tmp_path / "src", filter="data")
    root = sdist.name.removesuffix(".tar.gz")
    for schema in SCHEMAS:
        assert f"{root}/schemas/{schema}" in names
    wheel = build_wheel(tmp_path / "src" / root, tmp_path / "wheel")
    with zipfile.ZipFile(wheel) as archive:
        for schema in SCHEMAS:
            assert archive.read(f"hfexport/schemas/{schema}") == (ROOT / "schemas" / schema).read_bytes()


def test_editable_layout_reaches_the_same_schemas():
    """In the source tree (and so in an editable install) the package's schemas folder is the top-level one."""
    link = ROOT / "library" / "hfexport" / "schemas"
    assert link.is_symlink() and link.resolve() == (ROOT / "schemas").resolve()
    folder = resources.files("hfexport").joinpath("schemas")
    for schema in SCHEMAS:
        assert folder.joinpath(schema).read_bytes() == (ROOT / "schemas" / schema).read_bytes()


def test_editable_wheel_points_at_the_library_folder(tmp_path):
    _require_hatchling()
    code = f"from hatchling.build import build_editable; print(build_editable({str(tmp_path)!r}))"
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=ROOT, timeout=300)
    assert result.returncode == 0, result.stderr[-3000:]
    editable = tmp_path / result.stdout.strip().splitlines()[-1]
    with zipfile.ZipFile(editable) as archive:
        pth = [archive.read(name).decode() for name in archive.namelist() if name.endswith(".pth")]
    assert any(str(ROOT / "library") in text for text in pth), pth
