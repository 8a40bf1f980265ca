"""OpenVINO GenAI's `VLMPipeline(folder, "CPU")` on a vision-language OpenVINO generation export laid out as
optimum-intel's (`hfexport.formats.openvino.vlm_layout`), as its users run it: a text prompt and an image each.

VLMPipeline takes text and images, never token ids or pixel values: it tokenizes the prompt with the export's
`openvino_tokenizer.xml` and preprocesses each image itself (LLaVA: `llava/classes.cpp`, a bicubic resize to
`size.shortest_edge`, a center crop to `crop_size`, then `image_mean` / `image_std`). The check hands it, per sample
prompt (batch 1, an f32 inference precision hint):

- the recipe's text with each `<image>\\n` written as `<image>`: VLMPipeline writes an image's tokens then `'\\n'` for
  each `<image>` tag (`InputsEmbedderLLaVA::normalize_prompt`), so that text becomes exactly the processor's prompt;
- the image the processor's `pixel_values` were made from (`source_images`: its normalization undone, which is exact
  for a crop-sized image, the one size VLMPipeline's resize and crop leave as it is).

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
from hfexport.formats.openvino import vlm_layout

RUNTIME = "openvino-genai"
MODULE = "openvino_genai"
CLIENT = Path(__file__).resolve().parent / "clients" / "openvino_genai_vlm_client.py"
IMAGE_TAG = "<image>"  # VLMPipeline's LLaVA image tag (`VLMConfig::im_start`, vlm_config.hpp)
NOT_IN_LAYOUT = ("no openvino_language_model.xml, openvino_text_embeddings_model.xml and "
                 "openvino_vision_embeddings_model.xml in the export: VLMPipeline opens optimum-intel's layout "
                 "(hfexport.formats.openvino.vlm_layout writes it for LLaVA)")


class NotHandable(HfExportError, ValueError):
    """The sample cannot be handed to VLMPipeline as the processor's input (the message says why)."""


def check_generation(folder: Path, request: GenerationRequest, python: str) -> RuntimeCheck:
    """VLMPipeline on `folder` with each sample prompt and its image (module docstring), `python` the runtime's."""
    folder = Path(folder)
    config = read_json_object(folder / "config.json")
    refused = vlm_layout.limitation(config.get("model_type"))
    if refused:
        return RuntimeCheck(RUNTIME, NOT_CHECKED, reason=refused)
    if not all((folder / name).is_file() for name in vlm_layout.FILES):
        return RuntimeCheck(RUNTIME, NOT_CHECKED, reason=NOT_IN_LAYOUT)
    try:
        prompts, expanded = pipeline_prompts(request, config)
        images = source_images(folder, request.extra["pixel_values"])
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
    as `InputsEmbedderLLaVA::normalize_prompt` does); `NotHandable` where it would not make the processor's ids."""
    image_token = config.get("image_token_index", config.get("image_token_id"))
    texts = request.texts or []
    if len(texts) != len(request.prompts) or not isinstance(image_token, int):
        raise NotHandable("VLMPipeline takes text prompts: the recipe's sample texts (one per prompt) and config.json's "
                          "image_token_index are needed to hand it the processor's prompts")
    given, expanded = [], []
    for text, ids in zip(texts, request.prompts, strict=True):
        tags = text.count(IMAGE_TAG)
        if tags == 0 or text.count(IMAGE_TAG + "\n") != tags:
            raise NotHandable(f"VLMPipeline writes each image's tokens then '\\n' for an {IMAGE_TAG} tag "
                              f"(InputsEmbedderLLaVA::normalize_prompt, llava/classes.cpp): the sample text {text!r} "
                              f"has no {IMAGE_TAG!r} followed by a newline at each image, so VLMPipeline would "
                              "generate from other ids than model.generate")
        per_image = ids.count(image_token) // tags
        given.append(text.replace(IMAGE_TAG + "\n", IMAGE_TAG))
        expanded.append(text.replace(IMAGE_TAG + "\n", IMAGE_TAG * per_image + "\n"))
    return given, expanded


def source_images(folder: Path, pixel_values) -> list:
    """The uint8 images (height x width x 3) the processor's `pixel_values` (`[prompts, 3, height, width]`) were made
    from, per the flat `preprocessor_config.json`: its rescale and normalization undone. `NotHandable` where that is
    not exact or the image is not crop-sized (VLMPipeline would resize or crop it)."""
    import numpy as np

    try:
        settings = json.loads((Path(folder) / "preprocessor_config.json").read_text(encoding="utf-8"))
    except (OSError, ValueError) as error:
        raise NotHandable(f"VLMPipeline reads the image processor's settings from preprocessor_config.json: {error}")
    pixels = np.asarray(pixel_values, dtype=np.float64)
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
