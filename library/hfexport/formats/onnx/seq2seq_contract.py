"""An encoder-decoder ONNX generation export in the loaders' contract: `encoder_model.onnx` + `decoder_model_merged.onnx`,
the files optimum's `ORTModelForSeq2SeqLM` / `ORTModelForSpeechSeq2Seq` and transformers.js open as they are.

The engine's three graphs, what the loaders read and how the merged decoder is built: docs/generation.md, "How
`formats/onnx/seq2seq_contract` builds it".
"""

from __future__ import annotations

import json
import re
from pathlib import Path

from hfexport.errors import SaveError
from hfexport.files import MANIFEST_FILE

ENCODER_FILE = "encoder_model.onnx"
DECODER_FILE = "decoder_model_merged.onnx"
#: The merged decoder's metadata_props keys holding the engine's output names of each branch (hfexport's runner).
OUTPUTS_KEY = {False: "hfexport.prefill_outputs", True: "hfexport.decode_outputs"}
USE_CACHE_BRANCH = "use_cache_branch"
_ENGINE_CACHE = re.compile(
    r"^(?:input\.|output\.)?past_key_values\.(self|cross)_attention_cache\.layers\.(\d+)\.(keys|values)$")
_CONTRACT_CACHE = re.compile(r"^(past_key_values|present)\.(\d+)\.(decoder|encoder)\.(key|value)$")
_KIND = {"self": "decoder", "cross": "encoder"}
_ENGINE_KIND = {"decoder": "self", "encoder": "cross"}
#: The engine's decoder inputs -> the contract's (and back, for hfexport's runner).
_INPUTS = {"decoder_input_ids": "input_ids", "encoder_outputs.last_hidden_state": "encoder_hidden_states",
           "attention_mask": "encoder_attention_mask"}
_LEAVES = {contract: engine for engine, contract in _INPUTS.items()}
PASSED_THROUGH = "encoder_last_hidden_state"  # the engine's output that is its encoder_outputs input, unchanged


class Seq2SeqContractError(SaveError, ValueError):
    """An encoder-decoder export whose graphs do not fit the loaders' contract (a dynamic head count or size)."""


def applies(manifest: dict) -> bool:
    """Whether a saved export is an ONNX encoder-decoder generation (`encoder`, `prefill` taking `decoder_input_ids`,
    `decode` taking an `EncoderDecoderCache`) not yet in the contract."""
    components = manifest.get("components") or {}
    if manifest.get("export_format") != "onnx" or set(components) != {"encoder", "prefill", "decode"}:
        return False
    prefill = (components["prefill"].get("metadata") or {}).get("kwargs") or {}
    decode = (components["decode"].get("metadata") or {}).get("kwargs") or {}
    cache = decode.get("past_key_values") or {}
    return "decoder_input_ids" in prefill and cache.get("container") == "EncoderDecoderCache" and \
        components["decode"].get("file") != DECODER_FILE


def is_merged(input_names) -> bool:
    """Whether a graph with these inputs is a merged seq2seq decoder (`decoder_model_merged.onnx`)."""
    return USE_CACHE_BRANCH in input_names and "encoder_hidden_states" in input_names


def leaf_path(onnx_name: str) -> str | None:
    """The traced forward's tensor leaf a merged decoder's input feeds (`past_key_values.2.encoder.key` ->
    `past_key_values.cross_attention_cache.layers.2.keys`); None for `use_cache_branch`, which the runner computes."""
    match = _CONTRACT_CACHE.match(onnx_name)
    if match:
        return f"past_key_values.{_ENGINE_KIND[match[3]]}_attention_cache.layers.{match[2]}.{match[4]}s"
    if onnx_name == USE_CACHE_BRANCH:
        return None
    return _LEAVES.get(onnx_name, onnx_name)


def contract_output(engine_name: str) -> str:
    """The merged decoder's output (or, for the passed-through encoder output, input) an engine output name is."""
    match = _ENGINE_CACHE.match(engine_name)
    if match:
        return f"present.{match[2]}.{_KIND[match[1]]}.{match[3][:-1]}"
    return "encoder_hidden_states" if engine_name == PASSED_THROUGH else engine_name


def engine_outputs(custom_metadata: dict, use_cache: bool) -> list[str]:
    """The engine's output names of the branch `use_cache` picks, in its order (from the merged graph's metadata)."""
    return json.loads(custom_metadata[OUTPUTS_KEY[use_cache]])


def to_contract(folder: Path) -> bool:
    """Rewrite the encoder, prefill and decode graphs saved in `folder` as `encoder_model.onnx` (+ `_data`) and
    `decoder_model_merged.onnx` (+ `_data`), the manifest updated; False (nothing changed) when the export is not an
    ONNX encoder-decoder generation. Raises `Seq2SeqContractError` when a cache's heads or head size are dynamic."""
    folder = Path(folder)
    manifest_path = folder / MANIFEST_FILE
    manifest = json.loads(manifest_path.read_text(encoding="utf-8"))
    if not applies(manifest):
        return False
    import onnx_ir

    components = manifest["components"]
    sources = {name: folder / components[name]["file"] for name in ("encoder", "prefill", "decode")}
    encoder = onnx_ir.load(str(sources["encoder"]))
    _name_encoder_dims(encoder.graph)
    merged = merge_decoder(onnx_ir.load(str(sources["prefill"])), onnx_ir.load(str(sources["decode"])))
    onnx_ir.save(encoder, str(folder / ENCODER_FILE), external_data=ENCODER_FILE + "_data")
    onnx_ir.save(merged, str(folder / DECODER_FILE), external_data=DECODER_FILE + "_data")
    for source in sources.values():
        for old in (source, source.with_name(source.name + ".data")):
            if old.name not in (ENCODER_FILE, DECODER_FILE):
                old.unlink(missing_ok=True)
    components["encoder"]["file"] = ENCODER_FILE
    components["prefill"]["file"] = components["decode"]["file"] = DECODER_FILE
    manifest_path.write_text(json.dumps(manifest, indent=2) + "\n", encoding="utf-8")
    return True


def _name_encoder_dims(graph) -> None:
    """The encoder's dynamic dims named as optimum's exports name them (`batch_size`, `encoder_sequence_length`)."""
    import onnx_ir

    names: dict[str, str] = {}
    for value in graph.inputs:
        for axis, new in ((0, "batch_size"), (1, "encoder_sequence_length")):
            if axis == 1 and value.name == "input_features":  # Whisper's mel bins: static
                continue
            dim = value.shape[axis] if value.shape is not None and len(value.shape) > axis else None
            if dim is not None and not isinstance(dim, int) and dim.value is not None:
                names.setdefault(str(dim.value), new)
    for value in [*graph.inputs, *graph.outputs]:
        if value.shape is not None:
            value.shape = onnx_ir.Shape([static_int(dim) if isinstance(static_int(dim), int) or dim.value is None
                                         else names.get(str(dim.value), dim.value) for dim in value.shape])


def static_int(dim):
    """A dim as an int where it is static: the engine writes some specialized dims as symbols named by their value
    (Whisper's `input_features` `[s6, "80", "200"]`), which transformers.js would read as symbols (0 in an empty past)."""
    if isinstance(dim, int):
        return dim
    return int(dim.value) if dim.value is not None and str(dim.value).isdigit() else dim


def merge_decoder(prefill, decode):
    """One graph `If(use_cache_branch, then=decode, else=prefill)` in the loaders' names (module docstring)."""
    import onnx_ir

    layers = sorted({int(match[2]) for value in decode.graph.inputs if (match := _ENGINE_CACHE.match(value.name))})
    if not layers:
        raise Seq2SeqContractError("the decode graph takes no past_key_values.*_attention_cache input")
    inputs = {value.name.removeprefix("input."): value for value in decode.graph.inputs}
    hidden = inputs["encoder_outputs.last_hidden_state"]
    outer: dict[str, onnx_ir.Value] = {}

    def add(name, dtype, dims):
        outer[name] = onnx_ir.Value(name=name, type=onnx_ir.TensorType(dtype), shape=onnx_ir.Shape(dims))

    add("input_ids", onnx_ir.DataType.INT64, ["batch_size", "decoder_sequence_length"])
    if "attention_mask" in inputs or any(value.name == "attention_mask" for value in prefill.graph.inputs):
        add("encoder_attention_mask", onnx_ir.DataType.INT64, ["batch_size", "encoder_sequence_length"])
    encoder_length = static_int(hidden.shape[1]) if isinstance(static_int(hidden.shape[1]), int) else "encoder_sequence_length"
    add("encoder_hidden_states", hidden.dtype, ["batch_size", encoder_length, static_dim(hidden, 2)])
    for layer in layers:
        for kind, length in (("decoder", "past_decoder_sequence_length"), ("encoder", "encoder_sequence_length_out")):
            for part in ("key", "value"):
                source = inputs[f"past_key_values.{_ENGINE_KIND[kind]}_attention_cache.layers.{layer}.{part}s"]
                add(f"past_key_values.{layer}.{kind}.{part}", source.dtype,
                    ["batch_size", static_dim(source, 1), length, static_dim(source, 3)])
    add(USE_CACHE_BRANCH, onnx_ir.DataType.BOOL, [1])

    initializers: dict = {}  # content key -> the outer graph's initializer
    output_names = _output_order(prefill.graph)
    template = {value.name: value for value in prefill.graph.outputs}
    metadata = {OUTPUTS_KEY[False]: json.dumps([value.name for value in prefill.graph.outputs]),
                OUTPUTS_KEY[True]: json.dumps([value.name for value in decode.graph.outputs])}
    branches = {use_cache: branch(model, outer, initializers, output_names, "decode" if use_cache else "prefill")
                for use_cache, model in ((True, decode), (False, prefill))}
    node = use_cache_if(outer, branches, len(output_names))
    for value, name in zip(node.outputs, output_names, strict=True):
        value.name = name
        value.type = template[_engine_name(name, template)].type
        value.shape = onnx_ir.Shape(_output_dims(name, template[_engine_name(name, template)], outer))
    graph = onnx_ir.Graph(list(outer.values()), list(node.outputs), nodes=[node],
                          initializers=list(initializers.values()), opset_imports=dict(prefill.graph.opset_imports),
                          name="decoder_model_merged")
    return onnx_ir.Model(graph, ir_version=prefill.ir_version, producer_name="hfexport", metadata_props=metadata)


def static_dim(value, axis: int) -> int:
    """`value`'s dim `axis` as an int, refused where it is symbolic (transformers.js' empty past needs it)."""
    dim = static_int(value.shape[axis])
    if not isinstance(dim, int):
        raise Seq2SeqContractError(f"{value.name}: shape {value.shape}: axis {axis} must be static (transformers.js "
                                   "makes every symbolic dim of the empty past 0 but `batch_size`)")
    return dim


def _output_order(graph) -> list[str]:
    """The merged decoder's outputs: logits, then per layer present decoder key, value, encoder key, value."""
    names = [contract_output(value.name) for value in graph.outputs if value.name != PASSED_THROUGH]

    def key(name):
        match = _CONTRACT_CACHE.match(name)
        return (0, 0, 0, 0) if not match else (1, int(match[2]), match[3] == "encoder", match[4] == "value")

    return sorted(names, key=key)


def _engine_name(contract: str, template: dict) -> str:
    return next(name for name in template if contract_output(name) == contract)


def _output_dims(name: str, source, outer: dict) -> list:
    match = _CONTRACT_CACHE.match(name)
    if not match:  # logits
        return ["batch_size", "decoder_sequence_length", static_int(source.shape[2])]
    past = outer[f"past_key_values.{match[2]}.{match[3]}.{match[4]}"]
    length = "total_decoder_sequence_length" if match[3] == "decoder" else "encoder_sequence_length_out"
    return ["batch_size", past.shape[1], length, past.shape[3]]


def _outer_input(engine_name: str) -> str | None:
    """The merged decoder's input that feeds one of the engine's decoder inputs (None: none does)."""
    name = engine_name.removeprefix("input.")
    match = _ENGINE_CACHE.match(name)
    return f"past_key_values.{match[2]}.{_KIND[match[1]]}.{match[3][:-1]}" if match else _INPUTS.get(name)


def use_cache_if(outer: dict, branches: dict, outputs: int):
    """The merged decoder's one node: `If(use_cache_branch)`, then the decode branch, else the prompt's."""
    import onnx_ir

    return onnx_ir.Node("", "If", [outer[USE_CACHE_BRANCH]],
                        attributes=[onnx_ir.AttrGraph("then_branch", branches[True]),
                                    onnx_ir.AttrGraph("else_branch", branches[False])],
                        num_outputs=outputs, name="use_cache_branch_if")


def branch(model, outer: dict, initializers: dict, output_names: list[str], prefix: str, *,
           outer_input=_outer_input, output_name=contract_output):
    """`model`'s graph as an `If` branch: no inputs (each replaced by the merged graph's `outer_input(name)`), its
    weights moved to the outer graph (`initializers`, shared by name where equal), its values renamed apart, its
    outputs (named `output_name(name)`) in the merged decoder's order `output_names` (an output that is not computed
    inside the branch goes through an Identity)."""
    import onnx_ir

    graph = model.graph
    by_contract = {output_name(value.name): value for value in graph.outputs}
    for value in list(graph.inputs):
        target = outer_input(value.name)
        if target not in outer:
            raise Seq2SeqContractError(f"the {prefix} graph takes {value.name}, which the loaders do not feed")
        value.replace_all_uses_with(outer[target])
        for contract, output in list(by_contract.items()):
            if output is value:
                by_contract[contract] = outer[target]
    for name, value in list(graph.initializers.items()):
        graph.initializers.pop(name)
        key = _content_key(value)
        shared = initializers.get(key) if key is not None else None
        if shared is not None:  # the same tensor in the other branch (a weight, or a weight the optimizer transposed)
            value.replace_all_uses_with(shared)
            continue
        if any(other.name == value.name for other in initializers.values()):
            value.name = f"{prefix}/{name}"
        initializers[key if key is not None else (prefix, name)] = value
    nodes = list(graph)
    graph.remove(nodes, safe=False)
    for index, node in enumerate(nodes):
        node.name = f"{prefix}/{node.name or index}"
        for value in node.outputs:
            if value.name:
                value.name = f"{prefix}/{value.name}"
    produced = {id(value) for node in nodes for value in node.outputs}
    outputs, seen = [], set()
    for name in output_names:
        value = by_contract[name]
        if id(value) not in produced or id(value) in seen:
            identity = onnx_ir.Node("", "Identity", [value], num_outputs=1, name=f"{prefix}/{name}/identity")
            identity.outputs[0].name = f"{prefix}/{name}"
            identity.outputs[0].type, identity.outputs[0].shape = value.type, value.shape
            nodes.append(identity)
            value = identity.outputs[0]
        seen.add(id(value))
        outputs.append(value)
    graph.outputs.clear()
    return onnx_ir.Graph([], outputs, nodes=nodes, name=prefix)


def _content_key(value):
    """A key equal for two initializers holding the same tensor (dtype, shape, sha256 of the bytes)."""
    import hashlib

    tensor = value.const_value
    if tensor is None:
        return None
    return (str(tensor.dtype), tuple(tensor.shape), hashlib.sha256(tensor.tobytes()).hexdigest())
