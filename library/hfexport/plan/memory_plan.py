"""The memory a generation export's programs allocate when they load, where the format plans it for the dims' upper
bounds (ExecuTorch: `plans_memory_for_upper_bounds`), estimated from the config and the bounds before the export:
the largest attention score tensor of the encoder and decoder components, in float32, times `PLAN_OVER_LARGEST`."""

from __future__ import annotations

import math

from hfexport.models import config_int

#: A program's memory plan over its largest attention score tensor, measured on Whisper large-v3-turbo's programs at
#: the zoo's fast widths, batch 8 x 448 positions (ExecuTorch 1.5.1): encoder 4,296 MiB over 1,373 (3.1x), prefill
#: 1,670 MiB over 410 (4.1x).
PLAN_OVER_LARGEST = 4
FLOAT32_BYTES = 4


def attention_scores(config, batch: int, length: int) -> list[tuple[str, list[int]]]:
    """The attention score tensors a generation export of this config computes at its bounds, `(what, shape)`: the
    encoder's self-attention over its length (an encoder-decoder: `max_source_positions` where the model fixes it,
    else `length`), the decoder's prompt over itself and over the encoder's output."""
    decoder_heads = config_int(config, ("decoder_attention_heads", "num_attention_heads", "num_heads", "n_head"))
    if decoder_heads is None:
        return []
    scores = [("decoder self-attention", [batch, decoder_heads, length, length])]
    if getattr(config, "is_encoder_decoder", False):
        encoder = config_int(config, ("max_source_positions",)) or length
        encoder_heads = config_int(config, ("encoder_attention_heads",)) or decoder_heads
        scores += [("encoder self-attention", [batch, encoder_heads, encoder, encoder]),
                   ("decoder cross-attention", [batch, decoder_heads, length, encoder])]
    return scores


def estimate_memory_plan(config, bounds: tuple[int | None, int | None]) -> dict | None:
    """`{"bytes", "largest": {"what", "shape", "bytes"}, "bounds"}`: the memory plan's estimate at `bounds` (batch,
    length); None where a bound is unknown (the engine's own caps then decide the plan)."""
    batch, length = bounds
    if batch is None or length is None:
        return None
    scores = attention_scores(config, batch, length)
    if not scores:
        return None
    what, shape = max(scores, key=lambda item: math.prod(item[1]))
    largest = math.prod(shape) * FLOAT32_BYTES
    return {"bytes": largest * PLAN_OVER_LARGEST, "largest": {"what": what, "shape": shape, "bytes": largest},
            "bounds": {"batch": batch, "length": length}}
