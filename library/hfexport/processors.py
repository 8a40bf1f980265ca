"""A processor's parts: loaded without its video processor where only that part needs a missing library, and
saved beside a program as every format's loaders read them (`save_tokenizer`, `save_flat_preprocessor_config`).

transformers 5.23 builds image processors on Pillow (`image_processing_pil_*.py`) and feature extractors on numpy, but
every video processor on torchvision; a processor that takes a video processor beside its image processor or feature
extractor (Qwen2-VL, Qwen2.5-VL, Qwen2.5-Omni, MiniCPM-V, ...) then fails to load without torchvision ("...
VideoProcessor requires the Torchvision library"), though images and audio never reach the video part. Where loading
failed only there, `without_video` assembles the processor transformers chose from its other parts, each loaded by
its own Auto class, with a `VideoProcessorNotLoaded` in the video slot: it holds the saved video settings (what the
processor's constructor reads, and what saving the processor writes back) and raises transformers' own message when
it is asked to process a video. The inputs are those the full processor makes for images and
audio: its own call path, tokens and placeholders.
"""

from __future__ import annotations

import json
import logging
import os
from pathlib import Path

from hfexport.files import read_json_object

LOG = logging.getLogger(__name__)
VIDEO = "video_processor"


class VideoProcessorNotLoaded:
    """The video slot of a processor loaded without its video processor: the saved settings, nothing that runs."""

    _auto_class = None  # what `ProcessorMixin.save_pretrained` asks every part (its settings are saved by `to_dict`)

    def __init__(self, settings: dict, reason: str):
        self._settings = dict(settings)
        self.reason = reason

    def __getattr__(self, name: str):
        settings = self.__dict__.get("_settings", {})
        if name in settings:
            return settings[name]
        raise AttributeError(f"{name}: video processor not loaded: {self.__dict__.get('reason')}")

    def __call__(self, *args, **kwargs):
        raise ImportError(f"video processor not loaded: {self.reason}")

    def __deepcopy__(self, memo):
        return VideoProcessorNotLoaded(self._settings, self.reason)

    def to_dict(self) -> dict:
        return dict(self._settings)

    def __repr__(self) -> str:
        return f"VideoProcessorNotLoaded({self.reason})"


def _chosen_class(error: BaseException):
    """The processor class transformers' `ProcessorMixin.from_pretrained` was loading when `error` was raised."""
    from transformers.processing_utils import ProcessorMixin

    code = ProcessorMixin.from_pretrained.__func__.__code__
    chosen, trace = None, error.__traceback__
    while trace is not None:
        if trace.tb_frame.f_code is code:
            chosen = trace.tb_frame.f_locals.get("cls")
        trace = trace.tb_next
    return chosen


def _video_settings(source: str, processor_dict: dict, revision, token) -> dict:
    from transformers.video_processing_utils import BaseVideoProcessor

    section = processor_dict.get(VIDEO)
    if isinstance(section, dict):
        return section
    try:
        settings, _ = BaseVideoProcessor.get_video_processor_dict(source, revision=revision, token=token)
    except (OSError, ValueError):
        return {}
    return settings


def without_video(source: str, error: ImportError, reason: str, revision=None, token=None):
    """The processor whose loading raised `error` (transformers' ImportError from its video processor), assembled from
    its other parts, or None when `error` came from elsewhere or another part fails too (`reason`: what the report
    says the video processor needs)."""
    from transformers.processing_utils import MODALITY_TO_AUTOPROCESSOR_MAPPING

    chosen = _chosen_class(error)
    if chosen is None or VIDEO not in chosen.get_attributes():
        return None
    options = {"revision": revision, "token": token}
    processor_dict, instantiation = chosen.get_processor_dict(source, **options)
    parts = []
    for attribute in chosen.get_attributes():
        if attribute == VIDEO:
            parts.append(VideoProcessorNotLoaded(_video_settings(source, processor_dict, revision, token), reason))
        elif attribute in MODALITY_TO_AUTOPROCESSOR_MAPPING:  # a primary part: its Auto class, as transformers loads it
            try:
                parts.append(MODALITY_TO_AUTOPROCESSOR_MAPPING[attribute].from_pretrained(source, **options))
            except ImportError:
                return None
        else:  # a second tokenizer or image processor: not what this assembles
            return None

    def check_argument_for_proper_class(self, argument_name, argument):
        if isinstance(argument, VideoProcessorNotLoaded):
            return VideoProcessorNotLoaded
        return chosen.check_argument_for_proper_class(self, argument_name, argument)

    def to_dict(self):  # the video settings as saved, where transformers serializes its parts' `to_dict()`
        output = chosen.to_dict(self)
        if isinstance(output.get(VIDEO), VideoProcessorNotLoaded):
            output[VIDEO] = output[VIDEO].to_dict()
        return output

    assembled = type(chosen.__name__, (chosen,), {"__module__": chosen.__module__, "__doc__": chosen.__doc__,
                                                  "check_argument_for_proper_class": check_argument_for_proper_class,
                                                  "to_dict": to_dict})
    processor = assembled.from_args_and_dict(parts, processor_dict, **instantiation)
    LOG.warning("%s loaded without its video processor (%s): images and audio only", chosen.__name__, reason)
    return processor


def missing_parts(processor) -> dict[str, str]:
    """The parts of `processor` that were not loaded, with why (`{"video_processor": "needs torchvision"}`)."""
    video = getattr(processor, VIDEO, None) if processor is not None and hasattr(processor, "get_attributes") else None
    return {VIDEO: video.reason} if isinstance(video, VideoProcessorNotLoaded) else {}


def text_tokenizer(processor):
    """The text tokenizer of `processor` (a tokenizer, or a processor holding one), None if it has none."""
    from transformers import PreTrainedTokenizerBase

    if isinstance(processor, PreTrainedTokenizerBase):
        return processor
    inner = getattr(processor, "tokenizer", None)
    return inner if isinstance(inner, PreTrainedTokenizerBase) else None


def save_tokenizer(folder: Path, processor) -> list[str]:
    """The tokenizer's own files (`tokenizer.json`, `tokenizer_config.json`, ...) beside the program, readable by
    transformers 4.x too."""
    tokenizer = text_tokenizer(processor)
    if tokenizer is None:
        return []
    before = set(os.listdir(folder))
    tokenizer.save_pretrained(folder)
    config = folder / "tokenizer_config.json"
    try:
        data = json.loads(config.read_text(encoding="utf-8"))
    except (OSError, ValueError):
        data = None
    if not isinstance(data, dict):
        return sorted(set(os.listdir(folder)) - before)
    changed = False
    if data.get("tokenizer_class") == "TokenizersBackend":
        # transformers 5 names its generic tokenizer.json tokenizer `TokenizersBackend`, a class transformers 4.x
        # (optimum-intel's) cannot load; `PreTrainedTokenizerFast` is the same tokenizer in both.
        data["tokenizer_class"], changed = "PreTrainedTokenizerFast", True
    if isinstance(data.get("extra_special_tokens"), list):
        # transformers 5 writes the additional special tokens as a list `extra_special_tokens`; transformers 4.x
        # (optimum's) reads that key as a dict of named tokens (`.keys()`), and the list as `additional_special_tokens`.
        extra, changed = data.pop("extra_special_tokens"), True
        if extra and "additional_special_tokens" not in data:
            data["additional_special_tokens"] = extra
    if changed:
        config.write_text(json.dumps(data, indent=2, ensure_ascii=False) + "\n", encoding="utf-8")
    return sorted(set(os.listdir(folder)) - before)


def save_flat_preprocessor_config(folder: Path) -> None:
    """The image processor's settings flat in `preprocessor_config.json`, as transformers 4.x wrote them (transformers
    5 nests them in `processor_config.json`): transformers.js' `AutoImageProcessor` and OpenVINO GenAI's
    `ProcessorConfig` read that file. An owner's file already there is kept."""
    settings = read_json_object(folder / "processor_config.json")
    nested, flat = settings.get("image_processor"), folder / "preprocessor_config.json"
    if isinstance(nested, dict) and not flat.is_file():
        # `processor_class` too, as transformers 4.x wrote it: transformers.js' AutoProcessor picks the processor by it
        # (src/models/auto/processing_auto.js), else it makes a bare image processor and the prompt is not tokenized
        named = {"processor_class": settings["processor_class"]} if isinstance(settings.get("processor_class"),
                                                                              str) else {}
        flat.write_text(json.dumps({**nested, **named}, indent=2) + "\n", encoding="utf-8")
