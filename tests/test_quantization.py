"""Quantization from recipes: validation with JSON paths, conversion to the engine's objects, calibration sources
(inline, model repo file local and on the Hub, Hub dataset repo), and quantized exports that pass their gates.

The default run covers validation, conversion, calibration (plans only, nothing traced) and the MiniLM ORT dynamic
int8 job against its fp32 sibling. The OpenVINO, generation and ExecuTorch exports are marked slow.
"""

from __future__ import annotations

import copy
import dataclasses
import json
import shutil
from pathlib import Path

import pytest
from hfexport.errors import PlanError, RecipeError
from hfexport.recipe.loading import load_recipe
from hfexport.report.markdown import report_markdown

DIMS = {"batch": {"min": 1, "max": 8}, "seq": {"min": 2, "max": 64}}
SHAPES = {"input_ids": {"0": "batch", "1": "seq"}}
TEXTS = ["Calibration text number one.", "A second sentence for ranges.", "Short one.",
         "The fourth calibration sample is a little longer than the others."]


def recipe_with(quantization: dict | None, export_format: str = "onnx", mode: str = "forward", **target) -> dict:
    """A one-target recipe (tiny-bert shaped) whose target has `quantization`."""
    body = {"export_format": export_format, "mode": mode, **target}
    if mode == "forward":
        body.setdefault("dynamic_shapes", SHAPES)
    if quantization is not None:
        body["quantization"] = quantization
    return {"recipe_version": 1, "dims": DIMS, "sample_inputs": {"text": TEXTS[:2]}, "targets": {"t": body}}


def problems_of(document: dict) -> dict[str, str]:
    with pytest.raises(RecipeError) as caught:
        load_recipe(document)
    return {problem.path: problem.message for problem in caught.value.problems}


# ── Validation: every invalid section is a RecipeError with its JSON path ─────

Q = "targets.t.quantization"
INVALID = {
    "unknown method": ({"method": "gptq"}, "onnx", f"{Q}.method", "ort_dynamic"),
    "ort on openvino": ({"method": "ort_dynamic"}, "openvino", f"{Q}.method", "allowed combinations: ort_dynamic: onnx"),
    "ort on executorch": ({"method": "ort_static", "calibration": {"source": "sample_inputs"}}, "executorch",
                          f"{Q}.method", "allowed combinations"),
    "nncf on dynamo": ({"method": "nncf_weights"}, "dynamo", f"{Q}.method", "nncf_weights: openvino, onnx"),
    "pt2e without preset": ({"method": "pt2e"}, "executorch", f"{Q}.preset", "xnnpack_int8_dynamic_per_channel"),
    "unknown preset": ({"method": "pt2e", "preset": "xnnpack_int4"}, "executorch", f"{Q}.preset", "not a PT2E preset"),
    "x86 preset on executorch": ({"method": "pt2e", "preset": "x86_inductor_int8_static",
                                  "calibration": {"source": "sample_inputs"}}, "executorch", f"{Q}.preset",
                                 "presets for executorch: xnnpack_int8_dynamic_per_channel"),
    "xnnpack preset on onnx": ({"method": "pt2e", "preset": "xnnpack_int8_dynamic_per_channel"}, "onnx",
                               f"{Q}.preset", "does not lower to onnx"),
    "preset on ort": ({"method": "ort_dynamic", "preset": "xnnpack_int8_dynamic_per_channel"}, "onnx", f"{Q}.preset",
                      "pt2e only"),
    "class path as preset": ({"method": "pt2e", "preset": "torchao.XNNPACKQuantizer"}, "executorch", f"{Q}.preset",
                             "does not match"),
    "unknown param": ({"method": "ort_dynamic", "params": {"weight_typ": "int8"}}, "onnx", f"{Q}.params.weight_typ",
                      "it takes: weight_type"),
    "unknown ORT type": ({"method": "ort_dynamic", "params": {"weight_type": "int3"}}, "onnx",
                         f"{Q}.params.weight_type", "'int8', 'uint8'"),
    "int4 in ORT dynamic": ({"method": "ort_dynamic", "params": {"weight_type": "int4"}}, "onnx",
                            f"{Q}.params.weight_type", "expected one of"),
    "raw enum repr": ({"method": "ort_static", "params": {"calibrate_method": "CalibrationMethod.MinMax"},
                       "calibration": {"source": "sample_inputs"}}, "onnx", f"{Q}.params.calibrate_method", "'minmax'"),
    "unknown NNCF mode": ({"method": "nncf_weights", "params": {"mode": "int5_sym"}}, "openvino", f"{Q}.params.mode",
                          "'int4_sym'"),
    "ratio out of range": ({"method": "nncf_weights", "params": {"mode": "int4_sym", "ratio": 1.5}}, "openvino",
                           f"{Q}.params.ratio", "(0, 1]"),
    "group size zero": ({"method": "nncf_weights", "params": {"mode": "int4_sym", "group_size": 0}}, "openvino",
                        f"{Q}.params.group_size", "or -1"),
    "bool as string": ({"method": "ort_dynamic", "params": {"per_channel": "yes"}}, "onnx", f"{Q}.params.per_channel",
                       "true or false"),
    "ignored scope key": ({"method": "nncf_weights", "params": {"ignored_scope": {"layers": ["x"]}}}, "openvino",
                          f"{Q}.params.ignored_scope", "unknown key 'layers'"),
    "gptq on onnx": ({"method": "nncf_weights", "params": {"mode": "int4_sym", "gptq": True},
                      "calibration": {"source": "texts", "texts": TEXTS}}, "onnx", f"{Q}.params.gptq", "openvino only"),
    "nf4 on onnx": ({"method": "nncf_weights", "params": {"mode": "nf4"}}, "onnx", f"{Q}.params.mode",
                    "not available on onnx"),
    "pt2e params": ({"method": "pt2e", "preset": "xnnpack_int8_dynamic_per_channel", "params": {"per_channel": True}},
                    "executorch", f"{Q}.params.per_channel", "its preset decides everything"),
    "nncf preset at top": ({"method": "nncf_quantize", "preset": "mixed", "calibration": {"source": "sample_inputs"}},
                           "openvino", f"{Q}.preset", "params.preset"),
    "nested params": ({"method": "ort_dynamic", "params": {"extra_options": {"a": {"b": 1}}}}, "onnx",
                      f"{Q}.params.extra_options.a", "not valid"),
    "ort_static without data": ({"method": "ort_static"}, "onnx", f"{Q}.calibration", "calibrates on data and has none"),
    "nncf_quantize without data": ({"method": "nncf_quantize"}, "openvino", f"{Q}.calibration", "has none"),
    "pt2e static without data": ({"method": "pt2e", "preset": "xnnpack_int8_static_per_channel"}, "executorch",
                                 f"{Q}.calibration", "has none"),
    "awq without data": ({"method": "nncf_weights", "params": {"mode": "int4_sym", "awq": True}}, "openvino",
                         f"{Q}.calibration", "has none"),
    "mixed precision without data": ({"method": "nncf_weights", "params": {"mode": "int4_sym", "ratio": 0.8}},
                                     "openvino", f"{Q}.calibration", "has none"),
    "data-free with data": ({"method": "ort_dynamic", "calibration": {"source": "sample_inputs"}}, "onnx",
                            f"{Q}.calibration", "data-free"),
    "int4 that reads no data, with data": ({"method": "nncf_weights", "params": {"mode": "int4_sym"},
                                            "calibration": {"source": "texts", "texts": TEXTS}}, "openvino",
                                           f"{Q}.calibration", "data-free"),
    "unknown source": ({"method": "ort_static", "calibration": {"source": "wikipedia"}}, "onnx",
                       f"{Q}.calibration.source", "sample_inputs"),
    "texts without texts": ({"method": "ort_static", "calibration": {"source": "texts"}}, "onnx", f"{Q}.calibration",
                            "needs 'texts'"),
    "single text": ({"method": "ort_static", "calibration": {"source": "texts", "texts": ["one"]}}, "onnx",
                    f"{Q}.calibration.texts", "allow_single_sample"),
    "one sample requested": ({"method": "ort_static", "calibration": {"source": "texts", "texts": TEXTS,
                                                                      "num_samples": 1}}, "onnx",
                             f"{Q}.calibration.num_samples", "single sample"),
    "dataset without repo": ({"method": "ort_static", "calibration": {"source": "dataset", "path": "a.txt"}}, "onnx",
                             f"{Q}.calibration", "needs 'repo'"),
    "jsonl without field": ({"method": "ort_static", "calibration": {"source": "repo_file", "path": "c.jsonl"}},
                            "onnx", f"{Q}.calibration.field", "field"),
    "field on txt": ({"method": "ort_static", "calibration": {"source": "repo_file", "path": "c.txt", "field": "x"}},
                     "onnx", f"{Q}.calibration.field", "one sample per line"),
    "parquet file": ({"method": "ort_static", "calibration": {"source": "dataset", "repo": "u/d",
                                                             "path": "d.parquet", "field": "text"}}, "onnx",
                     f"{Q}.calibration.path", ".jsonl"),
    "revision on repo_file": ({"method": "ort_static", "calibration": {"source": "repo_file", "path": "c.txt",
                                                                       "revision": "v1"}}, "onnx",
                              f"{Q}.calibration.revision", "does not apply"),
    "path escaping the repo": ({"method": "ort_static", "calibration": {"source": "repo_file",
                                                                        "path": "../secrets.txt"}}, "onnx",
                               f"{Q}.calibration.path", "does not match"),
}


@pytest.mark.parametrize("case", list(INVALID))
def test_invalid_quantization_is_a_recipe_error_with_its_path(case):
    section, export_format, path, fragment = INVALID[case]
    problems = problems_of(recipe_with(section, export_format))
    assert path in problems, f"{case}: expected a problem at {path}, got {problems}"
    assert fragment in problems[path], f"{case}: {problems[path]!r} lacks {fragment!r}"


def test_executorch_quantization_needs_the_xnnpack_backend():
    problems = problems_of(recipe_with({"method": "pt2e", "preset": "xnnpack_int8_dynamic_per_channel"}, "executorch",
                                       options={"backend": "cuda"}))
    assert "XNNPACK" in problems["targets.t.options.backend"]


@pytest.mark.parametrize("section, export_format", [
    ({"method": "ort_dynamic", "params": {"weight_type": "int8", "per_channel": True, "nodes_to_exclude": ["/a/b"]}},
     "onnx"),
    ({"method": "ort_static", "params": {"quant_format": "qdq", "activation_type": "uint8", "weight_type": "int8",
                                         "calibrate_method": "entropy", "extra_options": {"ActivationSymmetric": True}},
      "calibration": {"source": "texts", "texts": TEXTS}}, "onnx"),
    ({"method": "nncf_weights", "params": {"mode": "int8_sym"}}, "openvino"),
    ({"method": "nncf_weights", "params": {"mode": "int4_asym", "group_size": 32, "ratio": 0.8, "awq": True,
                                           "sensitivity_metric": "max_activation_variance",
                                           "ignored_scope": {"patterns": [".*lm_head.*"], "validate": False}},
      "calibration": {"source": "dataset", "repo": "user/calib", "revision": "v1", "path": "data/train.jsonl",
                      "field": "text", "num_samples": 64}}, "openvino"),
    ({"method": "nncf_weights", "params": {"mode": "int4_sym"}}, "onnx"),
    ({"method": "nncf_quantize", "params": {"preset": "mixed", "target_device": "cpu", "subset_size": 100},
      "calibration": {"source": "repo_file", "path": "calibration.txt"}}, "onnx"),
    ({"method": "pt2e", "preset": "xnnpack_int8_dynamic_per_channel"}, "executorch"),
    ({"method": "pt2e", "preset": "xnnpack_int8_static_per_channel", "calibration": {"source": "sample_inputs"}},
     "executorch"),
    ({"method": "pt2e", "preset": "x86_inductor_int8_static", "calibration": {"source": "sample_inputs"}}, "openvino"),
    ({"method": "pt2e", "preset": "x86_inductor_int8_dynamic"}, "dynamo"),
])
def test_valid_sections_load(section, export_format):
    recipe = load_recipe(recipe_with(section, export_format))
    assert recipe.target("t").quantization == section


def test_validation_happens_before_any_weights_are_read(tmp_path, tiny_bert, cli):
    """A folder holding only a recipe: `hfexport validate` and `from_pretrained` reject the section (no weights)."""
    (tmp_path / "export_config.json").write_text(json.dumps(recipe_with({"method": "nncf_weights"}, "dynamo")))
    result = cli("validate", str(tmp_path))
    assert result.returncode == 1, result.stdout + result.stderr
    assert f"{Q}.method:" in result.stdout + result.stderr
    assert "Traceback" not in result.stderr
    from hfexport import AutoHfExporter

    with pytest.raises(RecipeError, match="allowed combinations"):
        AutoHfExporter.from_pretrained(tmp_path)


# ── Conversion: plain JSON to the engine's objects and enums ─────────────────


def _quantizer(section: dict, export_format: str):
    from hfexport.quantization.quantizer import build_quantizer

    return build_quantizer(load_recipe(recipe_with(section, export_format)).target("t"))


def test_ort_params_become_onnxruntime_enums():
    from onnxruntime.quantization import CalibrationMethod, QuantFormat, QuantType
    from transformers.exporters import (
        OnnxRuntimeDynamicConfig,
        OnnxRuntimeQuantizer,
        OnnxRuntimeStaticConfig,
    )

    dynamic = _quantizer({"method": "ort_dynamic", "params": {"weight_type": "uint8", "per_channel": True}}, "onnx")
    assert isinstance(dynamic, OnnxRuntimeQuantizer) and isinstance(dynamic.config, OnnxRuntimeDynamicConfig)
    assert dynamic.config.weight_type is QuantType.QUInt8 and dynamic.config.per_channel is True
    static = _quantizer({"method": "ort_static", "params": {
        "quant_format": "qoperator", "activation_type": "uint8", "weight_type": "int8", "calibrate_method": "entropy",
        "op_types_to_quantize": ["MatMul"]}, "calibration": {"source": "texts", "texts": TEXTS}}, "onnx")
    assert isinstance(static.config, OnnxRuntimeStaticConfig)
    assert static.config.quant_format is QuantFormat.QOperator
    assert static.config.activation_type is QuantType.QUInt8 and static.config.weight_type is QuantType.QInt8
    assert static.config.calibrate_method is CalibrationMethod.Entropy
    assert static.config.to_kwargs()["op_types_to_quantize"] == ["MatMul"]
    assert static.calibration_dataset is None  # calibration is attached per component by the plan


def test_nncf_params_become_nncf_enums_and_objects():
    import nncf
    from transformers.exporters import (
        NNCFOnnxQuantizer,
        NNCFOpenVINOQuantizer,
        NNCFQuantizationConfig,
        NNCFWeightCompressionConfig,
    )

    weights = _quantizer({"method": "nncf_weights", "params": {
        "mode": "int4_sym", "group_size": 16, "ratio": 0.9, "sensitivity_metric": "weight_quantization_error",
        "backup_mode": "int8_asym", "ignored_scope": {"names": ["lm_head"], "validate": False}}}, "openvino")
    assert isinstance(weights, NNCFOpenVINOQuantizer) and isinstance(weights.config, NNCFWeightCompressionConfig)
    assert weights.config.mode is nncf.CompressWeightsMode.INT4_SYM
    assert weights.config.sensitivity_metric is nncf.SensitivityMetric.WEIGHT_QUANTIZATION_ERROR
    assert weights.config.backup_mode is nncf.BackupMode.INT8_ASYM
    assert isinstance(weights.config.ignored_scope, nncf.IgnoredScope)
    assert weights.config.ignored_scope.names == ["lm_head"]
    from hfexport.quantization.quantizer import engine_arguments

    described = engine_arguments(weights)  # what plans and reports record
    assert described["quantizer"] == "NNCFOpenVINOQuantizer" and described["config"] == "NNCFWeightCompressionConfig"
    assert described["arguments"]["mode"] == "CompressWeightsMode.INT4_SYM" and described["arguments"]["ratio"] == 0.9
    assert isinstance(_quantizer({"method": "nncf_weights"}, "onnx"), NNCFOnnxQuantizer)
    full = _quantizer({"method": "nncf_quantize", "params": {"preset": "mixed", "target_device": "cpu",
                                                            "model_type": "transformer", "fast_bias_correction": False},
                       "calibration": {"source": "sample_inputs"}}, "openvino")
    assert isinstance(full.config, NNCFQuantizationConfig)
    assert full.config.preset is nncf.QuantizationPreset.MIXED
    assert full.config.target_device is nncf.TargetDevice.CPU
    assert full.config.model_type is nncf.ModelType.TRANSFORMER


@pytest.mark.parametrize("preset", ["xnnpack_int8_dynamic_per_channel", "xnnpack_int8_static_per_channel",
                                    "xnnpack_int8_static_per_tensor", "x86_inductor_int8_static",
                                    "x86_inductor_int8_dynamic"])
def test_pt2e_presets_build_the_named_quantizer(preset):
    from executorch.backends.xnnpack.quantizer.xnnpack_quantizer import XNNPACKQuantizer
    from hfexport.quantization.spec import PT2E_PRESETS
    from torchao.quantization.pt2e.quantizer.x86_inductor_quantizer import (
        X86InductorQuantizer,
    )
    from transformers.exporters import PT2EQuantizer

    spec = PT2E_PRESETS[preset]
    calibration = None if spec.dynamic else {"source": "sample_inputs"}
    section = {"method": "pt2e", "preset": preset, **({"calibration": calibration} if calibration else {})}
    quantizer = _quantizer(section, spec.formats[0])
    assert isinstance(quantizer, PT2EQuantizer) and type(quantizer).__name__ == "ExecutorchReadyPT2EQuantizer"
    expected = XNNPACKQuantizer if spec.backend == "xnnpack" else X86InductorQuantizer
    assert isinstance(quantizer.quantizer, expected)
    assert quantizer.quantizer.global_config.input_activation.is_dynamic is spec.dynamic


def test_every_parameter_is_a_field_of_the_engine_config_and_every_choice_an_enum_member():
    """The tables are data (validation imports no backend): check them against the installed engine and libraries."""
    from hfexport.quantization.spec import PARAMS, Choice
    from transformers import exporters

    configs = {"ort_dynamic": exporters.OnnxRuntimeDynamicConfig, "ort_static": exporters.OnnxRuntimeStaticConfig,
               "nncf_weights": exporters.NNCFWeightCompressionConfig, "nncf_quantize": exporters.NNCFQuantizationConfig}
    for method, config in configs.items():
        fields = {field.name for field in dataclasses.fields(config)}
        assert set(PARAMS[method]) <= fields, f"{method}: {set(PARAMS[method]) - fields} are not engine fields"
        for name, param in PARAMS[method].items():
            if isinstance(param, Choice):
                enum = param.enum()
                for value, member in param.values.items():
                    assert isinstance(getattr(enum, member), enum), f"{method}.{name}: {value} -> {member}"


def test_xnnpack_quantizer_keeps_integer_arithmetic_integer():
    """ExecuTorch 1.5.1's XNNPACKQuantizer turns `arange(n) + 0` into float, and the mask indexing then fails; the
    preset's quantizer keeps integer add/mul operands as they are (fails without the fix in quantization.py)."""
    import torch
    from executorch.backends.xnnpack.quantizer.xnnpack_quantizer import XNNPACKQuantizer
    from hfexport.quantization.quantizer import build_pt2e_preset
    from hfexport.quantization.spec import PT2E_PRESETS

    class Indexing(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.linear = torch.nn.Linear(4, 4)
            self.register_buffer("table", torch.randn(8, 4))

        def forward(self, x):
            index = torch.arange(x.shape[0]) + 1
            return self.linear(x) * 2.0 + self.table[index]

    x = torch.randn(3, 4)
    graph = torch.export.export(Indexing(), (x,)).module()
    fixed = build_pt2e_preset(PT2E_PRESETS["xnnpack_int8_static_per_channel"]).transform_for_annotation(copy.deepcopy(graph))
    fixed(x)  # runs: the integer add keeps its integer scalar
    float_adds = [node for node in fixed.graph.nodes if node.op == "get_attr" and "tensor_constant" in node.target]
    assert len(float_adds) == 1  # the float `* 2.0` still gets its tensor constant
    broken = XNNPACKQuantizer().transform_for_annotation(copy.deepcopy(graph))
    with pytest.raises(IndexError, match="tensors used as indices"):
        broken(x)


# ── Calibration sources (plans only: nothing is traced) ──────────────────────


@pytest.fixture(scope="module")
def bert(tiny_bert):
    from hfexport.models import load_model, load_processor

    return load_model(tiny_bert), load_processor(tiny_bert)


def _plan(document: dict, model, processor, **kwargs):
    from hfexport.plan import build_plan

    return build_plan(load_recipe(document), "t", model, None, processor, **kwargs)


def _ort_static(calibration: dict) -> dict:
    return {"method": "ort_static", "params": {"per_channel": True}, "calibration": calibration}


def test_inline_texts_calibrate_in_batches_of_the_sample_batch_with_the_traced_keys(bert):
    model, processor = bert
    plan = _plan(recipe_with(_ort_static({"source": "texts", "texts": TEXTS[:3]})), model, processor)
    quantizer = plan.components["model"].config.quantizer
    batches = quantizer.calibration_dataset
    assert len(batches) == 2  # 3 texts, batch 2: the last batch is filled from the start
    assert all(set(batch) == set(plan.inputs) for batch in batches)
    assert all(batch["input_ids"].shape[0] == 2 and batch["input_ids"].dtype == plan.inputs["input_ids"].dtype
               for batch in batches)
    record = plan.quantization
    assert record["calibration"]["samples"] == 3 and record["calibration"]["source"] == "texts"
    assert record["engine"]["quantizer"] == "OnnxRuntimeQuantizer"
    assert plan.describe()["quantization"]["calibration"]["batches"] == 2


def test_a_static_sequence_axis_gets_calibration_padded_to_the_traced_length(bert):
    model, processor = bert
    document = recipe_with(_ort_static({"source": "texts", "texts": TEXTS}))
    document["targets"]["t"]["dynamic_shapes"] = {"input_ids": {"0": "batch", "1": "static"}}
    plan = _plan(document, model, processor)
    length = plan.inputs["input_ids"].shape[1]
    batches = plan.components["model"].config.quantizer.calibration_dataset
    assert {tuple(batch["input_ids"].shape) for batch in batches} == {(2, length)}
    assert plan.quantization["calibration"]["padding"] == "max_length"


def _copy_model(source: Path, folder: Path, extra: dict[str, str]) -> Path:
    shutil.copytree(source, folder)
    for name, text in extra.items():
        (folder / name).parent.mkdir(parents=True, exist_ok=True)
        (folder / name).write_text(text, encoding="utf-8")
    return folder


def test_repo_file_in_a_local_model_folder(bert, tiny_bert, tmp_path):
    model, processor = bert
    lines = "\n".join(json.dumps({"text": text, "id": index}) for index, text in enumerate(TEXTS))
    folder = _copy_model(tiny_bert, tmp_path / "model", {"calibration/data.jsonl": lines + "\n"})
    plan = _plan(recipe_with(_ort_static({"source": "repo_file", "path": "calibration/data.jsonl", "field": "text",
                                          "num_samples": 3})), model, processor, source=folder)
    calibration = plan.quantization["calibration"]
    assert calibration["samples"] == 3 and calibration["origin"].endswith("calibration/data.jsonl [text]")
    with pytest.raises(PlanError, match=r"calibration\.field: .* has no field 'content'"):
        _plan(recipe_with(_ort_static({"source": "repo_file", "path": "calibration/data.jsonl", "field": "content"})),
              model, processor, source=folder)
    with pytest.raises(PlanError, match=r"calibration\.path: no file missing\.txt"):
        _plan(recipe_with(_ort_static({"source": "repo_file", "path": "missing.txt"})), model, processor, source=folder)


def test_repo_file_symlink_out_of_the_model_folder_is_refused(bert, tiny_bert, tmp_path):
    model, processor = bert
    folder = _copy_model(tiny_bert, tmp_path / "model", {})
    (tmp_path / "secret.txt").write_text("one\ntwo\n")
    (folder / "calibration.txt").symlink_to(tmp_path / "secret.txt")
    with pytest.raises(PlanError, match="outside the model folder"):
        _plan(recipe_with(_ort_static({"source": "repo_file", "path": "calibration.txt"})), model, processor,
              source=folder)


def test_repo_file_of_a_hub_model_repo_at_the_exported_revision(bert, tiny_bert, hub):
    """The model's own file comes from the Hub through huggingface_hub, at the revision being exported."""
    from hfexport import AutoHfExporter

    model, _ = bert
    repo = "user/tiny-bert-calibration"
    files = {path.name: path.read_bytes() for path in tiny_bert.iterdir() if path.is_file()}
    first = hub.seed_repo(repo, {**files, "export_config.json": json.dumps(recipe_with(_ort_static(
        {"source": "repo_file", "path": "calibration.txt"}))), "calibration.txt": "\n".join(TEXTS[:2])})
    hub.seed_repo(repo, {"calibration.txt": "\n".join(TEXTS)}, message="more calibration text")
    at_head = AutoHfExporter.from_pretrained(repo).plan(model)
    assert at_head.quantization["calibration"]["samples"] == 4
    pinned = AutoHfExporter.from_pretrained(repo, revision=first).plan(model)
    assert pinned.quantization["calibration"]["samples"] == 2
    assert pinned.quantization["calibration"]["origin"] == f"{repo}@{first}/calibration.txt"


def test_dataset_repo_file_with_revision_field_and_num_samples(bert, hub):
    model, processor = bert
    repo = "user/calibration-texts"
    rows = "\n".join(json.dumps({"sentence": f"Calibration sentence {index} for the dataset source."})
                     for index in range(10))
    hub.seed_repo(repo, {"data/train.jsonl": rows}, repo_type="dataset")
    commit = hub.seed_repo(repo, {"data/train.csv": "sentence,label\nfirst row text,0\nsecond row text,1\n"},
                           repo_type="dataset", message="add csv")
    plan = _plan(recipe_with(_ort_static({"source": "dataset", "repo": repo, "revision": commit,
                                          "path": "data/train.jsonl", "field": "sentence", "num_samples": 6})),
                 model, processor)
    calibration = plan.quantization["calibration"]
    assert calibration["samples"] == 6 and calibration["batches"] == 3
    assert calibration["origin"] == f"datasets/{repo}@{commit}/data/train.jsonl [sentence]"
    csv_plan = _plan(recipe_with(_ort_static({"source": "dataset", "repo": repo, "path": "data/train.csv",
                                              "field": "sentence"})), model, processor)
    assert csv_plan.quantization["calibration"]["samples"] == 2
    with pytest.raises(PlanError, match=r"calibration\.path: no file data/test\.jsonl in the dataset repo"):
        _plan(recipe_with(_ort_static({"source": "dataset", "repo": repo, "path": "data/test.jsonl",
                                       "field": "sentence"})), model, processor)
    from hfexport.errors import SourceError

    with pytest.raises(SourceError, match="not found"):
        _plan(recipe_with(_ort_static({"source": "dataset", "repo": "user/no-such-dataset", "path": "a.txt"})),
              model, processor)


def test_a_method_that_needs_data_refuses_a_single_sample_unless_allowed(bert, tiny_bert, tmp_path):
    model, processor = bert
    folder = _copy_model(tiny_bert, tmp_path / "model", {"one.txt": "only one line\n\n"})
    with pytest.raises(PlanError, match="calibrate on 1 sample .*allow_single_sample"):
        _plan(recipe_with(_ort_static({"source": "repo_file", "path": "one.txt"})), model, processor, source=folder)
    plan = _plan(recipe_with(_ort_static({"source": "repo_file", "path": "one.txt", "allow_single_sample": True})),
                 model, processor, source=folder)
    assert plan.quantization["calibration"]["samples"] == 1


def test_sample_inputs_source_uses_the_sample_texts_or_the_one_input_batch(bert):
    model, processor = bert
    document = recipe_with(_ort_static({"source": "sample_inputs"}))
    del document["sample_inputs"]  # the task's default texts
    plan = _plan(document, model, processor)
    assert plan.quantization["calibration"]["samples"] == 2
    assert plan.quantization["calibration"]["origin"] == "recipe sample_inputs"
    tensors = {"input_ids": {"shape": ["batch", "seq"], "dtype": "int64", "range": [0, "vocab_size"]}}
    document["sample_inputs"] = {"tensors": tensors}
    assert "single sample" in problems_of(document)["targets.t.quantization.calibration.source"]
    document["targets"]["t"]["quantization"]["calibration"]["allow_single_sample"] = True
    plan = _plan(document, model, processor)
    batches = plan.components["model"].config.quantizer.calibration_dataset
    assert len(batches) == 1 and batches[0]["input_ids"] is plan.inputs["input_ids"]


def test_data_free_methods_get_no_calibration_set(bert):
    model, processor = bert
    plan = _plan(recipe_with({"method": "ort_dynamic"}), model, processor)
    assert plan.components["model"].config.quantizer.calibration_dataset is None
    assert plan.quantization["data"] == "none" and plan.quantization["calibration"] is None


@pytest.mark.parametrize("single_graph", [False, True])
def test_generation_targets_calibrate_each_component_on_its_own_captured_inputs(tiny_llama, single_graph):
    """export_for_generation skips its calibration capture for per-component configs; the plan does it. A single
    graph (generation.single_graph) also runs the prompts: its decode calibrates on both, the prompts on an empty
    cache."""
    from hfexport.models import load_model, load_processor

    model, processor = load_model(tiny_llama), load_processor(tiny_llama)
    document = json.loads((tiny_llama / "export_config.json").read_text())
    target = copy.deepcopy(document["targets"]["openvino-generation"])
    target["generation"] = {"single_graph": single_graph}  # each layout asked for by name (one graph is the default)
    target["quantization"] = {"method": "nncf_weights",
                              "params": {"mode": "int4_sym", "group_size": 16, "scale_estimation": True},
                              "calibration": {"source": "texts", "texts": TEXTS}}
    document["targets"], document["default_target"] = {"t": target}, "t"
    plan = _plan(document, model, processor)
    per_component = plan.quantization["calibration"]["per_component"]
    if single_graph:
        samples = plan.components["decode"].config.quantizer.calibration_dataset
        assert set(plan.components) == {"decode"} and per_component == {"decode": len(samples)}
        # the engine's capture of a multi-token decode holds each batch's prompt call and a later step; the prompts
        # get the empty cache the graph runs them on (zero-length tensors in every layer, not uninitialized layers)
        prompts = [sample for sample in samples if sample["past_key_values"].get_seq_length() == 0]
        steps = [sample for sample in samples if sample["past_key_values"].get_seq_length() > 0]
        assert prompts and steps and len(prompts) + len(steps) == len(samples)
        for sample in prompts:
            keys = [layer.keys for layer in sample["past_key_values"].layers]
            assert len(keys) == model.config.num_hidden_layers and all(k is not None and k.shape[2] == 0 for k in keys)
            assert sample["input_ids"].shape[1] > 1
        return
    assert set(plan.components) == {"prefill", "decode"}
    assert per_component == {"prefill": 2, "decode": 2}
    for name, component in plan.components.items():
        samples = component.config.quantizer.calibration_dataset
        assert len(samples) == 2
        assert "past_key_values" in samples[0]  # forward kwargs of the component, not generate kwargs
        if name == "decode":
            assert samples[0]["input_ids"].shape[1] == 1


# ── Parity defaults ──────────────────────────────────────────────────────────


def test_default_parity_for_quantized_targets_and_recipe_overrides():
    from hfexport.verify.thresholds import default_parity, thresholds_for

    int8 = default_parity("ort_dynamic", "forward")
    assert int8["atol"] is None and int8["rtol"] is None and int8["min_cosine"] == 0.98 and "generate" not in int8
    int4 = default_parity("nncf_weights", "generation", {"mode": "int4_sym"})
    assert int4["min_cosine"] < int8["min_cosine"]
    assert int4["generate"]["max_new_tokens"] >= 8 and 0 < int4["generate"]["min_token_agreement"] < 1
    document = recipe_with({"method": "ort_dynamic"}, parity={"min_cosine": 0.999})

    thresholds = thresholds_for(load_recipe(document).target("t"))
    assert thresholds["default"]["min_cosine"] == 0.999 and thresholds["default"]["atol"] is None


# ── Quantized exports that pass their gates ──────────────────────────────────

MINILM_DIMS = {"batch": {"min": 1, "max": 8}, "seq": {"min": 2, "max": 128}}


def _minilm_recipe(format_: str, quantization: dict) -> dict:
    target = {"export_format": format_, "mode": "forward", "dynamic_shapes": SHAPES}
    return {"recipe_version": 1, "task": "feature-extraction", "dims": MINILM_DIMS,
            "sample_inputs": {"text": ["A sentence to embed for the parity probes.", "Another one, a bit longer."]},
            "targets": {format_: target, f"{format_}-int8": {**target, "quantization": quantization}}}


def _check_quantized_job(report, name: str, reference: str, max_size_ratio: float):
    target = report.targets[name]
    assert target.status == "ok", target.error
    assert report.targets[reference].status == "ok", report.targets[reference].error
    assert target.verification["passed"], target.verification["failures"]
    assert target.verification["thresholds"]["default"]["atol"] is None  # quantized: cosine and top-1, not atol
    comparison = target.quantization["comparison"]
    assert comparison["reference"] == reference
    assert 0 < comparison["size_ratio"] <= max_size_ratio
    assert comparison["latency_ratio"] > 0 and comparison["latency_ms"] > 0
    return target.quantization


def test_minilm_ort_dynamic_one_liner_passes_its_gate_on_real_text_and_reports_size_and_latency(minilm, tmp_path):
    """The documented one-liner `{"method": "ort_dynamic"}`: hfexport's defaults (per-channel, reduce_range: 7-bit
    weights, which do not saturate on CPUs without VNNI) pass the 8-bit gate, judged on the recipe's sample texts."""
    from hfexport.job.run import run_job
    from hfexport.report.data import JobReport

    recipe = _minilm_recipe("onnx", {"method": "ort_dynamic"})
    report = run_job(minilm, tmp_path / "out", recipe=recipe, all_targets=True)
    quantization = _check_quantized_job(report, "onnx-int8", "onnx", max_size_ratio=0.35)
    assert quantization["method"] == "ort_dynamic"
    assert quantization["params"] == {"per_channel": True, "reduce_range": True} == quantization["defaults"]
    assert quantization["engine"]["arguments"]["reduce_range"] is True
    verification = report.targets["onnx-int8"].verification
    assert verification["representative"]["real_text"] and "2 sample text(s)" in verification["representative"]["source"]
    roles = [probe.get("role") for probe in verification["probes"]]
    assert roles.count("quality") == 1 and roles.count("shape") == len(roles) - 1 >= 3
    quality = next(probe for probe in verification["probes"] if probe.get("role") == "quality")
    assert all(metrics["cosine"] >= 0.98 for metrics in quality["outputs"].values()), quality["outputs"]
    int8 = verification["runtime"]["checks"][0]["components"]["model"]
    assert int8["precision"] == "int8" and int8["int8_path"]  # the kernel path this CPU takes, named in the report
    saved = JobReport.read(tmp_path / "out" / "onnx-int8")  # the target's own report carries the comparison too
    assert saved.targets["onnx-int8"].quantization["comparison"]["size_ratio"] == quantization["comparison"]["size_ratio"]
    markdown = report_markdown(report)
    assert "**Quantization:** ort_dynamic" in markdown and f"{quantization['comparison']['size_ratio']:.2f}x" in markdown


@pytest.mark.slow
def test_minilm_nncf_weights_int8_openvino_passes_its_gate(minilm, tmp_path):
    from hfexport.job.run import run_job

    recipe = _minilm_recipe("openvino", {"method": "nncf_weights", "params": {"mode": "int8_asym"}})
    report = run_job(minilm, tmp_path / "out", recipe=recipe, all_targets=True)
    quantization = _check_quantized_job(report, "openvino-int8", "openvino", max_size_ratio=0.35)
    assert quantization["engine"]["quantizer"] == "NNCFOpenVINOQuantizer"
    assert quantization["data"] == "none"


def _llama_recipe(tiny_llama, name: str, quantization: dict, max_new_tokens: int = 8) -> dict:
    document = json.loads((tiny_llama / "export_config.json").read_text())
    document["targets"][name].pop("generation", None)  # the prefill + decode layout these jobs were written for
    target = copy.deepcopy(document["targets"][name])
    target["quantization"] = quantization
    target["parity"] = {"generate": {"max_new_tokens": max_new_tokens}}
    document["targets"] = {name: document["targets"][name], f"{name}-q": target}
    document["default_target"] = name
    return document


def _check_generation_job(report, name: str, min_token_agreement: float):
    """The quantized generation target exported and its gate ran: token agreement over N tokens reported against a
    quantized default (not token-exact), probes judged on cosine/top-1, and the status follows the gate.

    The tiny decoder is random: its logits are nearly flat, so a quantization step flips greedy picks that a trained
    model's peaked logits would keep. The gate's verdict is asserted to follow the reported metrics, not to pass.
    """
    assert report.targets[name].status == "ok", report.targets[name].error
    target = report.targets[f"{name}-q"]
    assert target.status in ("ok", "failed"), target.error  # exported and saved; the gate decides ok/failed
    paths = [entry["path"] for entry in target.files]
    assert any("prefill" in path for path in paths) and any("decode" in path for path in paths), paths
    verification = target.verification
    assert verification["thresholds"]["default"]["atol"] is None
    generation = verification["generation"]
    assert generation["max_new_tokens"] == 8 and generation["min_token_agreement"] == min_token_agreement
    assert 0 <= generation["token_agreement"] <= 1
    gate = generation["token_agreement"] >= min_token_agreement and all(
        probe["passed"] for probe in verification["probes"])
    assert (target.status == "ok") is gate, verification["failures"]
    for probe in verification["probes"]:
        for output in probe.get("outputs", {}).values():
            assert output["cosine"] > 0.9  # quantized, yet pointing the same way as the eager outputs
    comparison = target.quantization["comparison"]
    assert comparison["reference"] == name and 0 < comparison["size_ratio"] < 1
    print(f"{name}-q: {target.status}, token agreement {generation['token_agreement']:.3f}, "
          f"size {comparison['size_ratio']}x, latency {comparison.get('latency_ratio')}x")  # shown with -rP
    return target


@pytest.mark.slow
def test_tiny_llama_nncf_int4_openvino_generation_with_calibration_texts(tiny_llama, tmp_path):
    from hfexport.job.run import run_job

    quantization = {"method": "nncf_weights", "params": {"mode": "int4_sym", "group_size": 16, "ratio": 0.8,
                                                         "scale_estimation": True},
                    "calibration": {"source": "texts", "texts": TEXTS}}
    recipe = _llama_recipe(tiny_llama, "openvino-generation", quantization)
    report = run_job(tiny_llama, tmp_path / "out", recipe=recipe, all_targets=True)
    target = _check_generation_job(report, "openvino-generation", min_token_agreement=0.5)  # low-bit default
    assert target.quantization["calibration"]["per_component"] == {"prefill": 2, "decode": 2}
    assert target.quantization["engine"]["arguments"]["mode"] == "CompressWeightsMode.INT4_SYM"


@pytest.mark.slow
def test_tiny_llama_pt2e_xnnpack_executorch_generation(tiny_llama, tmp_path):
    from hfexport.job.run import run_job

    quantization = {"method": "pt2e", "preset": "xnnpack_int8_dynamic_per_channel"}
    recipe = _llama_recipe(tiny_llama, "pte-generation", quantization)
    report = run_job(tiny_llama, tmp_path / "out", recipe=recipe, all_targets=True)
    target = _check_generation_job(report, "pte-generation", min_token_agreement=0.75)  # 8-bit default
    assert target.quantization["engine"]["pt2e_quantizer"] == "IntegerSafeXNNPACKQuantizer"
    assert target.quantization["data"] == "none" and target.quantization["calibration"] is None


# Every method x format (and preset x format) the tables allow, on tiny-bert, in one job. The fp32 siblings give
# the size/latency references; dynamo has none, so its targets are compared with a throwaway fp32 export.
MATRIX = {
    "onnx-ort-static": ("onnx", {"method": "ort_static", "params": {"per_channel": True},
                                 "calibration": {"source": "texts", "texts": TEXTS}}),
    "onnx-nncf-int4": ("onnx", {"method": "nncf_weights", "params": {"mode": "int4_sym", "group_size": 16}}),
    "onnx-nncf-quantize": ("onnx", {"method": "nncf_quantize", "calibration": {"source": "texts", "texts": TEXTS}}),
    "onnx-pt2e-x86": ("onnx", {"method": "pt2e", "preset": "x86_inductor_int8_static",
                               "calibration": {"source": "sample_inputs"}}),
    "openvino-nncf-quantize": ("openvino", {"method": "nncf_quantize", "params": {"preset": "mixed"},
                                            "calibration": {"source": "texts", "texts": TEXTS}}),
    "openvino-pt2e-x86": ("openvino", {"method": "pt2e", "preset": "x86_inductor_int8_static",
                                       "calibration": {"source": "texts", "texts": TEXTS}}),
    "pt2-pt2e-x86-dynamic": ("dynamo", {"method": "pt2e", "preset": "x86_inductor_int8_dynamic"}),
    "pt2-pt2e-xnnpack": ("dynamo", {"method": "pt2e", "preset": "xnnpack_int8_dynamic_per_channel"}),
    "pte-pt2e-xnnpack-static": ("executorch", {"method": "pt2e", "preset": "xnnpack_int8_static_per_channel",
                                               "calibration": {"source": "texts", "texts": TEXTS}}),
    "pte-pt2e-xnnpack-dynamic": ("executorch", {"method": "pt2e", "preset": "xnnpack_int8_dynamic_per_channel"}),
}


@pytest.mark.slow
def test_every_allowed_combination_exports_and_passes_its_gate(tiny_bert, tmp_path):
    from hfexport.job.run import run_job

    document = json.loads((tiny_bert / "export_config.json").read_text())
    fp32 = {"onnx": "onnx", "openvino": "openvino", "executorch": "pte"}
    targets = {name: document["targets"][name] for name in fp32.values()}
    for name, (export_format, quantization) in MATRIX.items():
        base = copy.deepcopy(document["targets"][fp32.get(export_format, "pt2")])
        targets[name] = {**base, "quantization": quantization}
    document["targets"] = targets
    report = run_job(tiny_bert, tmp_path / "out", recipe=document, all_targets=True)
    problems = {name: target.error for name, target in report.targets.items() if target.status != "ok"}
    assert not problems, problems
    for name, (export_format, _) in MATRIX.items():
        comparison = report.targets[name].quantization["comparison"]
        assert comparison["size_ratio"] > 0, (name, comparison)
        if export_format == "dynamo":
            assert comparison["reference"].startswith("fp32 export")
        else:
            assert comparison["reference"] == fp32[export_format]
    assert not [path for path in (tmp_path / "out").iterdir() if ".reference-" in path.name]
