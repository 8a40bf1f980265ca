"""Generation of a multimodal model: hfexport's `image_encoder` and `embed` turn the prompt's images and tokens into
`inputs_embeds` (or, for a model whose prefill encodes its audio itself, the engine's `audio_encoder` and projector
with hfexport's `embed`), the engine's `language_model` and `lm_head` run the prompt, its `decode` the rest (the
components `hfexport.plan.vision_language` exports)."""

from __future__ import annotations

import inspect
import weakref

import torch

from hfexport.errors import GenerationError
from hfexport import preparers
from hfexport.generate.loop import CACHE, PREFILL, GenerationSession, as_traced
from hfexport.models import model_class_for

# hfexport's `image_encoder` (a prompt's images -> image features) and `embed` (input_ids + image features ->
# inputs_embeds), then the engine's `language_model` (inputs_embeds -> hidden states + cache) and `lm_head` for the
# prefill, and its `decode`.
IMAGE_ENCODER, EMBED, LANGUAGE_MODEL, LM_HEAD = "image_encoder", "embed", "language_model", "lm_head"
# the modalities an export may merge into its prompt (`<modality>_encoder`: hfexport's image encoder, or the engine's
# encoder of a modality the model's prefill encodes itself), and the engine's projector of such an encoder's output
MODALITIES, PROJECTOR = ("image", "audio"), "multi_modal_projector"
LANGUAGE_MODEL_INPUTS = {"inputs_embeds", "attention_mask", "position_ids", CACHE}


def modality_of(components: dict) -> str:
    """The modality a multimodal export merges into its prompt: the one whose `<modality>_encoder` it has."""
    return next((modality for modality in MODALITIES if f"{modality}_encoder" in components), "image")


def is_vision_language(components: dict, decode: str) -> bool:
    """Whether an export is a multimodal one (it has `embed` or `language_model`); refuses one that lacks a
    component."""
    if EMBED not in components and LANGUAGE_MODEL not in components:
        return False
    encoder = f"{modality_of(components)}_encoder"
    missing = [name for name in (encoder, EMBED, LANGUAGE_MODEL, LM_HEAD, decode) if name not in components]
    if missing:
        raise GenerationError(
            f"a multimodal generation export needs `{encoder}`, `embed`, `language_model`, `lm_head` and "
            f"`decode`; this one lacks {missing} (has {list(components)}): re-export it with hfexport, whose "
            "mode `generation` exports the encoder and the embedding merge beside the engine's components")
    return True


class VisionLanguageSession(GenerationSession):
    """A VLM's generation: the prefill is `language_model` on the prompt's embeddings, then `lm_head`."""

    def __init__(self, exported, layout, batch: int, inputs_embeds: torch.Tensor,
                 positions: torch.Tensor | None = None, carried: dict | None = None):
        self.inputs_embeds = inputs_embeds  # the prompt's embeddings, image features merged in (the prefill's input)
        self.positions = positions  # the prompt's multi-axis rope positions (`rope_positions`), or None
        # the prompt's inputs, which `model.generate` carries unchanged into every decode step (its model kwargs)
        self.carried = carried or {}
        super().__init__(exported, layout, batch)

    def _feed(self, name: str, traced: dict, device, input_ids, attention_mask, positions) -> dict:
        kwargs = super()._feed(name, traced, device, input_ids, attention_mask, positions)
        if name != PREFILL:
            kwargs.update({key: torch.as_tensor(value).to(device) for key, value in self.carried.items()
                           if key in traced and value is not None and key not in kwargs})
        return kwargs

    def prompt_positions(self, attention_mask: torch.Tensor) -> torch.Tensor:
        return super().prompt_positions(attention_mask) if self.positions is None else self.positions

    def _tokens(self, name: str, device, input_ids) -> dict:
        if name == PREFILL:
            return {"inputs_embeds": self.inputs_embeds.to(device)}
        return super()._tokens(name, device, input_ids)

    def _logits(self, name: str, outputs) -> torch.Tensor:
        if name == PREFILL:
            return _lm_head_logits(self.exported, outputs.last_hidden_state).cpu()
        return super()._logits(name, outputs)


def image_input_names(exported) -> list[str]:
    """The inputs a multimodal export's encoder takes from the caller: the processor's images (`pixel_values`, ...;
    not those the engine's input preparers compute from them, `hfexport.preparers`) for hfexport's `image_encoder`,
    the parameters of the model's `get_<modality>_features` for an encoder of the engine's (`encoder_features`);
    none for other exports."""
    components = getattr(exported, "components", {})
    if IMAGE_ENCODER not in components:
        modality = modality_of(components)
        if f"{modality}_encoder" not in components or EMBED not in components:
            return []
        return preparers.encoder_input_names(_meta_model(exported), modality)
    added = set(getattr(exported, "input_preparers", {}).get(IMAGE_ENCODER, {}).get("added", ()))
    return [name for name in components[IMAGE_ENCODER].metadata.kwargs if name not in added]


def image_text_embeds(exported, input_ids: torch.Tensor, images: dict) -> torch.Tensor:
    """A VLM prompt's `inputs_embeds`: the `image_encoder` on each prompt's images in turn (it is traced on one
    prompt's images, see `hfexport.plan.vision_language.image_stages`), their features concatenated in order, then
    `embed`, which scatters them into the token embeddings at the image tokens. Both are exported graphs: no torch
    model runs. An export whose encoder is the engine's (audio) runs `encoder_features` instead."""
    if IMAGE_ENCODER not in exported.components:
        modality = modality_of(exported.components)
        features = encoder_features(exported, modality, images)
        embed = exported.runners[EMBED]
        return _first_tensor(embed(input_ids=input_ids.to(embed.device),
                                   **{f"{modality}_features": features.to(embed.device)}), only=True).cpu()
    names = image_input_names(exported)
    missing = [name for name in names if name not in images]
    if missing:
        raise GenerationError(f"this vision-language export generates from images: pass {missing} (the processor's "
                              f"outputs) with the prompts; it got {sorted(images) or 'none'}")
    images = {name: torch.as_tensor(images[name]) for name in names}
    count = preparers.image_count(images)
    if count is None:
        raise GenerationError(f"the image inputs {names} differ in their first axis and are not patches packed by "
                              f"an image grid: {', '.join(f'{k}: {list(v.shape)}' for k, v in images.items())}")
    encoder = exported.runners[IMAGE_ENCODER]
    # the images one call takes: the traced first axis (of the image grid, where the patches come packed)
    counted = next((name for name in names if name.endswith("grid_thw")), names[0])
    traced = int(encoder.metadata.kwargs[counted]["shape"][0])
    step = traced if traced > 1 and count % traced == 0 else 1
    recorded = getattr(exported, "input_preparers", {}).get(IMAGE_ENCODER)
    features = []
    for first in range(0, count, step):
        chunk = preparers.image_slice(images, first, first + step)
        if recorded:  # what the engine's input preparers computed at export, computed from these images
            chunk = preparers.prepare(recorded, chunk)
        out = encoder(**as_traced(encoder, {name: value.to(encoder.device) if isinstance(value, torch.Tensor)
                                            else value for name, value in chunk.items()}))
        features.append(_first_tensor(out, only=True).cpu())
    features = torch.cat(features)
    embed = exported.runners[EMBED]
    return _first_tensor(embed(input_ids=input_ids.to(embed.device),
                               image_features=features.to(embed.device)), only=True).cpu()


def takes_rope_positions(exported) -> bool:
    """Whether a VLM export's language model takes multi-axis rope positions (`position_ids` `[axes, batch, seq]`:
    M-RoPE, Qwen2-VL-class), which `rope_positions` computes."""
    components = getattr(exported, "components", {})
    if LANGUAGE_MODEL not in components:
        return False
    traced = exported.runners[LANGUAGE_MODEL].metadata.kwargs.get("position_ids") or {}
    return len(traced.get("shape") or ()) == 3


_META_MODELS: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()


def _meta_model(exported):
    """The export's model class on the meta device (no weights; a 7B Qwen2-VL builds in ~0.1 s), for its own
    position methods and the arithmetic before its encoders; one per export."""
    model = _META_MODELS.get(exported)
    if model is None:
        config = exported.config
        with torch.device("meta"):
            model = model_class_for(config)._from_config(config)
        _META_MODELS[exported] = model
    return model


def encoder_inputs(exported, modality: str, inputs: dict) -> dict:
    """The kwargs the model's `get_<modality>_features` gives its encoder for `inputs` (the processor's), computed by
    the model's own code on its meta twin (`hfexport.preparers.encoder_call`: no weights needed)."""
    model = _meta_model(exported)
    given = {name: torch.as_tensor(value) for name, value in inputs.items() if value is not None}
    try:
        return preparers.encoder_call(model, modality, given)
    except Exception as error:  # noqa: BLE001 - the model's own message, one line
        raise GenerationError(f"{type(model).__name__}.get_{modality}_features could not take {sorted(given)}: "
                              f"{str(error).splitlines()[0] if str(error) else type(error).__name__}") from None


def encoder_features(exported, modality: str, inputs: dict) -> torch.Tensor:
    """The prompt's `modality` features, `[tokens, hidden]`, from an export whose `<modality>_encoder` is the model's
    own encoder (a model whose prefill encodes that modality itself: Qwen3-ASR, the Qwen2.5-Omni thinker), traced on
    one attention window of one clip (`hfexport.plan.vision_language.encoder_embed_stages`): per clip, per attention
    window of it (`hfexport.preparers.clip_windows`, windows laid out from the model's config as its code does), the
    encoder's inputs as the model computes them (`encoder_inputs`), what the engine's input preparers computed from
    them at export computed again (`hfexport.preparers`), the encoder; the windows' features concatenated (the plan
    checked that this is the encoder on the whole clip), then the engine's projector where it has one."""
    name, names = f"{modality}_encoder", image_input_names(exported)
    inputs = {key: torch.as_tensor(inputs[key]) for key in names if inputs.get(key) is not None}
    missing = [parameter for parameter in names[:1] if parameter not in inputs]
    if missing:
        raise GenerationError(f"this export generates from {modality}: pass {missing} (the processor's outputs) "
                              f"with the prompts; it got {sorted(inputs) or 'none'}")
    counts = {int(value.shape[0]) for value in inputs.values()}
    if len(counts) != 1:
        raise GenerationError(f"the {modality} inputs differ in their first axis (one row per clip): "
                              f"{', '.join(f'{k}: {list(v.shape)}' for k, v in inputs.items())}")
    encoder = exported.runners[name]
    recorded = getattr(exported, "input_preparers", {}).get(name)
    model_encoder = _meta_model(exported).get_encoder(modality=modality)
    module, frames = type(model_encoder).__module__, preparers.attention_window_frames(model_encoder)
    traced = encoder.metadata.kwargs
    features = []
    for row in range(counts.pop()):
        try:
            windows = preparers.clip_windows({key: value[row : row + 1] for key, value in inputs.items()}, frames)
        except ValueError as error:
            raise GenerationError(f"{modality} clip {row}: {error}") from None
        for window in windows:
            kwargs = encoder_inputs(exported, modality, window)
            if recorded:  # what the engine's input preparers computed at export, computed from this window
                kwargs = preparers.prepare(recorded, kwargs, module=module)
            _check_windows(name, traced, kwargs)
            features.append(_first_tensor(encoder(**as_traced(encoder, {
                key: value.to(encoder.device) if isinstance(value, torch.Tensor) else value
                for key, value in kwargs.items() if key in traced}))).cpu())
    features = torch.cat(features)
    if PROJECTOR in exported.components:
        projector = exported.runners[PROJECTOR]
        (argument,) = projector.metadata.kwargs
        features = _first_tensor(projector(**{argument: features.to(projector.device)})).cpu()
    return features.reshape(-1, features.shape[-1])


def _check_windows(component: str, traced: dict, kwargs: dict) -> None:
    """Refuse a window whose attention windows (`cu_seqlens`, from the engine's input preparers) are not as many as
    the traced window's: the windowed attention splits its frames with `.tolist()`, which the trace does not keep
    (traced on a clip of two windows, the ONNX encoder attended across them: docs/generation.md), so the exported
    encoder computes the traced number of windows only, and silently wrong for another. `encoder_features` cuts each
    clip into single windows first; this catches an export whose encoder was traced otherwise."""
    windows = kwargs.get("cu_seqlens")
    shape = (traced.get("cu_seqlens") or {}).get("shape")
    if isinstance(windows, torch.Tensor) and shape and windows.shape[0] != shape[0]:
        raise GenerationError(f"this export's {component} was traced on a clip of {shape[0] - 1} attention "
                              f"window(s) and computes that many only; this clip has {windows.shape[0] - 1} "
                              f"(cu_seqlens {windows.tolist()}): pass clips the length of the recipe's samples")


def rope_input_names(exported) -> list[str]:
    """The prompt inputs a multi-axis rope's positions are computed from besides `input_ids`, `attention_mask` and
    the images (the parameters of the model's `get_rope_index`: Qwen2-VL's `mm_token_type_ids`, `image_grid_thw`,
    ...); none for other exports."""
    if not takes_rope_positions(exported):
        return []
    model = _meta_model(exported)
    holder = model if hasattr(model, "get_rope_index") else getattr(model, "base_model", None)
    if not hasattr(holder, "get_rope_index"):
        return []
    parameters = inspect.signature(holder.get_rope_index).parameters.values()
    return [parameter.name for parameter in parameters if parameter.name not in ("input_ids", "attention_mask")
            and parameter.kind not in (parameter.VAR_KEYWORD, parameter.VAR_POSITIONAL)]


def rope_positions(exported, input_ids: torch.Tensor, attention_mask: torch.Tensor, prompt_inputs: dict):
    """A prompt's multi-axis rope positions, `[axes, batch, seq]`, as `model.generate` computes them: the model's own
    `_prepare_position_ids_for_generation` (Qwen2-VL-class: the text positions and `get_rope_index` over the image
    grids, `mm_token_type_ids`...), run on the model's class without weights. The decode continues them by one per
    step (`hfexport.generate.loop`), as generate's `_update_model_kwargs_for_generation` does."""
    model = _meta_model(exported)
    kwargs = {"attention_mask": attention_mask, **{name: torch.as_tensor(value) for name, value in
                                                   prompt_inputs.items() if value is not None}}
    try:
        positions = model._prepare_position_ids_for_generation(input_ids, kwargs)
    except Exception as error:  # noqa: BLE001 - the model's own message, one line
        raise GenerationError(f"{type(model).__name__} could not compute the prompt's rope positions from "
                              f"{sorted(kwargs)}: {str(error).splitlines()[0] if str(error) else type(error).__name__}"
                              ) from None
    traced = exported.runners[LANGUAGE_MODEL].metadata.kwargs["position_ids"]["shape"]
    if positions.dim() != 3 or positions.shape[0] != traced[0]:
        raise GenerationError(f"{type(model).__name__} computed rope positions {list(positions.shape)}; its language "
                              f"model takes position_ids of {traced[0]} axes: pass the processor's outputs "
                              f"({', '.join(rope_input_names(exported))}) with the prompts")
    return positions


def _lm_head_logits(exported, hidden_states: torch.Tensor) -> torch.Tensor:
    """The `lm_head` component on the language model's hidden states (its one input is named as traced)."""
    runner = exported.runners[LM_HEAD]
    (name,) = runner.metadata.kwargs
    return _first_tensor(runner(**{name: hidden_states.to(runner.device)}), only=True)


def _first_tensor(outputs, only: bool = False) -> torch.Tensor:
    """A component's first output tensor (an encoder's `last_hidden_state`), or with `only` its one output tensor (a
    runner returns it as traced: a tensor, or a tuple/output of one)."""
    if isinstance(outputs, torch.Tensor):
        return outputs
    values = list(outputs.values()) if hasattr(outputs, "values") else list(outputs)
    if not values or (only and len(values) != 1) or not isinstance(values[0], torch.Tensor):
        raise GenerationError(f"expected {'one' if only else 'an'} output tensor, got {type(outputs).__name__}")
    return values[0]
