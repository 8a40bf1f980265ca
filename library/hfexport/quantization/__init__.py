"""Quantization from recipes.

- `spec`: the plain-JSON `quantization` section: methods x formats, presets, parameters and their defaults,
  the static checks run when a recipe loads (no backend imported)
- `quantizer`: the engine's quantizer objects built from a section, attached to a plan's components
- `calibration`: calibration sets from the recipe's samples, files or datasets
"""
