"""`model.generate` over exported prefill/decode graphs, without the torch model: greedy search and sampling.

`generate(exported, input_ids, ...)` runs the `prefill` component on the prompt, then the `decode` component
one token at a time, carrying the KV cache between calls the way `model.generate` does: a `DynamicCache` that
grows, or a fixed-size `StaticCache` (a `generation.cache_implementation: "static"` target) fed a 4D mask built
here. It works the same over all four formats because every backend's runner takes the traced forward's kwargs
and returns what the model returns; the one backend difference is OpenVINO's stateful decode, which keeps the
cache inside its infer request: it is seeded from the prefill's cache and then left to carry itself.

The options are transformers' own: a `GenerationConfig` resolved as `model.generate` resolves it
(`resolve_generation_config`), the `LogitsProcessorList` and `StoppingCriteriaList` it implies, built from
transformers' public classes (`build_logits_processor`, `build_stopping_criteria`), streamers, and the token choice
and random draws of transformers 5.23's `_sample`, so a seeded sampling run gives `model.generate`'s tokens.

`verify_generation(exported, model, inputs, max_new_tokens)` compares it token for token with
`model.generate(do_sample=False)`: the parity check of generation targets.
"""

from __future__ import annotations

import contextlib
import copy
from dataclasses import dataclass
from typing import Any

import torch

from hfexport.engine import openvino_infer, openvino_output_tensor, openvino_request
from hfexport.errors import GenerationError
from hfexport.executorch_llm import COMPONENT as LLM_PROGRAM
from hfexport.executorch_llm import is_llm_program
from hfexport import preparers
from hfexport.models import empty_cache

PREFILL, DECODE, ENCODER = "prefill", "decode", "encoder"
CACHE = "past_key_values"
# A state-space model's generate (Mamba, transformers 5.23) passes its recurrent state as `cache_params`: a
# `DynamicCache` of `LinearAttentionLayer`s (a conv state and an SSM state per layer) instead of keys and values.
STATE = "cache_params"
_KNOWN_INPUTS = {"input_ids", "attention_mask", "position_ids", CACHE, STATE}
# A vision-language model (see `hfexport.plan`, "Vision-language generation"): hfexport's `image_encoder` (a prompt's
# images -> image features) and `embed` (input_ids + image features -> inputs_embeds), then the engine's
# `language_model` (inputs_embeds -> hidden states + cache) and `lm_head` for the prefill, and its `decode`.
IMAGE_ENCODER, EMBED, LANGUAGE_MODEL, LM_HEAD = "image_encoder", "embed", "language_model", "lm_head"
_LANGUAGE_MODEL_INPUTS = {"inputs_embeds", "attention_mask", "position_ids", CACHE}
# An encoder-decoder's prefill/decode (the engine's decompose_for_generation) take the decoder tokens and the
# encoder's output; the encoder is hfexport's own `encoder` component (see `hfexport.plan`), run once per call.
_SEQ2SEQ_INPUTS = {"decoder_input_ids", "attention_mask", "encoder_outputs", CACHE}


@dataclass
class _Layout:
    """What the exported components expect, read from their traced kwargs."""

    takes_mask: bool
    mask_dtype: torch.dtype | None  # a 4D mask's dtype (static cache); None for a 2D padding mask
    static_cache_len: int | None  # StaticCache size, None for a DynamicCache
    stateful: dict[str, bool]  # per component: an OpenVINO program that keeps the cache in its infer request
    pinned_batch: int | None  # the only batch size the decode takes (see `_layout`)
    seq2seq: bool = False  # an encoder-decoder: `encoder` once, then prefill/decode over the decoder tokens
    cache_kwarg: str = CACHE  # the kwarg that carries the cache: `past_key_values`, or a Mamba's `cache_params`
    multimodal: bool = False  # a VLM: the prefill is embed -> language_model -> lm_head (see IMAGE_ENCODER)
    prefill_by_decode: bool = False  # a state-space decode without a prefill: the prompt runs through the decode
    single_graph: bool = False  # a multi-token decode without a prefill: the prompt runs on an empty cache
    llm_program: bool = False  # ExecuTorch's LLM runner program: `model(input_ids, cache_position)`, its cache inside

    @property
    def prefill(self) -> str:
        """The component that runs the prompt."""
        if self.llm_program:
            return LLM_PROGRAM
        return LANGUAGE_MODEL if self.multimodal else DECODE if self.single_graph else PREFILL


# Options of transformers' GenerationConfig that this loop does not reproduce, with the values that leave them off.
_UNSUPPORTED = {
    "guidance_scale": ((None, 1, 1.0), "classifier-free guidance runs the torch model a second time on an "
                                       "unconditional prompt"),
    "penalty_alpha": ((None, 0, 0.0), "contrastive search needs the model's hidden states"),
    "dola_layers": ((None,), "DoLa decoding needs the hidden states of inner layers"),
    "watermarking_config": ((None,), "watermarking is not wired to exported graphs"),
    "prompt_lookup_num_tokens": ((None,), "prompt-lookup (assisted) decoding verifies several tokens per step"),
    "encoder_repetition_penalty": ((None, 1, 1.0), "it penalizes the encoder's input tokens, not reproduced here"),
    "encoder_no_repeat_ngram_size": ((None, 0), "it bans the encoder's input n-grams, not reproduced here"),
    "token_healing": ((None, False), "token healing needs the tokenizer's vocabulary trie"),
    "return_dict_in_generate": ((None, False), "generate returns the token ids only"),
    "output_scores": ((None, False), "generate returns the token ids only"),
    "output_logits": ((None, False), "generate returns the token ids only"),
    "output_attentions": ((None, False), "the exported graphs return logits and the cache only"),
    "output_hidden_states": ((None, False), "the exported graphs return logits and the cache only"),
}


# transformers 5.23's global defaults (`GenerationConfig._get_default_generation_params`, a private method) for the
# fields read here: applied where neither the caller nor the export's generation config sets them, as
# `model.generate` does. (`max_length` is handled in `_max_length`: 20 new tokens.)
GLOBAL_DEFAULTS = {
    "min_length": 0, "do_sample": False, "num_beams": 1, "num_return_sequences": 1, "temperature": 1.0,
    "top_k": 50, "top_p": 1.0, "typical_p": 1.0, "epsilon_cutoff": 0.0, "eta_cutoff": 0.0,
    "repetition_penalty": 1.0, "no_repeat_ngram_size": 0, "remove_invalid_values": False,
}


DEFAULT_NEW_TOKENS = 20  # transformers' default `max_length`, counted as new tokens when nobody set a length
BEAM_SEARCH_MESSAGE = (
    "beam search (num_beams={beams}) is not implemented over exported graphs: every step reorders the KV cache by "
    "the beams kept. The formats could support it: OpenVINO stateful exports take a `beam_idx` input that reorders "
    "the cache held in the decode's state; dynamo (.pt2), ONNX, ExecuTorch and stateless OpenVINO exports return "
    "the cache as tensors, which could be reordered between steps. hfexport's generate does neither yet: use greedy "
    "decoding or sampling (num_beams=1), or the torch model's generate"
)


def resolve_generation_config(exported, generation_config=None, **kwargs):
    """The `transformers.GenerationConfig` a call runs with, merged as `model.generate` merges it: `kwargs` over
    `generation_config`, over the export's saved generation config (`exported.generation_config`), over its config's
    `eos_token_id`/`pad_token_id`, over transformers' global defaults. Raises `GenerationError` for a kwarg that is
    not a generation option and for options this loop does not reproduce (beam search among them)."""
    from transformers import GenerationConfig

    if generation_config is not None and not isinstance(generation_config, GenerationConfig):
        raise GenerationError(f"generation_config is a {type(generation_config).__name__}, not a "
                              "transformers.GenerationConfig (pass max_new_tokens=... and other options by keyword)")
    config = copy.deepcopy(generation_config) if generation_config is not None else GenerationConfig()
    saved = getattr(exported, "generation_config", None)
    try:
        if saved is not None:
            config.update(**saved.to_dict(), defaults_only=True)
        eos, pad = default_special_tokens(exported)
        config.update(eos_token_id=eos, pad_token_id=pad, defaults_only=True)
        config.update(**GLOBAL_DEFAULTS, defaults_only=True)
        unknown = config.update(**kwargs)
    except ValueError as error:  # GenerationConfig.validate: an option out of range, or options that clash
        raise GenerationError(f"invalid generation options: {error}") from error
    if unknown:
        raise GenerationError(f"{sorted(unknown)} are not generation options (see transformers.GenerationConfig); "
                              "the exported graphs take input_ids and attention_mask only")
    if config.num_beams > 1:
        raise GenerationError(BEAM_SEARCH_MESSAGE.format(beams=config.num_beams))
    for name, (off, reason) in _UNSUPPORTED.items():
        if getattr(config, name, None) not in off:
            raise GenerationError(f"{name}={getattr(config, name)!r} is not supported over exported graphs: {reason}")
    return config


def build_logits_processor(generation_config, input_ids: torch.Tensor, attention_mask: torch.Tensor | None = None,
                           logits_processor=None, prefix_allowed_tokens_fn=None):
    """The `LogitsProcessorList` `model.generate` applies for `generation_config` (resolved, see
    `resolve_generation_config`) on the prompt `input_ids`, built from transformers' public processor and warper
    classes in transformers 5.23's order; `logits_processor` entries replace a built one of their type, the others
    run after the processors and before the sampling warpers."""
    import transformers as tf

    config, prompt_len = generation_config, input_ids.shape[1]
    eos = torch.tensor(_token_ids(config.eos_token_id), dtype=torch.long) if config.eos_token_id is not None else None
    processors = tf.LogitsProcessorList()
    if config.sequence_bias is not None:
        processors.append(tf.SequenceBiasLogitsProcessor(sequence_bias=config.sequence_bias))
    if config.repetition_penalty is not None and config.repetition_penalty != 1.0:
        padding = (attention_mask != 0).int().argmax(dim=1) if attention_mask is not None else None
        processors.append(tf.RepetitionPenaltyLogitsProcessor(config.repetition_penalty, prompt_ignore_length=padding))
    if config.no_repeat_ngram_size:
        processors.append(tf.NoRepeatNGramLogitsProcessor(config.no_repeat_ngram_size))
    if config.bad_words_ids is not None:
        processors.append(tf.NoBadWordsLogitsProcessor(config.bad_words_ids, eos))
    if config.min_length and eos is not None:
        processors.append(tf.MinLengthLogitsProcessor(config.min_length, eos))
    if config.min_new_tokens and eos is not None:
        processors.append(tf.MinNewTokensLengthLogitsProcessor(prompt_len, config.min_new_tokens, eos))
    if prefix_allowed_tokens_fn is not None:
        processors.append(tf.PrefixConstrainedLogitsProcessor(prefix_allowed_tokens_fn, config.num_beams))
    if config.forced_bos_token_id is not None:
        processors.append(tf.ForcedBOSTokenLogitsProcessor(config.forced_bos_token_id))
    if config.forced_eos_token_id is not None:
        processors.append(tf.ForcedEOSTokenLogitsProcessor(config.max_length, config.forced_eos_token_id))
    if config.remove_invalid_values is True:
        processors.append(tf.InfNanRemoveLogitsProcessor())
    if config.exponential_decay_length_penalty is not None:
        processors.append(tf.ExponentialDecayLengthPenalty(config.exponential_decay_length_penalty, eos, prompt_len))
    if config.suppress_tokens is not None:
        processors.append(tf.SuppressTokensLogitsProcessor(config.suppress_tokens))
    if config.begin_suppress_tokens is not None:
        processors.append(tf.SuppressTokensAtBeginLogitsProcessor(config.begin_suppress_tokens, prompt_len))
    processors = _merged(processors, logits_processor)
    if config.do_sample:
        if config.temperature is not None and config.temperature != 1.0:
            processors.append(tf.TemperatureLogitsWarper(config.temperature))
        if config.top_h is not None:
            processors.append(tf.TopHLogitsWarper(top_h=config.top_h))
        if config.top_k is not None and config.top_k != 0:
            processors.append(tf.TopKLogitsWarper(top_k=config.top_k))
        if config.top_p is not None and config.top_p < 1.0:
            processors.append(tf.TopPLogitsWarper(top_p=config.top_p))
        if config.min_p is not None:
            processors.append(tf.MinPLogitsWarper(min_p=config.min_p))
        if config.typical_p is not None and config.typical_p < 1.0:
            processors.append(tf.TypicalLogitsWarper(mass=config.typical_p))
        if config.epsilon_cutoff is not None and 0.0 < config.epsilon_cutoff < 1.0:
            processors.append(tf.EpsilonLogitsWarper(epsilon=config.epsilon_cutoff))
        if config.eta_cutoff is not None and 0.0 < config.eta_cutoff < 1.0:
            processors.append(tf.EtaLogitsWarper(epsilon=config.eta_cutoff))
    if config.renormalize_logits is True:
        processors.append(tf.LogitNormalization())
    return processors


def build_stopping_criteria(generation_config, max_length: int, stopping_criteria=None, tokenizer=None,
                            max_position_embeddings: int | None = None):
    """The `StoppingCriteriaList` `model.generate` stops on: `MaxLengthCriteria(max_length)` (prompt + new tokens),
    `MaxTimeCriteria`, `StopStringCriteria` (needs `tokenizer`), `EosTokenCriteria`, with `stopping_criteria` merged
    in (an entry replaces a built one of its type; the others are added)."""
    import transformers as tf

    config = generation_config
    criteria = tf.StoppingCriteriaList()
    criteria.append(tf.MaxLengthCriteria(max_length=max_length, max_position_embeddings=max_position_embeddings))
    if config.max_time is not None:
        criteria.append(tf.MaxTimeCriteria(max_time=config.max_time))
    if config.stop_strings is not None:
        if tokenizer is None:
            raise GenerationError("stop_strings need the model's tokenizer: pass tokenizer=...")
        criteria.append(tf.StopStringCriteria(stop_strings=config.stop_strings, tokenizer=tokenizer))
    if config.eos_token_id is not None:
        criteria.append(tf.EosTokenCriteria(eos_token_id=_token_ids(config.eos_token_id)))
    return _merged(criteria, stopping_criteria)


def _merged(built, custom):
    """`built` with each entry of `custom` in place of a built one of the same type, then the rest of `custom`
    (what `model.generate` does with its `logits_processor` / `stopping_criteria` arguments)."""
    if not custom:
        return built
    merged = type(built)()
    for entry in built:
        merged.append(next((mine for mine in custom if type(mine) is type(entry)), entry))
    merged.extend(mine for mine in custom if mine not in merged)
    return merged


def generate(
    exported,
    input_ids: torch.Tensor | None = None,
    attention_mask: torch.Tensor | None = None,
    generation_config=None,
    logits_processor=None,
    stopping_criteria=None,
    streamer=None,
    generator: torch.Generator | None = None,
    seed: int | None = None,
    tokenizer=None,
    prefix_allowed_tokens_fn=None,
    **kwargs,
) -> torch.LongTensor:
    """`model.generate` for a decoder-only model, over `exported` (an `ExportedModel` with `prefill` and `decode`
    components): greedy search or multinomial sampling. See `ExportedModel.generate` for the arguments.

    Returns prompt + generated tokens, `[batch * num_return_sequences, prompt + n]`.
    """
    input_features = kwargs.pop("input_features", None)
    decoder_input_ids = kwargs.pop("decoder_input_ids", None)
    images = {name: kwargs.pop(name) for name in image_input_names(exported) if name in kwargs}
    nothing_new = kwargs.get("max_new_tokens") is not None and kwargs["max_new_tokens"] < 1
    if nothing_new:  # transformers refuses max_new_tokens=0; here it returns the prompt
        kwargs.pop("max_new_tokens")
    config = resolve_generation_config(exported, generation_config, **kwargs)
    layout = _layout(exported)
    if layout.seq2seq:
        return _generate_seq2seq(exported, layout, config, input_ids, attention_mask, input_features,
                                 decoder_input_ids, nothing_new, logits_processor=logits_processor,
                                 stopping_criteria=stopping_criteria, streamer=streamer, generator=generator,
                                 seed=seed, tokenizer=tokenizer, prefix_allowed_tokens_fn=prefix_allowed_tokens_fn)
    if input_features is not None or decoder_input_ids is not None:
        raise GenerationError("input_features / decoder_input_ids are encoder-decoder inputs; this export is a "
                              "decoder-only prefill/decode")
    if input_ids is None:
        raise GenerationError("generate needs input_ids (the prompts)")
    input_ids = torch.as_tensor(input_ids, dtype=torch.long)
    if input_ids.dim() == 1:
        input_ids = input_ids.unsqueeze(0)
    if not layout.multimodal:  # a vision-language prompt's image placeholder id may lie past the text vocabulary
        _check_token_ids(exported, input_ids)
    inputs_embeds = _image_text_embeds(exported, input_ids, images) if layout.multimodal else None
    if attention_mask is None:
        attention_mask = torch.ones_like(input_ids)
    attention_mask = torch.as_tensor(attention_mask, dtype=torch.long)
    if attention_mask.shape != input_ids.shape:
        raise GenerationError(
            f"attention_mask has shape {tuple(attention_mask.shape)}, input_ids {tuple(input_ids.shape)}"
        )
    if not layout.takes_mask and not bool(attention_mask.all()):
        raise GenerationError(
            "this export was traced without an attention_mask, so it cannot run padded prompts: export it from a "
            "padded batch (sample_inputs with prompts of different lengths), or pass unpadded rows"
        )
    if seed is not None:
        if generator is not None:
            raise GenerationError("pass a seed or a generator, not both")
        generator = torch.Generator().manual_seed(seed)
    if config.num_return_sequences > 1:  # as model.generate expands its inputs: each prompt's copies side by side
        input_ids = input_ids.repeat_interleave(config.num_return_sequences, dim=0)
        attention_mask = attention_mask.repeat_interleave(config.num_return_sequences, dim=0)
        if inputs_embeds is not None:
            inputs_embeds = inputs_embeds.repeat_interleave(config.num_return_sequences, dim=0)
    batch, prompt_len = input_ids.shape
    max_length = config.max_length = _max_length(config, prompt_len, exported)  # as model.generate sets it
    if layout.static_cache_len is not None and max_length - 1 > layout.static_cache_len:
        raise GenerationError(
            f"the static cache holds {layout.static_cache_len} tokens: a prompt of {prompt_len} plus "
            f"{max_length - prompt_len} new tokens needs {max_length - 1} (raise generation.max_cache_len)"
        )
    rows = layout.pinned_batch or batch
    chunks = range(0, batch, rows)
    if streamer is not None and len(chunks) > 1:
        raise GenerationError(f"a streamer takes one batch; this export's decode runs {rows} rows at a time "
                              f"(a static cache traced at batch {rows}), so pass at most {rows} prompts")
    if streamer is not None:
        streamer.put(input_ids.cpu())
    if nothing_new or max_length <= prompt_len:
        if streamer is not None:
            streamer.end()
        return input_ids.clone()
    run = dict(config=config, max_length=max_length, logits_processor=logits_processor,
               stopping_criteria=stopping_criteria, streamer=streamer, generator=generator, tokenizer=tokenizer,
               prefix_allowed_tokens_fn=prefix_allowed_tokens_fn)
    if rows == batch:
        sequences = _decode(exported, layout, input_ids, attention_mask, real=batch, inputs_embeds=inputs_embeds,
                            **run)
    else:
        # A decode that only takes its traced batch: run chunks of that size, the last one filled up with copies of
        # its last row (rows are independent), and drop the copies.
        outputs = []
        for first in chunks:
            ids, mask = input_ids[first : first + rows], attention_mask[first : first + rows]
            embeds = inputs_embeds[first : first + rows] if inputs_embeds is not None else None
            real = ids.shape[0]
            if real < rows:
                ids = torch.cat([ids, ids[-1:].expand(rows - real, -1)])
                mask = torch.cat([mask, mask[-1:].expand(rows - real, -1)])
                if embeds is not None:
                    embeds = torch.cat([embeds, embeds[-1:].expand(rows - real, -1, -1)])
            outputs.append(_decode(exported, layout, ids, mask, real=real, inputs_embeds=embeds, **run)[:real])
        width = max(chunk.shape[1] for chunk in outputs)
        pad = _pad_token(config)
        # A chunk whose rows all stopped early is shorter: its rows would have emitted pad tokens from there.
        sequences = torch.cat([torch.nn.functional.pad(chunk, (0, width - chunk.shape[1]), value=pad or 0)
                               for chunk in outputs])
    if streamer is not None:
        streamer.end()
    return sequences


def _generate_seq2seq(exported, layout: _Layout, config, input_ids, attention_mask, input_features,
                      decoder_input_ids, nothing_new: bool, *, seed, generator, streamer, **run) -> torch.LongTensor:
    """`model.generate` for an encoder-decoder: the `encoder` component once on `input_ids`/`attention_mask` (or
    `input_features`), then the decoder loop from `decoder_input_ids` (default: `decoder_start_token_id`, plus the
    `forced_decoder_ids` of the generation config) over prefill/decode, each fed the encoder's output, its padding
    mask and the self- and cross-attention cache. Returns the decoder sequences, as `model.generate` does."""
    encoder_kwargs = {}
    if input_features is not None:
        encoder_kwargs["input_features"] = torch.as_tensor(input_features)
        batch = encoder_kwargs["input_features"].shape[0]
    else:
        if input_ids is None:
            raise GenerationError("an encoder-decoder export generates from input_ids (or input_features)")
        input_ids = torch.as_tensor(input_ids, dtype=torch.long)
        if input_ids.dim() == 1:
            input_ids = input_ids.unsqueeze(0)
        _check_token_ids(exported, input_ids)
        encoder_kwargs["input_ids"] = input_ids
        batch = input_ids.shape[0]
    if attention_mask is not None:
        attention_mask = torch.as_tensor(attention_mask, dtype=torch.long)
    elif input_ids is not None and input_features is None:
        attention_mask = torch.ones_like(input_ids)
    if attention_mask is not None:
        encoder_kwargs["attention_mask"] = attention_mask
    traced = exported.runners[ENCODER].metadata.kwargs
    missing = [name for name in traced if name not in encoder_kwargs]
    if missing:
        raise GenerationError(f"the encoder component takes {missing}; pass them to generate")
    encoder_kwargs = {name: value for name, value in encoder_kwargs.items() if name in traced}
    if seed is not None:
        if generator is not None:
            raise GenerationError("pass a seed or a generator, not both")
        generator = torch.Generator().manual_seed(seed)
    if config.num_return_sequences > 1:
        encoder_kwargs = {name: value.repeat_interleave(config.num_return_sequences, dim=0)
                          for name, value in encoder_kwargs.items()}
        attention_mask = encoder_kwargs.get("attention_mask")
        batch *= config.num_return_sequences
    encoder_outputs = exported.runners[ENCODER](**encoder_kwargs)
    if decoder_input_ids is None:
        decoder_input_ids = torch.tensor([decoder_prompt(exported, config)] * batch, dtype=torch.long)
    decoder_input_ids = torch.as_tensor(decoder_input_ids, dtype=torch.long)
    prompt_len = decoder_input_ids.shape[1]
    max_length = config.max_length = _max_length(config, prompt_len, exported)
    if streamer is not None:
        streamer.put(decoder_input_ids.cpu())
    if nothing_new or max_length <= prompt_len:
        if streamer is not None:
            streamer.end()
        return decoder_input_ids.clone()
    decoder_mask = torch.ones_like(decoder_input_ids)
    sequences = _decode(exported, layout, decoder_input_ids, decoder_mask, real=batch, config=config,
                        max_length=max_length, streamer=streamer, generator=generator,
                        encoder=(encoder_outputs, attention_mask), **run)
    if streamer is not None:
        streamer.end()
    if getattr(exported.config, "model_type", None) == "whisper":
        # transformers 5.23's WhisperForConditionalGeneration.generate returns the new tokens only (it strips its
        # decoder prompt: the start token and the forced language/task tokens).
        return sequences[:, prompt_len:]
    return sequences


def as_traced(runner, kwargs: dict) -> dict:
    """`kwargs` as the component was traced: an input the graph took as a Python list (transformers' `image_sizes`
    export input preparer turns the processor's tensor into `(height, width)` int tuples before tracing, so the graph
    is specialized on them) is fed its tensor's values the same way."""
    traced = runner.metadata.kwargs
    return {name: [tuple(int(v) for v in row) for row in value.tolist()]
            if isinstance(value, torch.Tensor) and (traced.get(name) or {}).get("container") == "list" else value
            for name, value in kwargs.items()}


def image_input_names(exported) -> list[str]:
    """The inputs a VLM export's `image_encoder` takes from the caller (`pixel_values`, ...; not those the engine's
    input preparers compute from them, `hfexport.preparers`); none for other exports."""
    components = getattr(exported, "components", {})
    if IMAGE_ENCODER not in components:
        return []
    added = set(getattr(exported, "input_preparers", {}).get(IMAGE_ENCODER, {}).get("added", ()))
    return [name for name in components[IMAGE_ENCODER].metadata.kwargs if name not in added]


def _image_text_embeds(exported, input_ids: torch.Tensor, images: dict) -> torch.Tensor:
    """A VLM prompt's `inputs_embeds`: the `image_encoder` on each prompt's images in turn (it is traced on one
    prompt's images, see `hfexport.plan._image_stages`), their features concatenated in order, then `embed`, which
    scatters them into the token embeddings at the image tokens. Both are exported graphs: no torch model runs."""
    names = image_input_names(exported)
    missing = [name for name in names if name not in images]
    if missing:
        raise GenerationError(f"this vision-language export generates from images: pass {missing} (the processor's "
                              f"outputs) with the prompts; it got {sorted(images) or 'none'}")
    images = {name: torch.as_tensor(images[name]) for name in names}
    counts = {int(value.shape[0]) for value in images.values()}
    if len(counts) != 1:
        raise GenerationError(f"the image inputs {names} differ in their first axis: "
                              f"{', '.join(f'{k}: {list(v.shape)}' for k, v in images.items())}")
    encoder = exported.runners[IMAGE_ENCODER]
    traced = int(encoder.metadata.kwargs[names[0]]["shape"][0])
    count = counts.pop()
    step = traced if traced > 1 and count % traced == 0 else 1
    recorded = getattr(exported, "input_preparers", {}).get(IMAGE_ENCODER)
    features = []
    for first in range(0, count, step):
        chunk = {name: value[first : first + step] for name, value in images.items()}
        if recorded:  # what the engine's input preparers computed at export, computed from these images
            chunk = preparers.prepare(recorded, chunk)
        out = encoder(**as_traced(encoder, {name: value.to(encoder.device) if isinstance(value, torch.Tensor)
                                            else value for name, value in chunk.items()}))
        features.append(_only_tensor(out).cpu())
    features = torch.cat(features)
    embed = exported.runners[EMBED]
    return _only_tensor(embed(input_ids=input_ids.to(embed.device),
                              image_features=features.to(embed.device))).cpu()


def _lm_head_logits(exported, hidden_states: torch.Tensor) -> torch.Tensor:
    """The `lm_head` component on the language model's hidden states (its one input is named as traced)."""
    runner = exported.runners[LM_HEAD]
    (name,) = runner.metadata.kwargs
    return _only_tensor(runner(**{name: hidden_states.to(runner.device)}))


def _only_tensor(outputs) -> torch.Tensor:
    """A component's one output tensor (a runner returns it as traced: a tensor, or a tuple/output of one)."""
    if isinstance(outputs, torch.Tensor):
        return outputs
    values = list(outputs.values()) if hasattr(outputs, "values") else list(outputs)
    if len(values) != 1 or not isinstance(values[0], torch.Tensor):
        raise GenerationError(f"expected one output tensor, got {type(outputs).__name__}")
    return values[0]


def decoder_prompt(exported, config) -> list[int]:
    """The decoder tokens an encoder-decoder's generate starts from: `decoder_start_token_id` (generation config,
    then model config, then BOS), then the `forced_decoder_ids` in position order (Whisper's language/task tokens)."""
    sources = [config, getattr(exported, "generation_config", None), getattr(exported, "config", None)]
    start = next((getattr(s, "decoder_start_token_id") for s in sources
                  if getattr(s, "decoder_start_token_id", None) is not None), None)
    if start is None:
        start = next((getattr(s, "bos_token_id") for s in sources if getattr(s, "bos_token_id", None) is not None), None)
    if start is None:
        raise GenerationError("no decoder_start_token_id in the export's generation config or config: pass "
                              "decoder_input_ids")
    tokens = [int(_token_ids(start)[0])]
    forced = getattr(config, "forced_decoder_ids", None) or []
    for position, token in sorted(forced):
        if position == len(tokens) and token is not None:
            tokens.append(int(token))
    return tokens


def _check_token_ids(exported, input_ids: torch.Tensor) -> None:
    """Refuse prompt ids outside the vocabulary before a graph runs: the runtimes' embedding lookups report them as
    their own index errors (ONNX Runtime: "indices element out of data bounds"), or not at all."""
    config = getattr(exported, "config", None)
    text_config = config.get_text_config() if hasattr(config, "get_text_config") else config
    vocab_size = getattr(text_config, "vocab_size", None)
    if not input_ids.numel() or not isinstance(vocab_size, int):
        return
    low, high = int(input_ids.min()), int(input_ids.max())
    if low < 0 or high >= vocab_size:
        bad = low if low < 0 else high
        raise GenerationError(f"input_ids holds token id {bad}, outside the model's vocabulary (0..{vocab_size - 1})")


def _max_length(config, prompt_len: int, exported) -> int:
    """Prompt + new tokens, as `model.generate` reads it: `max_new_tokens`, else `max_length` (a total), else 20 new
    tokens capped at the model's `max_position_embeddings`."""
    if config.max_new_tokens is not None:
        return prompt_len + config.max_new_tokens
    if config.max_length is not None:
        return config.max_length
    limit = getattr(getattr(exported, "config", None), "max_position_embeddings", None)
    return min(prompt_len + DEFAULT_NEW_TOKENS, limit) if limit else prompt_len + DEFAULT_NEW_TOKENS


def _pad_token(config) -> int | None:
    """`pad_token_id`, else the first EOS token (`model.generate`'s fallback)."""
    if config.pad_token_id is not None:
        return int(config.pad_token_id)
    eos = _token_ids(config.eos_token_id)
    return eos[0] if eos else None


# Torch threads for each step's token choice (logits processors, softmax/argmax, stopping criteria): vocabulary-sized
# vectors, which torch splits over its thread pool (past 32768 elements). Its OpenMP workers then need a core at every
# op and spin after it, next to the runtime's own workers that run the graphs: on SmolLM2-135M (2 shared cores) the
# processors alone took 0.4-1.3 s of a 2.8-3.7 s ONNX generation at batch 1 with torch's default threads.
# (benchmarks/smollm2_vs_optimum.py). None leaves torch's setting.
TOKEN_CHOICE_THREADS: int | None = 1


@contextlib.contextmanager
def _token_choice_threads():
    """Torch at `TOKEN_CHOICE_THREADS` threads for the block, then back, also on an exception (inside another such
    block: nothing to switch)."""
    before = torch.get_num_threads()
    change = TOKEN_CHOICE_THREADS is not None and TOKEN_CHOICE_THREADS != before
    if change:
        torch.set_num_threads(TOKEN_CHOICE_THREADS)
    try:
        yield
    finally:
        if change:
            torch.set_num_threads(before)


def _decode(exported, layout: _Layout, input_ids, attention_mask, *, real: int, config, max_length: int,
            logits_processor, stopping_criteria, streamer, generator, tokenizer,
            prefix_allowed_tokens_fn, encoder=None, inputs_embeds=None) -> torch.LongTensor:
    """transformers 5.23's `_sample` loop (greedy when `do_sample` is off) for one batch the components accept:
    the same processors, token choice, random draws (`torch.multinomial` on the softmax, one per step), padding of
    finished rows, stopping criteria and streamer calls. `real`: rows that are not chunk filler (streamed, and
    deciding when to stop)."""
    processors = build_logits_processor(config, input_ids, attention_mask, logits_processor, prefix_allowed_tokens_fn)
    criteria = build_stopping_criteria(config, max_length, stopping_criteria, tokenizer,
                                       getattr(exported.config, "max_position_embeddings", None))
    pads = any(hasattr(criterion, "eos_token_id") for criterion in criteria)
    pad = _pad_token(config)
    if pads and pad is None:
        raise GenerationError("an EOS stopping criterion needs a pad_token_id for the rows that finished")
    batch = input_ids.shape[0]
    session = _Session(exported, layout, batch, encoder, inputs_embeds)
    positions = (attention_mask.cumsum(-1) - 1).masked_fill(attention_mask == 0, 0)
    logits = session.prefill(input_ids, attention_mask, positions)

    sequences = input_ids
    unfinished = torch.ones(batch, dtype=torch.bool)
    # The token choice at `TOKEN_CHOICE_THREADS`: set once for the whole loop where the graphs run in a runtime of
    # their own (ONNX Runtime, OpenVINO, ExecuTorch); a `.pt2`'s graphs run in torch, at torch's own setting, so
    # there it is set around each step's token choice only.
    with contextlib.nullcontext() if _runs_in_torch(exported) else _token_choice_threads():
        while True:
            with _token_choice_threads():  # a `.pt2`'s per-step switch (else already set: nothing to do)
                scores = processors(sequences, logits[:, -1, :].to(dtype=torch.float32, copy=True))
                if config.do_sample:
                    probs = torch.nn.functional.softmax(scores, dim=-1)
                    # Only the real rows draw (chunk filler repeats the last one), so the draws are model.generate's.
                    next_tokens = torch.multinomial(probs[:real], num_samples=1, generator=generator).squeeze(1)
                    next_tokens = torch.cat([next_tokens, next_tokens[-1:].expand(batch - real)])
                else:
                    next_tokens = torch.argmax(scores, dim=-1)
                if pads:
                    next_tokens = torch.where(unfinished, next_tokens, torch.full_like(next_tokens, pad))
                sequences = torch.cat([sequences, next_tokens[:, None]], dim=-1)
                unfinished &= ~criteria(sequences, None)
            if streamer is not None:
                streamer.put(next_tokens[:real].cpu())
            if not bool(unfinished[:real].any()):
                break
            attention_mask = torch.cat([attention_mask, attention_mask.new_ones((batch, 1))], dim=-1)
            positions = positions[:, -1:] + 1
            logits = session.step(DECODE, next_tokens[:, None], attention_mask, positions)
    return sequences


def _runs_in_torch(exported) -> bool:
    """Whether the export's graphs run in torch (a dynamo `.pt2`) rather than in a runtime of their own."""
    return str(exported.export_format) == "dynamo"


def verify_generation(exported, model, inputs: dict, max_new_tokens: int) -> dict:
    """Greedy tokens of `exported` against `model.generate(**inputs, do_sample=False)`, for the report.

    `{"passed", "max_new_tokens", "token_agreement" (generated tokens that agree before their row's first
    divergence, over all generated positions), "first_divergence" (None, or the earliest one: {"row", "position"
    (index among the generated tokens), "expected", "got"}),
    "reference_tokens", "exported_tokens"}`; the token lists hold the generated tokens only, per row.
    """
    input_ids = inputs["input_ids"]
    attention_mask = inputs.get("attention_mask")
    eos, pad = default_special_tokens(exported, model)
    with torch.no_grad():
        reference = model.generate(
            input_ids=input_ids, attention_mask=attention_mask, do_sample=False, max_new_tokens=max_new_tokens,
            eos_token_id=eos, pad_token_id=pad,
        )
    produced = generate(exported, input_ids, attention_mask, do_sample=False, max_new_tokens=max_new_tokens,
                        eos_token_id=eos, pad_token_id=pad)
    prompt = input_ids.shape[1]
    expected, got = reference[:, prompt:].tolist(), produced[:, prompt:].tolist()
    agreeing = compared = 0
    first = None
    for row, (want, have) in enumerate(zip(expected, got)):
        agree = 0
        while agree < min(len(want), len(have)) and want[agree] == have[agree]:
            agree += 1
        agreeing += agree
        compared += max(len(want), len(have))
        if agree < max(len(want), len(have)) and (first is None or agree < first["position"]):
            first = {"row": row, "position": agree, "expected": want[agree] if agree < len(want) else None,
                     "got": have[agree] if agree < len(have) else None}
    return {
        "passed": first is None,
        "max_new_tokens": max_new_tokens,
        "token_agreement": agreeing / compared if compared else 1.0,
        "first_divergence": first,
        "reference_tokens": expected,
        "exported_tokens": got,
    }


def default_special_tokens(exported, model=None) -> tuple[Any, int | None]:
    """`(eos_token_id, pad_token_id)` from the export's generation config, then its config (then the model's)."""
    sources = [getattr(exported, "generation_config", None), getattr(exported, "config", None)]
    if model is not None:
        sources += [getattr(model, "generation_config", None), getattr(model, "config", None)]
    def first(field: str):
        return next((getattr(s, field) for s in sources if getattr(s, field, None) is not None), None)

    return first("eos_token_id"), first("pad_token_id")


def _token_ids(value) -> list[int]:
    if value is None:
        return []
    if isinstance(value, int):
        return [value]
    if isinstance(value, torch.Tensor):
        return [int(v) for v in value.flatten().tolist()]
    return [int(v) for v in value]


def _layout(exported) -> _Layout:
    components = getattr(exported, "components", {})
    if list(components) == [LLM_PROGRAM] and is_llm_program(exported.runners[LLM_PROGRAM].metadata):
        # ExecuTorch's LLM runner program (hfexport.executorch_llm): batch 1 (the chunks of `generate`), the prompt
        # without its left padding at positions from 0, then one token per step; the cache stays in the program.
        size = int(exported.runners[LLM_PROGRAM].metadata.export_config.get("max_seq_len") or 0) or None
        return _Layout(takes_mask=True, mask_dtype=None, static_cache_len=size, stateful={LLM_PROGRAM: False},
                       pinned_batch=1, llm_program=True)
    multimodal = EMBED in components or LANGUAGE_MODEL in components
    if multimodal:
        missing = [name for name in (IMAGE_ENCODER, EMBED, LANGUAGE_MODEL, LM_HEAD, DECODE) if name not in components]
        if missing:
            raise GenerationError(
                f"a vision-language generation export needs `image_encoder`, `embed`, `language_model`, `lm_head` and "
                f"`decode`; this one lacks {missing} (has {list(components)}): re-export it with hfexport, whose "
                "mode `generation` exports the image encoder and the embedding merge beside the engine's components")
    missing = [] if multimodal else [name for name in (PREFILL, DECODE) if name not in components]
    by_decode = missing == [PREFILL] and STATE in exported.runners[DECODE].metadata.kwargs
    single_graph = missing == [PREFILL] and not by_decode and CACHE in exported.runners[DECODE].metadata.kwargs
    if missing and not by_decode and not single_graph:
        raise GenerationError(
            f"generation needs `prefill` and `decode` components; this export has {list(components)} "
            "(export it with mode `generation`)"
        )
    runners = exported.runners
    seq2seq = not multimodal and PREFILL in runners and "decoder_input_ids" in runners[PREFILL].metadata.kwargs
    if seq2seq:
        return _seq2seq_layout(exported, runners)
    prefill = LANGUAGE_MODEL if multimodal else DECODE if by_decode or single_graph else PREFILL
    for name in dict.fromkeys((prefill, DECODE)):
        allowed = _LANGUAGE_MODEL_INPUTS if name == LANGUAGE_MODEL else _KNOWN_INPUTS
        traced = runners[name].metadata.kwargs
        # a kwarg traced as None (MiniCPM-V's `downsample_mode`) is a constant of the graph, not an input to feed
        unknown = sorted(key for key in set(traced) - allowed if traced[key].get("container") != "NoneType")
        if unknown:
            raise GenerationError(f"the {name} component takes {unknown}, which hfexport's generate does not feed")
        if name != LANGUAGE_MODEL and "input_ids" not in runners[name].metadata.kwargs:
            raise GenerationError(
                f"the {name} component takes no input_ids (traced: {list(runners[name].metadata.kwargs)})"
            )
    traced = runners[DECODE].metadata.kwargs
    cache_kwarg = STATE if STATE in traced or STATE in runners[prefill].metadata.kwargs else CACHE
    if cache_kwarg == STATE and CACHE in traced:
        raise GenerationError(f"the decode component takes both {CACHE} and {STATE}")
    mask = traced.get("attention_mask") if _fed(traced, "attention_mask") else None
    # Padded prompts need a mask in the prefill or the decode (a state-space decode takes none: its prefill does,
    # and without a prefill `_Session` zeroes a row's state while it is padding).
    takes_mask = mask is not None or by_decode or _fed(runners[prefill].metadata.kwargs, "attention_mask")
    mask_dtype = getattr(torch, mask["dtype"]) if mask is not None and mask.get("rank") == 4 else None
    cache = traced.get(cache_kwarg, {})
    static_len = None
    if cache.get("container") == "StaticCache":
        if mask_dtype is not None:
            static_len = int(mask["shape"][-1])
        else:
            static_len = getattr(getattr(exported, "generation_config", None), "max_cache_len", None)
            if static_len is None:
                raise GenerationError("a static-cache export whose cache size cannot be read (no 4D mask traced)")
    elif cache and cache.get("container") != "DynamicCache":
        raise GenerationError(f"the decode component takes a {cache.get('container')}; generate handles DynamicCache "
                              "and StaticCache")
    if single_graph and (static_len is not None or traced["input_ids"].get("shape", [0, 0])[1] == 1):
        what = "a static cache" if static_len is not None else "one token per step"
        raise GenerationError(f"this export has a decode and no prefill, and its decode takes {what}: generate runs "
                              "a prompt only on a multi-token decode over a DynamicCache (generation.single_graph); "
                              "export the prefill too")
    stateful = {PREFILL: not by_decode and _is_stateful(runners[prefill]), DECODE: _is_stateful(runners[DECODE])}
    if static_len is not None and stateful[DECODE]:
        raise GenerationError(
            "this OpenVINO export keeps a static cache as internal state (stateful=True), which transformers 5.23 "
            "exports wrong: the cache's write position becomes a constant. Re-export it with options.stateful: false"
        )
    pinned_batch = None
    if static_len is not None and str(exported.export_format) in ("dynamo", "executorch"):
        # transformers 5.23: a StaticLayer's `batch_size` is part of the cache's pytree context, so the decode's
        # input spec accepts the traced batch size only (torch.export and ExecuTorch check the spec).
        pinned_batch = int(traced["input_ids"]["shape"][0])
    return _Layout(
        takes_mask=takes_mask,
        mask_dtype=mask_dtype,
        static_cache_len=static_len,
        stateful=stateful,
        pinned_batch=pinned_batch,
        cache_kwarg=cache_kwarg,
        multimodal=multimodal,
        prefill_by_decode=by_decode,
        single_graph=single_graph,
    )


def _seq2seq_layout(exported, runners) -> _Layout:
    """An encoder-decoder's layout: an `encoder` component, and prefill/decode over the decoder tokens."""
    if ENCODER not in exported.components:
        raise GenerationError(
            "this encoder-decoder export has prefill/decode but no `encoder` component: re-export it with hfexport "
            "(mode `generation` exports the encoder beside them)")
    for name in (PREFILL, DECODE):
        unknown = sorted(set(runners[name].metadata.kwargs) - _SEQ2SEQ_INPUTS)
        if unknown:
            raise GenerationError(f"the {name} component takes {unknown}, which hfexport's generate does not feed")
    cache = runners[DECODE].metadata.kwargs.get(CACHE, {})
    if cache.get("container") != "EncoderDecoderCache":
        raise GenerationError(f"the decode component takes a {cache.get('container')}; an encoder-decoder's generate "
                              "handles EncoderDecoderCache (of DynamicCache)")
    stateful = {name: _is_stateful(runners[name]) for name in (PREFILL, DECODE)}
    if stateful[DECODE]:
        raise GenerationError(
            "this OpenVINO encoder-decoder export keeps its cache as internal state (stateful=True), which "
            "transformers 5.23 exports for the sample's encoder length only: the cross-attention state's length is "
            "pinned to it. Re-export it with options.stateful: false (hfexport's default for encoder-decoders)")
    return _Layout(takes_mask=True, mask_dtype=None, static_cache_len=None, stateful=stateful, pinned_batch=None,
                   seq2seq=True)


def _is_stateful(runner) -> bool:
    """An OpenVINO program whose cache became internal state (`OpenVINOConfig.stateful`): its infer request holds
    variables. (A prefill traced on an empty cache has no cache inputs either, but no state.)"""
    request = getattr(runner, "request", None)
    return request is not None and hasattr(request, "query_state") and len(request.query_state()) > 0


class _Session:
    """One generation: the cache between calls, and which OpenVINO request holds it as state."""

    def __init__(self, exported, layout: _Layout, batch: int, encoder=None, inputs_embeds=None):
        self.exported, self.layout, self.batch = exported, layout, batch
        self.encoder = encoder  # seq2seq: (encoder outputs, encoder padding mask)
        self.inputs_embeds = inputs_embeds  # a VLM's prompt embeddings, image features merged in (the prefill's input)
        self.cache = self._new_cache(exported, layout, batch)
        self.state_owner: str | None = None
        self.filled = 0  # cache slots written so far (static cache: where the next tokens go)

    @staticmethod
    def _new_cache(exported, layout: _Layout, batch: int):
        from transformers import DynamicCache, EncoderDecoderCache, StaticCache

        if layout.llm_program:
            return None
        if layout.prefill_by_decode:
            return zero_state(exported, batch)
        if layout.single_graph:  # a stateful OpenVINO decode starts from its variables' zero-length init instead
            return None if layout.stateful[DECODE] else empty_cache(exported.config, batch, _export_dtype(exported))
        if layout.cache_kwarg not in exported.runners[layout.prefill].metadata.kwargs:
            return None
        if layout.seq2seq:
            return EncoderDecoderCache(DynamicCache(config=exported.config), DynamicCache(config=exported.config))
        if layout.static_cache_len is not None:
            return StaticCache(config=exported.config, max_cache_len=layout.static_cache_len)
        return DynamicCache(config=exported.config)

    def prefill(self, input_ids, attention_mask, positions) -> torch.Tensor:
        """The prompt's logits: the prefill component, the decode on an empty cache (`single_graph`), or
        (`prefill_by_decode`) the decode on one token at a time."""
        if self.layout.llm_program:
            real = attention_mask[0].bool()
            if bool((real[1:].int() < real[:-1].int()).any()):
                raise GenerationError("this ExecuTorch LLM program takes left padding only (a 0 after a 1 in "
                                      "attention_mask): pad on the left (padding_side='left')")
            return self._llm_run(input_ids[:, real])
        if self.layout.single_graph:
            return self.step(DECODE, input_ids, attention_mask, positions)
        if not self.layout.prefill_by_decode:
            return self.step(PREFILL, input_ids, attention_mask, positions)
        real = attention_mask.bool()
        if bool((real[:, 1:] < real[:, :-1]).any()):
            raise GenerationError("this export runs the prompt through its decode, which takes left padding only "
                                  "(a 0 after a 1 in attention_mask): pad on the left (padding_side='left')")
        padded = ~real.all(dim=1)
        if bool(padded.any()) and self.layout.stateful[DECODE]:
            raise GenerationError("this OpenVINO decode keeps its state in the infer request (stateful=True), so "
                                  "padded prompts cannot reset a row's state: pass unpadded rows, or re-export it "
                                  "with options.stateful: false (hfexport's default for it)")
        for index in range(input_ids.shape[1]):
            logits = self.step(DECODE, input_ids[:, index : index + 1], attention_mask[:, : index + 1],
                               positions[:, index : index + 1])
            if bool(padded.any()) and not bool(real[:, index].all()):
                # Mamba's prefill zeroes the padded positions' inputs (`apply_mask_to_padding_states`), so a left-
                # padded row's state is still zero at its first real token: keep it so through the padding.
                self.cache = zero_state_rows(self.cache, ~real[:, index])
        return logits

    def _llm_run(self, input_ids) -> torch.Tensor:
        """ExecuTorch's LLM runner program on `input_ids` (one row) at the next cache positions, as TextLLMRunner
        calls it."""
        runner = self.exported.runners[LLM_PROGRAM]
        positions = torch.arange(self.filled, self.filled + input_ids.shape[1], dtype=torch.long)
        logits = runner(input_ids=input_ids.contiguous(), cache_position=positions)
        self.filled += input_ids.shape[1]
        return logits.cpu() if logits.dim() == 3 else logits.cpu()[None]

    def step(self, name: str, input_ids, attention_mask, positions) -> torch.Tensor:
        if self.layout.llm_program:
            return self._llm_run(input_ids)
        runner = self.exported.runners[self.layout.prefill if name == PREFILL else name]
        traced = runner.metadata.kwargs
        device = runner.device
        input_ids, attention_mask, positions = (t.to(device) for t in (input_ids, attention_mask, positions))
        if self.layout.seq2seq:
            encoder_outputs, encoder_mask = self.encoder
            kwargs: dict[str, Any] = {"decoder_input_ids": input_ids}
            if "encoder_outputs" in traced:
                kwargs["encoder_outputs"] = encoder_outputs
            if "attention_mask" in traced:
                kwargs["attention_mask"] = encoder_mask.to(device)
            if CACHE in traced:
                kwargs[CACHE] = self.cache
            return self._run(name, runner, kwargs, input_ids)
        if name == PREFILL and self.layout.multimodal:
            kwargs = {"inputs_embeds": self.inputs_embeds.to(device)}
        else:
            kwargs = {"input_ids": input_ids}
        if _fed(traced, "attention_mask"):
            kwargs["attention_mask"] = attention_mask if self.layout.mask_dtype is None else static_attention_mask(
                attention_mask, self.filled, input_ids.shape[1], self.layout.static_cache_len, self.layout.mask_dtype
            )
        if "position_ids" in traced:
            kwargs["position_ids"] = positions
        if self.layout.cache_kwarg in traced:
            kwargs[self.layout.cache_kwarg] = self.cache
        return self._run(name, runner, kwargs, input_ids)

    def _run(self, name: str, runner, kwargs: dict, input_ids) -> torch.Tensor:
        traced = runner.metadata.kwargs
        if self.layout.stateful[name]:
            self._hand_state_to(name, runner)
            self.filled += input_ids.shape[1]
            return _stateful_logits(runner, kwargs).cpu()
        outputs = runner(**kwargs)
        self.filled += input_ids.shape[1]
        if self.layout.cache_kwarg in traced or name == PREFILL:
            # The cache the next step reads (a prefill traced without a cache input still returns the first one).
            self.cache = getattr(outputs, self.layout.cache_kwarg, None)
        if name == PREFILL and self.layout.multimodal:
            return _lm_head_logits(self.exported, outputs.last_hidden_state).cpu()
        return outputs.logits.cpu()

    def _hand_state_to(self, name: str, runner) -> None:
        """Make the OpenVINO request of `name` hold the current cache as its state (once per generation)."""
        if self.state_owner == name:
            return
        import openvino
        from transformers.exporters.utils import get_leaf_tensors

        leaves = {}
        if self.cache is not None:
            leaves = {f"{self.layout.cache_kwarg}.{path}": tensor
                      for path, tensor in get_leaf_tensors(self.cache).items()}
        openvino_request(runner).reset_state()
        for state in openvino_request(runner).query_state():
            path = _state_leaf(state.name)
            if path in leaves:  # else (an empty cache) the variable's own zero-length init is right
                value = leaves[path].detach().cpu().contiguous().numpy()
                state.state = openvino.Tensor(value.astype(state.state.data.dtype, copy=False))
        self.state_owner = name


def _fed(traced: dict, name: str) -> bool:
    """Whether a component takes `name` as a tensor: a graph traced with `attention_mask=None` (Mamba's decode)
    lists it as a `NoneType` slot, and ExecuTorch rejects a tensor there (`set_inputs` error 0x12)."""
    return name in traced and traced[name].get("container") != "NoneType"


def zero_state(exported, batch: int):
    """The recurrent state a Mamba prefill starts from, `batch` rows of zeros: per layer a conv state
    `[batch, intermediate_size, conv_kernel]` and an SSM state `[batch, intermediate_size, state_size]` (transformers
    5.23's `MambaMixer`), written through the cache's own `update_conv_state` / `update_recurrent_state`, the calls
    the prefill makes, so the cache has the structure the decode was traced with."""
    from transformers import DynamicCache

    config = exported.config
    if getattr(config, "model_type", None) != "mamba":
        raise GenerationError(f"this export has a state-space decode and no prefill; generate knows the initial state "
                              f"of Mamba only, not of {getattr(config, 'model_type', None)!r}")
    dtype = _export_dtype(exported)
    cache = DynamicCache(config=config)
    for layer in range(config.num_hidden_layers):
        cache.update_conv_state(torch.zeros(batch, config.intermediate_size, config.conv_kernel, dtype=dtype), layer)
        cache.update_recurrent_state(torch.zeros(batch, config.intermediate_size, config.state_size, dtype=dtype),
                                     layer)
    return cache


def _export_dtype(exported) -> torch.dtype:
    """The dtype the decode was traced at (its float inputs, the cache among them)."""
    return getattr(torch, str(getattr(exported.runners[DECODE].metadata, "export_dtype", "float32")), torch.float32)


def zero_state_rows(cache, rows: torch.Tensor):
    """`cache` (a `DynamicCache` of `LinearAttentionLayer`s) with the states of `rows` (a bool per row) zeroed."""
    for layer in cache.layers:
        for states in (layer.conv_states, layer.recurrent_states):
            for index, tensor in states.items():
                if tensor is not None:
                    zeroed = rows.to(tensor.device).view(-1, *([1] * (tensor.dim() - 1)))
                    states[index] = torch.where(zeroed, torch.zeros((), dtype=tensor.dtype), tensor)
    return cache


def static_attention_mask(attention_mask: torch.Tensor, filled: int, query_len: int, size: int,
                          dtype: torch.dtype = torch.bool) -> torch.Tensor:
    """The 4D mask `generate` builds for a static cache of `size` slots, `[batch, 1, query_len, size]`: query `i`
    (cache slot `filled + i`) sees the slots up to its own that hold a real token (`attention_mask`, the 2D padding
    mask over the slots written so far, these queries included). Boolean (sdpa), or additive for a float `dtype`."""
    device = attention_mask.device
    padding = torch.zeros(attention_mask.shape[0], size, dtype=torch.bool, device=device)
    padding[:, : attention_mask.shape[1]] = attention_mask.bool()
    slots = torch.arange(filled, filled + query_len, device=device)
    causal = torch.arange(size, device=device)[None, :] <= slots[:, None]
    allowed = (causal[None, :, :] & padding[:, None, :])[:, None]
    if dtype == torch.bool:
        return allowed
    return torch.zeros(allowed.shape, dtype=dtype, device=device).masked_fill(~allowed, torch.finfo(dtype).min)


def run_component(runner, kwargs: dict):
    """One call of an exported component, as generate makes it: a stateful OpenVINO decode (a single graph's prompt,
    from its reset state) returns its logits read by port (`_stateful_logits`), any other its runner's outputs."""
    if _is_stateful(runner):
        openvino_request(runner).reset_state()
        return _stateful_logits(runner, {key: value for key, value in kwargs.items() if key != CACHE})
    return runner(**kwargs)


def _stateful_logits(runner, kwargs: dict) -> torch.Tensor:
    """Run a stateful OpenVINO program and return its logits, read by port name.

    transformers 5.23: `OpenVINOModelRunner.__call__` rebuilds the outputs from the traced `out_spec`, which still
    lists the cache leaves that `stateful=True` folded into state; the program returns fewer tensors than the spec
    has leaves and the runner raises `StopIteration`. The feed is the runner's own (`openvino_feed`).
    """
    compiled = runner.compiled_model
    results = openvino_infer(runner, kwargs)
    port = compiled.output("logits")
    return openvino_output_tensor(results[port], port)


def _state_leaf(variable_name: str) -> str:
    """The cache leaf an OpenVINO state variable holds: the engine names a variable `input.<path>output.<path>`."""
    head = variable_name.removeprefix("input.")
    index = head.find("output.")
    return head[:index] if index > 0 else head
