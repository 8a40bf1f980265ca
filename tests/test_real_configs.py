"""Published configs (hfexport.testing.zoo) through the default generation targets: issue 43's two defects.

Llama-3.2-1B's config as published (hidden 2048, 32 query heads over 8 key-value heads, head_dim 64, llama3 rope
scaling, tied head, stored in bfloat16), 2 layers, the zoo tokenizer's vocabulary, random weights; its MLP cut from
8192 to 512 wide (`SMALLER`), which no cache or attention shape depends on, to keep the export in seconds. The hidden
size stays: optimum-onnx 0.1.0 builds the empty past's head size as hidden_size / num_attention_heads for Llama, so a
smaller hidden with the published head_dim would be a shape no published Llama has, and optimum would refuse it.

- 8 key-value heads: a prompt of 8 tokens made the cache's heads axis `Dim.AUTO` (the sample's lengths were matched
  against every cache axis), torch.export fixed it to 8 as a symbol named "8", and the ONNX contract refused the graph.
- bfloat16: the engine exported the checkpoint's dtype, a bfloat16 graph ONNX Runtime's CPU provider has no `Mul`
  for (reported as a corrupt file). A half-precision checkpoint is now loaded, exported and verified at float32.
"""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest

from hfexport.deployment import PASSED
from hfexport.testing.zoo import build

#: Llama-3.2-1B's MLP width, cut (see the module docstring); hidden, heads, key-value heads, head_dim as published.
SMALLER = {"intermediate_size": 512}
#: 8 and 6 tokens of the zoo tokenizer: the padded prompt is as long as Llama 3's 8 key-value heads.
PROMPTS = ["The lazy dog", "The fox is"]


@pytest.fixture(scope="module")
def llama_3_2(session_dir) -> Path:
    return build("llama-3.2-1b", session_dir / "zoo-llama-3.2-1b", overrides=SMALLER, texts=PROMPTS)


def test_the_checkpoint_is_llama_3_2_1b_shaped_and_its_prompt_as_long_as_its_key_value_heads(llama_3_2):
    from transformers import AutoTokenizer

    config = json.loads((llama_3_2 / "config.json").read_text())
    assert (config["num_attention_heads"], config["num_key_value_heads"], config["head_dim"]) == (32, 8, 64)
    assert config["dtype"] == "bfloat16" and config["rope_parameters"]["rope_type"] == "llama3"
    tokenizer = AutoTokenizer.from_pretrained(llama_3_2)
    assert [len(tokenizer(text)["input_ids"]) for text in PROMPTS] == [8, 6]


def test_a_half_precision_checkpoint_loads_at_float32(llama_3_2):
    import torch

    from hfexport.models import checkpoint_dtype, load_config, load_model
    from hfexport.recipe.loading import load_recipe

    model = load_model(llama_3_2, load_recipe(llama_3_2))
    assert {parameter.dtype for parameter in model.parameters()} == {torch.float32}
    assert checkpoint_dtype(load_config(llama_3_2)) == "bfloat16"


def test_a_cache_keeps_its_heads_and_head_dim_static_when_a_prompt_is_as_long(llama_3_2):
    """The plan's default generation shapes mark a cache's batch and length `Dim.AUTO`, never its heads or head_dim,
    whatever sizes the sample's batch and lengths have."""
    from torch.export import Dim

    from hfexport.models import load_model, load_processor
    from hfexport.plan import build_plan
    from hfexport.recipe.loading import load_recipe

    recipe = load_recipe(llama_3_2)
    plan = build_plan(recipe, "onnx-generation", load_model(llama_3_2, recipe), None, load_processor(llama_3_2))
    cache = plan.components["decode"].config.dynamic_shapes["past_key_values"]
    assert len(cache) == 4 and all(spec == {0: Dim.AUTO, 2: Dim.AUTO} for spec in cache), cache


def test_llama_3_2_1b_in_bfloat16_exports_to_onnx_and_openvino_and_every_runtime_generates(
        session_dir, llama_3_2, runtime_env):
    """The job on the published shape and dtype: both targets export at float32, verify against `model.generate`,
    and the ONNX one is in the loaders' contract with a static `[batch_size, 8, past_sequence_length, 64]` past,
    generated token for token by transformers.js, optimum and onnxruntime-genai. The report names the checkpoint's
    dtype and each export's."""
    from unittest import mock

    import onnx

    from hfexport.job.run import run_job
    from hfexport.report.data import validate_report

    output = session_dir / "zoo-llama-3.2-1b-out"
    with mock.patch.dict(os.environ, runtime_env):
        report = run_job(llama_3_2, output, ["onnx-generation", "openvino-generation"], latency=False)
    for name, target in report.targets.items():
        assert target.status == "ok", (name, target.error)
        assert target.verification["passed"] and target.verification["export_dtype"] == "float32", name
    assert report.source["checkpoint_dtype"] == "bfloat16"
    validate_report(report.to_dict())
    onnx_target = report.targets["onnx-generation"]
    assert [(check["runtime"], check["verdict"]) for check in onnx_target.runtimes] == [
        ("transformers.js", PASSED), ("optimum", PASSED), ("onnxruntime-genai", PASSED)], onnx_target.runtimes
    graph = onnx.load(str(output / "onnx-generation" / "model.onnx"), load_external_data=False).graph
    past = next(value for value in graph.input if value.name == "past_key_values.1.value")
    assert [dim.dim_param or dim.dim_value for dim in past.type.tensor_type.shape.dim] == [
        "batch_size", 8, "past_sequence_length", 64]
    assert past.type.tensor_type.elem_type == onnx.TensorProto.FLOAT


def test_a_symbolic_head_count_is_refused_naming_the_input_the_axis_and_the_sizes():
    import onnx_ir

    from hfexport.formats.onnx.decoder_contract import ContractError, _symbol_names

    def value(name, dims):
        return onnx_ir.Value(name=name, shape=onnx_ir.Shape(dims), type=onnx_ir.TensorType(onnx_ir.DataType.FLOAT))

    symbol = onnx_ir.SymbolicDim
    graph = onnx_ir.Graph(
        [value("input_ids", [symbol("s44"), symbol("s70")]),
         value("input.past_key_values.layers.0.keys", [symbol("s44"), symbol("8"), symbol("s36"), 64])],
        [], nodes=[])
    with pytest.raises(ContractError) as raised:
        _symbol_names(graph, {"num_attention_heads": 32, "num_key_value_heads": 8, "head_dim": 64})
    message = str(raised.value)
    assert "'input.past_key_values.layers.0.keys', axis 1 (key-value heads)" in message
    assert "expected the static size 8 (config.json `num_key_value_heads`)" in message
    assert "found the symbolic dim '8'" in message and "fixed to that size" in message


def test_an_op_onnx_runtime_has_no_cpu_kernel_for_is_said_so_not_a_corrupt_file(tmp_path):
    """A sound graph of one bfloat16 `Mul`: ONNX Runtime's CPU provider has no kernel for it, which the loader says
    naming the op, its opset and the dtype."""
    import onnx
    from onnx import TensorProto, helper

    from hfexport.errors import MissingKernelError
    from hfexport.formats.onnx.file_component import OnnxFile
    from hfexport.formats.onnx.file_runner import OnnxFileRunner

    tensor = [helper.make_tensor_value_info(name, TensorProto.BFLOAT16, [2]) for name in ("a", "b", "c")]
    graph = helper.make_graph([helper.make_node("Mul", ["a", "b"], ["c"], name="the_mul")], "g", tensor[:2],
                              tensor[2:])
    path = tmp_path / "model.onnx"
    onnx.save(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 14)]), str(path))
    with pytest.raises(MissingKernelError) as raised:
        OnnxFileRunner.from_program(OnnxFile(path), None, device="cpu")
    message = str(raised.value)
    assert str(path) in message and "no CPU kernel for Mul (opset 14) at bfloat16 (node 'the_mul')" in message
    assert "not corrupt" in message


def test_the_preflight_counts_a_half_precision_checkpoint_at_float32(llama_3_2):
    from hfexport.job.preflight import loaded_bytes, weights_metadata

    stored, dtypes = weights_metadata(llama_3_2)
    assert set(dtypes) == {"BF16"} and stored == 2 * dtypes["BF16"]
    assert loaded_bytes(stored, dtypes) == 4 * dtypes["BF16"]
    assert loaded_bytes(100, {}) == 100  # no safetensors: the files' sizes
