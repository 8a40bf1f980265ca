"""SmolLM2-135M-Instruct (real weights) with an ExecuTorch 8da4w variant (issue 46): optimum-executorch's qlinear=8da4w
(groups of 32) and qembedding=8w, made from the eager model with the float32 program's LLM kernels, passing its
quality gate at the default bounds and run by TextLLMRunner and optimum-executorch from its folder
(`executorch/8da4w/`), which judge it by hfexport's 4-bit floor.
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


def test_the_8da4w_variant_passes_its_quality_gate_and_both_runtimes_run_it_by_name(gated):
    """Measured (benchmarks/results/variant_quality_executorch.json): perplexity ratio 1.511 and next-token agreement
    0.589, the same figures as optimum-executorch's own 8da4w of the checkpoint; both runtimes generate from the
    variant's folder, their greedy tokens agreeing 0.34 with float32's, below hfexport's 4-bit floor of 0.5: the gate
    fails the variant there, by name (the floor is not loosened for it)."""
    output, report = gated
    target = report.targets[TARGET]
    [variant] = target.variants
    assert (variant["name"], variant["file"]) == ("8da4w", "8da4w/model.pte")
    assert variant["settings"]["group_size"] == 32 and variant["settings"]["max_nll_ratio"] == 1.6
    assert variant["nll_ratio"] <= 1.6 and variant["top1_agreement"] >= 0.55  # the default bounds (docs/quantization.md)
    runtimes = {check["runtime"]: check for check in variant["runtimes"]}
    assert set(runtimes) == {"executorch-llm-runner", "optimum-executorch"}
    for check in runtimes.values():  # each generated: a token agreement, not a crash
        assert check.get("token_agreement") is not None, check
    failed = {name for name, check in runtimes.items() if check["verdict"] != PASSED}
    assert variant["verdict"] == ("failed" if failed else "passed")
    assert all(f"{name}: " in target.error for name in failed) if failed else target.status == "ok"
    program = output / TARGET / "8da4w" / "model.pte"
    assert program.stat().st_size < 0.2 * (output / TARGET / "model.pte").stat().st_size  # 0.16 measured
