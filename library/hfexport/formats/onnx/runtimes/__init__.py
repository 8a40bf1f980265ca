"""The deployment runtimes of ONNX exports: transformers.js, optimum, onnxruntime-genai."""

import json
from pathlib import Path


def exported_config(folder: Path) -> dict:
    """An export's config.json (beside its graph), which a runtime's `limitation(config)` reads at the gate as the
    plan read the model's before the export; {} where it cannot be read."""
    try:
        config = json.loads((Path(folder) / "config.json").read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return {}
    return config if isinstance(config, dict) else {}
