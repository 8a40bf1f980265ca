"""Which transformers class loads a model, and loading it: only transformers' own classes, never code a recipe names.

The class comes from the recipe's `task`, else its `model_class` (a bare class name that must be one of
transformers' `PreTrainedModel` classes), else `config.architectures`, else `AutoModel`. `trust_remote_code`
is the caller's choice, off by default, never the recipe's.
"""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

from hfexport.errors import Problem, RecipeError, SourceError, first_line
from hfexport.processors import without_video

# task -> transformers Auto class name
TASK_AUTO_CLASSES = {
    "feature-extraction": "AutoModel",
    "fill-mask": "AutoModelForMaskedLM",
    "text-classification": "AutoModelForSequenceClassification",
    "token-classification": "AutoModelForTokenClassification",
    "question-answering": "AutoModelForQuestionAnswering",
    "text-generation": "AutoModelForCausalLM",
    "text2text-generation": "AutoModelForSeq2SeqLM",
    "image-classification": "AutoModelForImageClassification",
    "image-feature-extraction": "AutoModel",
    "automatic-speech-recognition": "AutoModelForSpeechSeq2Seq",
    "image-text-to-text": "AutoModelForImageTextToText",
    "audio-classification": "AutoModelForAudioClassification",
}


GENERATIVE_TASKS = ("text-generation", "text2text-generation", "automatic-speech-recognition", "image-text-to-text")
_CLASS_NAME = re.compile(r"^[A-Z][A-Za-z0-9_]{0,127}$")  # Qwen2_5OmniThinker..., Qwen2_5_VL...


def transformers_class(name: str, path: str = "model_class"):
    """A class exported by `transformers` itself: a bare name, a `PreTrainedModel` or Auto class; nothing else."""
    import transformers
    from transformers import PreTrainedModel

    if not isinstance(name, str) or not _CLASS_NAME.match(name):
        raise RecipeError(Problem(path, f"{name!r} is not a transformers class name (no dots, no module paths)"))
    cls = getattr(transformers, name, None)
    is_model = isinstance(cls, type) and issubclass(cls, PreTrainedModel)
    is_auto = isinstance(cls, type) and name.startswith("AutoModel") and hasattr(cls, "from_pretrained")
    if cls is None or not (is_model or is_auto) or not cls.__module__.startswith("transformers."):
        raise RecipeError(Problem(path, f"{name!r} is not one of transformers' model classes"))
    return cls


def infer_task(config) -> str:
    """A task for a model that has no recipe task: from its architecture's name."""
    architectures = getattr(config, "architectures", None) or []
    name = architectures[0] if architectures else ""
    if getattr(config, "is_encoder_decoder", False) and "Speech" in name or "Whisper" in name:
        return "automatic-speech-recognition"
    if name.endswith("ForConditionalGeneration") and getattr(config, "vision_config", None) is not None and not getattr(
            config, "is_encoder_decoder", False):
        return "image-text-to-text"  # a vision-language model (LLaVA, Idefics3, ...), not a text encoder-decoder
    if name.endswith("ForConditionalGeneration") and getattr(config, "audio_config", None) is not None and (
            _task_from_auto_mappings(name) == "automatic-speech-recognition"):
        return "automatic-speech-recognition"  # a decoder over audio tokens (Qwen3-ASR), not a text encoder-decoder
    for suffix, task in (
        ("ForCausalLM", "text-generation"),
        ("ForConditionalGeneration", "text2text-generation"),
        ("ForMaskedLM", "fill-mask"),
        ("ForSequenceClassification", "text-classification"),
        ("ForTokenClassification", "token-classification"),
        ("ForQuestionAnswering", "question-answering"),
        ("ForImageClassification", "image-classification"),
        ("ForImageTextToText", "image-text-to-text"),
    ):
        if name.endswith(suffix):
            return task
    return _task_from_auto_mappings(name) or "feature-extraction"


# transformers' own task -> class tables, for the classes whose names the suffixes above miss (`GPT2LMHeadModel`,
# `MarianMTModel`, `XLNetLMHeadModel`, ...); the first table naming the class wins.
_AUTO_MAPPINGS = (
    ("MODEL_FOR_SPEECH_SEQ_2_SEQ_MAPPING_NAMES", "automatic-speech-recognition"),
    ("MODEL_FOR_IMAGE_TEXT_TO_TEXT_MAPPING_NAMES", "image-text-to-text"),
    ("MODEL_FOR_SEQ_TO_SEQ_CAUSAL_LM_MAPPING_NAMES", "text2text-generation"),
    ("MODEL_FOR_CAUSAL_LM_MAPPING_NAMES", "text-generation"),
    ("MODEL_FOR_MASKED_LM_MAPPING_NAMES", "fill-mask"),
    ("MODEL_FOR_SEQUENCE_CLASSIFICATION_MAPPING_NAMES", "text-classification"),
    ("MODEL_FOR_TOKEN_CLASSIFICATION_MAPPING_NAMES", "token-classification"),
    ("MODEL_FOR_QUESTION_ANSWERING_MAPPING_NAMES", "question-answering"),
    ("MODEL_FOR_IMAGE_CLASSIFICATION_MAPPING_NAMES", "image-classification"),
    ("MODEL_FOR_AUDIO_CLASSIFICATION_MAPPING_NAMES", "audio-classification"),
)


def _task_from_auto_mappings(name: str) -> str | None:
    """The task whose transformers Auto table lists class `name`, None when none does (or `name` is empty)."""
    if not name:
        return None
    from transformers.models.auto import modeling_auto

    for table, task in _AUTO_MAPPINGS:
        classes = getattr(modeling_auto, table, {}).values()
        if any(name == entry or (isinstance(entry, tuple) and name in entry) for entry in classes):
            return task
    return None


def config_int(config, names: tuple[str, ...]) -> int | None:
    """The first positive int a config (then its `text_config`) holds under one of `names`, None if none does."""
    for holder in (config, getattr(config, "text_config", None)):
        for name in names:
            value = getattr(holder, name, None) if holder is not None else None
            if isinstance(value, int) and value > 0:
                return value
    return None


def sequence_limit(config) -> int | None:
    """The longest sequence a model's config admits (`max_position_embeddings` or its aliases), None if unstated."""
    return config_int(config, ("max_position_embeddings", "n_positions", "max_sequence_length"))


def multi_axis_rope(config) -> bool:
    """Whether the text model's rope takes several position axes (Qwen2-VL-class M-RoPE: `mrope_section`), whose
    positions come from the model's `get_rope_index` over the image grids, not from the attention mask."""
    for holder in (config, getattr(config, "text_config", None)):
        rope = getattr(holder, "rope_parameters", None) if holder is not None else None
        if isinstance(rope, dict) and rope.get("mrope_section"):
            return True
    return False


def model_class_for(config, task: str | None = None, model_class: str | None = None):
    """The class to load: task's Auto class, else the recipe's class name, else the config's architecture."""
    if task:
        return transformers_class(TASK_AUTO_CLASSES[task], "task")
    if model_class:
        return transformers_class(model_class)
    architectures = getattr(config, "architectures", None) or []
    if architectures:
        return transformers_class(architectures[0], "config.architectures.0")
    return transformers_class("AutoModel")


def load_config(name_or_path: str | Path, revision: str | None = None, token: str | None = None,
                trust_remote_code: bool = False):
    from transformers import AutoConfig

    try:
        return AutoConfig.from_pretrained(
            str(name_or_path), revision=revision, token=token, trust_remote_code=trust_remote_code
        )
    except (OSError, ValueError) as error:
        raise SourceError(f"cannot load the config of {name_or_path}: {first_line(error)}") from None


#: The dtype a model is loaded at to be exported, whatever its checkpoint is stored in: the engine exports at the
#: model's dtype, and the formats' runtimes compute at float32 on the CPU (ONNX Runtime's CPU provider has no
#: bfloat16 `Mul`), as optimum exports a half-precision checkpoint by default. A target that wants a half-precision
#: file says so (the ONNX `"dtype": "float16"`, `hfexport.formats.onnx.float16`; OpenVINO's `runtime.precision`).
EXPORT_DTYPE = "float32"


def checkpoint_dtype(config) -> str | None:
    """The dtype the checkpoint's weights are stored in, as its config says (`dtype`, the older `torch_dtype`), the
    text model's for a composite config; None when unstated."""
    for holder in (config, getattr(config, "text_config", None)):
        dtype = getattr(holder, "dtype", None) if holder is not None else None
        if dtype is not None and str(dtype) != "auto":
            return str(dtype).removeprefix("torch.")
    return None


def load_model(name_or_path: str | Path, recipe=None, revision: str | None = None, token: str | None = None,
               trust_remote_code: bool = False, config=None) -> Any:
    """Load the model a recipe describes, in eval mode, at `EXPORT_DTYPE` (float32), on the CPU."""
    config = config or load_config(name_or_path, revision, token, trust_remote_code)
    cls = model_class_for(config, recipe.task if recipe else None, recipe.model_class if recipe else None)
    try:
        model = cls.from_pretrained(
            str(name_or_path), revision=revision, token=token, trust_remote_code=trust_remote_code, config=config,
            dtype=EXPORT_DTYPE,
        )
    except (OSError, ValueError) as error:
        raise SourceError(f"cannot load {name_or_path} with {cls.__name__}: {first_line(error)}") from None
    return model.eval()


def load_processor(name_or_path: str | Path, revision: str | None = None, token: str | None = None):
    """The repo's processor or tokenizer (None when it has neither): it turns sample texts/images into inputs.

    A processor whose video processor needs a library this environment lacks (transformers' video processors need
    torchvision) is assembled from its other parts (`hfexport.processors.without_video`): images and audio are
    processed as the full processor does. Any other part that needs a missing library is refused (SourceError with
    transformers' own message): falling back to the tokenizer would turn the repo's images or audio into something
    other than its processor's inputs, and fail later for another reason."""
    from transformers import AutoProcessor, AutoTokenizer

    for loader in (AutoProcessor, AutoTokenizer):
        try:
            return loader.from_pretrained(str(name_or_path), revision=revision, token=token)
        except ImportError as error:
            sentence = first_line(" ".join(str(error).split()).split(". ")[0].rstrip(".") or type(error).__name__)
            assembled = without_video(str(name_or_path), error, sentence, revision, token)
            if assembled is not None:
                return assembled
            raise SourceError(f"cannot load the model's processor: {sentence}") from None
        except Exception:  # noqa: BLE001 - a repo without a processor is normal; the next loader or None
            continue
    return None


def key_value_heads(config) -> int:
    """The key-value heads of one attention layer of a (text) config: `num_key_value_heads`, else 1 for a multi-query
    config (`multi_query`, unless `new_decoder_architecture` says `num_kv_heads`: Falcon's and GPT-BigCode's fields,
    read as their modeling code reads them), else `num_kv_heads`, else `num_attention_heads`."""
    heads = getattr(config, "num_key_value_heads", None)
    if heads is None and getattr(config, "multi_query", False) and not getattr(config, "new_decoder_architecture", False):
        return 1
    return heads or getattr(config, "num_kv_heads", None) or config.num_attention_heads


def empty_cache(config, batch: int, dtype=None):
    """The `DynamicCache` a single-graph decode runs the prompt on (`generation.single_graph`): per layer of `config`,
    keys and values of `batch` rows and no positions, `[batch, key_value_heads, 0, head_dim]` (transformers 5.23's
    attention cache layout), so the cache has the structure the decode was traced with."""
    import torch
    from transformers import DynamicCache

    dtype = dtype or torch.float32
    config = config.get_text_config()
    heads = key_value_heads(config)
    head_dim = getattr(config, "head_dim", None) or config.hidden_size // config.num_attention_heads
    cache = DynamicCache(config=config)
    for layer in range(len(cache.layers)):
        cache.update(torch.zeros(batch, heads, 0, head_dim, dtype=dtype),
                     torch.zeros(batch, heads, 0, head_dim, dtype=dtype), layer)
    return cache


def on_empty_cache(inputs: dict, model) -> dict:
    """A prompt's forward kwargs (`input_ids`, mask, positions) with `past_key_values` the `empty_cache` of `model`'s
    config, batch and dtype: what a single-graph decode runs a prompt on."""
    return {**inputs, "past_key_values": empty_cache(model.config, int(inputs["input_ids"].shape[0]), model.dtype)}
