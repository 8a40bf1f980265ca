"""Published configs of the checkpoints people export, built in code with random weights (issue 43's config zoo).

Each entry is a model's own `config.json` as its repository publishes it (the fields as they are there, the source
named beside it), so the shapes real checkpoints have are exercised: 32 query heads over 8 key-value heads, a head
size that is not hidden/heads, rope scaling, partial rotary, sliding-window and global layers, soft-capping, q/k
norms, MoE blocks, tied heads, the published dtype. `build` cuts the depth (2 layers: the first layer's kind and the
first of another kind where the layers differ, so a sliding and a global layer both stay), the vocabulary (a
tokenizer trained here, `hfexport.testing.models`; the special token ids are the tokenizer's), seeds the weights,
saves them in the published dtype and writes a recipe with one target per format (`<format>-<mode>`, as the
matrix's tiny models have). No download.

`fast=True` (the default suite's slice) also narrows what no cache or attention shape depends on: the MLP (and MoE
experts) and the number of query heads, where a model has more than twice as many as key-value heads (then twice),
or more than 8 in all (then 8), with the hidden size in proportion; the key-value heads, the head size and its ratio
to hidden/heads stay as published. See docs/compatibility.md, "Published configs".

    from hfexport.testing.zoo import build
    folder = build("llama-3.2-1b", tmp_path / "llama")
"""

from __future__ import annotations

import json
import shutil
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from hfexport.testing.models import (
    DIMS,
    FORMATS,
    SEED,
    TEXT_SHAPES,
    TEXTS,
    bpe_tokenizer,
    target_name,
    wordpiece_tokenizer,
)

#: The generation targets a decoder's recipe has on the ONNX and OpenVINO formats (examples/tiny-llama's, by name).
TARGETS = ("onnx-generation", "openvino-generation")
#: Fields of a published config that name tokens of its own vocabulary: replaced by the zoo tokenizer's.
_TOKEN_FIELDS = ("bos_token_id", "eos_token_id", "pad_token_id")
#: Token-id fields that name one of the three special tokens by its published id (mapped to the tokenizer's).
_ROLE_FIELDS = ("decoder_start_token_id", "forced_eos_token_id", "forced_bos_token_id", "sep_token_id", "cls_token_id")
#: Token-id fields that are generation settings the zoo's greedy generation does not use.
_FORCED_FIELDS = ("forced_bos_token_id", "forced_eos_token_id")
#: The modes each task's targets have.
MODES = {"text-generation": ("generation",), "text2text-generation": ("generation",),
         "automatic-speech-recognition": ("generation",), "feature-extraction": ("forward",),
         "image-feature-extraction": ("forward",), "image-classification": ("forward",)}
#: Per-layer lists a config may hold (cut with the depth).
_PER_LAYER = ("layer_types", "no_rope_layers")
#: Names a config stores its depth, widths and heads under.
_DEPTH = ("num_hidden_layers", "n_layer", "encoder_layers", "decoder_layers", "num_layers", "num_decoder_layers")
_MLP = ("intermediate_size", "ffn_hidden_size", "moe_intermediate_size", "d_ff", "encoder_ffn_dim", "decoder_ffn_dim")
_EXPERTS = ("num_experts", "num_local_experts")
#: `fast`: MLP width, MoE expert count and query heads at most.
FAST_MLP, FAST_EXPERTS, FAST_HEADS = 256, 4, 8
IMAGE_SIZE = 224


@dataclass(frozen=True)
class ZooModel:
    """One published config: its repository, where the fields were read, the fields as published, and its task."""

    name: str
    repo: str
    source: str  # where the fields below were read (the model repository's config.json, or a copy of it)
    config: dict[str, Any] = field(repr=False)
    task: str = "text-generation"

    @property
    def modes(self) -> tuple[str, ...]:
        return MODES[self.task]

    def targets(self) -> list[str]:
        return [target_name(export_format, mode) for mode in self.modes for export_format in FORMATS]


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
    # ── More decoders (text-generation) ─────────────────────────────────────────────────────────────────────────
    ZooModel(
        "llama-3.2-3b", "meta-llama/Llama-3.2-3B",
        "config.json of meta-llama/Llama-3.2-3B (as citsjtu2020/LLM-Prof sglang/Model_Config.md copies it)",
        {
            "architectures": ["LlamaForCausalLM"], "attention_bias": False, "attention_dropout": 0.0,
            "bos_token_id": 128000, "eos_token_id": 128001, "head_dim": 128, "hidden_act": "silu",
            "hidden_size": 3072, "initializer_range": 0.02, "intermediate_size": 8192,
            "max_position_embeddings": 131072, "mlp_bias": False, "model_type": "llama", "num_attention_heads": 24,
            "num_hidden_layers": 28, "num_key_value_heads": 8, "pretraining_tp": 1, "rms_norm_eps": 1e-05,
            "rope_scaling": {"factor": 32.0, "high_freq_factor": 4.0, "low_freq_factor": 1.0,
                             "original_max_position_embeddings": 8192, "rope_type": "llama3"},
            "rope_theta": 500000.0, "tie_word_embeddings": True, "torch_dtype": "bfloat16",
            "transformers_version": "4.45.0.dev0", "use_cache": True, "vocab_size": 128256,
        },
    ),
    ZooModel(
        "qwen2.5-3b", "Qwen/Qwen2.5-3B",
        "config.json of Qwen/Qwen2.5-3B (as citsjtu2020/LLM-Prof sglang/Model_Config.md copies it)",
        {
            "architectures": ["Qwen2ForCausalLM"], "attention_dropout": 0.0, "bos_token_id": 151643,
            "eos_token_id": 151643, "hidden_act": "silu", "hidden_size": 2048, "initializer_range": 0.02,
            "intermediate_size": 11008, "max_position_embeddings": 32768, "max_window_layers": 36,
            "model_type": "qwen2", "num_attention_heads": 16, "num_hidden_layers": 36, "num_key_value_heads": 2,
            "rms_norm_eps": 1e-06, "rope_theta": 1000000.0, "sliding_window": 32768, "tie_word_embeddings": True,
            "torch_dtype": "bfloat16", "transformers_version": "4.40.1", "use_cache": True, "use_mrope": False,
            "use_sliding_window": False, "vocab_size": 151936,
        },
    ),
    ZooModel(
        "qwen2.5-7b", "Qwen/Qwen2.5-7B",
        "config.json of Qwen/Qwen2.5-7B (as citsjtu2020/LLM-Prof sglang/Model_Config.md copies it)",
        {
            "architectures": ["Qwen2ForCausalLM"], "attention_dropout": 0.0, "bos_token_id": 151643,
            "eos_token_id": 151643, "hidden_act": "silu", "hidden_size": 3584, "initializer_range": 0.02,
            "intermediate_size": 18944, "max_position_embeddings": 131072, "max_window_layers": 28,
            "model_type": "qwen2", "num_attention_heads": 28, "num_hidden_layers": 28, "num_key_value_heads": 4,
            "rms_norm_eps": 1e-06, "rope_theta": 1000000.0, "sliding_window": 131072, "tie_word_embeddings": False,
            "torch_dtype": "bfloat16", "transformers_version": "4.40.1", "use_cache": True, "use_mrope": False,
            "use_sliding_window": False, "vocab_size": 152064,
        },
    ),
    ZooModel(
        "qwen3-4b", "Qwen/Qwen3-4B",
        "config.json of Qwen/Qwen3-4B (as citsjtu2020/LLM-Prof sglang/Model_Config.md copies it)",
        {
            "architectures": ["Qwen3ForCausalLM"], "attention_bias": False, "attention_dropout": 0,
            "bos_token_id": 151643, "eos_token_id": 151645, "head_dim": 128, "hidden_act": "silu",
            "hidden_size": 2560, "initializer_range": 0.02, "intermediate_size": 9728,
            "max_position_embeddings": 40960, "max_window_layers": 36, "model_type": "qwen3",
            "num_attention_heads": 32, "num_hidden_layers": 36, "num_key_value_heads": 8, "rms_norm_eps": 0.000001,
            "rope_scaling": None, "rope_theta": 1000000, "sliding_window": None, "tie_word_embeddings": True,
            "torch_dtype": "bfloat16", "transformers_version": "4.51.2", "use_cache": False,
            "use_sliding_window": False, "vocab_size": 151936,
        },
    ),
    ZooModel(
        "qwen3-8b", "Qwen/Qwen3-8B",
        "config.json of Qwen/Qwen3-8B (as citsjtu2020/LLM-Prof sglang/Model_Config.md copies it)",
        {
            "architectures": ["Qwen3ForCausalLM"], "attention_bias": False, "attention_dropout": 0.0,
            "bos_token_id": 151643, "eos_token_id": 151645, "head_dim": 128, "hidden_act": "silu",
            "hidden_size": 4096, "initializer_range": 0.02, "intermediate_size": 12288,
            "max_position_embeddings": 40960, "max_window_layers": 36, "model_type": "qwen3",
            "num_attention_heads": 32, "num_hidden_layers": 36, "num_key_value_heads": 8, "rms_norm_eps": 1e-06,
            "rope_scaling": None, "rope_theta": 1000000, "sliding_window": None, "tie_word_embeddings": False,
            "torch_dtype": "bfloat16", "transformers_version": "4.51.0", "use_cache": True,
            "use_sliding_window": False, "vocab_size": 151936,
        },
    ),
    ZooModel(
        "qwen3-30b-a3b", "Qwen/Qwen3-30B-A3B",
        "config.json of Qwen/Qwen3-30B-A3B (as citsjtu2020/LLM-Prof sglang/Model_Config.md copies it)",
        {
            "architectures": ["Qwen3MoeForCausalLM"], "attention_bias": False, "attention_dropout": 0.0,
            "bos_token_id": 151643, "decoder_sparse_step": 1, "eos_token_id": 151645, "head_dim": 128,
            "hidden_act": "silu", "hidden_size": 2048, "initializer_range": 0.02, "intermediate_size": 6144,
            "max_position_embeddings": 40960, "max_window_layers": 48, "mlp_only_layers": [],
            "model_type": "qwen3_moe", "moe_intermediate_size": 768, "norm_topk_prob": True,
            "num_attention_heads": 32, "num_experts": 128, "num_experts_per_tok": 8, "num_hidden_layers": 48,
            "num_key_value_heads": 4, "output_router_logits": False, "rms_norm_eps": 1e-06, "rope_scaling": None,
            "rope_theta": 1000000.0, "router_aux_loss_coef": 0.001, "sliding_window": None,
            "tie_word_embeddings": False, "torch_dtype": "bfloat16", "transformers_version": "4.51.0",
            "use_cache": True, "use_sliding_window": False, "vocab_size": 151936,
        },
    ),
    ZooModel(
        "gemma-2-9b", "google/gemma-2-9b-it",
        "config.json of google/gemma-2-9b-it (as kevinstephano/thunder_model_blocks "
        "thunder_model_blocks/gemma2/gemma2_config.py copies it)",
        {
            "architectures": ["Gemma2ForCausalLM"], "attention_bias": False, "attention_dropout": 0.0,
            "attn_logit_softcapping": 50.0, "bos_token_id": 2, "cache_implementation": "hybrid", "eos_token_id": 1,
            "final_logit_softcapping": 30.0, "head_dim": 256, "hidden_act": "gelu_pytorch_tanh",
            "hidden_activation": "gelu_pytorch_tanh", "hidden_size": 3584, "initializer_range": 0.02,
            "intermediate_size": 14336, "max_position_embeddings": 8192, "model_type": "gemma2",
            "num_attention_heads": 16, "num_hidden_layers": 42, "num_key_value_heads": 8, "pad_token_id": 0,
            "query_pre_attn_scalar": 256, "rms_norm_eps": 1e-06, "rope_theta": 10000.0, "sliding_window": 4096,
            "sliding_window_size": 4096, "torch_dtype": "bfloat16", "transformers_version": "4.42.0.dev0",
            "use_cache": True, "vocab_size": 256000,
        },
    ),
    ZooModel(
        "gemma-3-1b", "google/gemma-3-1b-it",
        "config.json of google/gemma-3-1b-it (as Liwink/gemma-jax models/README.md quotes it)",
        {
            "architectures": ["Gemma3ForCausalLM"], "attention_bias": False, "attention_dropout": 0.0,
            "attn_logit_softcapping": None, "bos_token_id": 2, "cache_implementation": "hybrid",
            "eos_token_id": [1, 106], "final_logit_softcapping": None, "head_dim": 256,
            "hidden_activation": "gelu_pytorch_tanh", "hidden_size": 1152, "initializer_range": 0.02,
            "intermediate_size": 6912, "max_position_embeddings": 32768, "model_type": "gemma3_text",
            "num_attention_heads": 4, "num_hidden_layers": 26, "num_key_value_heads": 1, "pad_token_id": 0,
            "query_pre_attn_scalar": 256, "rms_norm_eps": 1e-06, "rope_local_base_freq": 10000,
            "rope_scaling": None, "rope_theta": 1000000, "sliding_window": 512, "sliding_window_pattern": 6,
            "torch_dtype": "bfloat16", "transformers_version": "4.52.4", "use_cache": True, "vocab_size": 262144,
        },
    ),
    ZooModel(
        "mistral-nemo-12b", "mistralai/Mistral-Nemo-Base-2407",
        "config.json of mistralai/Mistral-Nemo-Base-2407 (as kevinstephano/thunder_model_blocks "
        "hf_mistral/mistral_config.py copies it)",
        {
            "architectures": ["MistralForCausalLM"], "attention_dropout": 0.0, "bos_token_id": 1, "eos_token_id": 2,
            "head_dim": 128, "hidden_act": "silu", "hidden_size": 5120, "initializer_range": 0.02,
            "intermediate_size": 14336, "max_position_embeddings": 128000, "model_type": "mistral",
            "num_attention_heads": 32, "num_hidden_layers": 40, "num_key_value_heads": 8, "rms_norm_eps": 1e-05,
            "rope_theta": 1000000.0, "sliding_window": None, "tie_word_embeddings": False,
            "torch_dtype": "bfloat16", "transformers_version": "4.43.3", "use_cache": True, "vocab_size": 131072,
        },
    ),
    ZooModel(
        "mistral-7b", "mistralai/Mistral-7B-v0.1",
        "transformers 5.23 `MistralConfig()` defaults, which its docstring says are mistralai/Mistral-7B-v0.1's "
        "(no copy of the repository's config.json found)",
        {
            "architectures": ["MistralForCausalLM"], "attention_dropout": 0.0, "bos_token_id": 1, "eos_token_id": 2,
            "head_dim": 128, "hidden_act": "silu", "hidden_size": 4096, "initializer_range": 0.02,
            "intermediate_size": 14336, "max_position_embeddings": 131072, "model_type": "mistral",
            "num_attention_heads": 32, "num_hidden_layers": 32, "num_key_value_heads": 8, "rms_norm_eps": 1e-06,
            "rope_theta": 10000.0, "sliding_window": 4096, "tie_word_embeddings": False, "torch_dtype": "bfloat16",
            "use_cache": True, "vocab_size": 32000,
        },
    ),
    ZooModel(
        "mixtral-8x7b", "mistralai/Mixtral-8x7B-v0.1",
        "config.json of mistralai/Mixtral-8x7B as a public test fixture quotes it (`_infer_hardware` of "
        "\"mixtral-8x7b\"; the code index's excerpt, which names no repository)",
        {
            "architectures": ["MixtralForCausalLM"], "attention_dropout": 0.0, "bos_token_id": 1, "eos_token_id": 2,
            "hidden_act": "silu", "hidden_size": 4096, "initializer_range": 0.02, "intermediate_size": 14336,
            "max_position_embeddings": 32768, "model_type": "mixtral", "num_attention_heads": 32,
            "num_experts_per_tok": 2, "num_hidden_layers": 32, "num_key_value_heads": 8, "num_local_experts": 8,
            "rms_norm_eps": 1e-05, "rope_theta": 1000000.0, "router_aux_loss_coef": 0.02, "torch_dtype": "bfloat16",
            "transformers_version": "4.36.0.dev0", "vocab_size": 32000,
        },
    ),
    ZooModel(
        "phi-3-mini-4k", "microsoft/Phi-3-mini-4k-instruct",
        "transformers 5.23 `Phi3Config()` defaults, which its docstring says are microsoft/Phi-3-mini-4k-instruct's "
        "(Phi-3.5-mini's longrope factors were found in no copy)",
        {
            "architectures": ["Phi3ForCausalLM"], "attention_dropout": 0.0, "bos_token_id": 1, "embd_pdrop": 0.0,
            "eos_token_id": 32000, "hidden_act": "silu", "hidden_size": 3072, "initializer_range": 0.02,
            "intermediate_size": 8192, "max_position_embeddings": 4096, "model_type": "phi3",
            "num_attention_heads": 32, "num_hidden_layers": 32, "num_key_value_heads": 32,
            "original_max_position_embeddings": 4096, "pad_token_id": 32000, "resid_pdrop": 0.0,
            "rms_norm_eps": 1e-05, "rope_theta": 10000.0, "sliding_window": None, "tie_word_embeddings": False,
            "torch_dtype": "bfloat16", "use_cache": True, "vocab_size": 32064,
        },
    ),
    ZooModel(
        "phi-4-mini", "microsoft/Phi-4-mini-instruct",
        "config.json of microsoft/Phi-4-mini-instruct as a public Rust test fixture trims it (\"Trimmed from "
        "phi-4-mini/config.json\"; the code index's excerpt, which names no repository). Its `rope_scaling` (longrope, "
        "48 factors each) is cut to three there, so it is left out here: the default rope",
        {
            "architectures": ["Phi3ForCausalLM"], "model_type": "phi3", "vocab_size": 200064, "hidden_size": 3072,
            "intermediate_size": 8192, "num_hidden_layers": 32, "num_attention_heads": 24, "num_key_value_heads": 8,
            "rms_norm_eps": 1e-5, "rope_theta": 10000.0, "max_position_embeddings": 131072,
            "tie_word_embeddings": True, "partial_rotary_factor": 0.75, "original_max_position_embeddings": 4096,
            "torch_dtype": "bfloat16",
        },
    ),
    ZooModel(
        "smollm3-3b", "HuggingFaceTB/SmolLM3-3B-Base",
        "config.json of HuggingFaceTB/SmolLM3-3B-Base as a public training repository pins it "
        "(`SMOLLM3_3B_OFFICIAL`; the code index's excerpt, which names no repository)",
        {
            "architectures": ["SmolLM3ForCausalLM"], "attention_bias": False, "attention_dropout": 0.0,
            "bos_token_id": None, "eos_token_id": 128001, "hidden_act": "silu", "hidden_size": 2048,
            "initializer_range": 0.02, "intermediate_size": 11008, "max_position_embeddings": 65536,
            "model_type": "smollm3", "no_rope_layer_interval": 4, "num_attention_heads": 16,
            "num_hidden_layers": 36, "num_key_value_heads": 4, "pad_token_id": 128004, "pretraining_tp": 2,
            "rms_norm_eps": 1e-06, "rope_scaling": None, "rope_theta": 5000000.0, "sliding_window": None,
            "tie_word_embeddings": True, "torch_dtype": "bfloat16", "use_cache": True, "use_sliding_window": False,
            "vocab_size": 128256,
        },
    ),
    ZooModel(
        "olmo-2-7b", "allenai/OLMo-2-1124-7B",
        "config.json of allenai/OLMo-2-1124-7B as Megatron-Bridge's OLMo 2 provider test mirrors it (\"Mirror of "
        "`allenai/OLMo-2-1124-7B/config.json`\"; the code index's excerpt)",
        {
            "architectures": ["Olmo2ForCausalLM"], "attention_bias": False, "attention_dropout": 0.0,
            "eos_token_id": 100257, "hidden_act": "silu", "hidden_size": 4096, "initializer_range": 0.02,
            "intermediate_size": 11008, "max_position_embeddings": 4096, "model_type": "olmo2",
            "num_attention_heads": 32, "num_hidden_layers": 32, "num_key_value_heads": 32, "pad_token_id": 100277,
            "rms_norm_eps": 1e-06, "rope_theta": 500000.0, "tie_word_embeddings": False, "torch_dtype": "bfloat16",
            "use_cache": True, "vocab_size": 100352,
        },
    ),
    ZooModel(
        "granite-3-8b", "ibm-granite/granite-3.x-8b",
        "a Granite 3 8B config.json (GraniteForCausalLM, 40 layers, vocabulary 49159, transformers 4.49.0) as a "
        "public model-inventory Markdown quotes it (the code index's excerpt; the checkpoint's name is outside it)",
        {
            "architectures": ["GraniteForCausalLM"], "attention_bias": False, "attention_dropout": 0.0,
            "attention_multiplier": 0.0078125, "bos_token_id": 0, "embedding_multiplier": 12.0, "eos_token_id": 0,
            "hidden_act": "silu", "hidden_size": 4096, "initializer_range": 0.02, "intermediate_size": 12800,
            "logits_scaling": 16.0, "max_position_embeddings": 131072, "mlp_bias": False, "model_type": "granite",
            "num_attention_heads": 32, "num_hidden_layers": 40, "num_key_value_heads": 8, "pad_token_id": 0,
            "residual_multiplier": 0.22, "rms_norm_eps": 1e-05, "rope_scaling": None, "rope_theta": 10000000.0,
            "tie_word_embeddings": True, "torch_dtype": "bfloat16", "transformers_version": "4.49.0",
            "use_cache": True, "vocab_size": 49159,
        },
    ),
    ZooModel(
        "gpt2", "openai-community/gpt2",
        "config.json of openai-community/gpt2 (as Shubham2376G/FAQ_generator gpt2/config.json copies it)",
        {
            "activation_function": "gelu_new", "architectures": ["GPT2LMHeadModel"], "attn_pdrop": 0.1,
            "bos_token_id": 50256, "embd_pdrop": 0.1, "eos_token_id": 50256, "initializer_range": 0.02,
            "layer_norm_epsilon": 1e-05, "model_type": "gpt2", "n_ctx": 1024, "n_embd": 768, "n_head": 12,
            "n_inner": None, "n_layer": 12, "n_positions": 1024, "reorder_and_upcast_attn": False,
            "resid_pdrop": 0.1, "scale_attn_by_inverse_layer_idx": False, "scale_attn_weights": True,
            "summary_activation": None, "summary_first_dropout": 0.1, "summary_proj_to_labels": True,
            "summary_type": "cls_index", "summary_use_proj": True, "torch_dtype": "float32",
            "transformers_version": "4.47.1", "use_cache": True, "vocab_size": 50257,
        },
    ),
    ZooModel(
        "pythia-1b", "EleutherAI/pythia-1b",
        "config.json of EleutherAI/pythia-1b as a public Rust test quotes it \"field-for-field\" (`PYTHIA_1B_CONFIG`; "
        "the code index's excerpt, which names no repository)",
        {
            "architectures": ["GPTNeoXForCausalLM"], "bos_token_id": 0, "eos_token_id": 0, "hidden_act": "gelu",
            "hidden_size": 2048, "initializer_range": 0.02, "intermediate_size": 8192, "layer_norm_eps": 1e-05,
            "max_position_embeddings": 2048, "model_type": "gpt_neox", "num_attention_heads": 8,
            "num_hidden_layers": 16, "rotary_emb_base": 10000, "rotary_pct": 0.25, "tie_word_embeddings": False,
            "torch_dtype": "float16", "transformers_version": "4.24.0", "use_cache": True,
            "use_parallel_residual": True, "vocab_size": 50304,
        },
    ),
    ZooModel(
        "falcon-7b", "tiiuae/falcon-7b",
        "transformers 5.23 `FalconConfig()` defaults, which its docstring says are tiiuae/falcon-7b's (no copy of the "
        "repository's config.json found)",
        {
            "architectures": ["FalconForCausalLM"], "activation": "gelu", "alibi": False, "attention_dropout": 0.0,
            "bias": False, "bos_token_id": 11, "eos_token_id": 11, "ffn_hidden_size": 18176, "hidden_dropout": 0.0,
            "hidden_size": 4544, "initializer_range": 0.02, "layer_norm_epsilon": 1e-05,
            "max_position_embeddings": 2048, "model_type": "falcon", "multi_query": True,
            "new_decoder_architecture": False, "num_attention_heads": 71, "num_hidden_layers": 32,
            "num_kv_heads": 71, "parallel_attn": True, "rope_theta": 10000.0, "tie_word_embeddings": True,
            "torch_dtype": "bfloat16", "use_cache": True, "vocab_size": 65024,
        },
    ),
    ZooModel(
        "stablelm-3b", "stabilityai/stablelm-3b-4e1t",
        "transformers 5.23 `StableLmConfig()` defaults, which its docstring says are stabilityai/stablelm-3b-4e1t's "
        "(no copy of the repository's config.json found)",
        {
            "architectures": ["StableLmForCausalLM"], "attention_dropout": 0.0, "bos_token_id": 0, "eos_token_id": 0,
            "hidden_act": "silu", "hidden_dropout": 0.0, "hidden_size": 2560, "initializer_range": 0.02,
            "intermediate_size": 6912, "layer_norm_eps": 1e-05, "max_position_embeddings": 4096,
            "model_type": "stablelm", "num_attention_heads": 32, "num_hidden_layers": 32, "num_key_value_heads": 32,
            "partial_rotary_factor": 0.25, "qk_layernorm": False, "rope_theta": 10000.0,
            "tie_word_embeddings": False, "torch_dtype": "bfloat16", "use_cache": True,
            "use_parallel_residual": False, "use_qkv_bias": False, "vocab_size": 50304,
        },
    ),
    # ── Encoders (feature-extraction) ───────────────────────────────────────────────────────────────────────────
    ZooModel(
        "bert-base-uncased", "google-bert/bert-base-uncased",
        "config.json of bert-base-uncased as fine-tuned from it (lukyanchikov/NLP bert-base-uncased/config.json: the "
        "classifier's `architectures`, `problem_type`; the encoder's fields as published)",
        {
            "architectures": ["BertModel"], "attention_probs_dropout_prob": 0.1, "classifier_dropout": None,
            "gradient_checkpointing": False, "hidden_act": "gelu", "hidden_dropout_prob": 0.1, "hidden_size": 768,
            "initializer_range": 0.02, "intermediate_size": 3072, "layer_norm_eps": 1e-12,
            "max_position_embeddings": 512, "model_type": "bert", "num_attention_heads": 12,
            "num_hidden_layers": 12, "pad_token_id": 0, "position_embedding_type": "absolute",
            "torch_dtype": "float32", "transformers_version": "4.10.2", "type_vocab_size": 2, "use_cache": True,
            "vocab_size": 30522,
        },
        task="feature-extraction",
    ),
    ZooModel(
        "xlm-roberta-base", "BAAI/bge-reranker-base",
        "config.json of BAAI/bge-reranker-base, an XLM-RoBERTa-base (as a public OpenSearch setup script registers "
        "it; the code index's excerpt, which names no repository)",
        {
            "architectures": ["XLMRobertaModel"], "attention_probs_dropout_prob": 0.1, "bos_token_id": 0,
            "classifier_dropout": None, "eos_token_id": 2, "hidden_act": "gelu", "hidden_dropout_prob": 0.1,
            "hidden_size": 768, "initializer_range": 0.02, "intermediate_size": 3072, "layer_norm_eps": 1e-05,
            "max_position_embeddings": 514, "model_type": "xlm-roberta", "num_attention_heads": 12,
            "num_hidden_layers": 12, "output_past": True, "pad_token_id": 1, "position_embedding_type": "absolute",
            "torch_dtype": "float32", "transformers_version": "4.33.3", "type_vocab_size": 1, "use_cache": True,
            "vocab_size": 250002,
        },
        task="feature-extraction",
    ),
    ZooModel(
        "modernbert-base", "answerdotai/ModernBERT-base",
        "transformers 5.23 `ModernBertConfig()` defaults, which its docstring says are answerdotai/ModernBERT-base's "
        "(no copy of the repository's config.json found)",
        {
            "architectures": ["ModernBertModel"], "attention_bias": False, "attention_dropout": 0.0,
            "bos_token_id": 50281, "classifier_pooling": "cls", "cls_token_id": 50281, "eos_token_id": 50282,
            "global_attn_every_n_layers": 3, "global_rope_theta": 160000.0, "hidden_activation": "gelu",
            "hidden_size": 768, "initializer_cutoff_factor": 2.0, "initializer_range": 0.02,
            "intermediate_size": 1152, "local_attention": 128, "local_rope_theta": 10000.0,
            "max_position_embeddings": 8192, "mlp_bias": False, "model_type": "modernbert", "norm_bias": False,
            "norm_eps": 1e-05, "num_attention_heads": 12, "num_hidden_layers": 22, "pad_token_id": 50283,
            "sep_token_id": 50282, "tie_word_embeddings": True, "torch_dtype": "float32", "vocab_size": 50368,
        },
        task="feature-extraction",
    ),
    # ── Encoder-decoders (text2text-generation, automatic-speech-recognition) ───────────────────────────────────
    ZooModel(
        "t5-v1_1-base", "google/t5-v1_1-base",
        "config.json of google/t5-v1_1-base, Flan-T5's architecture (gated-gelu), as nanoT5's training log prints it "
        "(the code index's excerpt, which names no repository)",
        {
            "architectures": ["T5ForConditionalGeneration"], "classifier_dropout": 0.0, "d_ff": 2048, "d_kv": 64,
            "d_model": 768, "decoder_start_token_id": 0, "dense_act_fn": "gelu_new", "dropout_rate": 0.1,
            "eos_token_id": 1, "feed_forward_proj": "gated-gelu", "initializer_factor": 1.0,
            "is_encoder_decoder": True, "is_gated_act": True, "layer_norm_epsilon": 1e-06, "model_type": "t5",
            "num_decoder_layers": 12, "num_heads": 12, "num_layers": 12, "output_past": True, "pad_token_id": 0,
            "relative_attention_max_distance": 128, "relative_attention_num_buckets": 32,
            "tie_word_embeddings": False, "transformers_version": "4.33.2", "use_cache": True, "vocab_size": 32128,
        },
        task="text2text-generation",
    ),
    ZooModel(
        "bart-base", "facebook/bart-base",
        "config.json of facebook/bart-base (as ibmm-unibe-ch/SMILES_or_SELFIES bart-base/config.json copies it)",
        {
            "activation_dropout": 0.1, "activation_function": "gelu", "add_bias_logits": False,
            "add_final_layer_norm": False, "architectures": ["BartForConditionalGeneration"],
            "attention_dropout": 0.1, "bos_token_id": 0, "classif_dropout": 0.1, "classifier_dropout": 0.0,
            "d_model": 768, "decoder_attention_heads": 12, "decoder_ffn_dim": 3072, "decoder_layerdrop": 0.0,
            "decoder_layers": 6, "decoder_start_token_id": 2, "dropout": 0.1, "early_stopping": True,
            "encoder_attention_heads": 12, "encoder_ffn_dim": 3072, "encoder_layerdrop": 0.0, "encoder_layers": 6,
            "eos_token_id": 2, "forced_eos_token_id": 2, "forced_bos_token_id": 0, "gradient_checkpointing": False,
            "init_std": 0.02, "is_encoder_decoder": True, "max_position_embeddings": 1024, "model_type": "bart",
            "no_repeat_ngram_size": 3, "normalize_before": False, "normalize_embedding": True, "num_beams": 4,
            "num_hidden_layers": 6, "pad_token_id": 1, "scale_embedding": False, "torch_dtype": "float32",
            "transformers_version": "4.12.0.dev0", "use_cache": True, "vocab_size": 51201,
        },
        task="text2text-generation",
    ),
    ZooModel(
        "whisper-tiny", "openai/whisper-tiny",
        "transformers 5.23 `WhisperConfig()` defaults, which its docstring says are openai/whisper-tiny's (no copy of "
        "the repository's config.json found)",
        {
            "activation_dropout": 0.0, "activation_function": "gelu", "architectures": ["WhisperForConditionalGeneration"],
            "attention_dropout": 0.0, "bos_token_id": 50256, "d_model": 384, "decoder_attention_heads": 6,
            "decoder_ffn_dim": 1536, "decoder_layers": 4, "decoder_start_token_id": 50257, "dropout": 0.0,
            "encoder_attention_heads": 6, "encoder_ffn_dim": 1536, "encoder_layers": 4, "eos_token_id": 50256,
            "init_std": 0.02, "max_source_positions": 1500, "max_target_positions": 448, "model_type": "whisper",
            "num_mel_bins": 80, "pad_token_id": 50256, "scale_embedding": False, "tie_word_embeddings": True,
            "torch_dtype": "float32", "use_cache": True, "vocab_size": 51865,
        },
        task="automatic-speech-recognition",
    ),
    # ── Vision encoders (image-feature-extraction, image-classification) ────────────────────────────────────────
    ZooModel(
        "clip-vit-base-patch32", "openai/clip-vit-base-patch32",
        "the `vision_config` of transformers 5.23 `CLIPConfig()` defaults, which its docstring says are "
        "openai/clip-vit-base-patch32's (no copy of the repository's config.json found); the image tower alone",
        {
            "architectures": ["CLIPVisionModel"], "model_type": "clip_vision_model", "hidden_size": 768,
            "intermediate_size": 3072, "projection_dim": 512, "num_hidden_layers": 12, "num_attention_heads": 12,
            "num_channels": 3, "image_size": 224, "patch_size": 32, "hidden_act": "quick_gelu",
            "layer_norm_eps": 1e-05, "torch_dtype": "float32",
        },
        task="image-feature-extraction",
    ),
    ZooModel(
        "siglip-base-patch16-224", "google/siglip-base-patch16-224",
        "the `vision_config` of transformers 5.23 `SiglipConfig()` defaults, which its docstring says are "
        "google/siglip-base-patch16-224's (no copy of the repository's config.json found); the image tower alone",
        {
            "architectures": ["SiglipVisionModel"], "model_type": "siglip_vision_model", "hidden_size": 768,
            "intermediate_size": 3072, "num_hidden_layers": 12, "num_attention_heads": 12, "num_channels": 3,
            "image_size": 224, "patch_size": 16, "hidden_act": "gelu_pytorch_tanh", "layer_norm_eps": 1e-06,
            "torch_dtype": "float32",
        },
        task="image-feature-extraction",
    ),
    ZooModel(
        "vit-base-patch16-224", "google/vit-base-patch16-224",
        "transformers 5.23 `ViTConfig()` defaults, which its docstring says are google/vit-base-patch16-224's (no "
        "copy of the repository's config.json found); 3 labels",
        {
            "architectures": ["ViTForImageClassification"], "attention_probs_dropout_prob": 0.0,
            "encoder_stride": 16, "hidden_act": "gelu", "hidden_dropout_prob": 0.0, "hidden_size": 768,
            "image_size": 224, "initializer_range": 0.02, "intermediate_size": 3072, "layer_norm_eps": 1e-12,
            "model_type": "vit", "num_attention_heads": 12, "num_channels": 3, "num_hidden_layers": 12,
            "num_labels": 3, "patch_size": 16, "qkv_bias": True, "torch_dtype": "float32",
        },
        task="image-classification",
    ),
    ZooModel(
        "dinov2-small", "facebook/dinov2-small",
        "config.json of facebook/dinov2-small (as mayasevensen/CSIRO---Image2Biomass-Prediction "
        "dinov2-small/config.json copies it; its backbone fields `out_features`, `out_indices` and `stage_names` left "
        "out: they name the 12 layers)",
        {
            "apply_layernorm": True, "architectures": ["Dinov2Model"], "attention_probs_dropout_prob": 0.0,
            "drop_path_rate": 0.0, "dtype": "float32", "hidden_act": "gelu", "hidden_dropout_prob": 0.0,
            "hidden_size": 384, "image_size": 518, "initializer_range": 0.02, "layer_norm_eps": 1e-06,
            "layerscale_value": 1.0, "mlp_ratio": 4, "model_type": "dinov2", "num_attention_heads": 6,
            "num_channels": 3, "num_hidden_layers": 12, "patch_size": 14, "qkv_bias": True,
            "transformers_version": "5.2.0", "use_mask_token": True, "use_swiglu_ffn": False,
        },
        task="image-feature-extraction",
    ),
    # ── Appended for issue 43's list: Phi-3.5-mini (longrope), Whisper large-v3-turbo, Marian ─────────────────────
    ZooModel(
        "phi-3.5-mini", "microsoft/Phi-3.5-mini-instruct",
        "config.json of microsoft/Phi-3.5-mini-instruct (as sdpython/experimental-experiment "
        "experimental_experiment/torch_models/llm_model_helper.py `get_phi_35_mini_instruct` copies it, linking the "
        "repository's config.json; its `_name_or_path` and `auto_map` to the repository's own modeling code left out: "
        "transformers' Phi3 runs it)",
        {
            "architectures": ["Phi3ForCausalLM"], "attention_bias": False, "attention_dropout": 0.0, "bos_token_id": 1,
            "embd_pdrop": 0.0, "eos_token_id": 32000, "hidden_act": "silu", "hidden_size": 3072,
            "initializer_range": 0.02, "intermediate_size": 8192, "max_position_embeddings": 131072,
            "model_type": "phi3", "num_attention_heads": 32, "num_hidden_layers": 32, "num_key_value_heads": 32,
            "original_max_position_embeddings": 4096, "pad_token_id": 32000, "resid_pdrop": 0.0,
            "rms_norm_eps": 1e-05,
            "rope_scaling": {
                "long_factor": [
                1.0800000429153442, 1.1100000143051147, 1.1399999856948853, 1.340000033378601, 1.5899999141693115,
                1.600000023841858, 1.6200000047683716, 2.620000123977661, 3.2300000190734863, 3.2300000190734863,
                4.789999961853027, 7.400000095367432, 7.700000286102295, 9.09000015258789, 12.199999809265137,
                17.670000076293945, 24.46000099182129, 28.57000160217285, 30.420001983642578, 30.840002059936523,
                32.590003967285156, 32.93000411987305, 42.320003509521484, 44.96000289916992, 50.340003967285156,
                50.45000457763672, 57.55000305175781, 57.93000411987305, 58.21000289916992, 60.1400032043457,
                62.61000442504883, 62.62000274658203, 62.71000289916992, 63.1400032043457, 63.1400032043457,
                63.77000427246094, 63.93000411987305, 63.96000289916992, 63.970001220703125, 64.02999877929688,
                64.06999969482422, 64.08000183105469, 64.12000274658203, 64.41000366210938, 64.4800033569336,
                64.51000213623047, 64.52999877929688, 64.83999633789062,
                ],
                "short_factor": [
                1.0, 1.0199999809265137, 1.0299999713897705, 1.0299999713897705, 1.0499999523162842,
                1.0499999523162842, 1.0499999523162842, 1.0499999523162842, 1.0499999523162842, 1.0699999332427979,
                1.0999999046325684, 1.1099998950958252, 1.1599998474121094, 1.1599998474121094, 1.1699998378753662,
                1.2899998426437378, 1.339999794960022, 1.679999828338623, 1.7899998426437378, 1.8199998140335083,
                1.8499997854232788, 1.8799997568130493, 1.9099997282028198, 1.9399996995925903, 1.9899996519088745,
                2.0199997425079346, 2.0199997425079346, 2.0199997425079346, 2.0199997425079346, 2.0199997425079346,
                2.0199997425079346, 2.0299997329711914, 2.0299997329711914, 2.0299997329711914, 2.0299997329711914,
                2.0299997329711914, 2.0299997329711914, 2.0299997329711914, 2.0299997329711914, 2.0299997329711914,
                2.0799996852874756, 2.0899996757507324, 2.189999580383301, 2.2199995517730713, 2.5899994373321533,
                2.729999542236328, 2.749999523162842, 2.8399994373321533,
                ],
                "type": "longrope",
            },
            "rope_theta": 10000.0, "sliding_window": 262144, "tie_word_embeddings": False, "torch_dtype": "bfloat16",
            "use_cache": True, "vocab_size": 32064,
        },
    ),
    ZooModel(
        "whisper-large-v3-turbo", "openai/whisper-large-v3-turbo",
        "config.json of openai/whisper-large-v3-turbo as oznav2/live_transcribe whisper-large-v3-turbo/config.json "
        "vendors it, re-saved by transformers 4.51.1 (its `torch_dtype` float32 and `use_cache` false are that copy's)",
        {
            "activation_dropout": 0.0, "activation_function": "gelu", "apply_spec_augment": False,
            "architectures": ["WhisperForConditionalGeneration"], "attention_dropout": 0.0,
            "begin_suppress_tokens": [220, 50256], "bos_token_id": 50257, "classifier_proj_size": 256,
            "d_model": 1280, "decoder_attention_heads": 20, "decoder_ffn_dim": 5120, "decoder_layerdrop": 0.0,
            "decoder_layers": 4, "decoder_start_token_id": 50258, "dropout": 0.0, "encoder_attention_heads": 20,
            "encoder_ffn_dim": 5120, "encoder_layerdrop": 0.0, "encoder_layers": 32, "eos_token_id": 50257,
            "forced_decoder_ids": None, "init_std": 0.02, "is_encoder_decoder": True, "mask_feature_length": 10,
            "mask_feature_min_masks": 0, "mask_feature_prob": 0.0, "mask_time_length": 10, "mask_time_min_masks": 2,
            "mask_time_prob": 0.05, "max_source_positions": 1500, "max_target_positions": 448,
            "median_filter_width": 7, "model_type": "whisper", "num_hidden_layers": 32, "num_mel_bins": 128,
            "pad_token_id": 50257, "scale_embedding": False, "torch_dtype": "float32",
            "transformers_version": "4.51.1", "use_cache": False, "use_weighted_layer_sum": False,
            "vocab_size": 51866,
        },
        task="automatic-speech-recognition",
    ),
    ZooModel(
        "opus-mt-en-de", "Helsinki-NLP/opus-mt-en-de",
        "config of Helsinki-NLP/opus-mt-en-de as a public model-registry test dumps it (`_name_or_path` "
        "Helsinki-NLP/opus-mt-en-de, transformers 4.9.0.dev0; the code index's excerpt, which names no repository): "
        "its Marian fields, without the attributes every config's `to_dict` adds (`return_dict`, `output_*`, "
        "`torchscript`, ...) and its classifier labels",
        {
            "activation_dropout": 0.0, "activation_function": "swish", "add_bias_logits": False,
            "add_final_layer_norm": False, "architectures": ["MarianMTModel"], "attention_dropout": 0.0,
            "bad_words_ids": [[58100]], "bos_token_id": 0, "classif_dropout": 0.0, "classifier_dropout": 0.0,
            "d_model": 512, "decoder_attention_heads": 8, "decoder_ffn_dim": 2048, "decoder_layerdrop": 0.0,
            "decoder_layers": 6, "decoder_start_token_id": 58100, "dropout": 0.1, "encoder_attention_heads": 8,
            "encoder_ffn_dim": 2048, "encoder_layerdrop": 0.0, "encoder_layers": 6, "eos_token_id": 0,
            "forced_eos_token_id": 0, "init_std": 0.02, "is_encoder_decoder": True, "max_length": 512,
            "max_position_embeddings": 512, "model_type": "marian", "normalize_before": False,
            "normalize_embedding": False, "num_beams": 4, "num_hidden_layers": 6, "pad_token_id": 58100,
            "scale_embedding": True, "static_position_embeddings": True, "tie_word_embeddings": True,
            "transformers_version": "4.9.0.dev0", "use_cache": True, "vocab_size": 58101,
        },
        task="text2text-generation",
    ),
)}


def recipe(texts: list[str] | None = None, task: str = "text-generation") -> dict:
    """A recipe with one target per format and mode (`<format>-<mode>`). A decoder's generation targets are
    examples/tiny-llama's kind (one graph each on ONNX and OpenVINO, greedy parity over 8 new tokens), the others the
    matrix's tiny models' (`hfexport.testing.models.matrix_recipe`)."""
    from hfexport.testing.models import matrix_recipe

    samples, shapes, dims = _samples(task, texts)
    document = matrix_recipe(task, MODES[task], shapes, samples, dims=dims)
    for name, target in document["targets"].items():
        if task == "text-generation" and name in TARGETS:
            target["generation"] = {"single_graph": True}
    document.pop("description", None)
    return document


def _samples(task: str, texts: list[str] | None) -> tuple[dict, dict, dict]:
    """(sample_inputs, forward dynamic shapes, dims) of a task's recipe."""
    if task in ("image-feature-extraction", "image-classification"):
        return ({"images": {"count": 2, "height": 48, "width": 40}}, {"pixel_values": {"0": "batch"}},
                {"batch": DIMS["batch"]})
    if task == "automatic-speech-recognition":
        return ({"audio": {"count": 2, "seconds": 1.5}}, {"input_features": {"0": "batch"}}, {"batch": DIMS["batch"]})
    seq_min = 3 if task == "text2text-generation" else 2  # BART's and T5's forward guard seq >= 3
    return ({"text": list(texts or TEXTS)}, TEXT_SHAPES,
            {"batch": DIMS["batch"], "seq": {"min": seq_min, "max": 128 if task == "text-generation" else 64}})


def build(name: str, folder: str | Path, *, layers: int = 2, overrides: dict | None = None,
          texts: list[str] | None = None, dtype: str | None = None, fast: bool = False,
          mlp: int | None = None) -> Path:
    """Write zoo model `name` to `folder` (replaced if it exists): its published config with `layers` layers
    (`fast`: narrowed, see the module docstring; `mlp`: only the MLP cut to that width and a MoE block to
    `FAST_EXPERTS` experts, what no cache or attention shape depends on), the zoo tokenizer's vocabulary and special
    tokens and `overrides` (fields a test shrinks, said where it does), random seeded weights saved in the published
    dtype (or `dtype`), the tokenizer or processor, a greedy generation config and `recipe(texts, task)`. Returns the
    folder."""
    import torch
    from transformers import AutoConfig, GenerationConfig

    from hfexport.models import TASK_AUTO_CLASSES, transformers_class

    model = ZOO[name]
    folder = Path(folder)
    if folder.exists():
        shutil.rmtree(folder)
    folder.mkdir(parents=True)
    text_task = model.task in ("text-generation", "text2text-generation", "feature-extraction",
                               "automatic-speech-recognition")
    tokenizer = (wordpiece_tokenizer() if model.task == "feature-extraction" else bpe_tokenizer()) if text_task else None
    fields = published_fields(model)
    special = {}
    if tokenizer is not None:
        special = {"bos_token_id": tokenizer.bos_token_id, "eos_token_id": tokenizer.eos_token_id,
                   "pad_token_id": tokenizer.pad_token_id}
        if model.task == "feature-extraction":  # WordPiece has no <s> or </s>: BERT's [CLS] and [SEP]
            special.update(bos_token_id=tokenizer.cls_token_id, eos_token_id=tokenizer.sep_token_id)
        roles = {key: model.config.get(key) for key in _TOKEN_FIELDS}
        for key in _ROLE_FIELDS:
            if key in fields:
                role = next((role for role, value in roles.items() if value is not None and value == fields[key]), None)
                # a start token of its own (Whisper's <|startoftranscript|>): the tokenizer's <s>
                fields[key] = special[role or "bos_token_id"] if role or key == "decoder_start_token_id" else None
        fields.update({key: special[key] for key in _TOKEN_FIELDS}, vocab_size=len(tokenizer))
        # the zoo's generation forces no token (its generation config, greedy, has none), and transformers.js starts
        # its generation config from config.json (4.3.2, src/models/modeling_utils.js `_prepare_generation_config`):
        # a forced token left there would be forced on its last new token alone (opus-mt-en-de's forced_eos_token_id)
        fields.update({key: None for key in _FORCED_FIELDS if key in fields})
        if "decoder_vocab_size" in fields:
            fields["decoder_vocab_size"] = len(tokenizer)
    fields.update(depth_fields(model, fields, layers))
    if fast or mlp:
        fields.update(fast_fields(model, fields, mlp or FAST_MLP, heads=fast))
    fields.update(overrides or {})
    stored = dtype or fields.pop("dtype", None) or fields.get("torch_dtype") or "float32"
    config = AutoConfig.for_model(fields.pop("model_type"), **fields)
    torch.manual_seed(SEED)
    network_class = transformers_class(TASK_AUTO_CLASSES[model.task], "task")
    network = network_class.from_config(config).eval().to(getattr(torch, stored))
    if network.can_generate():
        generation = {"decoder_start_token_id": config.decoder_start_token_id} if config.is_encoder_decoder else {}
        if model.task == "automatic-speech-recognition":  # no language, task or timestamp tokens: plain text
            generation = {"decoder_start_token_id": special["bos_token_id"]}
        network.generation_config = GenerationConfig(**special, **generation, do_sample=False)
    network.save_pretrained(folder)
    _save_processor(model, config, tokenizer, folder)
    (folder / "export_config.json").write_text(json.dumps(recipe(texts, model.task), indent=2) + "\n",
                                               encoding="utf-8")
    return folder


def make_weights_distinct(folder: str | Path, seed: int = 1, scale: float = 0.05, dtype: str = "auto") -> str:
    """Move every parameter of the causal LM in `folder` by seeded noise and save it again in its own dtype (or
    `dtype`), so no
    parameter is constant, symmetric or equal to another (the structure path's condition,
    `hfexport.rebind.weight_map.degenerate_keys`). Returns the dtype it was saved in."""
    import torch
    from transformers import AutoModelForCausalLM

    folder = Path(folder)
    model = AutoModelForCausalLM.from_pretrained(folder, dtype=dtype)
    generator = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for parameter in model.parameters():
            parameter.add_((torch.randn(parameter.shape, generator=generator) * scale).to(parameter.dtype))
    for file in folder.glob("*.safetensors"):
        file.unlink()
    model.save_pretrained(folder)
    return str(model.dtype).removeprefix("torch.")


def published_fields(model: ZooModel) -> dict:
    """The published fields a config is built from: without `transformers_version` and the generation settings
    some older configs hold (`num_beams`, `no_repeat_ngram_size`, ...: transformers 5 keeps those in
    generation_config.json, and the zoo's generation is greedy)."""
    from transformers import GenerationConfig

    generation = set(GenerationConfig().to_dict()) - set(_TOKEN_FIELDS) - set(_ROLE_FIELDS)
    return {key: value for key, value in model.config.items()
            if key not in ("transformers_version", "task_specific_params") and key not in generation}


def depth_fields(model: ZooModel, fields: dict, layers: int) -> dict:
    """The depth fields cut to `layers`, and each per-layer list cut to the first layer's kind and the first layer of
    another kind (a sliding and a global layer, a rotary and a NoPE layer), else its first `layers` entries."""
    from transformers import AutoConfig

    full = AutoConfig.for_model(fields["model_type"], **{k: v for k, v in fields.items() if k != "model_type"})
    published = full.to_dict()
    # a depth the config also takes under an alias (Whisper's `num_hidden_layers`, its `encoder_layers`) is cut under
    # both names: kept, the alias would set the published depth back
    cut = {key: layers for key in _DEPTH if isinstance(published.get(key), int) or isinstance(fields.get(key), int)}
    for key in _PER_LAYER:
        values = published.get(key)
        if isinstance(values, list) and values:
            other = next((value for value in values if value != values[0]), None)
            kept = [values[0], other] if other is not None and layers == 2 else values[:layers]
            cut[key] = kept + values[len(kept):layers]
    return cut


def fast_fields(model: ZooModel, fields: dict, mlp: int = FAST_MLP, heads: bool = True) -> dict:
    """The default suite's narrowing (module docstring): MLP width, MoE experts, and (`heads`) a decoder's query heads
    with its hidden size; the key-value heads, the head size and hidden/heads as published."""
    from transformers import AutoConfig

    config = AutoConfig.for_model(fields["model_type"], **{k: v for k, v in fields.items() if k != "model_type"})
    stored = config.to_dict()
    narrowed = {key: min(stored[key], mlp) for key in _MLP if isinstance(stored.get(key), int)}
    top = stored.get("num_experts_per_tok") or 1
    narrowed.update({key: min(stored[key], max(FAST_EXPERTS, 2 * top)) for key in _EXPERTS
                     if isinstance(stored.get(key), int)})
    if model.task != "text-generation" or not heads:
        return narrowed
    from hfexport.models import key_value_heads

    count, kv = config.num_attention_heads, key_value_heads(config)
    multi_query = kv == 1 and getattr(config, "num_key_value_heads", None) is None
    new_heads = min(count, FAST_HEADS) if kv >= count else min(count, 2 * kv)
    hidden_key = next(key for key in ("hidden_size", "n_embd", "d_model") if key in stored)
    if new_heads == count or (stored[hidden_key] * new_heads) % count:
        return narrowed
    narrowed[next(key for key in ("num_attention_heads", "n_head", "num_heads") if key in stored)] = new_heads
    narrowed[hidden_key] = stored[hidden_key] * new_heads // count
    for key in ("num_key_value_heads", "num_kv_heads"):
        if key in stored and not multi_query:
            narrowed[key] = new_heads if kv >= count else kv
    return narrowed


def _save_processor(model: ZooModel, config, tokenizer, folder: Path) -> None:
    """The tokenizer, or what turns the recipe's images or audio into the model's inputs."""
    if model.task == "automatic-speech-recognition":
        from transformers import WhisperFeatureExtractor

        WhisperFeatureExtractor(feature_size=config.num_mel_bins).save_pretrained(folder)
    elif model.task in ("image-feature-extraction", "image-classification"):
        from transformers import CLIPImageProcessor, SiglipImageProcessor, ViTImageProcessor

        size = {"height": IMAGE_SIZE, "width": IMAGE_SIZE}
        processor = {"clip_vision_model": lambda: CLIPImageProcessor(size={"shortest_edge": IMAGE_SIZE},
                                                                      crop_size=size),
                     "siglip_vision_model": lambda: SiglipImageProcessor(size=size)}.get(
            config.model_type, lambda: ViTImageProcessor(size=size))()
        processor.save_pretrained(folder)
    if tokenizer is not None:
        tokenizer.save_pretrained(folder)
