"""hfexport is quiet by default: what the engine and backends print (Python or C++, stdout or stderr, warnings) goes
to the `hfexport.engine` logger, shown with HFEXPORT_LOG=info or the CLI's --verbose."""

from __future__ import annotations

import ctypes
import logging
import os
import subprocess
import sys
import warnings
from pathlib import Path

import pytest
from hfexport import logs

LIBRARY = str(Path(logs.__file__).parents[1])


class _Records(logging.Handler):
    def __init__(self):
        super().__init__()
        self.records: list[logging.LogRecord] = []

    def emit(self, record):
        self.records.append(record)


@pytest.fixture
def engine_records():
    """The engine logger's records at INFO, kept here only (not printed: the test checks nothing reached fd 1/2)."""
    handler = _Records()
    level, propagate = logs.ENGINE.level, logs.ENGINE.propagate
    logs.ENGINE.addHandler(handler)
    logs.ENGINE.setLevel(logging.INFO)
    logs.ENGINE.propagate = False
    yield handler.records
    logs.ENGINE.removeHandler(handler)
    logs.ENGINE.setLevel(level)
    logs.ENGINE.propagate = propagate


def test_engine_output_captures_python_and_c_writes_and_warnings(capfd, engine_records):
    libc = ctypes.CDLL(None)
    with logs.engine_output("export onnx"):
        print("[torch.onnx] Run decompositions...")
        print("progress 10%\rprogress 100%", file=sys.stderr)
        os.write(2, b"[cpuinfo_utils.cpp:71] Reading file /sys/devices/soc0/image_version\n")
        libc.printf(b"printf from C\n")
        warnings.warn("Version drift detected", UserWarning)
        with logs.engine_output("inner"):  # re-entrant: the outer block captures
            os.write(1, b"inner write\n")
    captured = capfd.readouterr()
    assert captured.out == "" and captured.err == "", captured
    lines = [record.getMessage() for record in engine_records]
    assert "export onnx: [torch.onnx] Run decompositions..." in lines
    assert "export onnx: [cpuinfo_utils.cpp:71] Reading file /sys/devices/soc0/image_version" in lines
    assert "export onnx: printf from C" in lines and "export onnx: inner write" in lines
    assert "export onnx: progress 100%" in lines
    assert any("UserWarning: Version drift detected" in line for line in lines), lines
    assert all(record.levelno == logging.INFO for record in engine_records)


def test_engine_output_logs_what_was_printed_when_the_block_raises(capfd, engine_records):
    with pytest.raises(RuntimeError, match="engine failed"), logs.engine_output("export pte"):
        os.write(2, b"last words\n")
        raise RuntimeError("engine failed")
    assert capfd.readouterr().err == ""
    assert "export pte: last words" in [record.getMessage() for record in engine_records]
    os.write(2, b"after\n")  # the descriptors are back
    assert capfd.readouterr().err == "after\n"


@pytest.mark.parametrize(("value", "level"), [("info", logging.INFO), ("DEBUG", logging.DEBUG), ("30", 30),
                                              ("", None), ("loud", None)])
def test_hfexport_log_levels(value, level):
    assert logs.parse_level(value) == level


def _run(code: str, *args: str, env: dict | None = None):
    return subprocess.run([sys.executable, "-c", code, *args], capture_output=True, text=True, timeout=900,
                          env={**os.environ, "PYTHONPATH": LIBRARY, **(env or {})})


def test_the_python_api_prints_nothing_unasked(tiny_bert, tmp_path):
    """A job with ONNX (torch.onnx's progress lines, version drift) and ExecuTorch (C++ cpuinfo lines on fd 2),
    after `from hfexport import AutoHfExporter` (torchao's .so failures, torch's pytree warnings at import)."""
    code = ("import sys; from hfexport import AutoHfExporter, run_job; "
            "report = run_job(sys.argv[1], sys.argv[2], targets=['onnx', 'pte']); "
            "print(report.status, file=sys.stderr)")
    result = _run(code, str(tiny_bert), str(tmp_path / "out"), env={"HFEXPORT_LOG": ""})
    assert result.returncode == 0, result.stderr
    assert result.stdout == "" and result.stderr == "ok\n", result.stderr


def test_cli_verbose_shows_the_engine_lines(cli, tiny_bert, tmp_path):
    quiet = cli("export", str(tiny_bert), "--target", "onnx", "-o", str(tmp_path / "out"), "--quiet")
    assert quiet.returncode == 0, quiet.stderr
    assert quiet.stderr == "", quiet.stderr
    verbose = cli("--verbose", "export", str(tiny_bert), "--target", "onnx", "-o", str(tmp_path / "out"), "--quiet",
                  "--force")
    assert verbose.returncode == 0, verbose.stderr
    assert "hfexport.engine: export onnx: [torch.onnx]" in verbose.stderr, verbose.stderr
    assert "[torch.onnx]" not in verbose.stdout


@pytest.mark.parametrize(("env", "setup", "expected"), [
    ("", "", ""),  # quiet by default
    ("info", "", "hfexport.engine: export onnx: [cpuinfo] hello\n"),  # HFEXPORT_LOG turns it on
    ("", "import logging; logging.basicConfig(level=logging.INFO, format='app %(name)s %(message)s'); ",
     "app hfexport.engine export onnx: [cpuinfo] hello\n"),  # or the application's own logging configuration
])
def test_library_logging_follows_hfexport_log_or_the_applications_configuration(env, setup, expected):
    code = (setup + "import os; from hfexport.logs import engine_output\n"
            "with engine_output('export onnx'):\n    os.write(2, b'[cpuinfo] hello\\n')")
    result = _run(code, env={"HFEXPORT_LOG": env})
    assert result.returncode == 0, result.stderr
    assert result.stdout == "" and result.stderr == expected
