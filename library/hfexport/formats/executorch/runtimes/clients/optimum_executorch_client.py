"""optimum-executorch's ExecuTorchModelForCausalLM on a folder, greedy, from the prompts' token ids: run by
hfexport.formats.executorch.runtimes.optimum_executorch in the runtime's own environment (it never imports hfexport).

    python optimum_executorch_client.py FOLDER REQUEST.json

REQUEST: {"prompts": [[ids]], "max_new_tokens"}. Each prompt alone (the program has batch 1), through
`generate(prompt_ids, max_seq_len=len(prompt) + max_new_tokens)`, which returns the new ids (greedy).
ExecuTorch's LLM kernels (`llama::custom_sdpa`, `llama::update_cache`) are registered first, as its users do for a
program exported with `--use_custom_sdpa --use_custom_kv_cache`.

Prints one JSON line: {"version", "batch1": [[new ids]]}. The runtime's own logging goes to stderr.
"""

import json
import logging
import sys
from importlib.metadata import version

from executorch.extension.llm.custom_ops import custom_ops  # noqa: F401 - registers the LLM kernels the program calls
from optimum.executorch import ExecuTorchModelForCausalLM


def main():
    folder, request_path = sys.argv[1], sys.argv[2]
    with open(request_path, encoding="utf-8") as stream:
        request = json.load(stream)
    logging.basicConfig(stream=sys.stderr)
    model = ExecuTorchModelForCausalLM.from_pretrained(folder)
    batch1 = [model.generate(list(prompt), max_seq_len=len(prompt) + request["max_new_tokens"])
              for prompt in request["prompts"]]
    print(json.dumps({"version": version("optimum-executorch"), "batch1": batch1}), flush=True)


if __name__ == "__main__":
    main()
