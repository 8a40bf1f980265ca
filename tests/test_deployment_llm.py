"""Generation exports in the LLM runtimes' own contracts (issue 27): OpenVINO GenAI's LLMPipeline and optimum-intel's
OVModelForCausalLM on the OpenVINO target, run as their users run them (each in its own environment), token for
token against `model.generate` on tiny-llama's sample prompts."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest

from hfexport.deployment import FAILED, NOT_CHECKED, PASSED, GenerationRequest, run_checks
from hfexport.deployment import _python
from hfexport.formats.openvino.runtimes import openvino_genai, optimum_intel
from hfexport.testing import peers
from hfexport.testing.readme import readme_snippet

MAX_NEW_TOKENS = 8


def generation_request(model_dir: Path, texts: list[str], max_new_tokens: int = MAX_NEW_TOKENS,
                       chat: bool = False) -> GenerationRequest:
    """What the gate asks the runtimes: the prompts as token ids and `model.generate`'s greedy new tokens for each
    alone and for all in one left-padded batch."""
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(model_dir)
    model = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32).eval()
    if chat:
        prompts = [tokenizer.apply_chat_template([{"role": "user", "content": text}], add_generation_prompt=True,
                                                 tokenize=True, return_dict=False) for text in texts]
        prompts = [list(p["input_ids"]) if isinstance(p, dict) else list(p) for p in prompts]
    else:
        prompts = [tokenizer(text).input_ids for text in texts]
    eos = model.generation_config.eos_token_id
    eos = [eos] if isinstance(eos, int) else list(eos or [])
    pad = model.generation_config.pad_token_id
    pad = pad if pad is not None else tokenizer.pad_token_id
    options = {"max_new_tokens": max_new_tokens, "do_sample": False, "num_beams": 1, "pad_token_id": pad}
    request = GenerationRequest(prompts, [], max_new_tokens, eos, pad, texts=texts,
                                model_type=model.config.model_type)
    with torch.no_grad():
        for prompt in prompts:
            ids = torch.tensor([prompt])
            out = model.generate(ids, attention_mask=torch.ones_like(ids), **options)
            request.expected.append(request.cut(out[0, len(prompt):].tolist()))
        if pad is not None and len(prompts) > 1:
            width = max(map(len, prompts))
            ids = torch.full((len(prompts), width), pad)
            mask = torch.zeros((len(prompts), width), dtype=torch.long)
            for row, prompt in enumerate(prompts):
                ids[row, width - len(prompt):] = torch.tensor(prompt)
                mask[row, width - len(prompt):] = 1
            out = model.generate(ids, attention_mask=mask, **options)
            request.padded_expected = [request.cut(row[width:].tolist()) for row in out]
    return request


@pytest.fixture(scope="session")
def llama_request(tiny_llama) -> GenerationRequest:
    texts = json.loads((tiny_llama / "export_config.json").read_text())["sample_inputs"]["text"]
    return generation_request(tiny_llama, texts)


@pytest.fixture(scope="session")
def openvino_llama(exported_llama) -> Path:
    output, report = exported_llama
    assert report.targets["openvino-generation"].status == "ok", report.targets["openvino-generation"].error
    return output / "openvino-generation"


@pytest.fixture()
def runtimes(monkeypatch):
    """The runtimes' own environments, as the gate finds them (HFEXPORT_RUNTIME_<NAME>)."""
    monkeypatch.setenv("HFEXPORT_RUNTIME_OPENVINO_GENAI", str(peers.openvino_genai_venv()))
    monkeypatch.setenv("HFEXPORT_RUNTIME_OPTIMUM_INTEL", str(peers.peer_venv()))


def test_openvino_generation_is_one_stateful_graph_under_optimum_intels_names(openvino_llama, llama_request):
    import openvino as ov

    from hfexport import load

    files = {path.name for path in openvino_llama.iterdir()}
    assert {"openvino_model.xml", "openvino_model.bin", "config.json", "generation_config.json", "tokenizer.json",
            "openvino_tokenizer.xml", "openvino_detokenizer.xml"} <= files
    assert "openvino_decode.xml" not in files
    model = ov.Core().read_model(openvino_llama / "openvino_model.xml")
    assert [port.get_any_name() for port in model.inputs] == ["input_ids", "attention_mask", "position_ids",
                                                              "beam_idx"]
    assert [port.get_any_name() for port in model.outputs] == ["logits"]
    assert len(model.get_sinks()) == 2 * 2  # keys and values of tiny-llama's two layers, in ReadValue/Assign states
    manifest = json.loads((openvino_llama / "export.json").read_text())
    assert manifest["components"]["decode"]["file"] == "openvino_model.xml"
    # hfexport's own runner reads the same files
    import torch

    exported = load(openvino_llama)
    for prompt, want in zip(llama_request.prompts, llama_request.expected, strict=True):
        out = exported.generate(torch.tensor([prompt]), max_new_tokens=MAX_NEW_TOKENS, do_sample=False)
        assert llama_request.cut(out[0, len(prompt):].tolist()) == want


def _runtime_layers(program) -> dict[str, int]:
    """How many nodes of each kind the CPU plugin runs `program` as (compiled at an f32 hint: no CPU-dependent
    precision)."""
    import collections

    import openvino as ov

    compiled = ov.Core().compile_model(program, "CPU", {"INFERENCE_PRECISION_HINT": "f32"})
    return collections.Counter(str(node.get_rt_info()["layerType"].astype(str))
                               for node in compiled.get_runtime_model().get_ops())


def test_openvino_generation_attention_compiles_to_the_fused_kv_cache_attention(openvino_llama):
    """Each attention of the saved stateful decode is one CPU `ScaledDotProductAttention` holding the KV cache, as
    optimum-intel's export compiles (hfexport.formats.openvino.workarounds.fuse_ready_cache_broadcasts): tiny-llama's two
    layers, grouped-query (4 heads, 2 KV heads), no unfused MatMul/Softmax left."""
    import openvino as ov

    from hfexport.formats.openvino.workarounds import fuse_ready_cache_broadcasts

    program = ov.Core().read_model(openvino_llama / "openvino_model.xml")
    layers = _runtime_layers(program)
    assert layers["ScaledDotProductAttention"] == 2 and layers["Softmax"] == 0 and layers["MatMul"] == 0, layers
    assert fuse_ready_cache_broadcasts(program) == 0  # already in the fused form


def test_the_engines_own_stateful_decode_compiles_to_unfused_attention(monkeypatch):
    """Canary of hfexport.formats.openvino.workarounds's `fuse_ready_cache_broadcasts`: transformers 5.23's own OpenVINO
    export of tiny-llama's stateful decode compiles to unfused attention on the CPU (its numpy repeat_kv Broadcast
    defeats the plugin's StatefulSDPAFusion). Once this fails, the engine's graph fuses and the fix can go. The fix
    turns the same program into the fused one, keys and values of both layers."""
    import hfexport.formats.openvino.program
    from hfexport.export import AutoHfExporter
    from hfexport.formats.openvino.workarounds import fuse_ready_cache_broadcasts

    monkeypatch.setattr(hfexport.formats.openvino.program, "fuse_ready_cache_broadcasts", lambda program: 0)
    exporter = AutoHfExporter.from_pretrained(Path(__file__).resolve().parent.parent / "examples" / "tiny-llama",
                                              target="openvino-generation")
    program = exporter.export().components["decode"].program
    layers = _runtime_layers(program)
    assert layers["ScaledDotProductAttention"] == 0 and layers["Softmax"] == 2, layers
    assert fuse_ready_cache_broadcasts(program) == 2 * 2
    assert _runtime_layers(program)["ScaledDotProductAttention"] == 2


def test_llm_pipeline_and_optimum_intel_generate_model_generates_tokens(openvino_llama, llama_request, runtimes):
    import openvino as ov

    checks = run_checks("openvino", openvino_llama, llama_request)
    by_runtime = {}
    for check in checks:
        by_runtime.setdefault(check.runtime, []).append(check)
    genai = by_runtime["openvino-genai"]
    assert genai[0].verdict == PASSED, genai[0].reason
    assert genai[0].precision == "f32" and genai[0].batch_sizes == [1, 2]
    assert genai[0].version.startswith("2026.4.1")
    # The device default: f32 here (no AVX512-BF16/AMX), a second record judged at its own precision elsewhere.
    default = ov.Core().get_property("CPU", "INFERENCE_PRECISION_HINT").get_type_name()
    assert len(genai) == (1 if default == "f32" else 2)
    if default != "f32":
        assert genai[1].precision == default and genai[1].verdict in (PASSED, FAILED)
    intel = by_runtime["optimum-intel"][0]
    assert intel.verdict == PASSED, intel.reason
    assert intel.version == "1.27.0" and intel.batch_sizes == [1, 2]


def test_reduced_precision_is_judged_by_hfexports_floor_for_it():
    request = GenerationRequest([[1, 2]], [[5, 6, 7, 8]], 4, [9])
    assert openvino_genai.judge_at_precision("r", request, [[5, 6, 7, 8]], "f32").verdict == PASSED
    assert openvino_genai.judge_at_precision("r", request, [[5, 6, 0, 8]], "f32").verdict == FAILED
    # bf16's floor is 0.5 of the tokens (verify.thresholds.RUNTIME_MIN_TOKEN_AGREEMENT)
    passed = openvino_genai.judge_at_precision("r", request, [[5, 6, 0, 0]], "bf16")
    assert passed.verdict == PASSED and passed.precision == "bf16" and passed.first_difference["position"] == 2
    failed = openvino_genai.judge_at_precision("r", request, [[5, 0, 0, 0]], "bf16")
    assert failed.verdict == FAILED and "0.25" in failed.reason


def test_a_runtime_that_stops_at_eos_without_returning_it_made_the_same_tokens():
    request = GenerationRequest([[1]], [[4, 9]], 8, [9])
    assert openvino_genai.stop_token_kept(request, [[4]]) == [[4, 9]]
    assert openvino_genai.stop_token_kept(request, [[4, 5]]) == [[4, 5]]


def test_absent_crashed_and_hung_runtimes(openvino_llama, llama_request, monkeypatch, tmp_path):
    monkeypatch.delenv("HFEXPORT_RUNTIME_OPENVINO_GENAI", raising=False)
    monkeypatch.delenv("HFEXPORT_RUNTIME_OPTIMUM_INTEL", raising=False)
    with monkeypatch.context() as patched:
        for module in (openvino_genai, optimum_intel):  # nor importable beside hfexport
            patched.setattr(module, "interpreter", lambda runtime, name: None)
        absent = run_checks("openvino", openvino_llama, llama_request)
    assert [check.verdict for check in absent] == [NOT_CHECKED, NOT_CHECKED]
    assert "not installed" in absent[0].reason and "HFEXPORT_RUNTIME_OPENVINO_GENAI" in absent[0].reason
    crash = tmp_path / "crash"
    crash.write_text("#!/bin/sh\necho 'Segmentation fault' >&2\nexit 139\n")
    hang = tmp_path / "hang"
    hang.write_text("#!/bin/sh\nsleep 30\n")
    for script in (crash, hang):
        os.chmod(script, 0o755)
    monkeypatch.setenv("HFEXPORT_RUNTIME_OPENVINO_GENAI", str(crash))
    monkeypatch.setenv("HFEXPORT_RUNTIME_OPTIMUM_INTEL", str(hang))
    quick = GenerationRequest(llama_request.prompts, llama_request.expected, MAX_NEW_TOKENS,
                              llama_request.eos_token_id, timeout_s=1)
    crashed, hung = run_checks("openvino", openvino_llama, quick)
    assert crashed.verdict == FAILED and "exited 139" in crashed.reason and "Segmentation fault" in crashed.reason
    assert hung.verdict == FAILED and "time limit" in hung.reason


@pytest.mark.parametrize("marker, environment", [("readme-llm-openvino-genai", peers.openvino_genai_venv),
                                                 ("readme-llm-optimum-intel", peers.peer_venv)])
def test_the_readme_snippets_run_on_the_export(marker, environment, openvino_llama, llama_request, tmp_path):
    import subprocess

    (tmp_path / "out").mkdir()
    (tmp_path / "out" / "openvino-generation").symlink_to(openvino_llama)
    script = tmp_path / "snippet.py"
    script.write_text(readme_snippet(marker))
    done = subprocess.run([str(environment()), str(script)], cwd=tmp_path, capture_output=True, text=True,
                          timeout=300)
    assert done.returncode == 0, done.stderr[-2000:]
    from transformers import AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(openvino_llama)
    new = tokenizer.decode(llama_request.expected[0])  # the first sample prompt is the README's
    assert new.strip() and new.strip() in done.stdout


def test_the_card_shows_llm_runtime_snippets_only_for_runtimes_that_passed(exported_llama):
    import copy

    from hfexport.layout import Place
    from hfexport.report.card import loading_snippets

    report = copy.deepcopy(exported_llama[1])
    places = {name: Place(f"x/{name}") for name in report.targets}
    places["openvino-generation"] = Place("openvino")
    target = report.targets["openvino-generation"]
    target.runtimes = [{"runtime": "openvino-genai", "verdict": "passed"},
                       {"runtime": "optimum-intel", "verdict": "not_checked", "reason": "not installed"}]
    text = "\n".join(loading_snippets("me/llama", report, places))
    assert 'openvino_genai.LLMPipeline(f"{local}/openvino", "CPU")' in text
    assert "OVModelForCausalLM.from_pretrained(f\"{local}/openvino\")" not in text
    target.runtimes = [{"runtime": "openvino-genai", "verdict": "failed", "reason": "differs"}]
    assert "LLMPipeline" not in "\n".join(loading_snippets("me/llama", report, places))


def test_a_runtime_whose_parent_package_is_missing_is_not_found(monkeypatch):
    monkeypatch.delenv("HFEXPORT_RUNTIME_OPTIMUM_INTEL", raising=False)
    assert _python.interpreter("optimum-intel", "no_such_package_here.intel") is None


def test_openvino_generation_is_one_graph_unless_the_recipe_says_otherwise():
    from hfexport.recipe.data import Target

    def target(fmt, generation=None):
        return Target.from_dict("t", {"export_format": fmt, "mode": "generation", "generation": generation or {}})

    assert target("openvino").single_graph and target("openvino").single_graph_by_default
    assert not target("openvino", {"multi_token_decode": False}).single_graph
    assert not target("openvino", {"cache_implementation": "static", "max_cache_len": 64}).single_graph
    assert not target("openvino", {"single_graph": False}).single_graph
    assert target("onnx").single_graph and not target("executorch").single_graph  # ONNX: #26


def test_a_generation_target_in_its_runtimes_contract_is_published_in_its_formats_folder():
    from hfexport.layout import Place, assign_places

    spec = {"export_format": "openvino", "mode": "generation", "artifact": "openvino_model.xml"}
    assert assign_places({"gen": {**spec, "loaders_contract": True}}) == {"gen": Place("openvino")}
    assert assign_places({"gen": spec}) == {"gen": Place("openvino/gen")}  # the engine's own graphs: a subfolder
    forward = {"export_format": "openvino", "mode": "forward", "artifact": "openvino_model.xml"}
    assert assign_places({"fwd": forward, "gen": {**spec, "loaders_contract": True}}) == \
        {"fwd": Place("openvino"), "gen": Place("openvino/gen")}


def test_an_export_saved_before_the_runtime_layout_stays_readable(openvino_llama, llama_request, tmp_path):
    """Targets saved before this layout hold `openvino_decode.xml`, named by their manifest."""
    import shutil

    import torch

    from hfexport import load

    old = tmp_path / "old"
    shutil.copytree(openvino_llama, old)
    (old / "openvino_model.xml").rename(old / "openvino_decode.xml")
    (old / "openvino_model.bin").rename(old / "openvino_decode.bin")
    manifest = json.loads((old / "export.json").read_text())
    manifest["components"]["decode"]["file"] = "openvino_decode.xml"
    (old / "export.json").write_text(json.dumps(manifest))
    prompt = llama_request.prompts[0]
    out = load(old).generate(torch.tensor([prompt]), max_new_tokens=MAX_NEW_TOKENS, do_sample=False)
    assert llama_request.cut(out[0, len(prompt):].tolist()) == llama_request.expected[0]
