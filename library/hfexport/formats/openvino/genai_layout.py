"""The files the LLM runtimes read beside a generation export, written when it is saved: one contract, not two.

OpenVINO GenAI's `LLMPipeline(folder, "CPU")` and optimum-intel's `OVModelForCausalLM` open `openvino_model.xml/.bin`
as one stateful graph (inputs `input_ids`, `attention_mask`, `position_ids`, `beam_idx`; output `logits`; the KV cache
in ReadValue/Assign states that start empty), `config.json`, `generation_config.json`, the tokenizer's files, and
(LLMPipeline) `openvino_tokenizer.xml` / `openvino_detokenizer.xml`, the tokenizer as OpenVINO models made by
openvino-tokenizers. A decoder-only OpenVINO generation target exported as one decode graph (`single_graph`, the
default there: `hfexport.plan`) with the engine's stateful transformation (which adds `beam_idx`) is that graph: it
only needs optimum-intel's file name and the tokenizer beside it, and hfexport's own loader reads the same files (the
manifest names the program file). Targets saved before this keep `openvino_decode.xml`, named by their manifest.

`finish(folder, tokenizer)` is called by `ExportedModel.save_pretrained` after the engine wrote the programs.
"""

from __future__ import annotations

import json
import logging
import os
from pathlib import Path

from hfexport.files import MANIFEST_FILE, read_json_object
from hfexport.processors import save_tokenizer, text_tokenizer

OPENVINO_MODEL = "openvino_model.xml"  # optimum-intel's OV_XML_FILE_NAME, LLMPipeline's model file
OPENVINO_TOKENIZER = "openvino_tokenizer.xml"  # optimum-intel's OV_TOKENIZER_NAME, LLMPipeline's tokenizer
OPENVINO_DETOKENIZER = "openvino_detokenizer.xml"
DECODE = "decode"

log = logging.getLogger(__name__)


def read_manifest(folder: Path) -> dict | None:
    """A saved export's manifest (`export.json`), None where it is not one with components."""
    manifest = read_json_object(folder / MANIFEST_FILE)
    return manifest if isinstance(manifest.get("components"), dict) else None


def is_openvino_llm(manifest: dict) -> bool:
    """One stateful `decode` graph over input_ids and a KV cache: the graph optimum-intel and OpenVINO GenAI run."""
    components = manifest.get("components") or {}
    if manifest.get("export_format") != "openvino" or list(components) != [DECODE]:
        return False
    metadata = components[DECODE].get("metadata") or {}
    kwargs = metadata.get("kwargs") or {}
    return bool((metadata.get("export_config") or {}).get("stateful")) and "input_ids" in kwargs \
        and "past_key_values" in kwargs


def finish(folder: str | Path, tokenizer=None) -> list[str]:
    """Lay out a saved export in its runtimes' contract (see the module docstring); the names of the files written
    or renamed. A folder that is no decoder-only generation export is left as it is."""
    folder = Path(folder)
    manifest = read_manifest(folder)
    if manifest is None or not is_openvino_llm(manifest):
        return []
    written = [OPENVINO_MODEL] if rename_component(folder, manifest, DECODE, OPENVINO_MODEL) else []
    written += save_tokenizer(folder, tokenizer)
    written += save_openvino_tokenizer(folder, tokenizer)
    return written


def rename_component(folder: Path, manifest: dict, component: str, file: str) -> bool:
    """Move `component`'s program (`.xml` + `.bin`) to `file` and record that in the manifest; False where it is
    there already."""
    entry = manifest["components"][component]
    if entry.get("file") == file:
        return False
    old = folder / entry["file"]
    os.replace(old.with_suffix(".bin"), (folder / file).with_suffix(".bin"))
    os.replace(old, folder / file)
    entry["file"] = file
    (folder / MANIFEST_FILE).write_text(json.dumps(manifest, indent=2) + "\n", encoding="utf-8")
    return True


def save_openvino_tokenizer(folder: Path, processor) -> list[str]:
    """`openvino_tokenizer.xml` / `openvino_detokenizer.xml` made by openvino-tokenizers as optimum-intel makes them
    for a text-generation export (left padding, with the detokenizer); none where openvino-tokenizers is not installed
    or cannot convert this tokenizer (LLMPipeline then needs token ids)."""
    import copy

    tokenizer = text_tokenizer(processor)
    if tokenizer is None:
        return []
    try:
        import openvino as ov
        from openvino_tokenizers import convert_tokenizer
    except ImportError:
        log.warning("openvino-tokenizers is not installed: no %s beside %s", OPENVINO_TOKENIZER, folder)
        return []
    tokenizer = copy.deepcopy(tokenizer)
    tokenizer.padding_side = tokenizer.truncation_side = "left"
    try:
        converted = convert_tokenizer(tokenizer, with_detokenizer=True)
    except Exception as error:  # noqa: BLE001 - a tokenizer openvino-tokenizers does not convert: token ids only
        log.warning("openvino-tokenizers cannot convert this tokenizer (%s): no %s", error, OPENVINO_TOKENIZER)
        return []
    converted = converted if isinstance(converted, tuple) else (converted,)
    written = []
    for model, name in zip(converted, (OPENVINO_TOKENIZER, OPENVINO_DETOKENIZER), strict=False):
        ov.save_model(model, str(folder / name))
        written.append(name)
    return written
