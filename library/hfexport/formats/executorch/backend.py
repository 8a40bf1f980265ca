"""ExecuTorch as the layers see it: `executorch/model.pte` with its weights in `model.ptd`, deployed by ExecuTorch's
LLM runner and optimum-executorch (one program that holds its cache)."""

from __future__ import annotations

from hfexport.formats.backend import COMMON_OPTIONS, CardTarget, FormatBackend, register_format

PTE_SUFFIX, PTD_SUFFIX = ".pte", ".ptd"


def data_name(program_file: str) -> str:
    """`model.pte` -> `model.ptd`: the data file of a component's program."""
    return program_file.removesuffix(PTE_SUFFIX) + PTD_SUFFIX


@register_format
class ExecutorchFormat(FormatBackend):
    name = "executorch"
    label = "ExecuTorch"
    aliases = ("pte",)
    runtime_label = "ExecuTorch"
    runtime_package = "executorch"
    folder = "executorch"
    default_file = "model.pte"
    companion_files = ("model.ptd",)  # the loader reads `<stem>.pte`'s `.ptd`
    hub_tag = "executorch"
    extra = "executorch"
    packages = ("executorch",)
    target_name = "pte"
    init_options = {"backend": "xnnpack"}
    options = (*COMMON_OPTIONS, "backend", "alloc_graph_input", "alloc_graph_output", "alloc_mutable_buffers")
    # measured: Llama-3.2-1B's config at full depth, its LLM runner program, peaked while saving (the weight map
    # reads the written .pte beside the model) at 1 GiB + 3.9x and 4.1x its f32 weights in two runs; through its
    # gate, 1 GiB + 4.5x on SmolLM2-135M-Instruct (float32 on disk: its mapped pages too) and 2.9x on a 2-layer
    # Llama-3.2-1B config (bfloat16; benchmarks/results/stage_memory_variants.json): the full depth's peak with a
    # margin, within 25% of the others
    memory_factor = 4.2
    export_cost = 4.0
    runtimes = ("hfexport.formats.executorch.runtimes.executorch_llm_runner",
                "hfexport.formats.executorch.runtimes.optimum_executorch")
    checks_input_spec = True
    llm_program = True
    plans_memory_for_upper_bounds = True
    # ExecuTorch keeps only what its XNNPACK delegate lowers: the XNNPACK PT2E presets, on the xnnpack backend.
    quantized_lowerings = ("xnnpack",)
    variants = ("8da4w",)  # optimum-executorch's qlinear=8da4w, qembedding=8w (hfexport.formats.executorch.variants)

    def variant_file(self, name: str) -> str:
        # a folder per variant: optimum-executorch opens a program named model.pte only (its stem is the model)
        if name not in self.variants:
            return super().variant_file(name)
        return f"{name}/{self.default_file}"

    def program_files(self, file: str) -> list[tuple[str, bool]]:
        # its weights in `<stem>.ptd` (hfexport.formats.executorch.data_file); older exports: none
        return [(file, True), (data_name(file), False)]

    def runtime_snippets(self, repo_id: str, target: CardTarget, passed: list[str]) -> list[str]:
        folder, lines = target.folder, []
        if "executorch-llm-runner" in passed:
            lines += ["```python", "from huggingface_hub import snapshot_download",
                      "from executorch.extension.llm.custom_ops import custom_ops  # registers the LLM kernels",
                      "from executorch.extension.llm.runner import GenerationConfig, TextLLMRunner", "",
                      f'local = snapshot_download("{repo_id}", allow_patterns=["{folder}/*"]) + "/{folder}"',
                      'runner = TextLLMRunner(f"{local}/model.pte", f"{local}/tokenizer.json")',
                      "# greedy; num_bos=1 where the tokenizer starts a prompt with its BOS token",
                      'runner.generate("The capital of France is", GenerationConfig(echo=False, max_new_tokens=20, '
                      'temperature=0.0))', "```", ""]
        if "optimum-executorch" in passed:
            lines += ["```python", "from huggingface_hub import snapshot_download",
                      "from executorch.extension.llm.custom_ops import custom_ops  # registers the LLM kernels",
                      "from optimum.executorch import ExecuTorchModelForCausalLM",
                      "from tokenizers import Tokenizer", "",
                      f'local = snapshot_download("{repo_id}", allow_patterns=["{folder}/*"]) + "/{folder}"',
                      'model = ExecuTorchModelForCausalLM.from_pretrained(local)',
                      'tokenizer = Tokenizer.from_file(f"{local}/tokenizer.json")',
                      'prompt = tokenizer.encode("The capital of France is").ids',
                      "print(tokenizer.decode(model.generate(prompt, max_seq_len=len(prompt) + 20)))  # greedy",
                      "```", ""]
        return lines
