"""A real checkpoint end to end in the LLM runtimes (issue 27): SmolLM2-135M-Instruct exported with a plain OpenVINO
generation recipe, the gate running OpenVINO GenAI and optimum-intel on it, published as a pull request on the local
Hub, downloaded from `refs/pr/N` and run through LLMPipeline (and optimum-intel) on chat prompts, token for token at
f32 against `model.generate`; and the same for the plain ExecuTorch target in TextLLMRunner and optimum-executorch
(the LLM runner's contract). Slow: a 135M-parameter checkpoint and a minute or more of export."""

from __future__ import annotations

from pathlib import Path

import pytest

from hfexport.deployment import PASSED, run_checks
from hfexport.testing import peers

from test_deployment_llm import generation_request

pytestmark = pytest.mark.slow

CHAT = ["What is the capital of France?", "Write a haiku about the sea.", "Explain gravity to a child in one sentence."]
MAX_NEW = 24
RECIPE = {"recipe_version": 1, "task": "text-generation", "default_target": "openvino-generation",
          "targets": {"openvino-generation": {"export_format": "openvino", "mode": "generation",
                                              "options": {"dynamic": True}}}}


@pytest.fixture(scope="module")
def runtime_env():
    return {"HFEXPORT_RUNTIME_OPENVINO_GENAI": str(peers.openvino_genai_venv()),
            "HFEXPORT_RUNTIME_OPTIMUM_INTEL": str(peers.peer_venv())}


@pytest.fixture(scope="module")
def published(hub, smollm2, runtime_env, tmp_path_factory):
    """The job (with the gate's runtime checks) and its PR: (report, repo, pr number)."""
    import json

    from hfexport.job.run import run_job
    from hfexport.publication.publish import publish

    repo = f"{hub.user}/smollm2-llm-runtimes"
    hub.seed_repo(repo, smollm2)
    recipe = tmp_path_factory.mktemp("recipe") / "export_config.json"
    recipe.write_text(json.dumps(RECIPE))
    output = tmp_path_factory.mktemp("smollm2-openvino")
    with pytest.MonkeyPatch.context() as patch:
        for key, value in runtime_env.items():
            patch.setenv(key, value)
        report = run_job(smollm2, output, recipe=recipe, latency=False)
    result = publish(output, repo, mode="pr", token=hub.write_token)
    return report, repo, result.pr_num


def test_the_gate_ran_the_runtimes_on_the_export(published):
    report = published[0]
    target = report.targets["openvino-generation"]
    assert target.status == "ok", target.error
    verdicts = {(check["runtime"], check.get("precision")): check["verdict"] for check in target.runtimes}
    assert verdicts[("openvino-genai", "f32")] == PASSED, target.runtimes
    assert verdicts[("optimum-intel", "f32")] == PASSED, target.runtimes


def test_llm_pipeline_runs_the_pull_request_on_chat_prompts(published, smollm2, hub, runtime_env, monkeypatch,
                                                            tmp_path):
    from huggingface_hub import snapshot_download

    _, repo, num = published
    files = set(hub.list_files(repo, f"refs/pr/{num}"))
    assert {"openvino/openvino_model.xml", "openvino/openvino_model.bin", "openvino/openvino_tokenizer.xml",
            "openvino/openvino_detokenizer.xml", "openvino/tokenizer.json", "openvino/config.json",
            "openvino/generation_config.json"} <= files
    local = Path(snapshot_download(repo, revision=f"refs/pr/{num}", allow_patterns=["openvino/*"],
                                   cache_dir=tmp_path / "hub-cache", token=hub.write_token))
    request = generation_request(smollm2, CHAT, MAX_NEW, chat=True)
    for key, value in runtime_env.items():
        monkeypatch.setenv(key, value)
    checks = run_checks("openvino", local / "openvino", request)
    by = {(check.runtime, check.precision): check for check in checks}
    assert by[("openvino-genai", "f32")].verdict == PASSED, by[("openvino-genai", "f32")].reason
    assert by[("openvino-genai", "f32")].batch_sizes == [1, 3]
    assert by[("optimum-intel", "f32")].verdict == PASSED, by[("optimum-intel", "f32")].reason
    card = hub.read_file(repo, "README.md", f"refs/pr/{num}").decode()
    assert "openvino_genai.LLMPipeline" in card and "OVModelForCausalLM.from_pretrained" in card


# ExecuTorch's LLM runner: the plain ExecuTorch generation target (the runner's contract: model.pte holding its cache
# and weights, tokenizer.json), the recipe's sample prompts being the chat prompts as the chat template writes them
# (TextLLMRunner takes text and, SmolLM2's template starting with its BOS id, no extra BOS).
PTE_TARGET = "pte-llm"


def chat_texts(model_dir: Path) -> list[str]:
    from transformers import AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(model_dir)
    return [tokenizer.apply_chat_template([{"role": "user", "content": text}], add_generation_prompt=True,
                                          tokenize=False) for text in CHAT]


@pytest.fixture(scope="module")
def optimum_executorch_env():
    return {"HFEXPORT_RUNTIME_OPTIMUM_EXECUTORCH": str(peers.optimum_executorch_venv())}


@pytest.fixture(scope="module")
def published_pte(hub, smollm2, optimum_executorch_env, tmp_path_factory):
    """The job with its ExecuTorch target (the gate running TextLLMRunner and optimum-executorch) and its PR:
    (report, repo, pr number)."""
    import json

    from hfexport.job.run import run_job
    from hfexport.publication.publish import publish

    repo = f"{hub.user}/smollm2-executorch-runner"
    hub.seed_repo(repo, smollm2)
    recipe = tmp_path_factory.mktemp("recipe-pte") / "export_config.json"
    recipe.write_text(json.dumps({
        "recipe_version": 1, "task": "text-generation", "default_target": PTE_TARGET,
        "sample_inputs": {"text": chat_texts(smollm2)},
        "targets": {PTE_TARGET: {"export_format": "executorch", "mode": "generation",
                                 "parity": {"generate": {"max_new_tokens": MAX_NEW}}}}}))
    output = tmp_path_factory.mktemp("smollm2-pte")
    with pytest.MonkeyPatch.context() as patch:
        for key, value in optimum_executorch_env.items():
            patch.setenv(key, value)
        report = run_job(smollm2, output, recipe=recipe, latency=False)
    result = publish(output, repo, mode="pr", token=hub.write_token)
    return report, repo, result.pr_num


def test_the_gate_ran_textllmrunner_on_the_pte(published_pte):
    target = published_pte[0].targets[PTE_TARGET]
    assert target.status == "ok", target.error
    checks = {check["runtime"]: check for check in target.runtimes}
    assert checks["executorch-llm-runner"]["verdict"] == PASSED, checks
    assert checks["optimum-executorch"]["verdict"] == PASSED, checks


def test_textllmrunner_runs_the_pull_request_on_chat_prompts(published_pte, smollm2, hub, tmp_path,
                                                             optimum_executorch_env, monkeypatch):
    from huggingface_hub import snapshot_download

    _, repo, num = published_pte
    files = set(hub.list_files(repo, f"refs/pr/{num}"))
    assert {"executorch/model.pte", "executorch/tokenizer.json", "executorch/config.json",
            "executorch/generation_config.json"} <= files
    assert "executorch/model.ptd" not in files  # the weights are inside: optimum-executorch reads no .ptd
    local = Path(snapshot_download(repo, revision=f"refs/pr/{num}", allow_patterns=["executorch/*"],
                                   cache_dir=tmp_path / "hub-cache", token=hub.write_token))
    request = generation_request(smollm2, chat_texts(smollm2), MAX_NEW)
    for key, value in optimum_executorch_env.items():
        monkeypatch.setenv(key, value)
    checks = run_checks("executorch", local / "executorch", request)
    for check in checks:  # TextLLMRunner and optimum-executorch, each on the downloaded files
        assert check.verdict == PASSED, (check.runtime, check.reason)
    # hfexport's own generate reads the same files, token for token
    import torch

    from hfexport import load

    exported = load(repo, revision=f"refs/pr/{num}", subfolder="executorch", token=hub.write_token,
                    cache_dir=tmp_path / "hub-cache")
    for prompt, want in zip(request.prompts, request.expected, strict=True):
        out = exported.generate(torch.tensor([prompt]), max_new_tokens=MAX_NEW, do_sample=False)
        assert request.cut(out[0, len(prompt):].tolist()) == want
