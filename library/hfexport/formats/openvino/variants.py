"""optimum-intel's weight-compressed variants of an OpenVINO generation export, made from its `openvino_model.xml`
(the ov.Model the target converted: no re-export) by NNCF's `compress_weights`, as `optimum-cli export openvino
--weight-format int8|int4` makes them:

- `int8`: weight-only int8, asymmetric, one scale per output channel (NNCF's `INT8_ASYM`, optimum-intel's `bits=8,
  sym=False`).
- `int4`: `INT4_ASYM` in groups of `group_size` input values (default 128, or, where 128 does not divide every linear
  layer's input, the largest power of two that does: `hfexport.quantization.shapes`; SmolLM2's 576 takes 64), with
  `ratio` of the layers at 4 bits and the rest (and, as NNCF does by default, the embedding and the last layer) at
  int8_asym.

Layout: each variant is a complete folder of its runtimes' contract inside the target's folder, `int8/` and `int4/`
(`openvino/int4/openvino_model.xml` + `.bin`, the tokenizer models, `config.json`, `generation_config.json`, the
tokenizer files), because OpenVINO GenAI's `LLMPipeline(folder)` opens `openvino_model.xml` by that name only (a
folder per variant is the one layout both open: optimum-intel's `OVModelForCausalLM.from_pretrained(repo,
subfolder="openvino/int4")` reads the same folder), with the settings in `openvino_config.json`'s
`quantization_config` as optimum-intel's `OVConfig.save_pretrained` writes them. hfexport's own files (the manifest,
report and recipe copy) stay in the target's folder: the variant is not a target of its own.

`write(folder, variant, stage)` lays the variant out in `stage` and returns the settings it resolved (the group
size); `hfexport.files.keep_variant_folder` moves it into the target's folder; `next_token_scores` runs a stateful
graph on token rows from an empty cache.
"""

from __future__ import annotations

import json
from pathlib import Path

from hfexport.files import MANIFEST_FILE, RECIPE_COPY_FILE, REPORT_FILE
from hfexport.formats.openvino.genai_layout import OPENVINO_MODEL
from hfexport.formats.openvino.structure import constants_released_as_read
from hfexport.quantization.shapes import dividing_group_size, layer_input_sizes

CONFIG_FILE = "openvino_config.json"  # optimum-intel's OVConfig.CONFIG_NAME
DEFAULT_GROUP_SIZE = 128  # NNCF's and optimum-intel's for int4
#: hfexport's own files beside an export, which a variant's folder does not repeat
_OWN_FILES = (MANIFEST_FILE, REPORT_FILE, RECIPE_COPY_FILE)
_WEIGHTS = Path(OPENVINO_MODEL).with_suffix(".bin").name


def group_size(folder: Path, variant: dict) -> int:
    """The int4 group size: the recipe's, else 128 where it divides every linear layer's input (config.json beside
    the export), else the largest power of two that does, else -1 (one scale per output channel)."""
    if variant.get("group_size") is not None:
        return int(variant["group_size"])
    try:
        config = json.loads((Path(folder) / "config.json").read_text(encoding="utf-8"))
    except (OSError, ValueError):
        config = {}
    sizes = layer_input_sizes(config) if isinstance(config, dict) else {}
    if not sizes:
        return DEFAULT_GROUP_SIZE
    return dividing_group_size(sizes.values(), DEFAULT_GROUP_SIZE) or -1


def write(folder: Path, variant: dict, stage: Path) -> dict:
    """The variant `variant` (its full settings) of the stateful graph in `folder`, laid out in `stage` (the other
    files linked); the settings it resolved (`group_size` of int4)."""
    import nncf
    import openvino as ov

    folder, stage = Path(folder), Path(stage)
    stage.mkdir(parents=True, exist_ok=True)
    for path in folder.iterdir():
        if path.name not in (OPENVINO_MODEL, _WEIGHTS, *_OWN_FILES) and path.is_file() \
                and not path.name.startswith("."):
            (stage / path.name).symlink_to(path.resolve())
    model = ov.Core().read_model(str(folder / OPENVINO_MODEL))  # the .bin memory-mapped
    # each float constant NNCF read handed back when it reads the next: never the whole float model resident
    with constants_released_as_read():
        if variant["name"] == "int4":
            resolved = {"group_size": group_size(folder, variant)}
            model = nncf.compress_weights(model, mode=nncf.CompressWeightsMode.INT4_ASYM,
                                          group_size=resolved["group_size"], ratio=variant["ratio"])
            quantization = {"bits": 4, "group_size": resolved["group_size"], "ratio": variant["ratio"]}
        else:
            resolved = {}
            model = nncf.compress_weights(model, mode=nncf.CompressWeightsMode.INT8_ASYM)
            quantization = {"bits": 8, "group_size": None, "ratio": 1.0}
    # the float constants NNCF leaves (norms) stay as the export wrote them: no float16 compression on save
    ov.save_model(model, str(stage / OPENVINO_MODEL), compress_to_fp16=False)
    (stage / CONFIG_FILE).write_text(json.dumps(openvino_config(**quantization), indent=2) + "\n", encoding="utf-8")
    return resolved


def openvino_config(bits: int, group_size: int | None, ratio: float) -> dict:
    """`openvino_config.json` as optimum-intel 1.27's `OVConfig(quantization_config=OVWeightQuantizationConfig(bits,
    sym=False, group_size, ratio)).save_pretrained` writes it (its version keys left out: optimum made none of it)."""
    dtype = f"int{bits}"
    return {"dtype": dtype, "input_info": None, "output_attentions": False, "save_onnx_model": False,
            "quantization_config": {
                "all_layers": None, "backup_precision": None, "bits": bits, "dataset": None, "dtype": dtype,
                "gptq": None, "group_size": group_size, "group_size_fallback": None, "ignored_scope": None,
                "lora_correction": None, "num_samples": None, "processor": None, "quant_method": "default",
                "ratio": ratio, "scale_estimation": None, "sensitivity_metric": None, "statistics_path": None,
                "sym": False, "tokenizer": None}}


def next_token_scores(stage: Path, rows: list[list[int]]) -> list[tuple[list[float], list[int]]]:
    """Per token row (batch 1, an empty cache, the CPU at an f32 inference precision hint): the log-likelihood of each
    next token of the row (len - 1 values) and the argmax next token at each position (len values), in float64."""
    import numpy as np
    import openvino as ov

    compiled = ov.Core().compile_model(str(Path(stage) / OPENVINO_MODEL), "CPU", {"INFERENCE_PRECISION_HINT": "f32"})
    request = compiled.create_infer_request()
    names = {port.get_any_name() for port in compiled.inputs}
    results = []
    for row in rows:
        request.reset_state()
        ids = np.asarray([row], dtype=np.int64)
        feed = {"input_ids": ids, "attention_mask": np.ones_like(ids),
                "position_ids": np.arange(ids.shape[1], dtype=np.int64)[None], "beam_idx": np.zeros(1, dtype=np.int32)}
        logits = request.infer({key: value for key, value in feed.items() if key in names})[compiled.output("logits")]
        logits = np.asarray(logits[0], dtype=np.float64)
        shifted = logits - logits.max(axis=-1, keepdims=True)
        log_probs = shifted - np.log(np.exp(shifted).sum(axis=-1, keepdims=True))
        chosen = [float(log_probs[position, token]) for position, token in enumerate(row[1:])]
        results.append((chosen, [int(token) for token in logits.argmax(axis=-1)]))
    return results
