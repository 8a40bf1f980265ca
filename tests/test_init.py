"""`hfexport init`: a recipe proposed from the config, exported and verified, written with only passing targets."""

from __future__ import annotations

import importlib.util

import json
import shutil

import pytest
from hfexport.report.data import JobReport


def _without_recipe(example, tmp_path):
    folder = tmp_path / example.name
    shutil.copytree(example, folder)
    (folder / "export_config.json").unlink()
    return folder


def test_proposed_encoder_recipe_reads_the_config(tiny_bert):
    from hfexport.job.propose import propose_recipe
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
    from hfexport.job.propose import propose_recipe

    recipe = propose_recipe(tiny_llama, ["onnx", "openvino"])
    assert recipe["task"] == "text-generation"
    assert recipe["dims"]["seq"]["max"] == 256
    assert set(recipe["targets"]) == {"onnx-generation", "openvino-generation"}
    for target in recipe["targets"].values():
        assert target["mode"] == "generation" and target["options"] == {"dynamic": True}
        assert target["parity"]["generate"]["max_new_tokens"] == 8


def test_sequence_dim_is_capped_and_unknown_formats_refused():
    from hfexport.job.propose import SEQ_CAP, propose_recipe
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


MATRIX_MODELS = ["tiny-bert", "tiny-vit", "tiny-llama", "tiny-gpt2", "tiny-qwen2", "tiny-gemma3", "tiny-phi3",
                 "tiny-mistral", "tiny-mamba", "tiny-bart", "tiny-t5", "tiny-marian", "tiny-mbart", "tiny-whisper",
                 "tiny-llava", "tiny-idefics3", "tiny-qwen3-asr", "tiny-llava-next", "tiny-paddleocr-vl", "tiny-qwen2-vl",
                 "tiny-minicpm-v", "tiny-qwen2.5-omni"]
# Multi-axis rope (positions from get_rope_index over the image grids; PaddleOCR-VL's, and the Qwen2.5-Omni
# thinker's M-RoPE): init proposes the static forward, since hfexport's generate cannot compute those positions (the
# generation plan refuses it).
FORWARD_BY_INIT = {"tiny-paddleocr-vl", "tiny-qwen2-vl", "tiny-qwen2.5-omni"}


def test_the_parametrized_list_is_the_whole_matrix():
    from hfexport.testing.models import MODELS

    assert MATRIX_MODELS == list(MODELS)


@pytest.mark.parametrize("name", MATRIX_MODELS)
def test_init_proposes_what_the_matrix_recipe_needed(name, session_dir):
    """For each matrix model, with its hand-made recipe deleted, init's proposal agrees with that recipe on what
    decides a verdict: the task (GPT-2's `GPT2LMHeadModel` and Marian's `MarianMTModel` were feature-extraction: no
    task suffix), generation targets where the matrix generates, `seq.min` 3 for encoder-decoders, OpenVINO at f32
    (the verdict then holds with and without bf16: tiny T5 flips a top-1 at bf16), and sample inputs that build.
    docs/init_matrix.md is the end-to-end run of these proposals."""
    from hfexport.inputs import build_sample_inputs
    from hfexport.job.propose import propose_recipe
    from hfexport.models import load_config, load_processor
    from hfexport.recipe.loading import load_recipe
    from hfexport.testing.models import MODELS, make_model

    folder = make_model(name, session_dir / "init-proposals" / name)
    matrix = json.loads((folder / "export_config.json").read_text())
    (folder / "export_config.json").unlink()
    proposed = propose_recipe(folder, ["onnx", "openvino", "dynamo", "executorch"])
    recipe = load_recipe(proposed)
    assert proposed["task"] == matrix["task"] == MODELS[name].task
    mode = "generation" if "generation" in MODELS[name].modes and name not in FORWARD_BY_INIT else "forward"
    assert {target["mode"] for target in proposed["targets"].values()} == {mode}
    if "seq" in matrix["dims"]:
        assert proposed["dims"]["seq"]["min"] >= matrix["dims"]["seq"]["min"]
    for target in proposed["targets"].values():
        assert target.get("runtime") == ({"precision": "f32"} if target["export_format"] == "openvino" else None)
    config = load_config(folder)
    needs = MODELS[name].processor_needs
    if needs and importlib.util.find_spec(needs) is None:  # its processor cannot be built here: init's job says why
        from hfexport.errors import SourceError

        with pytest.raises(SourceError, match=f"(?i)requires the {needs} library"):
            load_processor(folder)
        return
    inputs = build_sample_inputs(recipe, load_processor(folder), config, recipe.task, mode)
    main = {"tiny-vit": "pixel_values", "tiny-whisper": "input_features"}.get(name, "input_ids")
    assert inputs[main].shape[0] == 2
    if MODELS[name].task == "image-text-to-text":
        assert "pixel_values" in inputs


def test_init_json_on_gpt2_generates_where_it_used_to_propose_feature_extraction(session_dir, cli):
    """End to end through the CLI on the family whose task init got wrong (GPT2LMHeadModel: no task suffix): the
    ONNX generation target exports and generates token for token; `--json` says what passed and was written."""
    from hfexport.testing.models import make_model

    folder = make_model("tiny-gpt2", session_dir / "tiny-gpt2-init")
    (folder / "export_config.json").unlink()
    result = cli("init", str(folder), "--format", "onnx", "--json", "--quiet")
    assert result.returncode == 0, result.stderr
    answer = json.loads(result.stdout)
    assert answer["proposed"]["task"] == "text-generation"
    assert answer["passed"] == ["onnx-generation"] and answer["failed"] == {}
    assert answer["formats"] == {"onnx-generation": "onnx"}
    assert answer["output"] == str(folder / "export_config.json")
    written = json.loads((folder / "export_config.json").read_text())
    assert list(written["targets"]) == ["onnx-generation"]
