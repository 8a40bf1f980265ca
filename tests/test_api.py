"""The Python API: the seed API kept (`supports_export_format`, `AutoExportConfig.from_dict`, `from_config`), the
recipe-bound `AutoHfExporter.from_pretrained`, the engine's names re-exported from `hfexport`, a cheap
`import hfexport`, and the recipe's option table kept in step with the engine's config dataclasses."""

from __future__ import annotations

import dataclasses
import json
import subprocess
import sys
import warnings
from pathlib import Path

import hfexport
import pytest
import transformers.exporters as engine
import transformers.exporters.utils as engine_utils
from hfexport import AutoExportConfig, AutoHfExporter
from hfexport.errors import RecipeError, SourceError, UnknownTargetError
from hfexport.recipe.validation import FORMAT_OPTIONS
from hfexport.schema import load_schema
from transformers.exporters import (
    DynamoConfig,
    ExecutorchConfig,
    ExportFormat,
    HfExporter,
    OnnxConfig,
    OnnxExporter,
    OpenVINOConfig,
)

ROOT = Path(__file__).resolve().parent.parent
ENGINE_CONFIGS = {"dynamo": DynamoConfig, "onnx": OnnxConfig, "executorch": ExecutorchConfig, "openvino": OpenVINOConfig}
SET_ELSEWHERE = {"export_format", "dynamic_shapes", "quantizer"}


# ── Seed API ─────────────────────────────────────────────────────────────────


@pytest.mark.parametrize("export_format", ["onnx", "dynamo", "openvino", "executorch"])
def test_supports_installed_formats(export_format):
    with warnings.catch_warnings():
        warnings.simplefilter("error", UserWarning)  # what supports_export_format warns with
        assert AutoHfExporter.supports_export_format({"export_format": export_format}) is True


def test_unknown_format_is_unsupported_with_a_warning_naming_both_halves():
    with pytest.warns(UserWarning) as caught:
        assert AutoHfExporter.supports_export_format({"export_format": "tflite"}) is False
    message = str(caught[0].message)
    assert "'tflite'" in message and "No config class and no exporter" in message
    assert "register_backend" in message and "onnx" in message


def test_registered_config_whose_exporter_lacks_packages(monkeypatch):
    from transformers.exporters.auto import EXPORT_BACKENDS

    @dataclasses.dataclass
    class ToyConfig(DynamoConfig):
        export_format: str = "toy"

    class ToyExporter(HfExporter):
        export_format = "toy"
        config_class = ToyConfig
        program_suffix = ".toy"
        required_packages = ["hfexport_no_such_package"]

        def export_program(self, model, sample_inputs, config):
            raise NotImplementedError

        @classmethod
        def save_program(cls, program, path):
            raise NotImplementedError

        @classmethod
        def load_program(cls, path):
            raise NotImplementedError

    monkeypatch.setattr("transformers.exporters.auto.EXPORT_BACKENDS", dict(EXPORT_BACKENDS))
    hfexport.register_backend(ToyExporter)
    with pytest.warns(UserWarning) as caught:
        assert AutoHfExporter.supports_export_format({"export_format": "toy"}) is False
    message = str(caught[0].message)
    assert "ToyConfig is registered" in message and "hfexport_no_such_package" in message


def test_auto_export_config_from_dict_gives_the_engine_enum():
    config = AutoExportConfig.from_dict({"export_format": "onnx", "opset_version": 18})
    assert type(config) is OnnxConfig
    assert config.export_format is ExportFormat.ONNX
    assert config.opset_version == 18
    with pytest.raises(ValueError, match="registered formats"):
        AutoExportConfig.from_dict({"export_format": "tflite"})


def test_from_config_gives_the_engine_exporter():
    assert isinstance(AutoHfExporter.from_config(OnnxConfig(opset_version=18)), OnnxExporter)
    assert isinstance(AutoHfExporter.from_config({"export_format": "onnx"}), OnnxExporter)


# ── Re-exports and import cost ───────────────────────────────────────────────


def test_engine_names_are_re_exported_as_they_are():
    own = {"AutoHfExporter", "AutoExportConfig", "ExportedModel"}  # extended by hfexport (subclasses)
    public = [name for name in engine.__all__ if name[0].isupper() or name == "register_backend"]
    assert len(public) >= 25
    for name in public:
        value = getattr(hfexport, name)
        if name in own:
            assert issubclass(value, getattr(engine, name)), name
            assert value is not getattr(engine, name)
        else:
            assert value is getattr(engine, name), name
        assert name in hfexport.__all__
    for name in ("decompose_for_generation", "get_leaf_tensors", "prepare_for_export"):
        assert getattr(hfexport, name) is getattr(engine_utils, name)
    with pytest.raises(AttributeError):
        hfexport.NoSuchName  # noqa: B018


def test_every_name_in_all_resolves():
    for name in hfexport.__all__:
        assert getattr(hfexport, name) is not None


def _python(code: str) -> str:
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300,
                            env={"PYTHONPATH": str(ROOT / "library"), "PATH": "/usr/bin:/bin"})
    assert result.returncode == 0, result.stderr
    return result.stdout.strip()


def test_import_hfexport_does_not_import_torch():
    loaded = json.loads(_python(
        "import sys, json, hfexport; "
        "print(json.dumps([m for m in ('torch', 'transformers', 'onnx', 'openvino', 'executorch') if m in sys.modules]))"
    ))
    assert loaded == []


def test_validating_a_recipe_does_not_import_torch():
    loaded = _python(
        "import sys; from hfexport.surfaces.cli import main; code = main(['validate', 'examples/tiny-bert']); "
        "print(code, 'torch' in sys.modules)"
    )
    assert loaded.splitlines()[-1] == "0 False"


# ── Recipe options versus the engine's config dataclasses ────────────────────


@pytest.mark.parametrize("export_format", list(ENGINE_CONFIGS))
def test_format_options_match_the_engine_config_fields(export_format):
    fields = {field.name for field in dataclasses.fields(ENGINE_CONFIGS[export_format])} - SET_ELSEWHERE
    assert set(FORMAT_OPTIONS[export_format]) == fields, (
        f"the engine's {ENGINE_CONFIGS[export_format].__name__} fields changed: update recipe.FORMAT_OPTIONS and the "
        "schema's options"
    )


def test_schema_options_are_the_engine_fields():
    schema = load_schema()
    every_option = set().union(*map(set, FORMAT_OPTIONS.values()))
    assert set(schema["$defs"]["options"]["properties"]) == every_option
    flat = set(schema["$defs"]["flat_recipe"]["properties"])
    assert flat == every_option | {"export_format", "dynamic_shapes"}


# ── from_pretrained ──────────────────────────────────────────────────────────


def test_from_pretrained_binds_the_default_target(tiny_bert):
    exporter = AutoHfExporter.from_pretrained(tiny_bert)
    assert exporter.target.name == "onnx" == exporter.recipe.default_target
    assert isinstance(exporter.config, OnnxConfig) and exporter.config.opset_version == 18


def test_from_pretrained_overrides_are_validated(tiny_bert):
    exporter = AutoHfExporter.from_pretrained(tiny_bert, target="onnx", opset_version=17, optimize=False)
    assert (exporter.config.opset_version, exporter.config.optimize) == (17, False)
    with pytest.raises(RecipeError, match=r"targets\.onnx\.options\.backend"):
        AutoHfExporter.from_pretrained(tiny_bert, target="onnx", backend="xnnpack")
    with pytest.raises(UnknownTargetError, match="onnx, openvino, pt2, pte"):
        AutoHfExporter.from_pretrained(tiny_bert, target="tflite")


def test_from_pretrained_reads_a_hub_repo(hub, tiny_bert):
    hub.seed_repo("user/api-bert", {name: (tiny_bert / name).read_bytes()
                                    for name in ("config.json", "export_config.json")})
    exporter = AutoHfExporter.from_pretrained("user/api-bert", target="pt2")
    assert exporter.target.export_format == "dynamo"
    assert isinstance(exporter.config, DynamoConfig)
    with pytest.raises(SourceError, match="not found"):
        AutoHfExporter.from_pretrained("user/api-missing")


def test_from_pretrained_with_a_separate_recipe(tiny_bert, tmp_path):
    recipe = tmp_path / "recipe.json"
    recipe.write_text(json.dumps({"export_format": "openvino", "compress_to_fp16": True}))
    exporter = AutoHfExporter.from_pretrained(tiny_bert, recipe=recipe)
    assert exporter.target.name == "openvino"
    assert isinstance(exporter.config, OpenVINOConfig) and exporter.config.compress_to_fp16 is True
