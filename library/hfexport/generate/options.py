"""What a generate call runs with: its `GenerationConfig`, merged as `model.generate` merges it, and the logits
processors and stopping criteria that config implies, built from transformers' public classes."""

from __future__ import annotations

import copy
from typing import Any

import torch

from hfexport.errors import GenerationError


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
# `model.generate` does. (`max_length` is handled in `max_total_length`: 20 new tokens.)
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
    eos = torch.tensor(as_token_ids(config.eos_token_id), dtype=torch.long) if config.eos_token_id is not None else None
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
        criteria.append(tf.EosTokenCriteria(eos_token_id=as_token_ids(config.eos_token_id)))
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



def max_total_length(config, prompt_len: int, exported) -> int:
    """Prompt + new tokens, as `model.generate` reads it: `max_new_tokens`, else `max_length` (a total), else 20 new
    tokens capped at the model's `max_position_embeddings`."""
    if config.max_new_tokens is not None:
        return prompt_len + config.max_new_tokens
    if config.max_length is not None:
        return config.max_length
    limit = getattr(getattr(exported, "config", None), "max_position_embeddings", None)
    return min(prompt_len + DEFAULT_NEW_TOKENS, limit) if limit else prompt_len + DEFAULT_NEW_TOKENS


def padding_token_id(config) -> int | None:
    """`pad_token_id`, else the first EOS token (`model.generate`'s fallback)."""
    if config.pad_token_id is not None:
        return int(config.pad_token_id)
    eos = as_token_ids(config.eos_token_id)
    return eos[0] if eos else None


def default_special_tokens(exported, model=None) -> tuple[Any, int | None]:
    """`(eos_token_id, pad_token_id)` from the export's generation config, then its config (then the model's)."""
    sources = [getattr(exported, "generation_config", None), getattr(exported, "config", None)]
    if model is not None:
        sources += [getattr(model, "generation_config", None), getattr(model, "config", None)]
    def first(field: str):
        return next((getattr(s, field) for s in sources if getattr(s, field, None) is not None), None)

    return first("eos_token_id"), first("pad_token_id")


def as_token_ids(value) -> list[int]:
    if value is None:
        return []
    if isinstance(value, int):
        return [value]
    if isinstance(value, torch.Tensor):
        return [int(v) for v in value.flatten().tolist()]
    return [int(v) for v in value]
