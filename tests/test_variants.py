"""Quantized and other variants of one format share its folder under the loaders' own file names (issue 14), and the
card's YAML header keeps the owner's bytes.

Placement rules (hfexport.layout) are checked as pure functions; a publication on the local Hub then holds tiny-bert's
ONNX target as `onnx/model.onnx` and a second, int8-named ONNX target as `onnx/model_quantized.onnx` with
`onnx/model_quantized.export.json` beside it, and hfexport's loader, cache, content hash and card work on both. The
quantized target here is tiny-bert's fp32 graph under a recipe copy that says `ort_dynamic`: only its name is under
test (tests/test_ecosystem_clients.py publishes a real int8 MiniLM and opens it with transformers.js and
sentence-transformers). The attack tests prove that a variant's files, like a folder's, never make hfexport read
outside their folder.
"""

from __future__ import annotations

import json
import shutil
import uuid
from pathlib import Path

import hfexport
import pytest
from hfexport.errors import (
    CorruptExportError,
    RecipeError,
    SourceError,
    UnsafeExportError,
)
from hfexport.layout import (
    LayoutError,
    Place,
    artifact_name,
    assign_places,
    place_files,
    published_name,
    target_places,
)

EXAMPLE = Path(__file__).resolve().parents[1] / "examples" / "tiny-bert"


# ── names and places ─────────────────────────────────────────────────────────


@pytest.mark.parametrize(("export_format", "quantization", "dtype", "expected"), [
    ("onnx", None, "float32", "model.onnx"),
    ("onnx", None, "float16", "model_fp16.onnx"),
    ("onnx", {"method": "ort_dynamic"}, None, "model_quantized.onnx"),
    ("onnx", {"method": "ort_dynamic", "params": {"weight_type": "uint8"}}, None, "model_quantized.onnx"),
    ("onnx", {"method": "ort_static", "params": {"weight_type": "int4"}}, None, "model_q4.onnx"),
    ("onnx", {"method": "nncf_weights", "params": {"mode": "int4_sym"}}, None, "model_q4.onnx"),
    ("onnx", {"method": "nncf_weights", "params": {"mode": "fp8_e4m3"}}, None, None),
    ("onnx", {"method": "nncf_quantize"}, None, "model_quantized.onnx"),
    ("openvino", None, None, "openvino_model.xml"),
    ("openvino", {"method": "nncf_quantize"}, None, "openvino_model_qint8_quantized.xml"),
    ("openvino", {"method": "nncf_weights", "params": {"mode": "int8_asym"}}, None, None),
    ("executorch", {"method": "pt2e", "preset": "xnnpack_int8_dynamic_per_channel"}, None, None),
    ("dynamo", None, None, "model.pt2"),
])
def test_a_target_is_named_for_what_it_is(export_format, quantization, dtype, expected):
    assert artifact_name(export_format, quantization, dtype) == expected


def _spec(export_format="onnx", artifact="model.onnx", mode="forward", **extra):
    return {"export_format": export_format, "mode": mode, "artifact": artifact, **extra}


def test_variants_of_a_format_share_its_folder_and_the_rest_get_their_own():
    places = assign_places({
        "onnx": _spec(), "onnx-int8": _spec(artifact="model_quantized.onnx"),
        "onnx-int8-static": _spec(artifact="model_quantized.onnx"),  # the name is taken: its own folder
        "onnx-fp8": _spec(artifact=None), "onnx-gen": _spec(mode="generation"),
        "ov-int8": _spec("openvino", "openvino_model_qint8_quantized.xml"),
        "st": _spec(artifact="model_quantized.onnx", file_name="model_qint8_avx512_vnni.onnx"),
        "deploy": _spec(path="deploy/int8", artifact="model_quantized.onnx"),
    })
    assert places == {
        "onnx": Place("onnx"), "onnx-int8": Place("onnx", "model_quantized"),
        "onnx-int8-static": Place("onnx/onnx-int8-static"), "onnx-fp8": Place("onnx/onnx-fp8"),
        "onnx-gen": Place("onnx/onnx-gen"), "ov-int8": Place("openvino", "openvino_model_qint8_quantized"),
        "st": Place("onnx", "model_qint8_avx512_vnni"), "deploy": Place("deploy/int8"),
    }
    assert places["onnx-int8"].manifest == "onnx/model_quantized.export.json"
    # a folder another tool wrote is never shared; a target keeps the place it was published at
    assert assign_places({"onnx-int8": _spec(artifact="model_quantized.onnx")}, foreign={"onnx"}) == {
        "onnx-int8": Place("onnx/onnx-int8")}
    assert assign_places({"onnx-int8": _spec(artifact="model_quantized.onnx")},
                         {"onnx-int8": Place("onnx/onnx-int8")}) == {"onnx-int8": Place("onnx/onnx-int8")}
    with pytest.raises(LayoutError, match=r"'a' and 'b' would both be published to onnx/model_x\.\*"):
        assign_places({"a": _spec(file_name="model_x.onnx"), "b": _spec(file_name="model_x.onnx")})


def test_a_variants_files_start_with_its_stem_and_belong_to_it_alone():
    place = Place("onnx", "model_quantized")
    assert [published_name(place, name, "onnx") for name in (
        "model.onnx", "model.onnx.data", "export.json", "export_config.json", "export_report.json", "config.json")] == [
        "model_quantized.onnx", "model_quantized.onnx_data", "model_quantized.export.json",
        "model_quantized.export_config.json", "model_quantized.export_report.json", "model_quantized.config.json"]
    assert published_name(Place("onnx"), "model.onnx.data", "onnx") == "model.onnx_data"
    ov = Place("openvino", "openvino_model_qint8_quantized")
    assert [published_name(ov, name, "openvino") for name in ("openvino_model.xml", "openvino_model.bin")] == [
        "openvino_model_qint8_quantized.xml", "openvino_model_qint8_quantized.bin"]
    tree = ["onnx/model.onnx", "onnx/model.onnx_data", "onnx/export.json", "onnx/config.json",
            "onnx/model_quantized.onnx", "onnx/model_quantized.export.json", "onnx/model_quantized.config.json",
            "onnx/sub/x.onnx", "README.md"]
    assert place_files(Place("onnx"), tree) == ["config.json", "export.json", "model.onnx", "model.onnx_data"]
    assert place_files(place, tree) == ["model_quantized.config.json", "model_quantized.export.json",
                                        "model_quantized.onnx"]


def test_targets_are_found_in_every_layout():
    copies = {"exports/old/export_config.json": None, "onnx/export_config.json": "onnx",
              "onnx/model_quantized.export_config.json": "onnx-int8", "onnx/gen/export_config.json": "gen"}
    paths = set(copies) | {"exports/old/export.json", "onnx/export.json", "onnx/model_quantized.export.json",
                           "onnx/gen/export.json", "onnx/export.export.json"}  # a reserved stem names no variant

    def read(path):
        return json.dumps({"targets": {copies[path]: {}}}) if copies.get(path) else None

    assert target_places(paths, read) == {"old": Place("exports/old"), "onnx": Place("onnx"),
                                          "onnx-int8": Place("onnx", "model_quantized"), "gen": Place("onnx/gen")}


@pytest.mark.parametrize(("file_name", "mode", "message"), [
    ("model_int8.xml", "forward", "not a file name for onnx"),
    ("export.onnx", "forward", "none of"),
    ("../model.onnx", "forward", "does not match"),
    ("sub/model.onnx", "forward", "does not match"),
    ("model.int8.onnx", "forward", "does not match"),
    ("model_x.onnx", "generation", "mode 'forward' only"),
])
def test_a_bad_file_name_is_refused_with_its_path(file_name, mode, message):
    from hfexport.recipe.data import recipe_from_document

    recipe = {"recipe_version": 1, "targets": {"t": {"export_format": "onnx", "mode": mode, "file_name": file_name}}}
    with pytest.raises(RecipeError) as caught:
        recipe_from_document(recipe)
    problems = [p for p in caught.value.problems if p.path.startswith("targets.t.file_name")]
    assert problems and message in problems[0].message, caught.value.problems
    good = recipe_from_document({"recipe_version": 1, "targets": {"t": {
        "export_format": "onnx", "file_name": "model_qint8_avx512_vnni.onnx"}}})
    assert good.targets["t"].file_name == "model_qint8_avx512_vnni.onnx"
    assert good.target_hash("t") == recipe_from_document(
        {"recipe_version": 1, "targets": {"t": {"export_format": "onnx"}}}).target_hash("t")


# ── a publication with a variant ─────────────────────────────────────────────


def _as_target(source: Path, folder: Path, name: str, quantization: dict | None) -> None:
    """`source` (an OUTPUT/<target> folder) copied as target `name`, its recipe copy and report renamed."""
    shutil.copytree(source, folder)
    recipe = json.loads((folder / "export_config.json").read_text())
    (old, spec), = recipe["targets"].items()
    if quantization:
        spec["quantization"] = quantization
    recipe["targets"], recipe["default_target"] = {name: spec}, name
    (folder / "export_config.json").write_text(json.dumps(recipe))
    report = json.loads((folder / "export_report.json").read_text())
    report["targets"] = {name: {**report["targets"][old], "target": name}}
    (folder / "export_report.json").write_text(json.dumps(report))


@pytest.fixture(scope="module")
def variant_out(exported_bert, tmp_path_factory) -> Path:
    output, _ = exported_bert
    out = tmp_path_factory.mktemp("variants") / "out"
    _as_target(output / "onnx", out / "onnx", "onnx", None)
    _as_target(output / "onnx", out / "onnx-int8", "onnx-int8", {"method": "ort_dynamic"})
    return out


@pytest.fixture(scope="module")
def variant_pr(hub, variant_out):
    from hfexport.publication.publish import publish

    repo = f"{hub.user}/variants-{uuid.uuid4().hex[:8]}"
    hub.seed_repo(repo, EXAMPLE)
    result = publish(variant_out, repo, mode="pr", token=hub.write_token)
    assert result.action == "opened"
    return repo, result.pr_num


def test_the_variant_is_published_under_the_loaders_name_beside_the_default(hub, variant_pr):
    repo, num = variant_pr
    files = set(hub.list_files(repo, f"refs/pr/{num}"))
    assert {"onnx/model.onnx", "onnx/model.onnx_data", "onnx/export.json", "onnx/model_quantized.onnx",
            "onnx/model_quantized.onnx_data", "onnx/model_quantized.export.json",
            "onnx/model_quantized.export_config.json", "onnx/model_quantized.export_report.json"} <= files
    assert not any(path.startswith(("exports/", "onnx/onnx-int8/")) for path in files)
    manifest = json.loads(hub.read_file(repo, "onnx/model_quantized.export.json", f"refs/pr/{num}"))
    assert manifest["components"]["model"]["file"] == "model_quantized.onnx"
    card = hub.read_file(repo, "README.md", f"refs/pr/{num}").decode()
    assert "| `onnx-int8` | [`onnx/model_quantized.onnx`](onnx/model_quantized.onnx)" in card
    assert 'model_kwargs={"file_name": "onnx/model_quantized.onnx"}' in card
    assert 'dtype: "q8", use_external_data_format: true' in card
    from huggingface_hub import HfApi

    description = HfApi(endpoint=hub.url).get_discussion_details(repo, num).events[0].content
    assert "`onnx-int8` → `onnx/model_quantized.*`" in description and "`onnx` → `onnx/`" in description


def test_hfexport_loads_the_variant_and_the_default_from_the_pull_request(variant_pr):
    import torch

    repo, num = variant_pr
    ids = torch.tensor([[2, 7, 9, 3]])
    outputs = [hfexport.load(repo, target=name, revision=f"refs/pr/{num}")(
        input_ids=ids, attention_mask=torch.ones_like(ids)).last_hidden_state for name in ("onnx", "onnx-int8")]
    by_name = hfexport.ExportedModel.from_pretrained(repo, revision=f"refs/pr/{num}", subfolder="onnx",
                                                     file_name="model_quantized.onnx")
    assert by_name.config is not None and by_name.config.model_type == "bert"
    outputs.append(by_name(input_ids=ids, attention_mask=torch.ones_like(ids)).last_hidden_state)
    assert all(torch.equal(outputs[0], other) for other in outputs[1:])  # the same graph under two names
    with pytest.raises(SourceError, match="file_name"):
        hfexport.ExportedModel.from_pretrained(repo, revision=f"refs/pr/{num}", subfolder="onnx",
                                               file_name="../model.onnx")


def test_republishing_is_a_no_op_and_the_cache_finds_the_variant(hub, variant_out, variant_pr):
    from hfexport.publication.cache import find_published
    from hfexport.publication.publish import publish
    from hfexport.report.data import JobReport

    repo, num = variant_pr
    again = publish(variant_out, repo, mode="pr", token=hub.write_token)
    assert (again.action, again.pr_num) == ("unchanged", num)
    key = JobReport.read(variant_out / "onnx-int8").targets["onnx-int8"].cache_key
    hit = find_published(repo, "onnx-int8", key, [f"refs/pr/{num}"], hub.write_token)
    assert hit is not None and "onnx/model_quantized.*" in hit.reason


def test_the_content_hash_ignores_a_variants_files(hub, variant_pr, tmp_path):
    from hfexport.publication.cache import local_content_hash

    repo, num = variant_pr
    model = tmp_path / "model"
    shutil.copytree(EXAMPLE, model)
    before = local_content_hash(model)
    (model / "onnx").mkdir(exist_ok=True)
    for name in ("model_quantized.export.json", "model_quantized.config.json"):
        (model / "onnx" / name).write_bytes(hub.read_file(repo, f"onnx/{name}", f"refs/pr/{num}"))
    assert local_content_hash(model) == before


# ── nothing a variant names is read outside its folder ──────────────────────


@pytest.fixture
def variant_folder(hub, variant_pr, tmp_path) -> Path:
    """A local copy of the pull request's `onnx/` folder (the default target and the variant)."""
    from huggingface_hub import snapshot_download

    repo, num = variant_pr
    local = Path(snapshot_download(repo, revision=f"refs/pr/{num}", allow_patterns=["onnx/*"],
                                   cache_dir=tmp_path / "cache"))
    folder = tmp_path / "repo"
    shutil.copytree(local, folder, symlinks=False)
    assert hfexport.load(folder, target="onnx-int8") is not None  # the clean copy loads
    return folder


@pytest.fixture
def elsewhere(tmp_path) -> Path:
    folder = tmp_path / "elsewhere"
    folder.mkdir()
    return folder


@pytest.mark.parametrize("name", ["model_quantized.onnx_data", "model_quantized.config.json",
                                  "model_quantized.export.json", "model_quantized.export_config.json"])
def test_a_variants_file_linked_outside_is_refused(variant_folder, elsewhere, name):
    onnx = variant_folder / "onnx"
    shutil.move(onnx / name, elsewhere / name)  # the real file, so a loader that followed the link would load it
    (onnx / name).symlink_to(elsewhere / name)
    if name == "model_quantized.export_config.json":  # it names the target: a linked one names none
        with pytest.raises(SourceError, match="no target 'onnx-int8'"):
            hfexport.load(variant_folder, target="onnx-int8")
        from hfexport.exported import _local_fetcher, owner_precision

        with pytest.raises(UnsafeExportError, match=f"{name}: resolves to .* outside the export folder"):
            owner_precision(_local_fetcher(onnx), "model_quantized.")  # the loader's read of the owner's precision
        return
    with pytest.raises(UnsafeExportError, match=f"{name}: resolves to .* outside the export folder"):
        hfexport.load(variant_folder, target="onnx-int8")


@pytest.mark.parametrize("file", ["../model_quantized.onnx", "/etc/hostname", "sub/../../model.onnx"])
def test_a_variant_manifest_naming_a_file_outside_is_refused(variant_folder, elsewhere, file):
    onnx = variant_folder / "onnx"
    shutil.copy(onnx / "model_quantized.onnx", elsewhere / "model_quantized.onnx")
    manifest = json.loads((onnx / "model_quantized.export.json").read_text())
    manifest["components"]["model"]["file"] = file
    (onnx / "model_quantized.export.json").write_text(json.dumps(manifest))
    with pytest.raises(UnsafeExportError, match="not a file name inside the export's folder"):
        hfexport.load(variant_folder, target="onnx-int8")


def test_a_variant_graph_pointing_at_the_defaults_weights_is_refused(variant_folder):
    """A variant's ONNX may keep its weights only in its own `<stem>.onnx_data`, not in another target's file."""
    import onnx as onnx_lib

    folder = variant_folder / "onnx"
    model = onnx_lib.load(folder / "model_quantized.onnx", load_external_data=False)
    for tensor in model.graph.initializer:
        for entry in tensor.external_data:
            if entry.key == "location":
                entry.value = "model.onnx_data"
    (folder / "model_quantized.onnx").write_bytes(model.SerializeToString())
    with pytest.raises(CorruptExportError, match="'model.onnx_data', not this component's weights file "
                                                 "'model_quantized.onnx"):
        hfexport.load(variant_folder, target="onnx-int8")


def test_a_float16_graph_is_named_model_fp16(exported_bert, tmp_path):
    """The dtype comes from the engine's manifest (`export_dtype`): a checkpoint stored in float16 exports float16
    graphs (the model loads with dtype="auto"); here tiny-bert's manifest says float16, only the name is under test."""
    from hfexport.publication.publish import _layout_spec, _local_targets

    output, _ = exported_bert
    _as_target(output / "onnx", tmp_path / "out" / "onnx", "onnx", None)
    manifest_file = tmp_path / "out" / "onnx" / "export.json"
    manifest = json.loads(manifest_file.read_text())
    assert manifest["components"]["model"]["metadata"]["export_dtype"] == "float32"
    (item,) = _local_targets(tmp_path / "out", None)
    assert _layout_spec(item)["artifact"] == "model.onnx"
    manifest["components"]["model"]["metadata"]["export_dtype"] = "float16"
    manifest_file.write_text(json.dumps(manifest))
    assert _layout_spec(item)["artifact"] == "model_fp16.onnx"
    assert assign_places({"onnx": _layout_spec(item)}) == {"onnx": Place("onnx", "model_fp16")}
