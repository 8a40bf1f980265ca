"""Calibration data for quantized targets: texts from the recipe's source, through the tokenizer like sample inputs.

Sources (a target's `quantization.calibration.source`):
- `sample_inputs`: the recipe's sample texts (one sample per text); a recipe without texts gives its one input batch;
- `texts`: texts written inline in the recipe;
- `repo_file`: a `.txt`/`.jsonl`/`.json`/`.csv` file in the model repo (a local folder, or a Hub repo through
  huggingface_hub at the revision being exported);
- `dataset`: such a file in a Hub dataset repo (`repo`, `revision`, `path`, `field`), downloaded through
  `hfexport.hub.HubRepo` (a missing file is a recipe problem; an unreachable Hub is an error, never "no file").

Files are parsed as data only (JSON, CSV, lines); nothing downloaded is executed. Texts are grouped in batches of the
sample inputs' batch size and tokenized with the same function as sample inputs, so a calibration batch has the keys
and dtypes the export was traced with; a target whose sequence axis is static gets batches padded to the traced
length. For generation targets the batches are generate kwargs; `quantization.attach` captures each component's own
forward inputs from them.
"""

from __future__ import annotations

import csv
import io
import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from hfexport.errors import PlanError, register_secret
from hfexport.hub import HubRepo
from hfexport.inputs import text_inputs, tokenizer_of
from hfexport.quantization.spec import FILE_SUFFIXES, sample_texts

DEFAULT_NUM_SAMPLES = 128
DEFAULT_MAX_LENGTH = 512
MAX_FILE_BYTES = 64 << 20


@dataclass
class Calibration:
    """Calibration samples at model level (forward kwargs, or generate kwargs for generation targets)."""

    source: str
    origin: str | None
    count: int  # texts (or input batches) read
    batches: list[dict] = field(default_factory=list)
    batch_size: int = 1
    max_length: int | None = None
    padding: str = "longest"

    def describe(self) -> dict:
        return {
            "source": self.source,
            "origin": self.origin,
            "samples": self.count,
            "batch_size": self.batch_size,
            "batches": len(self.batches),
            "max_length": self.max_length,
            "padding": self.padding,
        }


def _base(target_name: str) -> str:
    return f"targets.{target_name}.quantization.calibration"


# ── Reading texts ────────────────────────────────────────────────────────────


def _texts_from_bytes(data: bytes, path: str, field_name: str | None, limit: int, where: str) -> list[str]:
    """Samples from a file's bytes: lines of a .txt, `field` of each .jsonl line / .json item / .csv row."""
    try:
        text = data.decode("utf-8-sig")
    except UnicodeDecodeError as error:
        raise PlanError(f"{where}.path: {path} is not UTF-8 text ({error.reason} at byte {error.start})") from None
    suffix = Path(path).suffix.lower()
    texts: list[str] = []

    def take(value: Any, position: str):
        if isinstance(value, dict):
            if field_name not in value:
                keys = ", ".join(sorted(map(str, value))[:20])
                raise PlanError(f"{where}.field: {path} {position} has no field {field_name!r}; its fields: {keys}")
            value = value[field_name]
        elif field_name is not None and suffix != ".csv":
            raise PlanError(f"{where}.field: {path} {position} is {type(value).__name__}, not an object with {field_name!r}")
        if not isinstance(value, str):
            raise PlanError(f"{where}.field: {path} {position}: {field_name!r} is {type(value).__name__}, not text")
        if value.strip():
            texts.append(value)

    if suffix == ".txt":
        for line in text.splitlines():
            if line.strip():
                texts.append(line)
            if len(texts) >= limit:
                break
    elif suffix == ".jsonl":
        for number, line in enumerate(text.splitlines(), 1):
            if not line.strip():
                continue
            try:
                take(json.loads(line), f"line {number}")
            except json.JSONDecodeError as error:
                raise PlanError(f"{where}.path: {path} line {number} is not JSON ({error.msg})") from None
            if len(texts) >= limit:
                break
    elif suffix == ".json":
        try:
            document = json.loads(text)
        except (json.JSONDecodeError, RecursionError) as error:
            raise PlanError(f"{where}.path: {path} is not JSON ({getattr(error, 'msg', 'nested too deeply')})") from None
        if not isinstance(document, list):
            raise PlanError(f"{where}.path: {path} must hold a JSON array of strings or objects")
        for index, item in enumerate(document):
            take(item, f"item {index}")
            if len(texts) >= limit:
                break
    elif suffix == ".csv":
        reader = csv.DictReader(io.StringIO(text))
        if field_name not in (reader.fieldnames or []):
            columns = ", ".join(reader.fieldnames or []) or "(none)"
            raise PlanError(f"{where}.field: {path} has no column {field_name!r}; its columns: {columns}")
        for number, row in enumerate(reader, 2):
            take(row.get(field_name) or "", f"row {number}")
            if len(texts) >= limit:
                break
    else:
        raise PlanError(f"{where}.path: {path}: expected one of {', '.join(FILE_SUFFIXES)}")
    if not texts:
        raise PlanError(f"{where}: {path} holds no calibration text")
    return texts


def _read_local(folder: Path, relative: str, where: str) -> bytes:
    root = folder.resolve()
    path = (root / relative).resolve()
    if not path.is_relative_to(root):
        raise PlanError(f"{where}.path: {relative} points outside the model folder")
    if not path.is_file():
        raise PlanError(f"{where}.path: no file {relative} in {folder}")
    size = path.stat().st_size
    if size > MAX_FILE_BYTES:
        raise PlanError(f"{where}.path: {relative} is {size} bytes; calibration files are read up to {MAX_FILE_BYTES}")
    return path.read_bytes()


def _download(repo_id: str, filename: str, repo_type: str, revision: str | None, token: str | None, where: str) -> bytes:
    """One file of a Hub repo (hfexport.hub): absent is a recipe problem; the Hub failing is one readable line."""
    kind = "dataset repo" if repo_type == "dataset" else "repo"
    path = HubRepo(repo_id, revision, token, repo_type=repo_type, where=where).download(filename)
    if path is None:
        raise PlanError(f"{where}.path: no file {filename} in the {kind} {repo_id}")
    size = path.stat().st_size
    if size > MAX_FILE_BYTES:
        raise PlanError(f"{where}.path: {filename} is {size} bytes; calibration files are read up to {MAX_FILE_BYTES}")
    return path.read_bytes()


def load_texts(section: dict, recipe, target_name: str, source: str | Path | None = None,
               revision: str | None = None, token: str | None = None,
               plan_task: str | None = None) -> tuple[list[str] | None, str | None]:
    """The calibration texts of a `calibration` section and where they came from (`None` texts: the sample batch)."""
    register_secret(token)
    where = _base(target_name)
    kind = section["source"]
    limit = section.get("num_samples", DEFAULT_NUM_SAMPLES)
    field_name = section.get("field")
    if kind == "sample_inputs":
        texts = sample_texts(recipe.sample_inputs, plan_task)
        return (list(texts[:limit]) if texts else None), "recipe sample_inputs"
    if kind == "texts":
        return list(section["texts"][:limit]), "recipe (inline texts)"
    path = section["path"]
    if kind == "repo_file":
        if source is None:
            raise PlanError(f"{where}: source repo_file needs the model's folder or repo id (the model has no name_or_path)")
        folder = Path(str(source))
        if folder.is_dir():
            data = _read_local(folder, path, where)
            origin = f"{folder}/{path}"
        else:
            data = _download(str(source), path, "model", revision, token, where)
            origin = f"{source}@{revision}/{path}" if revision else f"{source}/{path}"
    else:  # dataset
        repo, dataset_revision = section["repo"], section.get("revision")
        data = _download(repo, path, "dataset", dataset_revision, token, where)
        origin = f"datasets/{repo}@{dataset_revision or 'main'}/{path}"
    if field_name:
        origin += f" [{field_name}]"
    return _texts_from_bytes(data, path, field_name, limit, where), origin


# ── Tokenizing ───────────────────────────────────────────────────────────────


def _axis_is_dynamic(config, input_name: str, axis: int) -> bool:
    """Whether the engine config leaves `input_name`'s `axis` dynamic (explicit shapes, or `dynamic=True`)."""
    shapes = getattr(config, "dynamic_shapes", None)
    if shapes is None:
        return bool(getattr(config, "dynamic", False))
    spec = shapes.get(input_name)
    return isinstance(spec, dict) and axis in spec


def _axis_max(config, input_name: str, axis: int) -> int | None:
    shapes = getattr(config, "dynamic_shapes", None) or {}
    spec = shapes.get(input_name)
    dim = spec.get(axis) if isinstance(spec, dict) else None
    high = getattr(dim, "max", None)
    return int(high) if isinstance(high, int) and high < (1 << 30) else None


def build_calibration(section: dict, plan, processor, model_config, source=None, revision=None,
                      token=None) -> Calibration:
    """Model-level calibration batches for `plan` (forward kwargs, or generate kwargs for generation targets)."""
    import torch


    target_name = plan.target.name
    where = _base(target_name)
    texts, origin = load_texts(section, plan.recipe, target_name, source, revision, token, plan.task)
    inputs = plan.inputs
    if texts is None:  # sample inputs without texts (images, audio, explicit tensors): the one input batch
        return Calibration(section["source"], origin, 1, [dict(inputs)], batch_size=_batch_of(inputs), padding="sample")

    tokenizer = tokenizer_of(processor)
    if tokenizer is None or not callable(tokenizer):
        raise PlanError(f"{where}: calibration texts go through the model's tokenizer, and this model has none")
    text_keys = [key for key, value in inputs.items() if isinstance(value, torch.Tensor)]
    if "input_ids" not in inputs:
        raise PlanError(f"{where}: calibration texts make input_ids, but this target is traced with {', '.join(inputs)}")

    reference = next(
        (component.config for component in plan.components.values() if "input_ids" in component.input_shapes),
        next(iter(plan.components.values())).config,
    )
    batch = _batch_of(inputs)
    length = int(inputs["input_ids"].shape[1])
    fixed = not _axis_is_dynamic(reference, "input_ids", 1)  # a static sequence axis: pad to the traced length
    max_length = section.get("max_length") or plan.recipe.sample_inputs.get("max_length") or _axis_max(
        reference, "input_ids", 1
    ) or DEFAULT_MAX_LENGTH
    if plan.generation_config is not None:  # a static cache holds the prompt and the two captured new tokens
        cache_len = plan.target.generation.get("max_cache_len")
        if cache_len:
            max_length = min(max_length, max(int(cache_len) - 2, 2))
    padded = texts + texts[: (-len(texts)) % batch]  # a short last batch is filled from the start
    batches = []
    for start in range(0, len(padded), batch):
        chunk = padded[start : start + batch]
        if fixed:
            if getattr(tokenizer, "pad_token", None) is None and getattr(tokenizer, "eos_token", None) is not None:
                tokenizer.pad_token = tokenizer.eos_token
            encoded = dict(tokenizer(chunk, return_tensors="pt", padding="max_length", truncation=True, max_length=length))
        else:
            encoded = text_inputs(chunk, processor, model_config, max_length)
        sample = {}
        for key, value in inputs.items():
            if key in encoded:
                sample[key] = encoded[key].to(value.dtype) if isinstance(value, torch.Tensor) else encoded[key]
            elif isinstance(value, torch.Tensor):
                raise PlanError(
                    f"{where}: calibration texts give only the tokenizer's inputs, and this target is also traced "
                    f"with {key!r} (traced inputs: {', '.join(text_keys)})"
                )
            else:
                sample[key] = value  # flags such as use_cache=False
        batches.append(sample)
    return Calibration(section["source"], origin, len(texts), batches, batch_size=batch,
                       max_length=length if fixed else max_length, padding="max_length" if fixed else "longest")


def _batch_of(inputs: dict) -> int:
    import torch

    for value in inputs.values():
        if isinstance(value, torch.Tensor) and value.dim() > 0:
            return int(value.shape[0])
    return 1
