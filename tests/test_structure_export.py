"""An ONNX generation target traced from the model's structure with placeholder weights, its weights written
afterwards through the weight map (hfexport.rebind.placeholders, issue 45), the job planning and exporting on the
structure before the model is loaded (hfexport.job.structure): the same files, byte for byte, as the export traced
from the weights, for a checkpoint whose parameters are all distinct (a trained model's); and a target whose
placeholder export cannot take the weights is exported from the weights instead."""

from __future__ import annotations

import contextlib
import json
import re
import shutil
from pathlib import Path

import pytest
from hfexport.formats.onnx.program import OnnxProgram
from hfexport.job.run import run_job
from hfexport.rebind.placeholders import placeholder, placeholder_model, placeholder_value
from hfexport.testing.zoo import build, make_weights_distinct

# Llama-3.2-1B's published config (tied embeddings, llama3 rope scaling), narrowed to run in seconds
NARROW = {"hidden_size": 64, "intermediate_size": 128, "num_attention_heads": 4, "num_key_value_heads": 2,
          "head_dim": 16}
REPORT_FILES = {"export_report.json"}  # timings and memory differ from run to run


def _distinct(folder: Path) -> Path:
    """The zoo checkpoint with every parameter moved by seeded noise, saved at float32: none equal to another, none
    constant."""
    make_weights_distinct(folder, dtype="float32")
    return folder


@pytest.fixture(scope="module")
def checkpoint(tmp_path_factory):
    return _distinct(build("llama-3.2-1b", tmp_path_factory.mktemp("structure") / "zoo", overrides=NARROW))


def _files(folder: Path) -> dict[str, bytes]:
    return {str(path.relative_to(folder)): path.read_bytes() for path in sorted(folder.rglob("*"))
            if path.is_file() and path.name not in REPORT_FILES}


def _spy(function, calls: list):
    def spy(*args):
        calls.append(function(*args))
        return calls[-1]
    return spy


@pytest.mark.parametrize("blocks", [False, True], ids=["whole", "in-blocks"])
def test_the_structure_export_writes_the_files_the_weights_export_writes(checkpoint, tmp_path, monkeypatch, blocks):
    """`blocks`: every stored tensor over 2 KB written from the shards a block of rows at a time (as a vocabulary's
    embedding and head over `weight_map.BLOCK_BYTES` are), and the twin's head over 4 KB run in blocks of rows while
    the job plans (`streaming.placeholders_in_blocks`), the same bytes."""
    from hfexport.job import pipeline
    from hfexport.rebind import streaming, weight_map

    from hfexport.job import run, structure

    if blocks:
        monkeypatch.setattr(weight_map, "BLOCK_BYTES", 2048)
        monkeypatch.setattr(streaming, "VOCABULARY_BLOCK_BYTES", 4096)

    written, loaded, planned = [], [], []
    monkeypatch.setattr(pipeline, "write_weights", _spy(pipeline.write_weights, written))

    @contextlib.contextmanager
    def in_blocks(model, original=pipeline.placeholders_in_blocks):
        with original(model):
            planned.append("forward" in vars(model.get_output_embeddings()))  # its head run in blocks
            yield model

    monkeypatch.setattr(pipeline, "placeholders_in_blocks", in_blocks)
    for module in (run, structure):  # the model loaded: no export from its structure needs it without a gate
        monkeypatch.setattr(module, "load_model", lambda *args, load=module.load_model, **kwargs: loaded.append(args)
                            or load(*args, **kwargs))
    options = {"verify": False, "latency": False, "runtimes": False, "workers": 1}
    report = run_job(checkpoint, tmp_path / "structure", ["onnx-generation"], **options)
    assert report.targets["onnx-generation"].status == "ok", report.targets["onnx-generation"].error
    assert len(written) == 1 and written[0]["tensors"]  # traced from the twin, the weights written through the map
    assert loaded == []  # planned and exported on the twin, the weights read from the shards: the model never loaded
    assert planned == [blocks]  # the twin's head over the block run in blocks while the job plans
    assert report.source["checkpoint_dtype"] == "float32"
    monkeypatch.setattr(OnnxProgram, "traces_without_weights", False)
    report = run_job(checkpoint, tmp_path / "weights", ["onnx-generation"], **options)
    assert report.targets["onnx-generation"].status == "ok", report.targets["onnx-generation"].error

    structure, weights = _files(tmp_path / "structure" / "onnx-generation"), _files(tmp_path / "weights" / "onnx-generation")
    assert structure.keys() == weights.keys()
    assert [name for name in structure if structure[name] != weights[name]] == []
    manifest = json.loads(structure["export.json"])
    assert manifest["weight_map"]["tensors"] and not manifest["weight_map"]["unmapped"]


@pytest.mark.slow
def test_a_hub_id_is_exported_from_its_structure_as_its_folder_is(checkpoint, hub, tmp_path, monkeypatch):
    """A model named by its Hub id takes the structure path too: the revision's config and safetensors shards
    downloaded (huggingface_hub over HTTP from the local Hub), the model never loaded, the files those of the export
    from the local folder, byte for byte."""
    import uuid

    from huggingface_hub import HfApi

    from hfexport.job import run, structure

    repo = f"{hub.user}/structure-{uuid.uuid4().hex[:8]}"
    api = HfApi(endpoint=hub.url, token=hub.write_token)
    api.create_repo(repo)
    api.upload_folder(repo_id=repo, folder_path=checkpoint)
    loaded = []
    for module in (run, structure):
        monkeypatch.setattr(module, "load_model", lambda *args, load=module.load_model, **kwargs: loaded.append(args)
                            or load(*args, **kwargs))
    options = {"verify": False, "latency": False, "runtimes": False, "workers": 1}
    report = run_job(repo, tmp_path / "hub", ["onnx-generation"], **options)
    assert report.targets["onnx-generation"].status == "ok", report.targets["onnx-generation"].error
    assert loaded == []  # the snapshot's shards read in place of the model, as a local folder's are
    assert report.source["checkpoint_dtype"] == "float32"
    report = run_job(checkpoint, tmp_path / "folder", ["onnx-generation"], **options)
    assert report.targets["onnx-generation"].status == "ok", report.targets["onnx-generation"].error
    by_id, by_folder = _files(tmp_path / "hub" / "onnx-generation"), _files(tmp_path / "folder" / "onnx-generation")
    assert by_id.keys() == by_folder.keys()
    # transformers' tokenizer records where it was loaded from (`is_local`): the one difference, not the export's
    tokenizer = [json.loads(files.pop("tokenizer_config.json")) for files in (by_id, by_folder)]
    assert tokenizer[0].pop("is_local") is False and tokenizer[1].pop("is_local") is True
    assert tokenizer[0] == tokenizer[1]
    assert by_id.keys() == by_folder.keys() and "model.onnx" in by_id
    assert [name for name in by_id if by_id[name] != by_folder[name]] == []


def test_a_placeholder_export_that_cannot_take_the_weights_is_made_from_them(checkpoint, tmp_path, monkeypatch):
    from hfexport.rebind import placeholders

    refused = []

    def unmapped(folder, structure, model, key):
        refused.append(folder)
        raise placeholders.StructureRefused("the placeholder export's weight map has unmapped model.onnx:val_1")

    monkeypatch.setattr("hfexport.job.pipeline.write_weights", unmapped)
    report = run_job(checkpoint, tmp_path / "out", ["onnx-generation"], latency=False, runtimes=False, workers=1)
    target = report.targets["onnx-generation"]
    assert target.status == "ok", target.error
    assert len(refused) == 1  # the twin's export was made, refused, and the target exported from the weights
    assert target.verification["passed"]  # the gate: the weights, not the placeholders


@pytest.mark.parametrize("target", ["onnx-generation", "openvino-generation"])
def test_an_export_after_a_refused_rebind_is_traced_from_the_twin_and_writes_the_weights(tiny_llama, tmp_path,
                                                                                       monkeypatch, target):
    """A push onto a previous export that is not rebound (here one whose gate failed; in CI's tests/test_rebind.py
    degenerate-checkpoint test, the bundled tiny-llama's all-ones norms): the rebind loads the model before it
    refuses, and the export that followed ran the plan made on the twin with the loaded model, so it traced the
    twin's placeholders (its map all uncovered, its float32 OpenVINO artifact generated token 0). It is exported from
    the twin (`structure_export`, `made_on`), passes its gate, and its files are the weights export's (a float32
    OpenVINO target: the `.xml` but for OpenVINO's generated node names)."""
    from hfexport.formats.programs import format_program
    from hfexport.job import pipeline
    from hfexport.testing.models import perturbed_checkpoint

    checkpoint = perturbed_checkpoint(tiny_llama, tmp_path / "push", seed=2)  # all parameters distinct
    options = {"latency": False, "runtimes": False, "workers": 1}
    program = type(format_program(target.split("-")[0]))
    with monkeypatch.context() as weights_export:
        weights_export.setattr(program, "traced_without_weights", lambda self, *args: False)
        assert run_job(checkpoint, tmp_path / "weights", [target], verify=False, **options).status == "ok"
    shutil.copytree(tmp_path / "weights" / target, tmp_path / "out" / target)  # the previous export, failed its gate
    previous = json.loads((tmp_path / "out" / target / "export_report.json").read_text())
    previous["targets"][target]["status"] = "failed"
    (tmp_path / "out" / target / "export_report.json").write_text(json.dumps(previous))

    written = []
    monkeypatch.setattr(pipeline, "write_weights", _spy(pipeline.write_weights, written))
    report = run_job(checkpoint, tmp_path / "out", [target], **options)
    result = report.targets[target]
    assert (result.status, result.method) == ("ok", "export"), result.error
    assert "did not pass its gate" in result.rebind["fallback"] and result.verification["passed"]
    assert len(written) == 1 and written[0]["tensors"]  # traced from the twin, the weights written through the map
    mine, theirs = _files(tmp_path / "out" / target), _files(tmp_path / "weights" / target)
    assert mine.keys() == theirs.keys()
    assert [name for name in mine if _graph(name, mine[name]) != _graph(name, theirs[name])] == []


def _graph(name: str, data: bytes) -> bytes:
    """A file's bytes; an OpenVINO `.xml` without the names it numbers per process and its layer ids."""
    if not name.endswith(".xml"):
        return data
    return re.sub(rb'_\d+(?=[",])', b"", re.sub(rb' (?:id|name)="[^"]*"', b"", data))


def test_placeholders_are_distinct_exact_and_hold_one_row():
    import torch
    from transformers import AutoConfig

    values = [placeholder_value(index) for index in range(0, 15 * 1024, 7)]
    assert len(set(values)) == len(values) and max(values) < 65504
    assert all(float(torch.tensor(value, dtype=torch.float16)) == value for value in values)
    tensor = placeholder((3, 4), torch.float32, 2.0)
    assert tensor.tolist() == [[2.0, -2.0, 2.0, -2.0]] * 3 and tensor.untyped_storage().nbytes() == 16
    assert not torch.equal(tensor[:, :3], tensor[:, :3].t())  # a square block is not symmetric

    from transformers import LlamaForCausalLM

    config = AutoConfig.for_model("llama", **NARROW, num_hidden_layers=2, vocab_size=320, tie_word_embeddings=True)
    model = placeholder_model(config, LlamaForCausalLM)
    assert model.lm_head.weight is model.model.embed_tokens.weight  # tied: one placeholder
    assert sum(parameter.untyped_storage().nbytes() for parameter in model.parameters()) < 64 * 1024
    reference = LlamaForCausalLM(config)
    assert torch.equal(model.model.rotary_emb.inv_freq, reference.model.rotary_emb.inv_freq)  # buffers: real


@pytest.mark.slow
def test_a_job_exported_from_its_structure_streams_the_model_for_its_gate(checkpoint, tmp_path, monkeypatch, caplog):
    import weakref

    from hfexport.job import structure
    from hfexport.verify import check

    loaded, streamed, opened = [], [], []

    def load_model(*args, load=structure.load_model, **kwargs):
        loaded.append(load(*args, **kwargs))
        return loaded[-1]

    def streamed_model(*args, stream=structure.streamed_model):
        model = stream(*args)
        streamed.append((weakref.ref(model), args[2:]))
        return model

    monkeypatch.setattr(structure, "load_model", load_model)
    monkeypatch.setattr(structure, "streamed_model", streamed_model)
    monkeypatch.setattr(check, "_own_process", lambda *args, run=check._own_process: opened.append(
        streamed[-1][0]() is None) or run(*args))
    report = run_job(checkpoint, tmp_path / "out", ["onnx-generation"], latency=False, runtimes=False, workers=1)
    target = report.targets["onnx-generation"]
    assert target.status == "ok", target.error
    assert not loaded  # exported from the twin; the gate's reference streamed its weights, the model never loaded
    assert len(streamed) == 1
    # the gate let the reference go (freed) before the artifact's process started, which checked it; the streamed
    # reference kept what the budget's room allows between forwards (`structure._resident_bytes`)
    assert opened == [True] and target.verification["runtime"]["process"] == "separate"
    assert len(streamed[0][1]) == 1 and streamed[0][1][0] >= 0
    assert "still referenced" not in caplog.text
    assert target.verification["passed"] and target.memory["peak_rss_mb"]["export"] > 0


def _twin_and_loaded_outputs(folder):
    """The placeholder twin of the checkpoint in `folder`, two rows of random ids, and the float32 loaded model's
    logits and greedy tokens (4 new) for them: what a streamed reference must compute."""
    import torch
    from transformers import AutoModelForCausalLM

    loaded = AutoModelForCausalLM.from_pretrained(folder, dtype=torch.float32).eval()
    twin = placeholder_model(loaded.config, type(loaded), dtype=torch.float32)
    twin.generation_config = loaded.generation_config
    ids = torch.randint(0, loaded.config.vocab_size, (2, 5), generator=torch.Generator().manual_seed(0))
    with torch.no_grad():
        return twin, ids, loaded(input_ids=ids).logits, loaded.generate(ids, max_new_tokens=4, do_sample=False)


def test_the_streamed_reference_computes_what_the_loaded_model_computes(checkpoint, tmp_path):
    """The gate's reference with its weights streamed from a bfloat16 checkpoint block by block
    (hfexport.rebind.streaming): the float32 model's logits and greedy tokens, bit for bit, and no block's weights
    left in place once it has run."""
    import torch
    from hfexport.rebind.checkpoint import CheckpointTensors
    from hfexport.rebind.streaming import streamed_model
    from transformers import AutoModelForCausalLM

    AutoModelForCausalLM.from_pretrained(checkpoint, dtype=torch.bfloat16).save_pretrained(tmp_path)
    twin, ids, logits, tokens = _twin_and_loaded_outputs(tmp_path)
    for resident in (0, 1 << 40):  # every block read on every forward; every block kept once read
        tensors = CheckpointTensors(tmp_path, torch.float32, twin.state_dict().keys())
        streamed = streamed_model(twin, tensors, resident)
        with torch.no_grad():
            assert torch.equal(streamed(input_ids=ids).logits, logits)
            once = tensors.reads
            assert torch.equal(streamed.generate(ids, max_new_tokens=4, do_sample=False), tokens)
        assert once > 0 and (tensors.reads > once if resident == 0 else tensors.reads == once)
        assert all(0 in parameter.stride() or parameter.dim() < 2 for parameter in streamed.parameters())


def test_a_streamed_vocabulary_is_read_in_blocks_of_rows(checkpoint, tmp_path, monkeypatch):
    """The streamed reference's embedding and head (tied) over `VOCABULARY_BLOCK_BYTES` read a block of rows at a
    time (the embedding only the rows its ids name): the loaded model's logits and greedy tokens, and the whole
    table never read (issue 45: Llama-3.2-1B's 128256 x 2048 table is 1 GB at float32)."""
    import torch
    from hfexport.rebind import streaming
    from hfexport.rebind.checkpoint import CheckpointTensors

    monkeypatch.setattr(streaming, "VOCABULARY_BLOCK_BYTES", 4096)  # 16 rows of the narrow model's 64 columns
    twin, ids, logits, tokens = _twin_and_loaded_outputs(checkpoint)

    class Counted(CheckpointTensors):
        whole: list = []

        def __getitem__(self, key):
            self.whole.append(key)
            return super().__getitem__(key)

    tensors = Counted(checkpoint, torch.float32, twin.state_dict().keys())
    streamed = streaming.streamed_model(twin, tensors)
    with torch.no_grad():
        torch.testing.assert_close(streamed(input_ids=ids).logits, logits, rtol=1e-5, atol=1e-5)
        assert torch.equal(streamed.generate(ids, max_new_tokens=4, do_sample=False), tokens)
    assert "model.embed_tokens.weight" not in Counted.whole and Counted.whole  # the table in blocks, the rest whole
    assert streamed.get_input_embeddings().weight.stride()[0] == 0  # the placeholder back in place


def _plan_on_twin(twin, folder, blocks: bool):
    """The ONNX generation target's plan on `twin` (its head run in blocks where `blocks`, as the job plans:
    `TargetPipeline._build_plan`), and the largest single allocation torch made while planning (its profiler)."""
    import torch
    from hfexport.models import load_processor
    from hfexport.plan import build_plan
    from hfexport.recipe.loading import load_recipe
    from hfexport.rebind.streaming import placeholders_in_blocks

    recipe, processor = load_recipe(folder), load_processor(folder)
    with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CPU], profile_memory=True) as profile, \
            (placeholders_in_blocks(twin) if blocks else contextlib.nullcontext()):
        plan = build_plan(recipe, "onnx-generation", twin, None, processor, source=folder)
    return plan, max(event.self_cpu_memory_usage for event in profile.events())


def test_the_plan_runs_the_twins_head_a_block_of_rows_at_a_time(checkpoint, monkeypatch):
    """The plan runs the twin (the engine's split of `generate`), and torch's linear copies a stride-0 placeholder
    weight whole before its product: Llama-3.2-1B's 128256 x 2048 head, 1 GB at float32, was the plan stage's peak
    (issue 45). Inside `placeholders_in_blocks` a head over `VOCABULARY_BLOCK_BYTES` runs a block of rows at a time:
    no allocation of the head's size, the same plan and sample tensors, and the head as it was afterwards (the
    export traces it)."""
    import torch
    from hfexport.models import load_config
    from hfexport.rebind import streaming
    from torch.utils._pytree import tree_flatten
    from transformers import LlamaForCausalLM

    monkeypatch.setattr(streaming, "VOCABULARY_BLOCK_BYTES", 1 << 16)  # 64 of the head's 320 rows of 256 columns
    config = load_config(checkpoint, None, None, False)
    config.hidden_size = 256  # the head (320 x 256 at float32, 320 KB) well above the plan's activations
    twin = placeholder_model(config, LlamaForCausalLM, dtype=torch.float32)
    head = twin.get_output_embeddings().weight.nbytes
    whole, whole_largest = _plan_on_twin(twin, checkpoint, blocks=False)
    blocked, blocked_largest = _plan_on_twin(twin, checkpoint, blocks=True)
    assert whole_largest == head > blocked_largest  # the copy the whole placeholder costs, gone
    assert "forward" not in vars(twin.get_output_embeddings())
    assert json.dumps(blocked.describe(), default=str) == json.dumps(whole.describe(), default=str)
    assert blocked.prepared_inputs() == whole.prepared_inputs() and blocked.own_components.keys() == {"decode"}
    for name, (_, inputs) in whole.own_components.items():
        theirs, mine = tree_flatten(inputs)[0], tree_flatten(blocked.own_components[name][1])[0]
        assert len(theirs) == len(mine) and all(torch.equal(a, b) if isinstance(a, torch.Tensor) else a == b
                                                for a, b in zip(theirs, mine))


def test_a_lean_onnx_session_leaves_the_weights_memory_mapped():
    """The gate that released the model opens ONNX Runtime without MLAS prepacking (which copies every MatMul
    weight: the session would hold the weights twice); other loads keep ONNX Runtime's default."""
    from hfexport.formats.programs import format_program

    program = format_program("onnx")
    lean = program.lean_load_options()["session_options"]
    assert lean.get_session_config_entry("session.disable_prepacking") == "1"
    assert lean.get_session_config_entry("session.intra_op.allow_spinning") == "0"
    import onnxruntime  # no float32 copy of a float16 graph's weights folded in, no arena keeping each run's casts

    assert lean.graph_optimization_level == onnxruntime.GraphOptimizationLevel.ORT_ENABLE_EXTENDED
    assert not lean.enable_cpu_mem_arena and lean.execution_order == onnxruntime.ExecutionOrder.PRIORITY_BASED
    default = program.generation_runner_options()["session_options"]
    with pytest.raises(RuntimeError, match="does not have configuration"):  # unset: ONNX Runtime's default
        default.get_session_config_entry("session.disable_prepacking")
    assert format_program("openvino").lean_load_options() == {}  # OpenVINO maps its .bin by default (ENABLE_MMAP)


def test_a_streamed_reference_left_in_place_is_replaced_by_the_model_where_weights_are_needed(checkpoint, monkeypatch):
    """A gate that failed before releasing its streamed reference leaves it as the job's model: a rebind or another
    export that then needs the weights gets the model loaded, never the streamed placeholders."""
    from types import SimpleNamespace

    import torch
    from hfexport.job import structure
    from hfexport.rebind.checkpoint import CheckpointTensors
    from hfexport.rebind.streaming import is_streamed, streamed_model
    from transformers import AutoModelForCausalLM

    loaded = AutoModelForCausalLM.from_pretrained(checkpoint, dtype=torch.float32)
    twin = placeholder_model(loaded.config, type(loaded), dtype=torch.float32)
    twin.generation_config = loaded.generation_config
    streamed = streamed_model(twin, CheckpointTensors(checkpoint, torch.float32, twin.state_dict().keys()))
    assert is_streamed(streamed) and not is_streamed(twin) and not is_streamed(loaded)
    calls = []
    job = SimpleNamespace(structure=SimpleNamespace(twin=twin), model_object=streamed, progress=lambda step: None,
                          model=checkpoint, recipe=None, revision_to_load=None, report=SimpleNamespace(timings={}),
                          options=SimpleNamespace(token=None, trust_remote_code=False))
    monkeypatch.setattr(structure, "load_model", lambda *args: calls.append(args) or loaded)
    structure.load_weights(job)
    assert job.model_object is loaded and len(calls) == 1
    structure.load_weights(job)  # the model already loaded: not again
    assert len(calls) == 1


@pytest.mark.slow
@pytest.mark.skipif(not __import__("hfexport.testing.cgroup", fromlist=["available"]).available(),
                    reason="needs a writable cgroup v1 memory controller (root)")
def test_a_published_width_checkpoint_exports_and_passes_its_gate_in_less_than_its_float32_model_and_libraries(
        tmp_path):
    """Llama-3.2-1B's published width at 2 layers, bfloat16 on disk, every parameter distinct (122M parameters: 489 MB
    at float32), exported to ONNX generation with its gate inside a 1000 MB memory cgroup: less than the libraries
    (~550 MB) and the float32 model together, which the gate's model load held before its reference streamed (that
    run is killed at the load, measured); the streamed reference and the memory-mapped session fit."""
    import subprocess
    import sys

    from hfexport.testing.cgroup import memory_cgroup
    folder = build("llama-3.2-1b", tmp_path / "model", layers=2)
    assert make_weights_distinct(folder) == "bfloat16"
    out = tmp_path / "out"
    with memory_cgroup(1000 << 20) as group:
        run = subprocess.run([sys.executable, "-m", "hfexport", "export", str(folder), "--target", "onnx-generation",
                              "-o", str(out), "--no-latency", "--no-rebind", "--no-preflight", "--workers", "1"],
                             preexec_fn=group.enter, capture_output=True, text=True, timeout=1500)
    assert run.returncode == 0, run.stderr[-2000:]
    report = json.loads((out / "export_report.json").read_text())
    target = report["targets"]["onnx-generation"]
    assert target["status"] == "ok" and target["verification"]["passed"]
    assert target["verification"]["generation"]["token_agreement"] == 1.0
    assert report["memory"]["peak_rss_mb"]["load_model"] < 1000
