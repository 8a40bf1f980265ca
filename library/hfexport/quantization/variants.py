"""A target's `variants`: what it publishes beside its full-precision files, each made from the one export and gated.

For ONNX the names are transformers.js' dtypes (`fp16`, `q8`, `q4`, `q4f16`), published under its file suffixes
(`model_fp16.onnx`, `model_quantized.onnx`, `model_q4.onnx`, `model_q4f16.onnx`) so that transformers.js opens each by
`dtype` alone. A recipe item is a name or an object with its name and settings (`settings` fills in the defaults):

- `q4`, `q4f16`: ONNX Runtime's `MatMulNBits`: `block_size` (32), `symmetric` (true), `accuracy_level` (4, as
  onnxruntime-genai's builder; 0 unset), `fused_attention` (true; also q8's: `formats.onnx.attention_fusion`).
  `head_bits` (8: a 4-bit head fails SmolLM2's runtime gate); `tied_embedding` (true): a tied embedding reads the
  head's blocks, as onnxruntime-genai's builder stores it (false: a float32 table, as transformers.js).
- `q8`: `weights_only` (true): 8-bit `MatMulNBits` blocks of `block_size` (None: the largest power of two to 128
  dividing every layer's input, 64 on SmolLM2; `accuracy_level` 4), the tied embedding reading the head's; false:
  ONNX Runtime's dynamic quantization as transformers.js' script makes q8 (`per_channel`, `reduce_range`: hfexport's
  `ort_dynamic` defaults; uint8 where WASM lacks int8).
- OpenVINO `int8`, `int4` (optimum-intel's weight formats, NNCF's `compress_weights` on the converted model, each in
  a folder of its own, `openvino/int4/`): int8 weight-only asymmetric per channel; int4 asymmetric in groups of
  `group_size` (default: 128 where it divides every linear layer's input, else the largest power of two that does;
  a stated one that does not divide is refused: `quantization.shapes`), `ratio` of the layers 4-bit (1.0, else int8).
- ExecuTorch `8da4w` (optimum-executorch's, `executorch/8da4w/model.pte`: `hfexport.formats.executorch.variants`):
  4-bit linear weights in groups of `group_size` (default 32, resolved and checked as int4's), the head `head`
  (default `8da8w`: 8-bit per channel; or `8da4w`), the embedding `embedding` (default `4w` in the same groups; or
  `8w` per row); for a target in ExecuTorch's LLM runner contract only.
- every variant: `max_nll_ratio` and `min_top1_agreement`, its bounds against float32 on the sample texts
  (`DEFAULT_BOUNDS`, measured on SmolLM2-135M-Instruct: docs/quantization.md, "Variants").
`variant_problems` is the recipe's check (pure data: no backend imported).
"""

from __future__ import annotations

from hfexport.errors import Problem
from hfexport.formats import format_traits, formats
from hfexport.quantization.spec import DEFAULT_PARAMS

#: the settings each variant takes, and their defaults
#: accuracy_level 4 (int8 activations inside MatMulNBits): the kernel onnxruntime-genai's builder sets on CPU,
#: several times faster there than unset's float32 path, at ratios within the bounds (docs/quantization.md, "Variants")
FOUR_BIT = {"block_size": 32, "symmetric": True, "accuracy_level": 4, "head_bits": 8, "tied_embedding": True,
            "fused_attention": True}
EIGHT_BIT = {"weights_only": True, "block_size": None, "accuracy_level": 4, "tied_embedding": True,
             "fused_attention": True, **{key: DEFAULT_PARAMS["ort_dynamic"][key] for key in ("per_channel", "reduce_range")}}
GROUPED_FOUR_BIT = {"group_size": None, "ratio": 1.0}  # group_size None: resolved from the model's layer sizes
SETTINGS = {"fp16": {}, "q8": EIGHT_BIT, "q4": FOUR_BIT, "q4f16": FOUR_BIT, "int8": {}, "int4": GROUPED_FOUR_BIT,
            "8da4w": {"group_size": None, "head": "8da8w", "embedding": "4w"}}  # group None: from the layer sizes
LOW_BIT = ("q4", "q4f16", "int4", "8da4w")
BLOCKED = ("q8", "q4", "q4f16")  # MatMulNBits' blocks: `block_size` a power of two
#: what puts an ExecuTorch generation target out of the LLM runner's contract, which its variants are made of
#: (`hfexport.recipe.data.Target.llm_runner_by_default`, `hfexport.plan.decoder.llm_runner_plan`)
_NOT_LLM_RUNNER = {"generation": ("single_graph", "multi_token_decode", "cache_implementation"),
                   "": ("components", "dynamic_shapes")}
#: (max_nll_ratio, min_top1_agreement) per variant: the perplexity ratio to the float32 export on the sample texts
#: and the share of their positions whose next token is the float32 export's (docs/quantization.md, "Variants")
DEFAULT_BOUNDS = {"fp16": (1.01, 0.97), "q8": (1.10, 0.85), "q4": (1.35, 0.60), "q4f16": (1.35, 0.60),
                  "int8": (1.10, 0.85), "int4": (1.50, 0.60), "8da4w": (1.60, 0.55)}
_BOUND_KEYS = ("max_nll_ratio", "min_top1_agreement")


def settings(item) -> dict:
    """A recipe item (a name or an object) as its full settings: `name`, the variant's settings with their defaults,
    and its bounds."""
    item = {"name": item} if isinstance(item, str) else dict(item)
    name = item["name"]
    bounds = dict(zip(_BOUND_KEYS, DEFAULT_BOUNDS[name]))
    return {"name": name, **SETTINGS[name], **bounds, **item}


def variant_problems(target: dict, export_format: str, base: list) -> list[Problem]:
    """Every problem of a target's `variants` (the schema has passed): a format or mode that publishes none, a
    quantized or float16 target (a variant is made from full-precision files), a name twice, a setting of another
    variant, a block size that is not a power of two."""
    path = ".".join(map(str, [*base, "variants"]))
    offered = format_traits(export_format).variants
    if not offered:
        return [Problem(path, f"{export_format} publishes no variants; formats with variants: "
                              f"{', '.join(variant_formats())}")]
    if target.get("mode", "forward") != "generation":
        return [Problem(path, "variants are made for a generation target (their quality gate generates); set mode "
                              "\"generation\"")]
    if target.get("quantization") or target.get("dtype"):
        what = "quantization" if target.get("quantization") else "dtype"
        return [Problem(path, f"variants are made from the target's full-precision files; a target with {what} "
                              "has none: make the variants on a target without it")]
    if format_traits(export_format).llm_program:
        problems = _llm_runner_problems(target, path)
        if problems:
            return problems
    problems, seen = [], set()
    for index, item in enumerate(target["variants"]):
        name = item if isinstance(item, str) else item["name"]
        where = f"{path}.{index}"
        if name not in offered:
            problems.append(Problem(where, f"{name!r} is not a variant of {export_format}; it has: {', '.join(offered)}"))
            continue
        if name in seen:
            problems.append(Problem(where, f"{name!r} is listed twice"))
        seen.add(name)
        if isinstance(item, dict):
            for key in item:
                if key not in ("name", *_BOUND_KEYS, *SETTINGS[name]):
                    takes = ", ".join((*SETTINGS[name], *_BOUND_KEYS))
                    problems.append(Problem(f"{where}.{key}", f"not a setting of {name}; it takes: {takes}"))
            block = item.get("block_size")
            if name in BLOCKED and isinstance(block, int) and block & (block - 1):
                problems.append(Problem(f"{where}.block_size", f"MatMulNBits takes a power of two from 16; got {block} "
                                        f"(e.g. {1 << (block.bit_length() - 1)})"))
    return problems


def _llm_runner_problems(target: dict, path: str) -> list[Problem]:
    """An ExecuTorch target whose recipe keeps the engine's graphs rather than the LLM runner's one program (what
    its variants are made of: `hfexport.formats.executorch.variants`)."""
    found = [f"{section}.{key}".lstrip(".") for section, keys in _NOT_LLM_RUNNER.items() for key in keys
             if key in ((target.get(section) or {}) if section else target)]
    backend = (target.get("options") or {}).get("backend", "xnnpack")
    if backend != "xnnpack":
        found.append(f"options.backend {backend!r}")
    if not found:
        return []
    return [Problem(path, f"ExecuTorch's variants are made of the LLM runner's program, which a target that sets "
                          f"{', '.join(found)} does not export (it keeps the engine's graphs): leave "
                          f"{'it' if len(found) == 1 else 'them'} out")]


def variant_formats() -> list[str]:
    """The formats whose targets publish variants."""
    return [backend.name for backend in formats() if backend.variants]
