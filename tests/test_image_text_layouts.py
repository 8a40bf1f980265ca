"""A vision-language ONNX generation export in transformers.js' image-text-to-text layout: `vision_encoder.onnx`,
`embed_tokens.onnx` and `decoder_model_merged.onnx` beside hfexport's own components
(`hfexport.formats.onnx.image_text_contract`), opened by transformers.js' `AutoModelForImageTextToText` in the gate.

The tiny LLaVA export is the session's (`llava_job`: its gate ran the ONNX runtimes); the names and shapes checked here
are those transformers.js 4.3.2 reads (src/models/session_config.js, src/models/modeling_utils.js).
"""

from __future__ import annotations

import json
import os

import pytest

TARGET = "onnx-generation"
PROMPTS = ["<image> Describe the picture", "<image> The capital of France is"]


def _io(path) -> tuple[list, list]:
    """A graph's inputs and outputs as (name, dims) pairs, dims as the file names them."""
    import onnx

    graph = onnx.load(str(path), load_external_data=False).graph

    def dims(value):
        return [dim.dim_param or dim.dim_value for dim in value.type.tensor_type.shape.dim]

    return [(value.name, dims(value)) for value in graph.input], [(value.name, dims(value)) for value in graph.output]


def _exported_through_transformers_js(name: str, session_dir, runtime_env):
    """Tiny model `name` built and exported to TARGET by a job whose gate ran the ONNX runtimes, transformers.js
    passing at batch 1: (the model's folder, the job's output folder)."""
    from unittest import mock

    from hfexport.job.run import run_job
    from hfexport.testing.models import make_model

    model = make_model(name, session_dir / f"{name}-js")
    output = session_dir / f"{name.removeprefix('tiny-')}-js"
    with mock.patch.dict(os.environ, runtime_env):
        report = run_job(model, output, [TARGET], latency=False)
    target = report.targets[TARGET]
    assert target.status == "ok", target.error
    js = {check["runtime"]: check for check in target.runtimes}["transformers.js"]
    assert (js["verdict"], js["batch_sizes"]) == ("passed", [1]), js
    return model, output


def _eager_new_tokens(model, inputs) -> list[int]:
    """`model.generate`'s greedy new tokens (8) for the processor's `inputs` of one prompt."""
    import torch

    with torch.no_grad():
        out = model.generate(**inputs, do_sample=False, max_new_tokens=8)
    return out[0, inputs["input_ids"].shape[1]:].tolist()


def test_the_export_is_in_transformers_js_image_text_to_text_layout(llava_job):
    """The three sessions transformers.js opens for an image-text-to-text model, with the names it feeds and reads,
    the past's heads and head size static (it builds the first step's empty past from the metadata), the image
    processor flat in preprocessor_config.json; hfexport's own components stay what its runner reads."""
    folder = llava_job[0] / TARGET
    assert _io(folder / "vision_encoder.onnx") == ([("pixel_values", [1, 3, 32, 32])], [("image_features", [16, 64])])
    assert _io(folder / "embed_tokens.onnx") == ([("input_ids", ["batch_size", "sequence_length"])],
                                                 [("inputs_embeds", ["batch_size", "sequence_length", 64])])
    inputs, outputs = _io(folder / "decoder_model_merged.onnx")
    past = [(f"past_key_values.{layer}.{part}", ["batch_size", 2, "past_sequence_length", 16])
            for layer in (0, 1) for part in ("key", "value")]
    assert inputs == [("inputs_embeds", ["batch_size", "sequence_length", 64]),
                      ("attention_mask", ["batch_size", "total_sequence_length"]),
                      ("position_ids", ["batch_size", "sequence_length"]), *past, ("use_cache_branch", [1])]
    assert outputs == [("logits", ["batch_size", "sequence_length", 320]),
                       *[(name.replace("past_key_values", "present"), [batch, heads, "total_sequence_length", size])
                         for name, (batch, heads, _, size) in past]]
    for name in ("vision_encoder.onnx", "embed_tokens.onnx", "decoder_model_merged.onnx"):
        assert (folder / (name + "_data")).is_file()  # the external data name transformers.js downloads
    flat = json.loads((folder / "preprocessor_config.json").read_text())
    assert flat["image_processor_type"] == "CLIPImageProcessor" and flat["crop_size"] == {"height": 32, "width": 32}
    assert flat["processor_class"] == "LlavaProcessor"  # transformers.js' AutoProcessor picks the processor by it
    manifest = json.loads((folder / "export.json").read_text())
    assert [entry["file"] for entry in manifest["components"].values()] == [
        "image_encoder.onnx", "embed.onnx", "language_model.onnx", "lm_head.onnx", "decode.onnx"]


def test_the_gate_ran_transformers_js_on_the_image_prompts_token_for_token(llava_job):
    """The job's gate: transformers.js generated `model.generate`'s tokens for each image prompt (batch 1: the image
    encoder is traced on one prompt's images); optimum and onnxruntime-genai have no VLM layout here."""
    runtimes = {check["runtime"]: check for check in llava_job[1].targets[TARGET].runtimes}
    js = runtimes["transformers.js"]
    assert (js["verdict"], js["batch_sizes"], js["precision"], js["version"]) == ("passed", [1], "fp32", "4.3.2"), js
    assert {runtimes[name]["verdict"] for name in ("optimum", "onnxruntime-genai")} == {"not_checked"}


def test_transformers_js_reads_the_images(llava_job, llava):
    """Not a check that passes whatever the image: the same prompts with other pixels are judged against the tokens
    of the images the model saw, and transformers.js, fed the other pixels, generates other tokens."""
    import numpy as np
    import torch

    from hfexport.deployment import GenerationRequest
    from hfexport.formats.onnx.runtimes import transformers_js
    from hfexport.testing import peers

    model, processor = llava
    rng = np.random.default_rng(3)
    images = [rng.integers(0, 256, (48, 40, 3), dtype=np.uint8)]  # one prompt: the runtime's start is the cost
    inputs = processor(text=PROMPTS[:1], images=images, return_tensors="pt", padding=True)
    prompts, expected = [], []
    for row, mask in enumerate(inputs["attention_mask"].bool()):
        ids = inputs["input_ids"][row][mask]
        with torch.no_grad():
            out = model.generate(input_ids=ids[None], attention_mask=torch.ones_like(ids)[None], do_sample=False,
                                 pixel_values=inputs["pixel_values"][row: row + 1], max_new_tokens=8)
        prompts.append(ids.tolist())
        expected.append(out[0, len(ids):].tolist())
    request = GenerationRequest(prompts=prompts, expected=expected, max_new_tokens=8, eos_token_id=[1],
                                pad_token_id=2, padded_expected=None, model_type="llava",
                                extra={"pixel_values": (1.0 - inputs["pixel_values"]).numpy()})
    with pytest.MonkeyPatch.context() as patch:
        patch.setenv("HFEXPORT_RUNTIME_TRANSFORMERS_JS", str(peers.node_modules()))
        check = transformers_js.check_generation(llava_job[0] / TARGET, request)
    assert check.verdict == "failed" and check.first_difference is not None, check


def test_a_vlm_without_the_layout_is_not_checked_with_why(tmp_path):
    """A VLM folder without the three graphs (image sizes: LLaVA-NeXT; an export saved before): not
    checked, saying which layout it lacks; transformers.js is not refused before the export for a LLaVA config."""
    import numpy as np

    from hfexport.deployment import GenerationRequest
    from hfexport.formats.onnx.runtimes import transformers_js

    request = GenerationRequest(prompts=[[5, 3, 6]], expected=[[7]], max_new_tokens=1, eos_token_id=[1],
                                extra={"pixel_values": np.zeros((1, 3, 4, 4), dtype=np.float32)})
    check = transformers_js.check_generation(tmp_path, request)
    assert (check.verdict, check.reason) == ("not_checked", transformers_js.NOT_IN_IMAGE_TEXT_CONTRACT)
    assert transformers_js.limitation({"model_type": "llava", "vision_config": {}, "text_config": {}}) is None
    llava_next = {"model_type": "llava_next", "vision_config": {}, "text_config": {}}
    assert transformers_js.limitation(llava_next) == (
        "refused before export: transformers.js 4.3.2's AutoModelForImageTextToText throws \"Unsupported model type: "
        "llava_next\" (src/models/auto/modeling_auto.js): 'llava_next' is not in its "
        "MODEL_FOR_IMAGE_TEXT_TO_TEXT_MAPPING_NAMES (src/models/registry.js)")
    (tmp_path / "config.json").write_text(json.dumps(llava_next))
    check = transformers_js.check_generation(tmp_path, request)  # the gate says what the plan said
    assert (check.verdict, check.reason) == ("not_checked", transformers_js.limitation(llava_next))


def test_the_card_opens_a_vlm_with_auto_model_for_image_text_to_text():
    from hfexport.layout import Place
    from hfexport.report.card import runtime_snippets
    from hfexport.report.data import JobReport, TargetReport

    runtimes = [{"runtime": "transformers.js", "verdict": "passed"},
                {"runtime": "optimum", "verdict": "not_checked", "reason": "not in the layout"}]
    target = TargetReport(TARGET, "onnx", "generation", plan={"task": "image-text-to-text"}, runtimes=runtimes)
    text = "\n".join(runtime_snippets("org/m", JobReport(source={}, targets={TARGET: target}), {TARGET: Place("onnx")}))
    assert 'AutoModelForImageTextToText.from_pretrained("org/m", { dtype: "fp32", use_external_data_format: true })' \
        in text
    assert "pipeline(" not in text and "ORTModel" not in text


def test_the_chat_template_goes_where_transformers_js_reads_it(tmp_path):
    """transformers 5 saves a processor's chat template as chat_template.jinja; transformers.js' tokenizer reads
    `chat_template` from tokenizer_config.json. Beside the layout it is written there (an owner's own is kept)."""
    from types import SimpleNamespace

    from hfexport.formats.onnx.image_text_contract import FILES, save_processor_files

    for name in FILES:
        (tmp_path / name).write_bytes(b"")
    (tmp_path / "processor_config.json").write_text(json.dumps(
        {"image_processor": {"image_processor_type": "SiglipImageProcessor"}, "processor_class": "Idefics3Processor"}))
    (tmp_path / "tokenizer_config.json").write_text(json.dumps({"eos_token": "</s>"}))
    save_processor_files(tmp_path, SimpleNamespace(chat_template="{{ messages }}"))
    assert json.loads((tmp_path / "tokenizer_config.json").read_text()) == {"eos_token": "</s>",
                                                                           "chat_template": "{{ messages }}"}
    assert json.loads((tmp_path / "preprocessor_config.json").read_text()) == {
        "image_processor_type": "SiglipImageProcessor", "processor_class": "Idefics3Processor"}
    (tmp_path / "tokenizer_config.json").write_text(json.dumps({"chat_template": "owner's"}))
    save_processor_files(tmp_path, SimpleNamespace(chat_template="{{ messages }}"))
    assert json.loads((tmp_path / "tokenizer_config.json").read_text()) == {"chat_template": "owner's"}


def test_a_rebind_writes_the_layout_again_from_the_rebound_components(llava_job, llava, tmp_path):
    """The three graphs copy the components' weights: after new weights are written into the components
    (`hfexport.rebind.folder.rebind_copy`), they are made again from them, not left holding the old weights."""
    import shutil

    from hfexport.rebind.folder import rebind_copy

    source = tmp_path / "previous"
    shutil.copytree(llava_job[0] / TARGET, source)
    for name in ("vision_encoder.onnx", "embed_tokens.onnx", "decoder_model_merged.onnx"):
        (source / (name + "_data")).write_bytes(b"stale")
    manifest = json.loads((source / "export.json").read_text())
    rebind_copy(source, tmp_path / "rebound", manifest, llava[0])
    for name in ("vision_encoder.onnx", "embed_tokens.onnx", "decoder_model_merged.onnx"):
        assert (tmp_path / "rebound" / (name + "_data")).read_bytes() == (llava_job[0] / TARGET / (name + "_data")
                                                                          ).read_bytes()


@pytest.mark.slow
def test_idefics3_generates_its_image_prompts_in_transformers_js(session_dir, runtime_env, hub, tmp_path):
    """The SmolVLM architecture: its vision encoder takes `pixel_attention_mask` beside the pixels (int64, fed as the
    processor made it), and transformers.js merges its features as LLaVA's (Idefics3ForConditionalGeneration extends
    LlavaForConditionalGeneration there). Published as a pull request on the local Hub, the README's snippet (its
    processor called text first, as the README says Idefics3's is) generates `model.generate`'s new tokens."""
    import numpy as np
    import onnx
    from transformers import AutoModelForImageTextToText, AutoProcessor

    from hfexport.publication.publish import publish

    model, output = _exported_through_transformers_js("tiny-idefics3", session_dir, runtime_env)
    inputs, outputs = _io(output / TARGET / "vision_encoder.onnx")
    assert [name for name, _ in inputs] == ["pixel_values", "pixel_attention_mask"]
    assert [name for name, _ in outputs] == ["image_features"]
    graph = onnx.load(str(output / TARGET / "vision_encoder.onnx"), load_external_data=False).graph
    assert graph.input[1].type.tensor_type.elem_type == onnx.TensorProto.BOOL  # as transformers.js' processor makes it

    repo = f"{hub.user}/idefics3-transformers-js"
    hub.seed_repo(repo, model)
    num = publish(output, repo, mode="pr", token=hub.write_token).pr_num
    picture = np.random.default_rng(5).integers(0, 256, (32, 32, 3), dtype=np.uint8)  # the processor's size
    printed = run_readme_snippet(hub, runtime_env, repo, num, picture, tmp_path, text_first=True)
    processor = AutoProcessor.from_pretrained(model)
    eager = AutoModelForImageTextToText.from_pretrained(model).eval()
    expected = _eager_new_tokens(eager, processor(text=["<image> Describe the picture"], images=[[picture]],
                                                  return_tensors="pt"))
    assert printed["ids"] == expected, (printed, expected)


def test_only_a_float32_llava_class_export_gets_the_layout(llava_job):
    """transformers.js opens `vision_encoder.onnx` & co. at `dtype: "fp32"`: a float16 export does not get them under
    those names, nor an image encoder on other inputs (LLaVA-NeXT's `image_sizes`), nor multi-axis rope positions
    beside an encoder without an image grid (Qwen2-VL-class exports, whose encoder takes `image_grid_thw`, get it)."""
    import copy

    from hfexport.formats.onnx.image_text_contract import applies

    manifest = json.loads((llava_job[0] / TARGET / "export.json").read_text())
    assert applies(manifest)
    half = copy.deepcopy(manifest)
    for entry in half["components"].values():
        entry["metadata"]["export_dtype"] = "float16"
    sizes = copy.deepcopy(manifest)
    sizes["components"]["image_encoder"]["metadata"]["kwargs"]["image_sizes"] = {"shape": [1, 2], "dtype": "int64"}
    rope = copy.deepcopy(manifest)
    rope["components"]["language_model"]["metadata"]["kwargs"]["position_ids"]["shape"] = [3, 1, 21]
    assert not any(applies(other) for other in (half, sizes, rope))


def test_a_qwen2_vl_config_gets_the_text_settings_transformers_js_reads_at_its_top_level():
    """transformers.js 4.3.2 normalizes a `qwen2_vl` config as a flat decoder's (src/configs.js) where transformers 5
    nests the settings in `text_config`: copied up beside the layout's graphs only; the owner's keys are kept."""
    from hfexport.formats.onnx.backend import IMAGE_TEXT_FILES, transformers_js_config

    text = {"num_hidden_layers": 2, "num_key_value_heads": 2, "num_attention_heads": 4, "hidden_size": 64}
    config = {"model_type": "qwen2_vl", "text_config": text, "hidden_size": 99}
    names = [*IMAGE_TEXT_FILES, *(name + "_data" for name in IMAGE_TEXT_FILES)]
    written = transformers_js_config(config, names)
    assert {key: written[key] for key in text} == {**text, "hidden_size": 99}
    assert written["text_config"] == text and written["transformers.js_config"]["use_external_data_format"] == {
        name: 1 for name in sorted(IMAGE_TEXT_FILES)}
    assert "num_hidden_layers" not in transformers_js_config(config, ["model.onnx"])
    assert "num_hidden_layers" not in transformers_js_config({**config, "model_type": "qwen2_5_vl"}, names)


def test_packed_patches_are_handed_to_transformers_js_per_prompt_by_their_grids():
    import numpy as np

    from hfexport.formats.onnx.runtimes.transformers_js import prompt_images

    pixels = np.arange(12 * 2).reshape(12, 2)
    grids = np.array([[1, 2, 2], [1, 2, 4]])
    first, second = prompt_images({"pixel_values": pixels, "image_grid_thw": grids}, 2)
    assert first["pixel_values"].tolist() == pixels[:4].tolist() and first["image_grid_thw"].tolist() == [[1, 2, 2]]
    assert second["pixel_values"].tolist() == pixels[4:].tolist() and second["image_grid_thw"].tolist() == [[1, 2, 4]]
    assert prompt_images({"pixel_values": pixels, "image_grid_thw": grids}, 3) is None
    rows = prompt_images({"pixel_values": np.zeros((2, 3, 4, 4))}, 2)
    assert [row["pixel_values"].shape for row in rows] == [(1, 3, 4, 4)] * 2


README_REPO, README_REVISION, README_PROMPT = "your-org/your-vlm", "refs/pr/1", "<image> Describe the picture"


def run_readme_snippet(hub, runtime_env, repo: str, num: int, picture, tmp_path, text_first: bool = False,
                       prompt: str = README_PROMPT) -> dict:
    """The README's transformers.js VLM snippet on `repo`'s pull request `num` of the local Hub, on `picture` (a
    uint8 `[height, width, 3]` array, saved as the snippet's picture.png), the processor called text first where
    `text_first` (Idefics3/SmolVLM's, Qwen2-VL's), on `prompt` (the model's image placeholder in place of `<image>`):
    what it printed (`text`) and the new token ids it generated (`ids`, printed by a line the test adds after it)."""
    import subprocess
    from pathlib import Path

    from PIL import Image

    text = (Path(__file__).resolve().parents[1] / "README.md").read_text()
    code = text.split("<!-- readme-vlm-transformers-js -->", 1)[1].split("```js\n", 1)[1].split("```", 1)[0]
    for literal in (README_REPO, README_REVISION):
        assert literal in code
    code = code.replace(README_REPO, repo).replace(README_REVISION, f"refs/pr/{num}")
    call = f"processor(image, {json.dumps(README_PROMPT)})"
    assert call in code
    code = code.replace(call, f"processor({json.dumps(prompt)}, image)" if text_first else
                        f"processor(image, {json.dumps(prompt)})")
    folder = Path(runtime_env["HFEXPORT_RUNTIME_TRANSFORMERS_JS"])
    work = tmp_path / "snippet"
    work.mkdir()
    Image.fromarray(picture).save(work / "picture.png")
    (work / "node_modules").symlink_to(folder / "node_modules", target_is_directory=True)
    script = work / "snippet.mjs"
    script.write_text(  # where the local Hub is: the one line a user of the real Hub leaves out
        hub.transformers_js_env(tmp_path / "tjs") + code
        + 'console.log(JSON.stringify(generated.tolist().map((row) => row.map(Number))));\n')
    env = {**os.environ, **hub.env(token=False, hf_home=tmp_path / "hf-home")}
    done = subprocess.run(["node", str(script)], capture_output=True, text=True, env=env, cwd=work, timeout=300)
    assert done.returncode == 0, done.stderr[-3000:]
    *printed, ids = done.stdout.strip().splitlines()
    return {"text": "\n".join(printed), "ids": json.loads(ids)[0]}


@pytest.mark.slow
def test_the_readme_snippet_runs_llavas_pull_request_token_for_token(hub, llava_job, llava, tiny_llava, runtime_env,
                                                                     tmp_path):
    """Published as a pull request on the local Hub: the README's transformers.js snippet, with its own processor on
    a picture file, generates `model.generate`'s new tokens for the processor's prompt and that picture."""
    import shutil

    import numpy as np

    from hfexport.publication.publish import publish

    repo = f"{hub.user}/llava-transformers-js"
    hub.seed_repo(repo, tiny_llava)
    output = tmp_path / "out-job"
    shutil.copytree(llava_job[0], output)
    num = publish(output, repo, mode="pr", token=hub.write_token).pr_num
    files = set(hub.list_files(repo, f"refs/pr/{num}"))
    assert {"onnx/vision_encoder.onnx", "onnx/embed_tokens.onnx", "onnx/decoder_model_merged.onnx",
            "preprocessor_config.json"} <= files, files  # the root's flat one, where AutoProcessor reads it
    picture = np.random.default_rng(5).integers(0, 256, (32, 32, 3), dtype=np.uint8)  # the crop's size: no resize
    printed = run_readme_snippet(hub, runtime_env, repo, num, picture, tmp_path)
    model, processor = llava
    expected = _eager_new_tokens(model, processor(text=["<image> Describe the picture"], images=[picture],
                                                  return_tensors="pt"))
    assert printed["ids"] == expected, (printed, expected)
    assert printed["text"] == processor.tokenizer.decode(expected, skip_special_tokens=True)


@pytest.mark.slow
def test_qwen2_vl_generates_its_image_prompts_in_transformers_js(session_dir, runtime_env, hub, tmp_path):
    """The Qwen2-VL class: transformers.js' `Qwen2VLForConditionalGeneration` (src/models/qwen2_vl/modeling_qwen2_vl.js)
    feeds the vision encoder `pixel_values` (packed patches) and `grid_thw`, and the decoder `position_ids` `[3, batch,
    sequence]` from its own `get_rope_index` (on each new token: past length + rope delta on all three axes); the
    layout takes them so and makes the text-position row transformers 5.23's graphs take first. The gate generates
    each sample prompt token for token; published as a pull request, the README's snippet (text first, Qwen2-VL's
    image placeholder) generates `model.generate`'s new tokens from its own processor."""
    import numpy as np
    from transformers import AutoModelForImageTextToText

    from hfexport.models import load_processor
    from hfexport.publication.publish import publish
    from hfexport.testing.models import PADDLEOCR_VL_IMAGE, QWEN2_VL_PROMPT

    model, output = _exported_through_transformers_js("tiny-qwen2-vl", session_dir, runtime_env)
    folder = output / TARGET
    assert [name for name, _ in _io(folder / "vision_encoder.onnx")[0]] == ["pixel_values", "grid_thw"]
    assert _io(folder / "decoder_model_merged.onnx")[0][2] == ("position_ids", [3, "batch_size", "sequence_length"])

    repo = f"{hub.user}/qwen2-vl-transformers-js"
    hub.seed_repo(repo, model)
    num = publish(output, repo, mode="pr", token=hub.write_token).pr_num
    shape = (PADDLEOCR_VL_IMAGE["height"], PADDLEOCR_VL_IMAGE["width"], 3)  # the processor's pixel budget: no resize
    picture = np.random.default_rng(5).integers(0, 256, shape, dtype=np.uint8)
    prompt = f"{QWEN2_VL_PROMPT} Describe the picture"
    printed = run_readme_snippet(hub, runtime_env, repo, num, picture, tmp_path, text_first=True, prompt=prompt)
    processor = load_processor(model)
    eager = AutoModelForImageTextToText.from_pretrained(model).eval()
    expected = _eager_new_tokens(eager, processor(text=[prompt], images=[picture], return_tensors="pt"))
    assert printed["ids"] == expected, (printed, expected)
