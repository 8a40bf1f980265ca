"""A mixture-of-experts model's experts as ExecuTorch runs them in a program whose sequence is dynamic: every expert
on every token, weighted by the token's routing weight for it (zero where the router did not pick it).

Why not transformers' own implementations (5.23, `transformers.integrations.moe`): its default `grouped_mm` is, on
CPU, the custom op `transformers::grouped_mm_fallback`, which ExecuTorch has no kernel for (`to_executorch` stops at
"Missing out variants: {'transformers::grouped_mm_fallback'}"); `batched_mm`, which the engine's XNNPACK preparation
switches to, gathers the routed experts' weights per token and expert, a `[seq x top_k, 2 x intermediate, hidden]`
tensor that ExecuTorch's memory plan sizes for the dynamic sequence's upper bound (Qwen3-30B-A3B's layout narrowed
to hidden 512 and intermediate 256, a 2048-token cache: 17 GB, and loading the program fails with
`std::bad_alloc`); `eager` loops over the experts the data hit, which torch.export cannot trace. Here each expert
is a static slice of the stacked weights, so the plan holds one expert's activations (`[seq, 2 x intermediate]`),
at the cost of computing the experts a token was not routed to (`num_experts / top_k` times the routed work).
"""

from __future__ import annotations

import contextlib

IMPLEMENTATION = "hfexport_every_expert"


def every_expert_forward(self, hidden_states, top_k_index, top_k_weights):
    """An `@use_experts_implementation` experts module's forward (the signature of transformers' `batched_mm`):
    `hidden_states` `[tokens, hidden]`, `top_k_index`/`top_k_weights` `[tokens, top_k]`."""
    import torch

    stacked = self.gate_up_proj if self.has_gate else self.up_proj
    experts = stacked.shape[0]
    routing = torch.zeros(hidden_states.shape[0], experts, dtype=hidden_states.dtype, device=hidden_states.device)
    routing = routing.scatter(1, top_k_index, top_k_weights.to(hidden_states.dtype))

    def linear(inputs, name, expert):
        weight = getattr(self, name)[expert]
        bias = getattr(self, f"{name}_bias")[expert] if self.has_bias else None
        return torch.nn.functional.linear(inputs, weight.t() if self.is_transposed else weight, bias)

    final = torch.zeros_like(hidden_states)
    for expert in range(experts):
        if self.has_gate:
            out = self._apply_gate(linear(hidden_states, "gate_up_proj", expert))
        else:
            out = self.act_fn(linear(hidden_states, "up_proj", expert))
        out = linear(out, "down_proj", expert)
        if self.has_post_expert_norm:
            out = self.post_expert_norm(out)
        final = final + out * routing[:, expert, None]
    return final


@contextlib.contextmanager
def every_expert(model):
    """Within the block, `model`'s experts run as `every_expert_forward`, restored after; a model without an experts
    implementation (no `get_experts_implementation`, or no experts) is left as it is."""
    from transformers.integrations.moe import ExpertsInterface

    implementation = getattr(model, "get_experts_implementation", None)
    original = implementation() if implementation is not None else None
    if not original:
        yield
        return
    ExpertsInterface.register(IMPLEMENTATION, every_expert_forward)
    model.set_experts_implementation(IMPLEMENTATION)
    try:
        yield
    finally:
        model.set_experts_implementation(original)
