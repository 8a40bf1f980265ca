"""A float32 OpenVINO generation target exported from the model's structure (issue 45,
`hfexport.formats.openvino.structure`): the placeholder twin converted with its placeholders' constants file-backed,
the float32 IR saved and the weights written into its `.bin` from the checkpoint's shards through the weight map, no
compress step. The files are those the export from the loaded model writes: the `.bin` and the manifest (its weight
map) byte for byte, the `.xml` but for OpenVINO's generated node names."""

from __future__ import annotations

import json
import re

import pytest
from hfexport.job.run import run_job
from hfexport.testing.zoo import build, make_weights_distinct

TARGET = "openvino-generation"
# Llama-3.2-1B's published config narrowed to run in seconds (as tests/test_structure_export.py)
NARROW = {"hidden_size": 64, "intermediate_size": 128, "num_attention_heads": 4, "num_key_value_heads": 2,
          "head_dim": 16}
REPORT_FILES = {"export_report.json"}  # timings and memory differ from run to run


def _graph(xml: str) -> str:
    """An `.xml` without the names OpenVINO numbers per process (`Constant_13228`, `Result_31536,string_output`) and
    the layer ids."""
    return re.sub(r'_\d+(?=[",])', "", re.sub(r' (?:id|name)="[^"]*"', "", xml))


def test_a_float32_target_is_traced_without_weights_but_not_one_compressed_to_float16():
    from hfexport.formats.programs import format_program

    program = format_program("openvino")
    assert program.traced_without_weights(None)
    assert program.traced_without_weights(None, {"dynamic": True})
    assert not program.traced_without_weights(None, {"compress_to_fp16": True})  # an out-of-range weight stays f32


@pytest.mark.parametrize("dtype", ["float32", pytest.param("bfloat16", marks=pytest.mark.slow)])
def test_the_structure_export_writes_the_float32_files_the_weights_export_writes(tmp_path, monkeypatch, dtype):
    from hfexport.formats.openvino import program
    from hfexport.formats.openvino import structure as openvino_structure
    from hfexport.job import pipeline, run, structure

    monkeypatch.setattr(openvino_structure, "FILE_BACKED_MIN_BYTES", 0)  # the narrow model's constants file-backed too
    folder = build("llama-3.2-1b", tmp_path / "model", overrides=NARROW)
    make_weights_distinct(folder, dtype=dtype)
    loaded, written = [], []
    for module in (run, structure):
        monkeypatch.setattr(module, "load_model", lambda *args, load=module.load_model, **kwargs: loaded.append(args)
                            or load(*args, **kwargs))
    monkeypatch.setattr(pipeline, "write_weights", lambda *args, write=pipeline.write_weights: written.append(args)
                        or write(*args))
    options = {"verify": False, "latency": False, "runtimes": False, "workers": 1}
    report = run_job(folder, tmp_path / "structure", [TARGET], **options)
    assert report.targets[TARGET].status == "ok", report.targets[TARGET].error
    assert loaded == [] and len(written) == 1  # planned and exported on the twin, the weights read from the shards
    monkeypatch.setattr(program.OpenvinoProgram, "traced_without_weights", lambda self, *args: False)
    report = run_job(folder, tmp_path / "weights", [TARGET], **options)
    assert report.targets[TARGET].status == "ok", report.targets[TARGET].error
    assert loaded and len(written) == 1  # the export from the loaded model, its weight map recorded from it

    structure_files, weights_files = tmp_path / "structure" / TARGET, tmp_path / "weights" / TARGET
    files = sorted(path.name for path in structure_files.iterdir() if path.name not in REPORT_FILES)
    assert files == sorted(path.name for path in weights_files.iterdir() if path.name not in REPORT_FILES)
    for name in files:
        mine, theirs = (structure_files / name).read_bytes(), (weights_files / name).read_bytes()
        if name.endswith(".xml"):  # the graph and the tokenizer models: node names numbered per process
            assert _graph(mine.decode()) == _graph(theirs.decode()), name
        else:
            assert mine == theirs, name
    manifest = json.loads((structure_files / "export.json").read_text())
    assert manifest["weight_map"]["tensors"]  # rebindable: the float32 IR's weight map recorded
