"""The GitHub Action: recipe annotations, the fan-out matrix, lint of the action and workflows, and end-to-end
runs of `action/action.yml`'s steps (hfexport.testing.actions) against the local Hub server."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import uuid
from pathlib import Path

import pytest
from hfexport.surfaces.annotations import Annotation, check_recipe, locate, resolve_path
from hfexport.testing.actions import (
    ActionError,
    condition,
    evaluate,
    parse_commands,
    read_output_file,
    run_action,
)

ROOT = Path(__file__).resolve().parent.parent
ACTION = ROOT / "action"
BIN = Path(sys.executable).parent


def action_env(**extra: str) -> dict[str, str]:
    """The steps' environment: this venv's python/hfexport first on PATH (the action runs with install: false)."""
    return {**os.environ, "PATH": f"{BIN}{os.pathsep}{os.environ['PATH']}", "PYTHONPATH": str(ROOT / "library"),
            **extra}


def unique(prefix: str) -> str:
    return f"user/{prefix}-{uuid.uuid4().hex[:8]}"


def line_of(text: str, needle: str) -> int:
    return next(number for number, line in enumerate(text.splitlines(), 1) if needle in line)


# ── annotations ──────────────────────────────────────────────────────────────

BAD_RECIPE = """{
  "recipe_version": 1,
  "dims": {"batch": {"min": 1, "max": 4}},
  "targets": {
    "onnx.v2": {
      "export_format": "onnx",
      "options": {
        "opset_version": 18,
        "backend": "xnnpack"
      },
      "dynamic_shapes": {"input_ids": {"0": "batchh"}}
    }
  }
}
"""


def test_annotations_point_at_each_problem_line(tmp_path):
    recipe = tmp_path / "export_config.json"
    recipe.write_text(BAD_RECIPE)
    annotations = check_recipe(recipe, workspace=tmp_path)
    by_path = {a.message.split(":")[0]: a for a in annotations}
    assert set(by_path) == {"targets.onnx.v2.options.backend", "targets.onnx.v2.dynamic_shapes.input_ids.0"}
    backend = by_path["targets.onnx.v2.options.backend"]
    assert (backend.file, backend.line, backend.col) == ("export_config.json", line_of(BAD_RECIPE, '"backend"'), 9)
    assert by_path["targets.onnx.v2.dynamic_shapes.input_ids.0"].line == line_of(BAD_RECIPE, '"batchh"')
    assert all(a.level == "error" and a.title == "invalid recipe" for a in annotations)


def test_missing_key_points_at_its_parent_and_syntax_errors_at_the_parser_position(tmp_path):
    text = '{\n  "targets": {\n    "x": {\n      "mode": "forward"\n    }\n  }\n}\n'
    (tmp_path / "missing.json").write_text(text)
    [annotation] = check_recipe(tmp_path / "missing.json")
    assert "export_format" in annotation.message and annotation.line == 3  # the target object that lacks it
    (tmp_path / "broken.json").write_text('{\n  "targets": {\n    "x": {,}\n  }\n}\n')
    [annotation] = check_recipe(tmp_path / "broken.json")
    assert (annotation.line, annotation.col) == (3, 11) and "not valid JSON" in annotation.message


def test_recipe_inside_config_json_is_located_in_config_json(tmp_path):
    config = {"model_type": "bert", "hidden_size": 8, "export_config": {"export_format": "onnx", "opset_version": "x"}}
    text = json.dumps(config, indent=2)
    (tmp_path / "config.json").write_text(text)
    [annotation] = check_recipe(tmp_path, workspace=tmp_path)
    assert annotation.file == "config.json" and annotation.line == line_of(text, '"opset_version"')


def test_dotted_paths_resolve_to_the_longest_existing_key():
    document = {"targets": {"a.b": {"c": [1, {"d.e": 2}]}, "a": {"x": 1}}}
    assert resolve_path(document, "targets.a.b.c.1.d.e") == ("targets", "a.b", "c", 1, "d.e")
    assert resolve_path(document, "targets.a.x") == ("targets", "a", "x")
    assert resolve_path(document, "targets.nope.deeper") == ("targets",)
    assert locate('{"a": {"b":\n  [1, 2]}}', "a.b.1") == (2, 7)


def test_annotation_commands_escape_data_and_properties():
    annotation = Annotation("100% wrong:\nsecond line", file="dir,with:odd.json", line=3, col=4)
    command = annotation.command()
    assert "\n" not in command and "%25" in command and "dir%2Cwith%3Aodd.json" in command
    [parsed], masks = parse_commands(command)
    assert parsed == {"level": "error", "message": "100% wrong:\nsecond line", "file": "dir,with:odd.json",
                      "line": 3, "col": 4, "title": "invalid recipe"}
    assert masks == []


def test_validate_format_github_cli(cli, tmp_path):
    recipe = tmp_path / "export_config.json"
    recipe.write_text(BAD_RECIPE)
    result = cli("validate", str(recipe), "--format", "github")
    assert result.returncode == 1, result.stderr
    annotations, _ = parse_commands(result.stdout)
    assert len(annotations) == 2 and {a["line"] for a in annotations} == {9, 11}
    valid = cli("validate", str(ROOT / "examples" / "tiny-bert"), "--format", "github")
    assert valid.returncode == 0 and "::error" not in valid.stdout


# ── the fan-out matrix ───────────────────────────────────────────────────────


def test_plan_json_is_a_one_line_matrix(cli, tiny_bert):
    result = cli("plan", str(tiny_bert), "--json")
    assert result.returncode == 0, result.stderr
    assert result.stdout.count("\n") == 1
    matrix = json.loads(result.stdout)
    assert matrix == {"include": [
        {"target": "onnx", "export_format": "onnx", "mode": "forward"},
        {"target": "openvino", "export_format": "openvino", "mode": "forward"},
        {"target": "pt2", "export_format": "dynamo", "mode": "forward"},
        {"target": "pte", "export_format": "executorch", "mode": "forward"},
    ]}
    some = cli("plan", str(tiny_bert), "--json", "--target", "pt2,onnx")
    assert [entry["target"] for entry in json.loads(some.stdout)["include"]] == ["pt2", "onnx"]
    unknown = cli("plan", str(tiny_bert), "--json", "--target", "nope")
    assert unknown.returncode == 2 and "nope" in unknown.stderr and "Traceback" not in unknown.stderr


# ── the local runner's expressions ───────────────────────────────────────────


def test_runner_expressions_follow_github_semantics():
    contexts = {"inputs": {"publish": "PR", "command": "export", "hf-token": ""},
                "steps": {"run": {"outputs": {"output-dir": "/x"}}}, "env": {}, "github": {}, "runner": {}}
    assert evaluate("inputs.publish == 'pr'", contexts) is True  # strings compare case-insensitively
    assert evaluate("inputs.publish != 'none' && inputs.command != 'plan'", contexts) is True
    assert evaluate("steps.run.outputs.output-dir", contexts) == "/x"
    assert evaluate("inputs.hf-token || 'fallback'", contexts) == "fallback"
    assert evaluate("steps.missing.outputs.x != ''", contexts) is False  # null and '' both coerce to 0
    assert condition("inputs.command == 'export'", contexts, "failure") is False  # implicit success()
    assert condition("always() && inputs.command == 'export'", contexts, "failure") is True
    with pytest.raises(ActionError, match="hashFiles"):
        evaluate("hashFiles('x')", contexts)
    with pytest.raises(ActionError, match="unknown context"):
        evaluate("secretz.x", contexts)


def test_output_files_parse_heredocs(tmp_path):
    path = tmp_path / "out"
    path.write_text("a=1\nb<<EOF_1\nline one\nline=two\nEOF_1\nc=\n")
    assert read_output_file(path) == {"a": "1", "b": "line one\nline=two", "c": ""}
    path.write_text("b<<EOF_1\nnever closed\n")
    with pytest.raises(ActionError, match="delimiter"):
        read_output_file(path)


def test_runner_refuses_unknown_inputs(tmp_path):
    with pytest.raises(ActionError, match="unknown input"):
        run_action(ACTION, {"model": "a/b", "modle": "x"}, workspace=tmp_path)


# ── lint ─────────────────────────────────────────────────────────────────────


def _linter(name: str) -> str:
    path = shutil.which(name, path=str(BIN)) or shutil.which(name)
    if path is None:
        pytest.fail(f"{name} is not installed (it is in the `test` extra)")
    return path


def _resolved_tree(tmp_path: Path) -> Path:
    """The workflows with hfexport's own action/workflow references pointing at this checkout, so the linter
    checks every input passed to them against action/action.yml and the reusable workflow."""
    tree = tmp_path / "lint"
    (tree / ".github" / "workflows").mkdir(parents=True)
    shutil.copytree(ACTION, tree / "action")
    shutil.copytree(ACTION, tree / ".hfexport" / "action")  # where the reusable workflow checks hfexport out
    shutil.copy(ROOT / ".github" / "workflows" / "hfexport.yml", tree / ".github" / "workflows")
    for example in sorted((ACTION / "examples").glob("*.yml")):
        text = example.read_text().replace("huggingface/hfexport/action@v1", "./action").replace(
            "huggingface/hfexport/.github/workflows/hfexport.yml@v1", "./.github/workflows/hfexport.yml")
        (tree / ".github" / "workflows" / f"example-{example.name}").write_text(text)
    subprocess.run(["git", "init", "-q", str(tree)], check=True)
    return tree


def test_actionlint_passes_on_workflows_and_examples(tmp_path):
    actionlint = _linter("actionlint")
    files = [ROOT / ".github" / "workflows" / "hfexport.yml", *sorted((ACTION / "examples").glob("*.yml"))]
    assert len(files) == 4
    direct = subprocess.run([actionlint, "-oneline", *map(str, files)], capture_output=True, text=True, cwd=ROOT)
    assert direct.returncode == 0, direct.stdout + direct.stderr
    tree = _resolved_tree(tmp_path)
    resolved = subprocess.run([actionlint, "-oneline"], capture_output=True, text=True, cwd=tree)
    assert resolved.returncode == 0, resolved.stdout + resolved.stderr
    # The check is live: an input the action does not declare is caught through the resolved reference.
    example = tree / ".github" / "workflows" / "example-checkpoint-repo.yml"
    example.write_text(example.read_text().replace("          targets: all", "          target: all"))
    broken = subprocess.run([actionlint, "-oneline"], capture_output=True, text=True, cwd=tree)
    assert broken.returncode == 1 and 'input "target" is not defined in action "hfexport"' in broken.stdout


def test_jactionlint_passes_on_the_composite_action(tmp_path):
    """actionlint lints workflows only (it reads action.yml just to check the inputs passed to it); jactionlint also
    lints composite actions: expressions, script injection, shellcheck of `run:` scripts. The actions are pinned
    by release tag, not commit SHA (SHAs cannot be checked offline), hence `--ignore unpinned-uses`."""
    jactionlint = _linter("jactionlint")
    files = [ACTION / "action.yml", ROOT / ".github" / "workflows" / "hfexport.yml",
             *sorted((ACTION / "examples").glob("*.yml"))]
    result = subprocess.run([jactionlint, "--ignore", "unpinned-uses", *map(str, files)], capture_output=True,
                            text=True, cwd=ROOT)
    assert result.returncode == 0, result.stdout + result.stderr
    broken = tmp_path / "action.yml"
    broken.write_text((ACTION / "action.yml").read_text().replace("${{ inputs.model }}", "${{ inputs.modle }}"))
    failed = subprocess.run([jactionlint, "--ignore", "unpinned-uses", str(broken)], capture_output=True, text=True)
    assert failed.returncode == 1 and "modle" in failed.stdout


# ── end to end against the local Hub ─────────────────────────────────────────


def _run(inputs: dict, tmp_path: Path, name: str, workspace: Path | None = None):
    """One run of the action on a fresh 'runner' (new workspace and temp folder), hfexport already installed."""
    workspace = workspace or tmp_path / f"{name}-workspace"
    workspace.mkdir(parents=True, exist_ok=True)
    return run_action(ACTION, {"install": "false", **inputs}, workspace=workspace, temp=tmp_path / f"{name}-temp",
                      env=action_env())


def _perturbed_weights(folder: Path) -> bytes:
    from safetensors.torch import load_file, save

    tensors = load_file(folder / "model.safetensors")
    name = sorted(tensors)[0]
    tensors[name] = tensors[name] + 0.01
    return save(tensors, metadata={"format": "pt"})


def _pr_state(hub, repo: str) -> dict:
    return {"refs": hub.refs(repo), "discussions": [(d["num"], d["status"], len(d["events"])) for d in
                                                    hub.discussions(repo)]}


def test_action_opens_a_pr_then_hits_the_cache_then_updates_the_same_pr(hub, tiny_bert, tmp_path):
    repo = unique("action")
    hub.seed_repo(repo, tiny_bert)
    inputs = {"model": repo, "targets": "pt2", "publish": "pr", "hf-token": hub.write_token}

    first = _run(inputs, tmp_path, "first")
    assert first.success, first.log
    assert [(s.name, s.outcome) for s in first.steps] == [
        ("Set up Python", "skipped"), ("Install torch (CPU) and hfexport", "skipped"), ("Run hfexport", "success"),
        ("Upload the export", "skipped"), ("Publish to the Hub", "success")]
    assert first.outputs["changed"] == "true" and first.outputs["status"] == "ok"
    assert first.outputs["pr-url"].endswith(f"/{repo}/discussions/1")
    report = json.loads(Path(first.outputs["report-json"]).read_text())
    assert report["targets"]["pt2"]["status"] == "ok" and report["source"]["commit"] == hub.head(repo)
    assert Path(first.outputs["report-markdown"]).read_text() in first.summary
    assert "## hfexport report" in first.summary and "`pt2`" in first.summary
    assert hub.write_token not in first.log + first.summary
    [pr] = hub.discussions(repo)
    assert pr["isPullRequest"] and pr["status"] == "open"
    # the job summary and the PR's description each carry the peak memory per stage beside the preflight's
    # estimate (issue 45)
    description = pr["events"][0]["data"]["latest"]["raw"]
    for text in (first.summary, description):
        memory = next(line for line in text.splitlines() if line.startswith("Peak memory: load "))
        assert "pt2: " in memory and "trace+convert " in memory and "gate " in memory, memory
        assert "· preflight estimate: load " in memory and "trace+convert " in memory.split("preflight")[1], memory
    assert "torch-export/model.pt2" in hub.list_files(repo, "refs/pr/1")
    assert first.annotations == []

    before = _pr_state(hub, repo)
    second = _run(inputs, tmp_path, "second")
    assert second.success, second.log
    assert second.outputs["changed"] == "false" and second.outputs["status"] == "unchanged"
    assert second.outputs["pr-url"] == first.outputs["pr-url"]
    assert "unchanged" in second.summary
    assert _pr_state(hub, repo) == before  # no commit, no PR, no comment

    pr_head = hub.refs(repo)["pulls"]["1"]
    hub.commit(repo, add={"model.safetensors": _perturbed_weights(tiny_bert)}, title="New weights")
    third = _run(inputs, tmp_path, "third")
    assert third.success, third.log
    assert third.outputs["changed"] == "true" and third.outputs["pr-url"] == first.outputs["pr-url"]
    assert len(hub.discussions(repo)) == 1
    assert hub.refs(repo)["pulls"]["1"] != pr_head
    assert hub.commits(repo, "refs/pr/1")[1]["id"] == pr_head  # one new commit on the same PR
    published = json.loads(hub.read_file(repo, "torch-export/export_report.json", "refs/pr/1"))
    assert published["source"]["commit"] == hub.head(repo)


def test_invalid_recipe_fails_with_an_annotation_on_its_line(hub, tiny_bert, tmp_path):
    workspace = tmp_path / "workspace"
    model = workspace / "checkpoint"
    shutil.copytree(tiny_bert, model)
    recipe = json.loads((tiny_bert / "export_config.json").read_text())
    recipe["targets"]["pt2"]["dynamic_shapes"]["input_ids"]["1"] = "sequence"  # not a declared dim
    text = json.dumps(recipe, indent=2)
    (model / "export_config.json").write_text(text)
    result = _run({"model": "checkpoint", "targets": "pt2", "publish": "pr", "repo": unique("never"),
                   "hf-token": hub.write_token}, tmp_path, "invalid", workspace)
    assert not result.success
    assert result.step("run").outcome == "failure" and result.step("run").returncode == 1
    assert result.step("publish").outcome == "skipped"
    [annotation] = result.annotations
    assert annotation["file"] == "checkpoint/export_config.json"
    assert annotation["line"] == line_of(text, '"sequence"')
    assert annotation["message"].startswith("targets.pt2.dynamic_shapes.input_ids.1:")
    assert result.outputs["status"] == "invalid" and result.outputs["changed"] == "false"
    assert "invalid recipe" in result.summary
    assert not (tmp_path / "invalid-temp" / "hfexport-output").exists()  # nothing exported


@pytest.mark.slow  # three action runs with two exports (~1.5 min); the pieces are covered by the tests above
def test_fan_out_plans_exports_each_target_alone_and_gathers_one_pr(hub, tiny_bert, tmp_path):
    """The reusable workflow's three jobs, run through the action: plan -> one export per target (artifacts)
    -> gather the downloaded artifacts and publish them as ONE pull request."""
    recipe = json.loads((tiny_bert / "export_config.json").read_text())
    recipe["targets"] = {"pt2": recipe["targets"]["pt2"],
                         "pt2-static": {"export_format": "dynamo", "mode": "forward"}}
    recipe["default_target"] = "pt2"
    repo = unique("fanout")
    hub.seed_repo(repo, tiny_bert)
    hub.commit(repo, add={"export_config.json": json.dumps(recipe, indent=2)}, title="Two targets")
    common = {"model": repo, "hf-token": hub.write_token}

    plan = _run({**common, "command": "plan"}, tmp_path, "plan")
    assert plan.success, plan.log
    matrix = json.loads(plan.outputs["matrix"])
    assert [entry["target"] for entry in matrix["include"]] == ["pt2", "pt2-static"]
    assert plan.step("publish").outcome == "skipped"

    artifacts = tmp_path / "publish-workspace" / "artifacts"
    for entry in matrix["include"]:
        job = _run({**common, "targets": entry["target"], "publish": "none"}, tmp_path, f"export-{entry['target']}")
        assert job.success, job.log
        assert job.step("publish").outcome == "skipped"
        # actions/download-artifact puts each artifact in its own folder
        shutil.copytree(job.outputs["output-dir"], artifacts / f"hfexport-{entry['target']}")
    assert hub.discussions(repo) == []

    gather = _run({**common, "command": "gather", "gather-from": "artifacts", "publish": "pr"}, tmp_path, "publish",
                  tmp_path / "publish-workspace")
    assert gather.success, gather.log
    assert gather.outputs["changed"] == "true"
    report = json.loads(Path(gather.outputs["report-json"]).read_text())
    assert sorted(report["targets"]) == ["pt2", "pt2-static"]
    [pr] = hub.discussions(repo)
    assert gather.outputs["pr-url"].endswith(f"/discussions/{pr['num']}")
    files = hub.list_files(repo, f"refs/pr/{pr['num']}")
    assert "torch-export/model.pt2" in files and "torch-export/pt2-static/model.pt2" in files
    assert len(hub.commits(repo, f"refs/pr/{pr['num']}")) == len(hub.commits(repo)) + 1  # one commit
    # the gathered report keeps the jobs' memory (each stage's largest peak and estimate): the summary and the PR
    assert set(report["memory"]["estimate_mb"]) >= {"load_model", "export"} and report["memory"]["peak_rss_mb"]
    description = pr["events"][0]["data"]["latest"]["raw"]
    for text in (gather.summary, description):
        memory = next(line for line in text.splitlines() if line.startswith("Peak memory: load "))
        assert "pt2: " in memory and "pt2-static: " in memory and "preflight estimate: load " in memory, memory


# A recipe whose pt2 export passes tracing but pins the batch to the sample's 1 (tests/test_verify.py's trap):
# verification rejects it at batch 8, a parity failure.
TRAP_RECIPE = {
    "recipe_version": 1,
    "task": "feature-extraction",
    "sample_inputs": {"text": ["The capital of France is Paris."]},
    "targets": {"pt2": {"export_format": "dynamo", "options": {"dynamic": True}}},
}


def _trap_workspace(tmp_path: Path, name: str) -> Path:
    workspace = tmp_path / f"{name}-workspace"
    (workspace / "recipes").mkdir(parents=True)
    (workspace / "recipes" / "trap.json").write_text(json.dumps(TRAP_RECIPE, indent=2))
    return workspace


def test_a_job_above_the_max_memory_input_is_refused_before_any_weight_is_read(hub, tiny_bert, tmp_path):
    repo = unique("budget")
    head = hub.seed_repo(repo, tiny_bert)
    result = _run({"model": repo, "targets": "onnx", "publish": "pr", "hf-token": hub.write_token,
                   "max-memory": "100MB"}, tmp_path, "budget")
    run = result.step("run")
    assert run.returncode == 2, result.log
    [annotation] = result.annotations
    assert "needed at the trace+convert stage" in annotation["message"]
    assert "budget is 104.9 MB" in annotation["message"]
    assert "load_model" not in result.log and "Traceback" not in result.log
    assert result.step("publish").outcome == "skipped"
    assert hub.discussions(repo) == [] and hub.refs(repo) == {"branches": {"main": head}, "tags": {}, "pulls": {}}


def test_parity_failure_fails_the_run_and_publishes_nothing(hub, tiny_bert, tmp_path):
    repo = unique("parity")
    head = hub.seed_repo(repo, tiny_bert)
    workspace = _trap_workspace(tmp_path, "parity")
    result = _run({"model": repo, "recipe": "recipes/trap.json", "publish": "pr", "hf-token": hub.write_token,
                   "upload-artifacts": "true"}, tmp_path, "parity", workspace)
    assert not result.success
    run = result.step("run")
    assert run.outcome == "failure" and run.returncode == 1, result.log
    assert [s.outcome for s in result.steps if s.name == "Upload the export"] == ["not-run"]  # always(): uploads
    assert result.step("publish").outcome == "skipped"
    assert result.outputs["status"] == "failed" and result.outputs["changed"] == "true"
    [annotation] = result.annotations
    assert annotation["level"] == "error" and annotation["title"] == "hfexport: pt2 failed parity"
    assert "batch=8" in annotation["message"]
    assert "## hfexport report" in result.summary and "failed" in result.summary
    assert hub.discussions(repo) == [] and hub.refs(repo) == {"branches": {"main": head}, "tags": {}, "pulls": {}}


@pytest.mark.slow  # a second trap export (~40 s)
def test_fail_on_parity_false_publishes_the_failed_export_flagged(hub, tiny_bert, tmp_path):
    repo = unique("parity-allowed")
    hub.seed_repo(repo, tiny_bert)
    workspace = _trap_workspace(tmp_path, "allowed")
    result = _run({"model": repo, "recipe": "recipes/trap.json", "publish": "pr", "hf-token": hub.write_token,
                   "fail-on-parity": "false"}, tmp_path, "allowed", workspace)
    assert result.success, result.log
    assert result.outputs["status"] == "failed" and result.outputs["pr-url"]
    assert [a["level"] for a in result.annotations] == ["warning"]
    [pr] = hub.discussions(repo)
    description = pr["events"][0]["data"]["latest"]["raw"]
    assert description.split("\n")[2].startswith("> [!WARNING]")  # flagged at the top, under the marker
    assert "**Parity verification failed** for `pt2`" in description


def test_bad_inputs_fail_with_one_annotation_and_no_traceback(tmp_path):
    result = _run({"model": "org/model", "publish": "sometimes"}, tmp_path, "inputs")
    assert result.step("run").returncode == 2
    [annotation] = result.annotations
    assert annotation["message"] == "input publish: expected one of none, pr, commit, got 'sometimes'"
    assert "Traceback" not in result.log
    assert "## hfexport export could not run" in result.summary
    budget = _run({"model": "org/model", "max-memory": "lots"}, tmp_path, "budget")
    assert budget.step("run").returncode == 2
    assert budget.annotations[0]["message"] == "input max-memory: 'lots' is not a memory size (e.g. 3000, 3000MB or 3GB)"
    local = _run({"model": ".", "publish": "pr"}, tmp_path, "local")  # a folder without a recipe
    assert local.step("run").returncode == 2 and "no recipe" in local.annotations[0]["message"]
