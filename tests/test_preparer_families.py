"""The families whose inputs transformers' export input preparers compute (`register_export_input_preparer`), end to
end from a recipe: the recipe's shape contract (text dynamic to a maximum, image tiles fixed, batch 1 for an edge
target) reaches the exported graph's inputs, a sample that breaks it is refused naming the recipe field, and what
the preparer computed is recorded in the report (`prepared_inputs`).

Tiny LLaVA-NeXT (the `image_sizes` preparer: its `image_sizes` tensor becomes Python ints before tracing), one
export on torch.export per session (~30 s).
"""

from __future__ import annotations

import json
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
    from hfexport.report.model import validate_report

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
