"""Published configs of the checkpoints people export, built in code with random weights (issue 43's config zoo).

Each entry is a model's own `config.json` as its repository publishes it (the fields as they are there, the source
named), so the shapes real checkpoints have are exercised: 32 query heads over 8 key-value heads, a head size that
is not hidden/heads, rope scaling, tied heads, the published dtype. `build` cuts the depth (2 layers) and the
vocabulary (a tokenizer trained here, `hfexport.testing.models.bpe_tokenizer`; the special token ids are the
tokenizer's), seeds the weights, saves them in the published dtype and writes a recipe of the bundled examples' kind
(examples/tiny-llama: one ONNX and one OpenVINO generation target, one graph each). No download.

    from hfexport.testing.zoo import build
    folder = build("llama-3.2-1b", tmp_path / "llama")
"""

from __future__ import annotations

import json
import shutil
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from hfexport.testing.models import DIMS, SEED, TEXTS, bpe_tokenizer

#: The generation targets a zoo model's recipe has (examples/tiny-llama's, by name).
TARGETS = ("onnx-generation", "openvino-generation")
#: Fields of a published config that name tokens of its own vocabulary: replaced by the zoo tokenizer's.
_TOKEN_FIELDS = ("bos_token_id", "eos_token_id", "pad_token_id")


@dataclass(frozen=True)
class ZooModel:
    """One published config: its repository, where the fields were read, and the fields as published."""

    name: str
    repo: str
    source: str  # where the fields below were read (the model repository's config.json, or a copy of it)
    config: dict[str, Any] = field(repr=False)


ZOO = {model.name: model for model in (
    ZooModel(
        "llama-3.2-1b", "meta-llama/Llama-3.2-1B",
        "config.json of meta-llama/Llama-3.2-1B-Instruct at 4e20de36 (as kevinstephano/thunder_model_blocks "
        "hf_llama/llama_config.py copies it)",
        {
            "architectures": ["LlamaForCausalLM"], "attention_bias": False, "attention_dropout": 0.0,
            "bos_token_id": 128000, "eos_token_id": 128001, "head_dim": 64, "hidden_act": "silu",
            "hidden_size": 2048, "initializer_range": 0.02, "intermediate_size": 8192,
            "max_position_embeddings": 131072, "mlp_bias": False, "model_type": "llama", "num_attention_heads": 32,
            "num_hidden_layers": 16, "num_key_value_heads": 8, "pretraining_tp": 1, "rms_norm_eps": 1e-05,
            "rope_scaling": {"factor": 32.0, "high_freq_factor": 4.0, "low_freq_factor": 1.0,
                             "original_max_position_embeddings": 8192, "rope_type": "llama3"},
            "rope_theta": 500000.0, "tie_word_embeddings": True, "torch_dtype": "bfloat16",
            "transformers_version": "4.45.0.dev0", "use_cache": True, "vocab_size": 128256,
        },
    ),
    ZooModel(
        "llama-3.1-8b", "meta-llama/Llama-3.1-8B",
        "config.json of meta-llama/Llama-3.1-8B (as NX-AI's xlstm benchmarks copy it: llama_3_1_config)",
        {
            "architectures": ["LlamaForCausalLM"], "attention_bias": False, "attention_dropout": 0.0,
            "bos_token_id": 128000, "eos_token_id": 128001, "hidden_act": "silu", "hidden_size": 4096,
            "initializer_range": 0.02, "intermediate_size": 14336, "max_position_embeddings": 131072,
            "mlp_bias": False, "model_type": "llama", "num_attention_heads": 32, "num_hidden_layers": 32,
            "num_key_value_heads": 8, "pretraining_tp": 1, "rms_norm_eps": 1e-05,
            "rope_scaling": {"factor": 8.0, "low_freq_factor": 1.0, "high_freq_factor": 4.0,
                             "original_max_position_embeddings": 8192, "rope_type": "llama3"},
            "rope_theta": 500000.0, "tie_word_embeddings": False, "torch_dtype": "bfloat16",
            "transformers_version": "4.43.0.dev0", "use_cache": True, "vocab_size": 128256,
        },
    ),
    ZooModel(
        "ministral-8b", "mistralai/Ministral-8B-Instruct-2410",
        "config.json of mistralai/Ministral-8B-Instruct-2410 (as NX-AI's xlstm benchmarks copy it: "
        "ministral8b_config)",
        {
            "architectures": ["MistralForCausalLM"], "attention_dropout": 0.0, "bos_token_id": 1, "eos_token_id": 2,
            "head_dim": 128, "hidden_act": "silu", "hidden_size": 4096, "initializer_range": 0.02,
            "intermediate_size": 12288, "max_position_embeddings": 32768, "model_type": "mistral",
            "num_attention_heads": 32, "num_hidden_layers": 36, "num_key_value_heads": 8, "rms_norm_eps": 1e-05,
            "rope_theta": 100000000.0, "sliding_window": 32768, "tie_word_embeddings": False,
            "torch_dtype": "bfloat16", "transformers_version": "4.46.0.dev0", "use_cache": True,
            "vocab_size": 131072,
        },
    ),
    ZooModel(
        "qwen2.5-0.5b", "Qwen/Qwen2.5-0.5B",
        "huggingface.co/Qwen/Qwen2.5-0.5B/raw/main/config.json, as a published model-config digest quotes it",
        {
            "architectures": ["Qwen2ForCausalLM"], "attention_dropout": 0.0, "bos_token_id": 151643,
            "eos_token_id": 151643, "hidden_act": "silu", "hidden_size": 896, "initializer_range": 0.02,
            "intermediate_size": 4864, "max_position_embeddings": 32768, "max_window_layers": 24,
            "model_type": "qwen2", "num_attention_heads": 14, "num_hidden_layers": 24, "num_key_value_heads": 2,
            "rms_norm_eps": 1e-06, "rope_theta": 1000000.0, "sliding_window": 32768, "tie_word_embeddings": True,
            "torch_dtype": "bfloat16", "transformers_version": "4.40.1", "use_cache": True, "use_mrope": False,
            "use_sliding_window": False, "vocab_size": 151936,
        },
    ),
    ZooModel(
        "qwen3-0.6b", "Qwen/Qwen3-0.6B",
        "huggingface.co/Qwen/Qwen3-0.6B/raw/main/config.json, as fetched with curl in a published guide",
        {
            "architectures": ["Qwen3ForCausalLM"], "attention_bias": False, "attention_dropout": 0.0,
            "bos_token_id": 151643, "eos_token_id": 151645, "head_dim": 128, "hidden_act": "silu",
            "hidden_size": 1024, "initializer_range": 0.02, "intermediate_size": 3072,
            "max_position_embeddings": 40960, "max_window_layers": 28, "model_type": "qwen3",
            "num_attention_heads": 16, "num_hidden_layers": 28, "num_key_value_heads": 8, "rms_norm_eps": 1e-06,
            "rope_scaling": None, "rope_theta": 1000000, "sliding_window": None, "tie_word_embeddings": True,
            "torch_dtype": "bfloat16", "transformers_version": "4.51.0", "use_cache": True,
            "use_sliding_window": False, "vocab_size": 151936,
        },
    ),
    ZooModel(
        "smollm2-135m", "HuggingFaceTB/SmolLM2-135M",
        "huggingface.co/HuggingFaceTB/SmolLM2-135M/raw/main/config.json, quoted verbatim in a published study",
        {
            "architectures": ["LlamaForCausalLM"], "attention_bias": False, "attention_dropout": 0.0,
            "bos_token_id": 0, "eos_token_id": 0, "hidden_act": "silu", "hidden_size": 576,
            "initializer_range": 0.041666666666666664, "intermediate_size": 1536, "is_llama_config": True,
            "max_position_embeddings": 8192, "model_type": "llama", "num_attention_heads": 9,
            "num_hidden_layers": 30, "num_key_value_heads": 3, "pretraining_tp": 1, "rms_norm_eps": 1e-05,
            "rope_interleaved": False, "rope_scaling": None, "rope_theta": 100000, "tie_word_embeddings": True,
            "torch_dtype": "bfloat16", "transformers_version": "4.40.1", "use_cache": True, "vocab_size": 49152,
        },
    ),
)}


def recipe(texts: list[str] | None = None) -> dict:
    """examples/tiny-llama's kind of recipe: the ONNX and OpenVINO generation targets, one graph each, greedy
    generation parity over 8 new tokens."""
    targets = {name: {"export_format": name.split("-")[0], "mode": "generation", "options": {"dynamic": True},
                      "generation": {"single_graph": True}, "parity": {"generate": {"max_new_tokens": 8}}}
               for name in TARGETS}
    return {"recipe_version": 1, "task": "text-generation", "default_target": TARGETS[0],
            "dims": {"batch": DIMS["batch"], "seq": {"min": 2, "max": 128}},
            "sample_inputs": {"text": list(texts or TEXTS)}, "targets": targets}


def build(name: str, folder: str | Path, *, layers: int = 2, overrides: dict | None = None,
          texts: list[str] | None = None, dtype: str | None = None) -> Path:
    """Write zoo model `name` to `folder` (replaced if it exists): its published config with `layers` layers, the
    zoo tokenizer's vocabulary and special tokens and `overrides` (fields a test shrinks, said where it does),
    random seeded weights saved in the published dtype (or `dtype`), the tokenizer, a greedy generation config and
    `recipe(texts)`. Returns the folder."""
    import torch
    from transformers import AutoConfig, AutoModelForCausalLM, GenerationConfig

    model = ZOO[name]
    folder = Path(folder)
    if folder.exists():
        shutil.rmtree(folder)
    folder.mkdir(parents=True)
    tokenizer = bpe_tokenizer()
    fields = {key: value for key, value in model.config.items() if key not in ("transformers_version",)}
    special = {"bos_token_id": tokenizer.bos_token_id, "eos_token_id": tokenizer.eos_token_id,
               "pad_token_id": tokenizer.pad_token_id}
    fields.update({key: special[key] for key in _TOKEN_FIELDS}, vocab_size=len(tokenizer), num_hidden_layers=layers)
    if isinstance(fields.get("layer_types"), list):
        fields["layer_types"] = fields["layer_types"][:layers]
    fields.update(overrides or {})
    stored = dtype or fields.get("dtype") or fields.get("torch_dtype") or "float32"
    config = AutoConfig.for_model(fields.pop("model_type"), **fields)
    torch.manual_seed(SEED)
    network = AutoModelForCausalLM.from_config(config).eval().to(getattr(torch, stored))
    network.generation_config = GenerationConfig(**special, do_sample=False)
    network.save_pretrained(folder)
    tokenizer.save_pretrained(folder)
    (folder / "export_config.json").write_text(json.dumps(recipe(texts), indent=2) + "\n", encoding="utf-8")
    return folder
