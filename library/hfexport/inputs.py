"""Sample inputs from a recipe: texts through the tokenizer/processor, synthesized images and audio, explicit tensors.

Everything is deterministic (seeded). Defaults avoid the shapes torch.export specializes on: batch >= 2 and a
sequence length that is neither 0, 1, nor equal to the batch, so a dynamic axis is never silently pinned.
"""

from __future__ import annotations

from typing import Any

from hfexport.errors import PlanError
from hfexport.models import GENERATIVE_TASKS
from hfexport.samples import SPEC_KEYS

DEFAULT_TEXTS = ["The capital of France is Paris, and", "Exporting a model should be one call."]
DEFAULT_SEQ = 13
DEFAULT_BATCH = 2
SEED = 0
_DTYPES = ("int64", "int32", "bool", "float32", "float16", "bfloat16")


# Samples only trace the model: bounded so that a recipe's sizes (each allowed up to 2**30) cannot exhaust memory.
MAX_SAMPLE_ELEMENTS = 1 << 27


def check_sample_size(path: str, shape) -> None:
    """PlanError when a synthesized sample of `shape` would exceed MAX_SAMPLE_ELEMENTS (checked before allocating)."""
    count = 1
    for size in shape:
        count *= int(size)
    if count > MAX_SAMPLE_ELEMENTS:
        raise PlanError(f"{path}: a sample of {' x '.join(map(str, shape))} = {count} values is too large "
                        f"(at most {MAX_SAMPLE_ELEMENTS}); use smaller sizes or dim bounds")


def sample_size(name: str | int, dims: dict, axis: int) -> int:
    """A concrete size for a shape entry: an int as is, a dim name at a non-special value inside its bounds."""
    if isinstance(name, int):
        return name
    bounds = dims.get(name, {})
    preferred = DEFAULT_BATCH if axis == 0 else DEFAULT_SEQ
    low, high = bounds.get("min", 0), bounds.get("max", max(preferred, 1 << 30))
    return max(low, min(preferred, high))


def _config_value(config, name: str, path: str):
    """A range bound that names a config value (`vocab_size`); only plain numeric attributes are read."""
    for holder in (config, getattr(config, "text_config", None)):
        value = getattr(holder, name, None) if holder is not None else None
        if isinstance(value, (int, float)) and not isinstance(value, bool):
            return value
    raise PlanError(f"{path}: the model config has no numeric value {name!r}")


def explicit_tensors(specs: dict, dims: dict, config) -> dict:
    """`{name: {shape, dtype, range|fill}}` -> tensors, seeded."""
    import torch

    generator = torch.Generator().manual_seed(SEED)
    tensors = {}
    for name, spec in specs.items():
        shape = [sample_size(size, dims, axis) for axis, size in enumerate(spec["shape"])]
        dtype = getattr(torch, spec["dtype"])
        path = f"sample_inputs.tensors.{name}"
        check_sample_size(f"{path}.shape", shape)
        if "fill" in spec:
            tensors[name] = torch.full(shape, spec["fill"], dtype=dtype)
            continue
        low, high = [
            _config_value(config, bound, f"{path}.range") if isinstance(bound, str) else bound
            for bound in spec.get("range", [0, 2] if not dtype.is_floating_point else [-1, 1])
        ]
        if dtype.is_floating_point:
            tensors[name] = (torch.rand(shape, generator=generator) * (high - low) + low).to(dtype)
        elif dtype == torch.bool:
            tensors[name] = torch.randint(0, 2, shape, generator=generator).bool()
        else:
            if high <= low:
                raise PlanError(f"{path}.range: empty integer range [{low}, {high})")
            tensors[name] = torch.randint(int(low), int(high), shape, generator=generator, dtype=dtype)
    return tensors


def _avoid_special_length(encoded: dict, tokenizer, batch: int) -> dict:
    """Pad a batch whose sequence length is 0, 1, 2 or equal to the batch, so that axis is not specialized."""
    length = encoded["input_ids"].shape[1]
    if length > 2 and length != batch:
        return encoded
    target = max(length, batch, 2) + 1
    pad_id = tokenizer.pad_token_id if tokenizer is not None and tokenizer.pad_token_id is not None else 0
    import torch

    pad = target - length
    result = dict(encoded)
    result["input_ids"] = torch.cat([torch.full((batch, pad), pad_id, dtype=encoded["input_ids"].dtype), encoded["input_ids"]], 1)
    if "attention_mask" in encoded:
        result["attention_mask"] = torch.cat([torch.zeros(batch, pad, dtype=encoded["attention_mask"].dtype), encoded["attention_mask"]], 1)
    if "token_type_ids" in encoded:
        result["token_type_ids"] = torch.cat([torch.zeros(batch, pad, dtype=encoded["token_type_ids"].dtype), encoded["token_type_ids"]], 1)
    return result


def tokenizer_of(processor):
    return getattr(processor, "tokenizer", processor)


def text_inputs(texts: list[str], processor, config, max_length: int | None = None,
                padding_side: str | None = None) -> dict:
    """Tokenize sample texts (padding to the longest, on `padding_side` when given, else the tokenizer's side;
    pad = eos when the tokenizer has no pad token)."""
    import torch

    tokenizer = tokenizer_of(processor)
    if tokenizer is None or not callable(tokenizer):
        vocab = int(_config_value(config, "vocab_size", "sample_inputs.text"))
        generator = torch.Generator().manual_seed(SEED)
        ids = torch.randint(3, vocab, (len(texts), DEFAULT_SEQ), generator=generator)
        return {"input_ids": ids, "attention_mask": torch.ones_like(ids)}
    if getattr(tokenizer, "pad_token", None) is None and getattr(tokenizer, "eos_token", None) is not None:
        tokenizer.pad_token = tokenizer.eos_token
    kwargs = {"truncation": True, "max_length": max_length} if max_length else {}
    if padding_side is not None:
        kwargs["padding_side"] = padding_side
    encoded = dict(tokenizer(list(texts), return_tensors="pt", padding=True, **kwargs))
    return _avoid_special_length(encoded, tokenizer, len(texts))


def synthetic_images(spec: dict, count: int) -> list:
    """`count` deterministic RGB images (HWC uint8 arrays) of the spec's size."""
    import numpy as np

    height, width = spec.get("height", 224), spec.get("width", 224)
    check_sample_size("sample_inputs.images", (count, height, width, 3))
    rng = np.random.default_rng(SEED)
    return [rng.integers(0, 256, (height, width, 3), dtype=np.uint8) for _ in range(count)]


def sample_images(spec: dict, count: int, samples: dict | None = None) -> list:
    """The sample's `count` images: the given sample image (`hfexport.samples`) in each place, else synthetic ones."""
    given = (samples or {}).get("image")
    return [given.image()] * count if given is not None else synthetic_images(spec, count)


def image_inputs(spec: dict, processor, count: int, samples: dict | None = None) -> dict:
    """Deterministic synthetic RGB images (or the given sample image) through the image processor."""
    image_processor = getattr(processor, "image_processor", processor)
    if image_processor is None:
        raise PlanError("sample_inputs.images: the model repo has no image processor")
    return dict(image_processor(images=sample_images(spec, count, samples), return_tensors="pt"))


def is_image_text_processor(processor) -> bool:
    """A multimodal processor (tokenizer + image processor), e.g. LlavaProcessor."""
    return getattr(processor, "tokenizer", None) is not None and getattr(processor, "image_processor", None) is not None


def image_text_inputs(texts: list[str], spec: dict, processor, count: int, max_length: int | None = None,
                      samples: dict | None = None) -> dict:
    """Texts and images through a multimodal processor in one call: the processor expands each image placeholder
    in the text to that image's token count (the tokenizer alone leaves one placeholder, which the model rejects)."""
    tokenizer = processor.tokenizer
    if getattr(tokenizer, "pad_token", None) is None and getattr(tokenizer, "eos_token", None) is not None:
        tokenizer.pad_token = tokenizer.eos_token
    kwargs = {"truncation": True, "max_length": max_length} if max_length else {}
    texts = list(texts)
    placeholder = getattr(processor, "image_token", None)
    if isinstance(placeholder, str) and count == len(texts):
        # One image per text: a text without the placeholder (`hfexport init`'s default texts) gets it in front,
        # else the processor refuses the images ("... image tokens in the text ...").
        texts = [text if placeholder in text else f"{placeholder} {text}" for text in texts]
    return dict(processor(text=texts, images=sample_images(spec, count, samples), return_tensors="pt", padding=True,
                          **kwargs))


def synthetic_audio(spec: dict, count: int, rate: int) -> list:
    """`count` deterministic clips (a tone plus seeded noise, float32 arrays) of the spec's length at `rate`."""
    import numpy as np

    seconds = spec.get("seconds", 1.0)
    check_sample_size("sample_inputs.audio", (count, int(rate * seconds)))
    rng = np.random.default_rng(SEED)
    time = np.arange(int(rate * seconds)) / rate
    return [(0.3 * np.sin(2 * np.pi * (220 + 110 * i) * time) + 0.01 * rng.standard_normal(time.size)).astype("float32")
            for i in range(count)]


def _sampling_rate(spec: dict, extractor) -> int:
    return spec.get("sampling_rate") or getattr(extractor, "sampling_rate", 16000)


def sample_audio(spec: dict, count: int, rate: int, samples: dict | None = None) -> list:
    """The sample's `count` clips at `rate`: the given sample clip (`hfexport.samples`) in each place, else synthetic."""
    given = (samples or {}).get("audio")
    return [given.audio(rate)] * count if given is not None else synthetic_audio(spec, count, rate)


def audio_inputs(spec: dict, processor, count: int, samples: dict | None = None) -> dict:
    """Deterministic synthetic audio (a tone plus seeded noise), or the given clip, through the feature extractor."""
    extractor = getattr(processor, "feature_extractor", processor)
    if extractor is None:
        raise PlanError("sample_inputs.audio: the model repo has no feature extractor")
    rate = _sampling_rate(spec, extractor)
    return dict(extractor(sample_audio(spec, count, rate, samples), sampling_rate=rate, return_tensors="pt"))


def is_audio_text_processor(processor) -> bool:
    """A processor that puts audio placeholders into the text (tokenizer + feature extractor + `audio_token`), e.g.
    Qwen3ASRProcessor; Whisper's processor has no `audio_token` (its audio goes to the encoder, not the text)."""
    return (getattr(processor, "tokenizer", None) is not None
            and getattr(processor, "feature_extractor", None) is not None
            and isinstance(getattr(processor, "audio_token", None), str))


def audio_text_inputs(texts: list[str], spec: dict, processor, count: int, samples: dict | None = None) -> dict:
    """Texts and audio through a multimodal processor in one call, which expands each audio placeholder to that
    clip's token count (as `image_text_inputs` does for images)."""
    tokenizer = processor.tokenizer
    if getattr(tokenizer, "pad_token", None) is None and getattr(tokenizer, "eos_token", None) is not None:
        tokenizer.pad_token = tokenizer.eos_token
    placeholder = processor.audio_token
    texts = [text if placeholder in text else f"{placeholder} {text}" for text in texts]
    rate = _sampling_rate(spec, processor.feature_extractor)
    return dict(processor(text=texts, audio=sample_audio(spec, count, rate, samples), sampling_rate=rate,
                          return_tensors="pt", padding=True))


def default_sample_spec(task: str | None) -> dict:
    """What to synthesize when the recipe names no sample inputs."""
    if task in ("image-classification", "image-feature-extraction"):
        return {"images": {"count": DEFAULT_BATCH}}
    if task == "automatic-speech-recognition" or task == "audio-classification":
        return {"audio": {"count": DEFAULT_BATCH, "seconds": 1.0}}
    if task == "image-text-to-text":
        return {"text": DEFAULT_TEXTS, "images": {"count": DEFAULT_BATCH}}
    return {"text": DEFAULT_TEXTS}


def sample_spec(recipe, task: str | None) -> dict:
    """The recipe's `sample_inputs`, or what is synthesized for its task when it names none."""
    return recipe.sample_inputs or default_sample_spec(task)


def check_sample_places(spec: dict, samples: dict | None) -> None:
    """PlanError when a given sample file (`hfexport.samples`) has no place in the sample inputs: it stands in for
    the recipe's images (clips), so a recipe whose samples hold none cannot take one."""
    for kind, sample in (samples or {}).items():
        key = SPEC_KEYS[kind]
        if key not in spec:
            raise PlanError(f"sample_inputs.{key}: the recipe's sample inputs hold no {key}, so the sample {kind} "
                            f"{sample.name} has no place in them (add `sample_inputs.{key}` to the recipe)")


def build_sample_inputs(recipe, processor, config, task: str | None, mode: str = "forward",
                        samples: dict | None = None) -> dict[str, Any]:
    """The inputs a target is traced with: forward kwargs (mode `forward`) or generate kwargs (`generation`).
    `samples`: given sample files by kind (`hfexport.samples.SampleFile`), each in place of every synthesized item of
    its kind."""
    spec = sample_spec(recipe, task)
    check_sample_places(spec, samples)
    dims = recipe.dims
    inputs: dict[str, Any] = {}
    if "tensors" in spec:
        inputs.update(explicit_tensors(spec["tensors"], dims, config))
    count = len(spec.get("text", [])) or DEFAULT_BATCH
    if "text" in spec and "images" in spec and is_image_text_processor(processor):
        inputs.update(image_text_inputs(spec["text"], spec["images"], processor, spec["images"].get("count", count),
                                        spec.get("max_length"), samples))
    elif "text" in spec and "audio" in spec and is_audio_text_processor(processor):
        inputs.update(audio_text_inputs(spec["text"], spec["audio"], processor, spec["audio"].get("count", count),
                                        samples))
    elif "text" in spec:
        # A decoder-only model's generation prompts are left-padded, as `model.generate` expects them, whatever side
        # the checkpoint's tokenizer pads (SmolLM2's pads right): ExecuTorch's LLM runner program and a decode that
        # runs the prompt take no right padding.
        decoder_generation = mode == "generation" and not getattr(config, "is_encoder_decoder", False)
        inputs.update(text_inputs(spec["text"], processor, config, spec.get("max_length"),
                                  padding_side="left" if decoder_generation else None))
    if "images" in spec and "pixel_values" not in inputs:
        inputs.update(image_inputs(spec["images"], processor, spec["images"].get("count", count), samples))
    if "audio" in spec and "input_features" not in inputs:
        inputs.update(audio_inputs(spec["audio"], processor, spec["audio"].get("count", count), samples))
    if not inputs:
        raise PlanError("sample_inputs: nothing to build inputs from")
    if mode == "forward" and task in GENERATIVE_TASKS:
        inputs["use_cache"] = False  # one graph without a cache; the engine's prepare_for_export pops the flag
    return inputs
