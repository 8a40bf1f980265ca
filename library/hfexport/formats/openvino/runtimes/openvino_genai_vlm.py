"""OpenVINO GenAI's `VLMPipeline(folder, "CPU")` on a vision-language OpenVINO generation export laid out as
optimum-intel's (`hfexport.formats.openvino.vlm_layout`), as its users run it: a text prompt and an image each.

VLMPipeline takes text and images, never token ids or pixel values: it tokenizes the prompt with the export's
`openvino_tokenizer.xml` and preprocesses each image itself (LLaVA: `llava/classes.cpp`, a bicubic resize to
`size.shortest_edge`, a center crop to `crop_size`, then `image_mean` / `image_std`; Qwen2-VL: `qwen2vl/classes.cpp`,
a bicubic resize to `smart_resize`'s size for `min_pixels` / `max_pixels` (or `size.shortest_edge` /
`size.longest_edge`) at a multiple of `patch_size` x `merge_size`, `image_mean` / `image_std`, then the patches). The
check hands it, per sample prompt (batch 1, an f32 inference precision hint):

- the recipe's text with each image tag as VLMPipeline expands it into exactly the processor's prompt (`TAGS`):
  LLaVA's `<image>\\n` written as `<image>` (VLMPipeline writes an image's tokens then `'\\n'` for each `<image>`,
  `InputsEmbedderLLaVA::normalize_prompt`); Qwen2-VL's `<|vision_start|><|image_pad|><|vision_end|>` as it is
  (`InputsEmbedderQwen2VL::normalize_prompt` writes the image's `<|image_pad|>` tokens between the two);
- the image the processor's `pixel_values` were made from (`source_images`: its normalization undone, and Qwen2-VL's
  packed patches put back in place, which is exact for an image of the size VLMPipeline's resize (and LLaVA's crop)
  leaves as it is: a crop-sized one, or one `smart_resize` keeps, whose pixel budget the sample image is made for).

Its client reports the ids VLMPipeline's tokenizer makes of the prompt (image tokens written out): other ids than the
processor's fail the check naming the first that differs; the new tokens are judged against `model.generate`'s,
token for token, as every runtime's are (`judge_tokens`, the stop token VLMPipeline drops kept), at batch 1: the
image encoder is traced on one prompt's image.
"""

from __future__ import annotations

import json
from pathlib import Path

from hfexport.deployment import (
    FAILED, NOT_CHECKED, GenerationRequest, RuntimeCheck, RuntimeClientError, judge_tokens,
)
from hfexport.deployment._python import as_expected, run_python_client
from hfexport.errors import HfExportError
from hfexport.files import read_json_object
from hfexport.formats.openvino import vision_split, vlm_layout

RUNTIME = "openvino-genai"
MODULE = "openvino_genai"
CLIENT = Path(__file__).resolve().parent / "clients" / "openvino_genai_vlm_client.py"
IMAGE_TAG = "<image>"  # VLMPipeline's LLaVA image tag (`VLMConfig::im_start`, vlm_config.hpp)
QWEN2_VL_TAG = vision_split.IMAGE_TAG  # `InputsEmbedderQwen2VL::NATIVE_TAG`, qwen2vl/classes.hpp
#: Per model type: (the tag in the sample text, the tag VLMPipeline is given, what it writes for an image of N
#: tokens, as a function of N and the image token).
TAGS = {
    "llava": (IMAGE_TAG + "\n", IMAGE_TAG, lambda count, token: token * count + "\n"),
    "qwen2_vl": (QWEN2_VL_TAG, QWEN2_VL_TAG, lambda count, token: "<|vision_start|>" + token * count + "<|vision_end|>"),
}
NOT_IN_LAYOUT = ("no openvino_language_model.xml, openvino_text_embeddings_model.xml and "
                 "openvino_vision_embeddings_model.xml (Qwen2-VL: and openvino_vision_embeddings_merger_model.xml) in "
                 "the export: VLMPipeline opens optimum-intel's layout (hfexport.formats.openvino.vlm_layout writes it "
                 "for LLaVA and Qwen2-VL)")


ONE_TOKEN_DECODE = ("the export's decode takes one new token (generation.multi_token_decode: false), and VLMPipeline "
                    "runs the prompt through the language model made from it: Qwen2-VL's decode keeps the one "
                    "token it was traced on, so hfexport does not write VLMPipeline's layout for it")


class NotHandable(HfExportError, ValueError):
    """The sample cannot be handed to VLMPipeline as the processor's input (the message says why)."""


def check_generation(folder: Path, request: GenerationRequest, python: str) -> RuntimeCheck:
    """VLMPipeline on `folder` with each sample prompt and its image (module docstring), `python` the runtime's."""
    folder = Path(folder)
    config = read_json_object(folder / "config.json")
    refused = vlm_layout.limitation(config.get("model_type"))
    if refused:
        return RuntimeCheck(RUNTIME, NOT_CHECKED, reason=refused)
    split = config.get("model_type") in vlm_layout.SPLIT_TYPES
    if not all((folder / name).is_file() for name in (*vlm_layout.FILES, *(vlm_layout.SPLIT_FILES if split else ()))):
        manifest = vlm_layout.read_manifest(folder)
        one_token = split and manifest is not None and not vlm_layout.takes_the_prompt(manifest)
        return RuntimeCheck(RUNTIME, NOT_CHECKED, reason=ONE_TOKEN_DECODE if one_token else NOT_IN_LAYOUT)
    try:
        prompts, expanded = pipeline_prompts(request, config)
        images = source_images(folder, request.extra["pixel_values"], request.extra.get("image_grid_thw"))
    except NotHandable as error:
        return RuntimeCheck(RUNTIME, NOT_CHECKED, reason=str(error))
    payload = {"prompts": prompts, "expanded": expanded, "images": images,
               "max_new_tokens": request.max_new_tokens, "eos_token_id": request.eos_token_id}
    try:
        answer = run_python_client(python, CLIENT, folder, payload, request.timeout_s)
    except RuntimeClientError as error:
        return RuntimeCheck(RUNTIME, FAILED, reason=str(error), batch_sizes=[1], precision="f32")
    for index, (want, got) in enumerate(zip(request.prompts, answer["ids"], strict=True)):
        if want != got:
            at = next((i for i, (a, b) in enumerate(zip(want, got, strict=False)) if a != b), min(len(want), len(got)))
            return RuntimeCheck(RUNTIME, FAILED, version=answer.get("version"), batch_sizes=[1], precision="f32",
                                reason=f"VLMPipeline's tokenizer (openvino_tokenizer.xml) makes other ids of prompt "
                                       f"{index} than the processor: they differ at position {at} of {len(want)}")
    got = as_expected(request, request.expected, answer["f32"], keep_stop_token=True)  # the EOS it stops at, kept
    return judge_tokens(RUNTIME, request, request.expected, got, version=answer.get("version"), batch_sizes=[1],
                        precision="f32")


def pipeline_prompts(request: GenerationRequest, config: dict) -> tuple[list[str], list[str]]:
    """Per sample prompt, the text VLMPipeline is given and that text as it tokenizes it (its image tags expanded
    as VLMPipeline's `normalize_prompt` does for the model type, `TAGS`); `NotHandable` where it would not make the
    processor's ids."""
    image_token = config.get("image_token_index", config.get("image_token_id"))
    texts = request.texts or []
    if len(texts) != len(request.prompts) or not isinstance(image_token, int):
        raise NotHandable("VLMPipeline takes text prompts: the recipe's sample texts (one per prompt) and config.json's "
                          "image_token_index are needed to hand it the processor's prompts")
    sample_tag, given_tag, written = TAGS.get(config.get("model_type"), TAGS["llava"])
    token = IMAGE_TAG if given_tag == IMAGE_TAG else "<|image_pad|>"
    given, expanded = [], []
    for text, ids in zip(texts, request.prompts, strict=True):
        tags = text.count(given_tag)
        if tags == 0 or text.count(sample_tag) != tags:
            raise NotHandable(f"VLMPipeline writes each image's tokens for an image tag {given_tag!r} "
                              f"({'InputsEmbedderLLaVA' if given_tag == IMAGE_TAG else 'InputsEmbedderQwen2VL'}"
                              f"::normalize_prompt): the sample text {text!r} has no {sample_tag!r} at each image, so "
                              "VLMPipeline would generate from other ids than model.generate")
        per_image = ids.count(image_token) // tags
        given.append(text.replace(sample_tag, given_tag))
        expanded.append(text.replace(sample_tag, written(per_image, token)))
    return given, expanded


def source_images(folder: Path, pixel_values, image_grid_thw=None) -> list:
    """The uint8 images (height x width x 3) the processor's `pixel_values` (`[prompts, 3, height, width]`, or
    Qwen2-VL's packed patches with one `image_grid_thw` row per prompt) were made from, per the flat
    `preprocessor_config.json`: its rescale and normalization undone (the patches put back in place first,
    `unpatched`). `NotHandable` where that is not exact or VLMPipeline would resize (or crop) the image."""
    import numpy as np

    try:
        settings = json.loads((Path(folder) / "preprocessor_config.json").read_text(encoding="utf-8"))
    except (OSError, ValueError) as error:
        raise NotHandable(f"VLMPipeline reads the image processor's settings from preprocessor_config.json: {error}")
    pixels = np.asarray(pixel_values, dtype=np.float64)
    if image_grid_thw is not None:
        pixels = unpatched(pixels, np.asarray(image_grid_thw), settings)
    else:
        crop = settings.get("crop_size") or {}
        height, width = pixels.shape[-2:]
        if pixels.ndim != 4 or (crop.get("height"), crop.get("width")) != (height, width) or \
                (settings.get("size") or {}).get("shortest_edge") != min(height, width):
            raise NotHandable(f"VLMPipeline resizes and crops each image itself (llava/classes.cpp): the sample's "
                              f"pixel_values {list(pixels.shape)} are not one crop-sized image per prompt, so hfexport "
                              "cannot hand it the image they were made from")
    mean = np.asarray(settings.get("image_mean", [0.0] * 3), dtype=np.float64)[:, None, None]
    std = np.asarray(settings.get("image_std", [1.0] * 3), dtype=np.float64)[:, None, None]
    scale = float(settings.get("rescale_factor", 1 / 255))
    values = (pixels * std + mean) / scale if settings.get("do_normalize", True) else pixels / scale
    rounded = np.rint(values)
    if np.abs(values - rounded).max() > 0.05 or rounded.min() < 0 or rounded.max() > 255:
        raise NotHandable("the sample's pixel_values are not a normalized uint8 image (preprocessor_config.json's "
                          "rescale and normalization do not undo to whole pixel values): VLMPipeline takes images")
    return rounded.astype(np.uint8).transpose(0, 2, 3, 1).tolist()


def unpatched(patches, grids, settings: dict):
    """`[images, 3, height, width]` from Qwen2-VL's packed patches (`[patches, 3 x temporal x patch x patch]`, the
    image processor's order: grid_t, h / merge, w / merge, merge, merge; then channel, temporal, patch, patch), the
    first of each image's temporal copies. `NotHandable` where an image is a video's (grid_t > 1) or VLMPipeline's
    `smart_resize` (qwen2vl/classes.cpp) would resize it."""
    import numpy as np

    patch, merge, temporal = (int(settings.get(key, default)) for key, default in
                              (("patch_size", 14), ("merge_size", 2), ("temporal_patch_size", 2)))
    size = settings.get("size") or {}
    low = settings.get("min_pixels") or size.get("shortest_edge")
    high = settings.get("max_pixels") or size.get("longest_edge")
    images, start = [], 0
    for grid_t, grid_h, grid_w in grids.tolist():
        height, width = grid_h * patch, grid_w * patch
        if grid_t != 1 or not low or not high or smart_resize(height, width, patch * merge, low, high) != (height,
                                                                                                          width):
            raise NotHandable(f"VLMPipeline resizes each image itself to smart_resize's size (qwen2vl/classes.cpp): "
                              f"the sample's image of grid {[grid_t, grid_h, grid_w]} is not one it keeps at "
                              f"{height} x {width}, so hfexport cannot hand it the image its patches were made from")
        count = grid_h * grid_w
        block = patches[start:start + count].reshape(grid_h // merge, grid_w // merge, merge, merge, 3, temporal,
                                                     patch, patch)
        start += count
        # back to (temporal, channel, h / merge, merge, patch, w / merge, merge, patch)
        image = block.transpose(5, 4, 0, 2, 6, 1, 3, 7).reshape(temporal, 3, height, width)
        images.append(image[0])
    if start != len(patches):
        raise NotHandable(f"the sample's {len(patches)} patches are not its image grids' {start}")
    return np.stack(images)


def smart_resize(height: int, width: int, factor: int, min_pixels: int, max_pixels: int) -> tuple[int, int]:
    """VLMPipeline's `qwen2_vl_utils::smart_resize` (qwen2vl/classes.cpp): the size it resizes an image to."""
    import math

    h_bar, w_bar = (math.floor(side / factor + 0.5) * factor for side in (height, width))  # std::round
    if h_bar * w_bar > max_pixels:
        beta = math.sqrt(height * width / max_pixels)
        h_bar, w_bar = math.floor(height / beta / factor) * factor, math.floor(width / beta / factor) * factor
    elif h_bar * w_bar < min_pixels:
        beta = math.sqrt(min_pixels / (height * width))
        h_bar, w_bar = math.ceil(height * beta / factor) * factor, math.ceil(width * beta / factor) * factor
    return h_bar, w_bar

