"""tiny-llama's ONNX generation target in the loaders' contract, generated token for token by the runtimes people
deploy it with: transformers.js (Node), optimum (its own venv, transformers 4.57) and onnxruntime-genai (its own
venv), each in the environment `hfexport.testing.peers` builds, named to the runtime modules by
`HFEXPORT_RUNTIME_*` as the gate reads them."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest

from hfexport.deployment import FAILED, NOT_CHECKED, PASSED, GenerationRequest, run_checks
from hfexport.formats import format_backend
from hfexport.layout import Place, assign_places
from hfexport.testing import peers

TARGET = "onnx-generation"
MAX_NEW_TOKENS = 8
ROOT = Path(__file__).resolve().parents[1]
SNIPPET = re.compile(r"<!-- runtime-snippet: (?P<runtime>[\w.-]+) -->\n```(?:js|python)\n(?P<code>.*?)```", re.S)
#: What tests/test_smollm2_runtimes.py fills in when it runs the README's snippets against a pull request.
README_REPO, README_REVISION, README_PROMPT = "your-org/your-llm", "refs/pr/1", '"The capital of France is"'


def readme_snippets() -> dict[str, str]:
    """README.md's loading snippets, by runtime (each after a `<!-- runtime-snippet: NAME -->` marker)."""
    return {match["runtime"]: match["code"] for match in SNIPPET.finditer((ROOT / "README.md").read_text())}


def test_the_readme_shows_each_onnx_runtime_with_what_the_slow_test_fills_in():
    snippets = readme_snippets()
    assert set(snippets) == {"transformers.js", "optimum", "onnxruntime-genai"}
    for code in snippets.values():
        assert README_REPO in code and README_REVISION in code and README_PROMPT in code and "16" in code


@pytest.fixture(scope="session")
def contract_folder(gated_llama) -> Path:
    folder, target, _ = gated_llama
    assert target.status == "ok", target.error
    return folder


def generation_request(model_folder: Path, texts: list[str], max_new_tokens: int = MAX_NEW_TOKENS,
                       ) -> GenerationRequest:
    """What the gate asks every runtime: the prompts' token ids and `model.generate`'s greedy new tokens at f32, per
    prompt (batch 1) and for the prompts in one left-padded batch."""
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(model_folder)
    model = AutoModelForCausalLM.from_pretrained(model_folder, dtype=torch.float32).eval()
    eos = model.generation_config.eos_token_id
    eos = eos if isinstance(eos, list) else [eos]
    request = GenerationRequest(prompts=[tokenizer(text)["input_ids"] for text in texts], expected=[],
                                max_new_tokens=max_new_tokens, eos_token_id=eos,
                                pad_token_id=tokenizer.pad_token_id, texts=texts,
                                model_type=model.config.model_type)
    with torch.no_grad():
        for prompt in request.prompts:
            ids = torch.tensor([prompt])
            out = model.generate(ids, attention_mask=torch.ones_like(ids), do_sample=False,
                                 max_new_tokens=max_new_tokens, pad_token_id=request.pad_token_id)
            request.expected.append(request.cut(out[0, ids.shape[1]:].tolist()))
        tokenizer.padding_side = "left"
        batch = tokenizer(texts, return_tensors="pt", padding=True)
        out = model.generate(**batch, do_sample=False, max_new_tokens=max_new_tokens,
                             pad_token_id=request.pad_token_id)
        request.padded_expected = [request.cut(row[batch["input_ids"].shape[1]:].tolist()) for row in out]
    return request


@pytest.fixture(scope="session")
def request_for_llama(tiny_llama) -> GenerationRequest:
    texts = json.loads((tiny_llama / "export_config.json").read_text())["sample_inputs"]["text"]
    return generation_request(tiny_llama, texts)


def test_the_onnx_generation_target_is_saved_in_the_loaders_contract(contract_folder):
    import onnx

    names = {path.name for path in contract_folder.iterdir()}
    assert {"model.onnx", "model.onnx_data", "genai_config.json", "config.json", "generation_config.json",
            "tokenizer.json", "tokenizer_config.json"} <= names
    assert not {"decode.onnx", "decode.onnx.data"} & names
    manifest = json.loads((contract_folder / "export.json").read_text())
    assert manifest["components"]["decode"]["file"] == "model.onnx"
    graph = onnx.load(str(contract_folder / "model.onnx"), load_external_data=False).graph

    def shape(value):
        return [dim.dim_param or dim.dim_value for dim in value.type.tensor_type.shape.dim]

    inputs = {value.name: shape(value) for value in graph.input}
    outputs = {value.name: shape(value) for value in graph.output}
    assert list(inputs)[:3] == ["input_ids", "attention_mask", "position_ids"]
    assert inputs["past_key_values.0.key"] == ["batch_size", 2, "past_sequence_length", 16]
    assert inputs["past_key_values.1.value"] == ["batch_size", 2, "past_sequence_length", 16]
    assert inputs["attention_mask"][0] == "batch_size"
    assert outputs["logits"] == ["batch_size", "sequence_length", 384]
    assert outputs["present.1.value"] == ["batch_size", 2, "past_sequence_length + sequence_length", 16]
    genai = json.loads((contract_folder / "genai_config.json").read_text())
    assert genai["model"]["decoder"] == {
        "filename": "model.onnx", "head_size": 16, "hidden_size": 64, "num_attention_heads": 4,
        "num_hidden_layers": 2, "num_key_value_heads": 2,
        "inputs": {"input_ids": "input_ids", "attention_mask": "attention_mask", "position_ids": "position_ids",
                   "past_key_names": "past_key_values.%d.key", "past_value_names": "past_key_values.%d.value"},
        "outputs": {"logits": "logits", "present_key_names": "present.%d.key",
                    "present_value_names": "present.%d.value"}}
    assert genai["search"]["past_present_share_buffer"] is False
    assert genai["model"]["type"] == "llama" and genai["model"]["eos_token_id"] == 1


def test_hfexports_own_generate_runs_the_same_files(contract_folder, request_for_llama):
    """One contract: `ExportedModel.generate` reads the files the runtimes read, and generates model.generate's
    tokens (batch 1 and the left-padded batch)."""
    import torch

    from hfexport import ExportedModel

    exported = ExportedModel.from_pretrained(contract_folder)
    request = request_for_llama
    for prompt, expected in zip(request.prompts, request.expected, strict=True):
        out = exported.generate(torch.tensor([prompt]), max_new_tokens=MAX_NEW_TOKENS, do_sample=False)
        assert request.cut(out[0, len(prompt):].tolist()) == expected
    width = max(map(len, request.prompts))
    ids = torch.tensor([[request.pad_token_id] * (width - len(p)) + p for p in request.prompts])
    mask = torch.tensor([[0] * (width - len(p)) + [1] * len(p) for p in request.prompts])
    out = exported.generate(ids, attention_mask=mask, max_new_tokens=MAX_NEW_TOKENS, do_sample=False)
    assert [request.cut(row[width:].tolist()) for row in out] == request.padded_expected


def test_the_gate_reports_every_onnx_runtime_passed(gated_llama):
    _, target, _ = gated_llama
    assert [(check["runtime"], check["verdict"]) for check in target.runtimes] == [
        ("transformers.js", PASSED), ("optimum", PASSED), ("onnxruntime-genai", PASSED)], target.runtimes
    checks = {check["runtime"]: check for check in target.runtimes}
    assert checks["transformers.js"]["version"] == peers.NODE_PACKAGES["@huggingface/transformers"]
    assert checks["onnxruntime-genai"]["version"] == "0.18.0" and checks["optimum"]["version"]
    # transformers.js and optimum batch (a left-padded batch of the recipe's two prompts); onnxruntime-genai gives
    # left-padded rows other positions than model.generate (hfexport.formats.onnx.runtimes.onnxruntime_genai): batch 1 only.
    assert checks["transformers.js"]["batch_sizes"] == [1, 2] and checks["optimum"]["batch_sizes"] == [1, 2]
    assert checks["onnxruntime-genai"]["batch_sizes"] == [1]


def test_a_runtime_that_is_absent_is_not_checked_and_one_that_crashes_or_hangs_fails(
        contract_folder, request_for_llama, monkeypatch, tmp_path):
    monkeypatch.setenv("HFEXPORT_RUNTIME_TRANSFORMERS_JS", str(tmp_path / "nowhere"))
    monkeypatch.setenv("HFEXPORT_RUNTIME_ONNXRUNTIME_GENAI", str(tmp_path / "no-python"))
    broken = tmp_path / "python"
    broken.write_text("#!/bin/sh\necho 'ImportError: no optimum here' >&2\nexit 3\n")
    broken.chmod(0o755)
    monkeypatch.setenv("HFEXPORT_RUNTIME_OPTIMUM", str(broken))
    checks = {check.runtime: check for check in run_checks("onnx", contract_folder, request_for_llama)}
    assert checks["transformers.js"].verdict == NOT_CHECKED and "not installed" in checks["transformers.js"].reason
    assert checks["onnxruntime-genai"].verdict == NOT_CHECKED
    assert checks["optimum"].verdict == FAILED and "no optimum here" in checks["optimum"].reason
    hanging = tmp_path / "hanging"
    hanging.write_text("#!/bin/sh\nsleep 30\n")
    hanging.chmod(0o755)
    monkeypatch.setenv("HFEXPORT_RUNTIME_OPTIMUM", str(hanging))
    request = GenerationRequest(**{**request_for_llama.__dict__, "timeout_s": 1.0})
    from hfexport.formats.onnx.runtimes import optimum

    check = optimum.check_generation(contract_folder, request)
    assert check.verdict == FAILED and "time limit" in check.reason


def test_a_folder_outside_the_contract_is_not_checked(tmp_path, request_for_llama):
    checks = run_checks("onnx", tmp_path, request_for_llama)
    assert [check.verdict for check in checks] == [NOT_CHECKED] * 3
    assert format_backend("onnx").runtimes == ("hfexport.formats.onnx.runtimes.transformers_js",
                                                "hfexport.formats.onnx.runtimes.optimum",
                                                "hfexport.formats.onnx.runtimes.onnxruntime_genai")


def test_a_contract_generation_target_is_published_to_onnx():
    targets = {"onnx-generation": {"export_format": "onnx", "mode": "generation", "artifact": "model.onnx",
                                   "loaders_contract": True},
               "pte-generation": {"export_format": "executorch", "mode": "generation", "artifact": "model.pte"}}
    places = assign_places(targets)
    assert places == {"onnx-generation": Place("onnx"), "pte-generation": Place("executorch/pte-generation")}
    # A forward ONNX target keeps onnx/model.onnx; the generation target then goes to its own folder.
    places = assign_places({**targets, "onnx": {"export_format": "onnx", "mode": "forward",
                                                "artifact": "model.onnx"}})
    assert places["onnx"] == Place("onnx") and places["onnx-generation"] == Place("onnx/onnx-generation")


def test_the_card_shows_the_runtimes_that_passed_and_only_those(gated_llama):
    from hfexport.report.card import render_section

    _, target, report = gated_llama
    card = render_section("org/tiny-llama", report, {TARGET: Place("onnx")})
    assert 'pipeline("text-generation", "org/tiny-llama"' in card
    assert 'ORTModelForCausalLM.from_pretrained("org/tiny-llama", subfolder="onnx")' in card
    assert 'og.Model(f"{folder}/onnx")' in card
    assert "hold the engine's generation graphs" not in card
    saved = target.runtimes
    try:
        target.runtimes = [{**check, "verdict": NOT_CHECKED} if check["runtime"] == "optimum" else check
                           for check in saved]
        card = render_section("org/tiny-llama", report, {TARGET: Place("onnx")})
    finally:
        target.runtimes = saved
    assert "ORTModelForCausalLM.from_pretrained(\"org/tiny-llama\", subfolder" not in card
    assert 'pipeline("text-generation"' in card


def test_an_export_in_the_engines_older_layout_still_loads_and_generates(contract_folder, request_for_llama,
                                                                         tmp_path):
    """Publications made before the contract hold `decode.onnx` with the engine's names
    (`input.past_key_values.layers.{i}.keys`, `output.past_key_values.layers.{i}.values`): still loaded and run."""
    import re

    import onnx_ir
    import torch

    from hfexport import ExportedModel

    old = tmp_path / "old"
    old.mkdir()
    for name in ("config.json", "generation_config.json", "export_config.json"):
        (old / name).write_bytes((contract_folder / name).read_bytes())
    model = onnx_ir.load(str(contract_folder / "model.onnx"))
    for value in model.graph.inputs:
        value.name = re.sub(r"^past_key_values\.(\d+)\.(key|value)$", r"input.past_key_values.layers.\1.\2s", value.name)
    for value in model.graph.outputs:
        value.name = re.sub(r"^present\.(\d+)\.(key|value)$", r"output.past_key_values.layers.\1.\2s", value.name)
    onnx_ir.save(model, str(old / "decode.onnx"), external_data="decode.onnx.data")
    manifest = json.loads((contract_folder / "export.json").read_text())
    manifest["components"]["decode"]["file"] = "decode.onnx"
    (old / "export.json").write_text(json.dumps(manifest))
    exported = ExportedModel.from_pretrained(old)
    prompt, expected = request_for_llama.prompts[0], request_for_llama.expected[0]
    out = exported.generate(torch.tensor([prompt]), max_new_tokens=MAX_NEW_TOKENS, do_sample=False)
    assert request_for_llama.cut(out[0, len(prompt):].tolist()) == expected


@pytest.mark.parametrize(("model_type", "genai_type"), [("llama", "llama"), ("qwen2", "qwen2"), ("gpt2", "decoder"),
                                                        ("starcoder2", "decoder")])
def test_genai_config_names_a_model_type_onnxruntime_genai_runs_as_a_plain_decoder(model_type, genai_type):
    """onnxruntime-genai gives GPT-2 a model of its own (one combined cache tensor per layer), so a GPT-2 graph in the
    contract runs as its generic "decoder"; an unknown model_type too."""
    from hfexport.formats.onnx.decoder_contract import genai_config

    config = {"model_type": model_type, "vocab_size": 320, "num_attention_heads": 4, "hidden_size": 32,
              "max_position_embeddings": 64, "eos_token_id": 1}
    made = genai_config({"num_hidden_layers": 2, "num_key_value_heads": 4, "head_size": 8}, config, {"pad_token_id": 0})
    assert made["model"]["type"] == genai_type
    assert (made["model"]["pad_token_id"], made["model"]["eos_token_id"], made["model"]["context_length"]) == (0, 1, 64)


def test_a_sliding_window_input_is_folded_and_any_other_unknown_input_keeps_the_engine_layout():
    """transformers 5.23 traces Gemma3's sliding layers with `..._sliding_window_tensor` as an input; the contract makes
    it a constant of config.sliding_window. An input no runtime feeds otherwise keeps the graph out of the contract."""
    import onnx
    import onnx_ir
    from onnx import TensorProto, helper

    from hfexport.formats.onnx.decoder_contract import _fold_sliding_windows, outside_contract

    sliding = "input.past_key_values.layers.0._sliding_window_tensor"
    graph = helper.make_graph(
        [helper.make_node("Identity", [sliding], ["window_out"]), helper.make_node("Identity", ["input_ids"], ["ids"])],
        "g", [helper.make_tensor_value_info("input_ids", TensorProto.INT64, ["b", "s"]),
              helper.make_tensor_value_info(sliding, TensorProto.INT64, []),
              helper.make_tensor_value_info("input.past_key_values.layers.0.keys", TensorProto.FLOAT, ["b", 2, "p", 4]),
              helper.make_tensor_value_info("token_type_ids", TensorProto.INT64, ["b", "s"])],
        [helper.make_tensor_value_info("window_out", TensorProto.INT64, []),
         helper.make_tensor_value_info("ids", TensorProto.INT64, ["b", "s"])])
    model = onnx_ir.serde.deserialize_model(helper.make_model(graph))
    _fold_sliding_windows(model.graph, {"sliding_window": 512})
    assert sliding not in [value.name for value in model.graph.inputs]
    assert model.graph.initializers[sliding].const_value.numpy() == 512
    assert outside_contract(model.graph) == ["token_type_ids"]
    onnx.checker.check_model(onnx_ir.serde.serialize_model(model))
