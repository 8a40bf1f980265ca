"""ExecuTorch's LLM runner contract for decoder-only generation targets: one `.pte` program that holds its KV cache,
its weights in a `.ptd` beside it, `tokenizer.json` beside both.

`executorch.extension.llm.runner.TextLLMRunner(model_path, tokenizer_path, data_path)` (executorch 1.5.1, the C++
runner the Android and iOS apps embed; `llm_runner_helper.cpp`, `text_decoder_runner.cpp`) and optimum-executorch's
`ExecuTorchModelForCausalLM` run a program whose method `forward(tokens [1, seq], input_pos [seq])` returns the
logits, with the cache inside the program (mutable buffers), and read constant methods: `get_max_seq_len` (required),
`get_max_context_len`, `use_kv_cache`, `enable_dynamic_shape`, `use_sdpa_with_kv_cache` (int64 each, defaults
otherwise), `get_eos_ids` (the stop ids; else the tokenizer's EOS); `get_bos_id` and `get_vocab_size` are written for
optimum-executorch, the runner takes both from the tokenizer.

That program is what transformers' `TorchExportableModuleWithStaticCache` (transformers.integrations.executorch) is
for: the model over a `StaticCache` registered as buffers, `forward(input_ids, cache_position)`. It is exported with
`torch.export(strict=True)` as transformers' own `convert_and_export_with_cache` does (a non-strict trace lifts the
cache tensors once more as constants beside the buffers, and torch 2.13's `run_decompositions` in `to_edge` then
fails), lowered with executorch's `to_edge_transform_and_lower(..., partitioner=[XnnpackPartitioner()],
constant_methods=...)`, and its weights tagged for a `.ptd` as executorch's own LLM export does
(`delegate_constant_tag` for the XNNPACK-delegated weights, `ExecutorchBackendConfig(external_constants=...)` for the
rest; `export_llama_lib.py`), under hfexport's ExecuTorch lowering fixes (`hfexport.workarounds.executorch`, applied by
`hfexport.export.run_plan`).

Why not the engine (`transformers.exporters.ExecutorchExporter`): its `export_for_generation` traces the model's
prefill/decode with the cache as inputs and outputs, non-strict; it calls `to_edge_transform_and_lower` without
`constant_methods` and writes every constant into the `.pte`; none of that is an option. So this module calls
torch.export and executorch directly for this one contract; every other ExecuTorch export stays the engine's.

The result is an ordinary `ExportedModel` with one component, `model` (`model.pte`), whose metadata records
`llm_runner` (and the cache size) in its export config: the engine's ExecuTorch runner runs it (`forward` on the
traced kwargs `input_ids`, `cache_position`), `ExportedModel.save_pretrained` writes `model.ptd` beside it (`hfexport.executorch_data.write_data`), the loader
opens the program with that data file (`load_program`), and `hfexport.generate` runs it one row at a time
(`is_llm_program`).
"""

from __future__ import annotations

import contextlib
import copy
import tempfile
from pathlib import Path

PROGRAM_FILE = "model.pte"
DATA_FILE = "model.ptd"
COMPONENT = "model"
DATA_TAG = "model"  # executorch names the data file after the tag: model.ptd
MARKER = "llm_runner"  # in the component's export_config: this program holds its cache (the runner's contract)
#: The cache size when the recipe names none (`generation.max_cache_len`): the model's context, at most this many.
DEFAULT_MAX_CONTEXT = 2048


def is_llm_program(metadata) -> bool:
    """Whether a component's metadata (an `ExportMetadata` or its dict) is this contract's program."""
    config = metadata.get("export_config") if isinstance(metadata, dict) else getattr(metadata, "export_config", None)
    return bool((config or {}).get(MARKER))


def manifest_is_llm(manifest: dict) -> bool:
    """Whether an export.json describes one LLM runner program."""
    components = manifest.get("components") or {}
    return manifest.get("export_format") == "executorch" and list(components) == [COMPONENT] and \
        is_llm_program(components[COMPONENT].get("metadata") or {})


def max_context(model, generation: dict) -> int:
    """The static cache's size: the recipe's `generation.max_cache_len`, else the model's context up to
    `DEFAULT_MAX_CONTEXT` (SmolLM2's 8192 would hold a 377 MB cache)."""
    if generation.get("max_cache_len"):
        return int(generation["max_cache_len"])
    context = getattr(model.config.get_text_config(), "max_position_embeddings", None) or DEFAULT_MAX_CONTEXT
    return int(min(context, DEFAULT_MAX_CONTEXT))


def eos_ids(model) -> list[int]:
    """The generation config's EOS ids (else the config's), as `get_eos_ids` returns them."""
    for source in (getattr(model, "generation_config", None), model.config):
        value = getattr(source, "eos_token_id", None)
        if value is not None:
            return [int(v) for v in (value if isinstance(value, (list, tuple)) else [value])]
    return []


def constant_methods(model, max_len: int) -> dict:
    """The metadata methods the runner (and optimum-executorch) read."""
    config = model.config.get_text_config()
    methods = {
        "get_max_seq_len": max_len,
        "get_max_context_len": max_len,
        "use_kv_cache": True,
        "enable_dynamic_shape": True,
        "use_sdpa_with_kv_cache": False,
        "get_vocab_size": int(config.vocab_size),
        "get_max_batch_size": 1,
        "get_n_layers": int(config.num_hidden_layers),
    }
    eos = eos_ids(model)
    if eos:
        methods["get_eos_ids"] = eos
        methods["get_eos_id"] = eos[0]
    bos = getattr(config, "bos_token_id", None)
    if bos is not None:
        methods["get_bos_id"] = int(bos)
    return methods


@contextlib.contextmanager
def _static_generation_config(model):
    """The model's generation config set to a static cache while the exportable module is built (it checks it)."""
    original = model.generation_config
    config = copy.deepcopy(original)
    config.cache_implementation, config.use_cache = "static", True
    model.generation_config = config
    try:
        yield
    finally:
        model.generation_config = original


def export(model, engine_config, generation: dict):
    """`model` as one LLM runner program (see the module docstring), as the engine's `ExportedModel` whose program
    and data file live in a temporary folder until saved."""
    import dataclasses

    import torch
    from executorch.backends.xnnpack.partition.xnnpack_partitioner import XnnpackPartitioner
    from executorch.exir import ExecutorchBackendConfig, to_edge_transform_and_lower
    from transformers.exporters import ExportedComponent, ExportedModel, ExportFormat, ExportMetadata
    from transformers.integrations.executorch import TorchExportableModuleWithStaticCache

    max_len = max_context(model, generation)
    with _static_generation_config(model):
        module = TorchExportableModuleWithStaticCache(model, batch_size=1, max_cache_len=max_len)
    module.eval()
    prompt = min(4, max_len - 1)
    inputs = {"input_ids": torch.zeros((1, prompt), dtype=torch.long), "cache_position": torch.arange(prompt)}
    seq = torch.export.Dim("seq", min=1, max=max_len - 1)
    shapes = {"input_ids": {1: seq}, "cache_position": {0: seq}}
    with torch.no_grad():
        program = torch.export.export(module, args=(), kwargs=inputs, dynamic_shapes=shapes, strict=True)
    _tag_weights(program)
    lowered = to_edge_transform_and_lower(program, partitioner=[XnnpackPartitioner()],
                                          constant_methods=constant_methods(model, max_len))
    manager = lowered.to_executorch(ExecutorchBackendConfig(external_constants=lambda node: DATA_TAG))
    scratch = tempfile.TemporaryDirectory(prefix="hfexport-pte-")
    folder = Path(scratch.name)
    with open(folder / PROGRAM_FILE, "wb") as file:
        manager.write_to_file(file)
    manager.write_tensor_data_to_file(str(folder))
    loaded = load_program(folder / PROGRAM_FILE, folder / DATA_FILE)
    loaded.scratch = scratch  # the files live as long as the program
    engine = dataclasses.asdict(engine_config) if dataclasses.is_dataclass(engine_config) else {}
    export_config = {key: value for key, value in engine.items()
                     if isinstance(value, (str, int, float, bool)) or value is None}
    export_config.update({MARKER: True, "max_seq_len": max_len, "strict": True})
    metadata = ExportMetadata(
        architecture=type(model).__name__,
        packages=_versions(),
        export_config=export_config,
        export_dtype=str(model.dtype).removeprefix("torch."),
        export_device="cpu",
        kwargs={name: {"rank": value.dim(), "shape": list(value.shape), "dtype": str(value.dtype).removeprefix(
            "torch.")} for name, value in inputs.items()},
        in_spec=torch.utils._pytree.treespec_dumps(program.call_spec.in_spec),
        out_spec=torch.utils._pytree.treespec_dumps(program.call_spec.out_spec),
    )
    generation_config = copy.deepcopy(getattr(model, "generation_config", None))
    return ExportedModel({COMPONENT: ExportedComponent(loaded, metadata)}, ExportFormat.EXECUTORCH,
                         config=model.config, generation_config=generation_config)


def _tag_weights(program) -> None:
    """Tag the program's constant inputs (weights, constant buffers; not the cache, which the program mutates) for
    `model.ptd`: XNNPACK's node visitor puts a constant whose placeholder carries `custom.delegate_constant_tag` into
    the named data under that tag, i.e. the data file. executorch's own LLM export sets the same tag with
    `delegate_external_constants_pass_unlifted` on the unlifted module and traces it again; tagging the lifted
    placeholders is the same mark without a second trace."""
    signature = program.graph_signature
    mutated = set(signature.buffers_to_mutate.values())
    constants = set(signature.inputs_to_parameters) | set(signature.inputs_to_lifted_tensor_constants) | {
        name for name, buffer in signature.inputs_to_buffers.items() if buffer not in mutated}
    for node in program.graph.nodes:
        if node.op == "placeholder" and node.name in constants:
            node.meta.setdefault("custom", {})["delegate_constant_tag"] = DATA_TAG


def _versions() -> dict:
    from importlib.metadata import PackageNotFoundError, version

    found = {}
    for package in ("torch", "transformers", "executorch"):
        try:
            found[package] = version(package)
        except PackageNotFoundError:
            pass
    return found


def load_program(path: Path, data: Path | None):
    """The `.pte` as an `executorch.runtime.Program` with its `.ptd`, remembering both files so that saving it again
    copies them (as the engine's `ExecutorchExporter.load_program` remembers `path`)."""
    from executorch.runtime import Runtime

    program = Runtime.get().load_program(Path(path), data_path=str(data) if data is not None else None)
    program.path, program.data_path = str(path), str(data) if data is not None else None
    return program


