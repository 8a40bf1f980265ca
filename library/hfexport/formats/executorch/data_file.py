"""ExecuTorch weights in a `.ptd` beside the `.pte`: program-data separation for the engine's ExecuTorch exports.

ExecuTorch 1.5.1 can keep a program's weights outside it: constants tagged external (`ExecutorchBackendConfig(
external_constants=...)`, i.e. `exir.passes.external_constants_pass`) are emitted as references by name, and a
delegate's named data (XNNPACK's packed weights) filed under an external tag goes into that tag's FlatTensor file
(`ExecutorchProgramManager.write_tensor_data_to_file` writes `<tag>.ptd`). The runtime is then given the data file
(`Runtime.load_program(pte, data_path=ptd)`, `_load_for_executorch(pte, data_path)`, the LLM runner's data path).
A weights-only change then changes the `.ptd` alone, and the `.pte` (the graph, the delegates' graphs, the keys)
stays byte for byte the same, which is what a rebind publishes (docs/rebind.md).

transformers 5.23's `ExecutorchExporter` has no option for it (its `ExecutorchConfig` sets only the memory plan of
`to_executorch`), so hfexport does it as a post-step on the engine's result when it is saved: `separated` re-emits the
`ExecutorchProgramManager`'s own execution programs (the same lowered graphs, no re-tracing or re-lowering) with
every constant placeholder tagged external, and files the delegates' named data under the same tag. The in-memory
export keeps running from the engine's manager as it was (its runner loads `program.buffer`, which has no data file);
only what is saved is split. ExecuTorch and optimum-executorch's documentation name the pair `model.pte` +
`model.ptd`; hfexport names each component's data file after its program (`model.ptd`, `prefill.ptd`, ...:
`data_name`).
"""

from __future__ import annotations

import os
import shutil
import tempfile
from pathlib import Path

from hfexport.formats.executorch.backend import PTD_SUFFIX, PTE_SUFFIX, data_name  # noqa: F401 - re-exported
from hfexport.formats.executorch.workarounds import drop_program_pages, weights_spilled

#: The attribute a loaded program (`executorch.runtime.Program`) keeps its data file in, beside the engine's `path`.
DATA_PATH = "data_path"


def separated(program, tag: str):
    """The engine's `ExecutorchProgramManager` re-emitted with its weights in the data file `tag` (cached on the
    manager: saving twice emits once). Anything else (a loaded program) is returned as it is."""
    from executorch.exir import ExecutorchBackendConfig, ExecutorchProgramManager
    from executorch.exir._serialize._named_data_store import NamedDataStoreOutput
    from executorch.exir.passes.external_constants_pass import external_constants_pass

    if not isinstance(program, ExecutorchProgramManager):
        return program
    cached = program.__dict__.get("_hfexport_separated")
    if cached is not None:
        return cached
    programs = {name: program.exported_program(name) for name in sorted(program.methods)}
    for exported in programs.values():
        external_constants_pass(exported.graph_module, lambda node: tag)
    named = program._named_data  # executorch 1.5.1: the delegates' named data the manager was built with
    if named is not None:
        external = {key: dict(entries) for key, entries in named.external_data.items()}
        external.setdefault(tag, {}).update(named.pte_data)
        named = NamedDataStoreOutput(buffers=named.buffers, pte_data={}, external_data=external)
    # The engine's to_executorch config differs from the defaults only in its memory plan, which has already run.
    # Emitted as the export's were: the constants it copies spilled to disk, the pages it read handed back.
    with weights_spilled():
        split = ExecutorchProgramManager(programs, program._config_methods, ExecutorchBackendConfig(), named)
    for exported in programs.values():
        drop_program_pages(exported)
    program.__dict__["_hfexport_separated"] = split
    return split


def write_data(program, destination: Path) -> bool:
    """Write the data file of a saved component's program to `destination` (a separated manager's one data file, or a
    loaded program's own `.ptd`), atomically; False when the program keeps its weights inside."""
    from executorch.exir import ExecutorchProgramManager

    destination = Path(destination)
    if isinstance(program, ExecutorchProgramManager):
        if not program._tensor_data:
            return False
        if len(program._tensor_data) != 1:
            raise ValueError(f"{destination.name}: the program has {len(program._tensor_data)} data files, hfexport "
                             "saves one per program")
        with tempfile.TemporaryDirectory(dir=destination.parent) as staging:
            program.write_tensor_data_to_file(staging)
            (written,) = Path(staging).iterdir()
            os.replace(written, destination)
        return True
    source = getattr(program, DATA_PATH, None)
    if not source:
        return False
    if Path(source).resolve() != destination.resolve():
        partial = destination.with_name(f".{destination.name}.partial")
        shutil.copyfile(source, partial)
        os.replace(partial, destination)
    return True
