"""The engine's export input preparers at run time: what a component traced on prepared inputs needs to run again.

transformers 5.23's `register_export_input_preparer` functions compute data-dependent inputs outside the traced graph
(a NaViT encoder's nearest position ids, window index and window lengths from `target_sizes`, ...), from the sample
inputs and a few attributes of the module being exported (`num_patches_per_side`, `window_kernel_size`, its attention
implementation). The exported component then takes those inputs, so whoever runs it on new images computes them
again. hfexport records the attributes beside the export (`input_preparers.json`, per component) and, at run time,
runs the engine's own `prepare_for_export` on a stand-in module that carries them: generating from the export needs
no torch model.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from hfexport.errors import CorruptExportError, HfExportError

FILE = "input_preparers.json"
# The module attributes transformers 5.23's preparers read (`transformers/exporters/utils.py`): `grid_thw`:
# spatial_merge_size, window_size, patch_size, num_grid_per_side; `target_sizes`: num_patches_per_side,
# window_kernel_size; the audio encoders: n_window, n_window_infer.
ATTRIBUTES = ("num_patches_per_side", "window_kernel_size", "spatial_merge_size", "window_size", "patch_size",
              "num_grid_per_side", "n_window", "n_window_infer")

# The attention implementations a recorded component may name (what the preparers read it for: whether flash
# attention wants `max_seqlen`).
ATTENTION = ("eager", "sdpa", "flex_attention", "flash_attention_2", "flash_attention_3", None)


def _attribute(module, name: str):
    """The first value of `name` on `module` or a submodule (where the engine's preparers look for it)."""
    return next((value for part in module.modules() if (value := getattr(part, name, None)) is not None), None)


def _plain(value) -> bool:
    return isinstance(value, (int, float, str, bool)) or (
        isinstance(value, (list, tuple)) and all(isinstance(item, int) for item in value))


def context(module, added: list[str]) -> dict:
    """What running the engine's preparers again needs for a component exported from `module`, whose inputs they
    added to (`added`: those inputs' names)."""
    attributes = {}
    for name in ATTRIBUTES:
        value = _attribute(module, name)
        if value is not None and _plain(value):
            attributes[name] = list(value) if isinstance(value, tuple) else value
    implementation = getattr(getattr(module, "config", None), "_attn_implementation", None)
    return {"added": list(added), "attributes": attributes,
            "attn_implementation": implementation if implementation in ATTENTION else None}


def prepare(recorded: dict, inputs: dict, module: str | None = None) -> dict:
    """`inputs` with what the engine's preparers compute from them, on a stand-in of the exported module. `module`:
    the modeling module the exported module's class comes from (transformers 5.23's omni-audio preparer takes its
    helpers, `chunk_and_pad_features`, ..., from `type(model).__module__`), named by the caller from the export's
    own model class, never from the file."""
    import torch
    from transformers import PretrainedConfig
    from transformers.exporters.utils import prepare_for_export

    standin = type("ExportedModule", (torch.nn.Module,), {"__module__": module or __name__})()
    for name, value in recorded["attributes"].items():
        setattr(standin, name, tuple(value) if isinstance(value, list) else value)
    config = PretrainedConfig()
    config._attn_implementation = recorded.get("attn_implementation") or "eager"
    standin.config = config
    _, prepared, _ = prepare_for_export(standin, dict(inputs))
    return prepared


def write(folder: str | Path, contexts: dict[str, dict]) -> None:
    """`input_preparers.json` in the export folder (nothing when no component's inputs were prepared)."""
    import json

    if contexts:
        (Path(folder) / FILE).write_text(json.dumps(contexts, indent=2) + "\n", encoding="utf-8")


def check_input_preparers(data: Any, label: str) -> dict[str, dict]:
    """The content of an export's `input_preparers.json` (parsed), checked (`label`: the file as the user named it)."""

    def refuse(where: str, expectation: str):
        raise CorruptExportError(f"{label}: {where}: {expectation}")

    if not isinstance(data, dict):
        refuse("$", "expected an object of component names")
    for component, entry in data.items():
        where = f"$.{component}"
        if not isinstance(entry, dict) or set(entry) != {"added", "attributes", "attn_implementation"}:
            refuse(where, "expected an object with added, attributes and attn_implementation")
        if not isinstance(entry["added"], list) or not all(isinstance(name, str) for name in entry["added"]):
            refuse(f"{where}.added", "expected a list of input names")
        attributes: Any = entry["attributes"]
        if not isinstance(attributes, dict):
            refuse(f"{where}.attributes", "expected an object")
        for name, value in attributes.items():
            if name not in ATTRIBUTES or not _plain(value):
                refuse(f"{where}.attributes.{name}", f"expected one of {', '.join(ATTRIBUTES)} with a number, string "
                                                     "or list of integers")
        if entry["attn_implementation"] not in ATTENTION:  # a name only: never a kernel repo to fetch
            refuse(f"{where}.attn_implementation", "expected one of " + ", ".join(
                name or "null" for name in ATTENTION))
    return data


def _patches_per_image(images: dict) -> list[int] | None:
    """Each image's patch rows where the images come packed (a `grid_thw` input, `[images, 3]`, beside `pixel_values`
    `[patches, ...]` holding every image's t * h * w patches one after another: Qwen2-VL-class), else None."""
    grids = [value for name, value in images.items() if name.endswith("grid_thw")]
    if len(grids) != 1 or grids[0].dim() != 2:
        return None
    return [int(rows) for rows in grids[0].prod(-1)]


def image_count(images: dict) -> int | None:
    """How many images `images` (a VLM's image inputs, tensors) hold: their common first axis, or the grid's rows
    where the patches come packed; None where they do not agree."""
    counts = {int(value.shape[0]) for value in images.values()}
    if len(counts) == 1:
        return counts.pop()
    patches = _patches_per_image(images)
    if patches is not None and counts <= {len(patches), sum(patches)}:
        return len(patches)
    return None


def image_slice(images: dict, first: int, stop: int) -> dict:
    """Images `first` to `stop` of `images` (see `image_count`): rows of a per-image input, the patch rows of those
    images of a packed one."""
    patches = _patches_per_image(images)
    if patches is None or len(patches) == sum(patches):
        return {name: value[first:stop] for name, value in images.items()}
    offsets = [sum(patches[:index]) for index in range(len(patches) + 1)]
    return {name: value[offsets[first] : offsets[stop]] if value.shape[0] == offsets[-1] else value[first:stop]
            for name, value in images.items()}


def repack_images(before: dict, after: dict) -> dict:
    """`after` (inputs whose per-image rows a probe tiled or cropped from `before`: image `i` is `before`'s image
    `i % count`) with packed patches that follow their grid: the chosen images' patch rows, in order."""
    import torch

    grids = [name for name in before if name.endswith("grid_thw")]
    patches = _patches_per_image({name: before[name] for name in grids})
    if patches is None or after[grids[0]].shape[0] == len(patches) or len(patches) == sum(patches):
        return after
    packed = {name: value for name, value in before.items()
              if isinstance(value, torch.Tensor) and value.dim() and value.shape[0] == sum(patches)}
    images = {**packed, grids[0]: before[grids[0]]}
    picked = [image_slice(images, index % len(patches), index % len(patches) + 1)
              for index in range(after[grids[0]].shape[0])]
    return {**after, **{name: torch.cat([chunk[name] for chunk in picked]) for name in packed}}


class _EncoderCalled(HfExportError):
    """Raised by the hook on a model's encoder: the kwargs the model's own code called it with."""

    def __init__(self, kwargs: dict):
        super().__init__("encoder called")
        self.kwargs = kwargs


def encoder_call(model, modality: str, inputs: dict) -> dict:
    """The kwargs `model.get_<modality>_features(**inputs)` gives its `<modality>` encoder (`model.get_encoder`), as
    the model's own code computes them from the processor's inputs (Qwen2.5-Omni's: the mel frames packed by
    `feature_attention_mask`, with `feature_lens`). The call stops when the encoder is reached, so `model` may be a
    meta-device twin without weights. Raises the model's own error, or RuntimeError when no encoder was called."""
    import inspect

    encoder = model.get_encoder(modality=modality)
    signature = inspect.signature(type(encoder).forward)

    def stop(module, args, kwargs):
        arguments = dict(signature.bind(module, *args, **kwargs).arguments)
        arguments.pop("self", None)
        variadic = [name for name, parameter in signature.parameters.items() if parameter.kind == parameter.VAR_KEYWORD]
        for name in variadic:
            arguments.update(arguments.pop(name, None) or {})
        raise _EncoderCalled(arguments)

    handle = encoder.register_forward_pre_hook(stop, with_kwargs=True)
    try:
        getattr(model, f"get_{modality}_features")(**inputs)
    except _EncoderCalled as call:
        return call.kwargs
    finally:
        handle.remove()
    raise RuntimeError(f"{type(model).__name__}.get_{modality}_features did not call its {modality} encoder")


def encoder_input_names(model, modality: str) -> list[str]:
    """The processor's inputs `model.get_<modality>_features` takes (its named parameters)."""
    import inspect

    parameters = inspect.signature(getattr(model, f"get_{modality}_features")).parameters.values()
    return [parameter.name for parameter in parameters
            if parameter.kind not in (parameter.VAR_KEYWORD, parameter.VAR_POSITIONAL)]


def attention_window_frames(encoder) -> int | None:
    """The input frames of one attention window of an audio encoder that attends within windows (`cu_seqlens`), as
    the model's own `get_audio_cu_seqlens` lays them out from the attributes the engine's omni-audio and Qwen3-ASR
    preparers read: chunks of `2 * n_window` mel frames, `n_window_infer // (2 * n_window)` chunks per window where
    the encoder has `n_window_infer` (Qwen3-ASR: 800 frames, 8 s), one chunk per window otherwise (Qwen2.5-Omni's
    published `n_window` 100: 200 frames, 2 s). None for an encoder without `n_window`."""
    n_window = _attribute(encoder, "n_window")
    if not isinstance(n_window, int) or n_window <= 0:
        return None
    chunk = 2 * n_window
    infer = _attribute(encoder, "n_window_infer")
    return chunk * max(infer // chunk, 1) if isinstance(infer, int) and infer > 0 else chunk


def _frame_mask(clip: dict):
    """A clip's mask of valid frames (the one integer or bool input of two axes: `feature_attention_mask`,
    `input_features_mask`), or None."""
    import torch

    masks = [value for value in clip.values() if isinstance(value, torch.Tensor) and value.dim() == 2
             and not value.is_floating_point()]
    return masks[0] if len(masks) == 1 else None


def clip_windows(clip: dict, frames: int | None) -> list[dict]:
    """One clip's processor inputs (a first axis of one) cut into its attention windows of `frames` mel frames
    (`attention_window_frames`), each as the processor's inputs of a clip of its own: every input whose last axis is
    the frame axis (that of the frame mask, else of `input_features`) sliced on it, the last window up to the last
    valid frame's window end. An encoder whose attention is block-diagonal over the windows, and per frame after it,
    gives the whole clip's features concatenated from these (checked at plan time:
    `hfexport.plan.vision_language.encoder_embed_stages`). `[clip]` where `frames` is None or the clip is one window.
    Raises ValueError on a mask that is not right-padded (valid frames, then padding): the model chunks the frames
    it keeps, so windows cut on the padded axis would not be its windows."""
    import torch

    mask = _frame_mask(clip)
    features = clip.get("input_features")
    if frames is None or (mask is None and not isinstance(features, torch.Tensor)):
        return [clip]
    length = int(mask.shape[-1]) if mask is not None else int(features.shape[-1])
    valid = length
    if mask is not None:
        valid = int(mask.sum())
        if bool((mask[..., :valid] == 0).any()):
            raise ValueError("the clip's frame mask is not right-padded (its valid frames first): hfexport cuts a "
                             "clip into its encoder's attention windows on the valid frames")
    if valid <= frames:
        return [clip]
    return [{name: value[..., start : start + frames]
             if isinstance(value, torch.Tensor) and value.dim() and value.shape[-1] == length else value
             for name, value in clip.items()} for start in range(0, valid, frames)]
