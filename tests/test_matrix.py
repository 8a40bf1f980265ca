"""The compatibility matrix: tiny models × formats × modes, each cell a real export + reload + verification job.

Default run: the tiny-model factories, the cell runner's classification, rendering and timeout, the generated
docs, and the fast subset (the bundled tiny-bert forward and tiny-llama targets on every format), read from the
session's exported fixtures rather than exported again. `pytest -m slow tests/test_matrix.py`: every cell, each
in its own subprocess; a cell recorded as pass in tests/data/compatibility_expected.json must still pass.
"""

from __future__ import annotations

import importlib.util

import json
import os
import warnings
from pathlib import Path

import pytest
from hfexport.testing.matrix import (
    committed_runtime_rows,
    OUTCOMES,
    PUBLISHED_DOCUMENT,
    Cell,
    CellResult,
    all_cells,
    compare,
    expectations,
    outcome_of,
    read_results,
    render_markdown,
    result_from_report,
    run_cell_subprocess,
    run_cells_subprocess,
)
from hfexport.testing.models import FORMATS, MODELS, make_model, target_name
from hfexport.testing.zoo import ZOO

ROOT = Path(__file__).resolve().parent.parent
EXPECTED_FILE = ROOT / "tests" / "data" / "compatibility_expected.json"
DOCS_JSON = ROOT / "docs" / "compatibility.json"
DOCS_MD = ROOT / "docs" / "compatibility.md"
PUBLISHED_JSON = ROOT / "docs" / "compatibility_published.json"
PUBLISHED_MD = ROOT / "docs" / "compatibility_published.md"
RUNTIMES_JSON = ROOT / "docs" / "llm_runtimes.json"  # scripts/llm_runtimes.py: the runtimes tables' rows
CELL_TIMEOUT_S = float(os.environ.get("HFEXPORT_MATRIX_TIMEOUT", "480"))
# The default run's subset: the bundled examples, exported once per session by tests/conftest.py.
FAST_SUBSET = {"exported_bert": "examples/tiny-bert", "exported_llama": "examples/tiny-llama"}


class NewlyPassingCell(Warning):
    """A cell that passes although the expectations file does not say so: update the file (not a failure)."""


def load_expected() -> dict:
    """`{"cells": {id: outcome}, "fast_subset": {id: outcome}}` (empty when the file is missing: nothing passes)."""
    if not EXPECTED_FILE.is_file():
        return {"cells": {}, "fast_subset": {}}
    return json.loads(EXPECTED_FILE.read_text(encoding="utf-8"))


# ── The tiny models ──────────────────────────────────────────────────────────


@pytest.fixture(scope="module")
def built_models(tmp_path_factory) -> dict[str, Path]:
    root = tmp_path_factory.mktemp("tiny-models")
    return {name: make_model(name, root / name) for name in MODELS}


def test_matrix_covers_the_required_families():
    families = {model.family for model in MODELS.values()}
    assert {"BERT", "Llama", "GPT-2", "Qwen2", "Gemma3", "Phi-3", "Mistral", "Mamba", "BART", "T5", "Marian", "mBART",
            "ViT", "Whisper", "LLaVA", "Idefics3", "LLaVA-NeXT", "Qwen3-ASR", "PaddleOCR-VL", "Qwen2-VL"} <= families
    generative = {name for name, model in MODELS.items() if "generation" in model.modes}
    assert generative == {"tiny-llama", "tiny-gpt2", "tiny-qwen2", "tiny-gemma3", "tiny-phi3", "tiny-mistral",
                          "tiny-mamba", "tiny-bart", "tiny-t5", "tiny-marian", "tiny-mbart", "tiny-whisper",
                          "tiny-llava", "tiny-idefics3", "tiny-qwen3-asr", "tiny-llava-next", "tiny-paddleocr-vl", "tiny-qwen2-vl",
                          "tiny-minicpm-v", "tiny-qwen2.5-omni"}
    cells = all_cells()
    assert len(cells) == 4 * sum(len(model.modes) for model in MODELS.values())
    assert {cell.export_format for cell in cells} == set(FORMATS)
    assert Cell.parse("tiny-gpt2/onnx/generation") == Cell("tiny-gpt2", "onnx", "generation")
    with pytest.raises(ValueError, match="unknown model"):
        all_cells(["tiny-nothing"])


@pytest.mark.parametrize("name", list(MODELS))
def test_tiny_model_is_a_small_complete_checkpoint(built_models, name):
    from hfexport.inputs import build_sample_inputs
    from hfexport.models import load_model, load_processor
    from hfexport.recipe.loading import load_recipe

    folder, spec = built_models[name], MODELS[name]
    assert (folder / "config.json").is_file() and (folder / "model.safetensors").is_file()
    assert (folder / "model.safetensors").stat().st_size < 1_000_000
    recipe = load_recipe(folder)
    assert set(recipe.target_names) == {target_name(fmt, mode) for mode in spec.modes for fmt in FORMATS}
    model = load_model(folder, recipe)
    assert type(model).__name__ == spec.model_class
    if spec.processor_needs and importlib.util.find_spec(spec.processor_needs) is None:
        # its processor needs a package this environment lacks (MiniCPM-V's: torchvision): refused, saying which
        from hfexport.errors import SourceError

        with pytest.raises(SourceError, match=f"(?i)requires the {spec.processor_needs} library"):
            load_processor(folder)
        return
    processor = load_processor(folder)
    import torch

    # two samples each, but MiniCPM-V's edge contract: one (its processor packs a batch's images into one row)
    batch = 1 if name == "tiny-minicpm-v" else 2
    for mode in spec.modes:
        inputs = build_sample_inputs(recipe, processor, model.config, recipe.task, mode)
        tensors = {key: value for key, value in inputs.items() if isinstance(value, torch.Tensor)}
        if "image_grid_thw" in tensors:  # grid_thw family: pixel_values are the images' packed patches
            assert tensors.pop("pixel_values").shape[0] == int(tensors["image_grid_thw"].prod(-1).sum())
        assert all(value.shape[0] == batch for value in tensors.values()), {k: v.shape for k, v in tensors.items()}
        with torch.no_grad():
            if mode == "forward":
                assert inputs.get("use_cache") in (None, False)  # one graph, no cache outputs
                output = model(**inputs)
                assert "past_key_values" not in output
            else:
                generated = model.generate(**inputs, max_new_tokens=2, do_sample=False)
                assert generated.shape[0] == batch


def test_tiny_models_are_seeded(tmp_path):
    first = make_model("tiny-gpt2", tmp_path / "a") / "model.safetensors"
    second = make_model("tiny-gpt2", tmp_path / "b") / "model.safetensors"
    assert first.read_bytes() == second.read_bytes()
    with pytest.raises(KeyError, match="no tiny model"):
        make_model("tiny-nothing", tmp_path / "c")


def test_image_text_sample_inputs_go_through_the_processor(built_models):
    """A multimodal processor expands each <image> placeholder to the image's tokens (the tokenizer alone leaves
    one, and LLaVA's forward then raises "Image features and image tokens do not match")."""
    import torch
    from hfexport.inputs import build_sample_inputs
    from hfexport.models import load_model, load_processor
    from hfexport.recipe.loading import load_recipe
    from hfexport.testing.models import IMAGE_SIZE, PATCH_SIZE

    folder = built_models["tiny-llava"]
    recipe, processor = load_recipe(folder), load_processor(folder)
    model = load_model(folder, recipe)
    inputs = build_sample_inputs(recipe, processor, model.config, recipe.task, "forward")
    image_tokens = (inputs["input_ids"] == model.config.image_token_index).sum(dim=1)
    assert image_tokens.tolist() == [(IMAGE_SIZE // PATCH_SIZE) ** 2] * 2
    assert inputs["pixel_values"].shape == (2, 3, IMAGE_SIZE, IMAGE_SIZE)
    with torch.no_grad():
        assert model(**inputs).logits.shape[:2] == inputs["input_ids"].shape


# ── Classifying a cell ───────────────────────────────────────────────────────


def _target(status="ok", error=None, verification=None):
    from hfexport.report.data import TargetReport

    return TargetReport(target="onnx-forward", export_format="onnx", mode="forward", status=status, error=error,
                        verification=verification)


def test_outcome_classification():
    assert outcome_of(_target(verification={"passed": True, "probes": [{}], "failures": []}))[0] == "pass"
    assert outcome_of(_target())[0] == "exported"
    failure = "probe batch=8,seq=37: last_hidden_state: max_abs 0.31 exceeds atol 0.0001 + rtol 0.001·|eager|"
    outcome, detail, stage = outcome_of(_target("failed", "parity failed: ...", {
        "passed": False, "probes": [{"passed": False}], "failures": [failure, "another"]}))
    assert (outcome, detail, stage) == ("parity-fail", failure, "verify")
    outcome, detail, stage = outcome_of(_target("failed", "x", {
        "passed": False, "error": "the artifact does not load back from onnx-forward: boom", "probes": []}))
    assert (outcome, stage) == ("error", "verify") and "does not load back" in detail
    error = "TorchExportError: Failed to export\n  File x.py, line 3\nmore <- ValueError: inner"
    outcome, detail, stage = outcome_of(_target("error", error), failed_stage="export")
    assert (outcome, stage) == ("error", "export")
    assert "\n" not in detail and detail.startswith("TorchExportError: Failed to export")
    assert len(outcome_of(_target("error", "x" * 5000))[1]) <= 400


def test_engine_error_line_keeps_torch_exports_suggested_fix():
    """A cell's error names the recipe bound to change, once: torch.export's UserError repeats its cause's first
    line (tiny-bart's forward guards seq >= 3, which a recipe with `dims.seq.min` 2 violates)."""
    import torch
    from hfexport.job.run import engine_error_message

    class NeedsThree(torch.nn.Module):
        def forward(self, x):
            return x + 1 if x.shape[1] >= 3 else x - 1

    with pytest.raises(Exception) as caught:
        torch.export.export(NeedsThree(), (torch.ones(2, 5),),
                            dynamic_shapes=({1: torch.export.Dim("seq", min=2, max=64)},))
    line = engine_error_message(caught.value)
    assert "\n" not in line
    assert line.count("Constraints violated (seq)") == 1
    assert line.endswith("Suggested fixes: seq = Dim('seq', min=3, max=64)")


def test_compare_flags_regressions_and_reports_new_passes():
    results = [CellResult("m", "onnx", "forward", "pass"), CellResult("m", "dynamo", "forward", "error", "boom"),
               CellResult("m", "openvino", "forward", "timeout", "timeout after 5 s"),
               CellResult("m", "executorch", "forward", "parity-fail", "logits")]
    expected = {"m/onnx/forward": "error", "m/dynamo/forward": "pass", "m/openvino/forward": "pass",
                "m/executorch/forward": "error"}
    regressions, newly = compare(results, expected)
    assert [r.id for r in regressions] == ["m/dynamo/forward", "m/openvino/forward"]
    assert [r.id for r in newly] == ["m/onnx/forward"]
    assert expectations(results)["m/executorch/forward"] == "parity-fail"


def test_markdown_has_a_table_per_mode_and_one_note_per_failure():
    results = [
        CellResult("tiny-gpt2", "onnx", "forward", "pass", timings={"export_s": 3.21}),
        CellResult("tiny-gpt2", "dynamo", "generation", "error", "RuntimeError: a | b <c>", "export"),
        CellResult("tiny-bert", "openvino", "forward", "timeout", "timeout after 9 s"),
    ]
    text = render_markdown(results, {"regenerate": "python scripts/compatibility_matrix.py", "wall_s": 120})
    assert "GENERATED FILE" in text and "python scripts/compatibility_matrix.py" in text
    assert "## Forward" in text and "## Generation" in text
    assert "✅ pass 3.2 s" in text
    assert "`tiny-gpt2/dynamo/generation`: RuntimeError: a \\| b &lt;c&gt;" in text  # a note cannot break a table
    assert "1 pass, 1 error, 1 timeout of 3 cells" in text
    for line in text.splitlines():
        if line.startswith("| `tiny-"):
            assert line.count("|") == 2 + len({r.export_format for r in results})


def test_a_hanging_cell_times_out_and_its_process_is_gone(tmp_path):
    result = run_cell_subprocess(Cell("tiny-bert", "onnx", "forward"), tmp_path, timeout=1)
    assert result.outcome == "timeout" and result.detail == "timeout after 1 s"
    assert result.timings["wall_s"] < 30
    assert not (tmp_path / "out").exists() or not any((tmp_path / "out").rglob("export.json"))


def test_cells_in_one_process_each_have_their_timeout_and_the_rest_go_on_in_a_fresh_one(tmp_path):
    cells = [Cell("tiny-bert", "onnx", "forward"), Cell("tiny-bert", "dynamo", "forward")]
    results = run_cells_subprocess(cells, tmp_path, timeout=1, fast=True, rebuild=True)
    assert [(result.id, result.outcome, result.detail) for result in results] == [
        (cell.id, "timeout", "timeout after 1 s") for cell in cells]
    assert all(result.timings["wall_s"] < 30 for result in results)


# ── Generated docs and expectations ──────────────────────────────────────────


def test_docs_are_generated_from_the_committed_results():
    results, meta = read_results(DOCS_JSON)
    runtimes = committed_runtime_rows(ROOT / "docs")
    assert DOCS_MD.read_text(encoding="utf-8") == render_markdown(results, meta, runtimes), (
        "docs/compatibility.md differs from what scripts/compatibility_matrix.py renders: regenerate it "
        "(python scripts/compatibility_matrix.py --render-only), never edit it by hand"
    )
    tiny = {result.id for result in results if result.model in MODELS}
    assert tiny == {cell.id for cell in all_cells()}
    # beside them, the published configs' rows that were run (scripts/compatibility_matrix.py --zoo): zoo cells only
    assert {result.id for result in results} - tiny <= {cell.id for cell in all_cells(list(ZOO))}
    assert all(result.outcome in OUTCOMES for result in results)
    assert all(result.detail is None or "\n" not in result.detail for result in results)
    assert all("export_s" in result.timings for result in results if result.outcome == "pass")
    expected = load_expected()["cells"]
    assert expected == expectations(results), "the expectations file comes from the same run as the docs"


def test_the_published_widths_document_is_generated_and_meets_the_zoo_bar():
    """docs/compatibility_published.* (`scripts/compatibility_matrix.py --zoo`): every zoo model through every format
    at its published widths, rendered from its JSON; at least 95% of the cells pass with every runtime that ran
    passing, and each other cell is an error decided before the export began (the plan or the preflight)."""
    results, meta = read_results(PUBLISHED_JSON)
    assert PUBLISHED_MD.read_text(encoding="utf-8") == render_markdown(results, meta, None), (
        "docs/compatibility_published.md differs from its JSON: python scripts/compatibility_matrix.py --zoo "
        "--render-only")
    assert meta["document"] == PUBLISHED_DOCUMENT and not meta["zoo_run"]["fast"]
    assert {result.id for result in results} == {cell.id for cell in all_cells(list(ZOO))}
    passing = [result for result in results if result.outcome == "pass"]
    assert len(passing) >= 0.95 * len(results)
    assert not [(result.id, check) for result in passing for check in result.runtimes if check["verdict"] == "failed"]
    assert all(result.outcome == "error" and result.stage in ("plan", "preflight")
               for result in results if result.outcome != "pass")


# ── The fast subset (default run) ────────────────────────────────────────────


def _fast_subset_results(request) -> list[CellResult]:
    results = []
    for fixture, name in FAST_SUBSET.items():
        _, report = request.getfixturevalue(fixture)
        for target, target_report in report.targets.items():
            cell = Cell(name, target_report.export_format, target_report.mode)
            results.append(result_from_report(cell, report, target=target))
    return results


def test_fast_subset_one_encoder_and_one_decoder_on_every_format(request):
    results = _fast_subset_results(request)
    for name in FAST_SUBSET.values():
        assert {r.export_format for r in results if r.model == name} == set(FORMATS), name
    expected = load_expected().get("fast_subset", {})
    if os.environ.get("HFEXPORT_UPDATE_EXPECTED"):  # record this run's outcomes (after a deliberate change)
        document = load_expected()
        document["fast_subset"] = expectations(results)
        EXPECTED_FILE.write_text(json.dumps(document, indent=2) + "\n", encoding="utf-8")
        expected = document["fast_subset"]
    assert {r.id for r in results} == set(expected), "the examples' targets changed: update the expectations"
    regressions, newly = compare(results, expected)
    for result in newly:
        warnings.warn(f"{result.id} now passes; record it in {EXPECTED_FILE.name}", NewlyPassingCell, stacklevel=1)
    assert not regressions, "\n".join(f"{r.id}: {r.outcome}: {r.detail}" for r in regressions)
    assert all(r.outcome in OUTCOMES for r in results)


# ── The whole matrix (slow) ──────────────────────────────────────────────────


@pytest.fixture(scope="session")
def matrix_workdir(tmp_path_factory) -> Path:
    return tmp_path_factory.mktemp("matrix")


@pytest.mark.slow
@pytest.mark.parametrize("cell", all_cells(), ids=lambda cell: cell.id)
def test_matrix_cell(cell, matrix_workdir):
    result = run_cell_subprocess(cell, matrix_workdir, timeout=CELL_TIMEOUT_S)
    assert result.outcome in OUTCOMES
    expected = load_expected()["cells"].get(cell.id)
    if result.outcome == "pass" and expected != "pass":
        warnings.warn(f"{cell.id} now passes (expected {expected}); regenerate the matrix", NewlyPassingCell,
                      stacklevel=1)
    if expected == "pass":
        assert result.outcome == "pass", f"{cell.id} regressed: {result.outcome}: {result.detail}"


def test_a_shape_constraint_error_names_the_recipe_field():
    """torch.export's "Constraints violated (seq)!" reads as the recipe's `dims.seq`, with the bound to set."""
    import torch
    from hfexport.job.run import engine_error_message

    class NeedsThree(torch.nn.Module):
        def forward(self, x):
            return x + 1 if x.shape[1] >= 3 else x - 1

    with pytest.raises(Exception) as caught:
        torch.export.export(NeedsThree(), (torch.ones(2, 5),),
                            dynamic_shapes=({1: torch.export.Dim("seq", min=2, max=64)},))
    line = engine_error_message(caught.value)
    assert line.startswith("Recipe `dims.seq`: the model cannot be traced over that range; set `dims.seq.min` 3"), line


def test_the_runtimes_tables_render_the_committed_runtime_rows_over_the_cells_own():
    """docs/llm_runtimes.json (scripts/llm_runtimes.py) replaces a cell's runtime verdicts and adds its own tables
    (the 8-bit ONNX variant), each failure with its reason and, where traced, its cause, as notes."""
    cell = CellResult("tiny-phi3", "onnx", "generation", "pass", None, None, {"export_s": 1.0},
                      [{"runtime": "optimum", "verdict": "passed"}])
    runtimes = {"generated": "2026-12-03T13:00:00Z", "rows": [
        {"model": "tiny-phi3", "format": "onnx", "runtimes": [
            {"runtime": "optimum", "verdict": "failed", "reason": "Got: 4 Expected: 2",
             "cause": "optimum-onnx 0.1.0 reads num_attention_heads for phi3"}]},
        {"model": "tiny-phi3", "format": "onnx-q8", "runtimes": [
            {"runtime": "transformers.js", "verdict": "passed", "precision": "q8"}]},
        {"model": "tiny-llama", "format": "onnx-q8", "runtimes": [], "error": "parity failed: top1 0.5 < 0.9"}]}
    text = render_markdown([cell], {}, runtimes)
    assert "| `tiny-phi3` (Phi-3) | ❌ fail [1](#note-1) [2](#note-2) |" in text
    assert "## Generation in the deployment runtimes (onnx, 8-bit variant `onnx/model_quantized.onnx`)" in text
    assert "| `tiny-phi3` (Phi-3) | ✅ pass |" in text
    assert "optimum: Got: 4 Expected: 2" in text and "optimum-onnx 0.1.0 reads num_attention_heads" in text
    assert "2026-12-03T13:00:00Z" in text
    assert "| `tiny-llama` (Llama) | ➖ not run [3](#note-3) |" in text and "3. <a id=\"note-3\"></a>`tiny-llama/onnx-q8" \
        "/generation`: not run" in text
    assert "not run: the target failed hfexport's own gate first (parity failed: top1 0.5 &lt; 0.9)" in text
