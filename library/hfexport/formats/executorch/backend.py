"""ExecuTorch as the layers see it: `executorch/model.pte` with its weights in `model.ptd`, deployed by ExecuTorch's
LLM runner and optimum-executorch (one program that holds its cache)."""

from __future__ import annotations

from hfexport.formats.backend import COMMON_OPTIONS, FormatBackend, register_format

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
    memory_factor = 4.0
    export_cost = 4.0
    runtimes = ("hfexport.formats.executorch.runtimes.executorch_llm_runner",
                "hfexport.formats.executorch.runtimes.optimum_executorch")
    checks_input_spec = True
    llm_program = True
    # ExecuTorch keeps only what its XNNPACK delegate lowers: the XNNPACK PT2E presets, on the xnnpack backend.
    quantized_lowerings = ("xnnpack",)

    def program_files(self, file: str) -> list[tuple[str, bool]]:
        # its weights in `<stem>.ptd` (hfexport.formats.executorch.data_file); older exports: none
        return [(file, True), (data_name(file), False)]
