"""A publication's pull request always merges, whatever the owner did on main meanwhile (issue 14).

The owner edits README.md (CRLF line endings) and other files on main between hfexport's updates; each update is
computed against main's current head, and the PR is then merged on the local Hub, whose merge is git's 3-way merge
(hfexport.testing.hub). The owner's README bytes must survive exactly, and the PR's description and card must list
every target the PR holds, marking a target built from older model files as stale.
"""

from __future__ import annotations

import json
import shutil

import pytest

from hfexport.report.card import END, START
from hfexport.publication.publish import publish

OWNER_README = b"---\r\nlicense: mit\r\ntags:\r\n- hfexport\r\n- onnx\r\n- openvino\r\n- torch-export\r\n---\r\n# Tiny BERT\r\n\r\nOwner's words.\r\n"


def _outside(readme: bytes) -> bytes:
    start, end = readme.index(START.encode()), readme.index(END.encode()) + len(END)
    return readme[:start] + readme[end:]


@pytest.fixture
def repo(hub, tiny_bert, request):
    name = f"{hub.user}/merge-{request.node.name[:40].replace('[', '-').replace(']', '')}"
    hub.seed_repo(name, tiny_bert)
    hub.commit(name, add={"README.md": OWNER_README})
    return name


def _api(hub):
    from huggingface_hub import HfApi

    return HfApi(endpoint=hub.url, token=hub.write_token)


def test_owner_readme_edits_between_updates_never_block_the_merge(hub, repo, exported_bert):
    output, _ = exported_bert
    first = publish(output, repo, mode="pr", token=hub.write_token, targets=["onnx"])
    assert first.action == "opened"
    assert "onnx/model.onnx" in hub.list_files(repo, f"refs/pr/{first.pr_num}")

    edited = OWNER_README.replace(b"Owner's words.\r\n", b"Owner's words.\r\n\r\nMore words, added on main.\r\n")
    hub.commit(repo, add={"README.md": edited, "NOTES.md": b"owner notes\n"})
    second = publish(output, repo, mode="pr", token=hub.write_token, targets=["pt2"])

    # main's README changed since the PR forked: a fresh PR from main's head, carrying onnx, replaces the old one
    assert second.action == "opened" and second.pr_num != first.pr_num
    old = next(d for d in hub.discussions(repo) if d["num"] == first.pr_num)
    assert old["status"] == "closed"
    files = hub.list_files(repo, f"refs/pr/{second.pr_num}")
    assert {"onnx/model.onnx", "torch-export/model.pt2", "NOTES.md"} <= set(files)
    details = _api(hub).get_discussion_details(repo, second.pr_num)
    description = details.events[0].content
    assert "`onnx` → `onnx/`" in description and "`pt2` → `torch-export/`" in description
    assert details.conflicting_files in (None, [])

    hub.commit(repo, add={"config_notes.txt": b"another owner file\n"})  # a non-README edit: updated in place
    third = publish(output, repo, mode="pr", token=hub.write_token, targets=["openvino"])
    assert third.action == "updated" and third.pr_num == second.pr_num

    _api(hub).merge_pull_request(repo, second.pr_num)
    readme = hub.read_file(repo, "README.md")
    assert _outside(readme).rstrip(b"\r\n") == edited.rstrip(b"\r\n")  # the owner's bytes, CRLF and all
    assert b"\r\n" in readme and b"\n" not in readme.replace(b"\r\n", b"")
    card = readme.decode()
    for name, folder in (("onnx", "onnx"), ("pt2", "torch-export"), ("openvino", "openvino")):
        assert f"| `{name}` | [`{folder}/`]({folder})" in card
    assert {"NOTES.md", "config_notes.txt", "onnx/model.onnx_data", "openvino/openvino_model.xml"} <= set(
        hub.list_files(repo))


def test_a_target_from_older_model_files_is_marked_stale(hub, repo, exported_bert, tmp_path):
    output, _ = exported_bert
    publish(output, repo, mode="pr", token=hub.write_token, targets=["pt2"])
    newer = tmp_path / "newer"
    shutil.copytree(output / "onnx", newer / "onnx")
    report_file = newer / "onnx" / "export_report.json"
    report = json.loads(report_file.read_text())
    report["source"]["content_hash"] = "f" * 64  # as if the owner had pushed new weights and only onnx was rebuilt
    report_file.write_text(json.dumps(report))
    result = publish(newer, repo, mode="pr", token=hub.write_token, targets=["onnx"])
    assert result.action == "updated"
    description = _api(hub).get_discussion_details(repo, result.pr_num).events[0].content
    assert "Stale" in description and "`pt2`: built from model files" in description
    card = hub.read_file(repo, "README.md", f"refs/pr/{result.pr_num}").decode()
    assert "⚠️ stale" in card and "`pt2`" in card and "`onnx`" in card


def test_a_recipe_path_places_the_target_and_a_bad_one_is_refused(hub, repo, exported_bert, tmp_path):
    from hfexport.errors import RecipeError
    from hfexport.recipe.data import recipe_from_document

    output, _ = exported_bert
    moved = tmp_path / "moved"
    shutil.copytree(output / "pt2", moved / "pt2")
    copy = moved / "pt2" / "export_config.json"
    recipe = json.loads(copy.read_text())
    recipe["targets"]["pt2"]["path"] = "deploy/torch"
    copy.write_text(json.dumps(recipe))
    assert recipe_from_document(recipe).targets["pt2"].path == "deploy/torch"
    result = publish(moved, repo, mode="pr", token=hub.write_token)
    assert "deploy/torch/model.pt2" in hub.list_files(repo, f"refs/pr/{result.pr_num}")
    for bad in ("../up", "/abs", "a/../b", ".hidden", "exports/pt2", ""):
        recipe["targets"]["pt2"]["path"] = bad
        with pytest.raises(RecipeError, match="path"):
            recipe_from_document(recipe)


def test_legacy_exports_folder_stays_loadable(hub, exported_bert):
    import hfexport

    output, _ = exported_bert
    repo = f"{hub.user}/legacy-layout"
    hub.seed_repo(repo, {f"exports/onnx/{p.name}": p.read_bytes() for p in (output / "onnx").iterdir()})
    model = hfexport.load(repo, target="onnx")
    assert model is not None


def test_publication_into_another_repo_names_its_base_model(hub, exported_bert, tmp_path):
    output, _ = exported_bert
    copy = tmp_path / "out"
    shutil.copytree(output / "onnx", copy / "onnx")
    report_file = copy / "onnx" / "export_report.json"
    report = json.loads(report_file.read_text())
    report["source"]["model"] = "org/tiny-bert"  # as exported from the Hub repo org/tiny-bert
    report_file.write_text(json.dumps(report))
    target = f"{hub.user}/tiny-bert-exports"
    publish(copy, target, mode="commit", token=hub.write_token)
    from huggingface_hub import ModelCard

    card = ModelCard(hub.read_file(target, "README.md").decode())
    assert card.data.base_model == "org/tiny-bert"
    assert {"hfexport", "onnx"} <= set(card.data.tags)
    for snippet in ('SentenceTransformer("' + target + '", backend="onnx")', "ORTModelForFeatureExtraction",
                    'pipeline("feature-extraction"', "hfexport.load(", "ort.InferenceSession("):
        assert snippet in card.text
