"""Every default parity threshold in one place (docs/parity.md's table is checked against it), and `thresholds_for`,
the one function that resolves a target's thresholds: defaults per format, dtype, runtime precision and
quantization method, then the recipe's `parity`.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from hfexport.formats import format_traits
from hfexport.layout import format_label

DEFAULT_MAX_NEW_TOKENS = 8  # greedy tokens generated per prompt by a generation target's check
EXACT_TOKEN_AGREEMENT = 1.0  # a float32 generation target must agree with model.generate token for token


# Defaults per format (float32: each format's `fp32_tolerance`) and precision; the recipe's `parity` overrides them
# (globally, then per output). None: that check does not apply (quantized artifacts are judged on direction and top-1,
# not on elements).


_HALF = (1e-2, 1e-2, 0.999, 0.95)
_FP16_WEIGHTS = (5e-3, 1e-2, 0.9995, 0.98)


# A float32 graph run at a reduced *runtime* precision (OpenVINO's CPU plugin: bf16 by default on CPUs with
# AVX512-BF16/AMX). Element-wise bounds do not hold there: bf16 rounding compounds over a real decoder's layers
# (SmolLM2-135M logits: max_abs 1.4 at bf16, top-1 still 1.0), so outputs are judged by direction and decisions, as
# quantized ones are. The graph itself is checked at f32 against the strict rows. Figures: docs/parity.md.
_RUNTIME = {"bf16": (None, None, 0.998, 0.95), "f16": (None, None, 0.9995, 0.95)}


# Greedy decoding at a reduced runtime precision: near-tied logits flip a pick and the rest of that row then
# diverges (SmolLM2-135M at bf16: 0.69 over 3 chat prompts x 16 tokens), so token agreement has a floor; a broken
# graph diverges from the first tokens.
RUNTIME_MIN_TOKEN_AGREEMENT = {"bf16": 0.5, "f16": 0.75}
_TOLERANCE_KEYS = ("atol", "rtol", "min_cosine", "min_top1")


# Shape probes of a quantized target prove it runs at every declared size: shapes and finiteness only.
SHAPE_ONLY = {"default": {}, "outputs": {}, "basis": "shape probe: shapes and finite values only"}


def default_tolerance(export_format: str, dtype: str = "float32", quantized: bool = False,
                      options: dict | None = None, precision: str = "f32") -> dict:
    """The thresholds an artifact meets unless its recipe says otherwise (the table in docs/parity.md).

    `precision` is the precision the runtime computes at (read back from it): a float32 graph that OpenVINO runs
    in bf16 is judged by the bf16 row, not by float32's."""
    if quantized:  # 8-bit; `default_parity` has the rows per method and bit width
        values = tuple(default_parity("", "forward")[key] for key in _TOLERANCE_KEYS)
    elif precision in _RUNTIME:
        values = _RUNTIME[precision]
    elif dtype in ("float16", "bfloat16"):
        values = _HALF
    elif format_traits(export_format).half_weights_option and \
            (options or {}).get(format_traits(export_format).half_weights_option):
        values = _FP16_WEIGHTS
    else:
        values = format_traits(export_format).fp32_tolerance
    return dict(zip(_TOLERANCE_KEYS, values))


@dataclass(frozen=True)
class Thresholds:
    """What one verification of a target must meet.

    `tolerances` is `{"default": {...}, "outputs": {name: {...}}, "basis": "..."}` (what reports record); the
    generation check decodes `max_new_tokens` greedy tokens per prompt and needs `min_token_agreement` of them to
    match `model.generate`."""
    tolerances: dict
    max_new_tokens: int
    min_token_agreement: float


def resolve(target, dtype: str = "float32", precision: str = "f32") -> Thresholds:
    """The one resolution of a target's thresholds: defaults per format, dtype, runtime precision and quantization
    method, under the recipe's `parity`.

    Args:
        target: the recipe `Target` (its `parity`, `quantization`, `export_format`, `options`, `mode`).
        dtype: the dtype the graph was exported in (`ExportMetadata.export_dtype`).
        precision: the precision the runtime computes at, read back from it (`f32`, `bf16`, `f16`). At a reduced
            runtime precision the recipe's float thresholds (made for the float32 graph) do not apply: the recipe
            pins `runtime.precision` to be judged, and run, at float32.

    Returns:
        `Thresholds`.
    """
    generate = dict((target.parity or {}).get("generate") or {})
    if target.quantization:  # token agreement over N tokens with a minimum fraction, unless the recipe says more
        quantized = default_parity(target.quantization["method"], target.mode, target.quantization.get("params"))
        generate = {**quantized.get("generate", {}), **generate}
    agreement = float(generate.get("min_token_agreement", EXACT_TOKEN_AGREEMENT))
    if precision in RUNTIME_MIN_TOKEN_AGREEMENT:
        agreement = min(agreement, RUNTIME_MIN_TOKEN_AGREEMENT[precision])
    return Thresholds(_tolerances(target, dtype, precision), int(generate.get("max_new_tokens", DEFAULT_MAX_NEW_TOKENS)),
                      agreement)


def thresholds_for(target, dtype: str = "float32", precision: str = "f32") -> dict:
    """`resolve(...).tolerances`: the output tolerances alone."""
    return _tolerances(target, dtype, precision)


def _tolerances(target, dtype: str, precision: str) -> dict:
    parity = target.parity or {}
    default = default_tolerance(target.export_format, dtype, bool(target.quantization), target.options, precision)
    reduced = precision in _RUNTIME and not target.quantization
    if target.quantization:  # per method and bit width
        quantized = default_parity(target.quantization["method"], target.mode, target.quantization.get("params"))
        default.update({key: quantized[key] for key in _TOLERANCE_KEYS})
    overridden = [] if reduced else [key for key in _TOLERANCE_KEYS if key in parity]
    default.update({key: parity[key] for key in overridden})
    outputs = {} if reduced else {name: {**default, **values} for name, values in (parity.get("outputs") or {}).items()}
    what = "quantized" if target.quantization else (f"{dtype} graph at {precision} runtime precision" if reduced
                                                    else dtype)
    basis = f"defaults for {format_label(target.export_format)} {what}"
    if overridden or outputs:
        basis += " with the recipe's parity"
    return {"default": default, "outputs": outputs, "basis": basis}


def tolerance_of(thresholds: dict, output: str) -> dict:
    outputs = thresholds["outputs"]
    return outputs.get(output) or outputs.get(output.split(".")[0]) or thresholds["default"]


# ── The quality gate ─────────────────────────────────────────────────────────

_LOW_BIT = ("int4", "uint4", "nf4", "mxfp4", "fp4", "int3", "int2")


def default_parity(method: str, mode: str, params: dict | None = None) -> dict:
    """Parity thresholds for a quantized target, in the recipe's `parity` vocabulary (the recipe's own win).

    Quantization moves every value a little, so absolute tolerances are off (`atol`/`rtol` None) and outputs are
    judged by direction and decisions: cosine similarity per output, top-1 agreement of logits, and for generation
    the fraction of greedy tokens that agree with the eager model over `max_new_tokens`.
    """
    params = params or {}
    low_bit = any(str(params.get(key, "")).startswith(_LOW_BIT) for key in ("mode", "weight_type"))
    thresholds: dict[str, Any] = {
        "atol": None,
        "rtol": None,
        "min_cosine": 0.95 if low_bit else 0.98,
        "min_top1": 0.8 if low_bit else 0.9,
    }
    if mode == "generation":
        thresholds["generate"] = {"max_new_tokens": 16, "min_token_agreement": 0.5 if low_bit else 0.75}
    return thresholds
