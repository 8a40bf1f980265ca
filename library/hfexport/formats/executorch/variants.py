"""ExecuTorch's `8da4w` variant of an ExecuTorch generation export (the LLM runner's program), in the forms of
optimum-executorch's `optimum-cli export executorch --recipe xnnpack --qlinear 8da4w --qembedding 4w|8w`:

- the linear layers: torchao's `Int8DynamicActivationIntxWeightConfig`, 4-bit symmetric weights in groups of
  `group_size` input values (default 32, optimum-executorch's; where 32 does not divide every linear layer's input,
  the largest power of two that does, else -1: one scale per output channel; `hfexport.quantization.shapes`),
  activations quantized to 8 bits per token at run time, scales chosen by `hqq_scale_only` (optimum-executorch's
  default); XNNPACK runs them (its dynamically quantized linear kernels);
- the language-model head, `head`: `8da8w` (the default: 8-bit weights per output channel, int8 activations, XNNPACK's
  kernels too) or `8da4w` as the other linear layers (optimum-executorch's `--qlinear 8da4w`, which quantizes the head
  with them). A tied head at 4 bits is where most of a small model's loss is (SmolLM2-135M: docs/quantization.md);
- the embedding, `embedding`: `4w` (the default: `IntxWeightOnlyConfig` int4 in the linear layers' groups, ExecuTorch's
  `quantized_decomposed::embedding_4bit` kernel) or `8w` (8 bits per row, `embedding_byte`), fused by
  `do_quant_fusion_and_const_prop` as optimum-executorch lowers (`4w` pays for the head's 8 bits: within 3% in size);
- the rest of the program is the float32 export's: the same attention (ExecuTorch's LLM kernels
  `llama::custom_sdpa`/`llama::update_cache` where the float32 export chose them, not checked again), cache size,
  metadata methods and last-position logits (`hfexport.formats.executorch.llm_program.export`).

Reused: the eager model the job holds (a copy is quantized; the job's stays float32) and the float32 export's choices,
read from its `export.json`. Made again: the trace and the lowering (a traced program's weights cannot be quantized in
place; XNNPACK picks its quantized kernels while lowering).

Layout: `8da4w/model.pte` inside the target's folder with the tokenizer and configs: optimum-executorch's
`ExecuTorchModelForCausalLM` opens a program named `model.pte` only and loads every `.pte` of its folder, so the
variant cannot be a `model_8da4w.pte` beside `model.pte` (docs/quantization.md, "Variants").
"""

from __future__ import annotations

import copy
import json
import shutil
from pathlib import Path

from hfexport.files import MANIFEST_FILE, RECIPE_COPY_FILE, REPORT_FILE, keep_variant_folder
from hfexport.formats.executorch.llm_program import ATTENTION, COMPONENT, PROGRAM_FILE, load_program, manifest_is_llm
from hfexport.formats.executorch.llm_program import export as export_llm_program
from hfexport.formats.executorch.workarounds import executorch_fixes
from hfexport.quantization.shapes import dividing_group_size, layer_input_sizes
from hfexport.quantization.variants import SETTINGS
from hfexport.workarounds.transformers_models import modeling_fixes

DEFAULT_GROUP_SIZE = 32  # optimum-executorch's `qlinear_group_size`
QPARAMS_ALGORITHM = "hqq_scale_only"  # optimum-executorch's DEFAULT_QPARAMS_ALGORITHM
HEADS = ("8da4w", "8da8w")  # the language-model head's form (optimum-executorch's qlinear names)
EMBEDDINGS = ("8w", "4w")  # the embedding's form (optimum-executorch's qembedding names)
#: the defaults (`hfexport.quantization.variants.SETTINGS`; docs/quantization.md, "Variants")
DEFAULT_HEAD, DEFAULT_EMBEDDING = SETTINGS["8da4w"]["head"], SETTINGS["8da4w"]["embedding"]
HEAD = "lm_head"  # the head's module name in transformers' causal LMs
#: hfexport's own files beside an export: linked into the stage (the runtimes check the program's contract in
#: export.json), never kept in the variant's folder (the variant is not a target of its own)
_OWN_FILES = (MANIFEST_FILE, REPORT_FILE, RECIPE_COPY_FILE)


def group_size(config: dict, variant: dict) -> int:
    """The linear layers' group size: the recipe's, else 32 where it divides every linear layer's input (the model's
    config.json), else the largest power of two that does, else -1 (one scale per output channel)."""
    if variant.get("group_size") is not None:
        return int(variant["group_size"])
    sizes = layer_input_sizes(config) if isinstance(config, dict) else {}
    if not sizes:
        return DEFAULT_GROUP_SIZE
    return dividing_group_size(sizes.values(), DEFAULT_GROUP_SIZE) or -1


def quantize(model, group: int, head: str = DEFAULT_HEAD, embedding: str = DEFAULT_EMBEDDING) -> None:
    """`model`'s embeddings and linear layers quantized in place by torchao's `quantize_` as optimum-executorch's
    `quantize_model_` calls it (embeddings first, so that a head tied to the embedding is quantized as a linear layer
    of its own): the embedding `embedding` (`8w`: 8 bits per row; `4w`: 4 bits in groups of `group`), the linear
    layers 8da4w in groups of `group` (-1: per output channel), the language-model head (`lm_head`) `head` (`8da4w`
    as the others; `8da8w`: 8-bit weights per output channel, optimum-executorch's 8da8w)."""
    import torch
    from torchao.quantization.granularity import PerAxis, PerGroup
    from torchao.quantization.quant_api import Int8DynamicActivationIntxWeightConfig, IntxWeightOnlyConfig, quantize_

    grouped = PerAxis(0) if group == -1 else PerGroup(group)
    quantize_(model, IntxWeightOnlyConfig(weight_dtype=torch.int8 if embedding == "8w" else torch.int4,
                                          granularity=PerAxis(0) if embedding == "8w" else grouped,
                                          intx_choose_qparams_algorithm=QPARAMS_ALGORITHM),
              lambda module, name: isinstance(module, torch.nn.Embedding))
    if head == "8da8w":
        quantize_(model, Int8DynamicActivationIntxWeightConfig(
            weight_dtype=torch.int8, weight_granularity=PerAxis(0), intx_choose_qparams_algorithm=QPARAMS_ALGORITHM),
            lambda module, name: isinstance(module, torch.nn.Linear) and name == HEAD)
    quantize_(model, Int8DynamicActivationIntxWeightConfig(
        weight_dtype=torch.int4, weight_granularity=grouped, intx_choose_qparams_algorithm=QPARAMS_ALGORITHM),
        lambda module, name: isinstance(module, torch.nn.Linear) and (head == "8da4w" or name != HEAD))


def write(folder: Path, variant: dict, stage: Path, model) -> dict:
    """The 8da4w program of `model` (the eager model the export in `folder` was made from), laid out in `stage` as
    `model.pte` with the export's other files linked; the settings it resolved (`group_size`)."""
    import torch

    if model is None:
        raise ValueError("the 8da4w variant is made from the eager model: none was given")
    folder, stage = Path(folder), Path(stage)
    stage.mkdir(parents=True, exist_ok=True)
    manifest = json.loads((folder / MANIFEST_FILE).read_text(encoding="utf-8"))
    if not manifest_is_llm(manifest):
        raise ValueError("the export is not ExecuTorch's LLM runner program (one model.pte holding its cache), which "
                         "8da4w is made of: the model's generation keeps the engine's graphs")
    export_config = manifest["components"][COMPONENT]["metadata"]["export_config"]
    config = json.loads((folder / "config.json").read_text(encoding="utf-8"))
    resolved = {"group_size": group_size(config, variant), "head": variant.get("head") or DEFAULT_HEAD,
                "embedding": variant.get("embedding") or DEFAULT_EMBEDDING}
    quantized = copy.deepcopy(model).eval()  # the job's model stays as it is
    with torch.no_grad():
        quantize(quantized, resolved["group_size"], resolved["head"], resolved["embedding"])
    with executorch_fixes(), modeling_fixes(quantized, "executorch"):
        exported = export_llm_program(quantized, None, {"max_cache_len": export_config["max_seq_len"]},
                                      attention=export_config.get(ATTENTION), quantized=True)
    program = exported.components[COMPONENT].program
    shutil.copyfile(program.path, stage / PROGRAM_FILE)
    del exported, program, quantized
    for path in folder.iterdir():
        if path.is_file() and path.suffix not in (".pte", ".ptd") and not path.name.startswith(".") \
                and path.name not in (REPORT_FILE, RECIPE_COPY_FILE):
            (stage / path.name).symlink_to(path.resolve())
    return resolved


def keep(stage: Path, folder: Path, file_name: str) -> list[str]:
    """Move the variant in `stage` into `folder` as the folder of `file_name` (`8da4w/model.pte`), hfexport's own
    files left out; the names written, relative to `folder` (assembled aside and renamed into place)."""
    for name in _OWN_FILES:
        (Path(stage) / name).unlink(missing_ok=True)
    return keep_variant_folder(stage, folder, file_name)


def next_token_scores(stage: Path, rows: list[list[int]]) -> list[tuple[list[float], list[int]]]:
    """Per token row, in the program of `stage` from position 0 (its cache's earlier contents are never attended to:
    the kernels attend up to the current position): the log-likelihood of each next token (len - 1 values) and the
    argmax next token at each position (len values), in float64. One token per call: the program returns the last
    position's logits only."""
    import torch

    program = load_program(Path(stage) / PROGRAM_FILE, None, custom_ops=True)
    forward = program.load_method("forward")
    results = []
    for row in rows:
        chosen, argmax = [], []
        for position, token in enumerate(row):
            logits = forward.execute([torch.tensor([[token]]), torch.tensor([position])])[0]
            log_probs = torch.log_softmax(logits.reshape(-1).double(), dim=-1)
            argmax.append(int(log_probs.argmax()))
            if position + 1 < len(row):
                chosen.append(float(log_probs[row[position + 1]]))
        results.append((chosen, argmax))
    return results
