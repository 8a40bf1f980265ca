"""Greedy generation over exported prefill/decode graphs, without the torch model.

`generate(exported, input_ids, ...)` runs the `prefill` component on the prompt, then the `decode` component
one token at a time, carrying the KV cache between calls the way `model.generate` does: a `DynamicCache` that
grows, or a fixed-size `StaticCache` (a `generation.cache_implementation: "static"` target) fed a 4D mask built
here. It works the same over all four formats because every backend's runner takes the traced forward's kwargs
and returns what the model returns; the one backend difference is OpenVINO's stateful decode, which keeps the
cache inside its infer request: it is seeded from the prefill's cache and then left to carry itself.

`verify_generation(exported, model, inputs, max_new_tokens)` compares it token for token with
`model.generate(do_sample=False)`: the parity check of generation targets.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any

import torch

PREFILL, DECODE = "prefill", "decode"
CACHE = "past_key_values"
_KNOWN_INPUTS = {"input_ids", "attention_mask", "position_ids", CACHE}


class GenerationError(ValueError):
    """The export cannot generate (no prefill/decode components, inputs it was not traced with, a full cache)."""


@dataclass
class _Layout:
    """What the exported components expect, read from their traced kwargs."""

    takes_mask: bool
    mask_dtype: torch.dtype | None  # a 4D mask's dtype (static cache); None for a 2D padding mask
    static_cache_len: int | None  # StaticCache size, None for a DynamicCache
    stateful: dict[str, bool]  # per component: an OpenVINO program that keeps the cache in its infer request
    pinned_batch: int | None  # the only batch size the decode takes (see `_layout`)


def generate(
    exported,
    input_ids: torch.Tensor,
    attention_mask: torch.Tensor | None = None,
    max_new_tokens: int = 20,
    eos_token_id: int | Iterable[int] | None = None,
    pad_token_id: int | None = None,
) -> torch.LongTensor:
    """Greedy decoding over `exported` (an `ExportedModel` with `prefill` and `decode` components).

    Returns prompt + generated tokens, `[batch, prompt + n]`, as `model.generate(do_sample=False)` returns them for
    a decoder-only model: left-padded prompts with their `attention_mask`; a row that emitted an EOS token then
    gets `pad_token_id` (the first EOS when None); it stops when every row finished or after `max_new_tokens`.
    """
    layout = _layout(exported)
    input_ids = torch.as_tensor(input_ids, dtype=torch.long)
    if input_ids.dim() == 1:
        input_ids = input_ids.unsqueeze(0)
    batch, prompt_len = input_ids.shape
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
    if max_new_tokens < 1:
        return input_ids.clone()
    if layout.static_cache_len is not None and prompt_len + max_new_tokens - 1 > layout.static_cache_len:
        raise GenerationError(
            f"the static cache holds {layout.static_cache_len} tokens: a prompt of {prompt_len} plus "
            f"{max_new_tokens} new tokens needs {prompt_len + max_new_tokens - 1} (raise generation.max_cache_len)"
        )
    eos = _token_ids(eos_token_id)
    if pad_token_id is None and eos:
        pad_token_id = eos[0]

    rows = layout.pinned_batch or batch
    if rows == batch:
        return _greedy(exported, layout, input_ids, attention_mask, max_new_tokens, eos, pad_token_id)
    # A decode that only takes its traced batch: run chunks of that size, the last one filled up with copies of
    # its last row (rows are independent), and drop the copies.
    chunks = []
    for first in range(0, batch, rows):
        ids, mask = input_ids[first : first + rows], attention_mask[first : first + rows]
        real = ids.shape[0]
        if real < rows:
            ids = torch.cat([ids, ids[-1:].expand(rows - real, -1)])
            mask = torch.cat([mask, mask[-1:].expand(rows - real, -1)])
        chunks.append(_greedy(exported, layout, ids, mask, max_new_tokens, eos, pad_token_id)[:real])
    width = max(chunk.shape[1] for chunk in chunks)
    # A chunk whose rows all stopped early is shorter: its rows would have emitted pad tokens from there.
    return torch.cat([torch.nn.functional.pad(chunk, (0, width - chunk.shape[1]), value=pad_token_id or 0)
                      for chunk in chunks])


def _greedy(exported, layout: _Layout, input_ids, attention_mask, max_new_tokens: int, eos: list[int],
            pad_token_id: int | None) -> torch.LongTensor:
    """The decoding loop of `model.generate` (greedy search) for one batch the components accept."""
    batch = input_ids.shape[0]
    session = _Session(exported, layout, batch)
    positions = (attention_mask.cumsum(-1) - 1).masked_fill(attention_mask == 0, 0)
    logits = session.step(PREFILL, input_ids, attention_mask, positions)

    sequences = input_ids
    unfinished = torch.ones(batch, dtype=torch.bool)
    for step in range(max_new_tokens):
        next_tokens = logits[:, -1, :].float().argmax(-1)
        if eos:
            next_tokens = torch.where(unfinished, next_tokens, torch.full_like(next_tokens, pad_token_id))
        sequences = torch.cat([sequences, next_tokens[:, None]], dim=-1)
        if eos:
            unfinished &= ~torch.isin(next_tokens, torch.tensor(eos))
        if step == max_new_tokens - 1 or not bool(unfinished.any()):
            break
        attention_mask = torch.cat([attention_mask, attention_mask.new_ones((batch, 1))], dim=-1)
        positions = positions[:, -1:] + 1
        logits = session.step(DECODE, next_tokens[:, None], attention_mask, positions)
    return sequences


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
    produced = generate(exported, input_ids, attention_mask, max_new_tokens=max_new_tokens, eos_token_id=eos,
                        pad_token_id=pad)
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
    missing = [name for name in (PREFILL, DECODE) if name not in components]
    if missing:
        raise GenerationError(
            f"generation needs `prefill` and `decode` components; this export has {list(components)} "
            "(export it with mode `generation`)"
        )
    runners = exported.runners
    for name in (PREFILL, DECODE):
        unknown = sorted(set(runners[name].metadata.kwargs) - _KNOWN_INPUTS)
        if unknown:
            raise GenerationError(f"the {name} component takes {unknown}, which hfexport's generate does not feed")
        if "input_ids" not in runners[name].metadata.kwargs:
            raise GenerationError(
                f"the {name} component takes no input_ids (traced: {list(runners[name].metadata.kwargs)})"
            )
    traced = runners[DECODE].metadata.kwargs
    mask = traced.get("attention_mask")
    mask_dtype = getattr(torch, mask["dtype"]) if mask is not None and mask.get("rank") == 4 else None
    cache = traced.get(CACHE, {})
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
    stateful = {name: _is_stateful(runners[name]) for name in (PREFILL, DECODE)}
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
        takes_mask=mask is not None,
        mask_dtype=mask_dtype,
        static_cache_len=static_len,
        stateful=stateful,
        pinned_batch=pinned_batch,
    )


def _is_stateful(runner) -> bool:
    """An OpenVINO program whose cache became internal state (`OpenVINOConfig.stateful`): its infer request holds
    variables. (A prefill traced on an empty cache has no cache inputs either, but no state.)"""
    request = getattr(runner, "request", None)
    return request is not None and hasattr(request, "query_state") and len(request.query_state()) > 0


class _Session:
    """One generation: the cache between calls, and which OpenVINO request holds it as state."""

    def __init__(self, exported, layout: _Layout, batch: int):
        self.exported, self.layout, self.batch = exported, layout, batch
        self.cache = self._new_cache(exported, layout)
        self.state_owner: str | None = None
        self.filled = 0  # cache slots written so far (static cache: where the next tokens go)

    @staticmethod
    def _new_cache(exported, layout: _Layout):
        from transformers import DynamicCache, StaticCache

        if CACHE not in exported.runners[PREFILL].metadata.kwargs:
            return None
        if layout.static_cache_len is not None:
            return StaticCache(config=exported.config, max_cache_len=layout.static_cache_len)
        return DynamicCache(config=exported.config)

    def step(self, name: str, input_ids, attention_mask, positions) -> torch.Tensor:
        runner = self.exported.runners[name]
        traced = runner.metadata.kwargs
        device = runner.device
        input_ids, attention_mask, positions = (t.to(device) for t in (input_ids, attention_mask, positions))
        kwargs: dict[str, Any] = {"input_ids": input_ids}
        if "attention_mask" in traced:
            kwargs["attention_mask"] = attention_mask if self.layout.mask_dtype is None else static_attention_mask(
                attention_mask, self.filled, input_ids.shape[1], self.layout.static_cache_len, self.layout.mask_dtype
            )
        if "position_ids" in traced:
            kwargs["position_ids"] = positions
        if CACHE in traced:
            kwargs[CACHE] = self.cache
        if self.layout.stateful[name]:
            self._hand_state_to(name, runner)
            self.filled += input_ids.shape[1]
            return _stateful_logits(runner, kwargs).cpu()
        outputs = runner(**kwargs)
        self.filled += input_ids.shape[1]
        if CACHE in traced or name == PREFILL:
            # The cache the next step reads (a prefill traced without a cache input still returns the first one).
            self.cache = getattr(outputs, CACHE, None)
        return outputs.logits.cpu()

    def _hand_state_to(self, name: str, runner) -> None:
        """Make the OpenVINO request of `name` hold the current cache as its state (once per generation)."""
        if self.state_owner == name:
            return
        import openvino
        from transformers.exporters.utils import get_leaf_tensors

        leaves = {}
        if self.cache is not None:
            leaves = {f"{CACHE}.{path}": tensor for path, tensor in get_leaf_tensors(self.cache).items()}
        runner.request.reset_state()
        for state in runner.request.query_state():
            path = _state_leaf(state.name)
            if path in leaves:  # else (an empty cache) the variable's own zero-length init is right
                value = leaves[path].detach().cpu().contiguous().numpy()
                state.state = openvino.Tensor(value.astype(state.state.data.dtype, copy=False))
        self.state_owner = name


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


def _stateful_logits(runner, kwargs: dict) -> torch.Tensor:
    """Run a stateful OpenVINO program and return its logits, read by port name.

    transformers 5.23: `OpenVINOModelRunner.__call__` rebuilds the outputs from the traced `out_spec`, which still
    lists the cache leaves that `stateful=True` folded into state; the program returns fewer tensors than the spec
    has leaves and the runner raises `StopIteration`. The feed is the runner's own (`openvino_feed`).
    """
    from transformers.exporters.runners.runner_openvino import openvino_output_tensor
    from transformers.exporters.utils import openvino_feed

    compiled = runner.compiled_model
    results = runner.request.infer(openvino_feed(compiled, kwargs))
    port = compiled.output("logits")
    return openvino_output_tensor(results[port], port)


def _state_leaf(variable_name: str) -> str:
    """The cache leaf an OpenVINO state variable holds: the engine names a variable `input.<path>output.<path>`."""
    head = variable_name.removeprefix("input.")
    index = head.find("output.")
    return head[:index] if index > 0 else head
