"""OpenVINO's programs: the engine's export with the cache broadcasts made ready for the CPU plugin's fused attention,
a stateful decode saved as optimum-intel's `openvino_model.xml` with its tokenizer models (a VLM's components also in
VLMPipeline's layout, `hfexport.formats.openvino.vlm_layout`), its files checked, its weights rewritten in place; its
weight-compressed variants (int8, int4) made from the saved graph."""

from __future__ import annotations

from pathlib import Path

from hfexport.files import keep_variant_folder, remove_variant_folder
from hfexport.formats.backend import FormatProgram
from hfexport.formats.openvino import variants as openvino_variants
from hfexport.formats.openvino import structure, weights
from hfexport.processors import save_flat_preprocessor_config, save_tokenizer
from hfexport.formats.openvino import vlm_layout
from hfexport.formats.openvino.genai_layout import finish, save_openvino_tokenizer
from hfexport.formats.openvino.workarounds import fuse_ready_cache_broadcasts
from hfexport.formats.openvino.file_check import check_openvino_files


#: What the gate of a float32 target exported from the model's structure holds beside the libraries, as a factor of
#: the float32 weights (measured on SmolLM2-135M-Instruct: `mapped_weight_bytes`)
FLOAT32_GATE = 2.1
#: What the save of a float32 target exported from the model's structure holds beside its export's, as a factor of
#: the float32 weights (`OpenvinoProgram.structure_save_factor`)
FLOAT32_SAVE = -0.8


class OpenvinoProgram(FormatProgram):
    name = "openvino"
    weights = weights
    # a target traced without weights (int8-weight or float32): OpenVINO's converter holds the graph's file-backed
    # constants mapped as it converts (measured with benchmarks/stage_memory_variants.py: SmolLM2-135M-Instruct, a
    # 2-layer Llama-3.2-1B config), and its save reads them again to write the graph, but not what else the converter
    # held; NNCF's int8 compression of the written float32 IR then holds a quarter of it, each float32 constant handed
    # back once compressed (`structure.constants_released_as_read`). Measured at SmolLM2-1.7B's config (W 6,528 MB):
    # export 7,162, save 7,889 MB, against the export's estimate (1.3 W) + 5 T - 0.2 W = 9,661 MB (+22%; at 0 it was
    # +39%); on 2 layers of Llama-3.2-1B's, +17% (benchmarks/results/export_memory_smollm2-1.7b.md). A float32 target
    # (no compression) on SmolLM2-135M-Instruct (W 513 MB): export 1086, save 1016 MB against 1227 and, with -0.2 W,
    # 1444 (+13%, +42%: the save's 5 T counts a vocabulary block, 64 MiB, docs/publishing.md "Memory"): its own
    # factor, `structure_save_factor`
    structure_export_memory = 1.3
    structure_export_vocabulary = True
    structure_save_memory = -0.2
    repacks_mapped_weights = True  # the CPU plugin's own copy of what it maps, ENABLE_MMAP or not

    def traced_without_weights(self, quantization, options=None) -> bool:
        # a float32 target, and an int8-weight one compressed once its float32 weights are written (docs/rebind.md)
        return structure.traced_without_weights(quantization, options)

    def structure_save_factor(self, target) -> float:
        # a float32 target's save runs no compression: it holds less than its conversion (SmolLM2-135M-Instruct:
        # export 1086-1200, save 1016-1131 MB), so the libraries + 1.3 W + 5 T - 0.8 W (1152 MB there)
        return self.structure_save_memory if target.quantization else FLOAT32_SAVE

    def mapped_weight_bytes(self, target, loaded: int) -> int:
        # the data-free int8 target's .bin holds a byte per weight (the CPU plugin keeps it so at compile: measured,
        # docs/rebind.md); a float32 one's weights the CPU plugin repacks into its own memory, beside what the export
        # left on the heap and the inference buffers: SmolLM2-135M-Instruct's gate 1647 MB, the libraries + 2.1 W
        # (docs/publishing.md, "Memory")
        if target.quantization and structure.traced_without_weights(target.quantization):
            return loaded // 4
        return int(FLOAT32_GATE * loaded)

    def structure_conversion(self, scratch: Path):
        return structure.file_backed_constants(scratch)

    def structure_save(self):
        # the converted graph's placeholder constants, read again as the IR is written
        return structure.scratch_released()

    def quantize_written(self, folder: Path, quantizer) -> None:
        structure.compress_written(folder, quantizer)

    def after_export(self, exported) -> None:
        # the CPU plugin's fused KV-cache attention matches the frontend's repeat of a grouped-query cache, which the
        # engine rewrites (hfexport.formats.openvino.workarounds)
        for component in exported.components.values():
            fuse_ready_cache_broadcasts(component.program)

    def after_save(self, model, directory: Path, tokenizer=None) -> None:
        finish(directory, tokenizer)  # a stateful decode as optimum-intel's openvino_model.xml, its tokenizer beside it
        # a VLM in VLMPipeline's layout (Qwen2-VL's vision split made from the model it was exported from)
        if vlm_layout.to_layout(directory, getattr(model, "source_model", None)) and tokenizer is not None:
            save_tokenizer(Path(directory), tokenizer)
            save_openvino_tokenizer(Path(directory), tokenizer)

    def after_rebind(self, directory: Path, model=None) -> None:
        # VLMPipeline's graphs are copies of the VLM components' weights (Qwen2-VL's vision split: of `model`'s):
        # written again
        vlm_layout.to_layout(directory, model)

    def save_processor(self, directory: Path, processor) -> None:
        directory = Path(directory)
        if all((directory / name).is_file() for name in vlm_layout.FILES) and hasattr(processor, "save_pretrained"):
            processor.save_pretrained(directory)  # VLMPipeline's contract: the tokenizer and image processor beside
            save_tokenizer(directory, processor)
            save_openvino_tokenizer(directory, processor)
            save_flat_preprocessor_config(directory)  # the settings VLMPipeline's ProcessorConfig reads

    def write_variant(self, folder: Path, variant: dict, stage: Path, model=None) -> dict:
        return openvino_variants.write(folder, variant, stage)

    def keep_variant(self, stage: Path, folder: Path, file_name: str) -> list[str]:
        return keep_variant_folder(stage, folder, file_name)

    def remove_variant(self, folder: Path, file_name: str) -> None:
        remove_variant_folder(folder, file_name)

    def next_token_scores(self, stage: Path, rows: list[list[int]]) -> list[tuple[list[float], list[int]]]:
        return openvino_variants.next_token_scores(stage, rows)

    def read(self, path: Path, fetch, entry: dict, allow_unsafe_pt2: bool):
        from transformers.exporters import OpenVINOExporter

        return OpenVINOExporter.load_program(path)

    def check_files(self, found: list, file: str, label: str, source: str, allow_unsafe_pt2: bool) -> None:
        check_openvino_files(found[0], found[1], label)
