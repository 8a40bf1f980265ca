"""optimum-executorch's `ExecuTorchModelForCausalLM` on an ExecuTorch generation export in the LLM runner's contract
(`hfexport.formats.executorch.llm_program`), as its users run it: `from_pretrained(folder)` loads `model.pte`, then greedy
`generate(prompt_ids, max_seq_len=...)` on each sample prompt's token ids (batch 1: the program has no batch).

optimum-executorch 1.1.0 (PyPI) pins transformers 5.0.0rc1, so it runs in an environment of its own, named by
`HFEXPORT_RUNTIME_OPTIMUM_EXECUTORCH` (the tests build it with `hfexport.testing.peers.optimum_executorch_venv`), else
beside hfexport where `optimum.executorch` is importable. It loads `model.pte` alone (`modeling.py`:
`_load_for_executorch(model_cache_path)`, no data file), so a program that hfexport 0.1 published with its weights in
`model.ptd` cannot run there (its first forward fails: `external_data_map is null`): such a folder is `not_checked`
with that reason. Its `generate` reads `logits[0, -1]` after the prompt and stops at the program's `get_eos_ids`
without checking the first token: the gate cuts after the first EOS, as `model.generate` stops.
"""

from __future__ import annotations

from pathlib import Path

from hfexport.deployment import FAILED, NOT_CHECKED, GenerationRequest, RuntimeCheck, RuntimeClientError, judge_tokens
from hfexport.deployment._python import as_expected, interpreter, run_python_client
from hfexport.formats.executorch.runtimes.executorch_llm_runner import is_llm_program_folder
from hfexport.formats.executorch.llm_program import DATA_FILE

RUNTIME = "optimum-executorch"
MODULE = "optimum.executorch"
CLIENT = Path(__file__).resolve().parent / "clients" / "optimum_executorch_client.py"


def check_generation(folder: Path, request: GenerationRequest) -> RuntimeCheck:
    """`ExecuTorchModelForCausalLM` on `folder`: token for token at batch 1 against `model.generate`."""
    folder = Path(folder)
    if request.is_encoder_decoder or not is_llm_program_folder(folder):
        return RuntimeCheck(RUNTIME, NOT_CHECKED, reason="not in the LLM runner's contract (no model.pte holding its "
                            "cache): optimum-executorch runs only such programs")
    if (folder / DATA_FILE).is_file():
        return RuntimeCheck(RUNTIME, NOT_CHECKED, reason="the weights are in model.ptd (as hfexport 0.1 published "
                            "them): optimum-executorch 1.1.0 loads model.pte alone (its first forward fails: "
                            "external_data_map is null); export again for a program with its weights inside")
    python = interpreter(RUNTIME, MODULE)
    if python is None:
        return RuntimeCheck(RUNTIME, NOT_CHECKED, reason="not installed (pip install optimum-executorch, in an "
                            "environment of its own: it pins transformers 5.0.0rc1; set "
                            "HFEXPORT_RUNTIME_OPTIMUM_EXECUTORCH to its python)")
    payload = {"prompts": request.prompts, "max_new_tokens": request.max_new_tokens}
    try:
        result = run_python_client(python, CLIENT, folder, payload, request.timeout_s)
    except RuntimeClientError as error:
        return RuntimeCheck(RUNTIME, FAILED, reason=str(error), batch_sizes=[1], precision="f32")
    got = as_expected(request, request.expected, result["batch1"])
    return judge_tokens(RUNTIME, request, request.expected, got, version=result.get("version"), batch_sizes=[1],
                        precision="f32")
