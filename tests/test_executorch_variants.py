"""ExecuTorch's `8da4w` variant of a generation target (issue 46): optimum-executorch's `qlinear=8da4w`,
`qembedding=8w` made by torchao on a copy of the eager model and lowered with the float32 program's LLM kernels, cache
and metadata, published as `executorch/8da4w/model.pte` (optimum-executorch opens a program named `model.pte` only),
gated on its quality against the float32 program and in TextLLMRunner and optimum-executorch by that folder; a group
size the layers cannot take, or a target outside the LLM runner's contract, is refused by validate first. The checks
on the recipe and the names run in the default suite; the tiny random Llama's job (a minute and a half of export and
runtimes on two cores) is slow, and SmolLM2 real weights are in tests/test_smollm2_executorch_variants.py (slow)."""

from __future__ import annotations

import json
import os
from unittest import mock

import pytest

from hfexport.quantization.shapes import variant_group_size_problems
from hfexport.testing.zoo import ZOO

TARGET = "pte-8da4w"
HEAD, EMBEDDING = "8da8w", "4w"  # the defaults (docs/quantization.md, "Variants")
SMOLLM2 = ZOO["smollm2-135m"].config


def test_a_stated_group_size_the_layers_cannot_take_is_refused_with_one_that_works(tmp_path, cli):
    target = {"export_format": "executorch", "mode": "generation", "variants": [{"name": "8da4w", "group_size": 128}]}
    [problem] = variant_group_size_problems(target, ["targets", "pte"], SMOLLM2)
    assert problem.path == "targets.pte.variants.0.group_size"
    assert "hidden_size = 576" in problem.message and "use group_size 64" in problem.message
    assert "torchao cannot group their weights" in problem.message and "NNCF" not in problem.message
    for fine in (["8da4w"], [{"name": "8da4w", "group_size": 32}], [{"name": "8da4w", "group_size": -1}]):
        assert variant_group_size_problems({"variants": fine}, ["t"], SMOLLM2) == []
    recipe = {"recipe_version": 1, "task": "text-generation", "default_target": "pte", "targets": {"pte": target}}
    (tmp_path / "config.json").write_text(json.dumps(SMOLLM2))
    (tmp_path / "export_config.json").write_text(json.dumps(recipe))
    result = cli("validate", str(tmp_path), "--format", "json")
    assert result.returncode == 1, result.stderr
    assert [entry["path"] for entry in json.loads(result.stdout)["problems"]] == ["targets.pte.variants.0.group_size"]


def test_an_unstated_group_size_is_32_where_it_divides_else_the_largest_that_does():
    from hfexport.formats.executorch.variants import group_size

    assert group_size(SMOLLM2, {"group_size": None}) == 32 and group_size(SMOLLM2, {"group_size": 64}) == 64
    assert group_size({"hidden_size": 16 * 9, "intermediate_size": 512}, {"group_size": None}) == 16
    assert group_size({"hidden_size": 584}, {"group_size": None}) == -1


def test_the_head_and_the_embedding_take_the_form_the_settings_name():
    """`head` 8da8w: the head's weights 8-bit per output channel (the other linear layers 4-bit in groups); `embedding`
    4w: 4 bits in the linear layers' groups; a head tied to the embedding is quantized apart from it."""
    import torch

    from hfexport.formats.executorch.variants import quantize

    class Tied(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.embed, self.proj = torch.nn.Embedding(64, 64), torch.nn.Linear(64, 64)
            self.lm_head = torch.nn.Linear(64, 64, bias=False)
            self.lm_head.weight = self.embed.weight

    for head, embedding, forms in (("8da8w", "4w", {"embed": (torch.int4, 32), "lm_head": (torch.int8, 64)}),
                                   ("8da4w", "8w", {"embed": (torch.int8, 64), "lm_head": (torch.int4, 32)})):
        model = Tied()
        quantize(model, 32, head, embedding)
        for name, (dtype, group) in {**forms, "proj": (torch.int4, 32)}.items():
            weight = getattr(model, name).weight
            assert (weight.target_dtype, weight.block_size) == (dtype, (1, group)), (head, embedding, name)


def test_the_variant_is_a_folder_of_its_own_whose_program_is_model_pte():
    """optimum-executorch's `ExecuTorchModelForCausalLM` takes the `.pte`'s stem as its `model`: the variant's program
    keeps that name, in a folder a publication keeps with its target (as OpenVINO's `int4/`)."""
    from hfexport.formats import find_format
    from hfexport.layout import variant_folders
    from hfexport.quantization.variants import settings
    from hfexport.verify.variants import runtime_floor

    assert find_format("executorch").variant_file("8da4w") == "8da4w/model.pte"
    assert "8da4w" in variant_folders()
    assert settings("8da4w") == {"name": "8da4w", "group_size": None, "head": HEAD, "embedding": EMBEDDING,
                                 "max_nll_ratio": 1.6, "min_top1_agreement": 0.55}
    assert runtime_floor("8da4w") == runtime_floor("q4") == 0.5  # 4-bit weights: hfexport's 4-bit greedy floor


def test_a_folder_that_is_not_the_runners_program_gets_no_variant(tmp_path):
    """The variant is made of the LLM runner's program: an ExecuTorch export that kept the engine's graphs (a model the
    contract does not take) fails it with why, before anything is quantized."""
    from hfexport.formats.executorch.variants import write

    (tmp_path / "export.json").write_text(json.dumps({"export_format": "executorch", "components": {
        "prefill": {"file": "prefill.pte", "metadata": {}}, "decode": {"file": "decode.pte", "metadata": {}}}}))
    with pytest.raises(ValueError, match="not ExecuTorch's LLM runner program"):
        write(tmp_path, {"name": "8da4w", "group_size": None}, tmp_path / "stage", model=object())


@pytest.fixture(scope="module")
def variants_job(tiny_llama, tmp_path_factory):
    """tiny-llama's ExecuTorch generation target (the LLM runner's program) with its 8da4w variant, gated in
    TextLLMRunner (beside hfexport) and optimum-executorch (its venv): (target folder, report)."""
    from hfexport.job.run import run_job
    from hfexport.testing import peers

    recipe = json.loads((tiny_llama / "export_config.json").read_text())
    recipe["default_target"] = TARGET
    # the embedding stated 8-bit: tiny-llama's random embedding at 4 bits (the default) leaves its greedy tokens agreeing
    # 0.25 in both runtimes, below the 4-bit floor (measured; docs/quantization.md, "Variants")
    recipe["targets"] = {TARGET: {"export_format": "executorch", "mode": "generation",
                                  "variants": [{"name": "8da4w", "embedding": "8w"}],
                                  "parity": {"generate": {"max_new_tokens": 8}}}}
    output = tmp_path_factory.mktemp("pte-variants")
    with mock.patch.dict(os.environ, {"HFEXPORT_RUNTIME_OPTIMUM_EXECUTORCH": str(peers.optimum_executorch_venv())}):
        return output / TARGET, run_job(tiny_llama, output, recipe=recipe, latency=False)


@pytest.mark.slow
def test_the_8da4w_program_is_gated_in_both_runtimes_by_its_folder(variants_job):
    from executorch.exir._serialize._program import deserialize_pte_binary

    folder, report = variants_job
    target = report.targets[TARGET]
    assert target.status == "ok", target.error
    [entry] = target.variants
    assert (entry["name"], entry["file"], entry["verdict"]) == ("8da4w", "8da4w/model.pte", "passed")
    assert entry["settings"]["group_size"] == 32  # tiny-llama's 64 and 128 take optimum-executorch's default
    assert (entry["settings"]["head"], entry["settings"]["embedding"]) == ("8da8w", "8w")
    assert entry["positions"] > 10 and entry["nll_ratio"] <= 1.5
    assert {check["runtime"]: check["verdict"] for check in entry["runtimes"]} == {
        "executorch-llm-runner": "passed", "optimum-executorch": "passed"}
    variant = folder / "8da4w"
    assert {path.name for path in variant.iterdir()} == {"model.pte", "tokenizer.json", "tokenizer_config.json",
                                                         "config.json", "generation_config.json"}
    assert entry["bytes"] == sum(path.stat().st_size for path in variant.iterdir())
    assert (variant / "model.pte").stat().st_size < (folder / "model.pte").stat().st_size / 3

    def operators(path):
        plan = deserialize_pte_binary((path / "model.pte").read_bytes()).program.execution_plan[0]
        return {operator.name for operator in plan.operators}

    # the LLM runner's kernels kept, the embedding one 8-bit kernel (`embedding` 8w), the linears (the head's 8-bit
    # weights too: `head` 8da8w, the default) in XNNPACK's delegates
    assert {"llama::custom_sdpa", "llama::update_cache", "quantized_decomposed::embedding_byte"} <= operators(variant)
    assert "quantized_decomposed::embedding_byte" not in operators(folder)
    assert {"llama::custom_sdpa", "llama::update_cache"} <= operators(folder)
    assert {item["path"] for item in target.files} >= {"8da4w/model.pte", "8da4w/tokenizer.json"}
    assert report.read(folder).targets[TARGET].variants == target.variants


@pytest.mark.slow
def test_the_float32_folder_still_opens_its_own_program_beside_the_variant(variants_job, tiny_llama):
    """optimum-executorch's `from_pretrained(folder)` loads every `.pte` under the folder, `8da4w/model.pte` too: it
    keeps the one directly in the folder (the float32 program), token for token as before."""
    from hfexport.deployment import PASSED, run_checks
    from hfexport.testing import peers

    folder, report = variants_job
    [before] = [check for check in report.targets[TARGET].runtimes if check["runtime"] == "optimum-executorch"]
    request = _request(folder, tiny_llama)
    with mock.patch.dict(os.environ, {"HFEXPORT_RUNTIME_OPTIMUM_EXECUTORCH": str(peers.optimum_executorch_venv())}):
        checks = {check.runtime: check for check in run_checks("executorch", folder, request)}
    assert before["verdict"] == PASSED and checks["optimum-executorch"].verdict == PASSED, checks
    assert checks["executorch-llm-runner"].verdict == PASSED, checks


def _request(folder, tiny_llama):
    """The gate's generation request for tiny-llama's ExecuTorch target (its sample prompts, greedy, 8 new tokens)."""
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from hfexport.deployment.gate import generation_request
    from hfexport.plan import build_plan
    from hfexport.recipe.loading import load_recipe

    recipe = load_recipe(json.loads((folder / "export_config.json").read_text()))
    tokenizer = AutoTokenizer.from_pretrained(tiny_llama)
    model = AutoModelForCausalLM.from_pretrained(tiny_llama, dtype=torch.float32).eval()
    return generation_request(model, build_plan(recipe, TARGET, model, None, tokenizer), tokenizer)
