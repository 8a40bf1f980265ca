"""OpenVINO's variants of a generation target (issue 46): optimum-intel's `int8` and `int4` weight formats made by NNCF
from the one converted model (no re-export), each a folder of its runtimes' contract inside the target's
(`openvino/int4/`, which LLMPipeline and optimum-intel both open), its settings in `openvino_config.json` as
optimum-intel records them, gated on its quality against the float32 graph and in LLMPipeline and optimum-intel by
name; a variant name or group size the target cannot take is refused by validate first. The tiny random Llama here
(hidden size 64: int4's default group of 128 resolves to 64); SmolLM2 real weights in
tests/test_smollm2_openvino_variants.py (slow)."""

from __future__ import annotations

import json
import os
from unittest import mock

import pytest
from hfexport.errors import RecipeError
from hfexport.quantization.shapes import variant_group_size_problems
from hfexport.recipe.loading import load_recipe
from hfexport.testing.zoo import ZOO

TARGET = "openvino-generation"
#: A tiny random model's logits have small margins: its 4-bit variant keeps fewer argmaxes than a trained model's
#: (SmolLM2's measured bounds are the defaults); the bound here says what this model is held to.
TINY_FOUR_BIT = {"min_top1_agreement": 0.5}
VARIANTS = ["int8", {"name": "int4", **TINY_FOUR_BIT}]
SMOLLM2 = ZOO["smollm2-135m"].config


def _recipe(tiny_llama, variants=VARIANTS, **target) -> dict:
    recipe = json.loads((tiny_llama / "export_config.json").read_text())
    spec = {**recipe["targets"][TARGET], "variants": variants, **target}
    return {**recipe, "default_target": TARGET, "targets": {TARGET: spec}}


def test_a_variant_name_of_another_format_is_refused_with_its_path(tiny_llama):
    with pytest.raises(RecipeError) as caught:
        load_recipe(_recipe(tiny_llama, ["int4", "q4", {"name": "int8", "group_size": 64}, {"name": "int4"}]))
    base = f"targets.{TARGET}.variants"
    assert [(problem.path, problem.message) for problem in caught.value.problems] == [
        (f"{base}.1", "'q4' is not a variant of openvino; it has: int8, int4"),
        (f"{base}.2.group_size", "not a setting of int8; it takes: max_nll_ratio, min_top1_agreement"),
        (f"{base}.3", "'int4' is listed twice")]
    with pytest.raises(RecipeError) as caught:
        load_recipe(_recipe(tiny_llama, [{"name": "int4", "group_size": 0}]))
    assert caught.value.problems[0].path.startswith(f"{base}.0")


def test_a_stated_group_size_the_layers_cannot_take_is_refused_with_one_that_works(tmp_path, cli):
    target = {"export_format": "openvino", "mode": "generation",
              "variants": ["int8", {"name": "int4", "group_size": 128}]}
    [problem] = variant_group_size_problems(target, ["targets", "ov"], SMOLLM2)
    assert problem.path == "targets.ov.variants.1.group_size"
    assert "hidden_size = 576" in problem.message and "use group_size 64" in problem.message
    for fine in (["int4"], [{"name": "int4", "group_size": 64}], [{"name": "int4", "group_size": -1}]):
        assert variant_group_size_problems({"variants": fine}, ["t"], SMOLLM2) == []
    recipe = {"recipe_version": 1, "task": "text-generation", "default_target": "ov", "targets": {"ov": target}}
    (tmp_path / "config.json").write_text(json.dumps(SMOLLM2))
    (tmp_path / "export_config.json").write_text(json.dumps(recipe))
    result = cli("validate", str(tmp_path), "--format", "json")
    assert result.returncode == 1, result.stderr
    problems = json.loads(result.stdout)["problems"]
    assert [entry["path"] for entry in problems] == ["targets.ov.variants.1.group_size"], problems
    from hfexport.surfaces import space

    check = space.check_recipe_text(json.dumps(recipe), config=(SMOLLM2, "HuggingFaceTB/SmolLM2-135M/config.json"))
    assert [entry.path for entry in check.problems] == ["targets.ov.variants.1.group_size"]


def test_an_unstated_group_size_is_128_where_it_divides_else_the_largest_that_does(tmp_path):
    from hfexport.formats.openvino.variants import group_size

    (tmp_path / "config.json").write_text(json.dumps(SMOLLM2))
    assert group_size(tmp_path, {"group_size": None}) == 64 and group_size(tmp_path, {"group_size": 32}) == 32
    (tmp_path / "config.json").write_text(json.dumps({"hidden_size": 2048, "intermediate_size": 8192}))
    assert group_size(tmp_path, {"group_size": None}) == 128
    (tmp_path / "config.json").write_text(json.dumps({"hidden_size": 584}))
    assert group_size(tmp_path, {"group_size": None}) == -1


@pytest.fixture(scope="module")
def variants_job(tiny_llama, tmp_path_factory):
    """tiny-llama's OpenVINO generation target with int8 and int4 variants, gated in LLMPipeline and optimum-intel:
    (output folder, report)."""
    from hfexport.job.run import run_job
    from hfexport.testing import peers

    env = {"HFEXPORT_RUNTIME_OPENVINO_GENAI": str(peers.openvino_genai_venv()),
           "HFEXPORT_RUNTIME_OPTIMUM_INTEL": str(peers.peer_venv())}
    output = tmp_path_factory.mktemp("ov-variants")
    with mock.patch.dict(os.environ, env):
        return output, run_job(tiny_llama, output, recipe=_recipe(tiny_llama), latency=False)


def test_each_variant_is_a_folder_both_runtimes_open_and_gate_by_name(variants_job):
    output, report = variants_job
    target = report.targets[TARGET]
    assert [(entry["name"], entry["file"]) for entry in target.variants] == [
        ("int8", "int8/openvino_model.xml"), ("int4", "int4/openvino_model.xml")]
    by_name = {entry["name"]: entry for entry in target.variants}
    int8, int4 = by_name["int8"], by_name["int4"]
    assert int8["verdict"] == "passed" and int8["nll_ratio"] < 1.05 and int8["positions"] > 10
    assert {check["runtime"] for check in int8["runtimes"]} == {"openvino-genai", "optimum-intel"}
    assert all(check["verdict"] == "passed" for check in int8["runtimes"]), int8["runtimes"]
    # The tiny random model's int4 keeps its next tokens on the texts (its quality gate passes) but its greedy
    # generation leaves float32's within the first tokens (0.38 of 8 tokens agree, below the 4-bit floor of 0.5): the
    # gate fails it in each runtime, by name, and the target with it (SmolLM2's int4 passes: the slow test).
    assert int4["settings"] == {"group_size": 64, "ratio": 1.0, "max_nll_ratio": 1.5, "min_top1_agreement": 0.5}
    assert int4["nll_ratio"] <= 1.5 and int4["top1_agreement"] >= 0.5
    assert int4["verdict"] == "failed" and {check["runtime"] for check in int4["runtimes"]
                                            if check["verdict"] == "failed"} == {"openvino-genai", "optimum-intel"}
    assert target.status == "failed" and target.error.startswith("variant int4: openvino-genai: ")
    assert "optimum-intel: " in target.error and "variant int8" not in target.error
    folder = output / TARGET
    for entry in target.variants:  # kept either way, as a target that fails parity keeps its files
        variant = folder / entry["name"]
        assert {"openvino_model.xml", "openvino_model.bin", "openvino_tokenizer.xml", "openvino_detokenizer.xml",
                "config.json", "generation_config.json", "tokenizer.json", "openvino_config.json"} <= \
            {path.name for path in variant.iterdir()}
        assert not any(path.is_symlink() for path in variant.iterdir())
        # hfexport's own files stay with the target: the variant folder is no target of its own
        assert not {"export.json", "export_report.json", "export_config.json"} & {p.name for p in variant.iterdir()}
        assert entry["bytes"] == sum(path.stat().st_size for path in variant.iterdir())
        assert (variant / "openvino_model.bin").stat().st_size < (folder / "openvino_model.bin").stat().st_size
    assert {entry["path"] for entry in target.files} >= {"int4/openvino_model.xml", "int8/openvino_model.bin"}
    assert report.read(folder).targets[TARGET].variants == target.variants


def test_the_settings_are_recorded_as_optimum_intel_records_them(variants_job):
    folder = variants_job[0] / TARGET
    int4 = json.loads((folder / "int4" / "openvino_config.json").read_text())
    assert int4["dtype"] == "int4"
    assert {key: int4["quantization_config"][key] for key in ("bits", "sym", "group_size", "ratio", "quant_method")} \
        == {"bits": 4, "sym": False, "group_size": 64, "ratio": 1.0, "quant_method": "default"}
    int8 = json.loads((folder / "int8" / "openvino_config.json").read_text())
    assert (int8["dtype"], int8["quantization_config"]["bits"], int8["quantization_config"]["sym"]) == ("int8", 8, False)


def test_the_graphs_hold_the_weights_each_name_means(variants_job):
    import openvino as ov

    folder = variants_job[0] / TARGET

    def constant_types(path):
        model = ov.Core().read_model(str(path / "openvino_model.xml"))
        return {op.get_output_element_type(0).get_type_name() for op in model.get_ops()
                if op.get_type_name() == "Constant"}

    assert {"u4", "u8"} <= constant_types(folder / "int4")  # int4 groups, the embedding and last layer int8
    assert "u8" in constant_types(folder / "int8") and "u4" not in constant_types(folder / "int8")
    assert not {"u4", "u8"} & constant_types(folder)


def test_the_publication_holds_each_variant_folder_and_republishing_is_a_no_op(variants_job, tiny_llama, hub):
    from hfexport.publication.publish import publish

    repo = f"{hub.user}/tiny-llama-ov-variants"
    hub.seed_repo(repo, tiny_llama)
    # the tiny model's int4 failed its runtimes (above): published flagged, as a failed target's files are
    result = publish(variants_job[0], repo, mode="pr", token=hub.write_token, allow_failed=True)
    files = set(hub.list_files(repo, f"refs/pr/{result.pr_num}"))
    for variant in ("int8", "int4"):
        assert {f"openvino/{variant}/{name}" for name in (
            "openvino_model.xml", "openvino_model.bin", "openvino_config.json", "openvino_tokenizer.xml",
            "config.json", "generation_config.json")} <= files
    assert "openvino/openvino_model.xml" in files and "openvino/export.json" in files
    assert not any(path.startswith("openvino/int4/export") for path in files)
    again = publish(variants_job[0], repo, mode="pr", token=hub.write_token, allow_failed=True)
    assert (again.action, again.pr_num) == ("unchanged", result.pr_num)


def test_a_variant_at_the_devices_reduced_precision_is_held_to_the_lower_floor():
    """LLMPipeline's second run at the CPU's default (bf16 where the CPU has it) judges a variant by the lower of its
    own floor and that precision's, never a higher one than the variant's."""
    from hfexport.deployment import FAILED, PASSED, GenerationRequest
    from hfexport.formats.openvino.runtimes.openvino_genai import judge_at_precision

    request = GenerationRequest([[1, 2]], [[5, 6, 7, 8]], 4, [9], min_token_agreement=0.5)  # 4-bit
    assert judge_at_precision("r", request, [[5, 6, 0, 0]], "f16").verdict == PASSED  # f16's own floor is 0.75
    assert judge_at_precision("r", request, [[5, 0, 0, 0]], "f16").verdict == FAILED
    eight_bit = GenerationRequest([[1, 2]], [[5, 6, 7, 8]], 4, [9], min_token_agreement=0.75)
    assert judge_at_precision("r", eight_bit, [[5, 6, 0, 0]], "bf16").verdict == PASSED  # bf16's 0.5
