"""The format registry (`hfexport.formats`): each built-in format answers under its recipe name, and a stub format,
registered here and nowhere else, is what the layers ask: the layout names and places its files, the loader checks
them with its program, the thresholds, the gate's runtimes, the card, the job's costs and the rebind take its
answers. No engine, no torch, but in the last test: the stub, with a stub backend registered in the engine too,
runs a whole job target (plan, export, save, gate, report; docs/architecture.md, "How to add a format"). The layers
never branch on a format's name, so a new format needs no edits there."""

from __future__ import annotations

import sys
import types
from pathlib import Path
from types import SimpleNamespace

import pytest
from hfexport.formats import FormatBackend, find_format, format_backend, format_traits, formats, register_format
from hfexport.formats.backend import FormatProgram, unregister_format
from hfexport.formats.programs import check_program_files, format_program, register_program, unregister_program

STUB = "stub"


class StubFormat(FormatBackend):
    name = STUB
    label = "Stub (.stub)"
    runtime_label = "the stub runtime"
    runtime_package = "stub-runtime"
    folder = "stub"
    default_file = "model.stub"
    companion_files = ("model.idx",)
    hub_tag = "stub-tag"
    packages = ("stub-package",)
    target_name = "stb"
    options = ("dynamic",)
    fp32_tolerance = (1e-3, 1e-2, 0.999, 0.9)
    memory_factor = 7.0
    export_cost = 3.0
    runtimes = ("hfexport_test_stub_runtime",)

    def program_files(self, file: str) -> list[tuple[str, bool]]:
        return [(file, True), (file.removesuffix(".stub") + ".idx", False)]

    def load_options(self, precision):
        return {"stub_precision": precision}


class StubProgram(FormatProgram):
    name = STUB
    weights = SimpleNamespace(read=lambda folder, file: [], write=lambda *args: None)
    checked: list = []

    def check_files(self, found, file, label, source, allow_unsafe_pt2):
        self.checked.append((file, [path.name if path else None for path in found], label))


@pytest.fixture
def stub(monkeypatch):
    register_format(StubFormat)
    register_program(StubProgram)
    runtime = types.ModuleType("hfexport_test_stub_runtime")
    runtime.RUNTIME = "stub-runtime"
    runtime.check_generation = lambda folder, request: SimpleNamespace(runtime="stub-runtime", verdict="passed", seconds=None)
    monkeypatch.setitem(sys.modules, runtime.__name__, runtime)
    StubProgram.checked = []
    yield format_backend(STUB)
    unregister_format(STUB)
    unregister_program(STUB)


def test_the_built_in_formats_answer_under_their_recipe_names():
    assert [backend.name for backend in formats()] == ["onnx", "openvino", "executorch", "dynamo"]
    assert [format_backend(name).folder for name in ("onnx", "openvino", "executorch", "dynamo")] == [
        "onnx", "openvino", "executorch", "torch-export"]
    for backend in formats():
        assert format_program(backend.name).name == backend.name and format_program(backend.name).weights is not None
        assert find_format(SimpleNamespace(value=backend.name)) is backend  # the engine's ExportFormat, by its value
    with pytest.raises(KeyError, match="no export format 'tflite'"):
        format_backend("tflite")
    assert find_format("tflite") is None and format_traits("tflite").runtimes == ()


def test_layout_names_and_places_a_stub_formats_files(stub):
    from hfexport.layout import Place, artifact_name, assign_places, canonical_format, check_file_name, format_folder
    from hfexport.layout import published_name

    assert canonical_format("STUB") == STUB and format_folder(STUB) == "stub"
    assert artifact_name(STUB) == "model.stub" and artifact_name(STUB, {"method": "x"}) is None
    assert check_file_name("small.stub", STUB) == "small.stub"
    places = assign_places({"a": {"export_format": STUB, "artifact": "model.stub"},
                            "b": {"export_format": STUB, "file_name": "small.stub"}})
    assert places == {"a": Place("stub"), "b": Place("stub", "small")}
    assert published_name(places["b"], "model.stub", STUB) == "small.stub"
    assert published_name(places["b"], "model.idx", STUB) == "small.idx"  # a companion follows the variant's stem


def test_the_loader_checks_a_stub_formats_files_with_its_program(stub, tmp_path):
    from hfexport.errors import CorruptExportError
    from hfexport.safety.artifacts import checked_file

    (tmp_path / "model.stub").write_bytes(b"program")

    def fetch(name, required):
        return checked_file(tmp_path, name, source="src", required=required)

    manifest = {"export_format": STUB, "components": {"model": {"file": "model.stub"}}}
    assert check_program_files(manifest, fetch, "src") == {"model": tmp_path / "model.stub"}
    assert StubProgram.checked == [("model.stub", ["model.stub", None], "src/model.stub")]
    with pytest.raises(CorruptExportError):
        check_program_files({"export_format": STUB, "components": {"model": {"file": "gone.stub"}}}, fetch, "src")


def test_verify_the_gate_the_card_and_the_job_ask_the_stub_format(stub, tmp_path):
    from hfexport.deployment import run_checks
    from hfexport.deployment.gate import has_runtimes
    from hfexport.job.parallel import export_cost
    from hfexport.job.preflight import memory_factor
    from hfexport.rebind.weight_map import weight_writer
    from hfexport.report.card import format_tags
    from hfexport.machine import load_options
    from hfexport.verify.thresholds import default_tolerance

    assert tuple(default_tolerance(STUB).values()) == StubFormat.fp32_tolerance
    assert load_options(STUB, "f32") == {"stub_precision": "f32"}
    assert has_runtimes(STUB) and [check.runtime for check in run_checks(STUB, tmp_path, request=None)] == [
        "stub-runtime"]
    assert format_tags({"t": SimpleNamespace(export_format=STUB)}) == ["hfexport", "stub-tag"]
    target = SimpleNamespace(export_format=STUB, mode="forward")
    assert (export_cost(target), memory_factor(target)) == (3.0, 7.0)
    assert weight_writer(STUB) is StubProgram.weights


def test_an_unknown_format_gets_no_hooks_and_no_flags():
    program, traits = format_program("tflite"), format_traits("tflite")
    assert type(program) is FormatProgram and program.weights is None
    assert not (traits.runs_in_torch or traits.one_decoder_graph or traits.llm_program or traits.converts_to_float16)
    assert Path(format_program("tflite").save(None, "dir", lambda directory: directory)) == Path("dir")


@pytest.fixture
def stub_engine(stub):
    """The stub format in the engine as well (`hfexport.register_backend`): a config, an exporter that exports nothing
    (its program is a key to the eager model, kept in this process) and a runner that runs the model it names."""
    from dataclasses import dataclass

    import torch
    from hfexport import register_backend
    from hfexport.engine import export_backends
    from transformers.exporters import ExportConfigMixin, ExportMetadata, HfExporter, ModelRunner
    from transformers.exporters.metadata import record_output_structure

    models = {}

    @dataclass
    class StubConfig(ExportConfigMixin):
        export_format: str = STUB
        dynamic: bool = False
        dynamic_shapes: dict | None = None
        quantizer: object = None

    class StubExporter(HfExporter):
        export_format, config_class, program_suffix = STUB, StubConfig, ".stub"

        def export_program(self, model, sample_inputs, config):
            kwargs = {name: {"rank": value.dim(), "shape": list(value.shape),
                             "dtype": str(value.dtype).removeprefix("torch.")} for name, value in sample_inputs.items()}
            metadata = ExportMetadata(architecture=type(model).__name__, export_dtype="float32", kwargs=kwargs)
            with torch.no_grad():
                record_output_structure(metadata, model(**sample_inputs))
            models[str(id(model))] = model
            return str(id(model)), metadata

        @classmethod
        def save_program(cls, program, path):
            Path(path).write_text(program)

        @classmethod
        def load_program(cls, path):
            return models[Path(path).read_text()]

    class StubRunner(ModelRunner):
        device = torch.device("cpu")

        def __init__(self, model, metadata):
            super().__init__(metadata)
            self.model = model

        @classmethod
        def from_program(cls, program, metadata, device=None):
            return cls(program, metadata)

        def __call__(self, share_inputs=True, share_outputs=False, **kwargs):
            with torch.no_grad():
                return self.model(**kwargs)

    StubProgram.read = lambda self, path, fetch, entry, allow_unsafe_pt2: StubExporter.load_program(path)
    register_backend(StubExporter, StubRunner)
    yield
    export_backends().pop(STUB, None)
    del StubProgram.read


def test_a_stub_format_runs_a_whole_job_target(stub_engine, tiny_bert, tmp_path):
    """Registered in the tests only, the stub goes through every stage of `hfexport.job.pipeline`: the recipe takes
    its name, the plan its engine config, the save writes its files atomically, the gate reloads them through its
    program's checks and compares them with the eager model, and its report lands beside them."""
    import json

    from hfexport.job.run import run_job

    recipe = json.loads((tiny_bert / "export_config.json").read_text())
    recipe.update(default_target="stb", targets={"stb": {"export_format": STUB, "mode": "forward", "rebind": False}})
    steps = []
    report = run_job(tiny_bert, tmp_path, recipe=recipe, latency=False,
                     progress=lambda step: steps.append(step.step) if step.status == "start" else None)

    target = report.targets["stb"]
    assert (target.status, target.error, target.method) == ("ok", None, "export")
    assert steps == ["cache", "preflight", "load_model", "target", "plan", "export", "save", "verify"], steps
    assert target.plan["export_format"] == STUB and target.plan["components"]["model"]["options"] == {"dynamic": True}
    assert sorted(entry["path"] for entry in target.files) == [
        "config.json", "export.json", "export_config.json", "model.stub"]
    assert set(target.timings) == {"plan_s", "export_s", "save_s", "verify_s"}
    assert target.verification["passed"] and target.verification["reloaded_from_disk"]
    assert target.verification["probes"], "the gate compared the reloaded stub with the eager model"
    assert StubProgram.checked[0] == ("model.stub", ["model.stub", None], f"{tmp_path / 'stb'}/model.stub")
    beside = json.loads((tmp_path / "stb" / "export_report.json").read_text())
    assert beside["targets"]["stb"] == target.to_dict()
    assert json.loads((tmp_path / "export_report.json").read_text())["targets"]["stb"]["status"] == "ok"
    assert json.loads((tmp_path / "stb" / "export.json").read_text())["export_format"] == STUB


def test_the_shipped_schemas_list_the_built_in_formats_and_validation_asks_the_registry(stub):
    """The schema files list the built-in formats (a recipe's aliases too) for whoever reads them; validation takes
    the registry's word, so the stub is a format while it is registered and no longer once it is not."""
    from hfexport.errors import RecipeError
    from hfexport.recipe.validation import validate_document
    from hfexport.schema import FORMAT_ENUMS, format_enum, load_schema

    for name, (_, with_aliases) in FORMAT_ENUMS.items():
        built_in = {spelling for backend in formats() if backend.name != STUB
                    for spelling in (backend.name, *(backend.aliases if with_aliases else ()))}
        assert set(format_enum(load_schema(name), name)) == built_in
        assert STUB not in format_enum(load_schema(name), name)
    document = {"recipe_version": 1, "targets": {"stb": {"export_format": STUB, "options": {"dynamic": True}}}}
    assert validate_document(document)["targets"]["stb"]["export_format"] == STUB
    with pytest.raises(RecipeError, match="not an option of stub.*stub takes: dynamic"):
        validate_document({"recipe_version": 1, "targets": {"stb": {"export_format": STUB,
                                                                    "options": {"opset_version": 18}}}})
    unregister_format(STUB)
    with pytest.raises(RecipeError, match="targets.stb.export_format: 'stub' is not one of"):
        validate_document(document)
