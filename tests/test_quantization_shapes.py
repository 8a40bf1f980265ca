"""A quantization the model's layers cannot take is refused before anything runs (issue 46 item 4): a group size
that does not divide a layer's input size, found from config.json by one rule, in `hfexport validate` and in the
Space's live check, with the recipe's file, JSON path and a group size that works."""

from __future__ import annotations

import json

import pytest
from hfexport.quantization.shapes import dividing_group_size, group_size_problems, layer_input_sizes
from hfexport.testing.zoo import ZOO

SMOLLM2 = ZOO["smollm2-135m"].config


def _recipe(params: dict, export_format: str = "openvino") -> dict:
    return {"recipe_version": 1, "task": "text-generation", "default_target": "q",
            "targets": {"q": {"export_format": export_format, "mode": "generation",
                              "quantization": {"method": "nncf_weights", "params": params}}}}


@pytest.mark.parametrize("name", sorted(ZOO))
def test_the_config_rule_covers_every_linear_layer_of_the_model(name):
    """The rule is general: every nn.Linear input size of the model built from a zoo config (meta device, no
    weights) is one of the sizes read from its config.json."""
    import torch
    from transformers import AutoConfig, AutoModel, AutoModelForCausalLM

    document = dict(ZOO[name].config)
    config = AutoConfig.for_model(document.pop("model_type"), **{**document, "num_hidden_layers": 1})
    auto = AutoModelForCausalLM if ZOO[name].task == "text-generation" else AutoModel  # the zoo's other tasks
    with torch.device("meta"):
        model = auto.from_config(config)
    inputs = {module.in_features for module in model.modules() if isinstance(module, torch.nn.Linear)}
    assert inputs and inputs <= set(layer_input_sizes(ZOO[name].config).values())


def test_smollm2_int4_group_128_is_refused_with_a_group_size_that_works():
    problems = group_size_problems(_recipe({"mode": "int4_asym", "group_size": 128})["targets"]["q"]["quantization"],
                                   ["targets", "q"], SMOLLM2)
    assert [problem.path for problem in problems] == ["targets.q.quantization.params.group_size"]
    assert "hidden_size = 576" in problems[0].message and "use group_size 64" in problems[0].message
    # NNCF's default group (128) is meant where the recipe states none: the mode is the line to change
    default = group_size_problems({"method": "nncf_weights", "params": {"mode": "int4_sym"}}, ["targets", "q"], SMOLLM2)
    assert default[0].path == "targets.q.quantization.params.mode" and "add group_size 64" in default[0].message
    for fine in ({"mode": "int4_asym", "group_size": 64}, {"mode": "int4_asym", "group_size": -1},
                 {"mode": "int8_asym"}, {"mode": "int4_asym", "group_size": 32}):
        assert group_size_problems({"method": "nncf_weights", "params": fine}, ["targets", "q"], SMOLLM2) == []
    assert group_size_problems({"method": "ort_dynamic"}, ["targets", "q"], SMOLLM2) == []


def test_a_size_no_power_of_two_divides_asks_for_per_channel_groups():
    config = {"hidden_size": 584, "intermediate_size": 1544}  # 8 x 73: no power of two from 16 up divides it
    problems = group_size_problems({"method": "nncf_weights", "params": {"mode": "int4_asym", "group_size": 64}},
                                   ["targets", "q"], config)
    assert "group_size -1" in problems[0].message
    assert dividing_group_size([576, 1536], 128) == 64 and dividing_group_size([584], 128) is None


def test_sub_configs_and_head_sizes_are_read():
    sizes = layer_input_sizes({"text_config": {"hidden_size": 1024, "num_attention_heads": 16, "head_dim": 128,
                                               "intermediate_size": 3072}, "vision_config": {"hidden_size": 1152}})
    assert sizes == {"text_config.hidden_size": 1024, "text_config.intermediate_size": 3072,
                     "text_config.num_attention_heads * text_config.head_dim": 2048,
                     "vision_config.hidden_size": 1152}


def test_validate_refuses_it_before_anything_runs(tmp_path, cli):
    (tmp_path / "config.json").write_text(json.dumps(SMOLLM2))
    (tmp_path / "export_config.json").write_text(json.dumps(_recipe({"mode": "int4_asym", "group_size": 128})))
    result = cli("validate", str(tmp_path), "--format", "json")
    assert result.returncode == 1, result.stderr
    problems = json.loads(result.stdout)["problems"]
    assert problems[0]["path"] == "targets.q.quantization.params.group_size"
    assert "use group_size 64" in problems[0]["message"] and "Traceback" not in result.stderr
    (tmp_path / "export_config.json").write_text(json.dumps(_recipe({"mode": "int4_asym", "group_size": 64})))
    assert cli("validate", str(tmp_path)).returncode == 0


def test_the_spaces_live_check_shows_it_on_the_recipes_line():
    from hfexport.surfaces import space

    recipe = _recipe({"mode": "int4_asym", "group_size": 128}, export_format="onnx")
    check = space.check_recipe_text(json.dumps(recipe), config=(SMOLLM2, "HuggingFaceTB/SmolLM2-135M/config.json"))
    assert not check.valid
    assert [problem.path for problem in check.problems] == ["targets.q.quantization.params.group_size"]
    assert "HuggingFaceTB/SmolLM2-135M/config.json" in check.problems[0].message
    assert any(label == "targets.q.quantization.params.group_size" for _, label in check.highlighted())
