"""ExecuTorch's programs: the engine's lowering with hfexport's fixes, each program saved with its weights in a `.ptd`
beside the `.pte` (an LLM runner program's inside), loaded with its data file, its files checked, its weights
(the `.ptd`'s named entries included) rewritten in place; an LLM runner program's 8da4w variant made from the eager
model (`hfexport.formats.executorch.variants`)."""

from __future__ import annotations

from pathlib import Path

from hfexport.files import MANIFEST_FILE, remove_variant_folder
from hfexport.formats.backend import FormatProgram
from hfexport.formats.executorch import variants as executorch_variants
from hfexport.formats.executorch import weights
from hfexport.formats.executorch.backend import data_name
from hfexport.formats.executorch.data_file import DATA_PATH, separated, write_data
from hfexport.formats.executorch.file_check import check_ptd_file, check_pte_file
from hfexport.formats.executorch.llm_program import DATA_FILE as LLM_DATA_FILE
from hfexport.formats.executorch.llm_program import is_llm_program, uses_custom_ops
from hfexport.formats.executorch.llm_program import load_program as load_executorch  # a .pte with its .ptd
from hfexport.formats.executorch.workarounds import executorch_fixes
from hfexport.processors import save_tokenizer
from hfexport.safety.artifacts import read_json


class ExecutorchProgram(FormatProgram):
    name = "executorch"
    weights = weights
    # not traced without weights (`traces_without_weights`): its emitter refuses a stride-0 placeholder and XNNPACK
    # keys each weight by its bytes' sha256 (docs/rebind.md, "ExecuTorch and the structure")

    def export_fixes(self, plan, model):
        return executorch_fixes(model)

    def save(self, model, directory, save, *args, **kwargs):
        """The engine's `save_pretrained` with each program's weights in its own `.ptd` beside the `.pte`
        (`hfexport.formats.executorch.data_file`): the engine writes the re-emitted `.pte`, then each component's data
        file."""
        from transformers.exporters import ExportedComponent

        components = model.components
        model.components = {name: ExportedComponent(separated(component.program, name), component.metadata)
                            for name, component in components.items()}
        try:
            result = save(directory, *args, **kwargs)
            entries = read_json(Path(directory) / MANIFEST_FILE, MANIFEST_FILE)["components"]
            for name, component in model.components.items():
                data = Path(directory) / data_name(entries[name]["file"])
                if not write_data(component.program, data):
                    data.unlink(missing_ok=True)  # a program with its weights inside: no older .ptd left beside it
        finally:
            model.components = components
        return result

    def after_save(self, model, directory: Path, tokenizer=None) -> None:
        if any(is_llm_program(component.metadata) for component in model.components.values()):
            save_tokenizer(Path(directory), tokenizer)  # ExecuTorch's LLM runner reads tokenizer.json beside it

    def read(self, path: Path, fetch, entry: dict, allow_unsafe_pt2: bool):
        from transformers.exporters import ExecutorchExporter

        if is_llm_program(entry["metadata"]):  # ExecuTorch's LLM runner contract: the weights inside (0.1: model.ptd)
            return load_executorch(path, fetch(LLM_DATA_FILE, False), custom_ops=uses_custom_ops(entry["metadata"]))
        data = fetch(data_name(entry["file"]), False)  # checked with the program (its backend's `program_files`)
        return load_executorch(path, data) if data is not None else ExecutorchExporter.load_program(path)

    def load_hint(self, manifest: dict, components: dict) -> str:
        without = [entry["file"] for name, entry in manifest["components"].items()
                   if not getattr(components[name].program, DATA_PATH, None)]
        return f" (there is no {data_name(without[0])} beside it: a program whose weights are kept apart cannot " \
               "load without its data file)" if without else ""

    def write_variant(self, folder: Path, variant: dict, stage: Path, model=None) -> dict:
        return executorch_variants.write(folder, variant, stage, model)

    def keep_variant(self, stage: Path, folder: Path, file_name: str) -> list[str]:
        return executorch_variants.keep(stage, folder, file_name)

    def remove_variant(self, folder: Path, file_name: str) -> None:
        remove_variant_folder(folder, file_name)

    def next_token_scores(self, stage: Path, rows: list[list[int]]) -> list[tuple[list[float], list[int]]]:
        return executorch_variants.next_token_scores(stage, rows)

    def check_files(self, found: list, file: str, label: str, source: str, allow_unsafe_pt2: bool) -> None:
        check_pte_file(found[0], label)
        if found[1] is not None:
            check_ptd_file(found[1], f"{source}/{data_name(file)}")
