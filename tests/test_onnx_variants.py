"""Quantized ONNX generation targets as transformers.js dtype variants: tiny-llama's 8-bit target (`ort_dynamic`)
beside its float32 one is saved in the loaders' contract, gated in the three runtimes under the name it is published
by (`model_quantized.onnx`, transformers.js' `dtype: "q8"`) and judged by the quantized target's token agreement floor,
then published as a pull request on the local Hub, where the README's variant snippet opens it with `dtype` alone
(config.json's `transformers.js_config`). Reuses test_onnx_runtimes' gated float32 target and runtime environments."""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
from pathlib import Path

import pytest

from hfexport.deployment import FAILED, PASSED, GenerationRequest, judge_tokens
from hfexport.formats.onnx.backend import transformers_js_config, transformers_js_dtype
from hfexport.layout import Place, assign_places

from test_onnx_runtimes import README_PROMPT, README_REPO, README_REVISION, TARGET

QUANTIZED = "onnx-generation-q8"
ROOT = Path(__file__).resolve().parents[1]
VARIANT_SNIPPET = re.compile(r"<!-- variant-snippet: transformers\.js q8 -->\n```js\n(?P<code>.*?)```", re.S)


def test_transformers_js_dtypes_are_its_own_suffixes():
    assert [transformers_js_dtype(name) for name in ("model.onnx", "model_quantized.onnx", "model_fp16.onnx",
                                                     "model_q4.onnx", "model_q4f16.onnx", "model_int8.onnx",
                                                     "model_uint8.onnx", "model_bnb4.onnx", "decode.onnx")] == [
        "fp32", "q8", "fp16", "q4", "q4f16", "int8", "uint8", "bnb4", None]


def test_transformers_js_config_names_each_graphs_external_data_and_keeps_the_owners_keys():
    config = {"model_type": "llama", "transformers.js_config": {"device": "webgpu",
                                                                "use_external_data_format": {"other.onnx": 2}}}
    made = transformers_js_config(config, ["model.onnx", "model.onnx_data", "model_quantized.onnx",
                                           "model_quantized.onnx_data", "model_fp16.onnx", "model_fp16.onnx_data",
                                           "model_q4.onnx", "genai_config.json"])
    assert made["model_type"] == "llama"
    assert made["transformers.js_config"] == {
        "device": "webgpu", "kv_cache_dtype": {"fp16": "float16"},
        "use_external_data_format": {"model.onnx": 1, "model_fp16.onnx": 1, "model_quantized.onnx": 1,
                                     "other.onnx": 2}}
    assert transformers_js_config({"a": 1}, ["genai_config.json"]) == {"a": 1}


def test_a_quantized_contract_generation_target_is_a_variant_beside_model_onnx():
    contract = {"export_format": "onnx", "mode": "generation", "loaders_contract": True}
    places = assign_places({TARGET: {**contract, "artifact": "model.onnx"},
                            QUANTIZED: {**contract, "artifact": "model_quantized.onnx"},
                            "onnx-generation-q4": {**contract, "artifact": "model_q4.onnx"},
                            "onnx-generation-fp8": {**contract, "artifact": None}})
    assert places == {TARGET: Place("onnx"), QUANTIZED: Place("onnx", "model_quantized"),
                      "onnx-generation-q4": Place("onnx", "model_q4"),
                      "onnx-generation-fp8": Place("onnx/onnx-generation-fp8")}
    # An OpenVINO generation target keeps its folder only under the name LLMPipeline opens (openvino_model.xml).
    places = assign_places({"ov": {"export_format": "openvino", "mode": "generation", "loaders_contract": True,
                                   "artifact": "openvino_model_qint8_quantized.xml"}})
    assert places == {"ov": Place("openvino/ov")}


def test_a_quantized_target_is_judged_by_its_token_agreement_floor():
    request = GenerationRequest(prompts=[[1], [2]], expected=[[5, 6, 7, 8], [5, 6, 7, 8]], max_new_tokens=4,
                                eos_token_id=[0], min_token_agreement=0.75)
    check = judge_tokens("transformers.js", request, request.expected, [[5, 6, 7, 8], [5, 6, 9, 9]], precision="q8")
    assert check.verdict == PASSED and check.precision == "q8" and check.first_difference["position"] == 2
    check = judge_tokens("transformers.js", request, request.expected, [[5, 9, 9, 9], [5, 6, 9, 9]])
    assert check.verdict == FAILED and "0.38 of the greedy tokens agree" in check.reason
    exact = GenerationRequest(**{**request.__dict__, "min_token_agreement": 1.0})
    assert judge_tokens("optimum", exact, exact.expected, [[5, 6, 7, 8], [5, 6, 7, 9]]).verdict == FAILED


@pytest.fixture(scope="session")
def gated_variant(session_dir, tiny_llama, runtime_env):
    """tiny-llama with an 8-bit ONNX generation target beside its float32 one, the 8-bit one exported and gated:
    (model folder, output folder, target report)."""
    from unittest import mock

    from hfexport.job.run import run_job

    model = session_dir / "llama-variants"
    shutil.copytree(tiny_llama, model)
    recipe = json.loads((model / "export_config.json").read_text())
    recipe["targets"] = {TARGET: recipe["targets"][TARGET],
                         QUANTIZED: {"export_format": "onnx", "mode": "generation", "options": {"dynamic": True},
                                     "quantization": {"method": "ort_dynamic"}}}
    (model / "export_config.json").write_text(json.dumps(recipe, indent=2))
    output = session_dir / "llama-variants-out"
    with mock.patch.dict(os.environ, runtime_env):
        report = run_job(model, output, [QUANTIZED], latency=False)
    return model, output, report.targets[QUANTIZED]


def test_the_gate_opens_the_variant_by_its_dtype_in_every_runtime(gated_variant):
    _, output, target = gated_variant
    assert target.status == "ok", target.error
    assert {path.name for path in (output / QUANTIZED).iterdir()} >= {"model.onnx", "model.onnx_data",
                                                                       "genai_config.json"}
    assert [(check["runtime"], check["verdict"], check["precision"]) for check in target.runtimes] == [
        ("transformers.js", PASSED, "q8"), ("optimum", PASSED, "q8"), ("onnxruntime-genai", PASSED, "q8")], \
        target.runtimes
    # judged as the quantized target itself is (docs/quantization.md: 8-bit generation, 16 tokens, agreement 0.75)
    generation = target.verification["generation"]
    assert (generation["max_new_tokens"], generation["min_token_agreement"]) == (16, 0.75)


@pytest.fixture(scope="session")
def variant_pr(hub, gated_llama, gated_variant):
    """Both targets published as one pull request: (repo, pr number)."""
    from hfexport.publication.publish import publish

    model, output, _ = gated_variant
    shutil.copytree(gated_llama[0], output / TARGET, dirs_exist_ok=True)
    repo = f"{hub.user}/tiny-llama-variants"
    hub.seed_repo(repo, model)
    result = publish(output, repo, mode="pr", targets=[TARGET, QUANTIZED], token=hub.write_token)
    return repo, result.pr_num


def test_the_pull_request_holds_the_variant_under_its_dtype_suffix(hub, variant_pr):
    import onnx

    repo, num = variant_pr
    revision = f"refs/pr/{num}"
    files = set(hub.list_files(repo, revision))
    assert {"onnx/model.onnx", "onnx/model.onnx_data", "onnx/genai_config.json", "onnx/model_quantized.onnx",
            "onnx/model_quantized.onnx_data", "onnx/model_quantized.export.json"} <= files
    graph = onnx.load_from_string(hub.read_file(repo, "onnx/model_quantized.onnx", revision))
    locations = {entry.value for tensor in graph.graph.initializer for entry in tensor.external_data
                 if entry.key == "location"}
    assert locations == {"model_quantized.onnx_data"}
    config = json.loads(hub.read_file(repo, "config.json", revision))
    assert config["transformers.js_config"] == {
        "use_external_data_format": {"model.onnx": 1, "model_quantized.onnx": 1}}
    assert config["model_type"] == "llama"
    readme = hub.read_file(repo, "README.md", revision).decode()
    assert 'dtype: "q8" }' in readme and 'file_name="model_quantized.onnx"' in readme
    assert '"filename": "model_quantized.onnx"' in readme


@pytest.mark.parametrize("snippet", ["fp32", "q8"])
def test_the_readmes_transformers_js_snippets_open_the_pull_request_by_dtype_alone(hub, variant_pr, runtime_env,
                                                                                   snippet, tmp_path):
    from test_onnx_runtimes import readme_snippets

    repo, num = variant_pr
    code = readme_snippets()["transformers.js"] if snippet == "fp32" else \
        VARIANT_SNIPPET.search((ROOT / "README.md").read_text())["code"]
    assert f'dtype: "{snippet}"' in code and "use_external_data_format" not in code
    for text in (README_REPO, README_REVISION, README_PROMPT):
        assert text in code
    code = code.replace(README_REPO, repo).replace(README_REVISION, f"refs/pr/{num}")
    folder = Path(runtime_env["HFEXPORT_RUNTIME_TRANSFORMERS_JS"])
    script = folder / f"variant_snippet_{snippet}.mjs"
    script.write_text(  # where the local Hub is: the one line a user of the real Hub leaves out
        hub.transformers_js_env(tmp_path / "tjs") + code)
    env = {**os.environ, **hub.env(token=False, hf_home=tmp_path / "hf-home")}
    done = subprocess.run(["node", str(script)], capture_output=True, text=True, env=env, cwd=folder, timeout=300)
    assert done.returncode == 0, done.stderr[-3000:]
    assert done.stdout.startswith("The capital of France is") and len(done.stdout.strip()) > len("The capital of "
                                                                                                  "France is")
    suffix = "" if snippet == "fp32" else "_quantized"
    downloaded = {path.name for path in (tmp_path / "tjs").rglob("onnx/*")}  # its cache: what it fetched
    assert {f"model{suffix}.onnx", f"model{suffix}.onnx_data"} <= downloaded, downloaded


@pytest.mark.slow
def test_a_float16_checkpoint_is_gated_as_the_fp16_variant(session_dir, tiny_llama, runtime_env):
    """A checkpoint stored in float16 is loaded at float32 like any other (`hfexport.models.EXPORT_DTYPE`); its
    target's `"dtype": "float16"` makes the float16 graph, published as `model_fp16.onnx` (transformers.js' `dtype:
    "fp16"`), and the gate opens it so in every runtime, judged by hfexport's f16 token agreement floor."""
    from unittest import mock

    import torch
    from transformers import AutoModelForCausalLM

    from hfexport.job.run import run_job

    model = session_dir / "llama-float16"
    shutil.copytree(tiny_llama, model)
    AutoModelForCausalLM.from_pretrained(model, dtype=torch.float16).save_pretrained(model)
    recipe = json.loads((model / "export_config.json").read_text())
    recipe["targets"][TARGET]["dtype"] = "float16"
    (model / "export_config.json").write_text(json.dumps(recipe))
    with mock.patch.dict(os.environ, runtime_env):
        report = run_job(model, session_dir / "llama-float16-out", [TARGET], latency=False)
    target = report.targets[TARGET]
    assert target.status == "ok", target.error
    assert [(check["runtime"], check["verdict"], check["precision"]) for check in target.runtimes] == [
        ("transformers.js", PASSED, "fp16"), ("optimum", PASSED, "fp16"), ("onnxruntime-genai", PASSED, "fp16")], \
        target.runtimes
