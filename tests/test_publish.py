"""Publishing to the local Hub over HTTP: one commit per publication, one PR per model, the card section.

Every repo name is unique per test. The session's `exported_bert` artifacts are published where an export is not
the point; the tests that change the recipe or the weights export tiny-bert's `onnx` target again (the real job).
"""

from __future__ import annotations

import json
import shutil
import uuid
from pathlib import Path

import pytest
from hfexport.errors import PublishError, PublishRefusedError
from hfexport.publication.publish import find_open_publication, parse_marker, publish
from hfexport.report.card import END, START, update_card
from hypothesis import given, settings
from hypothesis import strategies as st

EXAMPLE = Path(__file__).resolve().parents[1] / "examples" / "tiny-bert"
README = "---\nlicense: mit\ntags:\n- bert\n---\n# Tiny BERT  \n\nKeep   this text\t exactly — ünïcode, trailing spaces   \n"


def _repo(hub, readme: str | None = README) -> str:
    repo = f"user/tiny-bert-{uuid.uuid4().hex[:8]}"
    hub.seed_repo(repo, EXAMPLE)
    if readme is not None:
        hub.commit(repo, add={"README.md": readme})
    return repo


@pytest.fixture(scope="module")
def bert_out(exported_bert, tmp_path_factory) -> Path:
    """The session's tiny-bert export, onnx and pt2 targets only (a private copy)."""
    output, report = exported_bert
    out = tmp_path_factory.mktemp("publish") / "out"
    for name in ("onnx", "pt2"):
        assert report.targets[name].status == "ok", report.targets[name].error
        shutil.copytree(output / name, out / name)
    return out


def _state(hub, repo):
    return hub.refs(repo), [(d["num"], d["status"], len(d["events"])) for d in hub.discussions(repo)]


def _inputs():
    import torch

    return {"input_ids": torch.arange(2, 16, dtype=torch.long).reshape(2, 7) % 50,
            "attention_mask": torch.ones(2, 7, dtype=torch.long)}


# ── the main flow ────────────────────────────────────────────────────────────


def test_publish_opens_one_pr_that_loads_back_through_refs_pr(hub, bert_out):
    import hfexport

    repo = _repo(hub)
    main_before = hub.head(repo)
    result = publish(bert_out, repo, token=hub.write_token)
    assert (result.action, result.pr_num, result.repo_id) == ("opened", 1, repo)
    assert result.pr_url.endswith(f"/{repo}/discussions/1")
    refs = hub.refs(repo)
    assert refs["branches"]["main"] == main_before and refs["pulls"] == {"1": result.commit}
    # One commit on top of main holds everything: both targets, their reports, the card.
    pr_commits = hub.commits(repo, "refs/pr/1")
    assert pr_commits[0]["id"] == result.commit and pr_commits[0]["parents"] == [main_before]
    files = hub.list_files(repo, "refs/pr/1")
    for path in ("onnx/model.onnx", "onnx/model.onnx_data", "onnx/export.json", "onnx/export_report.json",
                 "torch-export/model.pt2", "torch-export/export_config.json", "README.md"):
        assert path in files and path in result.files
    marker = parse_marker(hub.discussions(repo)[0]["events"][0]["data"]["latest"]["raw"])
    assert marker["key"] == f"{repo}@main" and len(marker["content"]) == 64
    # The description names this PR's revision (filled in once the PR has its number) and where the recipe came from.
    description = hub.discussions(repo)[0]["events"][0]["data"]["latest"]["raw"]
    assert 'revision="refs/pr/1"' in description and "refs/pr/N" not in description, description
    assert "from this repo's export recipe (`export_config.json`, sha256 `" in description, description
    card = hub.read_file(repo, "README.md", "refs/pr/1").decode()
    assert "refs/pr/N" not in card and "from this repo's export recipe (`export_config.json`" in card
    # The description carries each stage's peak memory beside the preflight's estimate (issue 45), as read back
    # from the Hub: the load, each target's stages under their readers' names, the estimate per stage.
    from huggingface_hub import HfApi

    shown = HfApi(endpoint=hub.url, token=hub.write_token).get_discussion_details(repo, 1).events[0].content
    memory = next(line for line in shown.splitlines() if line.startswith("Peak memory: load "))
    assert "onnx: " in memory and "trace+convert " in memory and "write weights " in memory and "gate " in memory
    assert "· preflight estimate: load " in memory, memory
    # Their file lists are the files uploaded (issue 44): the loaders' names, the target's report too, counted right.
    onnx_files = sorted(path.split("/", 1)[1] for path in files if path.startswith("onnx/"))
    assert {"model.onnx_data", "export_report.json"} <= set(onnx_files), onnx_files
    for text in (description, card):
        assert "model.onnx.data" not in text
        assert all(f"| `{name}` |" in text for name in onnx_files), (onnx_files, text)
    assert f"| `onnx` | [`onnx/`](onnx) | ONNX | forward | {len(onnx_files)} |" in card, card

    # The PR's files load back from the Hub at refs/pr/1 and compute what the local artifacts compute.
    for target, field in (("onnx", "last_hidden_state"), ("pt2", "last_hidden_state")):
        remote = hfexport.load(repo, target=target, revision="refs/pr/1")
        local = hfexport.load(bert_out, target=target)
        assert getattr(remote(**_inputs()), field).equal(getattr(local(**_inputs()), field))

    # The same publication again changes nothing: no commit, no new PR, no comment.
    state = _state(hub, repo)
    again = publish(bert_out, repo, token=hub.write_token)
    assert (again.action, again.pr_num, again.pr_url) == ("unchanged", 1, result.pr_url)
    assert _state(hub, repo) == state


def test_cli_export_push_twice_changes_nothing_the_second_time(hub, bert_out, cli, tmp_path):
    """The second `export --push` is a cache hit against the PR head: nothing exported, nothing published."""
    repo = _repo(hub)
    publish(bert_out, repo, token=hub.write_token, targets=["onnx"])
    state = _state(hub, repo)
    env = hub.env(token=True)
    run = cli("export", str(EXAMPLE), "--target", "onnx", "-o", str(tmp_path / "out"), "--push", "--repo", repo,
              "--quiet", env=env)
    assert run.returncode == 0, run.stderr
    assert "nothing to publish" in run.stdout and f"{repo}/discussions/1" in run.stdout
    report = json.loads((tmp_path / "out" / "export_report.json").read_text())
    assert report["status"] == "unchanged"
    assert "already published in" in report["targets"]["onnx"]["unchanged_reason"]
    assert not (tmp_path / "out" / "onnx").exists()
    assert _state(hub, repo) == state
    assert hub.write_token not in run.stdout + run.stderr


def test_changing_the_recipe_or_the_weights_pushes_one_commit_onto_the_same_pr(hub, bert_out, tmp_path):
    from hfexport.job.run import run_job

    repo = _repo(hub)
    opened = publish(bert_out, repo, token=hub.write_token, targets=["onnx"])
    first_marker = parse_marker(hub.discussions(repo)[0]["events"][0]["data"]["latest"]["raw"])
    model = tmp_path / "model"
    shutil.copytree(EXAMPLE, model)

    def export_and_publish():
        out = tmp_path / f"out-{uuid.uuid4().hex[:6]}"
        report = run_job(model, out, targets=["onnx"], publish_repo=repo)
        assert report.targets["onnx"].status == "ok", report.targets["onnx"].error
        return report, publish(out, repo, token=hub.write_token)

    # Same model, same recipe: a cache hit against the PR head, nothing to publish.
    report = run_job(model, tmp_path / "same", targets=["onnx"], publish_repo=repo)
    assert report.targets["onnx"].status == "unchanged"

    recipe = json.loads((model / "export_config.json").read_text())
    recipe["dims"]["seq"]["max"] = 48
    (model / "export_config.json").write_text(json.dumps(recipe, indent=2))
    before = len(hub.commits(repo, "refs/pr/1"))
    _, updated = export_and_publish()
    assert (updated.action, updated.pr_num) == ("updated", opened.pr_num)
    assert len(hub.commits(repo, "refs/pr/1")) == before + 1 and hub.refs(repo)["pulls"]["1"] == updated.commit
    comments = [e["data"]["latest"]["raw"] for e in hub.discussions(repo)[0]["events"] if e["type"] == "comment"]
    assert "recipe target changed" in comments[-1] and updated.commit[:12] in comments[-1]

    from safetensors.torch import load_file, save_file

    weights = load_file(model / "model.safetensors")
    name = sorted(weights)[0]
    weights[name] = weights[name] + 0.01
    save_file(weights, model / "model.safetensors", metadata={"format": "pt"})
    report, updated_again = export_and_publish()
    assert (updated_again.action, updated_again.pr_num) == ("updated", opened.pr_num)
    assert len(hub.commits(repo, "refs/pr/1")) == before + 2
    assert len(hub.discussions(repo)) == 1  # still one PR
    comments = [e["data"]["latest"]["raw"] for e in hub.discussions(repo)[0]["events"] if e["type"] == "comment"]
    assert "model files changed" in comments[-1]
    published = json.loads(hub.read_file(repo, "onnx/export_report.json", "refs/pr/1"))
    assert published["targets"]["onnx"]["cache_key"] == report.targets["onnx"].cache_key
    # The PR description (and its marker) follows the PR head: same key, the new content hash.
    marker = parse_marker(hub.discussions(repo)[0]["events"][0]["data"]["latest"]["raw"])
    assert marker["key"] == first_marker["key"] and marker["content"] != first_marker["content"]
    assert marker["content"] in hub.commits(repo, "refs/pr/1")[0]["message"]
    readme = hub.read_file(repo, "README.md", "refs/pr/1").decode()
    assert readme.count(START) == 1 and readme.count(END) == 1


def test_commit_mode_creates_the_repo_and_commits_to_the_branch(hub, bert_out):
    repo = f"user/exports-{uuid.uuid4().hex[:8]}"
    result = publish(bert_out, repo, mode="commit", token=hub.write_token, targets=["pt2"])
    assert result.action == "committed" and result.pr_url is None
    assert hub.head(repo) == result.commit and "torch-export/model.pt2" in hub.list_files(repo)
    assert hub.discussions(repo) == []
    assert publish(bert_out, repo, mode="commit", token=hub.write_token, targets=["pt2"]).action == "unchanged"
    assert hub.head(repo) == result.commit


def test_a_merged_or_closed_pr_is_not_reused(hub, bert_out):
    from huggingface_hub import HfApi

    repo = _repo(hub)
    first = publish(bert_out, repo, token=hub.write_token, targets=["onnx"])
    HfApi().change_discussion_status(repo, first.pr_num, "closed", token=hub.write_token)
    assert find_open_publication(repo, token=hub.write_token) is None
    second = publish(bert_out, repo, token=hub.write_token, targets=["onnx"])
    assert second.action == "opened" and second.pr_num == first.pr_num + 1


# ── failures: clear messages, nothing half-made ─────────────────────────────


@pytest.mark.parametrize(
    ("token", "repo_suffix", "expected"),
    [
        ("hf_notavalidtoken12345", "", "401 unauthorized"),
        ("read", "", "403 forbidden"),
        ("write", "-missing", "not found"),
    ],
)
def test_auth_and_missing_repo_errors_are_clear_and_leave_nothing(hub, bert_out, token, repo_suffix, expected):
    repo = _repo(hub)
    value = {"read": hub.read_token, "write": hub.write_token}.get(token, token)
    state = _state(hub, repo)
    with pytest.raises(PublishError) as error:
        publish(bert_out, repo + repo_suffix, token=value, targets=["onnx"])
    message = str(error.value)
    assert expected in message and value not in message and "Traceback" not in message
    assert _state(hub, repo) == state


def test_no_token_at_all_is_refused_before_any_request(hub, bert_out, monkeypatch):
    monkeypatch.delenv("HF_TOKEN", raising=False)
    repo = _repo(hub)
    requests = len(hub.requests)
    with pytest.raises(PublishError, match="needs a Hub token with write access"):
        publish(bert_out, repo, targets=["onnx"])
    assert len(hub.requests) == requests


def test_a_dropped_connection_mid_commit_leaves_no_partial_pr(hub, bert_out):
    repo = _repo(hub)
    state = _state(hub, repo)
    hub.fail_next_commit = "drop"
    with pytest.raises(PublishError, match="connection to the Hub dropped .* nothing was published"):
        publish(bert_out, repo, token=hub.write_token)
    assert _state(hub, repo) == state and hub.refs(repo)["pulls"] == {}
    retried = publish(bert_out, repo, token=hub.write_token)
    assert retried.action == "opened" and hub.refs(repo)["pulls"] == {str(retried.pr_num): retried.commit}


def test_a_dropped_update_leaves_the_pr_where_it_was(hub, bert_out, tmp_path):
    repo = _repo(hub)
    publish(bert_out, repo, token=hub.write_token, targets=["onnx"])
    head = hub.refs(repo)["pulls"]["1"]
    hub.fail_next_commit = "drop"
    with pytest.raises(PublishError, match="dropped"):
        publish(bert_out, repo, token=hub.write_token, targets=["onnx", "pt2"])
    assert hub.refs(repo)["pulls"] == {"1": head} and len(hub.discussions(repo)) == 1


def _failed_copy(bert_out: Path, tmp_path: Path) -> Path:
    """bert_out's onnx target with its report marked as a parity failure (what `verify` writes)."""
    out = tmp_path / "failed"
    shutil.copytree(bert_out / "onnx", out / "onnx")
    path = out / "onnx" / "export_report.json"
    report = json.loads(path.read_text())
    report["status"] = report["targets"]["onnx"]["status"] = "failed"
    report["targets"]["onnx"]["error"] = "parity: last_hidden_state max_abs 0.5 > atol 0.0001"
    report["targets"]["onnx"]["verification"] = {"passed": False, "failures": ["last_hidden_state max_abs 0.5"]}
    path.write_text(json.dumps(report))
    return out


def test_what_passed_is_published_and_the_failed_target_is_listed_with_its_reason(hub, bert_out, tmp_path, cli):
    out = _failed_copy(bert_out, tmp_path)  # onnx failed parity
    shutil.copytree(bert_out / "pt2", out / "pt2")  # pt2 passed
    repo = _repo(hub)
    result = publish(out, repo, token=hub.write_token)
    assert result.action == "opened" and list(result.left_out) == ["onnx"]
    assert "max_abs 0.5" in result.left_out["onnx"]
    files = hub.list_files(repo, "refs/pr/1")
    card = hub.read_file(repo, "README.md", "refs/pr/1").decode()
    assert "torch-export/export.json" in result.files and not any(path.startswith("onnx/") for path in result.files)
    assert "torch-export/export.json" in files and not any(path.startswith("onnx/") for path in files)
    assert "Not published (did not pass verification): `onnx`: failed parity verification" in card
    assert "| `pt2` | [`torch-export/`](torch-export)" in card and "| `onnx` |" not in card
    description = hub.discussions(repo)[0]["events"][0]["data"]["latest"]["raw"]
    assert "Not published (they did not pass here; the targets above did):" in description
    assert "- `onnx`: failed parity verification: parity: last_hidden_state max_abs 0.5" in description
    assert "[!WARNING]" not in description  # nothing failed was published
    run = cli("publish", str(out), "--repo", _repo(hub), env=hub.env(token=True))
    assert run.returncode == 0, run.stderr
    assert "opened pull request" in run.stdout and "not published: onnx: failed parity verification" in run.stdout


def test_a_parity_failure_is_never_published_unless_allowed(hub, bert_out, tmp_path, cli):
    failed = _failed_copy(bert_out, tmp_path)
    repo = _repo(hub)
    state = _state(hub, repo)
    with pytest.raises(PublishRefusedError, match="onnx failed parity verification.*--allow-failed"):
        publish(failed, repo, token=hub.write_token)
    run = cli("publish", str(failed), "--repo", repo, env=hub.env(token=True))
    assert run.returncode == 1 and "not published" in run.stderr and "Traceback" not in run.stderr
    assert _state(hub, repo) == state

    allowed = publish(failed, repo, token=hub.write_token, allow_failed=True)
    assert allowed.action == "opened"
    description = hub.discussions(repo)[0]["events"][0]["data"]["latest"]["raw"]
    top = description.split("\n", 2)[2]  # after the marker line and a blank line
    assert top.startswith("> [!WARNING]\n> **Parity verification failed** for `onnx`")
    card = hub.read_file(repo, "README.md", "refs/pr/1").decode()
    assert "❌ failed" in card


def test_cli_publish_prints_the_pr_url(hub, bert_out, cli):
    repo = _repo(hub)
    run = cli("publish", str(bert_out), "--repo", repo, "--target", "onnx", env=hub.env(token=True))
    assert run.returncode == 0, run.stderr
    assert f"opened pull request {hub.url}/{repo}/discussions/1" in run.stdout
    run = cli("publish", str(bert_out), "--repo", repo, "--target", "onnx", "--json", env=hub.env(token=True))
    assert json.loads(run.stdout)["action"] == "unchanged"
    bad = cli("publish", str(bert_out), "--repo", repo, "--token", "hf_wrongwrongwrong1", env=hub.env(token=False))
    assert bad.returncode == 2 and "401" in bad.stderr and "hf_wrongwrongwrong1" not in bad.stderr


# ── the model card section ───────────────────────────────────────────────────


def _outside(text: str) -> tuple[str, str]:
    start, end = text.index(START), text.index(END) + len(END)
    return text[:start], text[end:]


def test_card_section_round_trips_through_the_hub_byte_for_byte(hub, bert_out, tmp_path):
    from huggingface_hub import ModelCard

    body = README.split("---\n", 2)[2]
    readme = README + "\n<!-- hfexport:start -->\nold section\n<!-- hfexport:end -->\n\n## After\n\ntail  \n"
    repo = _repo(hub, readme)
    publish(bert_out, repo, token=hub.write_token, targets=["onnx"])
    card_text = hub.read_file(repo, "README.md", "refs/pr/1").decode()
    before, after = _outside(card_text)
    original_before, original_after = _outside(readme)
    assert before.split("---\n", 2)[2] == original_before.split("---\n", 2)[2]  # body before the section
    assert after == original_after
    assert card_text.split("---\n", 2)[2].startswith(body)
    card = ModelCard(card_text)
    assert card.data.license == "mit" and card.data.tags == ["bert", "hfexport", "onnx"]
    section = card_text[card_text.index(START):card_text.index(END)]
    for expected in ("| `onnx` | [`onnx/`](onnx) | ONNX | forward |", '"' + repo + '", target="onnx"',
                     f'"{repo}", subfolder="onnx"', "## hfexport report"):
        assert expected in section

    # Publishing another target rewrites the section, and only the section.
    publish(bert_out, repo, token=hub.write_token, targets=["onnx", "pt2"])
    updated = hub.read_file(repo, "README.md", "refs/pr/1").decode()
    assert _outside(updated)[1] == original_after and "| `pt2` | [`torch-export/`](torch-export)" in updated
    assert ModelCard(updated).data.tags == ["bert", "hfexport", "onnx", "torch-export"]


def test_unbalanced_markers_are_refused(hub, bert_out):
    repo = _repo(hub, "# Card\n\n<!-- hfexport:start -->\nno end\n")
    with pytest.raises(PublishError, match="without the other"):
        publish(bert_out, repo, token=hub.write_token, targets=["onnx"])
    assert hub.discussions(repo) == []


SECTION_A = f"{START}\nA\n{END}"
SECTION_B = f"{START}\nB | table\n\n{END}"
# No lone "\r": huggingface_hub's ModelCard then writes a header with "\r" line breaks that its own parser does not
# read back (huggingface_hub 2.4); CRLF cards are covered by `crlf`.
text = st.text(st.characters(blacklist_categories=("Cs",), blacklist_characters="\r"), max_size=200).filter(
    lambda t: START not in t and END not in t and "---" not in t)


@settings(max_examples=200, deadline=None)
@given(body=text, tail=text, crlf=st.booleans(), header=st.booleans())
def test_update_card_keeps_everything_outside_the_markers(body, tail, crlf, header):
    from huggingface_hub import ModelCard

    newline = "\r\n" if crlf else "\n"
    prefix = f"---{newline}license: mit{newline}tags:{newline}- hfexport{newline}---{newline}" if header else ""
    original = prefix + body
    first = update_card(original, SECTION_A, ["hfexport"])
    assert first.count(START) == 1 and first.count(END) == 1
    if header:  # the tag is already there: every byte before the section is the original's
        assert first.startswith(original)
    else:  # a metadata header with the tag is added; the text follows it unchanged
        assert ModelCard(first).data.tags == ["hfexport"] and ModelCard(first).text.startswith(body)
    with_tail = first + tail
    second = update_card(with_tail, SECTION_B, ["hfexport"])
    assert _outside(second) == _outside(with_tail)
    inside = second[second.index(START):second.index(END)]  # the section itself; the text around it is the user's
    assert "B | table" in inside and "\nA\n" not in inside
