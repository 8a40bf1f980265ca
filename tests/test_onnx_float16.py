"""A float32 checkpoint's ONNX generation target published in float16 (the recipe target's `"dtype": "float16"`,
hfexport.formats.onnx.float16): converted by onnxruntime's own converter when saved, recorded as float16 in the manifest,
judged at f16 (direction, decisions and the f16 token agreement floor) by hfexport's verification and by the three
runtimes opening it as transformers.js' `dtype: "fp16"` file (`model_fp16.onnx`), run by hfexport's own `generate`,
published as that variant with `transformers.js_config`, and rebound through a weight map that records the cast.

The checkpoint is tiny-llama with seeded noise on every weight (`perturbed_checkpoint`, as test_rebind's): the bundled
one is a fresh initialization, which the weight map calls degenerate and never rebinds."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
from pathlib import Path

import pytest

from hfexport.deployment import PASSED
from hfexport.errors import RecipeError
from hfexport.files import MANIFEST_FILE

FP16 = "onnx-generation-fp16"
FP16_TARGET = {"export_format": "onnx", "mode": "generation", "options": {"dynamic": True}, "dtype": "float16"}


def _recipe(targets: dict) -> dict:
    return {"task": "text-generation", "targets": targets}


def test_the_recipes_dtype_takes_float16_on_onnx_targets_only():
    from hfexport.recipe.data import recipe_from_document

    recipe = recipe_from_document(_recipe({FP16: FP16_TARGET, "forward": {"export_format": "onnx",
                                                                         "dtype": "float16"}}))
    assert recipe.target(FP16).dtype == "float16" and recipe.target(FP16).to_dict()["dtype"] == "float16"
    assert recipe.target("forward").dtype == "float16"
    bad = {
        "ov": ({"export_format": "openvino", "mode": "generation", "dtype": "float16"},
               "targets.ov.dtype", "dtype converts an ONNX graph"),
        "q8": ({**FP16_TARGET, "quantization": {"method": "ort_dynamic"}},
               "targets.q8.dtype", "cannot be combined with quantization"),
        "bf16": ({**FP16_TARGET, "dtype": "bfloat16"}, "targets.bf16.dtype", "float16"),
    }
    for name, (target, path, words) in bad.items():
        with pytest.raises(RecipeError) as caught:
            recipe_from_document(_recipe({name: target}))
        message = str(caught.value)
        assert path in message and words in message, message


def test_only_a_float32_graph_is_converted(tmp_path):
    """A bfloat16 checkpoint's graph is refused with the dtype named (onnxruntime's converter takes float32); a float16
    one is left as it is (nothing to convert)."""
    from hfexport.formats.onnx.float16 import Float16Error, convert

    manifest = {"export_format": "onnx", "components": {"decode": {"file": "model.onnx",
                                                                    "metadata": {"export_dtype": "bfloat16"}}}}
    (tmp_path / MANIFEST_FILE).write_text(json.dumps(manifest))
    with pytest.raises(Float16Error, match="float16 converts a float32 graph; component 'decode' was exported at "
                                           "bfloat16"):
        convert(tmp_path)
    manifest["components"]["decode"]["metadata"]["export_dtype"] = "float16"
    (tmp_path / MANIFEST_FILE).write_text(json.dumps(manifest))
    assert convert(tmp_path) is False


def test_the_weight_maps_clamped_cast_is_onnxruntimes_float16_conversion():
    """`cast_clamped` writes the bytes onnxruntime's converter writes, at the edges where a plain cast differs."""
    import numpy
    import torch
    from onnxruntime.transformers.float16 import convert_np_to_float16

    from hfexport.rebind.weight_map import clamped_float16

    values = numpy.array([0.0, -0.0, 1e-9, -1e-9, 2.0 ** -25, 3e-8, 5.9e-8, 6e-8, 1e-5, 0.1, -0.3, 65504.0, 65519.0,
                          70000.0, -1e6, 3.4e38, float("inf"), float("-inf")], dtype=numpy.float32)
    expected = convert_np_to_float16(values)
    got = clamped_float16(torch.from_numpy(values)).numpy()
    assert got.tobytes() == expected.tobytes(), (got, expected)
    assert torch.from_numpy(values).to(torch.float16).numpy().tobytes() != expected.tobytes()  # a cast would not


def test_the_conversion_streams_the_weights_into_the_file_onnxruntimes_converter_writes(gated_llama, tmp_path,
                                                                                      monkeypatch):
    """`convert` converts the graph without its weights, each large initializer (`STREAMED_BYTES`; here every one)
    read from the float32 data and converted as it is written (issue 45: one tensor in memory, not the graph): the
    files onnxruntime's converter writes from the whole graph, byte for byte."""
    import onnx_ir

    from hfexport.formats.onnx import float16

    folder, target, _ = gated_llama
    assert target.status == "ok", target.error
    whole, streamed = tmp_path / "whole", tmp_path / "streamed"
    for copy in (whole, streamed):
        shutil.copytree(folder, copy)
    graph = whole / "model.onnx"
    model = float16.float16_model(graph)  # the converter as onnxruntime ships it, on the whole graph
    (whole / "model.onnx_data").unlink()
    onnx_ir.save(onnx_ir.from_proto(model), str(graph), external_data="model.onnx_data")
    converted = []
    monkeypatch.setattr(float16, "STREAMED_BYTES", 1)
    monkeypatch.setattr(float16, "CHUNK", 1000)  # several chunks per tensor
    monkeypatch.setattr(float16, "_converted", lambda *args, convert=float16._converted: converted.append(args[-1])
                        or convert(*args))
    assert float16.convert(streamed)
    assert converted.count(True) > 10  # the weights were streamed, not read with the graph
    assert sorted(path.name for path in streamed.iterdir()) == sorted(path.name for path in whole.iterdir())
    for name in ("model.onnx", "model.onnx_data"):
        assert (streamed / name).read_bytes() == (whole / name).read_bytes(), name


@pytest.fixture(scope="session")
def fp16_checkpoints(session_dir, tiny_llama):
    """(old, new): two trained-looking tiny-llama checkpoints whose recipe has the float16 target."""
    from hfexport.testing.models import perturbed_checkpoint

    folders = []
    for seed in (1, 2):
        folder = perturbed_checkpoint(tiny_llama, session_dir / f"fp16-llama-{seed}", seed=seed)
        recipe = json.loads((folder / "export_config.json").read_text())
        recipe["targets"], recipe["default_target"] = {FP16: FP16_TARGET}, FP16
        (folder / "export_config.json").write_text(json.dumps(recipe, indent=2))
        folders.append(folder)
    return tuple(folders)


@pytest.fixture(scope="session")
def gated_fp16(session_dir, fp16_checkpoints, runtime_env):
    """The float16 target exported and gated in the three runtimes: (output folder, target report)."""
    from unittest import mock

    from hfexport.job.run import run_job

    output = session_dir / "llama-fp16-out"
    with mock.patch.dict(os.environ, runtime_env):
        report = run_job(fp16_checkpoints[0], output, [FP16], latency=False)
    return output, report.targets[FP16]


def test_the_float32_graph_is_converted_to_float16_and_recorded_so(gated_fp16):
    import onnx

    output, target = gated_fp16
    assert target.status == "ok", target.error
    folder = output / FP16
    assert {"model.onnx", "model.onnx_data", "genai_config.json", "tokenizer.json"} <= \
        {path.name for path in folder.iterdir()}
    manifest = json.loads((folder / MANIFEST_FILE).read_text())
    assert {entry["metadata"]["export_dtype"] for entry in manifest["components"].values()} == {"float16"}
    graph = onnx.load(str(folder / "model.onnx"), load_external_data=False)
    types = {value.name: value.type.tensor_type.elem_type for value in [*graph.graph.input, *graph.graph.output]}
    half = onnx.TensorProto.FLOAT16
    assert types["logits"] == types["past_key_values.0.key"] == types["present.0.value"] == half, types
    assert types["input_ids"] == onnx.TensorProto.INT64
    # the weight map was made from the float16 files: every weight held, as onnxruntime's clamped cast of its float32
    # parameter
    weight_map = manifest["weight_map"]
    assert not weight_map["degenerate"] and not weight_map["uncovered"] and not weight_map["unmapped"]
    weights = [entry for entry in weight_map["tensors"] if entry["dtype"] == "float16"]
    assert weights and all("cast_clamped" in part["transform"] for entry in weights for part in entry["parts"])


def test_the_float16_target_is_judged_at_f16_by_hfexport_and_the_three_runtimes(gated_fp16):
    _, target = gated_fp16
    verification = target.verification
    assert verification["passed"] and verification["export_dtype"] == "float16", verification["failures"]
    assert verification["thresholds"]["basis"] == "defaults for ONNX float16 graph at f16 runtime precision"
    assert verification["runtime"]["precision"] == "f16"
    generation = verification["generation"]
    assert generation["min_token_agreement"] == 0.75, generation  # the f16 floor: never claimed token-exact
    assert [(check["runtime"], check["verdict"], check["precision"]) for check in target.runtimes] == [
        ("transformers.js", PASSED, "fp16"), ("optimum", PASSED, "fp16"), ("onnxruntime-genai", PASSED, "fp16")], \
        target.runtimes
    assert all(0.75 <= check["token_agreement"] <= 1 for check in target.runtimes), target.runtimes


def test_hfexports_own_generate_runs_the_float16_files(gated_fp16, fp16_checkpoints):
    import torch
    from transformers import AutoModelForCausalLM

    import hfexport

    output, _ = gated_fp16
    exported = hfexport.load(output / FP16)
    model = AutoModelForCausalLM.from_pretrained(fp16_checkpoints[0])
    ids = torch.tensor([[1, 15, 27, 8, 99], [1, 7, 300, 42, 5]])
    mask = torch.ones_like(ids)
    ours = exported.generate(input_ids=ids, attention_mask=mask, max_new_tokens=12, do_sample=False)
    expected = model.generate(input_ids=ids, attention_mask=mask, max_new_tokens=12, do_sample=False,
                              pad_token_id=0)
    assert ours.shape == expected.shape
    agreement = float((ours[:, 5:] == expected[:, 5:]).float().mean())
    assert agreement >= 0.75, (ours.tolist(), expected.tolist())


def test_a_push_of_new_weights_is_rebound_into_the_float16_graph(gated_fp16, fp16_checkpoints, tmp_path):
    """The weight map holds each weight as a cast: a push writes the new weights cast to float16, byte for byte what
    the map recomputes, and the gate judges the result as it judges an export."""
    from safetensors.torch import load_file

    from hfexport.job.run import run_job
    from hfexport.rebind.weight_map import _compute, _stored_u8, stored_tensors

    output, _ = gated_fp16
    shutil.copytree(output / FP16, tmp_path / "out" / FP16)
    report = run_job(fp16_checkpoints[1], tmp_path / "out", [FP16], latency=False, runtimes=False)
    target = report.targets[FP16]
    assert (target.status, target.method) == ("ok", "rebind"), (target.error, target.rebind)
    assert target.rebind["fallback"] is None and target.rebind["bytes_written"] > 0
    assert target.verification["passed"] and target.verification["export_dtype"] == "float16"
    folder = tmp_path / "out" / FP16
    manifest = json.loads((folder / MANIFEST_FILE).read_text())
    stored = stored_tensors(folder, manifest)
    new = {**load_file(fp16_checkpoints[1] / "model.safetensors")}
    checked = 0
    for record in manifest["weight_map"]["tensors"]:
        keys = [key for part in record["parts"] for key in part["keys"]]
        if record["dtype"] != "float16" or not all(key in new for key in keys):
            continue
        assert bytes(_compute(record, new).numpy()) == bytes(_stored_u8(stored[record["file"]][record["name"]])
                                                            .numpy()), record["name"]
        checked += 1
    assert checked >= 10


@pytest.fixture(scope="session")
def fp16_pr(hub, gated_fp16, fp16_checkpoints):
    """The float16 target published alone as a pull request on its checkpoint's repo: (repo, pr number)."""
    from hfexport.publication.publish import publish

    output, _ = gated_fp16
    repo = f"{hub.user}/tiny-llama-fp16"
    hub.seed_repo(repo, fp16_checkpoints[0])
    result = publish(output, repo, mode="pr", targets=[FP16], token=hub.write_token)
    return repo, result.pr_num


def test_the_pull_request_holds_model_fp16_and_transformers_js_opens_it_by_dtype_alone(hub, fp16_pr, runtime_env,
                                                                                        tmp_path):
    import re

    repo, num = fp16_pr
    revision = f"refs/pr/{num}"
    files = set(hub.list_files(repo, revision))
    assert {"onnx/model_fp16.onnx", "onnx/model_fp16.onnx_data", "onnx/model_fp16.export.json"} <= files
    assert "onnx/model.onnx" not in files
    config = json.loads(hub.read_file(repo, "config.json", revision))
    assert config["transformers.js_config"] == {"kv_cache_dtype": {"fp16": "float16"},
                                                "use_external_data_format": {"model_fp16.onnx": 1}}
    readme = hub.read_file(repo, "README.md", revision).decode()
    assert 'file_name="model_fp16.onnx"' in readme and '"filename": "model_fp16.onnx"' in readme
    snippet = re.search(r'```js\n(import \{ pipeline \}[^`]*?dtype: "fp16"[^`]*?)```', readme)
    assert snippet, readme
    folder = Path(runtime_env["HFEXPORT_RUNTIME_TRANSFORMERS_JS"])
    script = folder / "fp16_card_snippet.mjs"
    script.write_text(  # the card's snippet as it is, then one greedy generation; the local Hub's address first
        hub.transformers_js_env(tmp_path / "tjs")
        + snippet[1].replace(f'"{repo}", {{', f'"{repo}", {{ revision: "{revision}", ')
        + 'const out = await generator("hello world", { max_new_tokens: 4, do_sample: false });\n'
          'console.log(JSON.stringify(out));\n')
    env = {**os.environ, **hub.env(token=False, hf_home=tmp_path / "hf-home")}
    done = subprocess.run(["node", str(script)], capture_output=True, text=True, env=env, cwd=folder, timeout=300)
    assert done.returncode == 0, done.stderr[-3000:]
    assert json.loads(done.stdout.strip().splitlines()[-1])[0]["generated_text"].startswith("hello world")
    downloaded = {path.name for path in (tmp_path / "tjs").rglob("onnx/*")}
    assert {"model_fp16.onnx", "model_fp16.onnx_data"} <= downloaded and "model.onnx" not in downloaded, downloaded


@pytest.mark.slow
def test_smollm2_converted_to_float16_is_gated_in_every_onnx_runtime(smollm2, runtime_env, tmp_path):
    """SmolLM2-135M-Instruct (stored in float32) with the float16 target, on chat prompts, 16 greedy tokens: hfexport's
    verification and the three runtimes judged at f16; the agreement each reached is in the report."""
    from unittest import mock

    from transformers import AutoTokenizer

    from hfexport.job.run import run_job

    model = tmp_path / "smollm2"
    shutil.copytree(smollm2, model)
    tokenizer = AutoTokenizer.from_pretrained(model)
    chat = ["What is the capital of France?", "Write a haiku about the sea."]
    prompts = [tokenizer.apply_chat_template([{"role": "user", "content": text}], tokenize=False,
                                             add_generation_prompt=True) for text in chat]
    recipe = {"recipe_version": 1, "task": "text-generation", "sample_inputs": {"text": prompts},
              "targets": {FP16: {"export_format": "onnx", "mode": "generation", "dtype": "float16",
                                 "parity": {"generate": {"max_new_tokens": 16}}}}}
    (model / "export_config.json").write_text(json.dumps(recipe, indent=2))
    (model / ".complete").unlink(missing_ok=True)
    with mock.patch.dict(os.environ, runtime_env):
        report = run_job(model, tmp_path / "out", latency=False)
    target = report.targets[FP16]
    assert target.status == "ok", target.error
    generation = target.verification["generation"]
    figures = {"hfexport": generation["token_agreement"],
               **{check["runtime"]: (check.get("token_agreement"), check.get("first_difference"))
                  for check in target.runtimes}}
    print("SmolLM2 float16 token agreement:", json.dumps(figures))
    assert [(check["runtime"], check["verdict"], check["precision"]) for check in target.runtimes] == [
        ("transformers.js", PASSED, "fp16"), ("optimum", PASSED, "fp16"), ("onnxruntime-genai", PASSED, "fp16")], \
        figures


def test_an_encoder_decoders_float16_generation_target_is_refused_with_the_field_named(tiny_mbart, tmp_path):
    """Its two graphs would be converted but published under the float32 names, which its loaders open as float32:
    the target fails with the recipe field named, nothing is written, and the job goes on."""
    from hfexport.job.run import run_job

    model = tmp_path / "mbart"
    shutil.copytree(tiny_mbart, model)
    (model / "export_config.json").write_text(json.dumps({"task": "text2text-generation", "targets": {
        FP16: FP16_TARGET}}))
    report = run_job(model, tmp_path / "out", latency=False)
    target = report.targets[FP16]
    assert target.status == "error" and f"targets.{FP16}.dtype" in target.error, target.error
    assert "decoder-only" in target.error and not (tmp_path / "out" / FP16).exists()
