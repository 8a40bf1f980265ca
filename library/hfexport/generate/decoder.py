"""Generation of a decoder-only model over its prefill/decode: a `DynamicCache`, a `StaticCache` (its traced batch
only, in chunks), one multi-token graph (`single_graph`), or ExecuTorch's LLM runner program; the prompt checks and
batching that the vision-language and state-space variants share."""

from __future__ import annotations

import torch

from hfexport.errors import GenerationError
from hfexport.formats import format_traits
from hfexport.formats.executorch.llm_program import COMPONENT as LLM_PROGRAM
from hfexport.formats.executorch.llm_program import is_llm_program
from hfexport.generate.loop import (
    CACHE, DECODE, DECODE_TOKEN_TYPES, PREFILL, check_token_ids, sample_tokens, takes_tensor, is_stateful, GenerationLayout,
    GenerationSession,
)
from hfexport.generate.options import max_total_length, padding_token_id
from hfexport.generate.state_space import STATE, StateSpaceSession
from hfexport.generate.vision_language import (
    LANGUAGE_MODEL, LANGUAGE_MODEL_INPUTS, image_input_names, image_text_embeds, rope_positions,
    takes_rope_positions,
    VisionLanguageSession,
)

_KNOWN_INPUTS = {"input_ids", "attention_mask", "position_ids", CACHE, STATE}


def is_llm_program_export(exported) -> bool:
    """An export of ExecuTorch's LLM runner program (`hfexport.formats.executorch.llm_program`): one `model` component."""
    components = getattr(exported, "components", {})
    return list(components) == [LLM_PROGRAM] and is_llm_program(exported.runners[LLM_PROGRAM].metadata)


def llm_program_layout(exported) -> GenerationLayout:
    """ExecuTorch's LLM runner program: batch 1 (the chunks of `generate`), the prompt without its left padding at
    positions from 0, then one token per step; the cache stays in the program."""
    size = int(exported.runners[LLM_PROGRAM].metadata.export_config.get("max_seq_len") or 0) or None
    return GenerationLayout(takes_mask=True, mask_dtype=None, static_cache_len=size, stateful={LLM_PROGRAM: False},
                            pinned_batch=1, llm_program=True, prefill=LLM_PROGRAM, session=_LLMProgramSession)


class _LLMProgramSession(GenerationSession):
    """ExecuTorch's LLM runner program, `model(input_ids, cache_position)`, as TextLLMRunner calls it: its cache
    is inside the program."""

    def _new_cache(self):
        return None

    def prefill(self, input_ids, attention_mask, positions) -> torch.Tensor:
        real = attention_mask[0].bool()
        if bool((real[1:].int() < real[:-1].int()).any()):
            raise GenerationError("this ExecuTorch LLM program takes left padding only (a 0 after a 1 in "
                                  "attention_mask): pad on the left (padding_side='left')")
        return self._llm_run(input_ids[:, real])

    def step(self, name: str, input_ids, attention_mask, positions) -> torch.Tensor:
        return self._llm_run(input_ids)

    def _llm_run(self, input_ids) -> torch.Tensor:
        """ExecuTorch's LLM runner program on `input_ids` (one row) at the next cache positions, as TextLLMRunner
        calls it."""
        runner = self.exported.runners[LLM_PROGRAM]
        positions = torch.arange(self.filled, self.filled + input_ids.shape[1], dtype=torch.long)
        logits = runner(input_ids=input_ids.contiguous(), cache_position=positions)
        self.filled += input_ids.shape[1]
        return logits.cpu() if logits.dim() == 3 else logits.cpu()[None]


def decoder_layout(exported, runners, multimodal: bool, by_decode: bool, single_graph: bool) -> GenerationLayout:
    """A decoder-only export's layout (a VLM's and a state-space model's too), read from its traced kwargs."""
    prefill = LANGUAGE_MODEL if multimodal else DECODE if by_decode or single_graph else PREFILL
    for name in dict.fromkeys((prefill, DECODE)):
        # a multimodal decode may take a prompt input generate carries unchanged into every step (Qwen2.5-Omni's
        # `feature_attention_mask`): the session feeds the prompt's own (`VisionLanguageSession`)
        allowed = LANGUAGE_MODEL_INPUTS if name == LANGUAGE_MODEL else _KNOWN_INPUTS | (
            {*DECODE_TOKEN_TYPES, *(image_input_names(exported) if multimodal else ())} if name == DECODE else set())
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
    mask = traced.get("attention_mask") if takes_tensor(traced, "attention_mask") else None
    # Padded prompts need a mask in the prefill or the decode (a state-space decode takes none: its prefill does,
    # and without a prefill `StateSpaceSession` zeroes a row's state while it is padding).
    takes_mask = mask is not None or by_decode or takes_tensor(runners[prefill].metadata.kwargs, "attention_mask")
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
    stateful = {PREFILL: not by_decode and is_stateful(runners[prefill]), DECODE: is_stateful(runners[DECODE])}
    if static_len is not None and stateful[DECODE]:
        raise GenerationError(
            "this OpenVINO export keeps a static cache as internal state (stateful=True), which transformers 5.23 "
            "exports wrong: the cache's write position becomes a constant. Re-export it with options.stateful: false"
        )
    pinned_batch = None
    if static_len is not None and format_traits(exported.export_format).checks_input_spec:
        # transformers 5.23: a StaticLayer's `batch_size` is part of the cache's pytree context, so the decode's
        # input spec accepts the traced batch size only (torch.export and ExecuTorch check the spec).
        pinned_batch = int(traced["input_ids"]["shape"][0])
    return GenerationLayout(
        takes_mask=takes_mask,
        mask_dtype=mask_dtype,
        static_cache_len=static_len,
        stateful=stateful,
        pinned_batch=pinned_batch,
        cache_kwarg=cache_kwarg,
        multimodal=multimodal,
        prefill_by_decode=by_decode,
        single_graph=single_graph,
        prefill=prefill,
        session=VisionLanguageSession if multimodal else StateSpaceSession if by_decode else GenerationSession,
    )


def _session_args(layout: GenerationLayout, inputs_embeds, positions, carried: dict | None = None) -> dict:
    """What a batch's session starts from: a VLM's prompt embeddings (and multi-axis rope positions, the prompt inputs
    its decode takes), nothing for the others."""
    return {"inputs_embeds": inputs_embeds, "positions": positions, "carried": carried or {}} \
        if layout.multimodal else {}


def generate_decoder_only(exported, layout: GenerationLayout, config, input_ids, attention_mask, prompt_inputs: dict,
                          nothing_new: bool, *, logits_processor, stopping_criteria, streamer, generator, seed,
                          tokenizer, prefix_allowed_tokens_fn) -> torch.LongTensor:
    """`model.generate` for a decoder-only export (`generate`'s arguments): the prompt checked, repeated for
    `num_return_sequences`, and decoded in one batch, or in chunks of the one batch size the decode takes."""
    if input_ids is None:
        raise GenerationError("generate needs input_ids (the prompts)")
    input_ids = torch.as_tensor(input_ids, dtype=torch.long)
    if input_ids.dim() == 1:
        input_ids = input_ids.unsqueeze(0)
    if not layout.multimodal:  # a vision-language prompt's image placeholder id may lie past the text vocabulary
        check_token_ids(exported, input_ids)
    inputs_embeds = image_text_embeds(exported, input_ids, prompt_inputs) if layout.multimodal else None
    if attention_mask is None:
        attention_mask = torch.ones_like(input_ids)
    attention_mask = torch.as_tensor(attention_mask, dtype=torch.long)
    if attention_mask.shape != input_ids.shape:
        raise GenerationError(
            f"attention_mask has shape {tuple(attention_mask.shape)}, input_ids {tuple(input_ids.shape)}"
        )
    # a multi-axis rope's prompt positions (Qwen2-VL-class), from the prompt before it is repeated, as generate does
    positions = rope_positions(exported, input_ids, attention_mask, prompt_inputs) \
        if layout.multimodal and takes_rope_positions(exported) else None
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
        if positions is not None:  # [axes, batch, seq]
            positions = positions.repeat_interleave(config.num_return_sequences, dim=1)
    batch, prompt_len = input_ids.shape
    max_length = config.max_length = max_total_length(config, prompt_len, exported)  # as model.generate sets it
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
        sequences = sample_tokens(exported, layout, input_ids, attention_mask, real=batch,
                                  session_args=_session_args(layout, inputs_embeds, positions, prompt_inputs), **run)
    else:
        # A decode that only takes its traced batch: run chunks of that size, the last one filled up with copies of
        # its last row (rows are independent), and drop the copies.
        outputs = []
        for first in chunks:
            ids, mask = input_ids[first : first + rows], attention_mask[first : first + rows]
            embeds = inputs_embeds[first : first + rows] if inputs_embeds is not None else None
            rope = positions[:, first : first + rows] if positions is not None else None
            real = ids.shape[0]
            if real < rows:
                ids = torch.cat([ids, ids[-1:].expand(rows - real, -1)])
                mask = torch.cat([mask, mask[-1:].expand(rows - real, -1)])
                if embeds is not None:
                    embeds = torch.cat([embeds, embeds[-1:].expand(rows - real, -1, -1)])
                if rope is not None:
                    rope = torch.cat([rope, rope[:, -1:].expand(-1, rows - real, -1)], dim=1)
            outputs.append(sample_tokens(exported, layout, ids, mask, real=real,
                                         session_args=_session_args(layout, embeds, rope, prompt_inputs), **run)[:real])
        width = max(chunk.shape[1] for chunk in outputs)
        pad = padding_token_id(config)
        # A chunk whose rows all stopped early is shorter: its rows would have emitted pad tokens from there.
        sequences = torch.cat([torch.nn.functional.pad(chunk, (0, width - chunk.shape[1]), value=pad or 0)
                               for chunk in outputs])
    if streamer is not None:
        streamer.end()
    return sequences
