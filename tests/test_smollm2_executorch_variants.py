"""SmolLM2-135M-Instruct (real weights) with an ExecuTorch 8da4w variant (issue 46): optimum-executorch's qlinear=8da4w
(groups of 32) with the head at 8da8w and the embedding at 4w (the defaults), made from the eager model with the
float32 program's LLM kernels, passing its quality gate at the default bounds and run by TextLLMRunner and
optimum-executorch from its folder (`executorch/8da4w/`), which judge it by hfexport's 4-bit floor; then published as
a pull request on the local Hub, from which the README's 8da4w snippets (one per runtime) open it.
Slow: a 135M-parameter checkpoint exported twice (float32, then 8da4w), about 21 minutes on two shared cores."""

from __future__ import annotations

import importlib.util
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from hfexport.deployment import PASSED
from hfexport.testing import peers
from hfexport.testing.models import smollm2_as_published
from hfexport.testing.readme import readme_blocks

pytestmark = pytest.mark.slow

ROOT = Path(__file__).resolve().parents[1]
TARGET = "executorch-generation"
README_REPO, README_REVISION, README_PROMPT = "your-org/your-llm", "refs/pr/1", "The capital of France is"
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
    """Measured (AMD EPYC, 2 cores, load 7-12 from other jobs): the defaults (head 8da8w, embedding 4w, linears 8da4w in
    groups of 32) give a perplexity ratio of 1.479 and a next-token agreement of 0.674, and both runtimes' greedy tokens
    agree 0.5625 with float32's, above hfexport's 4-bit floor of 0.5 (optimum-executorch's own form, the head 4-bit and
    the embedding 8-bit: 1.511 / 0.589 and 0.34, failed there); model.pte 106.6 MB, 1.7% over optimum-executorch's
    104.8 MB (docs/quantization.md, "Variants")."""
    output, report = gated
    target = report.targets[TARGET]
    [variant] = target.variants
    assert (variant["name"], variant["file"]) == ("8da4w", "8da4w/model.pte")
    assert variant["settings"]["group_size"] == 32 and variant["settings"]["max_nll_ratio"] == 1.6
    assert (variant["settings"]["head"], variant["settings"]["embedding"]) == ("8da8w", "4w")  # the defaults
    assert variant["nll_ratio"] <= 1.6 and variant["top1_agreement"] >= 0.55  # the default bounds (docs/quantization.md)
    runtimes = {check["runtime"]: check for check in variant["runtimes"]}
    assert set(runtimes) == {"executorch-llm-runner", "optimum-executorch"}
    for check in runtimes.values():  # each generated: a token agreement, not a crash
        assert check.get("token_agreement") is not None, check
    assert {name: check["verdict"] for name, check in runtimes.items()} == {
        "executorch-llm-runner": PASSED, "optimum-executorch": PASSED}, runtimes
    assert variant["verdict"] == "passed" and target.status == "ok", target.error
    program = output / TARGET / "8da4w" / "model.pte"
    assert program.stat().st_size < 0.2 * (output / TARGET / "model.pte").stat().st_size  # 0.16 measured
    assert program.stat().st_size < 1.05 * 104.8e6  # within 5% of optimum-executorch's 8da4w/8w (106.6 MB measured)


@pytest.fixture(scope="module")
def published(hub, smollm2, gated, tmp_path_factory):
    """The gated target (its 8da4w folder inside) published as a pull request on the local Hub, whatever its verdict
    (`allow_failed`: what is checked here is that each runtime opens the variant from the pull request): (repo, pr
    number)."""
    from hfexport.publication.publish import publish

    output, _ = gated
    repo = f"{hub.user}/smollm2-executorch-variants"
    hub.seed_repo(repo, smollm2_as_published(smollm2, tmp_path_factory.mktemp("smollm2-pte-repo")))
    return repo, publish(output, repo, mode="pr", token=hub.write_token, allow_failed=True).pr_num


@pytest.fixture(scope="module")
def expected(smollm2) -> tuple[list[int], str]:
    """`model.generate`'s 8 greedy new tokens for the README's prompt (float32), and their text (printed beside the
    variant's)."""
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(smollm2)
    model = AutoModelForCausalLM.from_pretrained(smollm2, dtype=torch.float32).eval()
    ids = tokenizer(README_PROMPT, return_tensors="pt").input_ids
    new = model.generate(ids, max_new_tokens=8, do_sample=False)[0, ids.shape[1]:].tolist()
    return new, tokenizer.decode(new)


@pytest.mark.parametrize("runtime", ["executorch", "optimum-executorch"])
def test_the_readme_snippet_opens_the_8da4w_variant_from_the_pull_request(hub, published, expected, runtime,
                                                                          tmp_path):
    """The README's 8da4w snippets, run as written against the pull request (the repo and revision replaced): the
    variant's folder downloaded by huggingface_hub's CLI, then TextLLMRunner (hfexport's environment) and
    optimum-executorch (its own venv) generate from it; what was downloaded is the variant's program, never the float32
    one."""
    repo, num = published
    blocks = readme_blocks(f"readme-llm-{runtime}-8da4w")
    assert set(blocks) == {"bash", "python"}, blocks
    for text in (README_REPO, README_REVISION, README_PROMPT):
        assert text in "".join(blocks.values()), (runtime, text)

    def filled(code):
        return code.replace(README_REPO, repo).replace(README_REVISION, f"refs/pr/{num}")

    env = {**os.environ, **hub.env(token=False, hf_home=tmp_path / "hf-home"), "TOKENIZERS_PARALLELISM": "false"}
    done = subprocess.run(["bash", "-c", filled(blocks["bash"])], capture_output=True, text=True, cwd=tmp_path,
                          timeout=300, env={**env, "PATH": f"{Path(sys.executable).parent}:{env['PATH']}"})
    assert done.returncode == 0, done.stderr[-3000:]
    python = sys.executable if runtime == "executorch" else str(peers.optimum_executorch_venv())
    done = subprocess.run([python, "-c", filled(blocks["python"])], capture_output=True, cwd=tmp_path, timeout=600,
                          env=env)
    assert done.returncode == 0, done.stderr[-3000:]
    fetched = {path.relative_to(tmp_path / "your-llm").as_posix() for path in tmp_path.rglob("*.pte")}
    assert fetched == {"executorch/8da4w/model.pte"}, fetched  # the variant's program, never the float32 one
    tokens, first = expected
    printed = done.stdout.decode(errors="replace").strip()
    print(f"{runtime} 8da4w: {printed!r} (float32: {tokens}, {first!r})")
    # the variant's quality is the gate's (above: its token agreement over the 8 passages); on this one prompt its
    # greedy tokens leave float32's at the first (measured: " approximately 3,888 km" for float32's " Paris, ..." in
    # both runtimes), so what is checked here is that each opens the variant from the pull request and generates
    if runtime == "optimum-executorch":  # the new token ids, then their text
        listed, text = printed.splitlines()[-1].split("]", 1)
        new = json.loads(listed + "]")
        assert 1 <= len(new) <= 8 and all(isinstance(token, int) for token in new) and text.strip(), printed
    else:  # the runner prints the new text as it goes, then its statistics line
        assert printed.split("PyTorchObserver", 1)[0].strip(), printed
