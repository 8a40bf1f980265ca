"""ExecuTorch's LLM runner contract for decoder-only generation targets: one `.pte` program that holds its KV cache and
its weights, `tokenizer.json` beside it.

The contract in full, why this module exports it itself rather than through the engine, the LLM kernels it
uses and the `ExportedModel` it returns: docs/generation.md, "ExecuTorch's LLM runner program".
"""

from __future__ import annotations

import contextlib
import copy
import functools
import tempfile
from pathlib import Path

from hfexport.formats.executorch.experts import every_expert
from hfexport.models import key_value_heads

PROGRAM_FILE = "model.pte"
DATA_FILE = "model.ptd"  # the weights of a program hfexport 0.1 published (read still; 0.2 keeps them inside)
COMPONENT = "model"
MARKER = "llm_runner"  # in the component's export_config: this program holds its cache (the runner's contract)
LAST_LOGITS = "last_logits"  # in the component's export_config: the program returns the last position's logits
ATTENTION = "attention"  # in the component's export_config: CUSTOM_SDPA (the LLM kernels) or "sdpa" (portable ops)
CUSTOM_SDPA = "custom_sdpa"
_ATTENTION_NAME = "hfexport_executorch_custom_sdpa"  # the name the kernels' attention is registered under
_LAYER_ATTRIBUTE = "_hfexport_cache_layer"  # on each attention module while exporting: its cache layer
#: The cache size when the recipe names none (`generation.max_cache_len`): the model's context, at most this many.
DEFAULT_MAX_CONTEXT = 2048


def is_llm_program(metadata) -> bool:
    """Whether a component's metadata (an `ExportMetadata` or its dict) is this contract's program."""
    config = metadata.get("export_config") if isinstance(metadata, dict) else getattr(metadata, "export_config", None)
    return bool((config or {}).get(MARKER))


def uses_custom_ops(metadata) -> bool:
    """Whether a component's program calls ExecuTorch's LLM kernels (`register_custom_ops` before loading it)."""
    config = metadata.get("export_config") if isinstance(metadata, dict) else getattr(metadata, "export_config", None)
    return (config or {}).get(ATTENTION) == CUSTOM_SDPA


def register_custom_ops() -> None:
    """Register ExecuTorch's LLM kernels (`llama::custom_sdpa`, `llama::update_cache`) in this process, for export
    (the torch ops) and for the runtime (the ExecuTorch kernels): importing executorch's module loads its library."""
    from executorch.extension.llm.custom_ops import custom_ops  # noqa: F401 - registers on import


def register_quantized_kernels() -> None:
    """Register ExecuTorch's quantized kernels (`quantized_decomposed::embedding_4bit`/`embedding_byte`: an 8da4w
    variant's embedding, `hfexport.formats.executorch.variants`) for the runtime, as optimum-executorch's modeling does."""
    from executorch.kernels import quantized  # noqa: F401 - registers on import


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
        "use_sdpa_with_kv_cache": False,  # the runner's flag for the older fused op (sdpa_with_kv_cache), not ours
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


def export(model, engine_config, generation: dict, attention: str | None = None, quantized: bool = False):
    """`model` as one LLM runner program (see the module docstring), as the engine's `ExportedModel` whose program
    and data file live in a temporary folder until saved. `attention`: the attention to use (CUSTOM_SDPA or "sdpa")
    instead of choosing it (a variant keeps its float32 export's); `quantized`: the model's weights are torchao's
    quantized tensors (`hfexport.formats.executorch.variants`), lowered as optimum-executorch lowers them (quantize
    ops fused into their kernels, constants folded)."""
    import dataclasses

    import torch
    from executorch.backends.xnnpack.partition.xnnpack_partitioner import XnnpackPartitioner
    from executorch.exir import EdgeCompileConfig, ExecutorchBackendConfig, to_edge_transform_and_lower
    from transformers.exporters import ExportedComponent, ExportedModel, ExportFormat, ExportMetadata
    from transformers.integrations.executorch import TorchExportableModuleWithStaticCache

    max_len = max_context(model, generation)
    prompt = min(4, max_len - 1)
    inputs = {"input_ids": torch.zeros((1, prompt), dtype=torch.long), "cache_position": torch.arange(prompt)}
    seq = torch.export.Dim("seq", min=1, max=max_len - 1)
    shapes = {"input_ids": {1: seq}, "cache_position": {0: seq}}
    # _attention checks the kernels against the model's full logits, so the last-position cut comes after it
    with _static_generation_config(model), every_expert(model), _attention(model, attention) as attention, \
            _last_position_logits(model) as last_logits:
        if attention == CUSTOM_SDPA:
            module = _custom_ops_module(model, max_len).eval()
        else:
            with cache_heads_as_written(model):
                module = TorchExportableModuleWithStaticCache(model, batch_size=1, max_cache_len=max_len).eval()
        with torch.no_grad():
            program = torch.export.export(module, args=(), kwargs=inputs, dynamic_shapes=shapes, strict=True)
    _drop_inverse_transposes(program)
    # the LLM kernels are not core ATen: executorch's IR check would refuse them (as optimum-executorch's recipe)
    lowered = to_edge_transform_and_lower(program, partitioner=[XnnpackPartitioner()],
                                          compile_config=EdgeCompileConfig(_check_ir_validity=attention == "sdpa"),
                                          constant_methods=constant_methods(model, max_len),
                                          transform_passes=[_drop_padding_index] if quantized else None)
    # the weights inside: optimum-executorch reads no .ptd
    manager = lowered.to_executorch(ExecutorchBackendConfig(do_quant_fusion_and_const_prop=quantized))
    scratch = tempfile.TemporaryDirectory(prefix="hfexport-pte-")
    folder = Path(scratch.name)
    with open(folder / PROGRAM_FILE, "wb") as file:
        manager.write_to_file(file)
    loaded = load_program(folder / PROGRAM_FILE, None, custom_ops=attention == CUSTOM_SDPA)
    loaded.scratch = scratch  # the files live as long as the program
    engine = dataclasses.asdict(engine_config) if dataclasses.is_dataclass(engine_config) else {}
    export_config = {key: value for key, value in engine.items()
                     if isinstance(value, (str, int, float, bool)) or value is None}
    export_config.update({MARKER: True, "max_seq_len": max_len, "strict": True, ATTENTION: attention,
                          LAST_LOGITS: last_logits})
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


def _plain_full_attention(model, max_len: int) -> bool:
    """Every layer of the model's static cache is a plain full-attention layer (no sliding window, no KV sharing) and
    the model takes its attention function from transformers' attention interface: what the kernels compute."""
    from transformers.cache_utils import StaticCache, StaticLayer

    if not getattr(model, "_supports_attention_backend", False):
        return False
    layers = StaticCache(max_cache_len=max_len, config=model.config.get_text_config()).layers
    return bool(layers) and all(type(layer) is StaticLayer for layer in layers)


@contextlib.contextmanager
def _last_position_logits(model):
    """Within the block, the model's forward computes the logits of the last position alone (`logits_to_keep=1`),
    where it takes that argument (transformers' causal LMs do; yields whether it does): what executorch's own Llama
    export does (`generate_full_logits=False`). Both
    runners read only the last position (TextLLMRunner's `logits_to_token` takes the last row of `[1, seq, vocab]`,
    optimum-executorch's `generate` `logits[0, -1]`), and the language-model head over every prompt position is a
    fifth of SmolLM2's prefill (49152 x 576 of its 135M weights, per token)."""
    import inspect

    if "logits_to_keep" not in inspect.signature(model.forward).parameters:
        yield False
        return
    own = model.__dict__.get("forward")  # an instance's own forward (a hook's), put back after
    model.forward = functools.partial(model.forward, logits_to_keep=1)
    try:
        yield True
    finally:
        if own is None:
            del model.forward
        else:
            model.forward = own


@contextlib.contextmanager
def _attention(model, chosen: str | None = None):
    """Within the block, the model attends through ExecuTorch's LLM kernels where it can (yields CUSTOM_SDPA), else
    as it does (yields "sdpa"); its attention implementation is restored after. `chosen`: that one, unchecked (an
    attention already checked on the float32 model)."""
    max_len = 8
    if chosen == "sdpa" or not _plain_full_attention(model, max_len) or not _kernels_available():
        yield "sdpa"
        return
    config = model.config.get_text_config()
    original = config._attn_implementation
    try:
        config._attn_implementation = _ATTENTION_NAME
        if chosen == CUSTOM_SDPA or _same_as_eager(model, original):
            yield CUSTOM_SDPA
            return
    finally:
        config._attn_implementation = original
        for submodule in model.modules():
            submodule.__dict__.pop(_LAYER_ATTRIBUTE, None)
    yield "sdpa"


def _kernels_available() -> bool:
    try:
        register_custom_ops()
    except (ImportError, OSError, AssertionError):
        return False
    from transformers import AttentionInterface
    from transformers.masking_utils import AttentionMaskInterface

    AttentionInterface.register(_ATTENTION_NAME, _custom_sdpa)
    AttentionMaskInterface.register(_ATTENTION_NAME, _no_mask)  # causal in the kernel: no mask is built
    return True


def _same_as_eager(model, original: str) -> bool:
    """The kernels' module gives the model's own next-token logits on a short prompt and two decode steps (eager):
    a family whose attention is not what the kernels compute keeps the portable program."""
    import torch

    config = model.config.get_text_config()
    ids = torch.arange(3, 9).remainder(config.vocab_size).view(1, -1)
    steps = [(ids[:, :4], torch.arange(4)), (ids[:, 4:5], torch.tensor([4])), (ids[:, 5:6], torch.tensor([5]))]
    with torch.no_grad():
        module = _custom_ops_module(model, 8).eval()
        got = torch.cat([module(input_ids=step, cache_position=position)[0, -1:] for step, position in steps])
        config._attn_implementation = original
        want = model(ids, use_cache=False).logits[0, [3, 4, 5]]
        config._attn_implementation = _ATTENTION_NAME
    return bool(torch.allclose(got, want, rtol=1e-3, atol=1e-4))


def _no_mask(*args, **kwargs):
    return None


def _custom_sdpa(module, query, key, value, attention_mask, scaling=None, dropout=0.0, **kwargs):
    """transformers' attention function over ExecuTorch's `llama::custom_sdpa`: causal from the layer's start
    position, over the sequence-major cache `CustomOpsLayer` holds; returns `[batch, seq, heads, head_dim]` as
    transformers' attention functions do."""
    import torch

    start = module.__dict__[_LAYER_ATTRIBUTE].start
    output = torch.ops.llama.custom_sdpa(query.transpose(1, 2), key, value, start, None, 0.0, True, scaling)
    return output, None


def _custom_ops_classes():
    """`CustomOpsLayer` and `CustomOpsModule`, made on first use (transformers is imported only when exporting)."""
    import torch
    from transformers.cache_utils import StaticLayer
    from transformers.integrations.executorch import TorchExportableModuleWithStaticCache

    class CustomOpsLayer(StaticLayer):
        """A `StaticLayer` whose cache is sequence-major and written in place by `llama::update_cache` at the
        program's start position."""

        def update(self, key_states, value_states, *args, **kwargs):
            torch.ops.llama.update_cache(key_states.transpose(1, 2), self.keys, self.start)
            torch.ops.llama.update_cache(value_states.transpose(1, 2), self.values, self.start)
            return self.keys, self.values

    class CustomOpsModule(TorchExportableModuleWithStaticCache):
        """transformers' exportable module with its cache layers made `CustomOpsLayer`s (buffers re-registered
        sequence-major) and each attention module told its layer; `forward` sets the start position every layer
        writes and attends from (`cache_position[0]`).

        The layers keep no token counter: the kernels take the start position, and the model reads its positions
        from the first layer's counter alone (`get_seq_length`), set once per call. transformers' module sets and
        increments every layer's: 178 of the 795 instructions of SmolLM2's `forward`
        (benchmarks/README.md, `llm_runtimes_executorch.py`)."""

        def __init__(self, model, max_len: int):
            super().__init__(model, batch_size=1, max_cache_len=max_len)
            for index, layer in enumerate(self.static_cache.layers):
                layer.__class__ = CustomOpsLayer
                layer.keys = layer.keys.transpose(1, 2).contiguous()
                layer.values = layer.values.transpose(1, 2).contiguous()
                self.register_buffer(f"key_cache_{index}", layer.keys, persistent=False)
                self.register_buffer(f"value_cache_{index}", layer.values, persistent=False)
                if index:
                    delattr(self, f"cumulative_length_{index}")
            for submodule in model.modules():
                index = getattr(submodule, "layer_idx", None)
                if isinstance(index, int) and hasattr(submodule, "is_causal"):
                    # not an attribute nn.Module registers: the layer is no module and holds the cache buffers
                    submodule.__dict__[_LAYER_ATTRIBUTE] = self.static_cache.layers[index]

        def forward(self, input_ids=None, inputs_embeds=None, cache_position=None):
            start = cache_position[0].item()
            torch._check(start >= 0)
            torch._check(start + input_ids.shape[1] <= self.static_cache.layers[0].max_cache_len)
            for layer in self.static_cache.layers:
                layer.start = start
            self.static_cache.layers[0].cumulative_length.copy_(cache_position[0])
            outputs = self.model(input_ids=input_ids, inputs_embeds=inputs_embeds, attention_mask=None,
                                 past_key_values=self.static_cache, use_cache=True)
            return outputs.logits if hasattr(outputs, "logits") else outputs.last_hidden_state

    return CustomOpsLayer, CustomOpsModule


def _custom_ops_module(model, max_len: int):
    with cache_heads_as_written(model):
        return _custom_ops_classes()[1](model, max_len)


@contextlib.contextmanager
def cache_heads_as_written(model):
    """Within the block, the text config's `num_key_value_heads` is the key-value heads the model's attention writes
    (`hfexport.models.key_value_heads`, read as the modeling code reads them), where transformers would size the
    static cache otherwise; the config is restored after.

    transformers 5.23's `TorchExportableModuleWithStaticCache` sizes the cache from `get_head_shapes(config)`, which
    reads `num_key_value_heads`, else `num_attention_heads`: Falcon-7B's config (`multi_query: true`, one key-value
    head whatever `num_kv_heads` says; no `num_key_value_heads`) got a cache of its 71 attention heads for the one
    its attention writes, and torch.export stopped at "index_copy_(): Source/destination tensor must have same slice
    shapes"."""
    from transformers.configuration_utils import get_head_shapes

    config = model.config.get_text_config()
    heads, engine_heads = key_value_heads(config), get_head_shapes(config)[0]
    if not isinstance(engine_heads, int) or engine_heads == heads:  # per-layer head counts: left as they are
        yield
        return
    saved = config.__dict__.get("num_key_value_heads")
    config.num_key_value_heads = heads
    try:
        yield
    finally:
        if saved is None:
            del config.num_key_value_heads
        else:
            config.num_key_value_heads = saved


def _drop_inverse_transposes(program) -> int:
    """Drop every `transpose(transpose(x, a, b), a, b)` of the traced program (the identity): the model transposes
    each layer's values to `[batch, heads, seq, head_dim]` and the sequence-major cache update transposes them back
    (executorch's own `CustomKVCache` says the same pair "shall be removed by subsequent post-export graph pass").

    Why it matters: kept, the pair is two XNNPACK permutes that hold the value projection in a delegate of its own,
    ahead of the rotary embedding, so the last delegate before `llama::custom_sdpa` is a few tiny elementwise ops and
    the kernel starts on idle worker threads. Dropped, XNNPACK puts the value projection in the rotary embedding's
    delegate right before the cache update, as in optimum-executorch's program, and on 2 threads the attention kernel
    takes 20-30 us a layer instead of 55-65 (ETDump, SmolLM2 decode; at 1 thread both are 20-28: benchmarks/README.md).
    Not executorch's `RemoveRedundantTransposes` (extension/llm/export/export_passes.py, run by its LLM builder on the
    module before export): on an `ExportedProgram` it also rewires a pair that feeds the program's output, leaving the
    graph signature's output spec naming a deleted node; this pass leaves such a pair. Returns how many pairs were
    dropped."""
    import torch

    graph = program.graph_module.graph
    transpose = torch.ops.aten.transpose.int
    dropped = 0
    for node in list(graph.nodes):
        inner = node.args[0] if node.op == "call_function" and node.target == transpose else None
        if inner is None or getattr(inner, "target", None) != transpose or \
                sorted(inner.args[1:]) != sorted(node.args[1:]) or any(user.op == "output" for user in node.users):
            continue
        node.replace_all_uses_with(inner.args[0])
        graph.erase_node(node)
        if not inner.users:
            graph.erase_node(inner)
        dropped += 1
    if dropped:
        graph.lint()
        program.graph_module.recompile()
    return dropped


def _drop_padding_index(graph_module):
    """Drop `padding_idx` from every embedding (it only masks a gradient), so that the 8-bit embedding's
    `dequantize_affine -> embedding` is the pattern executorch's quant fusion makes one `embedding_byte` kernel of, as
    optimum-executorch's `RemovePaddingIdxEmbeddingPass` does."""
    from executorch.exir.dialects._ops import ops as exir_ops
    from torch.fx.passes.infra.pass_base import PassResult

    changed = False
    for node in graph_module.graph.nodes:
        if node.op == "call_function" and node.target == exir_ops.edge.aten.embedding.default and len(node.args) > 2:
            node.args, changed = node.args[:2], True
    if changed:
        graph_module.recompile()
    return PassResult(graph_module, changed)


def _versions() -> dict:
    from importlib.metadata import PackageNotFoundError, version

    found = {}
    for package in ("torch", "transformers", "executorch"):
        try:
            found[package] = version(package)
        except PackageNotFoundError:
            pass
    return found


def load_program(path: Path, data: Path | None, custom_ops: bool = False):
    """The `.pte` as an `executorch.runtime.Program` with its `.ptd`, remembering both files so that saving it again
    copies them (as the engine's `ExecutorchExporter.load_program` remembers `path`); `custom_ops`: the program calls
    ExecuTorch's LLM kernels (`uses_custom_ops`), registered first."""
    from executorch.runtime import Runtime

    if custom_ops:
        register_custom_ops()
        register_quantized_kernels()
    program = Runtime.get().load_program(Path(path), data_path=str(data) if data is not None else None)
    program.path, program.data_path = str(path), str(data) if data is not None else None
    return program


