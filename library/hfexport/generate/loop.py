"""The loop every generation family shares: transformers 5.23's `_sample` over a session that carries the cache
between an export's component calls (a `DynamicCache`, a `StaticCache` fed a 4D mask, or the state of an OpenVINO
infer request), for any of the four formats. The family modules give the session its inputs and prompt step."""

from __future__ import annotations

import contextlib
from dataclasses import dataclass
from typing import Any

import torch

from hfexport.engine import openvino_infer, openvino_output_tensor, openvino_request
from hfexport.errors import GenerationError
from hfexport.formats import format_traits
from hfexport.generate.options import (
    as_token_ids, build_logits_processor, build_stopping_criteria, max_total_length, padding_token_id,
    resolve_generation_config,
)
from hfexport.models import empty_cache

PREFILL, DECODE = "prefill", "decode"
CACHE = "past_key_values"
# The token types generate extends by zeros (text) for each new token (transformers 5.23's
# `_update_model_kwargs_for_generation`; it repeats the last `token_type_ids` instead, which hfexport does not feed),
# which a decode traced with them takes (Qwen2-VL's `mm_token_type_ids`).
DECODE_TOKEN_TYPES = ("mm_token_type_ids",)


@dataclass
class GenerationLayout:
    """What the exported components expect, read from their traced kwargs."""

    takes_mask: bool
    mask_dtype: torch.dtype | None  # a 4D mask's dtype (static cache); None for a 2D padding mask
    static_cache_len: int | None  # StaticCache size, None for a DynamicCache
    stateful: dict[str, bool]  # per component: an OpenVINO program that keeps the cache in its infer request
    pinned_batch: int | None  # the only batch size the decode takes (see `generate.decoder`)
    seq2seq: bool = False  # an encoder-decoder: `encoder` once, then prefill/decode over the decoder tokens
    cache_kwarg: str = CACHE  # the kwarg that carries the cache: `past_key_values`, or a Mamba's `cache_params`
    multimodal: bool = False  # a VLM: the prefill is embed -> language_model -> lm_head (`generate.vision_language`)
    prefill_by_decode: bool = False  # a state-space decode without a prefill: the prompt runs through the decode
    single_graph: bool = False  # a multi-token decode without a prefill: the prompt runs on an empty cache
    llm_program: bool = False  # ExecuTorch's LLM runner program: `model(input_ids, cache_position)`, its cache inside
    prefill: str = PREFILL  # the component that runs the prompt
    session: Any = None  # the `GenerationSession` class of this layout's family


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


def sample_tokens(exported, layout: GenerationLayout, input_ids, attention_mask, *, real: int, config, max_length: int,
                  logits_processor, stopping_criteria, streamer, generator, tokenizer,
                  prefix_allowed_tokens_fn, session_args: dict | None = None) -> torch.LongTensor:
    """transformers 5.23's `_sample` loop (greedy when `do_sample` is off) for one batch the components accept:
    the same processors, token choice, random draws (`torch.multinomial` on the softmax, one per step), padding of
    finished rows, stopping criteria and streamer calls. `real`: rows that are not chunk filler (streamed, and
    deciding when to stop). `session_args`: what the layout's session starts from (an encoder's output, a VLM's
    prompt embeddings)."""
    processors = build_logits_processor(config, input_ids, attention_mask, logits_processor, prefix_allowed_tokens_fn)
    criteria = build_stopping_criteria(config, max_length, stopping_criteria, tokenizer,
                                       getattr(exported.config, "max_position_embeddings", None))
    pads = any(hasattr(criterion, "eos_token_id") for criterion in criteria)
    pad = padding_token_id(config)
    if pads and pad is None:
        raise GenerationError("an EOS stopping criterion needs a pad_token_id for the rows that finished")
    batch = input_ids.shape[0]
    session = layout.session(exported, layout, batch, **(session_args or {}))
    positions = session.prompt_positions(attention_mask)
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
            positions = positions[..., -1:] + 1  # as generate continues them ([batch, seq] or [axes, batch, seq])
            logits = session.step(DECODE, next_tokens[:, None], attention_mask, positions)
    return sequences


def plain_greedy(exported, layout: GenerationLayout, generation_config, input_ids, attention_mask) -> dict | None:
    """What `sample_tokens` does for `generate(exported, input_ids, attention_mask, generation_config)` where that
    is a plain greedy loop (no logits processor; stops at `max_length` or an EOS token; no sampling, one sequence a
    prompt) over a decoder-only layout with a DynamicCache: `{"prefill", "input_ids", "attention_mask",
    "initial_cache" (leaf path -> tensor: a single graph's empty cache), "max_length", "eos", "pad", "pads", "feeds"
    (per component: whether it takes the mask, positions, the cache, and the token types fed as zeros)}`, for a loop
    without torch (`hfexport.verify.artifact`); None where `generate` does more, or refuses."""
    from transformers import EosTokenCriteria, MaxLengthCriteria
    from transformers.exporters.utils import get_leaf_tensors

    input_ids = torch.as_tensor(input_ids, dtype=torch.long)
    mask = torch.ones_like(input_ids) if attention_mask is None else torch.as_tensor(attention_mask, dtype=torch.long)
    try:
        config = resolve_generation_config(exported, generation_config)
        check_token_ids(exported, input_ids)
        processors = build_logits_processor(config, input_ids, mask)
        max_length = max_total_length(config, input_ids.shape[1], exported)
        criteria = build_stopping_criteria(config, max_length, None, None,
                                           getattr(exported.config, "max_position_embeddings", None))
    except Exception:  # noqa: BLE001 - generate refuses it: its own message, where it runs
        return None
    if len(processors) or config.do_sample or config.num_return_sequences > 1 or max_length <= input_ids.shape[1] \
            or not all(isinstance(criterion, (MaxLengthCriteria, EosTokenCriteria)) for criterion in criteria) \
            or mask.shape != input_ids.shape or (not layout.takes_mask and not bool(mask.all())):
        return None
    pads = any(hasattr(criterion, "eos_token_id") for criterion in criteria)
    if pads and padding_token_id(config) is None:
        return None
    cache = {}
    if layout.single_graph:
        empty = empty_cache(exported.config, input_ids.shape[0], traced_dtype(exported))
        cache = {f"{CACHE}.{path}": tensor for path, tensor in get_leaf_tensors(empty).items()}
    feeds = {}
    for name in dict.fromkeys((layout.prefill, DECODE)):
        traced = exported.runners[name].metadata.kwargs
        feeds[name] = {"attention_mask": takes_tensor(traced, "attention_mask"), "position_ids": "position_ids" in traced,
                       "zeros": [key for key in DECODE_TOKEN_TYPES if takes_tensor(traced, key)] if name == DECODE else [],
                       "cache": CACHE in traced}
    return {"prefill": layout.prefill, "input_ids": input_ids, "attention_mask": mask, "initial_cache": cache,
            "max_length": int(max_length), "eos": as_token_ids(config.eos_token_id), "pad": padding_token_id(config),
            "pads": pads, "feeds": feeds}


def _runs_in_torch(exported) -> bool:
    """Whether the export's graphs run in torch (a dynamo `.pt2`) rather than in a runtime of their own."""
    return format_traits(exported.export_format).runs_in_torch


class GenerationSession:
    """One generation over a decoder-only export's prefill/decode: the cache between calls, and which OpenVINO request
    holds it as state. A family's session (seq2seq, vision-language, state-space, ExecuTorch's LLM program) changes
    what a call is fed, how the prompt runs or where its logits come from."""

    def __init__(self, exported, layout: GenerationLayout, batch: int):
        self.exported, self.layout, self.batch = exported, layout, batch
        self.cache = self._new_cache()
        self.state_owner: str | None = None
        self.filled = 0  # cache slots written so far (static cache: where the next tokens go)

    def _new_cache(self):
        from transformers import DynamicCache, StaticCache

        exported, layout = self.exported, self.layout
        if layout.single_graph:  # a stateful OpenVINO decode starts from its variables' zero-length init instead
            return None if layout.stateful[DECODE] else empty_cache(exported.config, self.batch,
                                                                    traced_dtype(exported))
        if layout.cache_kwarg not in exported.runners[layout.prefill].metadata.kwargs:
            return None
        if layout.static_cache_len is not None:
            return StaticCache(config=exported.config, max_cache_len=layout.static_cache_len)
        return DynamicCache(config=exported.config)

    def prompt_positions(self, attention_mask) -> torch.Tensor:
        """The prompt's positions, as generate computes them from the padding mask (a multi-axis rope's differ)."""
        return (attention_mask.cumsum(-1) - 1).masked_fill(attention_mask == 0, 0)

    def prefill(self, input_ids, attention_mask, positions) -> torch.Tensor:
        """The prompt's logits: the prefill component, or the decode on an empty cache (`single_graph`)."""
        if self.layout.single_graph:
            return self.step(DECODE, input_ids, attention_mask, positions)
        return self.step(PREFILL, input_ids, attention_mask, positions)

    def step(self, name: str, input_ids, attention_mask, positions) -> torch.Tensor:
        runner = self.exported.runners[self.layout.prefill if name == PREFILL else name]
        traced = runner.metadata.kwargs
        device = runner.device
        input_ids, attention_mask, positions = (t.to(device) for t in (input_ids, attention_mask, positions))
        return self._run(name, runner, self._feed(name, traced, device, input_ids, attention_mask, positions),
                         input_ids)

    def _tokens(self, name: str, device, input_ids) -> dict[str, Any]:
        """The call's tokens: `input_ids` (a VLM's prefill takes `inputs_embeds` instead)."""
        return {"input_ids": input_ids}

    def _feed(self, name: str, traced: dict, device, input_ids, attention_mask, positions) -> dict[str, Any]:
        """The kwargs of one call: the tokens, the padding mask (a static cache's 4D mask), positions, the cache."""
        kwargs = self._tokens(name, device, input_ids)
        if takes_tensor(traced, "attention_mask"):
            kwargs["attention_mask"] = attention_mask if self.layout.mask_dtype is None else static_attention_mask(
                attention_mask, self.filled, input_ids.shape[1], self.layout.static_cache_len, self.layout.mask_dtype
            )
        if "position_ids" in traced:
            kwargs["position_ids"] = positions
        if name == DECODE:
            kwargs.update({key: torch.zeros_like(input_ids) for key in DECODE_TOKEN_TYPES if takes_tensor(traced, key)})
        if self.layout.cache_kwarg in traced:
            kwargs[self.layout.cache_kwarg] = self.cache
        return kwargs

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
        return self._logits(name, outputs)

    def _logits(self, name: str, outputs) -> torch.Tensor:
        """The call's logits (a VLM's prefill returns hidden states, which its `lm_head` turns into logits)."""
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


def takes_tensor(traced: dict, name: str) -> bool:
    """Whether a component takes `name` as a tensor: a graph traced with `attention_mask=None` (Mamba's decode)
    lists it as a `NoneType` slot, and ExecuTorch rejects a tensor there (`set_inputs` error 0x12)."""
    return name in traced and traced[name].get("container") != "NoneType"


def traced_dtype(exported) -> torch.dtype:
    """The dtype the decode was traced at (its float inputs, the cache among them)."""
    return getattr(torch, str(getattr(exported.runners[DECODE].metadata, "export_dtype", "float32")), torch.float32)


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
    if is_stateful(runner):
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


def is_stateful(runner) -> bool:
    """An OpenVINO program whose cache became internal state (`OpenVINOConfig.stateful`): its infer request holds
    variables. (A prefill traced on an empty cache has no cache inputs either, but no state.)"""
    request = getattr(runner, "request", None)
    return request is not None and hasattr(request, "query_state") and len(request.query_state()) > 0


def check_token_ids(exported, input_ids: torch.Tensor) -> None:
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


def as_traced(runner, kwargs: dict) -> dict:
    """`kwargs` as the component was traced: an input the graph took as a Python list (transformers' `image_sizes`
    export input preparer turns the processor's tensor into `(height, width)` int tuples before tracing, so the graph
    is specialized on them) is fed its tensor's values the same way."""
    traced = runner.metadata.kwargs
    return {name: [tuple(int(v) for v in row) for row in value.tolist()]
            if isinstance(value, torch.Tensor) and (traced.get(name) or {}).get("container") == "list" else value
            for name, value in kwargs.items()}
