"""optimum-executorch's `ExecuTorchModelForCausalLM` on an ExecuTorch generation export: reported `not_checked`, with
the reason measured.

optimum-executorch 1.1.0 (PyPI; it pins transformers 5.0.0rc1, so it lives in an environment of its own:
`hfexport.testing.peers.peer_venv(("optimum-executorch==1.1.0",))`) loads `model.pte` alone
(`modeling.py`: `_load_for_executorch(model_cache_path)`, no data file), so a program whose weights are in
`model.ptd` (ExecuTorch's LLM runner contract as hfexport saves it: `hfexport.executorch_llm`) loads, and its first
`forward` fails in ExecuTorch (`method.cpp: external_data_map is null`, error 0x2; measured on tiny-llama). The gate
says so rather than failing the target for a loader that cannot read the data file the runner takes.
"""

from __future__ import annotations

from pathlib import Path

from hfexport.deployment import NOT_CHECKED, GenerationRequest, RuntimeCheck

RUNTIME = "optimum-executorch"
DATA_FILE = "model.ptd"


def check(folder: Path, request: GenerationRequest) -> RuntimeCheck:
    """`not_checked`: why optimum-executorch cannot run this folder (see the module docstring)."""
    if (Path(folder) / DATA_FILE).is_file():
        return RuntimeCheck(RUNTIME, NOT_CHECKED, reason="optimum-executorch 1.1.0 loads model.pte alone, not the "
                            "weights in model.ptd (its first forward fails: external_data_map is null); "
                            "TextLLMRunner takes the .ptd")
    return RuntimeCheck(RUNTIME, NOT_CHECKED, reason="not in the LLM runner's contract (no model.pte holding its "
                        "cache): optimum-executorch runs only such programs")
