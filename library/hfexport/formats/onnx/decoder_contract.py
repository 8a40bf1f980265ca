"""A decoder-only ONNX generation export in the loaders' contract: the files transformers.js, optimum and
onnxruntime-genai open as they are.

The engine (transformers 5.23) names a single-graph decode's cache `input.past_key_values.layers.{i}.keys|values` and
`output.past_key_values.layers.{i}.keys|values`, with torch.export's symbols (`s44`, `s36 + s70`) for its dynamic
dims, and saves it as `decode.onnx` + `decode.onnx.data`. Every ONNX LLM loader reads one graph with inputs
`input_ids`, `attention_mask`, `position_ids`, `past_key_values.{i}.key|value` shaped `[batch_size, num_kv_heads,
past_sequence_length, head_dim]` and outputs `logits`, `present.{i}.key|value` (optimum's `ORTModelForCausalLM`;
onnxruntime-genai's default name templates; transformers.js 4.x, which builds the first step's empty past from the
graph's input metadata: the symbol named exactly `batch_size` becomes the batch, every other symbol 0, so heads and
head_dim must be static). `to_contract` renames the graph's inputs, outputs and dim symbols accordingly (onnx_ir; the
nodes and weights are the engine's, untouched) and saves it as `model.onnx` + `model.onnx_data` (the external data
name optimum and transformers.js download), with `genai_config.json` beside it (`genai_config`). The manifest names
`model.onnx` as the `decode` component, and hfexport's own runner maps the names back (`leaf_path`): one set of files
for every runtime. Exports saved before (the engine's names) load as they are.
"""

from __future__ import annotations

import json
import re
from pathlib import Path

from hfexport.errors import SaveError
from hfexport.files import MANIFEST_FILE, read_json_object

MODEL_FILE = "model.onnx"
DATA_FILE = MODEL_FILE + "_data"
GENAI_CONFIG_FILE = "genai_config.json"
BATCH, SEQUENCE, PAST, TOTAL = "batch_size", "sequence_length", "past_sequence_length", "total_sequence_length"
ENGINE_CACHE = re.compile(r"^(?:input\.|output\.)?past_key_values\.layers\.(\d+)\.(keys|values)$")
_SLIDING = re.compile(r"^(?:input\.)?past_key_values\.layers\.\d+\._sliding_window_tensor$")
_CONTRACT_PAST = re.compile(r"^past_key_values\.(\d+)\.(key|value)$")
_SYMBOL = re.compile(r"\b[su]\d+\b")
#: onnxruntime-genai's model types that run as its plain decoder-only model (src/models/model_type.h,
#: `ModelType::IsLLM`, less "gpt2" and "lfm2", which src/models/model.cpp gives models of their own: GPT-2's takes one
#: combined `past_%d` cache tensor per layer); any other model_type runs as the generic "decoder", the same model.
GENAI_LLM_TYPES = frozenset({
    "chatglm", "decoder", "ernie4_5", "gemma", "gemma2", "gemma3_text", "granite", "internlm2", "llama", "mistral",
    "nemotron", "olmo", "phi", "phimoe", "phi3", "phi3small", "qwen2", "qwen3", "smollm3"})


class ContractError(SaveError, ValueError):
    """A graph that cannot be put in the loaders' contract (a dynamic head count or head size, an unknown input)."""


def leaf_path(onnx_name: str) -> str:
    """The traced forward's tensor leaf an ONNX input feeds: `past_key_values.3.key` (the contract's name) ->
    `past_key_values.layers.3.keys`; the engine's own names (`input.` prefix) as the engine's runner reads them."""
    match = _CONTRACT_PAST.match(onnx_name)
    if match:
        return f"past_key_values.layers.{match[1]}.{match[2]}s"
    return onnx_name.removeprefix("input.")


def contract_name(engine_name: str, is_output: bool) -> str:
    """The contract's name of one of the engine's graph inputs or outputs (others keep theirs)."""
    match = ENGINE_CACHE.match(engine_name)
    if not match:
        return engine_name
    kind = match[2][:-1]
    return f"present.{match[1]}.{kind}" if is_output else f"past_key_values.{match[1]}.{kind}"


def applies(manifest: dict) -> bool:
    """Whether a saved export is one `to_contract` rewrites: ONNX, one `decode` component (a single graph) taking
    `input_ids` and a `DynamicCache` (a decoder-only LLM; not an encoder-decoder, a VLM or a static cache)."""
    components = manifest.get("components") or {}
    if manifest.get("export_format") != "onnx" or set(components) != {"decode"}:
        return False
    kwargs = (components["decode"].get("metadata") or {}).get("kwargs") or {}
    cache = kwargs.get("past_key_values") or {}
    return "input_ids" in kwargs and cache.get("container") == "DynamicCache" and \
        components["decode"].get("file") != MODEL_FILE


def to_contract(folder: Path) -> bool:
    """Rewrite the decode graph saved in `folder` into the loaders' contract (`model.onnx` + `model.onnx_data`,
    `genai_config.json`, the manifest updated); False (nothing changed) when the export is not one it applies to or
    its graph takes an input the loaders do not feed (`outside_contract`).

    Raises `ContractError` when the graph's cache has a dynamic head count or head size."""
    import onnx_ir

    folder = Path(folder)
    manifest_path = folder / MANIFEST_FILE
    manifest = json.loads(manifest_path.read_text(encoding="utf-8"))
    if not applies(manifest):
        return False
    entry = manifest["components"]["decode"]
    source = folder / entry["file"]
    model = onnx_ir.load(str(source))
    graph = model.graph
    config = read_json_object(folder / "config.json")
    _fold_sliding_windows(graph, config)
    if outside_contract(graph):
        return False
    symbols = _symbol_names(graph, config)
    for value in graph.inputs:
        value.name = contract_name(value.name, is_output=False)
    for value in graph.outputs:
        value.name = contract_name(value.name, is_output=True)
    for value in _values(graph):
        if value.shape is not None:
            value.shape = onnx_ir.Shape([_rename_dim(dim, symbols) for dim in value.shape])
    onnx_ir.save(model, str(folder / MODEL_FILE), external_data=DATA_FILE)
    for old in (source, folder / (entry["file"] + ".data")):
        if old.name not in (MODEL_FILE, DATA_FILE):
            old.unlink(missing_ok=True)
    entry["file"] = MODEL_FILE
    manifest_path.write_text(json.dumps(manifest, indent=2) + "\n", encoding="utf-8")
    generation = read_json_object(folder / "generation_config.json")
    (folder / GENAI_CONFIG_FILE).write_text(json.dumps(genai_config(graph_shapes(graph), config, generation),
                                                       indent=2) + "\n", encoding="utf-8")
    return True


def relocated(path: Path, old: str, new: str) -> bytes:
    """The ONNX graph at `path` (its proto alone, weights left where they are) with every external-data location
    `old` renamed `new`: a graph published or staged under another name (`model_quantized.onnx`) names its own data
    file (`model_quantized.onnx_data`), as transformers.js and optimum download `<file>_data` beside `<file>`."""
    import onnx

    model = onnx.load(str(path), load_external_data=False)
    for tensor in onnx_tensors(model):
        for entry in tensor.external_data:
            if entry.key == "location" and entry.value == old:
                entry.value = new
    return model.SerializeToString()


def onnx_tensors(model):
    """Every tensor of an ONNX model proto that may keep its bytes outside: initializers and tensor attributes,
    subgraphs included."""
    graphs = [model.graph]
    while graphs:
        graph = graphs.pop()
        yield from graph.initializer
        for node in graph.node:
            for attribute in node.attribute:
                if attribute.HasField("t"):
                    yield attribute.t
                yield from attribute.tensors
                if attribute.HasField("g"):
                    graphs.append(attribute.g)
                graphs.extend(attribute.graphs)


def stage_as(folder: Path, stage: Path, file_name: str) -> Path:
    """`stage` laid out as the contract folder `folder` is published when its graph is named `file_name` (a
    transformers.js dtype variant, `model_quantized.onnx`): `file_name` + `file_name_data` (the graph naming that data
    file) and every other file of `folder` (symlinked; `model.onnx` itself not, for a variant; the variant's data hard-linked). What the gate hands the
    runtimes, so each opens the variant by the name its users do."""
    folder, stage = Path(folder), Path(stage)
    stage.mkdir(parents=True, exist_ok=True)
    for path in folder.iterdir():
        if file_name == MODEL_FILE or path.name not in (MODEL_FILE, DATA_FILE):
            (stage / path.name).symlink_to(path.resolve())
    if file_name != MODEL_FILE:
        data = folder / DATA_FILE
        (stage / file_name).write_bytes(relocated(folder / MODEL_FILE, DATA_FILE, file_name + "_data")
                                        if data.is_file() else (folder / MODEL_FILE).read_bytes())
        if data.is_file():  # a real file beside the graph: ONNX Runtime refuses external data that resolves elsewhere
            _link_or_copy(data.resolve(), stage / (file_name + "_data"))
    return stage


def _link_or_copy(source: Path, destination: Path) -> None:
    import os
    import shutil

    try:
        os.link(source, destination)
    except OSError:  # another file system
        shutil.copyfile(source, destination)


def _fold_sliding_windows(graph, config: dict) -> None:
    """transformers 5.23 traces a sliding-window cache layer (Gemma3, Mistral with a window) with its window size as one
    more input, `past_key_values.layers.{i}._sliding_window_tensor` (`DynamicSlidingWindowLayer`: a 0-d int64 tensor of
    `config.sliding_window`), which no runtime feeds: it becomes a constant of the graph (its output stays, unread)."""
    import numpy
    import onnx_ir

    text = config.get("text_config") if isinstance(config.get("text_config"), dict) else config
    window = text.get("sliding_window")
    if not isinstance(window, int):
        return
    for value in [value for value in graph.inputs if _SLIDING.match(value.name)]:
        graph.inputs.remove(value)
        value.const_value = onnx_ir.tensor(numpy.array(window, dtype=numpy.int64), name=value.name)
        graph.register_initializer(value)


def outside_contract(graph) -> list[str]:
    """The graph's inputs no loader feeds: such a graph keeps the engine's names and layout, which hfexport's own
    runner reads."""
    known = {"input_ids", "attention_mask", "position_ids"}
    return [value.name for value in graph.inputs if value.name not in known
            and not ENGINE_CACHE.match(value.name) and not _CONTRACT_PAST.match(value.name)]


def graph_shapes(graph) -> dict:
    """What genai_config needs from the contract graph: layers, kv heads, head size, whether a present grows."""
    pasts = [value for value in graph.inputs if _CONTRACT_PAST.match(value.name)]
    if not pasts:
        raise ContractError("the decode graph takes no past_key_values.{i}.key|value input")
    shape = pasts[0].shape
    return {"num_hidden_layers": len(pasts) // 2, "num_key_value_heads": int(shape[1]), "head_size": int(shape[3])}


def genai_config(shapes: dict, config: dict, generation: dict) -> dict:
    """onnxruntime-genai's `genai_config.json` for the contract graph (keys from its config parser, src/config.cpp:
    it rejects unknown ones). The graph's present is the past concatenated with the new keys, so the past and present
    buffers are not shared (`search.past_present_share_buffer: false`)."""
    text = config.get("text_config") if isinstance(config.get("text_config"), dict) else config
    model_type = str(text.get("model_type") or "")
    heads = int(text.get("num_attention_heads") or shapes["num_key_value_heads"])
    eos = generation.get("eos_token_id", text.get("eos_token_id"))
    eos = [int(token) for token in (eos if isinstance(eos, list) else [eos] if eos is not None else [])]
    pad = generation.get("pad_token_id", text.get("pad_token_id"))
    context = int(text.get("max_position_embeddings") or text.get("n_positions") or 2048)
    model = {
        "type": model_type if model_type in GENAI_LLM_TYPES else "decoder",
        "context_length": context,
        "vocab_size": int(text["vocab_size"]),
        "eos_token_id": eos[0] if len(eos) == 1 else eos,
        "pad_token_id": int(pad) if pad is not None else (eos[0] if eos else 0),
        "decoder": {
            "filename": MODEL_FILE,
            "head_size": shapes["head_size"],
            "hidden_size": int(text.get("hidden_size") or heads * shapes["head_size"]),
            "num_attention_heads": heads,
            "num_hidden_layers": shapes["num_hidden_layers"],
            "num_key_value_heads": shapes["num_key_value_heads"],
            "inputs": {"input_ids": "input_ids", "attention_mask": "attention_mask", "position_ids": "position_ids",
                       "past_key_names": "past_key_values.%d.key", "past_value_names": "past_key_values.%d.value"},
            "outputs": {"logits": "logits", "present_key_names": "present.%d.key",
                        "present_value_names": "present.%d.value"},
        },
    }
    bos = generation.get("bos_token_id", text.get("bos_token_id"))
    if isinstance(bos, int):
        model["bos_token_id"] = bos
    search = {"do_sample": False, "max_length": context, "num_beams": 1, "past_present_share_buffer": False}
    return {"model": model, "search": search}


def shares_cache_buffers(graph: Path) -> bool:
    """Whether onnxruntime-genai may give the graph file `graph` the same buffers for its past and present
    (`search.past_present_share_buffer`): every `present.{i}.key|value` is written by a `GroupQueryAttention` (a
    variant with its attention fused, `hfexport.formats.onnx.attention_fusion`), which writes the new keys into the
    past's buffer at their slots. The export's own attention concatenates a present one step longer than its past,
    which a shared buffer cannot hold."""
    import onnx

    proto = onnx.load(str(graph), load_external_data=False).graph
    writers = {output: node.op_type for node in proto.node for output in node.output}
    presents = [value.name for value in proto.output if value.name.startswith("present.")]
    return bool(presents) and all(writers.get(name) == "GroupQueryAttention" for name in presents)


def genai_overlay(graph: Path) -> dict:
    """What a user of onnxruntime-genai overlays on the folder's `genai_config.json` (which names `model.onnx` and
    unshared buffers) to run the graph file `graph` as fast as its form allows: its file name where it is a variant,
    and shared past/present buffers where it `shares_cache_buffers` (about 3% of q4's decode speed on SmolLM2:
    docs/quantization.md, "Variants")."""
    graph = Path(graph)
    overlay: dict = {}
    if graph.name != MODEL_FILE:
        overlay["model"] = {"decoder": {"filename": graph.name}}
    if shares_cache_buffers(graph):
        overlay["search"] = {"past_present_share_buffer": True}
    return overlay


def _symbol_names(graph, config: dict | None = None) -> dict[str, str]:
    """torch.export's symbols of the contract's dims -> the contract's names, read off input_ids (batch, sequence),
    the first past key (past length; every past's heads and head size must be static) and attention_mask (total
    length)."""
    inputs = {value.name: value for value in graph.inputs}
    names: dict[str, str] = {}

    def name(value, axis: int, new: str) -> None:
        if value is not None and value.shape is not None and len(value.shape) > axis:
            dim = value.shape[axis]
            if not isinstance(dim, int) and dim.value is not None:
                names.setdefault(str(dim.value), new)

    past = next((value for value in graph.inputs
                 if ENGINE_CACHE.match(value.name) or _CONTRACT_PAST.match(value.name)), None)
    if past is None or past.shape is None or len(past.shape) != 4:
        raise ContractError("the decode graph has no [batch, heads, past, head_dim] cache input")
    _check_static_heads(graph, config or {})
    for value in graph.inputs:  # every input's batch, attention_mask's too (torch.export may give it its own symbol)
        name(value, 0, BATCH)
    name(inputs.get("input_ids"), 1, SEQUENCE)
    for value in graph.inputs:  # every layer's past length (a sliding layer's has its own symbol)
        if ENGINE_CACHE.match(value.name) or _CONTRACT_PAST.match(value.name):
            name(value, 2, PAST)
    name(inputs.get("attention_mask"), 1, TOTAL)
    return names


def _check_static_heads(graph, config: dict) -> None:
    """Raise `ContractError` naming the input, the axis, the size the config gives it and the dim the graph has, for
    a past whose key-value heads (axis 1) or head size (axis 3) is symbolic: transformers.js makes every symbolic
    dim of the empty past 0 but `batch_size`."""
    nested = isinstance(config.get("text_config"), dict)
    text, prefix = (config["text_config"], "text_config.") if nested else (config, "")
    heads = next(((text[key], prefix + key) for key in ("num_key_value_heads", "num_attention_heads")
                  if isinstance(text.get(key), int)), None)
    head_dim = (text["head_dim"], prefix + "head_dim") if isinstance(text.get("head_dim"), int) else (
        (text["hidden_size"] // text["num_attention_heads"], f"{prefix}hidden_size / {prefix}num_attention_heads")
        if isinstance(text.get("hidden_size"), int) and isinstance(text.get("num_attention_heads"), int) else None)
    for value in graph.inputs:
        if not (ENGINE_CACHE.match(value.name) or _CONTRACT_PAST.match(value.name)) or value.shape is None:
            continue
        for axis, what, size in ((1, "key-value heads", heads), (3, "head size", head_dim)):
            dim = value.shape[axis] if len(value.shape) > axis else None
            if dim is None or isinstance(dim, int):
                continue
            expected = f"the static size {size[0]} (config.json `{size[1]}`)" if size else "a static size"
            found = f"the symbolic dim {str(dim.value)!r}" if dim.value is not None else "an unnamed symbolic dim"
            if str(dim.value).isdigit():  # torch.export fixed an axis the export had marked dynamic (Dim.AUTO)
                found += " (an axis marked dynamic at export that torch.export then fixed to that size)"
            raise ContractError(
                f"input {value.name!r}, axis {axis} ({what}): expected {expected}, found {found} in shape "
                f"{value.shape}: transformers.js makes every symbolic dim of the empty past 0 but `batch_size`, so "
                "the head count and head size must be static")


def _rename_dim(dim, names: dict[str, str]):
    if isinstance(dim, int) or dim.value is None:
        return dim
    return _SYMBOL.sub(lambda match: names.get(match[0], match[0]), str(dim.value))


def _values(graph):
    """Every value of the graph with a shape: its inputs, its nodes' outputs (subgraphs' too), its outputs."""
    import onnx_ir

    yield from graph.inputs
    for node in onnx_ir.traversal.RecursiveGraphIterator(graph):
        yield from node.outputs
    yield from graph.outputs


