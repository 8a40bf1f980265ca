"""Parity verification: does the artifact on disk compute what the model computes?

- `thresholds`: the default thresholds per format, precision and quantization, and the recipe's overrides
- `probes`: the probe inputs that cover the declared dynamic ranges
- `parity`: output-by-output comparison (max abs/rel, cosine, top-1)
- `check`: `verify_exported` (forward and generation probes, the runtime-precision check)
"""
