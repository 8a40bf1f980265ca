"""ONNX's programs: the engine's export with onnxscript's fix and onnxruntime's fusion-ready rewrites, saved in the
runtimes' contracts (float16 conversion, the decoder, seq2seq and image-text-to-text layouts), loaded lazily on ONNX Runtime from the
checked file, its files checked, its weights rewritten in place, its external data renamed when published."""

from __future__ import annotations

from pathlib import Path

from hfexport.formats.backend import FormatProgram
from hfexport.formats.onnx import decoder_contract, weights
from hfexport.formats.onnx import float16 as onnx_float16
from hfexport.formats.onnx import image_text_contract
from hfexport.formats.onnx import seq2seq_contract as onnx_seq2seq
from hfexport.formats.onnx import variants as onnx_variants
from hfexport.formats.onnx.onnxruntime_workarounds import (
    broadcast_grouped_query_caches,
    fuse_ready_key_transposes,
    fuse_ready_rms_norms,
)
from hfexport.formats.onnx.onnxscript_workarounds import onnx_fixes
from hfexport.processors import save_tokenizer
from hfexport.formats.onnx.file_check import check_onnx_file


class OnnxProgram(FormatProgram):
    name = "onnx"
    weights = weights
    traces_without_weights = True  # measured, docs/publishing.md "Memory"

    def mapped_weight_bytes(self, target, loaded: int) -> int:
        return loaded // 2 if target.dtype == onnx_float16.FLOAT16 else loaded

    def export_fixes(self, plan, model):
        return onnx_fixes()

    def after_export(self, exported) -> None:
        # onnxruntime's RMSNorm fusion matches x / sqrt(v), the exporter writes x * (1 / sqrt(v)); its matmul
        # folds a key transpose the exporter writes through a 3-d view only as one Transpose; nothing in it undoes
        # repeat_kv's copies of a grouped-query cache (hfexport.formats.onnx.onnxruntime_workarounds)
        for component in exported.components.values():
            fuse_ready_rms_norms(component.program)
            fuse_ready_key_transposes(component.program)
            broadcast_grouped_query_caches(component.program)

    def after_save(self, model, directory: Path, tokenizer=None) -> None:
        if model.save_dtype == onnx_float16.FLOAT16:
            onnx_float16.convert(Path(directory))
        decoder_contract.to_contract(Path(directory))
        onnx_seq2seq.to_contract(Path(directory))
        image_text_contract.to_contract(Path(directory))

    def after_rebind(self, directory: Path, model=None) -> None:
        # transformers.js' image-text-to-text graphs are copies of the VLM components' weights: written again
        image_text_contract.to_contract(Path(directory))

    def save_processor(self, directory: Path, processor) -> None:
        in_contract = (directory / decoder_contract.GENAI_CONFIG_FILE).is_file() or \
            (directory / onnx_seq2seq.DECODER_FILE).is_file()
        if in_contract and hasattr(processor, "save_pretrained"):
            processor.save_pretrained(directory)  # the loaders' contract: the tokenizer beside the graph
            save_tokenizer(directory, processor)  # its class as transformers 4.x (optimum's) reads it too
            image_text_contract.save_processor_files(directory, processor)  # transformers.js' flat files

    def write_variant(self, folder: Path, variant: dict, stage: Path, model=None) -> dict:
        return onnx_variants.write(folder, variant, stage)

    def keep_variant(self, stage: Path, folder: Path, file_name: str) -> list[str]:
        return onnx_variants.keep(stage, folder, file_name)

    def next_token_scores(self, stage: Path, rows: list[list[int]]) -> list[tuple[list[float], list[int]]]:
        return onnx_variants.next_token_scores(stage, rows)

    def runner(self):
        from hfexport.formats.onnx.file_runner import OnnxFileRunner

        return OnnxFileRunner

    def generation_runner_options(self) -> dict:
        # many short runs with torch between them (see the function's docstring)
        return {"session_options": generation_session_options()}

    def lean_load_options(self) -> dict:
        # the weights memory-mapped, not packed into a copy (see generation_session_options)
        return {"session_options": generation_session_options(prepacking=False)}

    def component(self, path: Path, metadata, fetch, entry: dict, label: str):
        # ONNX Runtime opens the checked file; the graph is parsed on demand
        from hfexport.formats.onnx.file_component import OnnxFileComponent

        return OnnxFileComponent(path, metadata, _data(fetch, entry), label)

    def read(self, path: Path, fetch, entry: dict, allow_unsafe_pt2: bool):
        from hfexport.formats.onnx.file_component import read_onnx

        return read_onnx(path, _data(fetch, entry))

    def check_files(self, found: list, file: str, label: str, source: str, allow_unsafe_pt2: bool) -> None:
        check_onnx_file(found[0], found[1], label, data_alt=found[2])

    def published(self, files: dict[str, Path], names: dict[str, str]) -> dict[str, bytes]:
        # the engine's `X.onnx.data`, or the contract's `model.onnx_data` of a variant: the graph names its data's
        # published name
        published = {}
        for relative in [rel for rel in files if rel.endswith(".onnx")]:
            data = next((rel for rel in (f"{relative}.data", f"{relative}_data") if rel in files), None)
            if data is None or Path(names[data]).name == Path(data).name:
                continue
            published[names[relative]] = decoder_contract.relocated(files[relative], Path(data).name,
                                                                    Path(names[data]).name)
        return published

    def localize(self, folder: Path, local_of: dict[str, str]) -> None:
        """Point each graph's external-data locations back at the names the job saves (publication renamed them)."""
        import onnx

        for graph_file in folder.glob("*.onnx"):
            graph = onnx.load(str(graph_file), load_external_data=False)
            changed = False
            for tensor in graph.graph.initializer:
                for entry in tensor.external_data:
                    if entry.key == "location" and entry.value in local_of and local_of[entry.value] != entry.value:
                        entry.value, changed = local_of[entry.value], True
            if changed:
                graph_file.write_bytes(graph.SerializeToString())


def generation_session_options(prepacking: bool = True):
    """The ONNX Runtime session options hfexport opens a generation export's components with (when the caller passes
    none): ONNX Runtime's defaults with the intra-op workers' spinning off (`session.intra_op.allow_spinning`).

    Why: a spinning worker holds its core while it waits for work, within a run and after it. Generation is many short
    runs (one decode step is ~50 ms for SmolLM2-135M at batch 4) with torch's token choice in between, and on a CPU
    that other processes share, a spinning or preempted worker delays every parallel kernel of the step. On the
    shared 2-core machine of benchmarks/smollm2_vs_optimum.py this made `generate` 1.7-1.9x faster at load 4-7 (the
    same option made optimum's `ORTModelForCausalLM.generate` faster too). On an idle machine spinning saves the
    wake-up of each parallel kernel; `session_options=onnxruntime.SessionOptions()` gets ONNX Runtime's defaults.

    `prepacking=False` (the gate of a job exported from its structure: `lean_load_options`) keeps the weights out of
    anonymous memory: `session.disable_prepacking` (ONNX Runtime maps the page-aligned external data hfexport saves;
    MLAS prepacking would copy every MatMul weight), and for a float16 graph, which the CPU provider runs through a
    Cast before each MatMul, `ORT_ENABLE_EXTENDED` (the default level makes a float32 copy of every weight), no CPU
    memory arena and nodes ordered by priority (each Cast next to its MatMul). Measured: docs/publishing.md, "Memory"
    (503 -> 39 MB anonymous for 489 MB of float32 data; 504 -> 30 MB kept for 245 MB of float16 data)."""
    import onnxruntime

    options = onnxruntime.SessionOptions()
    options.add_session_config_entry("session.intra_op.allow_spinning", "0")
    if not prepacking:
        options.add_session_config_entry("session.disable_prepacking", "1")
        options.graph_optimization_level = onnxruntime.GraphOptimizationLevel.ORT_ENABLE_EXTENDED
        options.enable_cpu_mem_arena = False
        options.execution_order = onnxruntime.ExecutionOrder.PRIORITY_BASED
    return options


def _data(fetch, entry: dict) -> Path | None:
    return fetch(f"{entry['file']}.data", False) or fetch(f"{entry['file']}_data", False)
