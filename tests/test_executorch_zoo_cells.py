"""The zoo's ExecuTorch cells that failed after their export started (issue 43), each fixed generally or refused at
plan time with its upstream cause: a mixture-of-experts model's experts, a multi-query Falcon's cache, XNNPACK's tanh GELU."""

from __future__ import annotations

import pytest


@pytest.fixture(scope="module")
def tiny_moe():
    """A one-layer Qwen3-MoE (4 experts, 2 per token), random weights, float32."""
    import torch
    from transformers import Qwen3MoeConfig, Qwen3MoeForCausalLM

    torch.manual_seed(0)
    config = Qwen3MoeConfig(vocab_size=64, hidden_size=32, intermediate_size=64, moe_intermediate_size=16,
                            num_hidden_layers=1, num_attention_heads=4, num_key_value_heads=2, head_dim=8,
                            num_experts=4, num_experts_per_tok=2, max_position_embeddings=64)
    return Qwen3MoeForCausalLM(config).eval()


def test_every_expert_computes_what_the_models_own_experts_do(tiny_moe):
    import torch

    from hfexport.formats.executorch.experts import IMPLEMENTATION, every_expert

    ids = torch.arange(3, 20).view(1, -1)
    original = tiny_moe.get_experts_implementation()
    with torch.no_grad():
        want = tiny_moe(ids).logits
        with every_expert(tiny_moe):
            assert set(tiny_moe.get_experts_implementation().values()) == {IMPLEMENTATION}
            got = tiny_moe(ids).logits
    torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-5)
    assert tiny_moe.get_experts_implementation() == original


class _Logits:
    """`model`'s logits alone, no cache (what torch.export takes)."""

    def __new__(cls, model):
        import torch

        class Logits(torch.nn.Module):
            def __init__(self):
                super().__init__()
                self.model = model

            def forward(self, input_ids):
                return self.model(input_ids, use_cache=False).logits

        return Logits()


def _export(model):
    import torch

    from hfexport.formats.executorch.experts import every_expert

    seq = torch.export.Dim("seq", min=1, max=63)
    with every_expert(model), torch.no_grad():
        return torch.export.export(_Logits(model), (torch.zeros((1, 4), dtype=torch.long),),
                                   dynamic_shapes=({1: seq},), strict=True)


def test_the_experts_trace_without_transformers_op_or_a_per_token_gather_of_weights(tiny_moe):
    """transformers' default experts are a custom op ExecuTorch has no kernel for ("Missing out variants:
    {'transformers::grouped_mm_fallback'}"); its `batched_mm` gathers `[seq x top_k, 2 x intermediate, hidden]` of
    weights by the routing indices, which ExecuTorch's memory plan sizes for the sequence's upper bound. With
    `every_expert` neither is in the graph: each expert's weights are read as a static slice."""
    import torch

    program = _export(tiny_moe)
    parameters = {spec.arg.name for spec in program.graph_signature.input_specs if spec.kind.name == "PARAMETER"}
    targets = [str(node.target) for node in program.graph.nodes if node.op == "call_function"]
    assert not [target for target in targets if "grouped_mm" in target]
    gathers = [node for node in program.graph.nodes if node.target == torch.ops.aten.index.Tensor
               and getattr(node.args[0], "name", None) in parameters]
    assert not gathers, gathers


@pytest.mark.slow
def test_the_experts_lower_to_executorch_with_a_plan_of_activations_only(tiny_moe):
    """The program lowers (no missing out variant) and its planned memory is far below what the gathered weights of
    `batched_mm` would take at the sequence's upper bound."""
    from executorch.exir import to_edge_transform_and_lower

    executorch_program = to_edge_transform_and_lower(_export(tiny_moe)).to_executorch().executorch_program
    planned = sum(executorch_program.execution_plan[0].non_const_buffer_sizes)
    gathered = 63 * 2 * (2 * 16) * 32 * 4  # batched_mm's gathered gate_up weights alone at seq 63, in bytes
    assert planned < gathered / 4, planned


def test_the_static_cache_holds_the_key_value_heads_a_multi_query_falcon_writes():
    """Falcon-7B's config says `multi_query: true` (one key-value head) beside `num_kv_heads` 71 and no
    `num_key_value_heads`; transformers' `get_head_shapes` sizes the static cache for 71 heads (the attention heads),
    and torch.export stopped at "index_copy_(): Source/destination tensor must have same slice shapes". The cache is
    sized from the heads the attention writes (`hfexport.models.key_value_heads`)."""
    import torch
    from transformers import FalconConfig, FalconForCausalLM
    from transformers.configuration_utils import get_head_shapes
    from transformers.integrations.executorch import TorchExportableModuleWithStaticCache

    from hfexport.formats.executorch.llm_program import cache_heads_as_written

    torch.manual_seed(0)
    model = FalconForCausalLM(FalconConfig(vocab_size=64, hidden_size=32, num_attention_heads=4, num_kv_heads=4,
                                           num_hidden_layers=1, multi_query=True, new_decoder_architecture=False,
                                           max_position_embeddings=32)).eval()
    assert get_head_shapes(model.config) == (4, 8)  # the engine's reading, which the fix overrides
    model.generation_config.cache_implementation = "static"
    with cache_heads_as_written(model):
        module = TorchExportableModuleWithStaticCache(model, batch_size=1, max_cache_len=16)
    assert get_head_shapes(model.config) == (4, 8) and "num_key_value_heads" not in model.config.__dict__
    assert tuple(module.key_cache_0.shape) == (1, 1, 16, 8)
    with torch.no_grad():
        module(input_ids=torch.tensor([[3, 4]]), cache_position=torch.arange(2))  # writes without a shape error


def _tanh_gelu_through_xnnpack(inputs):
    import torch
    from executorch.backends.xnnpack.partition.xnnpack_partitioner import XnnpackPartitioner
    from executorch.exir import to_edge_transform_and_lower
    from executorch.runtime import Runtime

    class TanhGelu(torch.nn.Module):
        def forward(self, x):
            return torch.nn.functional.gelu(x, approximate="tanh")

    program = to_edge_transform_and_lower(torch.export.export(TanhGelu(), (inputs,)),
                                          partitioner=[XnnpackPartitioner()]).to_executorch()
    return Runtime.get().load_program(program.buffer).load_method("forward").execute([inputs])[0]


def test_without_the_fix_xnnpack_computes_the_erf_gelu_for_a_tanh_one():
    """ExecuTorch 1.5.1's XNNPACK partitioner delegates `gelu(approximate='tanh')` and serializes XNNPACK's gelu, the
    erf one (SigLIP's `gelu_pytorch_tanh`: last_hidden_state 8.8e-4 off on 4.9% of its elements). The canary: it still
    does (when this fails, ExecuTorch fixed it and the workaround can go)."""
    import torch

    inputs = torch.linspace(-4, 4, 801)
    got = _tanh_gelu_through_xnnpack(inputs)
    torch.testing.assert_close(got, torch.nn.functional.gelu(inputs), rtol=0, atol=1e-6)
    assert (got - torch.nn.functional.gelu(inputs, approximate="tanh")).abs().max() > 4e-4


def test_a_tanh_gelu_exported_to_executorch_computes_the_tanh_form():
    import torch

    from hfexport.formats.executorch.workarounds import executorch_fixes

    inputs = torch.linspace(-4, 4, 801)
    with executorch_fixes():
        got = _tanh_gelu_through_xnnpack(inputs)
    torch.testing.assert_close(got, torch.nn.functional.gelu(inputs, approximate="tanh"), rtol=0, atol=1e-6)
