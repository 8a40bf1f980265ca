"""Recipe checks report every problem in one pass: the schema's and the semantic ones together, in the loader, the
CLI (`validate`, text and JSON), the GitHub annotations and the Space's editor check."""

from __future__ import annotations

import json

import pytest
from hfexport.errors import RecipeError
from hfexport.recipe.data import recipe_from_document
from hfexport.surfaces.annotations import check_recipe
from hfexport.surfaces.space import check_recipe_text

# Two schema problems (a string opset, an unknown format) and two semantic ones (dims.seq's bounds, an ExecuTorch
# option on an ONNX target) that the schema cannot see.
BOTH = {
    "recipe_version": 1,
    "dims": {"seq": {"min": 64, "max": 2}},
    "targets": {
        "onnx": {"export_format": "onnx", "options": {"opset_version": "eighteen", "backend": "xnnpack"}},
        "tfl": {"export_format": "tflite"},
    },
}
EXPECTED = {"targets.onnx.options.opset_version", "targets.tfl.export_format", "dims.seq",
            "targets.onnx.options.backend"}


def test_the_loader_reports_schema_and_semantic_problems_together():
    with pytest.raises(RecipeError) as caught:
        recipe_from_document(BOTH)
    assert {problem.path for problem in caught.value.problems} == EXPECTED


def test_a_flat_recipe_gets_both_with_its_own_paths():
    with pytest.raises(RecipeError) as caught:
        recipe_from_document({"export_format": "onnx", "opset_version": "eighteen", "backend": "xnnpack"})
    assert {problem.path for problem in caught.value.problems} == {"opset_version", "backend"}


def test_a_valid_recipe_is_still_valid_and_schema_only_problems_are_unchanged():
    assert recipe_from_document({"export_format": "onnx", "opset_version": 18}).target_names == ["onnx"]
    with pytest.raises(RecipeError) as caught:
        recipe_from_document({"recipe_version": 1, "targets": {"x": {"export_format": "tflite"}}})
    assert [problem.path for problem in caught.value.problems] == ["targets.x.export_format"]


def test_validate_cli_and_annotations_list_all_four(cli, tmp_path):
    recipe = tmp_path / "export_config.json"
    recipe.write_text(json.dumps(BOTH, indent=2))
    text = cli("validate", str(recipe))
    assert text.returncode == 1
    assert all(f"{path}:" in text.stdout + text.stderr for path in EXPECTED), text.stdout + text.stderr
    as_json = cli("validate", str(recipe), "--json")
    assert {problem["path"] for problem in json.loads(as_json.stdout)["problems"]} == EXPECTED
    annotations = check_recipe(recipe, workspace=tmp_path)
    assert {annotation.message.split(":")[0] for annotation in annotations} == EXPECTED
    lines = recipe.read_text().splitlines()
    backend = next(annotation for annotation in annotations if annotation.message.startswith("targets.onnx.options.backend"))
    assert '"backend"' in lines[backend.line - 1]


def test_the_space_editor_check_lists_all_four():
    check = check_recipe_text(json.dumps(BOTH))
    assert not check.valid and {problem.path for problem in check.problems} == EXPECTED
    assert "4 problems" in check.markdown()
