"""Sample files: a person's own image or audio clip as the sample input of a job, instead of synthesized ones.

A recipe's sample images and clips are synthesized (`hfexport.inputs`). A job may be given one file per kind
(`run_job(sample_files={"image": path})`, `hfexport export --sample-image/--sample-audio`, the Space's upload): it
then stands in every image (clip) of the recipe's sample inputs, so the traced sample, the parity probes (resized
from the sample) and the generation check are all built from it, through the model's own processor.

A file is checked before anything is loaded: its size, that its content is of its kind (not its name), and that it
decodes whole. Images are decoded by Pillow (transformers' own image dependency); audio is WAV (PCM, 8 to 32 bits)
decoded by the standard library's `wave`, so no audio package is needed (float WAV, MP3, FLAC are refused with the
format to convert to). A clip at another rate than the feature extractor's is resampled (`SampleFile.audio`).
What the report records is the file's name, never its folder: a path on the uploader's machine says nothing to the
readers of a pull request.
"""

from __future__ import annotations

import hashlib
import re
import wave
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from hfexport.errors import SampleError
from hfexport.files import human_bytes

KINDS = ("image", "audio")
# Where a kind sits in a recipe's `sample_inputs`.
SPEC_KEYS = {"image": "images", "audio": "audio"}
MAX_BYTES = {"image": 20_000_000, "audio": 25_000_000}
MAX_IMAGE_PIXELS = 40_000_000  # checked from the header, before decoding (a decompression bomb is refused unread)
MAX_AUDIO_SECONDS = 60.0
IMAGE_FORMATS = ("PNG", "JPEG", "WEBP", "GIF", "BMP", "TIFF")


def display_name(path: str | Path) -> str:
    """The file's name as reports show it: no folder, no control characters or backticks, at most 100 characters."""
    name = re.sub(r"[\x00-\x1f\x7f`]", "", Path(str(path)).name).strip()
    if name in ("", ".", ".."):
        name = "sample"
    return name if len(name) <= 100 else name[:48] + "…" + name[-48:]


@dataclass
class SampleFile:
    """One checked, decoded sample file. `record()` is what the report keeps of it."""

    kind: str
    name: str
    bytes: int
    sha256: str
    width: int | None = None
    height: int | None = None
    seconds: float | None = None
    sampling_rate: int | None = None
    channels: int | None = None
    data: Any = field(default=None, repr=False)  # an RGB PIL image, or float32 mono samples at `sampling_rate`

    def record(self) -> dict:
        keys = ("width", "height") if self.kind == "image" else ("seconds", "sampling_rate", "channels")
        return {"kind": self.kind, "name": self.name, "bytes": self.bytes, "sha256": self.sha256,
                **{key: getattr(self, key) for key in keys}}

    def describe(self) -> str:
        return describe(self.record())

    def image(self):
        """The image, RGB (a PIL image, which every image processor takes)."""
        return self.data

    def audio(self, rate: int):
        """The clip as float32 mono samples at `rate` Hz (resampled when the file's rate differs)."""
        return resample(self.data, self.sampling_rate, rate)


def describe(record: dict) -> str:
    """`cat.png` · 640 × 480 px · 12.3 KB; `speech.wav` · 1.50 s · 16000 Hz · mono · 48.0 KB."""
    if record["kind"] == "image":
        what = f"{record['width']} × {record['height']} px"
    else:
        channels = {1: "mono", 2: "stereo"}.get(record["channels"], f"{record['channels']} channels")
        what = f"{record['seconds']:.2f} s · {record['sampling_rate']} Hz · {channels}"
    return f"`{record['name']}` · {what} · {human_bytes(record['bytes'])}"


def read_sample(path: str | Path, kind: str, name: str | None = None) -> SampleFile:
    """Check and decode the sample file at `path` as `kind` ("image" or "audio"); `name`: what messages and the report
    call it (default: the file's name). Raises SampleError (one line naming the file) for anything unusable."""
    if kind not in KINDS:
        raise SampleError(f"unknown sample kind {kind!r}: expected one of {', '.join(KINDS)}")
    path = Path(path)
    name = display_name(name or path)
    label = f"sample {kind} {name}"
    if not path.is_file():
        raise SampleError(f"{label}: no such file")
    size = path.stat().st_size
    if size == 0:
        raise SampleError(f"{label}: the file is empty")
    if size > MAX_BYTES[kind]:
        raise SampleError(f"{label}: {human_bytes(size)} is over the {human_bytes(MAX_BYTES[kind])} limit for a "
                          f"sample {kind}")
    content = path.read_bytes()
    sample = SampleFile(kind, name, size, hashlib.sha256(content).hexdigest())
    if kind == "image":
        _decode_image(path, sample, label)
    else:
        _decode_audio(path, content, sample, label)
    return sample


def read_samples(files: dict[str, str | Path] | None) -> dict[str, SampleFile]:
    """`{kind: path}` -> `{kind: SampleFile}`, each checked (`read_sample`)."""
    return {kind: read_sample(path, kind) for kind, path in (files or {}).items()}


def _decode_image(path: Path, sample: SampleFile, label: str) -> None:
    from PIL import Image, UnidentifiedImageError

    try:
        with Image.open(path) as image:
            if image.format not in IMAGE_FORMATS:
                raise SampleError(f"{label}: a {image.format} image; expected one of {', '.join(IMAGE_FORMATS)}")
            width, height = image.size
            if width * height > MAX_IMAGE_PIXELS:
                raise SampleError(f"{label}: {width} × {height} pixels is over the {MAX_IMAGE_PIXELS:,} pixel limit "
                                  "for a sample image")
            image.load()  # the whole file: a truncated or corrupt one fails here, not in the processor
            sample.data = image.convert("RGB")
    except SampleError:
        raise
    except UnidentifiedImageError:
        raise SampleError(f"{label}: not an image (expected {', '.join(IMAGE_FORMATS)})") from None
    except (OSError, ValueError, SyntaxError, Image.DecompressionBombError) as error:
        raise SampleError(f"{label}: the image cannot be decoded ({_first_line(error)})") from None
    sample.width, sample.height = width, height


def _decode_audio(path: Path, content: bytes, sample: SampleFile, label: str) -> None:
    import numpy as np

    if content[:4] != b"RIFF" or content[8:12] != b"WAVE":
        raise SampleError(f"{label}: not a WAV file (expected a RIFF/WAVE file, PCM 8 to 32 bits; convert other "
                          "formats to WAV first)")
    try:
        with wave.open(str(path), "rb") as clip:
            channels, width, rate, frames = (clip.getnchannels(), clip.getsampwidth(), clip.getframerate(),
                                             clip.getnframes())
            if rate <= 0 or channels <= 0:
                raise SampleError(f"{label}: the WAV header says {rate} Hz, {channels} channels")
            if frames / rate > MAX_AUDIO_SECONDS:
                raise SampleError(f"{label}: {frames / rate:.1f} s is over the {MAX_AUDIO_SECONDS:.0f} s limit for a "
                                  "sample clip")
            raw = clip.readframes(frames)
    except SampleError:
        raise
    except (wave.Error, EOFError, OSError) as error:
        message = _first_line(error)
        if "unknown format: 3" in message:
            message = "32-bit float WAV; save it as 16-bit PCM WAV"
        raise SampleError(f"{label}: the WAV file cannot be decoded ({message})") from None
    count = len(raw) // (width * channels)
    if count == 0:
        raise SampleError(f"{label}: the WAV file holds no audio frames")
    raw = raw[: count * width * channels]
    if width == 1:
        values = (np.frombuffer(raw, dtype=np.uint8).astype(np.float32) - 128) / 128
    elif width == 3:  # 24-bit little-endian: widened to int32 (the low byte zero), then scaled as 32-bit
        triples = np.frombuffer(raw, dtype=np.uint8).reshape(-1, 3)
        values = (np.pad(triples, ((0, 0), (1, 0))).copy().view("<i4")[:, 0].astype(np.float32)) / 2**31
    else:
        values = np.frombuffer(raw, dtype=f"<i{width}").astype(np.float32) / 2 ** (8 * width - 1)
    samples = values.reshape(count, channels).mean(axis=1).astype(np.float32)
    sample.data, sample.seconds, sample.sampling_rate, sample.channels = samples, round(count / rate, 3), rate, channels


def resample(samples, rate: int, target: int):
    """`samples` (float32, mono) from `rate` to `target` Hz: a windowed-sinc low-pass below the lower Nyquist
    frequency, then linear interpolation onto the new times. Enough for a probe input, which the exported and the eager
    model both see as the processor makes it; not a mastering-grade resampler."""
    import numpy as np

    if rate == target:
        return samples
    if target < rate:
        cutoff = 0.5 * target / rate  # cycles per input sample
        taps = np.arange(-32, 33)
        kernel = 2 * cutoff * np.sinc(2 * cutoff * taps) * np.hamming(taps.size)
        samples = np.convolve(samples, kernel / kernel.sum(), mode="same")
    count = max(1, round(samples.size * target / rate))
    times = np.arange(count) * (rate / target)
    return np.interp(times, np.arange(samples.size), samples).astype(np.float32)


def _first_line(error: BaseException) -> str:
    text = str(error).strip().splitlines()
    return text[0] if text else type(error).__name__


# ── What a processor takes ───────────────────────────────────────────────────


def _kinds_of(section: dict) -> set[str]:
    if "video_processor_type" in section:
        return set()
    if "sampling_rate" in section:  # a feature extractor of audio (Whisper's, Wav2Vec2's, Qwen3-ASR's...)
        return {"audio"}
    if "image_processor_type" in section or "image_mean" in section:  # an image processor (older: "feature extractor")
        return {"image"}
    return set()


def processor_kinds(documents: list[dict | None]) -> list[str]:
    """The sample kinds a model's processor takes, from its saved processor files (`preprocessor_config.json`,
    `processor_config.json`, as dicts): what transformers' AutoProcessor builds from them, read without loading it.
    A processor's file is one section, or (a multimodal processor) holds one per sub-processor."""
    found: set[str] = set()
    for document in documents:
        if not isinstance(document, dict):
            continue
        found |= _kinds_of(document)
        for value in document.values():
            if isinstance(value, dict):
                found |= _kinds_of(value)
    return [kind for kind in KINDS if kind in found]
