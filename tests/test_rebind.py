"""Rebinding a checkpoint push (hfexport.rebind): the weight map recorded at export, the new weights written into
the previous export's graphs and gated, and every hazard falling back to a full export instead of a wrong artifact.

The "previous" exports come from a tiny model whose every weight was moved by seeded noise (a trained checkpoint:
no parameter constant or equal to another), the "push" from the same model with other noise. The bundled examples
themselves are fresh initializations (all-ones norms, zero biases): the degenerate checkpoints of the hazards.
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest

from hfexport.files import MANIFEST_FILE

#: The default ExecuTorch generation target of a decoder (no layout named): one program in TextLLMRunner's contract
#: (hfexport.formats.executorch.llm_program), the model wrapped in transformers' `TorchExportableModuleWithStaticCache`.
LLM_TARGET = "pte-llm"
LLAMA_TARGETS = ["pt2", "onnx-generation", "openvino-generation", "pte-generation", LLM_TARGET]
BERT_TARGETS = ["onnx", "openvino", "pt2", "pte"]


def _with_llm_target(folder: Path) -> Path:
    """The model folder's recipe with the LLM runner program as one more target."""
    path = folder / "export_config.json"
    recipe = json.loads(path.read_text())
    recipe["targets"][LLM_TARGET] = {"export_format": "executorch", "mode": "generation",
                                     "options": {"backend": "xnnpack"}, "parity": {"generate": {"max_new_tokens": 8}}}
    path.write_text(json.dumps(recipe, indent=2))
    return folder


@pytest.fixture(scope="session")
def checkpoints(session_dir, tiny_llama, tiny_bert):
    """{model: (old checkpoint, new checkpoint)}: two trained-looking checkpoints of each tiny model."""
    from hfexport.testing.models import perturbed_checkpoint

    checkpoints = {name: (perturbed_checkpoint(source, session_dir / f"rebind-{name}-old", seed=1),
                          perturbed_checkpoint(source, session_dir / f"rebind-{name}-new", seed=2))
                   for name, source in (("llama", tiny_llama), ("bert", tiny_bert))}
    checkpoints["llama"] = tuple(_with_llm_target(folder) for folder in checkpoints["llama"])
    return checkpoints


@pytest.fixture(scope="session")
def previous_exports(session_dir, checkpoints):
    """{model: OUTPUT} with the old checkpoint exported to every rebindable target, once per session."""
    from hfexport.job.run import run_job

    outputs = {}
    for name, targets in (("llama", LLAMA_TARGETS), ("bert", BERT_TARGETS)):
        output = session_dir / f"rebind-{name}-out"
        report = run_job(checkpoints[name][0], output, targets, workers=2, latency=False)  # pte in a worker
        assert report.status == "ok", {n: t.error for n, t in report.targets.items()}
        outputs[name] = output
    return outputs


def _copy(source: Path, destination: Path, targets: list[str]) -> Path:
    for name in targets:
        shutil.copytree(source / name, destination / name)
    return destination


def _files(folder: Path) -> dict[str, bytes]:
    return {file.name: file.read_bytes() for file in folder.iterdir() if file.is_file()}


@pytest.mark.parametrize("model", ["llama", "bert"])
def test_a_push_of_new_weights_is_rebound_into_every_format_and_gated(model, previous_exports, checkpoints, tmp_path):
    from hfexport.job.run import run_job

    targets = LLAMA_TARGETS if model == "llama" else BERT_TARGETS
    output = _copy(previous_exports[model], tmp_path / "out", targets)
    before = {name: _files(output / name) for name in targets}
    for name in targets:  # the map was recorded at export, clean: every parameter held, every weight explained
        weight_map = json.loads((output / name / MANIFEST_FILE).read_text())["weight_map"]
        assert weight_map["tensors"] and not weight_map["degenerate"] and not weight_map["uncovered"]
        assert not weight_map["unmapped"]
    report = run_job(checkpoints[model][1], output, targets, workers=1, latency=False)
    for name in targets:
        target = report.targets[name]
        assert (target.status, target.method) == ("ok", "rebind"), (name, target.error, target.rebind)
        assert target.rebind["fallback"] is None and target.rebind["bytes_written"] > 0
        assert target.verification["passed"]  # the full gate against the new eager model
        if name in ("onnx-generation", "openvino-generation", LLM_TARGET):  # and the deployment runtimes
            assert target.runtimes and {check["verdict"] for check in target.runtimes} <= {"passed", "not_checked"}
        if name == LLM_TARGET:  # ExecuTorch's own TextLLMRunner ran the rebound program token for token
            runner = {check["runtime"]: check for check in target.runtimes}["executorch-llm-runner"]
            assert runner["verdict"] == "passed", runner
        after = _files(output / name)
        changed = {file for file in after if after[file] != before[name].get(file)}
        # only weights and the report changed: graphs, manifest (with its map) and configs are byte-identical
        assert changed - {"export_report.json"}, name
        assert not changed & {MANIFEST_FILE, "config.json", "export_config.json"}
        assert all(not file.endswith((".xml",)) for file in changed), changed
        if name == LLM_TARGET:  # the LLM runner program keeps its weights inside: its .pte is rewritten in place
            assert "model.pte" in changed and not list((output / name).glob("*.ptd")), changed
            assert len(after["model.pte"]) == len(before[name]["model.pte"])
        elif name.startswith("pte"):  # the weights are in each program's .ptd: the .pte files are byte-identical
            programs = [file for file in after if file.endswith(".pte")]
            assert programs and not changed & set(programs), changed
            assert {file for file in changed if file.endswith(".ptd")} == {p[:-4] + ".ptd" for p in programs}
            weight_map = json.loads((output / name / MANIFEST_FILE).read_text())["weight_map"]
            assert any(entry["name"].startswith("ptd:") for entry in weight_map["tensors"])
    assert json.loads((output / "export_report.json").read_text())["targets"]["pt2"]["method"] == "rebind"


def test_an_older_pte_that_keeps_its_weights_inside_is_still_rebound(checkpoints, tmp_path, monkeypatch):
    """Before the .ptd, hfexport saved the engine's .pte as it is, weights inside: such a publication still rebinds
    (its constant segment and delegates' named data rewritten in place) and stays one file."""
    import hfexport.formats.executorch.program
    from hfexport.job.run import run_job

    old, new = checkpoints["bert"]
    output = tmp_path / "out"
    with monkeypatch.context() as patch:
        patch.setattr(hfexport.formats.executorch.program, "separated", lambda program, tag: program)  # the save before the .ptd
        assert run_job(old, output, ["pte"], workers=1, latency=False).status == "ok"
    assert not list((output / "pte").glob("*.ptd"))
    weight_map = json.loads((output / "pte" / MANIFEST_FILE).read_text())["weight_map"]
    assert weight_map["tensors"] and not any(entry["name"].startswith("ptd:") for entry in weight_map["tensors"])
    program = (output / "pte" / "model.pte").read_bytes()
    target = run_job(new, output, ["pte"], workers=1, latency=False).targets["pte"]
    assert (target.status, target.method) == ("ok", "rebind"), (target.error, target.rebind)
    assert target.verification["passed"] and target.rebind["bytes_written"] > 0
    assert (output / "pte" / "model.pte").read_bytes() != program and not list((output / "pte").glob("*.ptd"))


def test_a_degenerate_checkpoint_is_never_rebound(exported_llama, checkpoints, tmp_path):
    """The bundled tiny-llama has all-ones norms: onnx_ir merged them into one initializer, OpenVINO dropped the
    multiply by one. The maps say so, and a push falls back to a full export rather than rebinding."""
    from hfexport.job.run import run_job
    from hfexport.rebind.weight_map import RebindRefused, apply
    from hfexport.testing.models import perturbed_checkpoint  # noqa: F401 - the push is checkpoints["llama"][1]
    from transformers import AutoModelForCausalLM

    source, _ = exported_llama
    onnx_map = json.loads((source / "onnx-generation" / MANIFEST_FILE).read_text())["weight_map"]
    openvino_map = json.loads((source / "openvino-generation" / MANIFEST_FILE).read_text())["weight_map"]
    norms = [key for key in onnx_map["degenerate"] if "norm" in key]
    assert len(norms) == 5
    shared = [entry for entry in onnx_map["tensors"] if len(entry["parts"][0]["keys"]) > 1]
    assert shared, "onnx_ir deduplicated the bit-identical norms into one initializer"
    assert set(openvino_map["uncovered"]) == set(norms), "OpenVINO dropped every multiply by one"

    # One location, several parameters whose new values differ: apply refuses it, even past the refusal check.
    copy = _copy(source, tmp_path / "copy", ["onnx-generation"])
    manifest = json.loads((copy / "onnx-generation" / MANIFEST_FILE).read_text())
    model = AutoModelForCausalLM.from_pretrained(checkpoints["llama"][1])
    with pytest.raises(RebindRefused, match="whose new values differ"):
        apply(copy / "onnx-generation", manifest, onnx_map, model)

    output = _copy(source, tmp_path / "out", ["openvino-generation"])
    report = run_job(checkpoints["llama"][1], output, ["openvino-generation"], workers=1, latency=False)
    target = report.targets["openvino-generation"]
    assert (target.status, target.method) == ("ok", "export"), target.error
    assert "degenerate checkpoint" in target.rebind["fallback"]


def test_a_weight_that_maps_to_nothing_and_an_uncovered_key_are_refused(previous_exports, checkpoints, tmp_path):
    """A stored tensor the map cannot explain (here: one initializer's bytes altered, as a fold would) leaves its
    parameter uncovered and itself unmapped: no rebind from such an export."""
    import numpy as np
    import onnx
    from onnx import numpy_helper
    from transformers import AutoModel

    from hfexport.rebind.weight_map import build, refusal

    folder = _copy(previous_exports["bert"], tmp_path, ["onnx"]) / "onnx"
    manifest = json.loads((folder / MANIFEST_FILE).read_text())
    graph_file = folder / manifest["components"]["model"]["file"]
    graph = onnx.load(str(graph_file))
    initializer = max(graph.graph.initializer, key=lambda tensor: int(np.prod(tensor.dims)))
    values = numpy_helper.to_array(initializer) * np.float32(1.5)  # a "folded" scale: no parameter has these values
    initializer.CopyFrom(numpy_helper.from_array(values, initializer.name))
    onnx.save(graph, str(graph_file), save_as_external_data=True, location=graph_file.name + ".data")
    model = AutoModel.from_pretrained(checkpoints["bert"][0])
    weight_map = build(folder, manifest, model, "0" * 64)
    assert weight_map["unmapped"] and weight_map["uncovered"]
    assert "maps to no stored tensor" in refusal(weight_map, "0" * 64)
    assert "maps to no parameter" in refusal({**weight_map, "uncovered": []}, "0" * 64)
    assert "rebind key differs" in refusal(weight_map, "1" * 64)


def test_a_corrupted_weight_map_is_caught_by_the_gate(previous_exports, checkpoints, tmp_path):
    """Two same-shaped parameters swapped in the recorded map: the rebound artifact fails the gate, and the target
    is exported in full instead (the report says why)."""
    from hfexport.job.run import run_job

    output = _copy(previous_exports["llama"], tmp_path / "out", ["pt2"])
    path = output / "pt2" / MANIFEST_FILE
    manifest = json.loads(path.read_text())
    entries = manifest["weight_map"]["tensors"]
    by_key = {entry["parts"][0]["keys"][0]: entry for entry in entries}
    q, o = by_key["model.layers.0.self_attn.q_proj.weight"], by_key["model.layers.0.self_attn.o_proj.weight"]
    q["parts"], o["parts"] = o["parts"], q["parts"]
    path.write_text(json.dumps(manifest, indent=2))
    report = run_job(checkpoints["llama"][1], output, ["pt2"], workers=1, latency=False)
    target = report.targets["pt2"]
    assert (target.status, target.method) == ("ok", "export")
    assert target.rebind["fallback"].startswith("the rebound artifact failed the gate")
    assert target.verification["passed"]


def test_the_llm_programs_map_and_a_corrupted_one_caught_by_the_gate_and_textllmrunner(previous_exports, checkpoints,
                                                                                       tmp_path):
    """The LLM runner program wraps the model in `TorchExportableModuleWithStaticCache` and keeps its weights inside:
    the portable ops' constants in its constant segment, XNNPACK's weights as named data keyed by hash (the tied
    embedding once in each), and its static KV cache is a mutable buffer the program plans in memory, neither stored
    nor a weight. The map still covers every state_dict key. Two same-shaped weights swapped in that map: the rebound program fails the gate
    (`ExportedModel.generate` against `model.generate`) and ExecuTorch's TextLLMRunner both."""
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from hfexport.deployment.gate import check_runtimes
    from hfexport.plan import build_plan
    from hfexport.rebind.folder import rebind_copy
    from hfexport.rebind.weight_map import stored_tensors
    from hfexport.recipe.loading import load_recipe
    from hfexport.verify.check import verify_exported

    source = previous_exports["llama"] / LLM_TARGET
    manifest = json.loads((source / MANIFEST_FILE).read_text())
    weight_map = manifest["weight_map"]
    by_key = {entry["parts"][0]["keys"][0]: entry for entry in weight_map["tensors"]}
    assert all(entry["file"] == "model.pte" for entry in weight_map["tensors"])  # no .ptd
    assert by_key["lm_head.weight"]["name"].startswith("named:")  # XNNPACK's head
    stored = [name for entries in stored_tensors(source, manifest).values() for name in entries]
    assert not [name for name in stored if "cache" in name.lower()], stored  # the KV cache is not stored
    assert not weight_map["uncovered"] and not weight_map["unmapped"] and not weight_map["degenerate"]

    q, o = by_key["model.layers.0.self_attn.q_proj.weight"], by_key["model.layers.0.self_attn.o_proj.weight"]
    q["parts"], o["parts"] = o["parts"], q["parts"]
    new = checkpoints["llama"][1]
    model = AutoModelForCausalLM.from_pretrained(new).eval()
    tokenizer = AutoTokenizer.from_pretrained(new)
    folder = tmp_path / LLM_TARGET
    assert rebind_copy(source, folder, manifest, model) > 0
    assert (folder / "model.pte").stat().st_size == (source / "model.pte").stat().st_size
    plan = build_plan(load_recipe(json.loads((new / "export_config.json").read_text())), LLM_TARGET, model, None,
                      tokenizer, source=new)
    verification = verify_exported(folder, model, plan, tokenizer)
    assert not verification["passed"] and verification["failures"]
    runner = {check.runtime: check for check in check_runtimes(folder, model, plan, tokenizer)}
    assert runner["executorch-llm-runner"].verdict == "failed", runner["executorch-llm-runner"]


@pytest.fixture(scope="session")
def mbart_export(session_dir, tiny_mbart):
    """tiny mBART (untied: its `model.shared.weight` is a parameter no graph reads) trained-looking, exported to its
    ONNX generation target once: (OUTPUT, old checkpoint, new checkpoint). The new checkpoint leaves `model.shared`
    as it was, as training leaves a parameter that gets no gradient."""
    from safetensors.torch import load_file, save_file

    from hfexport.job.run import run_job
    from hfexport.testing.models import perturbed_checkpoint

    old = perturbed_checkpoint(tiny_mbart, session_dir / "rebind-mbart-old", seed=1)
    new = perturbed_checkpoint(tiny_mbart, session_dir / "rebind-mbart-new", seed=2)
    (weights,) = new.glob("*.safetensors")
    tensors = load_file(weights)
    (previous,) = old.glob("*.safetensors")
    tensors["model.shared.weight"] = load_file(previous)["model.shared.weight"]
    save_file(tensors, weights, metadata={"format": "pt"})
    output = session_dir / "rebind-mbart-out"
    report = run_job(old, output, ["onnx-generation"], workers=1, latency=False)
    assert report.status == "ok", {n: t.error for n, t in report.targets.items()}
    return output, old, new


def test_the_seq2seq_layouts_merged_decoder_is_rebound_and_an_unread_parameter_must_be_unchanged(mbart_export,
                                                                                                 tmp_path):
    """The seq2seq layout's `decoder_model_merged.onnx` keeps its two branches' weights once, in the outer graph:
    the map holds each there (and the encoder's in `encoder_model.onnx`), a push rewrites both files' weights and
    nothing else, and the gate passes. The untied mBART's `model.shared.weight` is read by no graph (uncovered):
    the map records its value, and a push that changed it is refused."""
    import torch
    from transformers import AutoModelForSeq2SeqLM

    from hfexport.job.run import run_job
    from hfexport.rebind.weight_map import refusal

    source, old, new = mbart_export
    output = _copy(source, tmp_path / "out", ["onnx-generation"])
    folder = output / "onnx-generation"
    weight_map = json.loads((folder / MANIFEST_FILE).read_text())["weight_map"]
    assert weight_map["uncovered"] == ["model.shared.weight"] and not weight_map["unmapped"]
    assert not weight_map["degenerate"] and set(weight_map["uncovered_sha256"]) == {"model.shared.weight"}
    held = {}
    for entry in weight_map["tensors"]:
        for part in entry["parts"]:
            for key in part["keys"]:
                held.setdefault(key, set()).add(entry["file"])
    assert held["model.decoder.layers.0.self_attn.q_proj.weight"] == {"decoder_model_merged.onnx"}
    assert held["model.encoder.layers.0.self_attn.q_proj.weight"] == {"encoder_model.onnx"}

    changed = AutoModelForSeq2SeqLM.from_pretrained(new)
    with torch.no_grad():
        changed.model.shared.weight.add_(1e-3)
    assert "model.shared.weight maps to no stored tensor of the previous export, and its value changed" in \
        refusal(weight_map, weight_map["rebind_key"], changed)
    assert refusal(weight_map, weight_map["rebind_key"], AutoModelForSeq2SeqLM.from_pretrained(new)) is None

    before = _files(folder)
    target = run_job(new, output, ["onnx-generation"], workers=1, latency=False).targets["onnx-generation"]
    assert (target.status, target.method) == ("ok", "rebind"), (target.error, target.rebind)
    assert target.verification["passed"] and target.rebind["bytes_written"] > 0
    after = _files(folder)
    files = {file for file in after if after[file] != before.get(file)}
    assert {"encoder_model.onnx_data", "decoder_model_merged.onnx_data"} <= files
    assert not files & {MANIFEST_FILE, "config.json", "generation_config.json"}
    for graph in ("encoder_model.onnx", "decoder_model_merged.onnx"):
        assert _without_weights(after[graph]) == _without_weights(before[graph]), graph


def test_a_weight_map_is_checked_on_load(previous_exports):
    from hfexport.errors import CorruptExportError
    from hfexport.safety.artifacts import check_manifest

    manifest = json.loads((previous_exports["bert"] / "openvino" / MANIFEST_FILE).read_text())
    check_manifest(manifest)
    manifest["weight_map"]["tensors"][0]["parts"][0]["transform"] = ["rot13"]
    with pytest.raises(CorruptExportError, match=r"weight_map\.tensors\[0\]\.parts\[0\]\.transform"):
        check_manifest(manifest)


def test_no_rebind_and_the_recipe_switch_always_export(previous_exports, checkpoints, tmp_path, cli):
    from hfexport.recipe.loading import load_recipe

    output = _copy(previous_exports["bert"], tmp_path / "out", ["pt2"])
    result = cli("export", str(checkpoints["bert"][1]), "-o", str(output), "--target", "pt2", "--no-rebind",
                 "--workers", "1", "--quiet", "--json")
    assert result.returncode == 0, result.stderr[-2000:]
    target = json.loads(result.stdout)["targets"]["pt2"]
    assert target["method"] == "export" and target["rebind"] is None

    recipe = json.loads((checkpoints["bert"][1] / "export_config.json").read_text())
    recipe["targets"]["pt2"]["rebind"] = False
    loaded = load_recipe(recipe)
    assert loaded.target("pt2").rebind is False and loaded.target("onnx").rebind is True
    assert loaded.target("pt2").to_dict()["rebind"] is False


def test_a_push_of_new_weights_through_the_webhook_updates_the_pr_with_rebound_artifacts(hub, checkpoints, tmp_path):
    """The receiver's job finds the previous export in the model's open hfexport PR (no OUTPUT survives between
    webhook jobs), rebinds the pushed weights into it, gates it, and updates the same PR."""
    import uuid

    from test_webhook import Receiver, config, payload

    old, new = checkpoints["bert"]
    repo = f"user/rebind-{uuid.uuid4().hex[:8]}"
    hub.seed_repo(repo, old)
    server = Receiver(config(hub, tmp_path, targets=["pt2", "onnx"]))
    try:
        assert server.post(payload(hub, repo, hub.head(repo)))[0] == 202
        assert server.receiver.wait_idle(600)
        [pr] = hub.discussions(repo)
        ref = f"refs/pr/{pr['num']}"
        first = {path: hub.read_file(repo, path, ref) for path in ("onnx/model.onnx", "torch-export/export.json")}
        before = hub.head(repo)
        pushed = hub.commit(repo, add={"model.safetensors": (new / "model.safetensors").read_bytes()},
                            title="training step")["oid"]
        assert server.post(payload(hub, repo, pushed, before))[0] == 202
        assert server.receiver.wait_idle(600)
        job = {job.sha: job for job in server.receiver.jobs()}[pushed]
        assert (job.state, job.status, job.action) == ("done", "ok", "updated"), job.detail
        assert [pr["num"] for pr in hub.discussions(repo)] == [pr["num"]]
        for folder in ("onnx", "torch-export"):
            report = json.loads(hub.read_file(repo, f"{folder}/export_report.json", ref))
            [target] = report["targets"].values()
            assert report["source"]["commit"] == pushed
            assert target["method"] == "rebind" and target["rebind"]["from"] == f"{repo}@{ref}", target["rebind"]
            assert target["verification"]["passed"]
        # the manifest (with its weight map) is the same bytes; the graph is the same but for its inline weights
        assert hub.read_file(repo, "torch-export/export.json", ref) == first["torch-export/export.json"]
        graphs = [_without_weights(data) for data in (first["onnx/model.onnx"], hub.read_file(repo, "onnx/model.onnx",
                                                                                              ref))]
        assert graphs[0] == graphs[1] and first["onnx/model.onnx"] != hub.read_file(repo, "onnx/model.onnx", ref)
    finally:
        server.close()


def _without_weights(data: bytes) -> bytes:
    import onnx

    graph = onnx.load_from_string(data)
    for tensor in graph.graph.initializer:
        tensor.ClearField("raw_data")
    return graph.SerializeToString()


@pytest.mark.slow  # two quantized exports, each compared with its unquantized reference: ~2 min under load
def test_a_quantized_target_is_exported_never_rebound(checkpoints, tmp_path):
    """A quantized target's weights are computed by the quantizer, not copied: no map, and a push exports it."""
    from hfexport.job.run import run_job

    old, new = checkpoints["bert"]
    recipe = json.loads((old / "export_config.json").read_text())
    recipe["targets"] = {"onnx-int8": {**recipe["targets"]["onnx"], "quantization": {"method": "ort_dynamic"}}}
    recipe["default_target"] = "onnx-int8"
    output = tmp_path / "out"
    first = run_job(old, output, ["onnx-int8"], recipe=recipe, workers=1, latency=False).targets["onnx-int8"]
    assert first.status == "ok" and "weight_map" not in json.loads((output / "onnx-int8" / MANIFEST_FILE).read_text())
    target = run_job(new, output, ["onnx-int8"], recipe=recipe, workers=1, latency=False).targets["onnx-int8"]
    assert (target.status, target.method) == ("ok", "export")
    assert "quantized" in target.rebind["fallback"]


def test_a_packed_tensor_maps_to_its_parts_by_value():
    """ONNX Runtime's fusions pack transposed Q/K/V (and gate/up) into one initializer (`packed_matmul_N`), and
    OpenVINO may store fp16: the map finds the concatenation, the transposes and the cast by value, whatever the
    name, and recomputes the bytes from new weights."""
    import torch

    from hfexport.rebind.stored import Stored
    from hfexport.rebind.weight_map import _u8, _Variant, _compute, _match, _sample

    generator = torch.Generator().manual_seed(0)
    weights = {name: torch.randn(rows, 16, generator=generator) for name, rows in (("q", 16), ("k", 8), ("v", 8))}
    variants = []
    for name, tensor in weights.items():
        for transform, form in (([], tensor), (["transpose"], tensor.t()), (["cast"], tensor.half()),
                                (["transpose", "cast"], tensor.t().half())):
            variants.append(_Variant([name], transform, form.contiguous()))
    index = {}
    for variant in variants:
        data = _u8(variant.tensor)
        index.setdefault((len(data), _sample(data)), []).append(variant)
    for dtype, transform in ((torch.float32, ["transpose"]), (torch.float16, ["transpose", "cast"])):
        packed = torch.cat([weights[name].t().to(dtype) for name in ("q", "k", "v")], dim=1).contiguous()
        data = packed.view(-1).view(torch.uint8).numpy().tobytes()
        entry = Stored("packed_matmul_0", "model.onnx", None, len(data), str(dtype).removeprefix("torch."),
                       list(packed.shape), data)
        parts, axis = _match(entry, index, variants)
        assert axis == 1 and [part["keys"] for part in parts] == [["q"], ["k"], ["v"]]
        assert all(part["transform"] == transform for part in parts)
        record = {"file": "model.onnx", "name": entry.name, "dtype": entry.dtype, "concat_axis": axis, "parts": parts}
        new = {name: tensor + 1 for name, tensor in weights.items()}
        expected = torch.cat([new[name].t().to(dtype) for name in ("q", "k", "v")], dim=1)
        assert torch.equal(_compute(record, new), _u8(expected))
