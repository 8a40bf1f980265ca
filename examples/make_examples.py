"""Regenerate the bundled example checkpoints from seeds: a tiny Llama-like decoder and a tiny BERT-like encoder.

Each is a real checkpoint folder (config.json, model.safetensors, tokenizer files, export_config.json) under
2 MB, with a tokenizer trained here on a small built-in corpus. Run: `python examples/make_examples.py`.
The recipes (export_config.json) are kept in this script so that a regenerated folder is complete.
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path

HERE = Path(__file__).resolve().parent
SEED = 1234
CORPUS = [
    "The capital of France is Paris.",
    "The quick brown fox jumps over the lazy dog.",
    "Exporting models with recipes makes deployment reproducible.",
    "ONNX, OpenVINO, ExecuTorch and torch.export are deployment formats.",
    "A recipe states the dynamic shapes, the backend options and the parity tolerances.",
    "Hello world, this is a tiny model trained on nothing at all.",
    "Numbers like 1 2 3 4 5 6 7 8 9 10 appear in text too.",
] * 8

LLAMA_RECIPE = {
    "recipe_version": 1,
    "task": "text-generation",
    "description": "Tiny random Llama for hfexport's demo and tests.",
    "default_target": "onnx-generation",
    "dims": {"batch": {"min": 1, "max": 8}, "seq": {"min": 2, "max": 128}},
    "sample_inputs": {"text": ["The capital of France is", "The quick brown fox jumps over"]},
    "targets": {
        "pt2": {
            "export_format": "dynamo",
            "mode": "forward",
            "dynamic_shapes": {"input_ids": {"0": "batch", "1": "seq"}},
        },
        "onnx-generation": {
            "export_format": "onnx",
            "mode": "generation",
            "options": {"dynamic": True},
            "parity": {"generate": {"max_new_tokens": 8}},
        },
        "openvino-generation": {
            "export_format": "openvino",
            "mode": "generation",
            "options": {"dynamic": True},
            "parity": {"generate": {"max_new_tokens": 8}},
        },
        "pte-generation": {
            "export_format": "executorch",
            "mode": "generation",
            "options": {"dynamic": True, "backend": "xnnpack"},
            "parity": {"generate": {"max_new_tokens": 8}},
        },
    },
}

BERT_RECIPE = {
    "recipe_version": 1,
    "task": "feature-extraction",
    "description": "Tiny random BERT for hfexport's demo and tests.",
    "default_target": "onnx",
    "dims": {"batch": {"min": 1, "max": 8}, "seq": {"min": 2, "max": 64}},
    "sample_inputs": {"text": ["The capital of France is Paris.", "A tiny encoder for tests."]},
    "targets": {
        "onnx": {
            "export_format": "onnx",
            "mode": "forward",
            "options": {"opset_version": 18},
            "dynamic_shapes": {"input_ids": {"0": "batch", "1": "seq"}},
        },
        "openvino": {
            "export_format": "openvino",
            "mode": "forward",
            "dynamic_shapes": {"input_ids": {"0": "batch", "1": "seq"}},
        },
        "pt2": {
            "export_format": "dynamo",
            "mode": "forward",
            "dynamic_shapes": {"input_ids": {"0": "batch", "1": "seq"}},
        },
        "pte": {
            "export_format": "executorch",
            "mode": "forward",
            "options": {"backend": "xnnpack"},
            "dynamic_shapes": {"input_ids": {"0": "batch", "1": "seq"}},
        },
    },
}


def train_tokenizer(kind: str):
    """A small tokenizer trained on CORPUS: byte-level BPE for the decoder, WordPiece for the encoder."""
    from tokenizers import Tokenizer, decoders, models, normalizers, pre_tokenizers, processors, trainers
    from transformers import PreTrainedTokenizerFast

    if kind == "bpe":
        tokenizer = Tokenizer(models.BPE(unk_token=None))
        tokenizer.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
        tokenizer.decoder = decoders.ByteLevel()
        trainer = trainers.BpeTrainer(
            vocab_size=384, special_tokens=["<s>", "</s>", "<pad>"],
            initial_alphabet=pre_tokenizers.ByteLevel.alphabet(), show_progress=False,
        )
        tokenizer.train_from_iterator(CORPUS, trainer)
        bos = tokenizer.token_to_id("<s>")
        tokenizer.post_processor = processors.TemplateProcessing(single="<s> $A", special_tokens=[("<s>", bos)])
        return PreTrainedTokenizerFast(
            tokenizer_object=tokenizer, bos_token="<s>", eos_token="</s>", pad_token="<pad>", padding_side="left"
        )
    tokenizer = Tokenizer(models.WordPiece(unk_token="[UNK]"))
    tokenizer.normalizer = normalizers.BertNormalizer(lowercase=True)
    tokenizer.pre_tokenizer = pre_tokenizers.BertPreTokenizer()
    tokenizer.decoder = decoders.WordPiece()
    trainer = trainers.WordPieceTrainer(
        vocab_size=256, special_tokens=["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]"], show_progress=False
    )
    tokenizer.train_from_iterator(CORPUS, trainer)
    cls, sep = tokenizer.token_to_id("[CLS]"), tokenizer.token_to_id("[SEP]")
    tokenizer.post_processor = processors.TemplateProcessing(
        single="[CLS] $A [SEP]", pair="[CLS] $A [SEP] $B:1 [SEP]:1", special_tokens=[("[CLS]", cls), ("[SEP]", sep)]
    )
    return PreTrainedTokenizerFast(
        tokenizer_object=tokenizer, unk_token="[UNK]", pad_token="[PAD]", cls_token="[CLS]", sep_token="[SEP]",
        mask_token="[MASK]",
    )


def _write(folder: Path, model, tokenizer, recipe: dict) -> None:
    if folder.exists():
        shutil.rmtree(folder)
    model.save_pretrained(folder)
    tokenizer.save_pretrained(folder)
    (folder / "export_config.json").write_text(json.dumps(recipe, indent=2) + "\n", encoding="utf-8")


def make_tiny_llama(folder: Path = HERE / "tiny-llama") -> Path:
    import torch
    from transformers import GenerationConfig, LlamaConfig, LlamaForCausalLM

    tokenizer = train_tokenizer("bpe")
    torch.manual_seed(SEED)
    config = LlamaConfig(
        vocab_size=len(tokenizer), hidden_size=64, intermediate_size=128, num_hidden_layers=2,
        num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=256,
        bos_token_id=tokenizer.bos_token_id, eos_token_id=tokenizer.eos_token_id, pad_token_id=tokenizer.pad_token_id,
        architectures=["LlamaForCausalLM"], tie_word_embeddings=False,
    )
    model = LlamaForCausalLM(config).eval()
    model.generation_config = GenerationConfig(
        bos_token_id=tokenizer.bos_token_id, eos_token_id=tokenizer.eos_token_id, pad_token_id=tokenizer.pad_token_id,
        do_sample=False,
    )
    _write(folder, model, tokenizer, LLAMA_RECIPE)
    return folder


def make_tiny_bert(folder: Path = HERE / "tiny-bert") -> Path:
    import torch
    from transformers import BertConfig, BertModel

    tokenizer = train_tokenizer("wordpiece")
    torch.manual_seed(SEED)
    config = BertConfig(
        vocab_size=len(tokenizer), hidden_size=64, intermediate_size=128, num_hidden_layers=2,
        num_attention_heads=4, max_position_embeddings=128, pad_token_id=tokenizer.pad_token_id,
        architectures=["BertModel"],
    )
    model = BertModel(config).eval()
    _write(folder, model, tokenizer, BERT_RECIPE)
    return folder


if __name__ == "__main__":
    for path in (make_tiny_llama(), make_tiny_bert()):
        size = sum(file.stat().st_size for file in path.rglob("*") if file.is_file())
        print(f"{path.relative_to(HERE.parent)}: {size / 1e6:.2f} MB")
