"""Atomic saves: an exception or a Ctrl-C injected into the engine's `save_program` (after it wrote a file) leaves
no target folder and no staging folder, and a previous export of the same target survives a failed re-export."""

from __future__ import annotations

import hashlib
import json
import logging
import warnings
from pathlib import Path

import pytest
from hfexport.files import save_atomically
from hfexport.job.run import run_job
from hfexport.models import load_model
from hfexport.recipe.loading import load_recipe
from hfexport.surfaces import cli
from transformers.exporters import DynamoExporter

TARGET = "pt2"  # tiny-bert's fastest target (torch.export, one component)


@pytest.fixture(scope="module")
def bert_model(tiny_bert):
    return load_model(tiny_bert, load_recipe(tiny_bert)).eval()


@pytest.fixture
def save_fails_after_first_file(monkeypatch):
    """Make the engine write its program file, then raise `error` (an exception class or instance)."""
    original = DynamoExporter.save_program
    written: list[Path] = []

    def install(error):
        def save_program(cls, program, path):
            original(program, path)
            written.append(Path(path))
            assert Path(path).is_file()
            raise error

        monkeypatch.setattr(DynamoExporter, "save_program", classmethod(save_program))
        return written

    return install


def leftovers(output: Path) -> list[str]:
    """Anything in OUTPUT that is a folder other than a finished target (staging, old copies)."""
    return sorted(path.name for path in output.iterdir() if path.is_dir() and path.name.startswith("."))


def tree_digest(folder: Path) -> dict[str, str]:
    return {path.relative_to(folder).as_posix(): hashlib.sha256(path.read_bytes()).hexdigest()
            for path in sorted(folder.rglob("*")) if path.is_file()}


def job(tiny_bert, output, bert_model, **kwargs):
    return run_job(tiny_bert, output, [TARGET], model_object=bert_model, verify=False, **kwargs)


def test_exception_mid_save_leaves_no_target_folder(tiny_bert, tmp_path, bert_model, save_fails_after_first_file):
    written = save_fails_after_first_file(OSError("disk full (injected)"))
    report = job(tiny_bert, tmp_path, bert_model)
    assert written, "the engine wrote a file before failing"
    assert report.targets[TARGET].status == "error"
    assert "disk full (injected)" in report.targets[TARGET].error
    assert not (tmp_path / TARGET).exists()
    assert leftovers(tmp_path) == []
    assert not any(path.exists() for path in written), "the half-written file went with its staging folder"
    summary = json.loads((tmp_path / "export_report.json").read_text())
    assert summary["status"] == "error" and summary["targets"][TARGET]["files"] == []


def test_a_failed_save_on_a_nearly_full_disk_says_how_much_was_free(tiny_bert, tmp_path, bert_model,
                                                                    save_fails_after_first_file, monkeypatch):
    """OpenVINO says only "iostream error" when its disk fills: the target's error names the disk's free space."""
    save_fails_after_first_file(RuntimeError("basic_ios::clear: iostream error"))
    monkeypatch.setenv("HFEXPORT_DISK_LIMIT_MB", "10")  # what the preflight and the hint read as free
    error = job(tiny_bert, tmp_path, bert_model).targets[TARGET].error
    assert "iostream error" in error and f"(10 MB free on the disk of {tmp_path / TARGET}: full?)" in error, error


def test_ctrl_c_mid_save_leaves_no_target_folder(tiny_bert, tmp_path, bert_model, save_fails_after_first_file):
    save_fails_after_first_file(KeyboardInterrupt())
    with pytest.raises(KeyboardInterrupt):
        job(tiny_bert, tmp_path, bert_model)
    assert not (tmp_path / TARGET).exists()
    assert leftovers(tmp_path) == []


def test_previous_export_survives_a_failed_re_export(tiny_bert, tmp_path, bert_model, save_fails_after_first_file):
    first = job(tiny_bert, tmp_path, bert_model)
    assert first.targets[TARGET].status == "ok"
    before = tree_digest(tmp_path / TARGET)
    assert "model.pt2" in before and "export_config.json" in before

    save_fails_after_first_file(RuntimeError("injected"))
    second = job(tiny_bert, tmp_path, bert_model, force=True)
    assert second.targets[TARGET].status == "error"
    assert tree_digest(tmp_path / TARGET) == before
    assert leftovers(tmp_path) == []

    save_fails_after_first_file(KeyboardInterrupt())
    with pytest.raises(KeyboardInterrupt):
        job(tiny_bert, tmp_path, bert_model, force=True)
    assert tree_digest(tmp_path / TARGET) == before
    assert leftovers(tmp_path) == []


def test_save_atomically_replaces_and_restores(tmp_path):
    def write(text):
        def writer(folder: Path):
            (folder / "a.txt").write_text(text)
        return writer

    save_atomically(tmp_path, "t", write("one"))
    save_atomically(tmp_path, "t", write("two"))
    assert (tmp_path / "t" / "a.txt").read_text() == "two"

    def broken(folder: Path):
        (folder / "a.txt").write_text("three")
        raise KeyboardInterrupt

    with pytest.raises(KeyboardInterrupt):
        save_atomically(tmp_path, "t", broken)
    assert (tmp_path / "t" / "a.txt").read_text() == "two"
    assert sorted(path.name for path in tmp_path.iterdir()) == ["t"]


def test_cli_ctrl_c_is_one_line_and_exit_130(tiny_bert, tmp_path, capsys, save_fails_after_first_file):
    save_fails_after_first_file(KeyboardInterrupt())
    output = tmp_path / "out"
    with warnings.catch_warnings():
        code = cli.main(["export", str(tiny_bert), "--target", TARGET, "-o", str(output), "--quiet", "--no-verify"])
    logging.disable(logging.NOTSET)
    captured = capsys.readouterr()
    assert code == 130
    assert "interrupted" in captured.err and "Traceback" not in captured.err
    assert not (output / TARGET).exists() and leftovers(output) == []
