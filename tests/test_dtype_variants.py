"""A target's `variants` (issue 46): transformers.js' dtypes made from the one ONNX export (no re-export), under the
names transformers.js opens them by, each gated on its perplexity ratio and next-token agreement with the float32
export (and its runtimes, where installed); a recipe asking for a variant its target cannot make is refused first.
The tiny random Llama (2 layers) here; SmolLM2 real weights in tests/test_smollm2_dtype_variants.py (slow)."""

from __future__ import annotations

import copy
import json
import os
import shutil

import pytest
from hfexport.errors import RecipeError
from hfexport.recipe.loading import load_recipe

#: A tiny random model's logits have small margins: its 4-bit variants keep fewer argmaxes than a trained model's
#: (SmolLM2's measured bounds are the defaults); the bounds here say what this model is held to.
TINY_FOUR_BIT = {"min_top1_agreement": 0.5}
VARIANTS = ["fp16", "q8", {"name": "q4", "block_size": 16, **TINY_FOUR_BIT}, {"name": "q4f16", **TINY_FOUR_BIT}]


def _recipe(tiny_llama, variants=VARIANTS, **target) -> dict:
    recipe = json.loads((tiny_llama / "export_config.json").read_text())
    onnx = {**recipe["targets"]["onnx-generation"], "variants": variants, **target}
    return {**recipe, "default_target": "onnx-generation", "targets": {"onnx-generation": onnx}}


def _problems(recipe) -> list[tuple[str, str]]:
    with pytest.raises(RecipeError) as caught:
        load_recipe(recipe)
    return [(problem.path, problem.message) for problem in caught.value.problems]


def test_a_variant_the_target_cannot_make_is_refused_before_anything_runs(tiny_llama):
    base = "targets.onnx-generation.variants"
    assert _problems(_recipe(tiny_llama, ["q4", "q4", {"name": "q8", "symmetric": False},
                                          {"name": "q4f16", "block_size": 48}, {"name": "q8", "block_size": 24}])) == [
        (f"{base}.1", "'q4' is listed twice"),
        (f"{base}.2.symmetric", "not a setting of q8; it takes: weights_only, block_size, accuracy_level, "
                                "tied_embedding, fused_attention, per_channel, reduce_range, max_nll_ratio, min_top1_agreement"),
        (f"{base}.3.block_size", "MatMulNBits takes a power of two from 16; got 48 (e.g. 32)"),
        (f"{base}.4", "'q8' is listed twice"),
        (f"{base}.4.block_size", "MatMulNBits takes a power of two from 16; got 24 (e.g. 16)")]
    [(path, message)] = _problems(_recipe(tiny_llama, ["q4"], export_format="dynamo"))
    assert path == base and "dynamo publishes no variants" in message
    assert message.endswith("formats with variants: onnx, openvino, executorch")
    [(path, message)] = _problems(_recipe(tiny_llama, ["q4"], export_format="executorch", options={},
                                          generation={}))  # its names are its own
    assert path == f"{base}.0" and message == "'q4' is not a variant of executorch; it has: 8da4w"
    # its variants are made of the LLM runner's program, which this target's single graph is not
    [(path, message)] = _problems(_recipe(tiny_llama, ["8da4w"], export_format="executorch",
                                          options={"backend": "mlx"}))
    assert path == base and "made of the LLM runner's program" in message
    assert "generation.single_graph, options.backend 'mlx'" in message and message.endswith("leave them out")
    [(path, message)] = _problems(_recipe(tiny_llama, ["q4"], export_format="openvino"))  # its names are its own
    assert path == f"{base}.0" and message == "'q4' is not a variant of openvino; it has: int8, int4"
    forward = _recipe(tiny_llama, ["q8"])
    forward["targets"]["onnx-generation"] = {"export_format": "onnx", "mode": "forward", "variants": ["q8"]}
    [(path, message)] = _problems(forward)
    assert path == base and "generation target" in message
    [(path, message)] = _problems(_recipe(tiny_llama, ["q4"], dtype="float16"))
    assert path == base and "full-precision" in message
    [(path, message)] = _problems(_recipe(tiny_llama, ["bnb4"]))
    assert path == f"{base}.0" and "'bnb4'" in message


@pytest.fixture(scope="module")
def variants_job(tiny_llama, tmp_path_factory):
    from hfexport.job.run import run_job

    output = tmp_path_factory.mktemp("variants")
    return output, run_job(tiny_llama, output, recipe=_recipe(tiny_llama), latency=False, runtimes=False)


def test_each_variant_is_made_from_the_one_export_under_transformers_js_names(variants_job):
    output, report = variants_job
    target = report.targets["onnx-generation"]
    assert target.status == "ok", target.error
    assert "export_s" in target.timings and "variants_s" in target.timings  # one export, then the variants
    files = {entry["path"] for entry in target.files}
    assert {"model.onnx", "model_fp16.onnx", "model_quantized.onnx", "model_q4.onnx", "model_q4f16.onnx"} <= files
    assert [(entry["name"], entry["file"], entry["verdict"]) for entry in target.variants] == [
        ("fp16", "model_fp16.onnx", "passed"), ("q8", "model_quantized.onnx", "passed"),
        ("q4", "model_q4.onnx", "passed"), ("q4f16", "model_q4f16.onnx", "passed")]
    by_name = {entry["name"]: entry for entry in target.variants}
    assert by_name["fp16"]["nll_ratio"] == pytest.approx(1.0, abs=1e-3) and by_name["fp16"]["top1_agreement"] > 0.95
    assert by_name["q4"]["settings"] == {"block_size": 16, "symmetric": True, "accuracy_level": 4, "head_bits": 8,
                                         "tied_embedding": True, "fused_attention": True, "max_nll_ratio": 1.35,
                                         "min_top1_agreement": 0.5}
    assert by_name["q8"]["settings"]["per_channel"] is True and by_name["q8"]["positions"] > 20
    # q8's blocks resolved from the graph (its inputs 64 and 128 wide): recorded as made
    assert by_name["q8"]["settings"]["weights_only"] is True and by_name["q8"]["settings"]["block_size"] == 64
    for entry in target.variants:  # its report entry, on disk too (schema-checked when read back)
        assert entry["bytes"] == sum((output / "onnx-generation" / name).stat().st_size
                                     for name in (entry["file"], entry["file"] + "_data")
                                     if (output / "onnx-generation" / name).is_file())
    assert report.read(output / "onnx-generation").targets["onnx-generation"].variants == target.variants
    from hfexport.report.markdown import report_markdown

    table = report_markdown(report)
    assert "**Variants**" in table and "| q4 | `model_q4.onnx` |" in table and "✅ passed" in table


def test_the_graphs_are_what_each_dtype_means(variants_job, tmp_path):
    import onnx

    from hfexport.formats.onnx.variants import write
    from hfexport.quantization.variants import settings

    folder = variants_job[0] / "onnx-generation"

    def graph(name):
        return onnx.load(str(folder / name), load_external_data=False)

    def ops(name):
        return {node.op_type for node in graph(name).graph.node}

    def input_type(name):
        return {value.name: value.type.tensor_type.elem_type for value in graph(name).graph.input}["past_key_values.0.key"]

    assert "MatMulNBits" in ops("model_q4.onnx") and "MatMulNBits" in ops("model_q4f16.onnx")
    assert "MatMulNBits" in ops("model_quantized.onnx") and "MatMulInteger" not in ops("model_quantized.onnx")
    assert input_type("model_fp16.onnx") == input_type("model_q4f16.onnx") == onnx.TensorProto.FLOAT16
    assert input_type("model_q4.onnx") == input_type("model.onnx") == onnx.TensorProto.FLOAT
    def blocks(name):  # (bits, block_size) of each MatMulNBits, and whether it writes the logits
        return {(node.output[0] == "logits", *(next(a.i for a in node.attribute if a.name == key)
                                               for key in ("bits", "block_size")))
                for node in graph(name).graph.node if node.op_type == "MatMulNBits"}

    assert blocks("model_q4.onnx") == {(False, 4, 16), (True, 8, 16)}  # the head in 8-bit blocks (head_bits)
    assert blocks("model_quantized.onnx") == {(False, 8, 64), (True, 8, 64)}  # q8: weights alone, 8-bit blocks
    # the exporter's per-node stack traces stay with the float32 graph (3.4 MB of SmolLM2's, no computation)
    assert any(node.metadata_props for node in graph("model.onnx").graph.node)
    assert not any(node.metadata_props for name in ("model_quantized.onnx", "model_q4.onnx", "model_fp16.onnx")
                   for node in graph(name).graph.node)
    # q8 with weights_only false: transformers.js' dynamic int8 form (int8 activations)
    write(folder, settings({"name": "q8", "weights_only": False}), tmp_path / "q8-dynamic")
    dynamic = {node.op_type for node in onnx.load(str(tmp_path / "q8-dynamic" / "model.onnx"),
                                                  load_external_data=False).graph.node}
    assert "MatMulInteger" in dynamic and "DynamicQuantizeLinear" in dynamic and "MatMulNBits" not in dynamic


@pytest.mark.parametrize(("inputs", "expected"), [
    ((576, 1536), 64),  # SmolLM2-135M: 576 = 9 x 64
    ((2048, 8192), 128),  # capped: a scale per 128 weights is 1/32 of their 8-bit bytes
    ((100, 300), 32),  # no power of two from 16 divides: MatMulNBits pads the last block
])
def test_q8_blocks_divide_every_matmul_input_a_tied_head_included(tmp_path, inputs, expected):
    import numpy as np
    import onnx
    from onnx import TensorProto, helper, numpy_helper

    from hfexport.formats.onnx.variants import block_size_for

    hidden, wide = inputs
    weights = [numpy_helper.from_array(np.zeros(shape, np.float32), name) for name, shape in (
        ("up", (hidden, wide)), ("down", (wide, hidden)), ("embedding", (7, hidden)))]
    nodes = [helper.make_node("MatMul", ["x", "up"], ["h"]), helper.make_node("MatMul", ["h", "down"], ["y"]),
             helper.make_node("Transpose", ["embedding"], ["head"], perm=[1, 0]),  # a tied head reads K = hidden
             helper.make_node("MatMul", ["y", "head"], ["logits"])]
    graph = helper.make_graph(nodes, "g", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, hidden])],
                              [helper.make_tensor_value_info("logits", TensorProto.FLOAT, [1, 7])], weights)
    onnx.save(helper.make_model(graph), str(tmp_path / "model.onnx"))
    assert block_size_for(tmp_path / "model.onnx") == expected


def test_a_variant_below_its_bound_fails_the_target_by_name(variants_job, tiny_llama, tmp_path):
    from hfexport.plan import build_plan
    from hfexport.progress import no_progress
    from hfexport.report.data import TargetReport
    from hfexport.verify.variants import check_variants
    from transformers import AutoModelForCausalLM, AutoTokenizer

    folder = tmp_path / "onnx-generation"
    shutil.copytree(variants_job[0] / "onnx-generation", folder)
    recipe = load_recipe(_recipe(tiny_llama, ["fp16", {"name": "q4", "min_top1_agreement": 1.0}]))
    model, tokenizer = AutoModelForCausalLM.from_pretrained(tiny_llama).eval(), AutoTokenizer.from_pretrained(tiny_llama)
    plan = build_plan(recipe, "onnx-generation", model, None, tokenizer)
    report = TargetReport(target="onnx-generation", export_format="onnx", mode="generation")
    check_variants(report, folder, model, plan, tokenizer, no_progress, runtimes=False)
    assert report.status == "failed"
    assert report.error.startswith("variant q4: next-token agreement") and "below 1" in report.error
    assert "fp16" not in report.error
    # the previous job's other variants are not left behind as if made now
    assert not (folder / "model_quantized.onnx").exists() and (folder / "model_q4.onnx").is_file()


def test_the_publication_names_every_variant_for_transformers_js(variants_job, tiny_llama, hub):
    from hfexport.publication.publish import publish

    repo = f"{hub.user}/tiny-llama-variants"
    hub.seed_repo(repo, tiny_llama)
    result = publish(variants_job[0], repo, mode="pr", token=hub.write_token)
    files = set(hub.list_files(repo, f"refs/pr/{result.pr_num}"))
    assert {"onnx/model_q4.onnx", "onnx/model_q4f16.onnx", "onnx/model_fp16.onnx", "onnx/model_quantized.onnx"} <= files
    config = json.loads(hub.read_file(repo, "config.json", f"refs/pr/{result.pr_num}"))
    js = config["transformers.js_config"]
    assert {"model_q4.onnx", "model_quantized.onnx"} <= set(js["use_external_data_format"])
    assert js["kv_cache_dtype"] == {"fp16": "float16", "q4f16": "float16"}


def test_variants_are_part_of_the_target_as_the_recipe_copy_keeps_it(tiny_llama):
    recipe = load_recipe(_recipe(tiny_llama))
    target = recipe.target("onnx-generation")
    assert target.variants == VARIANTS and target.to_dict()["variants"] == VARIANTS
    other = copy.deepcopy(recipe.data)
    other["targets"]["onnx-generation"]["variants"] = ["q8"]
    assert load_recipe(other).target_hash("onnx-generation") != recipe.target_hash("onnx-generation")


def _tied_graph(folder):
    """A float32 graph whose head is tied to its 64 x 32 embedding (a Transpose of its table) saved in `folder`;
    the table."""
    import numpy as np
    import onnx
    from onnx import TensorProto, helper, numpy_helper

    embedding = np.random.default_rng(0).standard_normal((64, 32)).astype(np.float32)
    graph = helper.make_graph(
        [helper.make_node("Gather", ["embed.weight", "input_ids"], ["hidden"], name="embedding"),
         helper.make_node("Transpose", ["embed.weight"], ["head"], perm=[1, 0], name="tied"),
         helper.make_node("MatMul", ["hidden", "head"], ["logits"], name="head")],  # an export's nodes are named
        "tied", [helper.make_tensor_value_info("input_ids", TensorProto.INT64, [1, "sequence"])],
        [helper.make_tensor_value_info("logits", TensorProto.FLOAT, [1, "sequence", 64])],
        [numpy_helper.from_array(embedding, "embed.weight")])
    folder.mkdir()
    onnx.save(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 18)]), str(folder / "model.onnx"))
    return embedding


def _odd_graph(folder):
    """A float32 graph of one MatMul whose weight's 80 rows are 5 blocks of 16 (a 4-bit zero point's byte half
    used), saved in `folder`."""
    import numpy as np
    import onnx
    from onnx import TensorProto, helper, numpy_helper

    weight = np.random.default_rng(1).standard_normal((80, 24)).astype(np.float32) + 0.5  # zero points not 8
    graph = helper.make_graph(
        [helper.make_node("MatMul", ["x", "w"], ["logits"], name="head")], "odd",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, "sequence", 80])],
        [helper.make_tensor_value_info("logits", TensorProto.FLOAT, [1, "sequence", 24])],
        [numpy_helper.from_array(weight, "w")])
    folder.mkdir()
    onnx.save(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 18)]), str(folder / "model.onnx"))


def _quantizer_variant(folder, variant, bits, stage):
    """The weight-only variant as it was made before issue 45 streamed it: ONNX Runtime's `MatMulNBitsQuantizer` over
    the whole (fused, untied) float32 graph, the head in a second pass, then tied, and laid out as `write` does."""
    import onnx_ir
    from onnxruntime.quantization.matmul_nbits_quantizer import MatMulNBitsQuantizer

    from hfexport.formats.onnx.attention_fusion import fuse_attention
    from hfexport.formats.onnx.variants import head_nodes, tie_embedding, untied_head

    stage.mkdir()
    source = fuse_attention(folder / "model.onnx", stage / "fused.onnx")
    model = onnx_ir.load(str(source))
    untied_head(model)
    onnx_ir.save(model, str(stage / "untied.onnx"), external_data="untied.onnx.data")
    head_bits = variant.get("head_bits") or bits
    heads = head_nodes(model) if head_bits != bits else []
    options = {"block_size": variant["block_size"], "is_symmetric": variant.get("symmetric", True),
               "accuracy_level": variant["accuracy_level"]}
    quantizer = MatMulNBitsQuantizer(str(stage / "untied.onnx"), bits=bits, nodes_to_exclude=heads, **options)
    quantizer.process()
    if heads:
        quantizer = MatMulNBitsQuantizer(quantizer.model.model, bits=head_bits, nodes_to_include=heads, **options)
        quantizer.process()
    quantizer.model.save_model_to_file(str(stage / "quantized.onnx"), use_external_data_format=True)
    model = onnx_ir.load(str(stage / "quantized.onnx"))
    if variant["tied_embedding"] and options["is_symmetric"] and tie_embedding(model):
        onnx_ir.save(model, str(stage / "tied.onnx"), external_data="tied.onnx.data")
        model = onnx_ir.load(str(stage / "tied.onnx"))
    for node in model.graph:
        node.metadata_props.clear()
    onnx_ir.save(model, str(stage / "model.onnx"), external_data="model.onnx_data")


@pytest.mark.parametrize(("graph", "variant", "bits"), [
    ("llama", {"name": "q4", "block_size": 16}, 4),  # the head 8-bit: the quantizer's second pass
    ("llama", {"name": "q8"}, 8),
    ("llama", {"name": "q4", "block_size": 16, "symmetric": False, "head_bits": 4}, 4),  # zero points
    ("tied", {"name": "q4", "block_size": 16}, 4),  # the untied head's blocks read by the embedding
    ("odd", {"name": "q4", "block_size": 16, "symmetric": False, "head_bits": 4}, 4),
])
def test_weight_only_variants_are_byte_for_byte_the_quantizers_made_one_weight_at_a_time(
        variants_job, tmp_path, monkeypatch, graph, variant, bits):
    """issue 45: each weight is read, quantized (ONNX Runtime's own kernels) and written as the graph is saved, a
    slab of it at a time (here a few rows or columns: several slabs and a short last one), where the quantizer held
    the whole float32 graph; the files are the same bytes."""
    from hfexport.formats.onnx import variants
    from hfexport.formats.onnx.variants import write
    from hfexport.quantization.variants import settings

    monkeypatch.setattr(variants, "SLAB_BYTES", 3000)

    if graph == "llama":
        folder = variants_job[0] / "onnx-generation"
    else:
        folder = tmp_path / graph
        (_tied_graph if graph == "tied" else _odd_graph)(folder)
    variant = settings(variant)
    variant = {**variant, **write(folder, variant, tmp_path / "streamed")}
    _quantizer_variant(folder, variant, bits, tmp_path / "quantizer")
    for name in ("model.onnx", "model.onnx_data"):
        assert (tmp_path / "streamed" / name).read_bytes() == (tmp_path / "quantizer" / name).read_bytes(), name


@pytest.mark.parametrize("name", ["fp16", "q4f16"])
def test_float16_variants_are_byte_for_byte_the_converters_their_weights_converted_as_written(
        variants_job, tmp_path, monkeypatch, name):
    """issues 45/46: fp16's and q4f16's float16 conversion runs on the graph without its weights, each converted as
    it is written (`float16.streamed_float16_model`; here every float32 one, a few chunks at a time), where
    onnxruntime's converter held the whole graph and its float16 copy; the files are the same bytes."""
    import onnx_ir

    from hfexport.formats.onnx import float16, variants
    from hfexport.formats.onnx.variants import write
    from hfexport.quantization.variants import settings

    folder, variant = variants_job[0] / "onnx-generation", settings({"name": name, "block_size": 16})
    converted = []
    monkeypatch.setattr(float16, "STREAMED_BYTES", 1)
    monkeypatch.setattr(float16, "CHUNK", 1000)
    monkeypatch.setattr(float16, "_converted", lambda *args, convert=float16._converted: converted.append(args[-1])
                        or convert(*args))
    write(folder, variant, tmp_path / "streamed")
    assert converted.count(True) >= 4  # the weights were streamed, not read with the graph
    monkeypatch.setattr(variants, "streamed_float16_model",  # the conversion as it was: the converter, whole graph
                        lambda source: onnx_ir.from_proto(float16.float16_model(source)))
    write(folder, variant, tmp_path / "whole")
    for file in ("model.onnx", "model.onnx_data"):
        assert (tmp_path / "streamed" / file).read_bytes() == (tmp_path / "whole" / file).read_bytes(), file


@pytest.mark.parametrize("head_bits", [8, 4])
def test_a_head_tied_to_the_embedding_is_quantized_too_and_the_embedding_reads_its_blocks(tmp_path, head_bits):
    """A tied head reaches its MatMul through a Transpose of the embedding's weight, which ONNX Runtime's quantizer
    does not take for a constant: q4 gives it its own transposed copy, so it is a MatMulNBits of `head_bits` (on
    SmolLM2 the float32 head was the largest weight a decode step read: benchmarks/variant_speed.py), and the
    embedding's Gather then reads the head's blocks (GatherBlockQuantized, as onnxruntime-genai's builder ties them):
    the table is stored once, and each gathered row is exactly the head's dequantized column."""
    import numpy as np
    import onnx
    import onnxruntime
    from onnx import TensorProto, helper

    from hfexport.formats.onnx.variants import write
    from hfexport.quantization.variants import settings

    folder = tmp_path / "f32"
    embedding = _tied_graph(folder)
    # tied_embedding by default; accuracy_level 0 (float activations), so that the identity probe below reads the
    # head's weights exactly (level 4 quantizes the probe's rows to int8 in the kernel)
    write(folder, settings({"name": "q4", "head_bits": head_bits, "accuracy_level": 0}), tmp_path / "q4")
    quantized = onnx.load(str(tmp_path / "q4" / "model.onnx"))
    assert [node.op_type for node in quantized.graph.node] == ["Reshape", "GatherBlockQuantized", "MatMulNBits"]
    gather, head = quantized.graph.node[1], quantized.graph.node[2]
    assert gather.input[2] == head.input[2]  # one table of head_bits blocks and its scales, read by both
    assert {a.name: a.i for a in gather.attribute}["bits"] == {a.name: a.i for a in head.attribute}["bits"] == head_bits
    assert "embed.weight" not in {tensor.name for tensor in quantized.graph.initializer}
    ids = np.arange(64, dtype=np.int64)[None]
    logits = {name: onnxruntime.InferenceSession(str(tmp_path / name / "model.onnx")).run(
        None, {"input_ids": ids})[0] for name in ("f32", "q4")}
    assert (logits["q4"].argmax(-1) == logits["f32"].argmax(-1)).mean() > 0.9  # the tied head's own diagonal
    # the rows the embedding gathers are the head's own dequantized weights (MatMulNBits' zero point: 8, 128)
    probe = onnx.load(str(tmp_path / "q4" / "model.onnx"))
    probe.graph.output.append(helper.make_tensor_value_info("hidden", TensorProto.FLOAT, None))
    identity = np.eye(32, dtype=np.float32)[None]
    rows = onnxruntime.InferenceSession(probe.SerializeToString()).run(["hidden"], {"input_ids": ids})[0][0]
    columns = onnxruntime.InferenceSession(
        helper.make_model(helper.make_graph(
            [helper.make_node("MatMulNBits", ["x", *head.input[1:]], ["y"], domain="com.microsoft",
                              **{a.name: helper.get_attribute_value(a) for a in head.attribute})],
            "head", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 32, 32])],
            [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, 32, 64])],
            [tensor for tensor in probe.graph.initializer if tensor.name in head.input[1:]]),
            opset_imports=[helper.make_opsetid("", 18), helper.make_opsetid("com.microsoft", 1)]).SerializeToString()
    ).run(None, {"x": identity})[0][0]
    np.testing.assert_array_equal(rows, columns.T)
    step = np.abs(embedding).max(axis=1, keepdims=True) / 2 ** (head_bits - 1)  # one step of each row (one block)
    assert (np.abs(rows - embedding) <= step * 1.001).all()


@pytest.mark.slow
def test_a_tied_models_4_bit_variants_read_one_quantized_table_in_every_runtime(tiny_llama, runtime_env, tmp_path):
    """tiny-llama with its head tied to the embedding, its table above the exporter's constant folding (1M elements:
    a smaller one is folded into a second, untied copy of the head): q4 and q4f16 store the table once, as the head's
    blocks (8-bit, `head_bits`' default) that the embedding's GatherBlockQuantized reads, and transformers.js, optimum
    and onnxruntime-genai each pass the gate on them."""
    from unittest import mock

    import onnx
    import torch
    from transformers import AutoConfig, AutoModelForCausalLM

    from hfexport.job.run import run_job

    model = tmp_path / "tiny-llama-tied"
    shutil.copytree(tiny_llama, model)
    config = AutoConfig.from_pretrained(model)
    config.tie_word_embeddings, config.vocab_size = True, 20480
    torch.manual_seed(0)
    (model / "model.safetensors").unlink()
    AutoModelForCausalLM.from_config(config).save_pretrained(model)
    with mock.patch.dict(os.environ, runtime_env):
        report = run_job(model, tmp_path / "out", recipe=_recipe(tiny_llama, [
        {"name": name, "tied_embedding": True, **TINY_FOUR_BIT} for name in ("q4", "q4f16")]),
                         latency=False)
    target = report.targets["onnx-generation"]
    assert target.status == "ok", target.error
    for variant in target.variants:
        assert variant["verdict"] == "passed", variant
        assert {check["runtime"]: check["verdict"] for check in variant["runtimes"]} == {
            "transformers.js": "passed", "optimum": "passed", "onnxruntime-genai": "passed"}
        graph = onnx.load(str(tmp_path / "out" / "onnx-generation" / variant["file"]), load_external_data=False)
        ops = [node.op_type for node in graph.graph.node]
        assert "GatherBlockQuantized" in ops and "Gather" not in ops, variant["name"]
        assert {attribute.i for node in graph.graph.node if node.op_type == "GatherBlockQuantized"
                for attribute in node.attribute if attribute.name == "bits"} == {8}, variant["name"]
        assert "model.embed_tokens.weight" not in {tensor.name for tensor in graph.graph.initializer}
