"""`hfexport init`: a recipe proposed from the config, exported and verified, written with only passing targets."""

from __future__ import annotations

import json
import shutil

import pytest
from hfexport.report.model import JobReport


def _without_recipe(example, tmp_path):
    folder = tmp_path / example.name
    shutil.copytree(example, folder)
    (folder / "export_config.json").unlink()
    return folder


def test_proposed_encoder_recipe_reads_the_config(tiny_bert):
    from hfexport.job.init import propose_recipe
    from hfexport.recipe.loading import load_recipe

    recipe = propose_recipe(tiny_bert, ["onnx", "dynamo", "executorch", "openvino"])
    load_recipe(recipe)  # valid
    assert recipe["task"] == "feature-extraction"
    assert recipe["dims"] == {"batch": {"min": 1, "max": 8}, "seq": {"min": 2, "max": 128}}  # max_position_embeddings
    assert list(recipe["targets"]) == ["onnx", "pt2", "pte", "openvino"]
    for target in recipe["targets"].values():
        assert target["mode"] == "forward"
        assert target["dynamic_shapes"] == {"input_ids": {"0": "batch", "1": "seq"}}
    assert recipe["targets"]["pte"]["options"] == {"backend": "xnnpack"}
    assert len(recipe["sample_inputs"]["text"]) == 2  # batch 2: torch.export keeps the batch axis symbolic


def test_proposed_decoder_recipe_uses_generation_mode(tiny_llama):
    from hfexport.job.init import propose_recipe

    recipe = propose_recipe(tiny_llama, ["onnx", "openvino"])
    assert recipe["task"] == "text-generation"
    assert recipe["dims"]["seq"]["max"] == 256
    assert set(recipe["targets"]) == {"onnx-generation", "openvino-generation"}
    for target in recipe["targets"].values():
        assert target["mode"] == "generation" and target["options"] == {"dynamic": True}
        assert target["parity"]["generate"]["max_new_tokens"] == 8


def test_sequence_dim_is_capped_and_unknown_formats_refused():
    from hfexport.job.init import SEQ_CAP, propose_recipe
    from transformers import BertConfig

    config = BertConfig(max_position_embeddings=1 << 20, architectures=["BertForMaskedLM"])
    recipe = propose_recipe(config=config)
    assert recipe["task"] == "fill-mask" and recipe["dims"]["seq"]["max"] == SEQ_CAP
    assert list(recipe["targets"]) == ["onnx"]  # the default format
    with pytest.raises(ValueError, match="tflite"):
        propose_recipe(config=config, formats=["tflite"])


def test_init_refuses_to_replace_a_recipe(tiny_bert, cli):
    before = (tiny_bert / "export_config.json").read_bytes()
    result = cli("init", str(tiny_bert))
    assert result.returncode == 2
    assert "exists; pass --force" in result.stderr and "Traceback" not in result.stderr
    assert (tiny_bert / "export_config.json").read_bytes() == before


@pytest.mark.parametrize("example", ["tiny_bert", "tiny_llama"])
def test_init_writes_a_recipe_that_exports_and_verifies(example, request, tmp_path, cli):
    folder = _without_recipe(request.getfixturevalue(example), tmp_path)
    result = cli("init", str(folder), "--format", "dynamo", "--quiet")
    assert result.returncode == 0, result.stderr
    recipe = json.loads((folder / "export_config.json").read_text())
    name = "pt2" if example == "tiny_bert" else "pt2-generation"
    assert list(recipe["targets"]) == [name] and recipe["default_target"] == name
    assert {"hfexport", "transformers", "torch"} <= set(recipe["validated_with"])
    assert f"1 verified target(s): {name}" in result.stdout

    output = tmp_path / "out"
    exported = cli("export", str(folder), "-o", str(output), "--all-targets", "--quiet")
    assert exported.returncode == 0, exported.stderr
    target = JobReport.read(output).targets[name]
    assert target.status == "ok" and target.verification["passed"]
    if example == "tiny_llama":
        assert target.verification["generation"]["token_agreement"] == 1.0
