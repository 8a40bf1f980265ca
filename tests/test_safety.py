"""Safe loading: a crafted `export.json` is refused before the engine parses it, and nothing in it runs.

The payload used throughout is `{"_t": "seq", "p": "os:mkdir", "v": [MARKER]}` in a cache context: the engine
(transformers 5.23) imports `os.mkdir` and calls it with the marker path when it rebuilds outputs. One test shows
the engine's own loader does run it (so the crafted manifests are real exploits); every other test asserts the
marker does not exist after hfexport refused the export.
"""

from __future__ import annotations

import copy
import json
import shutil
import uuid
from pathlib import Path

import pytest
from hfexport.errors import CorruptExportError, UnsafeExportError
from hfexport.formats.programs import check_export_folder
from hfexport.safety.artifacts import (
    check_manifest,
    check_manifest_file,
)

DATA = Path(__file__).parent / "data" / "manifests"
REAL_MANIFESTS = sorted(DATA.glob("*.json"))


def _leaf():
    return {"type": None, "context": None, "children_spec": []}


def _with_payload(manifest: dict, context: dict, node_type: str = "transformers.cache_utils:DynamicCache") -> dict:
    """`manifest` whose first component's first output leaf became a cache node carrying `context`."""
    crafted = copy.deepcopy(manifest)
    metadata = next(iter(crafted["components"].values()))["metadata"]
    spec = json.loads(metadata["out_spec"])
    spec[1]["children_spec"][0] = {"type": node_type, "context": json.dumps(context), "children_spec": [_leaf()]}
    metadata["out_spec"] = json.dumps(spec)
    return crafted


@pytest.fixture
def marker(tmp_path) -> Path:
    path = tmp_path / f"pwned-{uuid.uuid4().hex[:8]}"
    assert not path.exists()
    return path


@pytest.fixture
def onnx_export(exported_bert, tmp_path) -> Path:
    """A private copy of the session's tiny-bert ONNX export (safe to tamper with)."""
    output, _ = exported_bert
    folder = tmp_path / "onnx"
    shutil.copytree(output / "onnx", folder)
    return folder


def _tamper(folder: Path, context: dict, node_type: str = "transformers.cache_utils:DynamicCache") -> None:
    manifest = json.loads((folder / "export.json").read_text())
    (folder / "export.json").write_text(json.dumps(_with_payload(manifest, context, node_type), indent=2))


def _inputs():
    import torch

    return {"input_ids": torch.ones(1, 5, dtype=torch.long), "attention_mask": torch.ones(1, 5, dtype=torch.long)}


# ── the check itself ─────────────────────────────────────────────────────────


@pytest.mark.parametrize("path", REAL_MANIFESTS, ids=lambda p: p.stem)
def test_real_generation_manifests_pass(path):
    """Dynamic and static caches (DynamicCache/DynamicLayer, StaticCache/StaticLayer contexts) are allowed."""
    assert check_manifest_file(path)["components"]


def test_every_format_of_a_real_export_passes(exported_bert):
    output, report = exported_bert
    checked = [name for name in report.targets if (output / name / "export.json").is_file()]
    assert checked, "the session export has no target folders"
    for name in checked:
        check_export_folder(output / name)


BASE = json.loads((DATA / "llama-onnx-generation.json").read_text()) if REAL_MANIFESTS else {}


@pytest.mark.parametrize(
    ("context", "node_type", "named", "where"),
    [
        ({"_t": "seq", "p": "os:system", "v": ["touch /tmp/x"]}, None, "os:system", ".context.p"),
        ({"_t": "obj", "p": "transformers.cache_utils:DynamicCache",
          "s": {"layers": [{"_t": "map", "p": "subprocess:Popen", "v": {}}]}}, None, "subprocess:Popen",
         ".context.s.layers[0].p"),
        ({"_t": "type", "p": "builtins:eval"}, None, "builtins:eval", ".context.p"),
        # Reached through a transformers module's own imports: still not a transformers class.
        ({"_t": "seq", "p": "transformers.utils.hub:os.system", "v": []}, None, "transformers.utils.hub:os.system",
         ".context.p"),
        ({"_t": "seq", "p": "transformers.cache_utils:DynamicCache.__init__", "v": []}, None, "__init__", ".context.p"),
        ({"_t": "obj", "p": "transformers.modeling_utils:PreTrainedModel", "s": {}}, None, "PreTrainedModel",
         ".context.p"),
        ({"_t": "seq", "p": "transformers:AutoModel", "v": []}, None, "transformers:AutoModel", ".context.p"),
        ({}, "os.system", "os.system", ".type"),
        ({}, "posix:system", "posix:system", ".type"),
    ],
)
def test_crafted_specs_are_refused_with_class_and_path(context, node_type, named, where):
    crafted = _with_payload(BASE, context, node_type or "transformers.cache_utils:DynamicCache")
    with pytest.raises(UnsafeExportError) as error:
        check_manifest(crafted, "crafted/export.json")
    message = str(error.value)
    assert named in message and "crafted/export.json: components.prefill.metadata.out_spec[1].children_spec[0]" \
        in message and where in message.split(": ")[1]


@pytest.mark.parametrize(
    ("mutate", "error", "expected"),
    [
        (lambda m: m["components"]["prefill"].__setitem__("file", "../../outside.onnx"), UnsafeExportError,
         "components.prefill.file: '../../outside.onnx' is not a file name inside"),
        (lambda m: m["components"]["prefill"].__setitem__("file", "/etc/passwd"), UnsafeExportError,
         "not a file name inside"),
        (lambda m: m["components"]["prefill"]["metadata"].__setitem__("out_spec", "[1, {"), CorruptExportError,
         "components.prefill.metadata.out_spec: not valid JSON"),
        (lambda m: m["components"]["prefill"]["metadata"].__setitem__("in_spec", 7), CorruptExportError,
         r"\$.components.prefill.metadata.in_spec: 7 is not of type 'string', 'null'"),
        (lambda m: m.__setitem__("components", []), CorruptExportError, r"\$.components: \[\] is not of type 'object'"),
    ],
)
def test_malformed_manifests_are_refused(mutate, error, expected):
    crafted = copy.deepcopy(BASE)
    mutate(crafted)
    with pytest.raises(error, match=expected):
        check_manifest(crafted, "crafted/export.json")


def test_unknown_tags_and_fake_dtypes_are_refused():
    with pytest.raises(UnsafeExportError, match="unknown context tag 'call'"):
        check_manifest(_with_payload(BASE, {"_t": "call", "p": "os:system"}))
    # `{"_t": "dtype", "n": ...}` is `getattr(torch, n)`: only real dtypes may be named.
    with pytest.raises(UnsafeExportError, match="'load' is not a torch dtype"):
        check_manifest(_with_payload(BASE, {"_t": "obj", "p": "transformers.cache_utils:DynamicLayer",
                                            "s": {"dtype": {"_t": "dtype", "n": "load"}}}))


def test_allowed_names_cover_outputs_caches_and_containers():
    allowed = {"_t": "obj", "p": "transformers.cache_utils:EncoderDecoderCache", "s": {
        "a": {"_t": "seq", "p": "builtins:tuple", "v": [1, 2]},
        "b": {"_t": "map", "p": "collections:OrderedDict", "v": {}},
        "c": {"_t": "type", "p": "transformers.cache_utils:DynamicLayer"},
        "d": {"_t": "dtype", "n": "bfloat16"},
        "e": {"_t": "items", "v": [[0, {"_t": "tensor", "i": 0}]]},
    }}
    check_manifest(_with_payload(BASE, allowed, "transformers.modeling_outputs.Seq2SeqLMOutput"))


# ── nothing runs: local folders, the engine's own loader as the control ──────


def test_the_crafted_manifest_is_a_real_exploit_for_the_engines_loader(onnx_export, marker):
    """Control: without hfexport's check, the engine imports `os.mkdir` from the manifest and calls it."""
    from transformers.exporters import ExportedModel as EngineExportedModel

    _tamper(onnx_export, {"_t": "seq", "p": "os:mkdir", "v": [str(marker)]})
    EngineExportedModel.from_pretrained(onnx_export)(**_inputs())
    assert marker.exists()


def test_hfexport_refuses_the_crafted_folder_and_nothing_runs(onnx_export, marker):
    import hfexport

    _tamper(onnx_export, {"_t": "seq", "p": "os:mkdir", "v": [str(marker)]})
    for load in (lambda: hfexport.ExportedModel.from_pretrained(onnx_export), lambda: hfexport.load(onnx_export),
                 lambda: hfexport.load(onnx_export.parent, target="onnx")):
        with pytest.raises(UnsafeExportError, match="os:mkdir"):
            load()
    assert not marker.exists()


def test_a_crafted_node_type_is_refused_before_the_engine_imports_it(onnx_export, marker):
    _tamper(onnx_export, {"_t": "seq", "p": "os:mkdir", "v": [str(marker)]}, node_type="os.mkdir")
    import hfexport

    with pytest.raises(UnsafeExportError, match="'os.mkdir'"):
        hfexport.ExportedModel.from_pretrained(onnx_export)
    assert not marker.exists()


# ── from the Hub: refused after downloading only export.json ─────────────────


def test_crafted_export_on_the_hub_is_refused_without_downloading_the_program(hub, onnx_export, marker, tmp_path):
    import hfexport

    _tamper(onnx_export, {"_t": "seq", "p": "os:mkdir", "v": [str(marker)]})
    repo = f"user/crafted-{uuid.uuid4().hex[:8]}"
    hub.seed_repo(repo, {f"exports/onnx/{p.name}": p.read_bytes() for p in onnx_export.iterdir()})
    cache = tmp_path / "cache"
    with pytest.raises(UnsafeExportError, match=rf"{repo}@main/exports/onnx/export.json: .*os:mkdir"):
        hfexport.load(repo, target="onnx", cache_dir=cache)
    downloaded = sorted(p.name for p in cache.rglob("*") if p.is_file() and "snapshots" in p.parts)
    assert downloaded == ["export.json"]
    assert not marker.exists()


def test_hub_target_loads_when_clean_and_missing_targets_are_named(hub, exported_bert):
    import hfexport
    from hfexport.errors import SourceError

    output, _ = exported_bert
    repo = f"user/clean-{uuid.uuid4().hex[:8]}"
    hub.seed_repo(repo, {f"exports/onnx/{p.name}": p.read_bytes() for p in (output / "onnx").iterdir()})
    model = hfexport.load(repo, target="onnx")
    assert model(**_inputs()).last_hidden_state.shape[:2] == (1, 5)
    with pytest.raises(SourceError, match=r"no target .pt2. published in .*@main \(targets found: onnx;"):
        hfexport.load(repo, target="pt2")
    with pytest.raises(SourceError, match="not a target name"):
        hfexport.load(repo, target="../onnx")


def test_a_warm_load_of_a_publication_asks_the_hub_once(hub, exported_bert, tiny_bert, tmp_path):
    """A published target (`onnx/`, weights in `model.onnx_data`) loaded again with a warm cache makes two requests:
    `model_info` of the branch, whose commit and file list name the target's folder (its recipe copy is read at that
    commit from the cache), and the manifest's at the branch, whose commit pins the rest; the optional files the
    target lacks (`model.onnx.data`, `generation_config.json`) are known absent from the 404s huggingface_hub noted
    for that commit. By folder, only the manifest's."""
    import hfexport
    from hfexport.publication.publish import publish

    output, _ = exported_bert
    repo = f"user/warm-{uuid.uuid4().hex[:8]}"
    hub.seed_repo(repo, tiny_bert)
    publish(output, repo, mode="commit", targets=["onnx"], token=hub.write_token)
    cache = tmp_path / "cache"
    first = hfexport.load(repo, target="onnx", cache_dir=cache)
    hub.requests.clear()
    again = hfexport.load(repo, target="onnx", cache_dir=cache)
    assert [(method, path) for method, path, _ in hub.requests] == [
        ("GET", f"/api/models/{repo}/revision/main"), ("HEAD", f"/{repo}/resolve/main/onnx/export.json")]
    assert again(**_inputs()).last_hidden_state.equal(first(**_inputs()).last_hidden_state)
    hub.requests.clear()
    by_folder = hfexport.ExportedModel.from_pretrained(repo, subfolder="onnx", cache_dir=cache)
    assert [(method, path) for method, path, _ in hub.requests] == [("HEAD", f"/{repo}/resolve/main/onnx/export.json")]
    assert by_folder.config.to_dict() == first.config.to_dict()


def test_loading_a_published_onnx_target_imports_neither_onnx_nor_onnx_ir(hub, exported_bert, tiny_bert, tmp_path):
    """Loading a published ONNX target and running it, in a fresh process, imports neither onnx_ir (the engine's ONNX
    runner module imports it: ~30 ms) nor onnx (~40 ms: the external-data check parses with protobuf alone,
    `safety.onnx_proto`), and gives the outputs the in-process load gives (benchmarks/load_published.py)."""
    import os
    import subprocess
    import sys

    import hfexport
    from hfexport.publication.publish import publish

    output, _ = exported_bert
    repo = f"user/light-{uuid.uuid4().hex[:8]}"
    hub.seed_repo(repo, tiny_bert)
    publish(output, repo, mode="commit", targets=["onnx"], token=hub.write_token)
    cache = tmp_path / "cache"
    expected = hfexport.load(repo, target="onnx", cache_dir=cache)(**_inputs()).last_hidden_state
    heavy = ("onnx", "onnx_ir", "onnxscript", "transformers.exporters.runners.runner_onnx")
    code = (
        "import json, sys, torch, hfexport\n"
        f"model = hfexport.load({repo!r}, target='onnx', cache_dir={str(cache)!r})\n"
        "ids = torch.ones(1, 5, dtype=torch.long)\n"
        "out = model(input_ids=ids, attention_mask=ids).last_hidden_state\n"
        f"print(json.dumps({{'imported': [m for m in {heavy!r} if m in sys.modules], "
        "'runner': type(model.runners['model']).__name__, 'output': out.flatten().tolist()}))\n")
    library = str(Path(hfexport.__file__).resolve().parent.parent)
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300,
                            env={**os.environ, "PYTHONPATH": library})
    assert result.returncode == 0, result.stderr[-3000:]
    found = json.loads(result.stdout.strip().splitlines()[-1])
    assert found["imported"] == [] and found["runner"] == "OnnxFileRunner"
    assert found["output"] == expected.flatten().tolist()


def test_hfexport_onnx_runner_takes_the_engines_options_and_hands_over_what_it_does_not_run(onnx_export, tmp_path):
    """`OnnxFileRunner.from_program` takes what the engine's ONNX runner takes; explicit providers and a graph with a
    type NumPy cannot hold (bf16) get the engine's runner, and run."""
    import inspect

    import hfexport
    import onnx
    from hfexport.formats.onnx.file_component import OnnxFile as _OnnxFile
    from hfexport.formats.onnx.file_runner import OnnxFileRunner
    from onnx import TensorProto, helper
    from transformers.exporters.runners.runner_onnx import OnnxModelRunner

    def options(runner) -> list:
        return [(p.name, p.default) for p in inspect.signature(runner.from_program).parameters.values()]

    assert options(OnnxFileRunner) == options(OnnxModelRunner)
    chosen = hfexport.ExportedModel.from_pretrained(onnx_export, providers=["CPUExecutionProvider"])
    assert type(chosen.runners["model"]) is OnnxModelRunner
    assert chosen(**_inputs()).last_hidden_state.equal(
        hfexport.ExportedModel.from_pretrained(onnx_export)(**_inputs()).last_hidden_state)
    graph = helper.make_graph([helper.make_node("Cast", ["x"], ["y"], to=TensorProto.FLOAT)], "bf16",
                              [helper.make_tensor_value_info("x", TensorProto.BFLOAT16, [2])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, [2])])
    onnx.save(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 18)]), tmp_path / "bf16.onnx")
    metadata = chosen.components["model"].metadata
    assert type(OnnxFileRunner.from_program(_OnnxFile(tmp_path / "bf16.onnx"), metadata)) is OnnxModelRunner


def test_hfexport_onnx_loader_matches_the_engines(onnx_export, hub):
    """hfexport builds ONNX exports itself (no exporter import): same components, metadata, config and outputs."""
    import hfexport
    from transformers.exporters import ExportedModel as EngineExportedModel

    ours, theirs = hfexport.ExportedModel.from_pretrained(onnx_export), EngineExportedModel.from_pretrained(onnx_export)
    assert list(ours.components) == list(theirs.components) and ours.export_format == theirs.export_format
    assert ours.components["model"].metadata == theirs.components["model"].metadata
    assert ours.config.to_dict() == theirs.config.to_dict()
    # On the CPU hfexport runs the checked file itself (no onnx_ir import), on the same ONNX Runtime kernels.
    assert type(ours.runners["model"]).__name__ == "OnnxFileRunner"
    assert type(theirs.runners["model"]).__name__ == "OnnxModelRunner"
    assert ours(**_inputs()).last_hidden_state.equal(theirs(**_inputs()).last_hidden_state)
    # From the Hub cache (the weights file is a link to a blob), the graph's weights stay readable through onnx_ir.
    repo = f"user/loader-{uuid.uuid4().hex[:8]}"
    hub.seed_repo(repo, {f"exports/onnx/{p.name}": p.read_bytes() for p in onnx_export.iterdir()})
    remote = hfexport.load(repo, target="onnx")
    initializer = next(iter(remote.program.graph.initializers.values()))
    assert initializer.const_value.numpy().size > 0
    assert remote(**_inputs()).last_hidden_state.equal(ours(**_inputs()).last_hidden_state)
