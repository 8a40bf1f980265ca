"""The runtime is part of the verdict: CPU features and the precision each backend really used, read back; OpenVINO
checked at f32 and at the precision `hfexport.load` gives (pinned by the recipe, or the device default).

Every test here that depends on precision sets it explicitly. The one that needs a bf16-capable CPU says so and is
skipped elsewhere, with the reason.
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest
from hfexport.errors import RecipeError, SourceError
from hfexport.report.markdown import report_markdown
from hfexport.machine import _openvino_precision, cpu_info, int8_kernel_path, read_back, read_cpuinfo

BF16_REASON = "this CPU has no AVX512-BF16/AMX-BF16: OpenVINO runs bf16 requests at f32 here"


# ── the CPU ──────────────────────────────────────────────────────────────────


def test_cpuinfo_flags_become_the_features_that_change_numerics(tmp_path):
    sapphire = tmp_path / "spr"
    sapphire.write_text("processor\t: 0\nmodel name\t: Intel(R) Xeon(R) Processor\n"
                        "flags\t\t: fpu avx2 fma avx512f avx512_vnni avx512_bf16 amx_bf16 amx_int8 amx_tile\n")
    epyc = tmp_path / "epyc"
    epyc.write_text("processor\t: 0\nmodel name\t: AMD EPYC 7763 64-Core Processor\nflags\t\t: fpu avx2 fma\n")
    model, flags = read_cpuinfo(sapphire)
    assert model == "Intel(R) Xeon(R) Processor" and "amx_int8" in flags
    assert int8_kernel_path(["AVX2", "AVX512F", "AMX-INT8"]).startswith("AMX-INT8")
    assert int8_kernel_path(["AVX2", "AVX512F", "AVX512-VNNI"]).startswith("VNNI")
    assert "can saturate" in int8_kernel_path(["AVX2", "FMA"])
    assert read_cpuinfo(tmp_path / "missing") == (None, set())
    assert int8_kernel_path([], known=False).startswith("unknown")
    model, flags = read_cpuinfo(epyc)
    assert model.startswith("AMD EPYC") and "avx512f" not in flags


def test_this_cpu_is_described_consistently():
    cpu = cpu_info()
    assert cpu["model"] and isinstance(cpu["features"], list)
    assert cpu["bf16"] == any(name in cpu["features"] for name in ("AVX512-BF16", "AMX-BF16", "BF16"))
    assert cpu["int8_path"] == int8_kernel_path(cpu["features"], cpu["features_known"])


# ── recipes pin the runtime precision ────────────────────────────────────────


def _bert_recipe(tiny_bert: Path, target: str, runtime: dict | None) -> dict:
    document = json.loads((tiny_bert / "export_config.json").read_text())
    if runtime is None:
        document["targets"][target].pop("runtime", None)
    else:
        document["targets"][target]["runtime"] = runtime
    return document


@pytest.mark.parametrize("target, runtime, path, expected", [
    ("onnx", {"precision": "bf16"}, "targets.onnx.runtime.precision", "onnx runs the graph's own types"),
    ("openvino", {"precision": "fp64"}, "targets.openvino.runtime.precision", "auto"),
    ("openvino", {"inference_precision": "f32"}, "targets.openvino.runtime.inference_precision", "precision"),
])
def test_a_bad_runtime_section_is_a_recipe_error_with_its_path(tiny_bert, target, runtime, path, expected):
    from hfexport.recipe.loading import load_recipe

    with pytest.raises(RecipeError) as caught:
        load_recipe(_bert_recipe(tiny_bert, target, runtime))
    problems = caught.value.problems
    assert any(problem.path == path and expected in problem.message for problem in problems), problems


def test_the_runtime_section_is_kept_in_the_target_and_its_hash(tiny_bert):
    from hfexport.recipe.loading import load_recipe

    plain = load_recipe(_bert_recipe(tiny_bert, "openvino", None))
    pinned = load_recipe(_bert_recipe(tiny_bert, "openvino", {"precision": "f32"}))
    assert pinned.target("openvino").runtime == {"precision": "f32"}
    assert pinned.standalone("openvino")["targets"]["openvino"]["runtime"] == {"precision": "f32"}
    assert plain.target_hash("openvino") != pinned.target_hash("openvino")  # a pin is a different export
    assert plain.target_hash("onnx") == pinned.target_hash("onnx")


# ── thresholds per precision ─────────────────────────────────────────────────


def test_reduced_precision_has_its_own_thresholds_and_ignores_float32_overrides():
    from hfexport.recipe.data import Target
    from hfexport.verify.thresholds import default_tolerance, thresholds_for

    strict = default_tolerance("openvino")
    bf16 = default_tolerance("openvino", precision="bf16")
    f16 = default_tolerance("openvino", precision="f16")
    assert strict["atol"] == 1e-4 and bf16["atol"] is None and f16["atol"] is None  # judged by direction and top-1
    assert bf16["min_cosine"] < f16["min_cosine"] < strict["min_cosine"] and bf16["min_top1"] < strict["min_top1"]
    target = Target("t", "openvino", parity={"atol": 1e-6, "outputs": {"logits": {"atol": 1e-6}}})
    assert thresholds_for(target)["default"]["atol"] == 1e-6  # the graph check keeps the recipe's thresholds
    at_bf16 = thresholds_for(target, precision="bf16")
    assert at_bf16["default"] == bf16 and at_bf16["outputs"] == {}
    assert "bf16 runtime precision" in at_bf16["basis"]


# ── OpenVINO checked at the precision it will run at ─────────────────────────


@pytest.fixture(scope="module")
def bert_parts(tiny_bert):
    from hfexport.models import load_model, load_processor
    from hfexport.recipe.loading import load_recipe

    return load_model(tiny_bert, load_recipe(tiny_bert)), load_processor(tiny_bert)


def _verify_openvino(exported_bert, tiny_bert, bert_parts, runtime: dict | None):
    from hfexport.plan import build_plan
    from hfexport.recipe.loading import load_recipe
    from hfexport.verify.check import verify_exported

    output, _ = exported_bert
    model, processor = bert_parts
    recipe = load_recipe(_bert_recipe(tiny_bert, "openvino", runtime))
    plan = build_plan(recipe, "openvino", model, None, processor)
    return verify_exported(output / "openvino", model, plan, processor)


def test_openvino_pinned_to_f32_is_checked_at_f32_against_strict_thresholds(exported_bert, tiny_bert, bert_parts,
                                                                          monkeypatch):
    import openvino

    compiled = []
    compile_model = openvino.Core.compile_model

    def counted(self, *args, **kwargs):  # the real compile, counted: the f32 pin is compiled once, not twice
        compiled.append(args[2] if len(args) > 2 else kwargs.get("config"))
        return compile_model(self, *args, **kwargs)

    monkeypatch.setattr(openvino.Core, "compile_model", counted)
    verification = _verify_openvino(exported_bert, tiny_bert, bert_parts, {"precision": "f32"})
    assert len(compiled) == 1 and compiled[0]["INFERENCE_PRECISION_HINT"] == "f32"
    assert verification["passed"], verification["failures"]
    runtime = verification["runtime"]
    assert runtime["backend"] == "openvino" and runtime["device"] == "CPU"
    assert runtime["requested"] == "f32" and runtime["precision"] == "f32"
    assert [(check["name"], check["precision"]) for check in runtime["checks"]] == [("graph", "f32"), ("runtime", "f32")]
    assert runtime["checks"][1]["same_as"] == "graph" and "runtime_check" not in verification
    assert verification["thresholds"]["default"]["atol"] == 1e-4
    for probe in verification["probes"]:
        assert all(metrics["max_abs"] < 1e-4 for metrics in probe["outputs"].values())
    assert runtime["cpu"] == json.loads(json.dumps(cpu_info()))


@pytest.mark.skipif(not cpu_info()["bf16"], reason=BF16_REASON)
def test_openvino_bf16_is_judged_by_bf16_thresholds_on_a_cpu_that_has_it(exported_bert, tiny_bert, bert_parts):
    from hfexport.verify.thresholds import default_tolerance

    verification = _verify_openvino(exported_bert, tiny_bert, bert_parts, {"precision": "bf16"})
    assert verification["passed"], verification["failures"]
    runtime = verification["runtime"]
    assert [(check["name"], check["precision"]) for check in runtime["checks"]] == [("graph", "f32"), ("runtime", "bf16")]
    assert runtime["precision"] == "bf16"
    check = verification["runtime_check"]
    assert check["precision"] == "bf16" and check["thresholds"]["default"] == default_tolerance("openvino", precision="bf16")
    # bf16 really ran: the same probes differ from eager by more than the float32 atol, and pass bf16's thresholds
    worst = max(metrics["max_abs"] for probe in check["probes"] for metrics in probe["outputs"].values())
    lowest = min(metrics["cosine"] for probe in check["probes"] for metrics in probe["outputs"].values())
    assert worst > 1e-4 and lowest >= check["thresholds"]["default"]["min_cosine"]
    graph_worst = max(metrics["max_abs"] for probe in verification["probes"] for metrics in probe["outputs"].values())
    assert graph_worst < 1e-5


def test_the_device_default_is_read_back_and_judged_by_its_own_row(exported_bert, tiny_bert, bert_parts):
    """No pin ("auto"): whatever the CPU plugin picks here is read back, and a reduced precision gets its own check."""
    import openvino

    default = str(openvino.Core().get_property("CPU", "INFERENCE_PRECISION_HINT")).lower()
    verification = _verify_openvino(exported_bert, tiny_bert, bert_parts, None)
    runtime = verification["runtime"]
    assert runtime["requested"] == "auto"
    expected = "bf16" if "bf" in default else "f16" if "16" in default else "f32"
    assert runtime["precision"] == expected
    assert ("runtime_check" in verification) == (expected != "f32")
    assert verification["passed"], verification["failures"]


# ── hfexport.load applies the owner's pin ────────────────────────────────────


def _pinned_copy(exported_bert, tmp_path: Path, precision: str) -> Path:
    output, _ = exported_bert
    folder = tmp_path / f"openvino-{precision}"
    shutil.copytree(output / "openvino", folder)
    recipe_file = folder / "export_config.json"
    document = json.loads(recipe_file.read_text())
    target = document["targets"][document["default_target"]]
    target["runtime"] = {"precision": precision}
    recipe_file.write_text(json.dumps(document))
    return folder


def _plugin_precision(folder: Path, hint: str) -> str:
    """What OpenVINO's CPU plugin itself runs `folder`'s IR at when compiled with INFERENCE_PRECISION_HINT=`hint`."""
    import openvino

    core = openvino.Core()
    compiled = core.compile_model(core.read_model(str(folder / "openvino_model.xml")), "CPU",
                                  {"INFERENCE_PRECISION_HINT": hint})
    return _openvino_precision(compiled)  # the reader read_back uses: this compares the hint's path, not the reader


def test_load_applies_the_recipes_pin_and_the_callers_choice_wins(exported_bert, tmp_path):
    import hfexport

    folder = _pinned_copy(exported_bert, tmp_path, "f32")
    assert read_back(hfexport.load(folder, device="cpu"))["precision"] == "f32"
    # The caller's f16 replaces the pin: the model runs at what the CPU plugin makes of an f16 hint on this CPU (f16
    # with AVX512-FP16/AMX-FP16, bf16 on a CPU with bf16 only such as AMD Zen 4/5, f32 without either), read from a
    # bare OpenVINO compile of the same IR with the same hint.
    f16 = read_back(hfexport.load(folder, device="cpu", precision="f16"))["precision"]
    assert f16 == _plugin_precision(folder, "f16")
    explicit = hfexport.load(folder, device="cpu", precision="f16", config={"INFERENCE_PRECISION_HINT": "f32"})
    assert read_back(explicit)["precision"] == "f32"


def test_load_refuses_a_precision_the_format_cannot_run_at(exported_bert):
    import hfexport

    output, _ = exported_bert
    with pytest.raises(SourceError, match="onnx exports run at 'auto' or 'f32'"):
        hfexport.load(output / "onnx", precision="bf16")


def test_load_reports_a_malformed_recipe_copy_by_file_and_path(exported_bert, tmp_path):
    import hfexport

    folder = _pinned_copy(exported_bert, tmp_path, "f32")
    document = json.loads((folder / "export_config.json").read_text())
    document["targets"][document["default_target"]]["runtime"] = {"precision": "fp128"}
    (folder / "export_config.json").write_text(json.dumps(document))
    with pytest.raises(RecipeError) as caught:
        hfexport.load(folder)
    assert "export_config.json" in str(caught.value) and "runtime.precision" in str(caught.value)


def _spinning(exported) -> dict:
    """Each ONNX session's `session.intra_op.allow_spinning` entry (None: not set, ONNX Runtime's default: spin)."""
    entries = {}
    for name, runner in exported.runners.items():
        try:
            entries[name] = runner.session.get_session_options().get_session_config_entry(
                "session.intra_op.allow_spinning")
        except RuntimeError:  # onnxruntime: "SessionOptions does not have configuration with key"
            entries[name] = None
    return entries


def test_onnx_generation_exports_load_without_spinning_and_the_callers_options_win(exported_llama, exported_bert):
    import onnxruntime
    from hfexport import ExportedModel

    generation = exported_llama[0] / "onnx-generation"
    assert _spinning(ExportedModel.from_pretrained(generation)) == {"decode": "0"}  # the example's single graph
    mine = onnxruntime.SessionOptions()
    mine.add_session_config_entry("session.intra_op.allow_spinning", "1")
    assert _spinning(ExportedModel.from_pretrained(generation, session_options=mine)) == {"decode": "1"}
    # A forward export (one run per call, nothing between runs) keeps ONNX Runtime's defaults.
    assert _spinning(ExportedModel.from_pretrained(exported_bert[0] / "onnx")) == {"model": None}


# ── reports show it ──────────────────────────────────────────────────────────


def test_reports_name_the_cpu_and_the_precision_of_every_check(exported_bert):
    from hfexport.report.data import validate_report

    _, report = exported_bert
    validate_report(report.to_dict())
    text = report_markdown(report)
    assert f"Verified on {cpu_info()['model']}" in text
    assert "**Runtime:** openvino on CPU" in text and "graph checked at f32" in text
    assert "**Runtime:** onnxruntime on cpu" in text
    onnx = report.targets["onnx"].verification["runtime"]
    assert onnx["checks"][0]["components"]["model"]["providers"] == ["CPUExecutionProvider"]
