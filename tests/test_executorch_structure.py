"""An ExecuTorch generation target in a job that starts from the model's structure (hfexport.job.structure,
`FormatProgram.gated_from_structure`): its program is exported from the loaded model (ExecuTorch's emitter refuses
the twin's stride-0 placeholders, and XNNPACK keys each weight by its bytes' sha256: docs/rebind.md, "ExecuTorch and
the structure"), but the gate lets the model go before ExecuTorch's runtime opens the program; the files are byte for
byte those of a job that loaded the model first."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from hfexport.formats.executorch.program import ExecutorchProgram
from hfexport.job.run import run_job
from hfexport.job.structure import gated_from_structure, traced_without_weights
from hfexport.recipe.data import Target
from hfexport.testing.zoo import build, make_weights_distinct

pytest.importorskip("executorch")

NARROW = {"hidden_size": 64, "intermediate_size": 128, "num_attention_heads": 4, "num_key_value_heads": 2,
          "head_dim": 16}
TARGET = {"export_format": "executorch", "mode": "generation", "options": {"dynamic": True, "backend": "xnnpack"},
          "generation": {"single_graph": True}, "parity": {"atol": 5e-4, "generate": {"max_new_tokens": 8}}}


def test_an_executorch_generation_target_is_gated_from_the_structure_not_traced_from_it():
    single = Target.from_dict("pte", TARGET)
    runner = Target.from_dict("pte", {**TARGET, "generation": {}})  # ExecuTorch's LLM runner program: the model's
    onnx = Target.from_dict("onnx", {"export_format": "onnx", "mode": "generation"})
    assert gated_from_structure(single) and not traced_without_weights(single)
    assert not gated_from_structure(runner) and not gated_from_structure(onnx)
    assert not gated_from_structure(Target.from_dict("pte", {**TARGET, "mode": "forward", "generation": {}}))


@pytest.fixture(scope="module")
def checkpoint(tmp_path_factory):
    folder = build("llama-3.2-1b", tmp_path_factory.mktemp("et-structure") / "zoo", overrides=NARROW)
    make_weights_distinct(folder, dtype="float32")
    recipe = json.loads((folder / "export_config.json").read_text())
    recipe["targets"]["pte-generation"] = TARGET
    (folder / "export_config.json").write_text(json.dumps(recipe))
    return folder


def _files(folder: Path) -> dict[str, bytes]:
    return {str(path.relative_to(folder)): path.read_bytes() for path in sorted(folder.rglob("*"))
            if path.is_file() and path.name != "export_report.json"}


def _untimed(value):
    """A verification record without its timings (`*_s`, `seconds`)."""
    if isinstance(value, dict):
        return {key: _untimed(item) for key, item in value.items() if not key.endswith("_s") and key != "seconds"}
    return [_untimed(item) for item in value] if isinstance(value, list) else value


@pytest.mark.slow
def test_the_gate_lets_the_model_go_before_executorch_opens_the_program(checkpoint, tmp_path, monkeypatch, caplog):
    import weakref

    from hfexport.job import structure
    from hfexport.verify import check

    loaded, opened = [], []

    def load_model(*args, load=structure.load_model, **kwargs):
        model = load(*args, **kwargs)
        loaded.append(weakref.ref(model))
        return model

    streamed = []
    monkeypatch.setattr(structure, "load_model", load_model)
    monkeypatch.setattr(structure, "streamed_model", lambda *args, stream=structure.streamed_model: streamed.append(
        args) or stream(*args))
    monkeypatch.setattr(check, "_load", lambda *args, load=check._load, **kwargs: opened.append(
        loaded[-1]() is None) or load(*args, **kwargs))
    report = run_job(checkpoint, tmp_path / "structure", ["pte-generation"], latency=False, runtimes=False,
                     workers=1)
    target = report.targets["pte-generation"]
    assert target.status == "ok", target.error
    assert len(loaded) == 1  # the twin planned first; the model loaded once, for the export (the gate streams it)
    assert len(streamed) == 1  # the gate's reference streamed from the shards, the loaded model let go first
    assert opened == [True]  # freed before ExecuTorch's runtime opened the program
    assert "still referenced" not in caplog.text
    assert target.verification["passed"] and target.verification["generation"]["token_agreement"] == 1.0

    monkeypatch.setattr(ExecutorchProgram, "gated_from_structure", False)  # the job loads the model first
    report = run_job(checkpoint, tmp_path / "weights", ["pte-generation"], latency=False, runtimes=False, workers=1)
    assert report.targets["pte-generation"].status == "ok", report.targets["pte-generation"].error
    assert _untimed(report.targets["pte-generation"].verification) == _untimed(target.verification)  # the same gate
    gated, weights = _files(tmp_path / "structure" / "pte-generation"), _files(tmp_path / "weights" / "pte-generation")
    assert gated.keys() == weights.keys() and "decode.pte" in gated and "decode.ptd" in gated
    assert [name for name in gated if gated[name] != weights[name]] == []
