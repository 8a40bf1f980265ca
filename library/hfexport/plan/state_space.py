"""Planning a state-space model's generation (Mamba): where a format would trace its prefill at the sample's length
only, the decode is exported alone and `generate` runs the prompt through it."""

from __future__ import annotations

from hfexport.workarounds.transformers_models import prefill_by_decode


def exports_decode_alone(model, export_format: str, stages: dict) -> bool:
    """Whether this model's prefill on `export_format` would take the sample's length only
    (`hfexport.workarounds.transformers_models.prefill_by_decode`): on that format Mamba's scan stays the engine's
    loop unrolled at the sample's length (modeling_fixes). The decode is the same recurrence for one token: export it
    alone; generate feeds it the prompt token by token, from a zero state."""
    return prefill_by_decode(model, export_format) and "prefill" in stages

