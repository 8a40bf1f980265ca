"""OpenVINO IR as the layers see it: `openvino/openvino_model.xml` + `.bin`, deployed by OpenVINO GenAI and optimum-intel;
the one format whose runtime precision differs from the graph's (bf16 by default on CPUs that have it)."""

from __future__ import annotations

from hfexport.formats.backend import (
    COMMON_OPTIONS,
    IMAGE_TEXT_TASK,
    CardTarget,
    FormatBackend,
    register_format,
)

#: The model types OpenVINO GenAI's VLMPipeline runs on a vision split hfexport writes (`VLMModelType::QWEN2_VL`,
#: vlm_config.cpp): its files, made by `hfexport.formats.openvino.vision_split`, and the image tag VLMPipeline expands
#: for them (`InputsEmbedderQwen2VL::NATIVE_TAG`, qwen2vl/classes.hpp). Qwen2.5-VL's adds window attention
#: (`window_attention_mask`, `window_index`: qwen2_5_vl/classes.cpp), not made.
VLM_SPLIT_TYPES = ("qwen2_vl",)
VISION_EMBEDDINGS_FILE = "openvino_vision_embeddings_model.xml"
VISION_MERGER_FILE = "openvino_vision_embeddings_merger_model.xml"
VLM_IMAGE_TAG = "<|vision_start|><|image_pad|><|vision_end|>"

PRECISIONS = ("auto", "f32", "bf16", "f16")


@register_format
class OpenvinoFormat(FormatBackend):
    name = "openvino"
    label = "OpenVINO"
    aliases = ("ov", "openvino-ir")
    runtime_label = "OpenVINO"
    runtime_package = "openvino"
    folder = "openvino"
    default_file = "openvino_model.xml"
    companion_files = ("openvino_model.bin",)
    hub_tag = "openvino"
    extra = "openvino"
    packages = ("openvino",)
    target_name = "openvino"
    # OpenVINO's CPU plugin runs bf16 by default where the CPU has AVX512-BF16 or AMX, f32 elsewhere, so an unpinned
    # OpenVINO target's verdict depends on the CPU init ran on (docs/parity.md). init pins f32: what it verified then
    # holds on every CPU (tiny T5's ±300 logits flipped a top-1 at bf16). An owner who wants bf16 drops the pin.
    init_runtime = {"precision": "f32"}
    options = (*COMMON_OPTIONS, "compress_to_fp16", "stateful")
    runtime_precisions = PRECISIONS
    sentence_transformers = True
    optimum_classes = ("optimum.intel", "OVModel")
    max_program_bytes = 1 << 30  # the `.xml` graph; its weights are in the `.bin`
    half_weights_option = "compress_to_fp16"
    # measured through the gate: 1 GiB + 2.9x the f32 weights at Llama-3.2-1B's full depth, 2.8x on
    # SmolLM2-135M-Instruct, 2.1x on a 2-layer Llama-3.2-1B config (benchmarks/results/stage_memory_variants.json):
    # the full depth's peak with a margin, within 25% of the others
    memory_factor = 3.1
    # the `.bin`'s pages handed back while the CPU plugin compiles (`hfexport.files.dropping_mapped_folder`), not kept
    # beside its repacked copy: SmolLM2-135M-Instruct's gate 1818 -> 1641 MB (docs/publishing.md, "Memory")
    mapped_gate_release = 0.5
    export_cost = 1.0
    runtimes = ("hfexport.formats.openvino.runtimes.openvino_genai", "hfexport.formats.openvino.runtimes.optimum_intel")
    # compiled for the CPU explicitly, so the precision it picked can be read back (AUTO does not expose it)
    verify_load_options = {"device": "cpu"}
    one_decoder_graph = True
    cache_state_option = "stateful"
    # a stateful decode's gate compiled, run and read back in a torch-free process of its own
    # (`hfexport.formats.openvino.gate_process`): the exporting process's leftovers not beside the compiled model
    gate_in_own_process = True
    nncf_quantizer = "NNCFOpenVINOQuantizer"
    variants = ("int8", "int4")  # optimum-intel's weight formats (hfexport.formats.openvino.variants)

    def variant_file(self, name: str) -> str:
        # a folder per variant: LLMPipeline opens `openvino_model.xml` by that name only
        if name not in self.variants:
            return super().variant_file(name)
        return f"{name}/{self.default_file}"

    def program_files(self, file: str) -> list[tuple[str, bool]]:
        return [(file, True), (f"{file.removesuffix('.xml')}.bin", True)]

    def artifact_name(self, quantization: dict | None = None, dtype: str | None = None) -> str | None:
        if not quantization:
            return self.default_file
        method, params = quantization.get("method"), quantization.get("params") or {}
        if method == "nncf_quantize" and not params.get("mode") or \
                method == "pt2e" and quantization.get("preset") == "x86_inductor_int8_static":
            return "openvino_model_qint8_quantized.xml"
        return None

    def decode_takes_the_prompt(self, config, task: str) -> bool:
        # VLMPipeline runs the prompt through the stateful language model, made from the decode; Qwen2-VL's decode
        # traced on one token keeps that length (its 3-axis rope: the CPU plugin then reads a 2-token prompt as a
        # batch of 2 and ends in a segmentation fault), LLaVA's does not
        return task == IMAGE_TEXT_TASK and getattr(config, "model_type", None) in VLM_SPLIT_TYPES

    def load_options(self, precision: str | None) -> dict:
        """`INFERENCE_PRECISION_HINT` ("auto" leaves the device default)."""
        return {} if precision in (None, "auto") else {"config": {"INFERENCE_PRECISION_HINT": precision}}

    def loading_snippets(self, loader: str, repo_id: str, targets: list[CardTarget]) -> list[str]:
        if loader == "plain" and targets:
            path = targets[0].path
            return ["import openvino as ov", "from huggingface_hub import snapshot_download", "",
                    f'local = snapshot_download("{repo_id}", allow_patterns=["{path[:-4]}.*"])',
                    f'compiled = ov.Core().compile_model(f"{{local}}/{path}", "CPU")']
        return super().loading_snippets(loader, repo_id, targets)

    def runtime_snippets(self, repo_id: str, target: CardTarget, passed: list[str]) -> list[str]:
        if not {"openvino-genai", "optimum-intel"} & set(passed):
            return []
        folder = target.folder
        code = ["from huggingface_hub import snapshot_download", "",
                f'local = snapshot_download("{repo_id}", allow_patterns=["{folder}/*"])']
        if "openvino-genai" in passed and target.task == IMAGE_TEXT_TASK:  # VLMPipeline's layout (vlm_layout)
            split = any(file.endswith(VISION_MERGER_FILE) for file in target.files)  # Qwen2-VL's image tag, else LLaVA's
            prompt = f"{VLM_IMAGE_TAG} Describe the picture" if split else "<image>\\nDescribe the picture"
            code += ["", "import numpy as np", "import openvino as ov", "import openvino_genai", "from PIL import Image", "",
                     f'pipe = openvino_genai.VLMPipeline(f"{{local}}/{folder}", "CPU")',
                     'pixels = np.asarray(Image.open("picture.png").convert("RGB"))  # height x width x 3, uint8',
                     f'print(pipe.generate("{prompt}", images=[ov.Tensor(pixels[None])], max_new_tokens=20,',
                     '                    apply_chat_template=False))  # the prompt as written']
            return ["```python", *code, "```", ""]
        if "openvino-genai" in passed:
            code += ["", "import openvino_genai", "",
                     f'pipe = openvino_genai.LLMPipeline(f"{{local}}/{folder}", "CPU")',
                     'print(pipe.generate("The capital of France is", max_new_tokens=20))']
        if "optimum-intel" in passed:
            code += ["", "from optimum.intel import OVModelForCausalLM", "",
                     f'model = OVModelForCausalLM.from_pretrained(f"{{local}}/{folder}")']
        return ["```python", *code, "```", ""]
