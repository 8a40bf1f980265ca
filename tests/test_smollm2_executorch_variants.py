"""SmolLM2-135M-Instruct (real weights) with an ExecuTorch 8da4w variant (issue 46): optimum-executorch's qlinear=8da4w
(groups of 32) and qembedding=8w, made from the eager model with the float32 program's LLM kernels, passing its
quality gate at the default bounds and in TextLLMRunner and optimum-executorch by its folder (`executorch/8da4w/`).
Slow: a 135M-parameter checkpoint exported twice (float32, then 8da4w), minutes on two cores."""

from __future__ import annotations

import importlib.util
from pathlib import Path

import pytest

from hfexport.deployment import PASSED
from hfexport.testing import peers

pytestmark = pytest.mark.slow

TARGET = "executorch-generation"
#: benchmarks/variant_quality.py's 8 passages, on which the 8da4w bounds were measured (docs/quantization.md,
#: "Variants"): a 4-bit variant's greedy tokens leave float32's soon on some prompts, so the runtimes' 4-bit floor is
#: judged over all eight, as the benchmark judged it
_SPEC = importlib.util.spec_from_file_location(
    "variant_quality", Path(__file__).resolve().parents[1] / "benchmarks" / "variant_quality.py")
_BENCHMARK = importlib.util.module_from_spec(_SPEC)
_SPEC.loader.exec_module(_BENCHMARK)
RECIPE = {"recipe_version": 1, "task": "text-generation", "default_target": TARGET,
          "sample_inputs": {"text": _BENCHMARK.TEXTS},
          "targets": {TARGET: {"export_format": "executorch", "mode": "generation", "variants": ["8da4w"]}}}


@pytest.fixture(scope="module")
def gated(smollm2, tmp_path_factory):
    from hfexport.job.run import run_job

    output = tmp_path_factory.mktemp("smollm2-pte-variants")
    with pytest.MonkeyPatch.context() as patch:
        patch.setenv("HFEXPORT_RUNTIME_OPTIMUM_EXECUTORCH", str(peers.optimum_executorch_venv()))
        return output, run_job(smollm2, output, recipe=RECIPE, latency=False)


def test_the_8da4w_variant_passes_its_gate_in_both_runtimes(gated):
    output, report = gated
    target = report.targets[TARGET]
    assert target.status == "ok", target.error
    [variant] = target.variants
    assert (variant["name"], variant["file"], variant["verdict"]) == ("8da4w", "8da4w/model.pte", "passed")
    assert variant["settings"]["group_size"] == 32 and variant["settings"]["max_nll_ratio"] == 1.5
    assert variant["nll_ratio"] <= 1.5 and variant["top1_agreement"] >= 0.6  # the default bounds (docs/quantization.md)
    assert {check["runtime"] for check in variant["runtimes"] if check["verdict"] == PASSED} == {
        "executorch-llm-runner", "optimum-executorch"}
    program = output / TARGET / "8da4w" / "model.pte"
    assert program.stat().st_size < 0.35 * (output / TARGET / "model.pte").stat().st_size
