"""The families whose inputs transformers' export input preparers compute (`register_export_input_preparer`), end to
end from a recipe: the recipe's shape contract (text dynamic to a maximum, image tiles fixed, batch 1 for an edge
target) reaches the exported graph's inputs, a sample that breaks it is refused naming the recipe field, and what
the preparer computed is recorded in the report (`prepared_inputs`).

Tiny LLaVA-NeXT (the `image_sizes` preparer: its `image_sizes` tensor becomes Python ints before tracing), one
export on torch.export per session (~30 s). Tiny PaddleOCR-VL (the `grid_thw` family: packed patches with image
grids, 3-axis rope positions from the base model's `get_rope_index`), one edge forward export on torch.export
(~40 s). Tiny MiniCPM-V 4.6 (the `target_sizes` preparer: a NaViT-style encoder's
position ids and window index computed from `target_sizes`, and again at run time from `input_preparers.json`), one
generation export on torch.export per session; its inputs are made the processor's way by
`hfexport.testing.models.minicpm_v_inputs` (which tests/test_processors.py checks against the processor, loaded here
without its video processor).
"""

from __future__ import annotations

import copy
import json
import re
import shutil

import pytest

from hfexport.errors import PlanError
from hfexport.testing.models import IMAGE_SIZE, make_model

TILES = 3  # a 32 x 64 image under anyres pinpoints 32 x 32 / 32 x 64 / 64 x 32: two 32 x 32 crops + the whole image
SEQ = {"min": 70, "max": 200}


def edge_recipe(width: int = 2 * IMAGE_SIZE, text: str = "<image> Describe the picture in one sentence, please.") -> dict:
    """An edge target: batch 1, the text dynamic up to `SEQ.max`, the image tiles fixed (count and size)."""
    fixed_tiles = {"0": 1, "1": TILES, "3": IMAGE_SIZE, "4": IMAGE_SIZE}
    return {
        "recipe_version": 1,
        "task": "image-text-to-text",
        "dims": {"seq": SEQ},
        "sample_inputs": {"text": [text], "images": {"count": 1, "height": IMAGE_SIZE, "width": width}},
        "targets": {"edge": {
            "export_format": "dynamo", "mode": "forward",
            "dynamic_shapes": {"input_ids": {"0": 1, "1": "seq"}, "attention_mask": {"0": 1, "1": "seq"},
                               "pixel_values": fixed_tiles},
            "parity": {"probe": {"seq": [80, SEQ["max"]]}},
        }},
    }


@pytest.fixture(scope="session")
def tiny_llava_next(session_dir):
    return make_model("tiny-llava-next", session_dir / "tiny-llava-next")


def _with_recipe(source, folder, recipe: dict):
    if folder.exists():
        shutil.rmtree(folder)
    shutil.copytree(source, folder)
    (folder / "export_config.json").write_text(json.dumps(recipe), encoding="utf-8")
    return folder


@pytest.fixture(scope="session")
def edge_job(session_dir, tiny_llava_next):
    from hfexport.job.run import run_job

    folder = _with_recipe(tiny_llava_next, session_dir / "llava-next-edge", edge_recipe())
    output = session_dir / "llava-next-edge-out"
    return output, run_job(folder, output, targets=["edge"])


def test_the_recipes_tile_and_text_range_reach_the_graph(edge_job):
    import torch

    output, report = edge_job
    target = report.targets["edge"]
    assert target.status == "ok", target.error
    assert target.verification["passed"], target.verification["failures"]
    probed = {probe["name"] for probe in target.verification["probes"]}
    assert {"seq=80", f"seq={SEQ['max']}"} <= probed
    program = torch.export.load(str(output / "edge" / "model.pt2"))
    shapes = {node.name: node.meta["val"].shape for node in program.graph.nodes if node.op == "placeholder"
              and node.name in ("input_ids", "attention_mask", "pixel_values")}
    assert list(shapes["pixel_values"]) == [1, TILES, 3, IMAGE_SIZE, IMAGE_SIZE]  # the tiles: fixed
    batch, seq = shapes["input_ids"]
    assert batch == 1 and isinstance(seq, torch.SymInt)  # the text: dynamic
    bounds = program.range_constraints[seq.node.expr]
    assert (int(bounds.lower), int(bounds.upper)) == (SEQ["min"], SEQ["max"])
    assert shapes["attention_mask"][1].node.expr == seq.node.expr
    assert target.plan["components"]["model"]["dynamic_axes"]["input_ids"]["1"] == "seq [70, 200]"


def test_the_report_records_what_the_preparer_computed(edge_job):
    from hfexport.report.data import validate_report

    output, report = edge_job
    prepared = report.targets["edge"].prepared_inputs
    # transformers' `image_sizes` preparer: the processor's [1, 2] tensor, as the Python ints the graph is traced on
    assert prepared == {"model": {"image_sizes": {
        "kind": "replaced", "from": {"shape": [1, 2], "dtype": "int64", "value": [[IMAGE_SIZE, 2 * IMAGE_SIZE]]},
        "python": "list", "value": [[IMAGE_SIZE, 2 * IMAGE_SIZE]]}}}
    written = json.loads((output / "export_report.json").read_text(encoding="utf-8"))
    validate_report(written)
    assert written["targets"]["edge"]["prepared_inputs"] == prepared
    from hfexport.report.markdown import report_markdown

    assert ("Computed by the engine's input preparers before tracing: model: `image_sizes` replaced (list)."
            in report_markdown(report))


@pytest.mark.parametrize("recipe, field, expectation", [
    (edge_recipe(width=IMAGE_SIZE, text="<image> " + "The quick brown fox jumps over the lazy dog. " * 3),
     "targets.edge.dynamic_shapes.pixel_values.1",
     f"the recipe pins this axis to {TILES}, but the sample input has size 2"),
    (edge_recipe(text="<image> " + "The quick brown fox jumps over the lazy dog. " * 20),
     "targets.edge.dynamic_shapes.input_ids.1", "outside dim 'seq' [70, 200]"),
], ids=["another-tile-count", "text-past-the-maximum"])
def test_a_sample_outside_the_contract_is_refused_naming_the_field(session_dir, tiny_llava_next, recipe, field,
                                                                     expectation):
    from transformers import AutoModelForImageTextToText

    from hfexport.models import load_processor
    from hfexport.plan import build_plan
    from hfexport.recipe.loading import load_recipe

    folder = _with_recipe(tiny_llava_next, session_dir / "llava-next-mismatch", recipe)
    model = AutoModelForImageTextToText.from_pretrained(folder).eval()
    with pytest.raises(PlanError) as refused:
        build_plan(load_recipe(folder), "edge", model, processor=load_processor(folder))
    assert str(refused.value).startswith(f"{field}:") and expectation in str(refused.value)


def test_a_component_traced_on_python_ints_is_fed_them():
    """transformers' `image_sizes` preparer traces a component on Python ints (its metadata: a list); `generate` and
    the probes hold the processor's tensor, which the graph's input spec refuses ("Trying to flatten user inputs")."""
    from types import SimpleNamespace

    import torch

    from hfexport.generate import as_traced

    runner = SimpleNamespace(metadata=SimpleNamespace(kwargs={
        "pixel_values": {"rank": 5, "shape": [1, 3, 3, 32, 32], "dtype": "float32"}, "image_sizes": {"container": "list"}}))
    pixels = torch.zeros(1, 3, 3, 32, 32)
    fed = as_traced(runner, {"pixel_values": pixels, "image_sizes": torch.tensor([[32, 64]])})
    assert fed["image_sizes"] == [(32, 64)] and fed["pixel_values"] is pixels


def test_a_text_growing_probe_keeps_each_rows_image_tokens():
    import torch

    from hfexport.verify.probes import keep_image_tokens

    image = 9
    sample = {"input_ids": torch.tensor([[0, image, image, 5, 6], [image, image, 7, 8, 4]])}
    grown = {"input_ids": torch.cat([sample["input_ids"], sample["input_ids"][:, :3]], dim=1)}  # cyclic tiling
    kept = keep_image_tokens(grown, sample, image)["input_ids"]
    assert ((kept == image).sum(-1) == 2).all()
    assert kept.tolist() == [[0, image, image, 5, 6, 0, 6, 6], [image, image, 7, 8, 4, 4, 4, 7]]
    assert keep_image_tokens(sample, sample, image) is sample  # not grown: as it was


@pytest.fixture(scope="session")
def llava_next_generation(session_dir, tiny_llava_next):
    """tiny-llava-next's `dynamo-generation` target, exported and verified by the job: (output folder, JobReport)."""
    from hfexport.job.run import run_job

    output = session_dir / "llava-next-generation"
    return output, run_job(tiny_llava_next, output, targets=["dynamo-generation"])


def test_llava_next_generates_token_for_token_from_new_images(llava_next_generation, tiny_llava_next):
    """The `.pt2` image encoder is traced on the preparer's Python-int `image_sizes`; `generate` feeds the
    processor's tensor as those ints, and an image the export never saw (same size: the tile contract) generates
    what `model.generate` does, batched and left-padded."""
    import numpy as np
    import torch
    from transformers import AutoProcessor, LlavaNextForConditionalGeneration

    from hfexport import ExportedModel

    output, report = llava_next_generation
    target = report.targets["dynamo-generation"]
    assert target.status == "ok" and target.verification["passed"], target.verification["failures"]
    assert target.verification["generation"]["token_agreement"] == 1.0
    assert target.prepared_inputs["image_encoder"]["image_sizes"]["kind"] == "replaced"
    model = LlavaNextForConditionalGeneration.from_pretrained(tiny_llava_next).eval()
    processor = AutoProcessor.from_pretrained(tiny_llava_next)
    rng = np.random.default_rng(7)
    images = [rng.integers(0, 256, (IMAGE_SIZE, 2 * IMAGE_SIZE, 3), dtype=np.uint8) for _ in range(2)]
    inputs = dict(processor(text=["<image> What is this?", "<image> The quick brown fox jumps"], images=images,
                            return_tensors="pt", padding=True))
    with torch.no_grad():
        expected = model.generate(**inputs, max_new_tokens=8, do_sample=False)
    exported = ExportedModel.from_pretrained(output / "dynamo-generation")
    assert torch.equal(exported.generate(**inputs, max_new_tokens=8), expected)


# ── The grid_thw family: tiny PaddleOCR-VL (Qwen2-VL-class vision; Qwen2-VL's processor needs torchvision) ──────


@pytest.fixture(scope="session")
def tiny_paddleocr_vl(session_dir):
    return make_model("tiny-paddleocr-vl", session_dir / "tiny-paddleocr-vl")


def _paddleocr_vl_inputs(folder):
    """The matrix recipe's sample through the model's real processor (PIL images): packed patches + image grids."""
    from transformers import AutoModelForImageTextToText

    from hfexport.inputs import build_sample_inputs
    from hfexport.models import load_processor
    from hfexport.recipe.loading import load_recipe

    recipe = load_recipe(folder)
    model = AutoModelForImageTextToText.from_pretrained(folder).eval()
    return model, build_sample_inputs(recipe, load_processor(folder), model.config, recipe.task, "forward")


def test_the_engine_alone_computes_no_rope_index_for_the_outer_model(tiny_paddleocr_vl):
    """Canary of `workarounds.transformers_models.base_rope_index`: transformers 5.23's preparers look for
    `get_rope_index` on the traced module only, and PaddleOCR-VL's (like Qwen2-VL's) is on its base model; once the
    engine computes the positions itself, the workaround can go."""
    from transformers.exporters.utils import prepare_for_export

    from hfexport.workarounds.transformers_models import base_rope_index

    model, inputs = _paddleocr_vl_inputs(tiny_paddleocr_vl)
    assert list(inputs["image_grid_thw"].tolist()) == [[1, 4, 8], [1, 4, 8]]  # 32 x 64 pixels, 8 x 8 patches
    assert list(inputs["pixel_values"].shape) == [64, 3, 8, 8]  # two images' patches, packed
    _, prepared, _ = prepare_for_export(model, dict(inputs))
    assert prepared.get("position_ids") is None
    positions = base_rope_index(model, dict(prepared))["position_ids"]
    expected, _ = model.model.get_rope_index(inputs["input_ids"], image_grid_thw=inputs["image_grid_thw"],
                                             attention_mask=inputs["attention_mask"],
                                             mm_token_type_ids=inputs["mm_token_type_ids"])
    assert positions.shape == (3, *inputs["input_ids"].shape) and (positions == expected).all()


def test_a_grid_thw_generation_plans_an_image_encoder_per_image_and_3_axis_positions(tiny_paddleocr_vl):
    """The plan of a grid_thw (M-RoPE) generation: hfexport's image encoder on one image's packed patches (the
    grid's first row: the sample's two images are split by their grids), and the engine's language model and decode
    on the text + (t, h, w) rope positions that hfexport's generate computes (tests/test_generate_mrope.py)."""
    from hfexport.models import load_processor
    from hfexport.plan import build_plan
    from hfexport.recipe.loading import load_recipe

    model, _ = _paddleocr_vl_inputs(tiny_paddleocr_vl)
    plan = build_plan(load_recipe(tiny_paddleocr_vl), "dynamo-generation", model,
                      processor=load_processor(tiny_paddleocr_vl))
    assert list(plan.components) == ["image_encoder", "embed", "language_model", "lm_head", "decode"]
    shapes = {name: component.input_shapes for name, component in plan.components.items()}
    assert shapes["image_encoder"]["pixel_values"]["shape"] == [PADDLE_PATCHES, 3, 8, 8]
    assert shapes["image_encoder"]["image_grid_thw"]["shape"] == [1, 3]
    assert shapes["language_model"]["position_ids"]["shape"][:2] == [4, 2]
    assert shapes["decode"]["position_ids"]["shape"] == [4, 2, 1]


PADDLE_PATCHES = 32  # a 32 x 64 image in 8 x 8 patches: image_grid_thw [1, 4, 8]
PADDLE_SEQ = {"min": 20, "max": 120}


def paddleocr_vl_edge_recipe(height: int = IMAGE_SIZE, width: int = 2 * IMAGE_SIZE) -> dict:
    """The edge contract on the grid_thw family: batch 1, the text dynamic to `PADDLE_SEQ.max`, the image fixed (its
    packed patches and grid); the rope `position_ids` the engine's preparer adds follow the text (named as prepared)."""
    from hfexport.testing.models import PADDLEOCR_VL_PROMPT

    text = {"0": 1, "1": "seq"}
    return {
        "recipe_version": 1,
        "task": "image-text-to-text",
        "dims": {"seq": PADDLE_SEQ},
        "sample_inputs": {"text": [f"{PADDLEOCR_VL_PROMPT} Describe the picture in one sentence, please."],
                          "images": {"count": 1, "height": height, "width": width}},
        "targets": {"edge": {
            "export_format": "dynamo", "mode": "forward",
            "dynamic_shapes": {"input_ids": text, "attention_mask": text, "mm_token_type_ids": text,
                               "position_ids": {"1": 1, "2": "seq"}, "pixel_values": {"0": PADDLE_PATCHES},
                               "image_grid_thw": {"0": 1}},
            "parity": {"probe": {"seq": [40, PADDLE_SEQ["max"]]}},
        }},
    }


@pytest.fixture(scope="session")
def paddleocr_vl_edge(session_dir, tiny_paddleocr_vl):
    from hfexport.job.run import run_job

    folder = _with_recipe(tiny_paddleocr_vl, session_dir / "paddleocr-vl-edge", paddleocr_vl_edge_recipe())
    output = session_dir / "paddleocr-vl-edge-out"
    return output, run_job(folder, output, targets=["edge"])


def test_a_grid_thw_edge_contract_reaches_the_graph(paddleocr_vl_edge):
    """Probes grow the text to 40 and 120 tokens around the fixed image (placeholders and their `mm_token_type_ids`
    kept, the rope positions recomputed per probe by the preparer) and match eager."""
    import torch

    output, report = paddleocr_vl_edge
    target = report.targets["edge"]
    assert target.status == "ok", target.error
    assert target.verification["passed"], target.verification["failures"]
    assert {probe["name"] for probe in target.verification["probes"]} >= {"seq=40", f"seq={PADDLE_SEQ['max']}"}
    program = torch.export.load(str(output / "edge" / "model.pt2"))
    shapes = {node.name: node.meta["val"].shape for node in program.graph.nodes if node.op == "placeholder"}
    assert list(shapes["pixel_values"]) == [PADDLE_PATCHES, 3, 8, 8]  # the image: fixed
    assert list(shapes["image_grid_thw"]) == [1, 3]
    batch, seq = shapes["input_ids"]
    assert batch == 1 and isinstance(seq, torch.SymInt)  # the text: dynamic
    bounds = program.range_constraints[seq.node.expr]
    assert (int(bounds.lower), int(bounds.upper)) == (PADDLE_SEQ["min"], PADDLE_SEQ["max"])
    assert shapes["position_ids"][0] == 3 and shapes["position_ids"][2].node.expr == seq.node.expr
    # the text's 3-axis rope positions, computed before tracing by the engine's preparer on the base model: one
    # more input of the graph, recorded in the report
    sample = target.plan["components"]["model"]["input_shapes"]["input_ids"]["shape"]
    assert target.prepared_inputs == {"model": {"position_ids": {"kind": "added", "shape": [3, *sample],
                                                                 "dtype": "int64"}}}


def test_a_grid_thw_image_of_another_size_is_refused_naming_the_field(session_dir, tiny_paddleocr_vl):
    from transformers import AutoModelForImageTextToText

    from hfexport.models import load_processor
    from hfexport.plan import build_plan
    from hfexport.recipe.loading import load_recipe

    folder = _with_recipe(tiny_paddleocr_vl, session_dir / "paddleocr-vl-mismatch",
                          paddleocr_vl_edge_recipe(height=2 * IMAGE_SIZE, width=2 * IMAGE_SIZE))
    model = AutoModelForImageTextToText.from_pretrained(folder).eval()
    with pytest.raises(PlanError) as refused:
        build_plan(load_recipe(folder), "edge", model, processor=load_processor(folder))
    assert str(refused.value).startswith("targets.edge.dynamic_shapes.")
    assert f"the recipe pins this axis to {PADDLE_PATCHES}, but the sample input has size" in str(refused.value)


def test_a_text_growing_probe_marks_the_turned_placeholders_as_text():
    """The rope index groups image grids by `mm_token_type_ids`: a tiled placeholder turned into text is text there."""
    import torch

    from hfexport.verify.probes import keep_image_tokens

    image = 9
    sample = {"input_ids": torch.tensor([[0, image, image, 5, 6]]), "mm_token_type_ids": torch.tensor([[0, 1, 1, 0, 0]])}
    grown = {name: torch.cat([value, value[:, :3]], dim=1) for name, value in sample.items()}
    kept = keep_image_tokens(grown, sample, image)
    assert kept["input_ids"].tolist() == [[0, image, image, 5, 6, 0, 6, 6]]
    assert kept["mm_token_type_ids"].tolist() == [[0, 1, 1, 0, 0, 0, 0, 0]]


# ── The `target_sizes` family: tiny MiniCPM-V 4.6 (NaViT-style packed vision encoder) ────────────────────────────


@pytest.fixture(scope="session")
def tiny_minicpm_v(session_dir):
    return make_model("tiny-minicpm-v", session_dir / "tiny-minicpm-v")


def _minicpm_v_image(seed: int):
    import numpy as np
    from PIL import Image

    from hfexport.testing.models import MINICPM_V_IMAGE

    shape = (MINICPM_V_IMAGE["height"], MINICPM_V_IMAGE["width"], 3)
    return Image.fromarray(np.random.default_rng(seed).integers(0, 256, shape, dtype=np.uint8))


@pytest.fixture(scope="session")
def minicpm_v_generation(session_dir, tiny_minicpm_v):
    """tiny-minicpm-v's `dynamo-generation` target (batch 1, one fixed-size image), exported and verified by the job
    from the processor's inputs made without it (`minicpm_v_inputs`): (output folder, JobReport)."""
    from hfexport.job.run import run_job
    from hfexport.testing.models import minicpm_v_inputs

    inputs = minicpm_v_inputs(tiny_minicpm_v, ["<image> Describe the picture"], [_minicpm_v_image(0)])
    output = session_dir / "minicpm-v-generation"
    return output, run_job(tiny_minicpm_v, output, targets=["dynamo-generation"], inputs=inputs)


def test_minicpm_v_generates_token_for_token_from_new_images(minicpm_v_generation, tiny_minicpm_v):
    """The `target_sizes` preparer adds the image encoder's nearest position ids, window index and window lengths at
    export; the export records what computing them again needs (`input_preparers.json`), so generating from the files
    on images the export never saw (same size: the contract) gives `model.generate`'s tokens with no torch model."""
    import torch
    from transformers import AutoModelForImageTextToText

    from hfexport import ExportedModel
    from hfexport.testing.models import minicpm_v_inputs

    output, report = minicpm_v_generation
    target = report.targets["dynamo-generation"]
    assert target.status == "ok" and target.verification["passed"], target.verification["failures"]
    assert target.verification["generation"]["token_agreement"] == 1.0
    prepared = target.prepared_inputs["image_encoder"]
    assert {"position_ids", "window_index", "cu_window_seqlens", "merged_shape"} <= set(prepared)
    assert prepared["window_index"]["kind"] == "added" and prepared["window_index"]["shape"] == [64]
    exported = ExportedModel.from_pretrained(output / "dynamo-generation")
    assert exported.input_preparers["image_encoder"]["attributes"] == {
        "num_patches_per_side": 16, "window_kernel_size": [2, 2], "patch_size": 4}
    model = AutoModelForImageTextToText.from_pretrained(tiny_minicpm_v).eval()
    for seed, text in ((7, "<image> What is this?"), (8, "<image> The quick brown fox jumps over the lazy dog")):
        inputs = minicpm_v_inputs(tiny_minicpm_v, [text], [_minicpm_v_image(seed)])
        with torch.no_grad():
            expected = model.generate(**inputs, max_new_tokens=8, do_sample=False)
        assert torch.equal(exported.generate(**inputs, max_new_tokens=8), expected)


def test_a_broken_input_preparers_file_is_refused_naming_the_field(minicpm_v_generation, tmp_path):
    from hfexport import ExportedModel
    from hfexport.errors import CorruptExportError

    output, _ = minicpm_v_generation
    folder = tmp_path / "export"
    shutil.copytree(output / "dynamo-generation", folder)
    data = json.loads((folder / "input_preparers.json").read_text(encoding="utf-8"))
    data["image_encoder"]["attributes"]["__class__"] = "os.system"
    (folder / "input_preparers.json").write_text(json.dumps(data), encoding="utf-8")
    with pytest.raises(CorruptExportError) as refused:
        ExportedModel.from_pretrained(folder)
    assert "input_preparers.json: $.image_encoder.attributes.__class__: expected one of" in str(refused.value)


@pytest.mark.slow
@pytest.mark.parametrize("export_format", ["onnx", "openvino"])
def test_minicpm_v_generates_token_for_token_in_onnx_and_openvino(export_format, session_dir, tiny_minicpm_v):
    """As on torch.export: the job's gate passes, and the saved files generate `model.generate`'s tokens on new
    images, each prepared from `input_preparers.json` (about 5 min per format at load 25 on 2 cores)."""
    import torch
    from transformers import AutoModelForImageTextToText

    from hfexport import ExportedModel
    from hfexport.job.run import run_job
    from hfexport.testing.models import minicpm_v_inputs

    target = f"{export_format}-generation"
    inputs = minicpm_v_inputs(tiny_minicpm_v, ["<image> Describe the picture"], [_minicpm_v_image(0)])
    output = session_dir / f"minicpm-v-{target}"
    report = run_job(tiny_minicpm_v, output, targets=[target], inputs=inputs)
    checked = report.targets[target]
    assert checked.status == "ok" and checked.verification["passed"], checked.verification["failures"]
    assert checked.verification["generation"]["token_agreement"] == 1.0
    exported = ExportedModel.from_pretrained(output / target)
    model = AutoModelForImageTextToText.from_pretrained(tiny_minicpm_v).eval()
    for seed, text in ((7, "<image> What is this?"), (8, "<image> The quick brown fox jumps over the lazy dog")):
        prompt = minicpm_v_inputs(tiny_minicpm_v, [text], [_minicpm_v_image(seed)])
        with torch.no_grad():
            expected = model.generate(**prompt, max_new_tokens=8, do_sample=False)
        assert torch.equal(exported.generate(**prompt, max_new_tokens=8), expected)


def test_an_uploaded_image_that_breaks_the_tile_contract_is_refused_naming_the_field(session_dir, tiny_llava_next,
                                                                                     tmp_path):
    """A person's own image (`sample_files`, the Space's upload) is held to the recipe's contract like a synthesized
    one: a square photo tiles into 2 crops under anyres, where the edge target pins 3, so the plan refuses it naming
    the field, before anything is traced."""
    import numpy as np
    from PIL import Image
    from transformers import AutoModelForImageTextToText

    from hfexport.models import load_processor
    from hfexport.plan import build_plan
    from hfexport.recipe.loading import load_recipe
    from hfexport.samples import read_sample

    recipe = edge_recipe(text="<image> " + "The quick brown fox jumps over the lazy dog. " * 3)
    folder = _with_recipe(tiny_llava_next, session_dir / "llava-next-upload", recipe)
    Image.fromarray(np.random.default_rng(0).integers(0, 256, (64, 64, 3), dtype=np.uint8)).save(tmp_path / "sq.png")
    model = AutoModelForImageTextToText.from_pretrained(folder).eval()
    with pytest.raises(PlanError) as refused:
        build_plan(load_recipe(folder), "edge", model, processor=load_processor(folder),
                   samples={"image": read_sample(tmp_path / "sq.png", "image")})
    assert str(refused.value).startswith("targets.edge.dynamic_shapes.pixel_values.1:")
    assert f"the recipe pins this axis to {TILES}, but the sample input has size 2" in str(refused.value)


@pytest.mark.parametrize("name, unreached", [
    ("tiny-minicpm-v", "window_index, cu_window_seqlens, merged_shape, max_seqlen"),
    ("tiny-qwen3-asr", "cu_seqlens, max_seqlen"),
])
def test_a_forward_whose_prepared_inputs_cannot_reach_their_encoder_is_refused_at_plan_time(session_dir, name,
                                                                                          unreached):
    """The engine's preparers fire on the whole model's inputs, but MiniCPM-V's and Qwen3-ASR's forward take what
    they computed as **kwargs only and call their encoder without it: torch.export then stopped at the encoder's own
    data-dependent computation after the trace (the matrix's GuardOnDataDependentSymNode); the plan says so first.
    Both generations plan, with the encoder as a component that takes the prepared inputs (Qwen3-ASR's audio encoder
    traced on one clip, beside hfexport's `embed` of the audio features). Their ExecuTorch generations are refused
    at plan time with the lowering's own message (each stopped there after minutes of export)."""
    from transformers import AutoModelForImageTextToText, AutoModelForSpeechSeq2Seq

    from hfexport.models import load_processor
    from hfexport.plan import build_plan
    from hfexport.recipe.loading import load_recipe

    folder = make_model(name, session_dir / "unreached" / name)
    loader = AutoModelForSpeechSeq2Seq if name == "tiny-qwen3-asr" else AutoModelForImageTextToText
    model, processor, recipe = loader.from_pretrained(folder).eval(), load_processor(folder), load_recipe(folder)
    with pytest.raises(PlanError) as refused:
        build_plan(recipe, "onnx-forward", model, processor=processor)
    assert str(refused.value).startswith(f"{type(model).__name__}: the engine's input preparers computed {unreached} "
                                         "for the whole model, but its forward takes them only as **kwargs")
    assert "GuardOnDataDependentSymNode" in str(refused.value)
    plan = build_plan(recipe, "onnx-generation", model, processor=processor)
    encoder = "audio_encoder" if name == "tiny-qwen3-asr" else "image_encoder"
    assert set(unreached.split(", ")) <= set(plan.components[encoder].prepared_inputs)
    assert "embed" in plan.components
    if name == "tiny-qwen3-asr":  # the engine's own batch export of its encoder stops on ExecuTorch: said first
        with pytest.raises(PlanError, match=r"^Qwen3ASRForConditionalGeneration: the engine exports its own "
                                            r"Qwen3ASREncoder on the whole batch's clips \(2 attention windows\).*"
                                            r"Cannot evaluate a finite upper bound"):
            build_plan(recipe, "executorch-generation", model, processor=processor)
    if name == "tiny-minicpm-v":  # ExecuTorch's to_edge stopped on the merger's data-sized slice after the export
        with pytest.raises(PlanError, match=r"^MiniCPMV4_6ForConditionalGeneration: its vision tower "
                                            r"\(MiniCPMV4_6VisionModel, over packed patches sized by `target_sizes`' "
                                            r"values\) cannot be lowered to executorch: .*GuardOnDataDependentSymNode"):
            build_plan(recipe, "executorch-generation", model, processor=processor)


def test_a_grid_thw_vision_tower_is_refused_for_executorch_at_plan_time(tiny_paddleocr_vl):
    """ExecuTorch's to_edge refused the tower's `aten.repeat_interleave.Tensor` after minutes of export (PaddleOCR-VL's
    and Qwen2-VL's matrix cells); the plan refuses it first, quoting that message."""
    from hfexport.models import load_processor
    from hfexport.plan import build_plan
    from hfexport.recipe.loading import load_recipe

    model, _ = _paddleocr_vl_inputs(tiny_paddleocr_vl)
    with pytest.raises(PlanError) as refused:
        build_plan(load_recipe(tiny_paddleocr_vl), "executorch-forward", model,
                   processor=load_processor(tiny_paddleocr_vl))
    assert str(refused.value).startswith("targets.executorch-forward: PaddleOCRVLForConditionalGeneration: its vision "
                                         "tower (PaddleOCRVisionModel, over packed patches with `grid_thw`)")
    assert "aten.repeat_interleave.Tensor is not in Core ATen opset" in str(refused.value)


def test_an_omni_thinker_forward_is_refused_and_its_generation_plans_an_audio_merge(session_dir):
    """Qwen2.5-Omni's thinker, its processor loaded without the video part: the forward computes the audio
    encoder's `feature_lens` inside, so the engine's omni-audio preparer never fires (torch.export stopped at the
    mask after the trace): refused first. Its generation plans the audio encoder on one clip, with the preparer's
    inputs, and hfexport's `embed` of the audio features at the audio tokens; a clip of several attention windows
    plans the encoder on one window, and an encoder whose windows are not independent (an odd `n_window`) is refused."""
    from transformers import AutoModelForImageTextToText

    from hfexport.inputs import build_sample_inputs
    from hfexport.models import load_processor
    from hfexport.plan import build_plan
    from hfexport.plan.vision_language import encoder_embed_stages
    from hfexport.recipe.loading import load_recipe

    folder = make_model("tiny-qwen2.5-omni", session_dir / "omni-plan")
    model, processor, recipe = (AutoModelForImageTextToText.from_pretrained(folder).eval(), load_processor(folder),
                                load_recipe(folder))
    with pytest.raises(PlanError, match=r"^Qwen2_5OmniThinkerForConditionalGeneration: its audio encoder "
                                        r"\(Qwen2_5OmniAudioEncoder\) takes `feature_lens`.*GuardOnDataDependentSymNode"):
        build_plan(recipe, "openvino-forward", model, processor=processor)
    plan = build_plan(recipe, "openvino-generation", model, processor=processor)
    assert list(plan.components) == ["audio_encoder", "language_model", "lm_head", "decode", "embed"]
    assert plan.retraced == ("audio_encoder",)
    prepared = plan.components["audio_encoder"].prepared_inputs
    assert {"padded_feature", "chunk_lengths", "cu_seqlens", "valid_indices", "pool_indices"} <= set(prepared)
    assert prepared["cu_seqlens"]["value"] == [0, 50]  # one clip (1 s), one attention window
    assert plan.components["embed"].input_shapes["audio_features"]["shape"] == [50, 64]  # 25 per clip
    # the encoder's windowed attention splits a clip's frames with `.tolist()`, which the trace does not keep (the
    # ONNX encoder attended across the windows): clips of two windows plan the encoder on one window, which
    # `generate` runs once per window, the features concatenated (checked equal to the whole clip's at plan time)
    longer = session_dir / "omni-two-windows"
    shutil.copytree(folder, longer, dirs_exist_ok=True)
    document = json.loads((longer / "export_config.json").read_text(encoding="utf-8"))
    document["sample_inputs"]["audio"]["seconds"] = 1.5  # 150 mel frames: chunks of 100 and 50
    (longer / "export_config.json").write_text(json.dumps(document), encoding="utf-8")
    plan = build_plan(load_recipe(longer), "onnx-generation", model, processor=processor)
    assert plan.components["audio_encoder"].prepared_inputs["cu_seqlens"]["value"] == [0, 50]  # the first window
    assert plan.components["embed"].input_shapes["audio_features"]["shape"] == [74, 64]  # 25 + 12 per clip
    # an odd `n_window` (49 frames per window after the convolution) pairs frames across two windows in the encoder's
    # stride-2 pooling: the windows are not independent, refused before export with what differs (checked where the
    # plan checks it, before the merge: the engine's split of generate is not needed for it)
    config = copy.deepcopy(model.config)
    config.audio_config.n_window = 49
    odd = type(model)(config).eval()
    recipe = load_recipe(longer)
    inputs = build_sample_inputs(recipe, processor, config, recipe.task, "generation")
    with pytest.raises(PlanError) as refused:
        encoder_embed_stages(odd, inputs, {}, "audio")
    assert re.match(r"Qwen2_5OmniThinkerForConditionalGeneration: its audio encoder \(Qwen2_5OmniAudioEncoder\) run "
                    r"once per attention window \(98 frames\) on the recipe's clip 0 \(2 windows\) gives max_abs "
                    r"0\.\d+ against the whole clip \(bound 1e-05\): its windows are not independent", str(refused.value))
