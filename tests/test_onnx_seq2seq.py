"""Encoder-decoder ONNX generation exports in the seq2seq loaders' layout (`encoder_model.onnx` +
`decoder_model_merged.onnx`, hfexport.formats.onnx.seq2seq_contract): the files optimum (`ORTModelForSeq2SeqLM`,
`ORTModelForSpeechSeq2Seq`) and transformers.js open as they are, checked by the gate token for token against
`model.generate`, and run by hfexport's own `generate` (tests/test_generate_seq2seq.py runs it on the same mBART
export). tiny mBART (text) and tiny Whisper (audio) are exported once per session by jobs whose gate runs the
runtimes, in the environments `hfexport.testing.peers` builds.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
from pathlib import Path

import pytest

from hfexport.deployment import NOT_CHECKED, PASSED, GenerationRequest, run_checks
from hfexport.testing import peers

TARGET = "onnx-generation"
ROOT = Path(__file__).resolve().parents[1]
SNIPPET = re.compile(r"<!-- seq2seq-snippet: (?P<runtime>[\w.-]+) -->\n```(?:js|python)\n(?P<code>.*?)```", re.S)
REPO = "your-org/your-seq2seq"


@pytest.fixture(scope="session")
def mbart_folder(_mbart_job) -> Path:
    output, report = _mbart_job  # the session's export (read only; conftest's mbart_job gives a module's report copy)
    assert report.targets[TARGET].status == "ok", report.targets[TARGET].error
    return output / TARGET


@pytest.fixture(scope="session")
def whisper_job(session_dir, runtime_env):
    from unittest import mock

    from hfexport.job.run import run_job
    from hfexport.testing.models import make_model

    folder = session_dir / "tiny-whisper"
    if not (folder / "export_config.json").is_file():
        make_model("tiny-whisper", folder)
    output = session_dir / "whisper-onnx-runtimes"
    with mock.patch.dict(os.environ, runtime_env):
        report = run_job(folder, output, targets=[TARGET], latency=False)
    return folder, output / TARGET, report.targets[TARGET]


def _io(path: Path) -> tuple[dict, dict]:
    import onnx

    graph = onnx.load(str(path), load_external_data=False).graph

    def shape(value):
        return [dim.dim_param or dim.dim_value for dim in value.type.tensor_type.shape.dim]

    return {value.name: shape(value) for value in graph.input}, {value.name: shape(value) for value in graph.output}


def test_an_encoder_decoder_is_saved_as_encoder_model_and_decoder_model_merged(mbart_folder):
    names = {path.name for path in mbart_folder.iterdir()}
    assert {"encoder_model.onnx", "encoder_model.onnx_data", "decoder_model_merged.onnx",
            "decoder_model_merged.onnx_data", "config.json", "generation_config.json", "tokenizer.json"} <= names
    assert not {"encoder.onnx", "prefill.onnx", "decode.onnx", "decode.onnx.data"} & names
    components = json.loads((mbart_folder / "export.json").read_text())["components"]
    assert {name: entry["file"] for name, entry in components.items()} == {
        "encoder": "encoder_model.onnx", "prefill": "decoder_model_merged.onnx", "decode": "decoder_model_merged.onnx"}
    inputs, outputs = _io(mbart_folder / "encoder_model.onnx")
    assert inputs == {"input_ids": ["batch_size", "encoder_sequence_length"],
                      "attention_mask": ["batch_size", "encoder_sequence_length"]}
    assert list(outputs) == ["last_hidden_state"]
    inputs, outputs = _io(mbart_folder / "decoder_model_merged.onnx")
    # optimum zips its per-layer (decoder key, value, encoder key, value) tuples with the past inputs in graph order.
    assert list(inputs) == ["input_ids", "encoder_attention_mask", "encoder_hidden_states",
                            *[f"past_key_values.{i}.{kind}.{part}" for i in range(1)
                              for kind in ("decoder", "encoder") for part in ("key", "value")], "use_cache_branch"]
    assert inputs["past_key_values.0.decoder.value"] == ["batch_size", 4, "past_decoder_sequence_length", 8]
    assert inputs["past_key_values.0.encoder.key"] == ["batch_size", 4, "encoder_sequence_length_out", 8]
    assert inputs["use_cache_branch"] == [1]
    assert list(outputs) == ["logits", *[f"present.{i}.{kind}.{part}" for i in range(1)
                                         for kind in ("decoder", "encoder") for part in ("key", "value")]]


def test_the_merged_decoder_stores_each_weight_once(mbart_folder):
    """The prefill and decode branches share their weights (and the transposed copies the optimizer folded): one
    initializer per distinct tensor, in the outer graph."""
    import hashlib

    import onnx_ir

    model = onnx_ir.load(str(mbart_folder / "decoder_model_merged.onnx"))
    digests = [hashlib.sha256(value.const_value.tobytes()).hexdigest() + str(value.const_value.shape)
               for value in model.graph.initializers.values()]
    assert len(digests) == len(set(digests))
    node = list(model.graph)
    assert [n.op_type for n in node] == ["If"]
    assert all(not branch.initializers for branch in (node[0].attributes["then_branch"].value,
                                                       node[0].attributes["else_branch"].value))


def test_the_gate_runs_optimum_and_transformers_js_on_mbart(mbart_job):
    _, report = mbart_job
    checks = {check["runtime"]: check for check in report.targets[TARGET].runtimes}
    assert {name: check["verdict"] for name, check in checks.items()} == {
        "transformers.js": PASSED, "optimum": PASSED, "onnxruntime-genai": NOT_CHECKED}, checks
    # Each prompt alone and both in one right-padded batch (the encoder's input, as its tokenizer pads).
    assert checks["transformers.js"]["batch_sizes"] == [1, 2] and checks["optimum"]["batch_sizes"] == [1, 2]
    assert checks["transformers.js"]["version"] == peers.NODE_PACKAGES["@huggingface/transformers"]
    assert "not a model type of onnxruntime-genai" in checks["onnxruntime-genai"]["reason"]


def test_whisper_is_saved_in_the_layout_and_passes_in_optimum_and_transformers_js(whisper_job):
    _, folder, target = whisper_job
    assert target.status == "ok", target.error
    inputs, _ = _io(folder / "encoder_model.onnx")
    assert inputs == {"input_features": ["batch_size", 80, 200]}
    inputs, _ = _io(folder / "decoder_model_merged.onnx")
    assert "encoder_attention_mask" not in inputs  # Whisper's decoder attends to every frame
    assert inputs["encoder_hidden_states"] == ["batch_size", 100, 32]
    checks = {check["runtime"]: check for check in target.runtimes}
    assert checks["optimum"]["verdict"] == PASSED and checks["optimum"]["batch_sizes"] == [1, 2]
    # transformers.js 4.3's Whisper generate starts one decoder row: batch 1 only.
    assert checks["transformers.js"]["verdict"] == PASSED and checks["transformers.js"]["batch_sizes"] == [1]
    assert checks["onnxruntime-genai"]["verdict"] == NOT_CHECKED
    assert "present_key_cross" in checks["onnxruntime-genai"]["reason"]


def test_hfexports_own_generate_runs_whisper_from_the_same_files(whisper_job):
    import numpy as np
    import torch
    from transformers import AutoFeatureExtractor, WhisperForConditionalGeneration

    from hfexport import ExportedModel

    source, folder, _ = whisper_job
    model = WhisperForConditionalGeneration.from_pretrained(source).eval()
    extractor = AutoFeatureExtractor.from_pretrained(source)
    seconds = np.arange(int(16000 * 1.5)) / 16000
    audio = [np.sin(2 * np.pi * 440 * seconds).astype(np.float32),
             np.random.default_rng(0).standard_normal(16000).astype(np.float32) * 0.1]
    features = extractor(audio, sampling_rate=16000, return_tensors="pt").input_features
    exported = ExportedModel.from_pretrained(folder, precision="f32")
    with torch.no_grad():
        expected = model.generate(input_features=features, max_new_tokens=8)
    got = exported.generate(input_features=features, max_new_tokens=8)
    assert torch.equal(got, expected), (got.tolist(), expected.tolist())


def test_a_seq2seq_request_on_a_folder_outside_the_layout_is_not_checked(tmp_path):
    request = GenerationRequest(prompts=[[5, 6, 2]], expected=[[7, 2]], max_new_tokens=4, eos_token_id=[2],
                                pad_token_id=1, is_encoder_decoder=True, model_type="t5")
    checks = {check.runtime: check for check in run_checks("onnx", tmp_path, request)}
    assert {check.verdict for check in checks.values()} == {NOT_CHECKED}
    assert "decoder_model_merged.onnx" in checks["optimum"].reason
    assert "decoder_model_merged.onnx" in checks["transformers.js"].reason


def test_the_card_names_the_seq2seq_pipeline_and_class_by_task():
    from hfexport.layout import Place
    from hfexport.report.card import runtime_snippets
    from hfexport.report.data import JobReport, TargetReport

    passed = [{"runtime": "transformers.js", "verdict": PASSED}, {"runtime": "optimum", "verdict": PASSED}]
    for task, pipeline, ort_class in (("text2text-generation", "text2text-generation", "ORTModelForSeq2SeqLM"),
                                      ("automatic-speech-recognition", "automatic-speech-recognition",
                                       "ORTModelForSpeechSeq2Seq"),
                                      ("text-generation", "text-generation", "ORTModelForCausalLM")):
        target = TargetReport(TARGET, "onnx", "generation", plan={"task": task}, runtimes=passed)
        text = "\n".join(runtime_snippets("org/m", JobReport(source={}, targets={TARGET: target}),
                                          {TARGET: Place("onnx")}))
        assert f'pipeline("{pipeline}", "org/m"' in text and f"{ort_class}.from_pretrained" in text


@pytest.fixture(scope="session")
def snippet_repo(tmp_path_factory, tiny_mbart, mbart_folder) -> Path:
    """A folder laid out as the model's repo after the PR: the model's own files at the root, the export in onnx/."""
    models = tmp_path_factory.mktemp("seq2seq-snippets")
    repo = models / REPO
    shutil.copytree(tiny_mbart, repo)
    shutil.copytree(mbart_folder, repo / "onnx")
    return models


def _expected_text(tiny_mbart) -> str:
    import torch
    from transformers import AutoModelForSeq2SeqLM, AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(tiny_mbart)
    model = AutoModelForSeq2SeqLM.from_pretrained(tiny_mbart).eval()
    with torch.no_grad():
        out = model.generate(**tokenizer("The capital of France is", return_tensors="pt"), max_new_tokens=16,
                             do_sample=False)
    return tokenizer.decode(out[0], skip_special_tokens=True)


@pytest.mark.parametrize("runtime", ["transformers.js", "optimum"])
def test_the_readme_seq2seq_snippet_generates_model_generates_text(runtime, snippet_repo, runtime_env, tiny_mbart):
    snippets = {match["runtime"]: match["code"] for match in SNIPPET.finditer((ROOT / "README.md").read_text())}
    assert set(snippets) == {"transformers.js", "optimum"}
    code = snippets[runtime]
    assert REPO in code
    if runtime == "transformers.js":
        modules = Path(runtime_env["HFEXPORT_RUNTIME_TRANSFORMERS_JS"])
        script = snippet_repo / "snippet.mjs"
        script.write_text('import { env } from "@huggingface/transformers";\n'
                          f"env.localModelPath = {json.dumps(str(snippet_repo))}; env.allowRemoteModels = false;\n"
                          + code)
        link = snippet_repo / "node_modules"
        if not link.exists():
            link.symlink_to(modules / "node_modules", target_is_directory=True)
        command = ["node", str(script)]
    else:
        script = snippet_repo / "snippet.py"
        script.write_text(code.replace(REPO, str(snippet_repo / REPO)))
        command = [runtime_env["HFEXPORT_RUNTIME_OPTIMUM"], str(script)]
    done = subprocess.run(command, capture_output=True, text=True, timeout=300, cwd=snippet_repo,
                          env={**os.environ, "HF_HUB_OFFLINE": "1"})
    assert done.returncode == 0, done.stderr[-2000:]
    assert done.stdout.strip().splitlines()[-1].strip() == _expected_text(tiny_mbart).strip()


@pytest.mark.slow
def test_an_export_in_the_engines_older_seq2seq_layout_still_loads_and_generates(session_dir, tiny_mbart,
                                                                                 monkeypatch):
    """Publications made before the seq2seq layout hold `encoder.onnx`, `prefill.onnx` and `decode.onnx` with the
    engine's names: exported here as they were (the layout step off), then loaded and run token for token."""
    import torch
    from transformers import AutoModelForSeq2SeqLM, AutoTokenizer

    from hfexport import ExportedModel
    from hfexport.formats.onnx import seq2seq_contract as onnx_seq2seq
    from hfexport.job.run import run_job

    monkeypatch.setattr(onnx_seq2seq, "to_contract", lambda folder: False)
    output = session_dir / "mbart-older-layout"
    report = run_job(tiny_mbart, output, targets=[TARGET], latency=False)
    assert report.targets[TARGET].status == "ok", report.targets[TARGET].error
    assert (output / TARGET / "prefill.onnx").is_file() and not (output / TARGET / "decoder_model_merged.onnx").exists()
    model = AutoModelForSeq2SeqLM.from_pretrained(tiny_mbart).eval()
    tokenizer = AutoTokenizer.from_pretrained(tiny_mbart)
    inputs = dict(tokenizer(["The capital of France is", "The quick brown fox jumps over the lazy"],
                            return_tensors="pt", padding=True))
    with torch.no_grad():
        expected = model.generate(**inputs, do_sample=False, max_new_tokens=10)
    exported = ExportedModel.from_pretrained(output / TARGET, precision="f32")
    assert torch.equal(exported.generate(inputs["input_ids"], inputs["attention_mask"], max_new_tokens=10), expected)


def test_the_seq2seq_target_is_published_in_onnx(mbart_job, mbart_folder):
    from hfexport.layout import Place, assign_places
    from hfexport.publication.publish import _layout_spec, _Target

    _, report = mbart_job
    spec = _layout_spec(_Target(TARGET, mbart_folder, report, files={}))
    assert spec["loaders_contract"] is True and spec["artifact"] == "model.onnx"
    assert assign_places({TARGET: spec}) == {TARGET: Place("onnx")}
