"""Planning a vision-language model's generation: hfexport's `image_encoder` and `embed` beside the engine's
`language_model`, `lm_head` and `decode` (the merge of image features the engine leaves to the caller)."""

from __future__ import annotations

from hfexport.errors import PlanError
from hfexport.plan.tracing import call_capture
from hfexport.preparers import image_count, image_slice

# transformers 5.23's `generate` encodes a VLM's images before the prefill (`_prepare_multimodal_encoder_kwargs_for_
# generation` calls `base_model.get_image_features` and hands the prefill `mm_encoder_outputs` instead of
# `pixel_values`), so the engine's `decompose_for_generation`, which captures the forward calls of generate, splits
# the prefill into `language_model` (taking `inputs_embeds`), `lm_head` and `decode` with no image encoder, and
# leaves the merge of image features into the text embeddings to the caller. hfexport adds the two missing pieces
# as components of their own: `image_encoder` (the call generate made: vision tower, feature selection, projector)
# and `embed` (token embeddings with the image features scattered in at the image-token positions).

IMAGE_ENCODER, EMBED = "image_encoder", "embed"
# Formats whose lowering takes the Core ATen opset only: ExecuTorch 1.5.1's `to_edge` refuses a `grid_thw` vision
# tower's `aten.repeat_interleave.Tensor` (measured on tiny PaddleOCR-VL and tiny Qwen2-VL, forward).
CORE_ATEN_FORMATS = ("executorch",)


def grid_thw_refusal(model, export_format: str, inputs: dict) -> str | None:
    """Why `model` cannot be exported to `export_format` on `inputs` (the upstream message, quoted), or None: a vision
    tower over packed patches with image grids (a module whose forward takes `grid_thw`: Qwen2-VL-class, PaddleOCR-VL),
    fed images (`image_grid_thw`), on a format that takes Core ATen ops only."""
    import inspect

    if str(export_format) not in CORE_ATEN_FORMATS or not any(name.endswith("grid_thw") for name in inputs):
        return None
    for module in model.modules():
        forward = getattr(type(module), "forward", None)
        if forward is not None and "grid_thw" in inspect.signature(forward).parameters:
            return (f"{type(model).__name__}: its vision tower ({type(module).__name__}, over packed patches with "
                    f"`grid_thw`) cannot be lowered to {export_format}: ExecuTorch 1.5.1's to_edge stops at "
                    "\"SpecViolationError: Operator torch._ops.aten.repeat_interleave.Tensor is not in Core ATen "
                    "opset\"; export it to dynamo, onnx or openvino")
    return None


def image_features_capture(model):
    """The kwargs of every call to `model.base_model.get_image_features` within the block (see above)."""
    base = getattr(model, "base_model", None)
    if getattr(base, "get_image_features", None) is None or "image" not in getattr(model, "input_modalities", ()):
        base = None
    return call_capture(base, "get_image_features")


def image_token_id(config) -> int | None:
    """The placeholder token a VLM's processor repeats once per image feature."""
    for name in ("image_token_id", "image_token_index"):
        value = getattr(config, name, None)
        if isinstance(value, int):
            return value
    return None


def _image_modules(model, fixed: dict):
    """`(image_encoder, embed)`: the two modules hfexport exports beside a VLM's engine components."""
    import torch

    base = model.base_model

    class ImageEncoder(torch.nn.Module):
        """`base_model.get_image_features` on one prompt's images, as generate calls it: the image features of
        every image token, `[tokens, hidden]` (pooled outputs concatenated, as the model's forward does)."""

        def __init__(self):
            super().__init__()
            self.base = base
            # the engine's input preparers read the exported module's config (`target_sizes`'s `get_max_seqlen`: the
            # attention implementation), as they read a model's
            self.config = base.config

        def forward(self, **images):
            features = self.base.get_image_features(**images, **fixed, return_dict=True).pooler_output
            if isinstance(features, (list, tuple)):
                features = torch.cat(list(features), dim=0)
            return features.reshape(-1, features.shape[-1])

    class Embed(torch.nn.Module):
        """Token embeddings with the image features scattered in at the image-token positions (the model's
        `masked_scatter`), `[batch, seq, hidden]`: the `inputs_embeds` the language model's prefill takes."""

        def __init__(self):
            super().__init__()
            self.embed_tokens = model.get_input_embeddings()
            self.image_token_id = image_token_id(model.config)

        def forward(self, input_ids, image_features):
            embeds = self.embed_tokens(input_ids)
            mask = (input_ids == self.image_token_id).unsqueeze(-1)
            return embeds.masked_scatter(mask, image_features.to(embeds.dtype))

    return ImageEncoder().eval(), Embed().eval()


def image_stages(model, inputs: dict, call: dict, stages: dict) -> dict:
    """`{"image_encoder": ..., "embed": ...}` stages from the captured `get_image_features` call.

    The encoder is traced on the first prompt's images (the first slice of every image tensor): LLaVA's
    `get_image_features` turns the image batch into a Python list, which pins the traced batch, so `generate` runs
    it once per prompt. The merge is checked here against the `inputs_embeds` the engine captured for the
    language model, so a model that builds them differently is refused at plan time, not exported wrong."""
    import torch

    images = {key: value for key, value in call.items() if isinstance(value, torch.Tensor)}
    fixed = {key: value for key, value in call.items() if key not in images and key != "return_dict"}
    if "input_ids" not in inputs or image_token_id(model.config) is None:
        raise PlanError(f"{type(model).__name__}: a vision-language model needs input_ids and an image token id "
                        "(config.image_token_id) to generate from images")
    count = image_count(images)
    if count is None:
        raise PlanError(f"{type(model).__name__}: the image inputs {sorted(images)} do not share a batch axis "
                        f"({', '.join(f'{k}: {list(v.shape)}' for k, v in images.items())}) and are not patches "
                        "packed by an image grid; hfexport's image encoder runs one prompt's images at a time")
    encoder, embed = _image_modules(model, fixed)
    with torch.no_grad():
        features = torch.cat([encoder(**image_slice(images, row, row + 1)) for row in range(count)])
        merged = embed(inputs["input_ids"], features)
    expected = stages.get("language_model", (None, {}))[1].get("inputs_embeds")
    if expected is None or expected.shape != merged.shape or not torch.allclose(expected, merged, atol=1e-5):
        raise PlanError(f"{type(model).__name__}: the language model's inputs_embeds are not the token embeddings "
                        "with the image features at the image tokens; hfexport cannot export this model's image "
                        "merge")
    first = {key: value.clone() for key, value in image_slice(images, 0, 1).items()}
    return {IMAGE_ENCODER: (encoder, first), EMBED: (embed, {"input_ids": inputs["input_ids"], "image_features": features})}
