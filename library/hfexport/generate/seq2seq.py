"""Generation of an encoder-decoder (BART, T5, Whisper): hfexport's `encoder` component once per call, then the
decoder loop over the engine's prefill/decode, each fed the encoder's output, its padding mask and the self- and
cross-attention cache (the components `hfexport.plan.seq2seq` exports)."""

from __future__ import annotations

from typing import Any

import torch

from hfexport.errors import GenerationError
from hfexport.generate.loop import (
    CACHE, DECODE, PREFILL, check_token_ids, sample_tokens, is_stateful, GenerationLayout, GenerationSession,
)
from hfexport.generate.options import max_total_length, as_token_ids

ENCODER = "encoder"
# An encoder-decoder's prefill/decode (the engine's decompose_for_generation) take the decoder tokens and the
# encoder's output; the encoder is hfexport's own `encoder` component (see `hfexport.plan.seq2seq`), run once per call.
_SEQ2SEQ_INPUTS = {"decoder_input_ids", "attention_mask", "encoder_outputs", CACHE}


def seq2seq_layout(exported, runners) -> GenerationLayout:
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
    stateful = {name: is_stateful(runners[name]) for name in (PREFILL, DECODE)}
    if stateful[DECODE]:
        raise GenerationError(
            "this OpenVINO encoder-decoder export keeps its cache as internal state (stateful=True), which "
            "transformers 5.23 exports for the sample's encoder length only: the cross-attention state's length is "
            "pinned to it. Re-export it with options.stateful: false (hfexport's default for encoder-decoders)")
    return GenerationLayout(takes_mask=True, mask_dtype=None, static_cache_len=None, stateful=stateful,
                            pinned_batch=None, seq2seq=True, session=_Seq2SeqSession)



class _Seq2SeqSession(GenerationSession):
    """An encoder-decoder's generation: every call takes the decoder tokens, the encoder's output and its mask."""

    def __init__(self, exported, layout: GenerationLayout, batch: int, encoder):
        self.encoder = encoder  # (encoder outputs, encoder padding mask)
        super().__init__(exported, layout, batch)

    def _new_cache(self):
        from transformers import DynamicCache, EncoderDecoderCache

        config = self.exported.config
        if CACHE not in self.exported.runners[self.layout.prefill].metadata.kwargs:
            return None
        return EncoderDecoderCache(DynamicCache(config=config), DynamicCache(config=config))

    def _feed(self, name: str, traced: dict, device, input_ids, attention_mask, positions) -> dict[str, Any]:
        encoder_outputs, encoder_mask = self.encoder
        kwargs: dict[str, Any] = {"decoder_input_ids": input_ids}
        if "encoder_outputs" in traced:
            kwargs["encoder_outputs"] = encoder_outputs
        if "attention_mask" in traced:
            kwargs["attention_mask"] = encoder_mask.to(device)
        if CACHE in traced:
            kwargs[CACHE] = self.cache
        return kwargs


def generate_seq2seq(exported, layout: GenerationLayout, config, input_ids, attention_mask, input_features,
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
        check_token_ids(exported, input_ids)
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
    max_length = config.max_length = max_total_length(config, prompt_len, exported)
    if streamer is not None:
        streamer.put(decoder_input_ids.cpu())
    if nothing_new or max_length <= prompt_len:
        if streamer is not None:
            streamer.end()
        return decoder_input_ids.clone()
    decoder_mask = torch.ones_like(decoder_input_ids)
    sequences = sample_tokens(exported, layout, decoder_input_ids, decoder_mask, real=batch, config=config,
                              max_length=max_length, streamer=streamer, generator=generator,
                              session_args={"encoder": (encoder_outputs, attention_mask)}, **run)
    if streamer is not None:
        streamer.end()
    if getattr(exported.config, "model_type", None) == "whisper":
        # transformers 5.23's WhisperForConditionalGeneration.generate returns the new tokens only (it strips its
        # decoder prompt: the start token and the forced language/task tokens).
        return sequences[:, prompt_len:]
    return sequences

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
    tokens = [int(as_token_ids(start)[0])]
    forced = getattr(config, "forced_decoder_ids", None) or []
    for position, token in sorted(forced):
        if position == len(tokens) and token is not None:
            tokens.append(int(token))
    return tokens
