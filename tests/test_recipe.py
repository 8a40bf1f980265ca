"""Recipes: the malformed-recipe corpus through `validate` and `export`, a property test of the loader, and the
sources a recipe is read from (file, folder, config.json field, Hub repo without weights)."""

from __future__ import annotations

import copy
import json
import logging
import math
import os
import warnings
from pathlib import Path

import pytest
from hfexport.errors import RecipeError, RecipeNotFoundError, SourceError
from hfexport.recipe.loading import MAX_RECIPE_BYTES, load_recipe, recipe_from_hub
from hfexport.recipe.data import Recipe, recipe_from_document, recipe_from_text
from hfexport.surfaces import cli
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

BAD = Path(__file__).parent / "data" / "bad_recipes"
EXPECTED: dict[str, str] = json.loads((BAD / "expected.json").read_text())
CORPUS = sorted(EXPECTED)


@pytest.fixture
def in_process(capsys):
    """`run(*argv) -> (exit code, stdout, stderr)` through `hfexport.surfaces.cli.main`, undoing its process-wide log quieting."""
    environ = dict(os.environ)

    def run(*argv: str):
        capsys.readouterr()
        with warnings.catch_warnings():
            code = cli.main(list(argv))
        logging.disable(logging.NOTSET)
        captured = capsys.readouterr()
        return code, captured.out, captured.err

    yield run
    os.environ.clear()
    os.environ.update(environ)


def _path_line(path: str) -> str:
    """How a problem's path starts its line in the human output (`  targets.onnx.mode: ...`)."""
    return f"{path}:"


# ── The corpus ───────────────────────────────────────────────────────────────


def test_corpus_is_complete():
    files = {file.name for file in BAD.iterdir() if file.name != "expected.json"}
    assert files == set(EXPECTED), "every bad recipe has an expected path, and every expected path a file"
    assert len(files) >= 30
    assert all(file.endswith((".json", ".txt")) for file in files)


@pytest.mark.parametrize("name", CORPUS)
def test_loader_reports_the_expected_path(name):
    with pytest.raises(RecipeError) as caught:
        load_recipe(BAD / name)
    paths = [problem.path for problem in caught.value.problems]
    assert EXPECTED[name] in paths, f"{name}: expected a problem at {EXPECTED[name]!r}, got {caught.value}"
    assert all(problem.message for problem in caught.value.problems)


@pytest.mark.parametrize("name", CORPUS)
def test_validate_exits_1_with_the_path(in_process, name):
    code, out, err = in_process("validate", str(BAD / name))
    assert code == 1, (out, err)
    assert _path_line(EXPECTED[name]) in out + err
    assert "Traceback" not in out + err

    code, out, _ = in_process("validate", "--json", str(BAD / name))
    assert code == 1
    result = json.loads(out)
    assert result["valid"] is False
    assert EXPECTED[name] in [problem["path"] for problem in result["problems"]]


@pytest.mark.parametrize("name", CORPUS)
def test_export_exits_1_and_writes_nothing(in_process, tiny_bert, tmp_path, name):
    """An invalid recipe is a failed check (exit 1) for `export` as for `validate`: one policy, errors.exit_code."""
    output = tmp_path / "out"
    code, out, err = in_process("export", str(tiny_bert), "--recipe", str(BAD / name), "-o", str(output), "--quiet")
    assert code == 1, (out, err)
    assert "Traceback" not in out + err
    assert "invalid recipe" in err
    assert len(err.strip().splitlines()) < 12, "one readable message, not a dump"
    assert not output.exists() or not any(path.is_dir() for path in output.iterdir())


SUBPROCESS_SAMPLE = ["not_json.txt", "empty.json", "dotted_model_class.json", "min_greater_than_max.json",
                     "bad_dim_reference.json"]


@pytest.mark.parametrize("name", SUBPROCESS_SAMPLE)
def test_real_command(cli, tiny_bert, tmp_path, name):
    """The console-script path in a real process (the in-process tests cover the whole corpus)."""
    validated = cli("validate", str(BAD / name))
    assert validated.returncode == 1
    assert _path_line(EXPECTED[name]) in validated.stdout + validated.stderr
    output = tmp_path / "out"
    exported = cli("export", str(tiny_bert), "--recipe", str(BAD / name), "-o", str(output))
    assert exported.returncode == 1, exported.stderr
    assert "Traceback" not in exported.stdout + exported.stderr
    assert not output.exists() or not any(path.is_dir() for path in output.iterdir())


def test_oversized_recipe_is_refused_before_parsing(in_process, tmp_path):
    big = tmp_path / "big.json"
    big.write_text('{"export_format": "onnx", "description": "' + "x" * MAX_RECIPE_BYTES + '"}')
    code, out, err = in_process("validate", str(big))
    assert code == 1
    assert "$:" in out + err and "bytes" in out + err


def test_every_problem_is_listed_at_once():
    document = {
        "recipe_version": 1,
        "dims": {"seq": {"min": 9, "max": 3}},
        "default_target": "nope",
        "targets": {"a": {"export_format": "onnx", "dynamic_shapes": {"input_ids": {"0": "batch", "1": "seq"}},
                          "options": {"backend": "xnnpack"}}},
    }
    with pytest.raises(RecipeError) as caught:
        recipe_from_document(document)
    paths = {problem.path for problem in caught.value.problems}
    assert {"dims.seq", "default_target", "targets.a.dynamic_shapes.input_ids.0", "targets.a.options.backend"} <= paths
    assert "'batch' is not a dim; known dims: seq" in str(caught.value)


def test_deep_nesting_inside_free_form_params_is_a_recipe_error():
    """quantization.params is free-form: nesting there must not reach Python's recursion limit (it did)."""
    depth = 600
    document = {"recipe_version": 1, "targets": {"o": {"export_format": "onnx", "quantization": {
        "method": "ort_dynamic", "params": json.loads('{"a":' * depth + "1" + "}" * depth)}}}}
    with pytest.raises(RecipeError) as caught:
        recipe_from_document(document)
    assert caught.value.problems[0].path.startswith("targets.o.quantization.params.a")


# ── Valid recipes and their forms ────────────────────────────────────────────


def test_flat_recipe_is_one_forward_target():
    recipe = recipe_from_document({"export_format": "onnx", "dynamic": True, "opset_version": 18})
    assert recipe.target_names == ["onnx"]
    target = recipe.target()
    assert (target.export_format, target.mode, target.options) == ("onnx", "forward", {"dynamic": True, "opset_version": 18})


def test_flat_recipe_problems_use_the_flat_paths():
    with pytest.raises(RecipeError) as caught:
        recipe_from_document({"export_format": "dynamo", "opset_version": 18, "dynamic_shapes": {"x": {"0": "b"}}})
    assert {problem.path for problem in caught.value.problems} == {"opset_version", "dynamic_shapes.x.0"}


def test_examples_are_valid(tiny_bert, tiny_llama):
    bert, llama = load_recipe(tiny_bert), load_recipe(tiny_llama)
    assert set(bert.target_names) == {"onnx", "openvino", "pt2", "pte"}
    assert any(target.mode == "generation" for target in llama.targets.values())


def test_recipe_in_config_json_field(tmp_path, tiny_bert):
    config = json.loads((tiny_bert / "config.json").read_text())
    config["export_config"] = {"export_format": "openvino", "compress_to_fp16": True}
    (tmp_path / "config.json").write_text(json.dumps(config))
    recipe = load_recipe(tmp_path)
    assert recipe.target().options == {"compress_to_fp16": True}
    assert "export_config" in recipe.source


def test_folder_without_recipe(tmp_path):
    (tmp_path / "config.json").write_text('{"model_type": "bert"}')
    with pytest.raises(RecipeNotFoundError, match="export_config.json"):
        load_recipe(tmp_path)


def test_missing_local_path_is_a_source_error(tmp_path):
    with pytest.raises(SourceError, match="no such file"):
        load_recipe(str(tmp_path / "missing.json"))


def test_recipe_from_hub_downloads_no_weights(hub, tiny_bert, tmp_path):
    files = {name: (tiny_bert / name).read_bytes() for name in ("config.json", "export_config.json", "model.safetensors")}
    hub.seed_repo("user/recipe-only", files)
    recipe = recipe_from_hub("user/recipe-only")
    assert recipe.target_names == load_recipe(tiny_bert).target_names
    assert recipe.source == "user/recipe-only/export_config.json"
    cache = Path(os.environ["HF_HOME"]) / "hub"
    downloaded = {path.name for path in cache.rglob("*") if "recipe-only" in str(path) and path.is_file()}
    assert "model.safetensors" not in downloaded
    assert "export_config.json" in downloaded


def test_recipe_from_hub_config_field_and_revision(hub, tiny_bert):
    config = json.loads((tiny_bert / "config.json").read_text())
    hub.seed_repo("user/config-recipe", {"config.json": json.dumps(config)})
    with pytest.raises(RecipeNotFoundError):
        recipe_from_hub("user/config-recipe")
    config["export_config"] = {"export_format": "dynamo"}
    sha = hub.seed_repo("user/config-recipe", {"config.json": json.dumps(config)})
    assert recipe_from_hub("user/config-recipe", revision=sha).target_names == ["dynamo"]
    with pytest.raises(SourceError, match="revision"):
        recipe_from_hub("user/config-recipe", revision="no-such-branch")
    with pytest.raises(SourceError, match="not found"):
        recipe_from_hub("user/does-not-exist")


# ── Property: the loader raises RecipeError and nothing else ─────────────────

VALID = json.loads((Path(__file__).parent.parent / "examples" / "tiny-llama" / "export_config.json").read_text())
KEYS = ["export_format", "targets", "dims", "mode", "options", "dynamic_shapes", "min", "max", "0", "1", "*",
        "input_ids", "batch", "seq", "generation", "components", "quantization", "method", "params", "task",
        "model_class", "default_target", "sample_inputs", "tensors", "shape", "dtype", "range", "parity", "probe"]
STRINGS = ["onnx", "dynamo", "executorch", "openvino", "batch", "seq", "2*seq", "seq+1", "static", "auto",
           "dynamic", "generation", "forward", "transformers.BertModel", "BertModel", "static", "xnnpack", "", "é"]

scalars = (
    st.none() | st.booleans() | st.integers(min_value=-(2**70), max_value=2**70)
    | st.floats(allow_nan=True, allow_infinity=True) | st.sampled_from(STRINGS) | st.text(max_size=8)
)
json_values = st.recursive(
    scalars,
    lambda children: st.lists(children, max_size=4)
    | st.dictionaries(st.sampled_from(KEYS) | st.text(max_size=6), children, max_size=5),
    max_leaves=25,
)


def _paths(value, prefix=()):
    yield prefix
    if isinstance(value, dict):
        for key, item in value.items():
            yield from _paths(item, (*prefix, key))
    elif isinstance(value, list):
        for index, item in enumerate(value):
            yield from _paths(item, (*prefix, index))


VALID_PATHS = list(_paths(VALID))[1:]


@st.composite
def mutated_recipes(draw):
    """The decoder's valid recipe with a few values replaced by random JSON, or deleted."""
    document = copy.deepcopy(VALID)
    for _ in range(draw(st.integers(1, 3))):
        path = draw(st.sampled_from(VALID_PATHS))
        parent = document
        try:
            for key in path[:-1]:
                parent = parent[key]
            if draw(st.booleans()):
                parent[path[-1]] = draw(json_values)
            elif isinstance(parent, dict):
                del parent[path[-1]]
        except (KeyError, IndexError, TypeError):
            continue  # an earlier mutation removed this path
    return document


def _loads_or_recipe_error(call):
    try:
        recipe = call()
    except RecipeError as error:
        assert error.problems and all(problem.path for problem in error.problems)
        assert str(error)
        return
    assert isinstance(recipe, Recipe)
    recipe.sha256, recipe.targets  # noqa: B018 - a valid recipe is usable
    for name in recipe.target_names:
        recipe.standalone(name)


PROPERTY_SETTINGS = settings(max_examples=100, deadline=None, suppress_health_check=[HealthCheck.too_slow])


@PROPERTY_SETTINGS
@given(json_values)
def test_random_json_documents(document):
    _loads_or_recipe_error(lambda: recipe_from_document(document))


@PROPERTY_SETTINGS
@given(mutated_recipes())
def test_mutated_valid_recipe(document):
    _loads_or_recipe_error(lambda: recipe_from_document(document))


def _dumps(value) -> str:
    return json.dumps(value, allow_nan=True)


@PROPERTY_SETTINGS
@given(json_values | mutated_recipes())
def test_random_json_text(document):
    text = _dumps(document)
    _loads_or_recipe_error(lambda: recipe_from_text(text))
    _loads_or_recipe_error(lambda: recipe_from_text(text.encode("utf-8")))


@PROPERTY_SETTINGS
@given(st.binary(max_size=64) | st.text(max_size=64))
def test_random_bytes_and_text(blob):
    _loads_or_recipe_error(lambda: recipe_from_text(blob))


def test_non_finite_numbers_in_a_document_dict():
    """A Python dict (not parsed JSON) may hold NaN and infinities: still only RecipeError."""
    for value in (math.nan, math.inf, -math.inf):
        _loads_or_recipe_error(lambda value=value: recipe_from_document(
            {"recipe_version": 1, "dims": {"seq": {"max": value}}, "targets": {"o": {"export_format": "onnx"}}}))


@pytest.mark.parametrize("axis", ["static", "auto", "dynamic", 4, "batch", "2*batch", "batch+1", " 3 * batch - 1 "])
def test_every_axis_form_is_valid(axis):
    """The keywords also match the dim-name pattern: the schema must accept them (it rejected them with oneOf)."""
    recipe = recipe_from_document({"recipe_version": 1, "dims": {"batch": {}}, "targets": {"o": {
        "export_format": "onnx", "dynamic_shapes": {"input_ids": {"0": axis}}}}})
    assert recipe.target().dynamic_shapes == {"input_ids": {"0": axis}}


# ── Validation against the model (issue 30) ─────────────────────────────────


@pytest.fixture
def run():
    from conftest import run_cli

    return run_cli


def test_dims_past_what_the_models_config_admits_are_refused_with_the_field(tmp_path, run):
    import shutil

    folder = tmp_path / "bert"
    shutil.copytree(Path(__file__).resolve().parent.parent / "examples" / "tiny-bert", folder)
    recipe = json.loads((folder / "export_config.json").read_text())
    recipe["dims"]["seq"]["max"] = 100000  # tiny-bert's max_position_embeddings is 128
    (folder / "export_config.json").write_text(json.dumps(recipe))
    done = run("validate", str(folder))
    code, out, err = done.returncode, done.stdout, done.stderr
    assert code == 1, (out, err)
    assert "dims.seq.max: 100000 is more than the model's max_position_embeddings (128" in out + err
    assert "at most 128" in out + err and "Traceback" not in out + err


def test_an_unknown_enum_value_gets_did_you_mean():
    from hfexport.errors import RecipeError
    from hfexport.recipe.validation import validate_document

    with pytest.raises(RecipeError) as raised:
        validate_document({"export_format": "onxx"})
    assert "did you mean 'onnx'?" in str(raised.value)
    with pytest.raises(RecipeError) as raised:
        validate_document({"export_format": "torch-exprt"})
    assert "did you mean 'torch-export'?" in str(raised.value)


def test_one_name_per_format_with_the_old_spellings_accepted_where_typed():
    from hfexport.layout import FORMAT_LABELS, canonical_format
    from hfexport.surfaces.cli import build_parser

    assert [canonical_format(name) for name in ("pt2", "torch.export", "PTE", "onnx", "tflite")] == [
        "dynamo", "dynamo", "executorch", "onnx", "tflite"]
    args = build_parser().parse_args(["init", "m", "--format", "pt2", "--format", "pte", "--format", "onnx"])
    assert args.format == ["dynamo", "executorch", "onnx"]
    assert set(FORMAT_LABELS) == {"onnx", "openvino", "executorch", "dynamo"}


def test_a_recipe_may_name_a_format_by_any_of_its_spellings_and_the_engine_gets_its_own():
    """Issue 44: `pt2`, `torch-export`, `torch.export` mean dynamo and `pte` executorch in a recipe's export_format
    (the schema accepts them, the loader gives the engine its own name); people read one name per format."""
    from hfexport.layout import format_label
    from hfexport.recipe.data import recipe_from_document
    from hfexport.recipe.validation import validate_document

    for spelling, engine in (("pt2", "dynamo"), ("torch-export", "dynamo"), ("torch.export", "dynamo"),
                             ("dynamo", "dynamo"), ("pte", "executorch"), ("executorch", "executorch")):
        assert validate_document({"export_format": spelling})["targets"] == {engine: {"export_format": engine,
                                                                                      "mode": "forward"}}
        full = {"targets": {"t": {"export_format": spelling, "dynamic_shapes": {"input_ids": {"0": "batch"}}}},
                "dims": {"batch": {"min": 1, "max": 4}}}
        recipe = recipe_from_document(full)
        assert recipe.target("t").export_format == engine and recipe.document == full  # published as written
        assert format_label(spelling) == {"dynamo": "torch.export", "executorch": "ExecuTorch"}[engine]
    assert [format_label(name) for name in ("onnx", "openvino")] == ["ONNX", "OpenVINO"]


def test_config_problems_checks_sequence_and_image_dims():
    from hfexport.recipe.validation import config_problems

    recipe = {"dims": {"s": {"min": 1, "max": 512}, "h": {"min": 32, "max": 448}},
              "targets": {"t": {"export_format": "onnx", "dynamic_shapes": {
                  "input_ids": {"1": "s"}, "pixel_values": {"2": "h", "3": "h"}}}}}
    config = {"text_config": {"max_position_embeddings": 256}, "vision_config": {"image_size": 224}}
    problems = {problem.path: problem.message for problem in config_problems(recipe, config)}
    assert set(problems) == {"dims.s.max", "dims.h.max"}
    assert "text_config.max_position_embeddings (256" in problems["dims.s.max"]
    assert "vision_config.image_size (224" in problems["dims.h.max"]
    assert config_problems(recipe, {"text_config": {"max_position_embeddings": 512}}) == []
