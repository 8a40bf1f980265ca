"""Provenance and cache keys: what a key covers, hits in OUTPUT and on the Hub, and that a hit loads nothing."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import uuid
from pathlib import Path

import pytest
from hfexport.job.run import resolve_source, run_job
from hfexport.progress import Step
from hfexport.publication.cache import (
    cache_key,
    hub_content_hash,
    local_content_hash,
    lookup,
)
from hfexport.recipe.loading import load_recipe

ROOT = Path(__file__).resolve().parents[1]
EXAMPLE = ROOT / "examples" / "tiny-bert"


@pytest.fixture(scope="module")
def recipe():
    return load_recipe(EXAMPLE)


@pytest.fixture
def out_with_onnx(exported_bert, tmp_path) -> Path:
    """A private OUTPUT holding the session's tiny-bert onnx export (so the shared folder's summary is not rewritten)."""
    output, _ = exported_bert
    out = tmp_path / "out"
    shutil.copytree(output / "onnx", out / "onnx")
    return out


def _packages(**changes):
    from hfexport.report.data import package_versions

    return {**package_versions(), **changes}


def test_the_key_covers_source_recipe_target_and_relevant_packages(recipe):
    source = {"content_hash": "a" * 64, "commit": None}
    onnx, pt2 = recipe.target("onnx"), recipe.target("pt2")
    key = cache_key(source, onnx, recipe.target_hash("onnx"), _packages())
    assert key == cache_key(dict(source), onnx, recipe.target_hash("onnx"), _packages())  # deterministic
    assert key != cache_key({"content_hash": "b" * 64}, onnx, recipe.target_hash("onnx"), _packages())
    assert key != cache_key(source, onnx, recipe.target_hash("pt2"), _packages())
    for package in ("hfexport", "transformers", "torch", "onnx", "onnxscript", "onnxruntime"):
        assert key != cache_key(source, onnx, recipe.target_hash("onnx"), _packages(**{package: "0.0.1"})), package
    # A backend the target does not use is not part of its key.
    assert key == cache_key(source, onnx, recipe.target_hash("onnx"), _packages(openvino="0.0.1", executorch="0.0.1"))
    pt2_key = cache_key(source, pt2, recipe.target_hash("pt2"), _packages())
    assert pt2_key == cache_key(source, pt2, recipe.target_hash("pt2"), _packages(onnx="0.0.1"))
    assert cache_key({"content_hash": None, "commit": None}, onnx, recipe.target_hash("onnx"), _packages()) is None


def test_recipe_hash_is_per_target(recipe, tmp_path):
    """Changing one target's options changes that target's hash only; a shared dim changes all of them."""
    data = json.loads((EXAMPLE / "export_config.json").read_text())
    data["targets"]["onnx"]["options"]["opset_version"] = 17
    changed = load_recipe(data)
    assert changed.target_hash("onnx") != recipe.target_hash("onnx")
    assert changed.target_hash("pt2") == recipe.target_hash("pt2")
    data["dims"]["seq"]["max"] = 32
    assert load_recipe(data).target_hash("pt2") != recipe.target_hash("pt2")


def test_local_content_hash_is_weights_and_configs_only(tmp_path):
    model = tmp_path / "model"
    shutil.copytree(EXAMPLE, model)
    before = local_content_hash(model)
    (model / "README.md").write_text("docs change")
    recipe = json.loads((model / "export_config.json").read_text())
    recipe["description"] = "edited"
    (model / "export_config.json").write_text(json.dumps(recipe))
    assert local_content_hash(model) == before  # the recipe has per-target hashes of its own
    (model / "config.json").write_text((model / "config.json").read_text() + " ")
    assert local_content_hash(model) != before


def test_hub_content_hash_ignores_published_exports(hub):
    """Publishing exports into the model's own repo makes a new commit but is not a change of the model."""
    repo = f"user/cache-{uuid.uuid4().hex[:8]}"
    hub.seed_repo(repo, EXAMPLE)
    first = resolve_source(repo, None, None)
    hub.commit(repo, add={"exports/onnx/model.onnx": b"x", "README.md": "card", "export_config.json": "{}"})
    second = resolve_source(repo, None, None)
    assert first["commit"] != second["commit"] and first["content_hash"] == second["content_hash"]
    # The same files in a local folder and in a Hub repo have the same identity: a publication made from a folder
    # is a cache hit for a job that reads the repo.
    assert first["content_hash"] == local_content_hash(EXAMPLE)
    hub.commit(repo, add={"model.safetensors": (EXAMPLE / "model.safetensors").read_bytes() + b"\0"})
    changed = resolve_source(repo, None, None)
    assert changed["content_hash"] != first["content_hash"]
    from huggingface_hub import HfApi

    info = HfApi().model_info(repo, files_metadata=True)
    assert hub_content_hash(repo, info.sha, info.siblings) == changed["content_hash"]


def test_a_local_hit_skips_loading_and_says_why(out_with_onnx, exported_bert):
    steps: list[Step] = []
    report = run_job(EXAMPLE, out_with_onnx, targets=["onnx"], progress=steps.append)
    target = report.targets["onnx"]
    assert (report.status, target.status, report.changed) == ("unchanged", "unchanged", False)
    assert "same cache key" in target.unchanged_reason and str(out_with_onnx / "onnx") in target.unchanged_reason
    assert target.cache_key == exported_bert[1].targets["onnx"].cache_key
    assert target.files == exported_bert[1].targets["onnx"].files
    # The runtimes' verdicts and the variants were measured on these same files: the hit carries them.
    assert (target.runtimes, target.variants) == (exported_bert[1].targets["onnx"].runtimes,
                                                  exported_bert[1].targets["onnx"].variants)
    assert not any(step.step in ("load_model", "preflight", "export") for step in steps)
    assert "load_model_s" not in report.timings
    summary = json.loads((out_with_onnx / "export_report.json").read_text())
    assert summary["targets"]["onnx"]["status"] == "unchanged"
    # The target's own report is the original export's, not overwritten by the cache hit.
    assert json.loads((out_with_onnx / "onnx" / "export_report.json").read_text())["targets"]["onnx"]["status"] == "ok"


def test_a_damaged_local_export_is_not_a_hit(out_with_onnx, recipe):
    source = resolve_source(EXAMPLE, None, None)
    from hfexport.report.data import package_versions

    keys = {"onnx": cache_key(source, recipe.target("onnx"), recipe.target_hash("onnx"), package_versions())}
    assert lookup(out_with_onnx, keys, [], None)
    data = out_with_onnx / "onnx" / "model.onnx.data"
    data.write_bytes(data.read_bytes()[:-10])
    assert lookup(out_with_onnx, keys, [], None) == {}
    assert lookup(out_with_onnx, {"onnx": "0" * 64}, [], None) == {}


def test_published_exports_are_hits_at_the_pr_head_and_on_main(hub, exported_bert, tmp_path):
    """The second run of an unchanged revision checks the Hub (PR head, then main) and exports nothing."""
    from hfexport.publication.publish import publish

    output, _ = exported_bert
    out = tmp_path / "pub"
    shutil.copytree(output / "onnx", out / "onnx")
    shutil.copytree(output / "pt2", out / "pt2")
    repo = f"user/cache-{uuid.uuid4().hex[:8]}"
    hub.seed_repo(repo, EXAMPLE)
    publish(out, repo, token=hub.write_token, targets=["onnx"])                  # onnx: in the open PR
    publish(out, repo, mode="commit", token=hub.write_token, targets=["pt2"])    # pt2: on main
    steps: list[Step] = []
    report = run_job(repo, tmp_path / "fresh", targets=["onnx", "pt2"], progress=steps.append)
    assert report.status == "unchanged"
    assert f"{repo}@refs/pr/1" in report.targets["onnx"].unchanged_reason
    assert f"{repo}@main" in report.targets["pt2"].unchanged_reason
    assert not any(step.step == "load_model" for step in steps)
    assert not (tmp_path / "fresh" / "onnx").exists()


def test_a_cache_hit_does_not_even_import_torch(hub, exported_bert, tmp_path):
    """In a fresh process, a no-op re-export (remote report checked) never imports torch, let alone loads weights."""
    from hfexport.publication.publish import publish

    output, _ = exported_bert
    out = tmp_path / "pub"
    shutil.copytree(output / "onnx", out / "onnx")
    repo = f"user/cache-{uuid.uuid4().hex[:8]}"
    hub.seed_repo(repo, EXAMPLE)
    publish(out, repo, mode="commit", token=hub.write_token, targets=["onnx"])
    code = (
        "import sys, json\n"
        "from hfexport.job.run import run_job\n"
        f"report = run_job({repo!r}, {str(tmp_path / 'fresh')!r}, targets=['onnx'])\n"
        "print(json.dumps([report.status, 'torch' in sys.modules, 'transformers' in sys.modules]))\n"
    )
    env = {**os.environ, "PYTHONPATH": str(ROOT / "library")}
    run = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env, timeout=300)
    assert run.returncode == 0, run.stderr
    assert json.loads(run.stdout.strip().splitlines()[-1]) == ["unchanged", False, False]


def test_force_exports_again(out_with_onnx):
    steps: list[Step] = []
    report = run_job(EXAMPLE, out_with_onnx, targets=["pt2"], progress=steps.append)  # not in OUTPUT: exported
    assert report.targets["pt2"].status in ("ok", "failed")
    again = run_job(EXAMPLE, out_with_onnx, targets=["pt2"])
    assert again.targets["pt2"].status == "unchanged"
    forced_steps: list[Step] = []
    forced = run_job(EXAMPLE, out_with_onnx, targets=["pt2"], force=True, progress=forced_steps.append)
    assert forced.targets["pt2"].status in ("ok", "failed") and forced.targets["pt2"].unchanged_reason is None
    assert any(step.step == "export" for step in forced_steps)
    assert not any(step.step == "cache" for step in forced_steps)
    assert forced.targets["pt2"].cache_key == again.targets["pt2"].cache_key


def test_cli_force_flag_and_unchanged_summary(out_with_onnx, cli):
    run = cli("export", str(EXAMPLE), "--target", "onnx", "-o", str(out_with_onnx), "--json")
    assert run.returncode == 0, run.stderr
    report = json.loads(run.stdout)
    assert report["status"] == "unchanged" and report["targets"]["onnx"]["cache_key"]
