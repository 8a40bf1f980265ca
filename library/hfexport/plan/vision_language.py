"""Planning a multimodal model's generation: hfexport's `image_encoder` and `embed` beside the engine's
`language_model`, `lm_head` and `decode` (the merge of image features the engine leaves to the caller); for a model
whose prefill encodes its audio itself, the engine's `audio_encoder` (and projector) and hfexport's `embed` of audio
features."""

from __future__ import annotations

from hfexport.errors import PlanError
from hfexport.plan.tracing import call_capture, traced_inputs
from hfexport.preparers import (
    attention_window_frames, clip_windows, encoder_call, encoder_input_names, image_count, image_slice,
)

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


def _packed_tower(model, argument: str):
    """The first module of `model` below its multimodal forward (no `input_ids`) whose forward takes `argument`: the
    vision tower over packed patches whose layout that tensor's values give."""
    import inspect

    for module in model.modules():
        forward = getattr(type(module), "forward", None)
        parameters = inspect.signature(forward).parameters if forward is not None else {}
        if argument in parameters and "input_ids" not in parameters:
            return module
    return None


def grid_thw_refusal(model, export_format: str, inputs: dict) -> str | None:
    """Why `model` cannot be exported to `export_format` on `inputs` (the upstream message, quoted), or None: a vision
    tower over packed patches with image grids (a module whose forward takes `grid_thw`: Qwen2-VL-class, PaddleOCR-VL),
    fed images (`image_grid_thw`), on a format that takes Core ATen ops only."""
    if str(export_format) not in CORE_ATEN_FORMATS or not any(name.endswith("grid_thw") for name in inputs):
        return None
    if (tower := _packed_tower(model, "grid_thw")) is not None:
        return (f"{type(model).__name__}: its vision tower ({type(tower).__name__}, over packed patches with "
                f"`grid_thw`) cannot be lowered to {export_format}: ExecuTorch 1.5.1's to_edge stops at "
                "\"SpecViolationError: Operator torch._ops.aten.repeat_interleave.Tensor is not in Core ATen "
                "opset\"; export it to dynamo, onnx or openvino")
    return None


# Formats whose lowering re-runs torch's decompositions on the exported graph and guards there: ExecuTorch 1.5.1's
# `to_edge` decomposes `aten.slice.Tensor` (torch 2.13's `slice_forward`), which asks whether the slice's end is
# negative; a NaViT tower's merger slices its packed patches by sizes read from `target_sizes`' values (unbacked
# symbols with no lower bound), so the lowering stops after torch.export succeeded (measured on tiny MiniCPM-V 4.6's
# image encoder, generation).
DATA_SIZED_SLICE_STOPS = ("executorch",)


def target_sizes_refusal(model, export_format: str, image_inputs: dict) -> str | None:
    """Why `model`'s image encoder, fed `image_inputs`, cannot be lowered to `export_format` (the upstream message,
    quoted), or None: a tower over packed patches sized by `target_sizes` (MiniCPM-V), see above."""
    if str(export_format) not in DATA_SIZED_SLICE_STOPS or "target_sizes" not in image_inputs:
        return None
    if (tower := _packed_tower(model, "target_sizes")) is None:
        return None
    return (f"{type(model).__name__}: its vision tower ({type(tower).__name__}, over packed patches sized by "
            f"`target_sizes`' values) cannot be lowered to {export_format}: torch.export traces it, but ExecuTorch "
            "1.5.1's to_edge stops at \"GuardOnDataDependentSymNode: Could not guard on data-dependent expression "
            "u38 < 0\" (torch 2.13's decomposition of aten.slice.Tensor, `slice_forward`, on the merger's slice of "
            "the packed patches by those sizes); export it to dynamo, onnx or openvino")


def image_features_capture(model):
    """The kwargs of every call to `model.base_model.get_image_features` within the block (see above)."""
    base = getattr(model, "base_model", None)
    if getattr(base, "get_image_features", None) is None or "image" not in getattr(model, "input_modalities", ()):
        base = None
    return call_capture(base, "get_image_features")


def modality_token_id(config, modality: str) -> int | None:
    """The placeholder token a multimodal processor repeats once per feature of `modality` ("image", "audio"): the
    config's `<modality>_token_id` (or `_token_index`)."""
    for name in (f"{modality}_token_id", f"{modality}_token_index"):
        value = getattr(config, name, None)
        if isinstance(value, int):
            return value
    return None


def image_token_id(config) -> int | None:
    """The placeholder token a VLM's processor repeats once per image feature."""
    return modality_token_id(config, "image")


def embed_module(model, modality: str):
    """hfexport's `embed` component for `modality` ("image", "audio"): the token embeddings with that modality's
    features scattered in at its placeholder tokens (the model's `masked_scatter`), `[batch, seq, hidden]`, the
    `inputs_embeds` the language model's prefill takes. Its features input is named for the modality
    (`image_features`, `audio_features`), as `hfexport.generate` feeds it."""
    import torch

    class Embed(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.embed_tokens = model.get_input_embeddings()
            self.token_id = modality_token_id(model.config, modality)

        def merge(self, input_ids, features):
            embeds = self.embed_tokens(input_ids)
            mask = (input_ids == self.token_id).unsqueeze(-1)
            return embeds.masked_scatter(mask, features.to(embeds.dtype))

    class ImageEmbed(Embed):
        def forward(self, input_ids, image_features):
            return self.merge(input_ids, image_features)

    class AudioEmbed(Embed):
        def forward(self, input_ids, audio_features):
            return self.merge(input_ids, audio_features)

    return {"image": ImageEmbed, "audio": AudioEmbed}[modality]().eval()


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

    return ImageEncoder().eval(), embed_module(model, "image")


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


# A model whose prefill encodes a modality itself (transformers 5.23's `generate` encodes images before the prefill,
# not audio: Qwen3-ASR, the Qwen2.5-Omni thinker) is split by the engine into `<modality>_encoder` (the encoder's
# module on the kwargs the model's forward gave it), a `multi_modal_projector` where the forward runs one on the
# encoder's output, and a language model taking `inputs_embeds`. hfexport adds the merge, `embed`, as for images.
MODALITIES = ("image", "audio")
PROJECTOR = "multi_modal_projector"
# Formats whose export of the engine's batch capture of such an encoder stops (`batch_encoder_refusal`): ExecuTorch
# 1.5.1 on an encoder that selects its valid frames with `nonzero` over several attention windows (Qwen3-ASR).
BATCH_ENCODER_STOPS = ("executorch",)


def first_output(outputs):
    """A component's first output tensor (an encoder's `last_hidden_state`, or the tensor itself)."""
    import torch

    if isinstance(outputs, torch.Tensor):
        return outputs
    values = list(outputs.values()) if hasattr(outputs, "values") else list(outputs)
    return values[0]


def encoded_modality(stages: dict) -> str | None:
    """The modality whose encoder the engine's split holds beside a language model, without hfexport's `embed`."""
    if EMBED in stages or "language_model" not in stages:
        return None
    return next((modality for modality in MODALITIES if f"{modality}_encoder" in stages), None)


def encoder_embed_stages(model, inputs: dict, stages: dict, modality: str) -> dict:
    """`stages` with the `<modality>_encoder` traced on one attention window of one clip and hfexport's `embed` of
    `modality`'s features.

    The engine captured the encoder on the whole batch's clips, and its graph is specialized on their layout (an
    audio encoder's attention splits its frames by `cu_seqlens` with `.tolist()`: the number of windows is a
    constant of the graph), so hfexport traces it again on the first window of the first clip
    (`hfexport.preparers.clip_windows`, windows of `attention_window_frames` as the model's code lays them out), with
    the kwargs the model's own `get_<modality>_features` gives it for that window (`hfexport.preparers.
    encoder_call`), and `generate` runs it once per window of every clip, the features concatenated. That equals the
    encoder on the whole clip where its attention is block-diagonal over the windows and what follows is per frame:
    checked here on every sample clip (`_check_windows_separate`). The merge is checked against the `inputs_embeds`
    the engine captured for the language model (every clip's features, through the engine's projector where it has
    one), so a model that builds them differently is refused at plan time, not exported wrong."""
    import torch

    if "input_ids" not in inputs or modality_token_id(model.config, modality) is None:
        raise PlanError(f"{type(model).__name__}: a model that merges {modality} features into its prompt needs "
                        f"input_ids and a {modality} token id (config.{modality}_token_id) to generate")
    media = {name: inputs[name] for name in encoder_input_names(model, modality)
             if isinstance(inputs.get(name), torch.Tensor)}
    counts = {int(value.shape[0]) for value in media.values()}
    if len(counts) != 1:
        raise PlanError(f"{type(model).__name__}: the {modality} inputs {sorted(media)} do not share a first axis "
                        f"({', '.join(f'{k}: {list(v.shape)}' for k, v in media.items())}); hfexport's "
                        f"{modality} encoder runs one clip at a time")
    encoder = model.get_encoder(modality=modality)
    frames = attention_window_frames(encoder)
    with torch.no_grad():
        clips = [{name: value[row : row + 1] for name, value in media.items()} for row in range(counts.pop())]
        try:
            windows = [clip_windows(clip, frames) for clip in clips]
        except ValueError as error:
            raise PlanError(f"{type(model).__name__}: the recipe's {modality} samples: {error}") from None
        calls = [[encoder_call(model, modality, window) for window in clip] for clip in windows]
        outputs = [[first_output(encoder(**call)) for call in clip] for clip in calls]
        _check_windows_separate(model, encoder, modality, clips, outputs, frames)
        features = torch.cat([output for clip in outputs for output in clip])
        if PROJECTOR in stages:
            features = first_output(stages[PROJECTOR][0](features))
        features = features.reshape(-1, features.shape[-1])
        embed = embed_module(model, modality)
        merged = embed(inputs["input_ids"], features)
    expected = stages["language_model"][1].get("inputs_embeds")
    if expected is None or expected.shape != merged.shape or not torch.allclose(expected, merged, atol=1e-5):
        raise PlanError(f"{type(model).__name__}: the language model's inputs_embeds are not the token embeddings "
                        f"with the {modality} encoder's features"
                        f"{' (through ' + PROJECTOR + ')' if PROJECTOR in stages else ''} at the {modality} tokens; "
                        f"hfexport cannot export this model's {modality} merge")
    _refuse_split_windows(model, encoder, modality, calls[0][0])
    return {**stages, f"{modality}_encoder": (encoder, calls[0][0]),
            EMBED: (embed, {"input_ids": inputs["input_ids"], f"{modality}_features": features})}


# The bound of `_check_windows_separate`: the encoder once per window against once per clip, float32 (measured on
# the tiny Qwen2.5-Omni: 7.5e-8 over three windows; Qwen3-ASR's: 0).
WINDOWS_ATOL = 1e-5


def _check_windows_separate(model, encoder, modality: str, clips: list, outputs: list, frames: int | None) -> None:
    """Refuse an encoder whose features over a clip's attention windows, one window at a time, are not its features
    over the whole clip (as `generate` would run it): something after the windowed attention mixes windows, e.g.
    Qwen2.5-Omni's stride-2 average pooling, which pairs frames across two windows when a window holds an odd number
    of frames after its convolution (`n_window` odd: measured on the tiny one with n_window 49, 58 features for 59)."""
    import torch

    for row, (clip, parts) in enumerate(zip(clips, outputs)):
        if len(parts) < 2:
            continue
        whole = first_output(encoder(**encoder_call(model, modality, clip)))
        joined = torch.cat(parts)
        if joined.shape != whole.shape:
            difference = f"{joined.shape[0]} features where the whole clip gives {whole.shape[0]}"
        else:
            gap = float((joined - whole).abs().max())
            if gap <= WINDOWS_ATOL:
                continue
            difference = f"max_abs {gap:.3g} against the whole clip (bound {WINDOWS_ATOL})"
        raise PlanError(f"{type(model).__name__}: its {modality} encoder ({type(encoder).__name__}) run once per "
                        f"attention window ({frames} frames) on the recipe's clip {row} ({len(parts)} windows) gives "
                        f"{difference}: its windows are not independent (something after the windowed attention "
                        "mixes them), so hfexport's one-window encoder cannot compute it; give sample clips of one "
                        "window each (docs/generation.md)")


def _refuse_split_windows(model, encoder, modality: str, call: dict) -> None:
    """Refuse a traced call that the encoder's windowed attention still splits into several windows (`cu_seqlens`,
    from the engine's input preparers): an encoder whose windows `attention_window_frames` does not know (no
    `n_window`); it splits the frames with `.tolist()`, which the trace does not keep."""
    windows = traced_inputs(encoder, dict(call)).get("cu_seqlens")
    if windows is not None and windows.dim() == 1 and windows.shape[0] > 2:
        raise PlanError(f"{type(model).__name__}: its {modality} encoder ({type(encoder).__name__}) splits one "
                        f"window of the recipe's first clip into {windows.shape[0] - 1} attention windows (cu_seqlens "
                        f"{windows.tolist()}) with `.tolist()`, which the trace does not keep: traced on such a clip, "
                        "the ONNX encoder attended across the windows (max_abs 0.0176 vs eager) and the torch.export "
                        "one failed its own runtime assertion (\"u1 >= 1\"), measured with transformers 5.23 and "
                        "torch 2.13; hfexport cuts clips into windows of the encoder's `n_window` (and "
                        "`n_window_infer`), which this encoder lacks: give sample clips of one window each "
                        "(docs/generation.md)")


def batch_encoder_refusal(model, stage: tuple, export_format: str) -> str | None:
    """Why the engine's own export of an encoder hfexport retraces cannot be made on `export_format` (the upstream
    message, quoted), or None. The engine exports its capture on the whole batch too (`export_for_generation` takes
    a config per component it finds); measured with ExecuTorch 1.5.1 on Qwen3-ASR's encoder, which selects its valid
    frames with `nonzero` itself (the preparer does not compute `valid_indices` for it): over several attention
    windows that export stops. Qwen2.5-Omni's, whose valid frames the preparer computes, exports."""
    if str(export_format) not in BATCH_ENCODER_STOPS:
        return None
    encoder, captured = stage
    prepared = traced_inputs(encoder, dict(captured))
    windows = prepared.get("cu_seqlens")
    if windows is None or windows.dim() != 1 or windows.shape[0] <= 2 or "valid_indices" in prepared:
        return None
    return (f"{type(model).__name__}: the engine exports its own {type(encoder).__name__} on the whole batch's "
            f"clips ({windows.shape[0] - 1} attention windows) beside hfexport's one-clip encoder, and ExecuTorch "
            "1.5.1 stops there (\"RuntimeError: Cannot evaluate a finite upper bound for symbolic expression\", the "
            "encoder's own `nonzero` over the windows); export it to dynamo, onnx or openvino")


def retraced_encoders(model, stages: dict) -> list[str]:
    """The components hfexport traces again beside the engine's twin of the same name (`encoder_embed_stages`): a
    modality encoder of the model's own whose features hfexport's `embed` merges."""
    if EMBED not in stages:
        return []
    return [f"{modality}_encoder" for modality in MODALITIES if f"{modality}_encoder" in stages
            and stages[f"{modality}_encoder"][0] is model.get_encoder(modality=modality)]
