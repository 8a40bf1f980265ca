"""Planning an encoder-decoder's generation (seq2seq, Whisper): the engine splits prefill/decode; hfexport adds
the `encoder` that `generate` ran, and traces with two decoder start tokens so both stay dynamic."""

from __future__ import annotations

from hfexport.errors import PlanError
from hfexport.plan.tracing import call_capture
from hfexport.recipe.data import Target


def check_default_layout(target: Target, generation_config, multi_token_decode: bool) -> None:
    """An encoder-decoder exports with the default layout only."""
    if generation_config is not None or multi_token_decode:
        raise PlanError(f"targets.{target.name}.generation: an encoder-decoder exports with the default layout "
                        "(a DynamicCache of one token per step); static caches, multi-token decode and single "
                        "graphs are for decoder-only models")


def with_encoder(target: Target, model, stages: dict, encoder_calls: list) -> dict:
    """`stages` with hfexport's `encoder` first, traced with the kwargs generate passed it."""
    import torch

    if not encoder_calls:
        raise PlanError(f"targets.{target.name}: generate() never ran {type(model).__name__}'s encoder")
    encoder_inputs = {key: value for key, value in encoder_calls[0].items() if isinstance(value, torch.Tensor)}
    return {"encoder": (model.get_encoder(), encoder_inputs), **stages}


def encoder_capture(model):
    """The kwargs of every call to `model.get_encoder()` within the block (nothing when `model` is None).

    transformers 5.23's `decompose_for_generation` captures an encoder-decoder's prefill/decode only; `generate`
    runs the encoder before them, so hfexport exports it as a third component, traced with what generate passed."""
    return call_capture(model.get_encoder() if model is not None else None, "forward")


def seq2seq_trace_inputs(model, inputs: dict) -> dict:
    """Generate kwargs that trace an encoder-decoder with two decoder prompt tokens.

    With the usual one-token decoder prompt, the decode step is captured with a one-token self-attention cache,
    and torch.export specializes a size-1 axis: the exported decode would only ever run the second token. Two
    start tokens make the prefill's decoder axis and the decode's cache axis 2 at trace time, so both stay
    dynamic (generate then feeds the prefill one token, as model.generate does)."""
    import torch

    if "decoder_input_ids" in inputs:
        return dict(inputs)
    start = model.generation_config.decoder_start_token_id
    if start is None:
        start = model.config.decoder_start_token_id
    if start is None:
        raise PlanError("the encoder-decoder has no decoder_start_token_id (generation_config or config)")
    start = start[0] if isinstance(start, (list, tuple)) else int(start)
    batch = next(value.shape[0] for value in inputs.values() if isinstance(value, torch.Tensor))
    return {**inputs, "decoder_input_ids": torch.full((batch, 2), start, dtype=torch.long)}
