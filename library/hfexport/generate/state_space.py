"""Generation of a state-space model (Mamba): its recurrent state in `cache_params`, and, where only the decode
was exported (`hfexport.plan.state_space`), the prompt run through the decode one token at a time from a zero
state."""

from __future__ import annotations

import torch

from hfexport.errors import GenerationError
from hfexport.generate.loop import DECODE, traced_dtype, GenerationSession

# A state-space model's generate (Mamba, transformers 5.23) passes its recurrent state as `cache_params`: a
# `DynamicCache` of `LinearAttentionLayer`s (a conv state and an SSM state per layer) instead of keys and values.
STATE = "cache_params"


class StateSpaceSession(GenerationSession):
    """A state-space decode without a prefill: the prompt runs through the decode, from a zero state."""

    def _new_cache(self):
        return zero_state(self.exported, self.batch)

    def prefill(self, input_ids, attention_mask, positions) -> torch.Tensor:
        """The prompt's logits: the decode on one token at a time."""
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
    dtype = traced_dtype(exported)
    cache = DynamicCache(config=config)
    for layer in range(config.num_hidden_layers):
        cache.update_conv_state(torch.zeros(batch, config.intermediate_size, config.conv_kernel, dtype=dtype), layer)
        cache.update_recurrent_state(torch.zeros(batch, config.intermediate_size, config.state_size, dtype=dtype),
                                     layer)
    return cache


def zero_state_rows(cache, rows: torch.Tensor):
    """`cache` (a `DynamicCache` of `LinearAttentionLayer`s) with the states of `rows` (a bool per row) zeroed."""
    for layer in cache.layers:
        for states in (layer.conv_states, layer.recurrent_states):
            for index, tensor in states.items():
                if tensor is not None:
                    zeroed = rows.to(tensor.device).view(-1, *([1] * (tensor.dim() - 1)))
                    states[index] = torch.where(zeroed, torch.zeros((), dtype=tensor.dtype), tensor)
    return cache
