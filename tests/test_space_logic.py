"""The Space's UI-independent logic (hfexport.surfaces.space): editor validation, errors, folders, recipe proposals."""

from __future__ import annotations

import json
import os
import shutil
import time
import uuid
import zipfile
from pathlib import Path

import pytest
from hfexport.errors import (
    PlanError,
    Problem,
    PublishRefusedError,
    RecipeError,
    SourceError,
    UnknownTargetError,
)
from hfexport.job.preflight import PreflightError
from hfexport.surfaces import space as logic
from hfexport.surfaces.failure import SpaceError, describe_failure
from hypothesis import given, settings
from hypothesis import strategies as st

EXAMPLES = Path(__file__).resolve().parent.parent / "examples"


def unique(name: str) -> str:
    return f"user/{name}-{uuid.uuid4().hex[:8]}"


def bert_recipe() -> dict:
    return json.loads((EXAMPLES / "tiny-bert" / "export_config.json").read_text())


# ── editor ───────────────────────────────────────────────────────────────────

json_values = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats(allow_nan=False, allow_infinity=False) | st.text(max_size=5),
    lambda children: st.lists(children, max_size=3) | st.dictionaries(st.text(max_size=4), children, max_size=3),
    max_leaves=12,
)


@settings(max_examples=200, deadline=None)
@given(json_values)
def test_pretty_json_is_json_dumps_indent_2(value):
    text, where = logic.pretty_json(value)
    assert text == json.dumps(value, indent=2, ensure_ascii=False) + "\n"
    assert where["$"] == 0


def test_pretty_json_maps_paths_to_their_lines():
    text, where = logic.pretty_json(bert_recipe())
    lines = text.splitlines()
    assert lines[where["targets.onnx.dynamic_shapes.input_ids.1"]].strip() == '"1": "seq"'
    assert lines[where["dims.seq.max"]].strip() == '"max": 64'
    assert lines[where["targets.pte"]].strip() == '"pte": {'


def test_valid_recipe_lists_its_targets():
    check = logic.check_recipe_text(json.dumps(bert_recipe()))
    assert check.valid and check.targets == ["onnx", "openvino", "pt2", "pte"]
    assert "Valid recipe" in check.markdown() and "`onnx`" in check.markdown()
    assert not any(label for _, label in check.highlighted())


def test_invalid_recipe_problem_is_located_on_its_line():
    recipe = bert_recipe()
    recipe["targets"]["onnx"]["dynamic_shapes"]["input_ids"]["1"] = "sequence"  # not a declared dim
    check = logic.check_recipe_text(json.dumps(recipe))
    assert not check.valid
    paths = [problem.path for problem in check.problems]
    assert "targets.onnx.dynamic_shapes.input_ids.1" in paths
    line = check.pretty.splitlines().index('          "1": "sequence"') + 1
    highlighted = [(text, label) for text, label in check.highlighted() if label]
    assert highlighted == [(f'{line} │           "1": "sequence"\n', "targets.onnx.dynamic_shapes.input_ids.1")]
    assert f"`targets.onnx.dynamic_shapes.input_ids.1` (line {line})" in check.markdown()
    # every segment together is the pretty text, each line after its number: nothing dropped, nothing added
    numbered = check.highlighted()
    assert [text.split(" │ ", 1)[1] for text, _ in numbered] == check.pretty.splitlines(keepends=True)
    assert [int(text.split(" │ ", 1)[0]) for text, _ in numbered] == list(range(1, len(numbered) + 1))
    window = check.highlighted(context=2)
    assert len(window) == 1 + 5 + 1 and window[0][0].strip() == "…" and window[-1][0].strip() == "…"
    assert window[3] == highlighted[0]


def test_problem_on_a_missing_key_is_shown_on_its_parent():
    recipe = bert_recipe()
    del recipe["targets"]["pt2"]["export_format"]
    check = logic.check_recipe_text(json.dumps(recipe))
    assert not check.valid
    labelled = [text for text, label in check.highlighted() if label]
    assert any(text.split(" │ ", 1)[1].strip().startswith('"pt2"') for text in labelled), labelled


def test_text_that_is_not_json_is_one_problem_shown_at_its_line():
    check = logic.check_recipe_text('{"recipe_version": 1,')
    assert not check.valid and not check.parsed
    assert check.problems[0].path == "$" and "not valid JSON" in check.problems[0].message
    assert check.highlighted() == [('1 │ {"recipe_version": 1,\n', "JSON syntax")]
    text = "\n".join(['{', *[f'  "k{i}": {i},' for i in range(60)], '  "end": 1', '},,broken'])
    check = logic.check_recipe_text(text)  # the case: the whole document used to be shown
    window = check.highlighted(context=4)
    assert window[0][0].strip() == "…" and len(window) == 1 + 5
    assert window[-1] == ("63 │ },,broken\n", "JSON syntax") and "(line 63)" in check.markdown()
    assert logic.check_recipe_text("").problems[0].message.startswith("empty document")


def test_recipe_for_job_uses_the_repo_recipe_unless_edited():
    from hfexport.recipe.validation import canonical_json

    recipe = bert_recipe()
    repo = canonical_json(recipe)
    assert logic.recipe_for_job(json.dumps(recipe, indent=4), repo) == (None, False)
    assert logic.recipe_for_job("", repo) == (None, False)
    edited = {**recipe, "default_target": "pt2"}
    assert logic.recipe_for_job(json.dumps(edited), repo) == (edited, True)
    with pytest.raises(RecipeError) as caught:
        logic.recipe_for_job('{"targets": {}}', repo)
    assert caught.value.problems


# ── input checks and errors ──────────────────────────────────────────────────


def test_model_ids_are_hub_repo_ids_never_local_paths(tmp_path, monkeypatch):
    assert logic.check_model_id("  org/model ") == "org/model"
    for bad in ("", "../etc/passwd", "/etc", "a b", "org/model/extra"):
        with pytest.raises(SpaceError):
            logic.check_model_id(bad)
    (tmp_path / "org" / "local").mkdir(parents=True)
    monkeypatch.chdir(tmp_path)
    with pytest.raises(SpaceError, match="not a Hub repo id"):
        logic.check_model_id("org/local")  # a folder of the Space's own disk, not a repo
    assert logic.check_revision(" refs/pr/3 ") == "refs/pr/3" and logic.check_revision("") is None
    with pytest.raises(SpaceError):
        logic.check_revision("main; rm -rf /")


def test_commands_reproduce_the_job_and_are_shell_quoted():
    assert logic.export_command("org/m", "refs/pr/2", ["onnx", "pt2"]) == \
        "hfexport export org/m --revision refs/pr/2 --target onnx --target pt2 -o out"
    assert logic.export_command("org/m", None, [], edited_recipe=True, push=True) == \
        "hfexport export org/m --recipe export_config.json -o out --push --pr"
    assert logic.export_command("org/m", "it's", []) == "hfexport export org/m --revision 'it'\"'\"'s' -o out"
    assert logic.validate_command("org/m") == "hfexport validate org/m"
    assert logic.init_command("org/m", ["onnx", "openvino"]) == \
        "hfexport init org/m --format onnx --format openvino -o export_config.json"


def test_failures_are_a_category_a_line_and_a_command_never_a_token():
    token = "hf_" + "S3cret" * 4
    cases = {
        SourceError("repository org/m not found or not accessible"): "Repository not found",
        SourceError("revision 'v9' not found in org/m"): "Revision not found",
        PublishRefusedError("target(s) onnx failed parity verification: not publishing"): "Publishing refused",
        SpaceError("Sign in required", "sign in with Hugging Face to convert models"): "Sign in required",
        RuntimeError(f"boom with {token}\nTraceback (most recent call last):\n  File x"): "Unexpected error",
        PreflightError("org/m: not enough memory: about 1.1 GB needed, 64 MB available"): "Model too large for this Space",
        UnknownTargetError("no target 'tflite'; the recipe has: onnx"): "Unknown target",
        PlanError("input 'pixel_values' is not an input of BertModel"): "Recipe does not fit the model",
    }
    for error, category in cases.items():
        failure = describe_failure(error, "hfexport export org/m -o out")
        text = failure.markdown()
        assert failure.category == category, (error, failure)
        assert "Traceback" not in text and token not in text
        assert "```sh\nhfexport export org/m -o out\n```" in text
    recipe_failure = describe_failure(RecipeError([Problem("targets.onnx.mode", "expected forward")], "x"))
    assert recipe_failure.category == "Invalid recipe"
    assert "- `targets.onnx.mode`: expected forward" in recipe_failure.markdown()


def test_hub_http_errors_keep_their_status(hub):
    from huggingface_hub import HfApi

    with pytest.raises(Exception) as caught:
        HfApi(token="hf_not_a_known_token_at_all").whoami()
    failure = describe_failure(caught.value)
    assert failure.category == "Not authorised" and "401" in failure.message
    assert "hf_not_a_known_token_at_all" not in failure.markdown()


def test_the_oauth_token_is_the_hub_token(monkeypatch, tmp_path):
    settings = logic.SpaceSettings(workdir=tmp_path)
    monkeypatch.setenv("HF_TOKEN", "hf_developer_token_1234")
    monkeypatch.delenv("SPACE_ID", raising=False)
    assert logic.hub_token(None, settings) is None  # signed out: never the Space's own token
    assert logic.hub_token("hf_user_oauth_token", settings) == "hf_user_oauth_token"
    assert logic.hub_token(logic.GRADIO_MOCK_OAUTH_TOKEN, settings) == logic.GRADIO_MOCK_OAUTH_TOKEN
    settings.use_hf_token_for_mock_login = True  # local run against a Hub that does not know the mock token
    assert logic.hub_token(logic.GRADIO_MOCK_OAUTH_TOKEN, settings) == "hf_developer_token_1234"
    monkeypatch.setenv("SPACE_ID", "org/space")  # on a Space the swap never happens
    assert logic.hub_token(logic.GRADIO_MOCK_OAUTH_TOKEN, settings) == logic.GRADIO_MOCK_OAUTH_TOKEN
    with pytest.raises(SpaceError, match="sign in"):
        logic.require_token(None, "convert models")


def test_settings_from_environment(tmp_path):
    settings = logic.SpaceSettings.from_env({"HFEXPORT_SPACE_WORKDIR": str(tmp_path), "HFEXPORT_SPACE_QUEUE_SIZE": "3",
                                             "HFEXPORT_SPACE_VERIFY": "0"})
    assert settings.workdir == tmp_path and settings.queue_size == 3 and settings.verify is False


# ── folders ──────────────────────────────────────────────────────────────────


def test_workspace_keeps_one_job_per_session_and_removes_released_and_stale_ones(tmp_path):
    workspace = logic.Workspace(tmp_path / "work", ttl_s=60)
    first = workspace.new_job("session-a")
    (first / "artifact.bin").write_bytes(b"x")
    second = workspace.new_job("session-a")
    assert not first.exists() and second.is_dir() and second.parent == first.parent
    other = workspace.new_job("session-b/../../escape")
    assert other.parent.parent == workspace.root  # session ids cannot leave the root
    workspace.release("session-a")
    assert not second.parent.exists()
    old = time.time() - 3600
    for path in (other, other.parent):
        os.utime(path, (old, old))
    assert workspace.sweep() == [other.parent]
    assert workspace.sessions() == []


def test_zip_holds_every_target_file_and_the_report(tmp_path):
    output = tmp_path / "out"
    (output / "onnx").mkdir(parents=True)
    (output / "onnx" / "model.onnx").write_bytes(b"onnx")
    (output / "export_report.json").write_text("{}")
    (output / ".onnx.partial-1234").mkdir()
    (output / ".onnx.partial-1234" / "junk").write_text("x")
    archive = logic.zip_artifacts(output, tmp_path / "a.zip")
    assert sorted(zipfile.ZipFile(archive).namelist()) == ["export_report.json", "onnx/model.onnx"]


def test_progress_log_has_one_line_per_step_and_target():
    from hfexport.progress import Step

    log = logic.ProgressLog("Converting `org/m`")
    log.add(Step("load_model", "start", None, "org/m"))
    log.add(Step("load_model", "done", None, "org/m", 1.25))
    log.add(Step("target", "start", "onnx"))
    log.add(Step("export", "start", "onnx", "onnx / forward"))
    text = log.markdown()
    assert "✓ download and load the model (1.2 s)" in text
    assert "… export `onnx`: onnx / forward" in text
    log.add(Step("export", "error", "onnx", "TorchExportError: boom", 2.0))
    assert "✗ export `onnx` (2.0 s): TorchExportError: boom" in log.markdown()
    assert log.markdown().count("export `onnx`") == 1
    log.add(Step("target", "done", "pt2", "unchanged: already published in org/m@refs/pr/1 (exports/pt2)"))
    assert "✓ already exported `pt2`: already published in org/m@refs/pr/1 (exports/pt2)" in log.markdown()


def test_progress_log_shows_how_long_a_running_step_has_run():
    from hfexport.progress import RUNNING, Step

    log = logic.ProgressLog("Converting `org/m`")
    log.add(Step("export", "start", "pte", "executorch / generation"))
    log.add(Step("export", RUNNING, "pte", "executorch / generation", 45.2))
    assert "… export `pte` (running, 45 s): executorch / generation" in log.markdown()
    log.add(Step("export", "done", "pte", "executorch / generation", 61.0))
    log.add(Step("export", RUNNING, "pte", "executorch / generation", 62.0))  # a late beat cannot reopen it
    assert "✓ export `pte` (61.0 s)" in log.markdown() and "running" not in log.markdown()
    log.add(Step("probe", "done", "pte", "batch=1 seq=2 [decode]", 0.3))
    assert "✓ parity probe `pte` (0.3 s): batch=1 seq=2 [decode]" in log.markdown()


# ── against the local Hub ────────────────────────────────────────────────────


def test_fetch_recipe_valid_invalid_missing_and_unknown(hub):
    valid = unique("bert")
    hub.seed_repo(valid, EXAMPLES / "tiny-bert")
    fetched = logic.fetch_recipe(valid, None, None)
    assert fetched.check.valid and fetched.source == f"{valid}/export_config.json"
    assert json.loads(fetched.text) == bert_recipe()

    broken = unique("broken")
    recipe = bert_recipe()
    recipe["targets"]["onnx"]["mode"] = "sideways"
    hub.seed_repo(broken, {"config.json": "{}", "export_config.json": json.dumps(recipe)})
    fetched = logic.fetch_recipe(broken, None, None)
    assert not fetched.check.valid
    assert [p.path for p in fetched.check.problems] == ["targets.onnx.mode"]
    assert [label for _, label in fetched.check.highlighted() if label] == ["targets.onnx.mode"]

    embedded = unique("embedded")
    hub.seed_repo(embedded, {"config.json": json.dumps({"export_config": {"export_format": "onnx", "opset": 1}})})
    fetched = logic.fetch_recipe(embedded, None, None)
    assert fetched.source.endswith("config.json (export_config)") and not fetched.check.valid

    missing = unique("norecipe")
    hub.seed_repo(missing, {"config.json": "{}"})
    assert logic.fetch_recipe(missing, None, None).check is None

    with pytest.raises(SourceError, match="not found"):
        logic.fetch_recipe(unique("nothing-here"), None, None)
    with pytest.raises(SourceError, match="revision"):
        logic.fetch_recipe(valid, "no-such-branch", None)


def test_signed_out_reads_never_use_the_spaces_own_token(hub, monkeypatch):
    private = unique("private")
    hub.seed_repo(private, EXAMPLES / "tiny-bert", private=True)
    monkeypatch.setenv("HF_TOKEN", hub.write_token)  # the Space's own secret, which must not leak to visitors
    with pytest.raises(SourceError, match="not found or not accessible"):
        logic.fetch_recipe(private, None, None)
    assert logic.fetch_recipe(private, None, hub.read_token).check.valid


def test_propose_recipe_opens_then_leaves_alone_then_updates_one_pr(hub):
    repo = unique("propose")
    hub.seed_repo(repo, {"config.json": "{}"})
    recipe = bert_recipe()
    token = logic.GRADIO_MOCK_OAUTH_TOKEN
    first = logic.propose_recipe(repo, recipe, token)
    assert first.action == "opened" and first.pr_num == 1 and first.pr_url.endswith("/discussions/1")
    assert hub.read_file(repo, "export_config.json", "refs/pr/1") == logic.pretty_json(recipe)[0].encode()
    again = logic.propose_recipe(repo, recipe, token)
    assert (again.action, again.pr_num) == ("unchanged", 1) and "already proposes" in again.markdown()
    changed = {**recipe, "default_target": "pt2"}
    updated = logic.propose_recipe(repo, changed, token)
    assert (updated.action, updated.pr_num) == ("updated", 1)
    assert json.loads(hub.read_file(repo, "export_config.json", "refs/pr/1"))["default_target"] == "pt2"
    assert len(hub.discussions(repo)) == 1
    assert "export_config.json" not in hub.list_files(repo)  # main untouched until the owner merges
    with pytest.raises(RecipeError):
        logic.propose_recipe(repo, {"targets": {}}, token)


def test_job_runner_reports_an_unknown_repo_as_a_failure_and_removes_its_folder(hub, tmp_path):
    settings = logic.SpaceSettings(workdir=tmp_path, verify=False)
    output = tmp_path / "job" / "out"
    output.mkdir(parents=True)
    request = logic.JobRequest(model=unique("missing"), output=output, targets=["onnx"], token=hub.read_token)
    runner = logic.JobRunner(settings)
    try:
        events = list(runner.run(request))
    finally:
        runner.close()
    finished = events[-1]
    assert isinstance(finished, logic.Finished) and finished.report is None
    assert finished.failure.category == "Repository not found"
    assert finished.failure.command == f"hfexport export {request.model} --target onnx -o out"
    assert not output.exists()
    assert not runner.busy


def test_draft_recipe_for_a_model_without_one_is_init_s_proposal(hub):
    repo = unique("draft")
    hub.seed_repo(repo, {"config.json": (EXAMPLES / "tiny-bert" / "config.json").read_bytes()})
    draft = logic.draft_recipe(repo, None, ["onnx", "dynamo"], None)
    assert draft.check.valid and draft.check.targets == ["onnx", "pt2"]
    document = json.loads(draft.text)
    assert document["task"] == "feature-extraction" and "validated_with" not in document
    assert "every target was exported" not in document["description"]  # not true of a draft
    assert f"hfexport init {repo} --format onnx --format dynamo" in draft.note


def test_validated_with_is_recorded_only_for_a_recipe_whose_every_target_passed_here():
    from hfexport.report.data import JobReport, TargetReport

    recipe = bert_recipe()
    report = JobReport(source={"model": "org/m"})
    for name in recipe["targets"]:
        report.targets[name] = TargetReport(name, recipe["targets"][name]["export_format"], "forward",
                                            verification={"passed": True})
    verified = logic.verified_recipe(recipe, report)
    document, validated = logic.finalize_proposal(recipe, verified)
    assert validated and set(document["validated_with"]) >= {"hfexport", "transformers", "torch", "onnx", "openvino",
                                                              "executorch"}
    assert logic.check_recipe_text(json.dumps(document)).valid  # still a valid recipe
    assert logic.finalize_proposal(document, verified) == (document, True)  # idempotent: the same bytes again

    report.targets["pte"].verification = {"passed": False}
    assert logic.finalize_proposal(recipe, logic.verified_recipe(recipe, report)) == (recipe, False)
    edited = {**recipe, "default_target": "pt2"}  # not the recipe that was verified
    assert logic.finalize_proposal(edited, verified) == (edited, False)
    assert logic.finalize_proposal(recipe, None) == (recipe, False)


def test_space_metadata_pins_the_installed_gradio_and_installs_hfexport():
    import re

    import gradio
    import hfexport
    import yaml

    space = Path(__file__).resolve().parent.parent / "space"
    front = re.match(r"^---\n(.*?)\n---\n", (space / "README.md").read_text(), re.S)
    metadata = yaml.safe_load(front.group(1))
    assert metadata["sdk"] == "gradio" and metadata["sdk_version"] == gradio.__version__
    assert (space / metadata["app_file"]).is_file()
    assert metadata["hf_oauth"] is True and metadata["hf_oauth_scopes"] == ["read-repos", "write-discussions"]
    requirements = (space / "requirements.txt").read_text().splitlines()
    line = next(line for line in requirements if line.startswith("hfexport"))
    assert "space" in re.search(r"\[(.*?)\]", line).group(1).split(",")
    assert line.endswith(f"=={hfexport.__version__}")


def test_a_job_past_its_time_limit_or_abandoned_is_stopped_and_the_next_job_gets_a_fresh_process(hub, tmp_path):
    repo = unique("slow")
    hub.seed_repo(repo, EXAMPLES / "tiny-bert")
    runner = logic.JobRunner(logic.SpaceSettings(workdir=tmp_path, job_timeout_s=1.0))
    try:
        output = tmp_path / "slow" / "out"
        events = list(runner.run(logic.JobRequest(repo, output, ["onnx"], token=hub.read_token)))
        failure = events[-1].failure
        assert (failure.category, events[-1].report) == ("Export crashed", None)
        assert "past its 1 s limit" in failure.message and failure.command.startswith(f"hfexport export {repo}")
        assert not output.exists()
        runner.settings.job_timeout_s = 600
        # A caller that stops listening mid-job (a closed tab): the job's process is stopped, not left to talk to
        # the next job.
        listening = runner.run(logic.JobRequest(repo, tmp_path / "abandoned" / "out", ["onnx"], token=hub.read_token))
        first = next(listening)
        assert first.step == "cache" or first.step == "preflight", first
        listening.close()
        assert runner.worker._process is None and not runner.busy
        missing = unique("missing")
        events = list(runner.run(logic.JobRequest(missing, tmp_path / "next" / "out", [], token=hub.read_token)))
        assert events[-1].failure.category == "Repository not found"
    finally:
        runner.close()
    assert runner.worker._process is None


def test_jobs_never_fall_back_to_the_spaces_own_token(hub, tmp_path, monkeypatch):
    private = unique("private-job")
    hub.seed_repo(private, EXAMPLES / "tiny-bert", private=True)
    monkeypatch.setenv("HF_TOKEN", hub.write_token)  # the Space's secret: the job process must not see it
    monkeypatch.delenv("HF_HUB_DISABLE_IMPLICIT_TOKEN", raising=False)  # as on a Space: implicit tokens allowed
    runner = logic.JobRunner(logic.SpaceSettings(workdir=tmp_path))
    try:
        events = list(runner.run(logic.JobRequest(private, tmp_path / "job" / "out", ["onnx"], token=None)))
    finally:
        runner.close()
    assert events[-1].failure.category == "Repository not found", events[-1].failure


def test_a_job_above_the_spaces_memory_is_refused_before_any_weight_is_read(hub, tmp_path, monkeypatch):
    """The Space's budget is its container's memory (the cgroup's headroom, or HFEXPORT_MEMORY_LIMIT_MB)."""
    repo = unique("budget")
    hub.seed_repo(repo, EXAMPLES / "tiny-bert")
    monkeypatch.setenv("HFEXPORT_MEMORY_LIMIT_MB", "100")  # the worker process inherits it
    runner = logic.JobRunner(logic.SpaceSettings(workdir=tmp_path))
    output = tmp_path / "out"
    try:
        events = list(runner.run(logic.JobRequest(repo, output, ["onnx"], token=hub.read_token)))
    finally:
        runner.close()
    finished = events[-1]
    assert finished.report is None and "needed at the trace+convert stage" in finished.failure.message
    assert "104.9 MB" in finished.failure.message
    assert not any(step.step == "load_model" for step in events[:-1])


def test_worker_streams_a_job_then_a_burst_of_cache_hit_events(hub, tmp_path):
    """The second job is a cache hit: its events arrive in one burst, which must all reach the caller."""
    repo = unique("burst")
    hub.seed_repo(repo, EXAMPLES / "tiny-bert")
    runner = logic.JobRunner(logic.SpaceSettings(workdir=tmp_path, verify=False, job_timeout_s=600))
    output = tmp_path / "out"
    try:
        first = list(runner.run(logic.JobRequest(repo, output, ["pt2"], token=hub.read_token)))
        assert first[-1].report is not None and first[-1].report.targets["pt2"].status == "ok", first[-1].failure
        assert [s.step for s in first[:-1] if s.status == "done"][-2:] == ["save", "target"]
        second = list(runner.run(logic.JobRequest(repo, output, ["pt2"], token=hub.read_token)))
        assert second[-1].report.targets["pt2"].status == "unchanged"
        assert any(s.step == "target" and "unchanged" in (s.detail or "") for s in second[:-1])
    finally:
        runner.close()


def test_a_recipe_from_the_editor_is_recorded_as_proposed_or_edited(tiny_bert, tmp_path):
    """What the Space sends with the editor's recipe (JobRequest.recipe_origin) reaches the report, and the card says
    it: not "this repo's export recipe" (issue 30). The job is prepared only (recipe, source, cache): no export."""
    from hfexport.job.run import JobOptions, _prepare
    from hfexport.report.card import render_section
    from hfexport.report.data import validate_report

    recipe = json.loads((tiny_bert / "export_config.json").read_text())
    bare = tmp_path / "model"  # the model without a recipe of its own: hfexport proposed one
    shutil.copytree(tiny_bert, bare, ignore=shutil.ignore_patterns("export_config.json"))
    job = _prepare(bare, tmp_path / "out", JobOptions(targets=["pt2"], recipe=recipe, recipe_origin="proposed"))
    report = job.report
    assert report.source["recipe_origin"] == "proposed"
    validate_report(report.to_dict())
    card = render_section("user/model", report)
    assert "from a recipe hfexport proposed for this model" in card and "this repo's export recipe" not in card

    # Issue 44: whether the recipe is the repo's is decided by its bytes (canonical JSON), not by what the page
    # believed: the model's own recipe sent as "edited" is the repo's, an edited one is not.
    same = _prepare(tiny_bert, tmp_path / "out-same", JobOptions(targets=["pt2"], recipe=json.loads(json.dumps(recipe)),
                                                                 recipe_origin="edited")).report
    assert "recipe_origin" not in same.source and same.source["recipe_source"].endswith("export_config.json")
    assert "this repo's export recipe" in render_section("user/model", same)
    changed = _prepare(tiny_bert, tmp_path / "out-edited", JobOptions(
        targets=["pt2"], recipe={**recipe, "description": "edited"}, recipe_origin="edited")).report
    assert changed.source["recipe_origin"] == "edited"
    assert "a recipe edited in the hfexport Space" in render_section("user/model", changed)


# ── quantized variants ───────────────────────────────────────────────────────


def test_quantized_variants_are_schema_valid_targets_with_names_that_do_not_collide():
    """Issue 30: the page's "ONNX int8" / "OpenVINO int8" add one quantized copy of each unquantized target of their
    format; the result validates (schema and quantization checks), publishes where the loaders look, and is undone by
    unticking; a name already taken gets a suffix, and neither the base's parity nor its path follows it."""
    from hfexport.layout import artifact_name

    recipe = bert_recipe()
    recipe["targets"]["onnx"]["parity"] = {"atol": 1e-6}
    recipe["targets"]["onnx-int8"] = {**recipe["targets"]["onnx"], "path": "mine"}  # a user's own target of that name
    before = json.loads(json.dumps(recipe))
    assert [key for _, key in logic.quantized_variant_choices(recipe)] == ["onnx-int8", "openvino-int8"]
    assert logic.ticked_variants(recipe) == []

    both = logic.with_quantized_variants(recipe, ["onnx-int8", "openvino-int8"])
    assert recipe == before  # never edited in place
    check = logic.check_recipe_text(logic.pretty_json(both)[0])
    assert check.valid, check.markdown()
    added = logic.variant_targets(both)
    # one per unquantized base of the format: the user's `onnx-int8` is a base too (it has no quantization)
    assert sorted(added) == ["onnx-int8-2", "onnx-int8-int8", "openvino-int8"], added
    assert set(before["targets"]) <= set(both["targets"]) and before["targets"]["onnx-int8"] == both["targets"]["onnx-int8"]
    onnx_q8 = both["targets"]["onnx-int8-2"]
    assert onnx_q8["quantization"] == {"method": "ort_dynamic"} and "parity" not in onnx_q8 and "path" not in onnx_q8
    assert onnx_q8["dynamic_shapes"] == recipe["targets"]["onnx"]["dynamic_shapes"]
    assert artifact_name("onnx", onnx_q8["quantization"]) == "model_quantized.onnx"
    assert both["targets"]["openvino-int8"]["quantization"] == {"method": "nncf_weights", "params": {"mode": "int8_asym"}}
    assert logic.ticked_variants(both) == ["onnx-int8", "openvino-int8"]

    assert logic.with_quantized_variants(both, ["onnx-int8", "openvino-int8"]) == both  # ticking again adds nothing
    assert logic.with_quantized_variants(both, []) == recipe  # unticking takes back exactly what was added
    only_onnx = logic.with_quantized_variants(both, ["onnx-int8"])
    assert "openvino-int8" not in only_onnx["targets"] and "onnx-int8-2" in only_onnx["targets"]

    assert logic.quantized_variant_choices({"export_format": "onnx"}) == []  # a flat recipe has no named targets
    long = {**recipe, "targets": {"o" * 64: recipe["targets"]["onnx"]}, "default_target": "o" * 64}
    named = logic.variant_targets(logic.with_quantized_variants(long, ["onnx-int8"]))
    assert named == ["o" * 59 + "-int8"]
    with pytest.raises(SpaceError, match="the page offers: onnx-int8, openvino-int8"):
        logic.with_quantized_variants(recipe, ["onnx-fp8"])


def test_the_outcome_says_the_status_first_and_offers_a_pr_update_only_for_what_passed():
    """Issue 44: the outcome's first line is the status; "Update PR #N publishes these targets" only when a target
    passed (never beside a disabled button); the PR's link once it is open; a failure after the table."""
    from hfexport.report.data import JobReport, TargetReport

    report = JobReport(source={"model": "org/m"})
    report.targets["onnx"] = TargetReport("onnx", "onnx", "forward", status="failed", error="parity check failed")
    failed = logic.outcome_markdown(report, pr_num=1, failure="**Parity check failed**: onnx", model="org/m")
    assert failed.startswith("### Outcome of `org/m`: ❌ the target failed"), failed
    assert "Update PR" not in failed and "Nothing to download: no target passed." in failed
    assert failed.index("| `onnx` | ❌ failed") < failed.index("**Parity check failed**")
    assert "Open PR** publishes" not in failed

    report.targets["pt2"] = TargetReport("pt2", "dynamo", "forward", verification={"passed": True})
    some = logic.outcome_markdown(report, pr_num=1, failure="**Parity check failed**: onnx")
    assert some.startswith("### Outcome: ⚠️ 1 of 2 targets passed, 1 failed"), some
    assert "**Update PR #1** publishes these targets" in some and "**Open PR** publishes the targets that passed (pt2)" in some
    opened = logic.outcome_markdown(report, pr_url="http://hub/org/m/discussions/1", pr_num=1)
    assert "Pull request: [#1](http://hub/org/m/discussions/1)." in opened and "Update PR" not in opened
    del report.targets["onnx"]
    assert logic.outcome_markdown(report).startswith("### Outcome: ✅ 1 target passed")
