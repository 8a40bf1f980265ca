"""The `hfexport` command: `show` (text and JSON), `export --json` with a clean stdout, one readable line and exit 2
for what cannot run, and a token given with --token that never shows in output or report files."""

from __future__ import annotations

import json
import re
import logging
import os
import warnings
from pathlib import Path

import pytest
from hfexport.surfaces import cli as hfexport_cli

SECRET = "hf_SECRETSECRETSECRET123"


@pytest.fixture
def run(capsys):
    """`run(*argv) -> (exit code, stdout, stderr)` through `hfexport.surfaces.cli.main` in this process."""
    environ = dict(os.environ)

    def call(*argv: str):
        capsys.readouterr()
        with warnings.catch_warnings():
            code = hfexport_cli.main([str(arg) for arg in argv])
        logging.disable(logging.NOTSET)
        captured = capsys.readouterr()
        return code, captured.out, captured.err

    yield call
    os.environ.clear()
    os.environ.update(environ)


def assert_one_readable_error(code: int, out: str, err: str, *needles: str) -> None:
    assert code == 2, (out, err)
    assert "Traceback" not in out + err
    lines = [line for line in err.strip().splitlines() if line.strip()]
    assert lines and lines[0].startswith("error:"), err
    assert len(lines) <= 3, err
    for needle in needles:
        assert needle in err, (needle, err)


# ── show ─────────────────────────────────────────────────────────────────────


def test_show_prints_components_and_dims(run, tiny_bert):
    code, out, err = run("show", tiny_bert, "--target", "onnx")
    assert code == 0, err
    assert "target onnx: ONNX / forward" in out
    assert "dims: batch [1, 8], seq [2, 64]" in out
    assert "component model" in out
    assert "input_ids" in out and "seq [2, 64]" in out and "opset_version" in out


def test_show_reads_only_the_recipe_and_never_imports_torch(tiny_bert, tiny_llama):
    """`show` used to load the engine and the model (~7-17 s, nearly all of it importing torch and the engine)."""
    import subprocess
    import sys

    code = ("import sys; from hfexport.surfaces.cli import main; codes = [main(['show', sys.argv[1]]), "
            "main(['show', sys.argv[2], '--target', 'onnx-generation'])]; "
            "print('torch imported' if 'torch' in sys.modules else 'no torch', codes)")
    result = subprocess.run([sys.executable, "-c", code, str(tiny_bert), str(tiny_llama)], capture_output=True,
                            text=True, env={**os.environ, "PYTHONPATH": str(Path(hfexport_cli.__file__).parents[2])})
    assert result.returncode == 0, result.stderr
    assert result.stdout.strip().endswith("no torch [0, 0]"), result.stdout
    assert "input_ids dynamic: {0: batch [1, 8], 1: seq [2, 64]}" in result.stdout
    assert "target onnx-generation: ONNX / generation" in result.stdout
    assert "--resolve lists them" in result.stdout  # generation components come from the model


def test_show_resolve_prints_sample_shapes_and_engine_defaults(run, tiny_bert):
    code, out, err = run("show", tiny_bert, "--target", "onnx", "--resolve")
    assert code == 0, err
    assert "input_ids: [2, 14] dynamic:" in out and '"optimize": true' in out


def test_show_json_parses(run, tiny_bert):
    code, out, _ = run("show", tiny_bert, "--target", "pt2", "--json")
    assert code == 0
    plan = json.loads(out)
    assert plan["target"] == "pt2" and plan["export_format"] == "dynamo"
    assert plan["components"]["model"]["dynamic_axes"]["input_ids"] == {"0": "batch [1, 8]", "1": "seq [2, 64]"}


def test_show_generation_target_json(run, tiny_llama):
    code, out, _ = run("show", tiny_llama, "--target", "onnx-generation", "--json")
    assert code == 0
    plan = json.loads(out)
    assert list(plan["components"]) == ["decode"]  # the example's single graph (generation.single_graph)


# ── export --json ────────────────────────────────────────────────────────────


def test_export_json_report_on_a_clean_stdout(cli, tiny_bert, tmp_path):
    """The real command, ONNX (whose exporter prints progress lines): stdout is exactly the report."""
    output = tmp_path / "out"
    result = cli("export", str(tiny_bert), "--target", "onnx", "-o", str(output), "--json")
    assert result.returncode == 0, result.stderr
    report = json.loads(result.stdout)
    assert report["status"] == "ok"
    assert report["targets"]["onnx"]["status"] == "ok"
    assert report == json.loads((output / "export_report.json").read_text())
    assert {entry["path"] for entry in report["targets"]["onnx"]["files"]} >= {"model.onnx", "export.json"}
    # not a terminal: plain progress lines, each led by the job's elapsed time; one line per step (at its end), no
    # probe lines unless -v
    lines = [line for line in result.stderr.splitlines() if line.startswith("[")]
    assert all(re.match(r"\[\d\d:\d\d\.\d\] ", line) for line in lines), lines
    assert any("✓ onnx: export " in line for line in lines) and not any("… onnx: export" in line for line in lines)
    assert not [line for line in lines if "onnx: probe " in line], lines
    assert len(lines) <= 20, lines
    assert "\x1b[" not in result.stderr  # no terminal control codes in a log


# ── What cannot run: one line, exit 2 ────────────────────────────────────────


def test_unknown_target(run, tiny_bert, tmp_path):
    code, out, err = run("export", tiny_bert, "--target", "tflite", "-o", tmp_path / "out")
    assert_one_readable_error(code, out, err, "'tflite'", "onnx, openvino, pt2, pte")
    assert not (tmp_path / "out").exists()


def test_show_unknown_target(run, tiny_bert):
    code, out, err = run("show", tiny_bert, "--target", "nope")
    assert_one_readable_error(code, out, err, "'nope'")


def test_missing_model_folder(run, tmp_path):
    code, out, err = run("export", tmp_path / "no-such-model", "-o", tmp_path / "out")
    assert_one_readable_error(code, out, err, "no-such-model")
    assert not (tmp_path / "out").exists()


def test_missing_hub_model(run, tmp_path):
    code, out, err = run("export", "user/no-such-model", "-o", tmp_path / "out")
    assert_one_readable_error(code, out, err, "user/no-such-model")


def test_invalid_recipe(run, tiny_bert, tmp_path):
    recipe = tmp_path / "recipe.json"
    recipe.write_text('{"export_format": "onnx", "opset_version": "eighteen"}')
    code, out, err = run("export", tiny_bert, "--recipe", recipe, "-o", tmp_path / "out")
    assert code == 1 and "Traceback" not in err  # an invalid recipe is a failed check: errors.exit_code
    assert "opset_version: 'eighteen' is not of type 'integer'" in err


def test_unknown_format(run, tiny_bert, tmp_path):
    recipe = tmp_path / "recipe.json"
    recipe.write_text('{"export_format": "tflite"}')
    code, out, err = run("export", tiny_bert, "--recipe", recipe, "-o", tmp_path / "out")
    assert code == 1 and "Traceback" not in err  # an invalid recipe is a failed check: errors.exit_code
    assert "export_format: 'tflite' is not one of" in err


def test_missing_recipe_file(run, tiny_bert, tmp_path):
    code, out, err = run("export", tiny_bert, "--recipe", tmp_path / "nope.json", "-o", tmp_path / "out")
    assert_one_readable_error(code, out, err, "nope.json")


def test_usage_errors_exit_2(run):
    code, _, err = run("export")
    assert code == 2 and "usage" in err
    code, _, _ = run("no-such-command")
    assert code == 2


def test_real_command_errors_have_no_traceback(cli, tmp_path):
    result = cli("export", str(tmp_path / "missing"), "-o", str(tmp_path / "out"))
    assert result.returncode == 2
    assert "Traceback" not in result.stderr and result.stdout == ""
    assert result.stderr.startswith("error:")


# ── Tokens ───────────────────────────────────────────────────────────────────


def assert_no_secret(*texts: str, folder: Path | None = None) -> None:
    for text in texts:
        assert SECRET not in text
    if folder is not None and folder.exists():
        for path in folder.rglob("*"):
            if path.is_file():
                assert SECRET.encode() not in path.read_bytes(), path


def test_bad_token_is_never_printed(run, hub, tiny_bert, tmp_path):
    hub.seed_repo("user/token-private", {name: (tiny_bert / name).read_bytes() for name in
                                         ("config.json", "export_config.json")}, private=True)
    for argv in (
        ("export", "user/token-private", "--token", SECRET, "-o", tmp_path / "out"),
        ("export", "user/token-missing", "--token", SECRET, "-o", tmp_path / "out"),
        ("validate", "user/token-private", "--token", SECRET),
        ("show", "user/token-private", "--token", SECRET),
        ("export", "user/token-private", "--token", SECRET, "-o", tmp_path / "out", "--json"),
    ):
        code, out, err = run(*argv)
        assert code == 2, (argv, out, err)
        assert "Traceback" not in err
        assert_no_secret(out, err, folder=tmp_path / "out")


def test_real_command_with_a_bad_token(cli, hub, tmp_path):
    result = cli("export", "user/token-private-2", "--token", SECRET, "-o", str(tmp_path / "out"))
    assert result.returncode == 2
    assert_no_secret(result.stdout, result.stderr, folder=tmp_path / "out")


def test_valid_token_stays_out_of_output_and_reports(run, hub, tiny_bert, tmp_path):
    """A token that works: the whole job runs from a private Hub repo, and neither the output nor any file names it."""
    hub.add_token(SECRET, user=hub.user, role="read")
    hub.seed_repo("user/token-ok", tiny_bert, private=True)
    output = tmp_path / "out"
    code, out, err = run("export", "user/token-ok", "--token", SECRET, "--target", "pt2", "-o", output, "--json")
    assert code == 0, err
    report = json.loads(out)
    assert report["targets"]["pt2"]["status"] == "ok"
    assert report["source"]["commit"] == hub.head("user/token-ok")
    assert_no_secret(out, err, folder=output)


@pytest.mark.parametrize("below", ["", "sub"])
def test_output_that_cannot_be_a_folder_is_refused_before_exporting(run, tiny_bert, tmp_path, monkeypatch, below):
    """It used to export first (a minute for a big model) and fail when saving: now it is refused before the model
    even loads."""
    import hfexport.job.run

    def no_export(*args, **kwargs):
        raise AssertionError("loaded the model to export although the output cannot be written")

    monkeypatch.setattr(hfexport.job.run, "load_model", no_export)
    blocker = tmp_path / "a-file"
    blocker.write_text("not a folder")
    code, out, err = run("export", tiny_bert, "--target", "pt2", "-o", blocker / below if below else blocker)
    assert_one_readable_error(code, out, err, "a-file exists and is not a folder")
    assert blocker.read_text() == "not a folder"


# ── The results table ────────────────────────────────────────────────────────

LONG_PARITY = ("parity: logits max abs diff 0.31 > atol 0.0001 at probe batch=8 seq=37; "
               "cosine 0.97 < 0.999 at probe batch=1 seq=2; top-1 agreement 0.5 < 1.0 at probe batch=8 seq=64")


def _report_with_a_long_failure():
    from hfexport.report.data import JobReport, TargetReport

    report = JobReport(source={"model": "examples/tiny-llama"})
    report.targets["openvino-generation"] = TargetReport(
        "openvino-generation", "openvino", "generation", status="failed", error=LONG_PARITY,
        verification={"passed": False, "probes": []}, files=[{"path": "openvino_model.bin", "bytes": 123_456_789}], timings={"export_s": 123.4, "verify_s": 12.25})
    report.targets["pt2"] = TargetReport("pt2", "dynamo", "forward", status="unchanged",
                                         unchanged_reason="an export with the same cache key is in out/pt2",
                                         files=[{"path": "model.pt2", "bytes": 12_345}])
    report.targets["pte"] = TargetReport("pte", "executorch", "forward", files=[{"path": "model.pte", "bytes": 9_999}],
                                         timings={"export_s": 3.0, "verify_s": 1.0})
    return report


def _render(report, terminal: bool) -> str:
    import io

    from rich.console import Console

    buffer = io.StringIO()
    console = Console(file=buffer, force_terminal=terminal, width=80, highlight=False, soft_wrap=True)
    hfexport_cli.print_summary(report, console)
    return buffer.getvalue()


def test_summary_fits_80_columns_and_long_messages_go_below():
    import re

    text = _render(_report_with_a_long_failure(), terminal=True)
    lines = [re.sub(r"\x1b\[[0-9;]*m", "", line) for line in text.splitlines()]
    assert max(map(len, lines)) <= 80, text
    rows = {line.split()[0]: line for line in lines if line.split() and line.split()[0] in ("openvino-generation", "pte")}
    assert rows["openvino-generation"].split()[1:4] == ["OpenVINO", "failed", "FAIL"], text  # status, parity
    assert "123.5 MB" in rows["openvino-generation"] and "123.4s" in rows["openvino-generation"]
    assert "parity" not in rows["openvino-generation"]  # the message is a note below the table, not a cell
    notes = "".join(lines[lines.index(next(line for line in lines if line.startswith("openvino-generation: "))):])
    assert notes.replace(" ", "").startswith(("openvino-generation:" + LONG_PARITY).replace(" ", ""))
    assert "pt2: an export with the same cache key is in out/pt2" in text


def test_summary_is_plain_text_when_not_a_terminal():
    text = _render(_report_with_a_long_failure(), terminal=False)
    assert "\x1b[" not in text and not set(text) & set("─│┃━╭╮")
    lines = text.splitlines()
    assert lines[0] == "hfexport · examples/tiny-llama"
    assert lines[1].split() == ["target", "format", "status", "parity", "size", "export", "verify"]
    assert lines[3].split() == ["openvino-generation", "OpenVINO", "failed", "FAIL", "123.5", "MB", "123.4s",
                                "12.2s"]
    assert f"openvino-generation: {LONG_PARITY}" in lines  # one line, whole: logs are read with grep


def test_real_export_prints_a_plain_table_to_a_pipe(cli, tiny_bert, tmp_path):
    result = cli("export", str(tiny_bert), "--target", "pt2", "-o", str(tmp_path / "out"))
    assert result.returncode == 0, result.stderr
    lines = result.stdout.splitlines()
    assert "\x1b[" not in result.stdout and "─" not in result.stdout
    assert lines[1].split()[:4] == ["target", "format", "status", "parity"]
    assert lines[3].split()[:4] == ["pt2", "torch.export", "ok", "pass"]


# ── Messages in the user's terms ─────────────────────────────────────────────


def test_validate_a_missing_folder_says_so(run, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    code, out, err = run("validate", "nosuchdir")
    assert_one_readable_error(code, out, err, "nosuchdir: no such file or folder here")
    assert "no recipe" not in err


# `python -m hfexport ARGS` with huggingface_hub's retries kept and their back-off waits (1 + 2 + 4 + 8 + 8 s per
# request to a closed port) skipped.
WITHOUT_BACKOFF_WAITS = ("import runpy, types, huggingface_hub.utils._http as http; "
                         "http.time = types.SimpleNamespace(sleep=lambda seconds: None); "
                         "runpy.run_module('hfexport', run_name='__main__', alter_sys=True)")


def test_an_unreachable_hub_is_not_reported_as_no_recipe(cli, tmp_path):
    """huggingface_hub's LocalEntryNotFoundError (offline, nothing cached) subclasses EntryNotFoundError."""
    result = cli("validate", "user/some-model", env={"HF_ENDPOINT": "http://127.0.0.1:9", "HF_HUB_ETAG_TIMEOUT": "1",
                                                     "HF_HOME": str(tmp_path / "hf")}, cwd=tmp_path,
                 python_args=("-c", WITHOUT_BACKOFF_WAITS))
    assert result.returncode == 2, result.stderr
    assert "cannot reach the Hub for user/some-model" in result.stderr and "no recipe" not in result.stderr
    assert "Traceback" not in result.stderr


def test_init_on_an_empty_folder_names_the_missing_config(run, tmp_path):
    code, out, err = run("init", tmp_path, "-o", tmp_path / "recipe.json")
    assert_one_readable_error(code, out, err, "has no config.json", "a model folder")
    assert "model_type" not in err
    code, out, err = run("init", tmp_path / "missing", "-o", tmp_path / "recipe.json")
    assert_one_readable_error(code, out, err, "missing: no such folder")


def test_progress_shows_step_starts_and_probes_only_when_verbose():
    import io

    from hfexport.progress import Step
    from hfexport.surfaces.cli import _JobProgress
    from rich.console import Console

    def lines(verbose):
        out = io.StringIO()
        progress = _JobProgress(Console(file=out, force_terminal=False, width=120), verbose=verbose)
        for step in (Step("export", "start", "onnx"), Step("export", "done", "onnx", seconds=1.0),
                     Step("probe", "done", "onnx", "batch=1 seq=2", seconds=0.1),
                     Step("probe", "error", "onnx", "batch=8 seq=64: max abs 0.5", seconds=0.1)):
            progress(step)
        return out.getvalue().splitlines()

    quiet, verbose = lines(False), lines(True)
    assert len(quiet) == 2 and "✓ onnx: export" in quiet[0] and "✗ onnx: probe batch=8" in quiet[1], quiet
    assert len(verbose) == 4 and "… onnx: export" in verbose[0] and "✓ onnx: probe batch=1" in verbose[2], verbose
