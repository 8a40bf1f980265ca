"""Weights streamed from a checkpoint's safetensors shards into a finished export (hfexport.rebind.checkpoint): the
same bytes as writing a loaded model's weights through the weight map (one path: `weight_map.apply`), without
loading the model; a bfloat16 checkpoint into a float16 ONNX and an OpenVINO generation target, tied embeddings read
under their stored name, derived buffers kept."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest
from hfexport.errors import RebindRefused
from hfexport.files import MANIFEST_FILE
from hfexport.job.run import run_job
from hfexport.rebind.checkpoint import CheckpointTensors
from hfexport.rebind.folder import rebind_copy
from hfexport.rebind.weight_map import refusal
from hfexport.safety.artifacts import check_manifest_file
from hfexport.testing.zoo import build

# Llama-3.2-1B's published config (tied embeddings, llama3 rope scaling, bfloat16 on disk), narrowed to run in seconds
NARROW = {"hidden_size": 64, "intermediate_size": 128, "num_attention_heads": 4, "num_key_value_heads": 2,
          "head_dim": 16}


def _perturbed(source: Path, destination: Path, seed: int, dtype) -> Path:
    """`source`'s checkpoint with every parameter moved by seeded noise (no two equal, none constant: a map that is
    not degenerate), saved at `dtype` beside the same tokenizer and recipe."""
    import torch
    from transformers import AutoModelForCausalLM

    shutil.copytree(source, destination)
    model = AutoModelForCausalLM.from_pretrained(source, dtype=torch.float32)
    generator = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for parameter in model.parameters():
            parameter.add_(torch.randn(parameter.shape, generator=generator) * 0.05)
    for file in destination.glob("*.safetensors"):
        file.unlink()
    model.to(dtype).save_pretrained(destination)
    return destination


@pytest.fixture(scope="module")
def exported(tmp_path_factory):
    import torch

    root = tmp_path_factory.mktemp("stream")
    base = build("llama-3.2-1b", root / "zoo", overrides=NARROW)
    recipe = json.loads((base / "export_config.json").read_text())
    recipe["targets"]["onnx-generation"]["dtype"] = "float16"
    (base / "export_config.json").write_text(json.dumps(recipe))
    first = _perturbed(base, root / "first", 1, torch.bfloat16)
    second = _perturbed(first, root / "second", 2, torch.bfloat16)
    report = run_job(first, root / "out", all_targets=True, verify=False, latency=False, workers=1)
    assert {t.status for t in report.targets.values()} == {"ok"}, report.targets
    return root, second


@pytest.mark.parametrize("target", ["onnx-generation", "openvino-generation"])
def test_streamed_checkpoint_writes_the_bytes_the_loaded_model_writes(exported, target):
    import torch
    from transformers import AutoModelForCausalLM

    root, second = exported
    source = root / "out" / target
    manifest = check_manifest_file(source / MANIFEST_FILE)
    weight_map = manifest["weight_map"]
    model = AutoModelForCausalLM.from_pretrained(second, dtype=torch.float32)  # as a job loads it
    assert refusal(weight_map, weight_map["rebind_key"], model) is None
    loaded = rebind_copy(source, root / f"{target}-loaded", manifest, model)

    with torch.device("meta"):  # the structure alone: the state_dict's keys, no weights
        keys = AutoModelForCausalLM.from_config(model.config).state_dict().keys()
    tensors = CheckpointTensors(second, torch.float32, keys).alias_parts(weight_map)
    assert "lm_head.weight" in tensors and "lm_head.weight" not in tensors.where  # tied: saved once, read by alias
    streamed = rebind_copy(source, root / f"{target}-streamed", manifest, tensors=tensors)
    assert streamed == loaded > 0
    for file in sorted((root / f"{target}-loaded").rglob("*")):
        if file.is_file():
            twin = root / f"{target}-streamed" / file.relative_to(root / f"{target}-loaded")
            assert twin.read_bytes() == file.read_bytes(), file.name
    # every entry read its tensors once (tied and identical names of one part read once each), none held after
    parts = sum(len(part["keys"]) for record in weight_map["tensors"] for part in record["parts"]
                if not tensors.derived(part["keys"]))
    assert tensors.reads == parts
    assert any(tensors.derived(part["keys"]) for record in weight_map["tensors"] for part in record["parts"])  # inv_freq


def test_a_checkpoint_without_a_mapped_weight_is_refused(exported, tmp_path):
    import torch
    from safetensors.torch import load_file, save_file

    root, second = exported
    broken = tmp_path / "broken"
    shutil.copytree(second, broken)
    weights = load_file(str(broken / "model.safetensors"))
    del weights["model.layers.0.mlp.up_proj.weight"]
    save_file(weights, str(broken / "model.safetensors"), metadata={"format": "pt"})
    source = root / "out" / "onnx-generation"
    manifest = check_manifest_file(source / MANIFEST_FILE)
    tensors = CheckpointTensors(broken, torch.float32, weights.keys() | {"model.layers.0.mlp.up_proj.weight"})
    with pytest.raises(RebindRefused, match="maps to model.layers.0.mlp.up_proj.weight, which the model lacks"):
        rebind_copy(source, tmp_path / "out", manifest, tensors=tensors.alias_parts(manifest["weight_map"]))



def _rss_file_kb() -> int:
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith("RssFile:"):
            return int(line.split()[1])
    return 0


def test_a_stored_tensor_read_through_its_mapping_is_handed_back(tmp_path):
    """Issue 45: the weight map and the weight writes read an export's tensors one after another through one mapping
    of its file; each is handed back once read (`stored.release`), so a 4 GB export's pages never all count at once.
    The bytes read the same afterwards (from the file again)."""
    import hashlib
    import os

    from hfexport.rebind.stored import Stored, mapped, release

    size = 16 << 20
    (tmp_path / "data.bin").write_bytes(os.urandom(size))
    view = mapped(tmp_path / "data.bin")
    entry = Stored("t", "data.bin", 4096, size - 8192, "float32", None, view[4096:size - 4096])
    digest = hashlib.sha256(entry.data).hexdigest()  # every page touched
    before = _rss_file_kb()
    release(entry)
    assert before - _rss_file_kb() >= (size - 3 * 8192) // 1024  # its pages left the resident set
    assert hashlib.sha256(entry.data).hexdigest() == digest
    release(Stored("inline", "model.onnx", None, 4, "float32", [1], b"abcd"))  # held in memory: nothing to hand back


@pytest.mark.parametrize("block", [None, 256], ids=["whole", "in-blocks"])
def test_degenerate_checkpoint_tensors_are_found_read_whole_or_in_blocks(tmp_path, monkeypatch, block):
    """`degenerate_keys` over a checkpoint's shards: a large 2-D tensor (a vocabulary's table, over
    `weight_map.BLOCK_BYTES`) is digested and checked for a constant a block of rows at a time, with the answer the
    whole tensor gives: bit-identical untied tensors and a constant one found, distinct ones not."""
    import torch
    from safetensors.torch import save_file

    from hfexport.rebind import weight_map

    if block:
        monkeypatch.setattr(weight_map, "BLOCK_BYTES", block)
    values = torch.randn(64, 32, generator=torch.Generator().manual_seed(0))
    tensors = {"a": values, "b": values.clone(), "c": torch.ones(64, 32), "d": values + 1, "e": torch.randn(8)}
    save_file(tensors, str(tmp_path / "model.safetensors"))
    model = torch.nn.Module()
    for name, tensor in tensors.items():
        model.register_parameter(name, torch.nn.Parameter(tensor.clone()))
    assert weight_map.degenerate_keys(model, tensors=CheckpointTensors(tmp_path)) == ["a", "b", "c"]
