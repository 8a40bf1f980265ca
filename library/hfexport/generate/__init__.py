"""`model.generate` over exported graphs, without the torch model: greedy search and sampling, on any format.

`generate(exported, input_ids, ...)` runs the prompt through the export's prefill, then its decode one token at a
time, carrying the cache between calls the way `model.generate` does, with transformers' own generation config,
logits processors, stopping criteria, streamers and random draws (so a seeded sampling run gives its tokens).
`verify_generation` compares it token for token with `model.generate(do_sample=False)`: the parity check of
generation targets.

This module reads which family an export is and hands the call to its module: `decoder` (decoder-only text: dynamic
and static caches, single graphs, ExecuTorch's LLM program), `seq2seq` (encoder-decoders, Whisper),
`vision_language`, `state_space` (Mamba); they share `loop` (the `_sample` loop, the session that carries the cache)
and `options` (the generation config, processors and stopping criteria).
"""

from __future__ import annotations

import torch

from hfexport.errors import GenerationError
from hfexport.generate.decoder import (
    decoder_layout, generate_decoder_only, is_llm_program_export, llm_program_layout,
)
from hfexport.generate.loop import (
    CACHE, DECODE, PREFILL, TOKEN_CHOICE_THREADS, GenerationLayout, as_traced, plain_greedy, run_component,
    static_attention_mask,
)
from hfexport.generate.options import (
    BEAM_SEARCH_MESSAGE, DEFAULT_NEW_TOKENS, GLOBAL_DEFAULTS, build_logits_processor, build_stopping_criteria,
    default_special_tokens, resolve_generation_config,
)
from hfexport.generate.seq2seq import ENCODER, generate_seq2seq, seq2seq_layout, decoder_prompt
from hfexport.generate.state_space import STATE, zero_state, zero_state_rows
from hfexport.generate.vision_language import (
    EMBED, IMAGE_ENCODER, LANGUAGE_MODEL, LM_HEAD, is_vision_language, image_input_names, rope_input_names,
)

__all__ = [
    "BEAM_SEARCH_MESSAGE", "CACHE", "DECODE", "DEFAULT_NEW_TOKENS", "EMBED", "ENCODER", "GLOBAL_DEFAULTS",
    "IMAGE_ENCODER", "LANGUAGE_MODEL", "LM_HEAD", "PREFILL", "STATE", "TOKEN_CHOICE_THREADS", "GenerationError",
    "as_traced", "build_logits_processor", "build_stopping_criteria", "decoder_prompt", "default_special_tokens",
    "generate", "generation_layout", "image_input_names", "plain_greedy", "prompt_input_names", "resolve_generation_config", "run_component", "static_attention_mask",
    "verify_generation", "zero_state", "zero_state_rows",
]


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
    # a multimodal prompt's images or audio (an audio-text model's `input_features` among them), and what its
    # multi-axis rope positions are computed from (Qwen2-VL's `mm_token_type_ids`)
    prompt_inputs = {name: kwargs.pop(name) for name in prompt_input_names(exported) if name in kwargs}
    input_features = kwargs.pop("input_features", None)
    decoder_input_ids = kwargs.pop("decoder_input_ids", None)
    nothing_new = kwargs.get("max_new_tokens") is not None and kwargs["max_new_tokens"] < 1
    if nothing_new:  # transformers refuses max_new_tokens=0; here it returns the prompt
        kwargs.pop("max_new_tokens")
    config = resolve_generation_config(exported, generation_config, **kwargs)
    layout = _layout(exported)
    if layout.seq2seq:
        return generate_seq2seq(exported, layout, config, input_ids, attention_mask, input_features,
                                decoder_input_ids, nothing_new, logits_processor=logits_processor,
                                stopping_criteria=stopping_criteria, streamer=streamer, generator=generator,
                                seed=seed, tokenizer=tokenizer, prefix_allowed_tokens_fn=prefix_allowed_tokens_fn)
    if input_features is not None or decoder_input_ids is not None:
        raise GenerationError("input_features / decoder_input_ids are encoder-decoder inputs; this export is a "
                              "decoder-only prefill/decode")
    return generate_decoder_only(exported, layout, config, input_ids, attention_mask, prompt_inputs, nothing_new,
                                 logits_processor=logits_processor, stopping_criteria=stopping_criteria,
                                 streamer=streamer, generator=generator, seed=seed, tokenizer=tokenizer,
                                 prefix_allowed_tokens_fn=prefix_allowed_tokens_fn)


def prompt_input_names(exported) -> list[str]:
    """The inputs besides `input_ids` and `attention_mask` that a prompt of this export takes from the processor: a
    multimodal model's images or audio, and what its multi-axis rope positions come from (Qwen2-VL's
    `mm_token_type_ids`); none for text."""
    return list(dict.fromkeys([*image_input_names(exported), *rope_input_names(exported)]))


def generation_layout(exported) -> GenerationLayout:
    """Which generation family an export is and what its components expect (`GenerationLayout`), as `generate`
    reads it; `exported` needs only `components`, `runners` (each with its `metadata`), `export_format`, `config`
    and `generation_config`. Raises `GenerationError` where `generate` would."""
    return _layout(exported)


def _layout(exported) -> GenerationLayout:
    """Which family an export is, and what its components expect (that family's reading of their traced kwargs)."""
    components = getattr(exported, "components", {})
    if is_llm_program_export(exported):
        return llm_program_layout(exported)
    multimodal = is_vision_language(components, DECODE)
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
        return seq2seq_layout(exported, runners)
    return decoder_layout(exported, runners, multimodal, by_decode, single_graph)


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
