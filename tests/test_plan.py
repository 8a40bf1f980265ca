"""Plans: recipe dims and axis specs -> torch.export dims, inherited specs, synthesized inputs that pin nothing,
PlanErrors that name what is wrong, and generation components with cache specs. Nothing here traces except the
one export at the end that proves a `"*"` cache spec is accepted by the engine."""

from __future__ import annotations

import copy
import json

import pytest
import torch
from hfexport.errors import PlanError
from hfexport.models import load_model, load_processor
from hfexport.plan import build_dims, build_plan
from hfexport.recipe.loading import load_recipe
from hfexport.recipe.data import recipe_from_document
from torch.export import Dim


@pytest.fixture(scope="module")
def bert(tiny_bert):
    recipe = load_recipe(tiny_bert)
    return recipe, load_model(tiny_bert, recipe), load_processor(tiny_bert)


@pytest.fixture(scope="module")
def llama(tiny_llama):
    recipe = load_recipe(tiny_llama)
    return recipe, load_model(tiny_llama, recipe), load_processor(tiny_llama)


def bert_recipe(dynamic_shapes=None, dims=None, **extra) -> dict:
    target = {"export_format": "onnx", "options": {"opset_version": 18}}
    if dynamic_shapes is not None:
        target["dynamic_shapes"] = dynamic_shapes
    return {"recipe_version": 1, "task": "feature-extraction",
            "dims": dims if dims is not None else {"batch": {"min": 1, "max": 8}, "seq": {"min": 2, "max": 64}},
            "targets": {"t": target}, **extra}


def ids(batch: int, seq: int) -> dict:
    return {"input_ids": torch.randint(5, 100, (batch, seq)), "attention_mask": torch.ones(batch, seq, dtype=torch.long)}


def plan_for(document: dict, model, inputs=None, processor=None, target="t"):
    return build_plan(recipe_from_document(document), target, model, inputs, processor)


# ── Dims and axis specs ──────────────────────────────────────────────────────


def test_one_dim_per_name_with_bounds():
    recipe = recipe_from_document(bert_recipe(dims={"batch": {"min": 1, "max": 8}, "seq": {"min": 2, "max": 64},
                                                    "free": {}}))
    dims = build_dims(recipe)
    assert set(dims) == {"batch", "seq", "free"}
    assert all(isinstance(dim, Dim) for dim in dims.values())
    assert (dims["batch"].__name__, dims["batch"].min, dims["batch"].max) == ("batch", 1, 8)
    assert (dims["seq"].min, dims["seq"].max) == (2, 64)


def test_same_dim_name_is_one_object_across_inputs(bert):
    _, model, _ = bert
    plan = plan_for(bert_recipe({"input_ids": {"0": "batch", "1": "seq"}, "attention_mask": {"0": "batch", "1": "seq"}}),
                    model, ids(2, 7))
    shapes = plan.config.dynamic_shapes
    assert shapes["input_ids"][0] is shapes["attention_mask"][0] is plan.dims["batch"]
    assert shapes["input_ids"][1] is shapes["attention_mask"][1] is plan.dims["seq"]


def test_json_axis_keys_become_ints(bert):
    _, model, _ = bert
    plan = plan_for(bert_recipe({"input_ids": {"0": "batch", "1": "seq"}}), model, ids(2, 7))
    assert set(plan.config.dynamic_shapes["input_ids"]) == {0, 1}
    assert all(isinstance(key, int) for spec in plan.config.dynamic_shapes.values() if spec for key in spec)


@pytest.mark.parametrize("spec, expected", [
    ("static", None), ("auto", Dim.AUTO), ("dynamic", Dim.DYNAMIC), (7, None),
])
def test_keywords_and_ints(bert, spec, expected):
    _, model, _ = bert
    plan = plan_for(bert_recipe({"input_ids": {"0": "batch", "1": spec}}), model, ids(2, 7))
    axes = plan.config.dynamic_shapes["input_ids"]
    if expected is None:
        assert 1 not in axes
    else:
        assert axes[1] is expected
    assert plan.components["model"].dynamic_axes["input_ids"]["1"].startswith(str(spec) if spec != 7 else "static (7)")


def test_int_that_disagrees_with_the_sample(bert):
    _, model, _ = bert
    with pytest.raises(PlanError, match=r"input_ids\.1: the recipe pins this axis to 9, but the sample input has size 7"):
        plan_for(bert_recipe({"input_ids": {"1": 9}}), model, ids(2, 7))


@pytest.mark.parametrize("expression, size, base, scale, offset", [
    ("2*seq", 14, 7, 2, 0), ("seq+1", 8, 7, 1, 1), ("seq - 1", 6, 7, 1, -1), ("3 * seq + 2", 23, 7, 3, 2),
])
def test_linear_expressions(bert, expression, size, base, scale, offset):
    _, model, _ = bert
    inputs = {**ids(2, 7), "token_type_ids": torch.zeros(2, size, dtype=torch.long)}
    plan = plan_for(bert_recipe({"input_ids": {"0": "batch", "1": "seq"}, "token_type_ids": {"1": expression}}),
                    model, inputs)
    derived = plan.config.dynamic_shapes["token_type_ids"][1]
    seq = plan.dims["seq"]
    assert derived is not seq and derived.root is seq
    assert derived.fn(base) == size == scale * base + offset
    assert expression in plan.components["model"].dynamic_axes["token_type_ids"]["1"]


def test_linear_expression_that_cannot_match_the_sample(bert):
    _, model, _ = bert
    inputs = {**ids(2, 7), "token_type_ids": torch.zeros(2, 15, dtype=torch.long)}
    with pytest.raises(PlanError, match="not 2\\*seq for any whole seq"):
        plan_for(bert_recipe({"input_ids": {"1": "seq"}, "token_type_ids": {"1": "2*seq"}}), model, inputs)


def test_linear_expression_whose_dim_would_be_traced_at_one(bert):
    _, model, _ = bert
    inputs = {**ids(2, 7), "token_type_ids": torch.zeros(2, 2, dtype=torch.long)}
    with pytest.raises(PlanError, match="seq = 1"):
        plan_for(bert_recipe({"input_ids": {"0": "batch"}, "token_type_ids": {"1": "seq+1"}}), model, inputs)


def test_sample_outside_the_dim_bounds(bert):
    _, model, _ = bert
    document = bert_recipe({"input_ids": {"0": "batch", "1": "seq"}},
                           dims={"batch": {"min": 1, "max": 8}, "seq": {"min": 2, "max": 4}})
    with pytest.raises(PlanError, match=r"size 7, outside dim 'seq' \[2, 4\]"):
        plan_for(document, model, ids(2, 7))


def test_axis_beyond_the_rank(bert):
    _, model, _ = bert
    with pytest.raises(PlanError, match="axis 2 does not exist; the input has rank 2"):
        plan_for(bert_recipe({"input_ids": {"2": "seq"}}), model, ids(2, 7))


# ── Inputs the recipe does not list, and defaults ────────────────────────────


def test_unlisted_inputs_inherit_a_same_shaped_listed_input(bert):
    recipe, model, processor = bert
    plan = build_plan(recipe, "onnx", model, None, processor)
    shapes, described = plan.config.dynamic_shapes, plan.components["model"].dynamic_axes
    inheriting = [name for name, value in plan.inputs.items()
                  if name != "input_ids" and getattr(value, "shape", None) == plan.inputs["input_ids"].shape]
    assert "attention_mask" in inheriting
    for name in inheriting:
        assert shapes[name] == shapes["input_ids"] == {0: plan.dims["batch"], 1: plan.dims["seq"]}
        assert described[name]["0"].endswith("(as input_ids)")


def test_an_input_of_another_shape_does_not_inherit(bert):
    _, model, _ = bert
    inputs = {**ids(2, 7), "token_type_ids": torch.zeros(2, 5, dtype=torch.long)}
    plan = plan_for(bert_recipe({"input_ids": {"0": "batch", "1": "seq"}}), model, inputs)
    assert plan.config.dynamic_shapes["attention_mask"] == plan.config.dynamic_shapes["input_ids"]
    assert plan.config.dynamic_shapes["token_type_ids"] is None


def test_no_dynamic_shapes_means_dynamic_and_a_sample_that_pins_nothing(bert):
    _, model, processor = bert
    plan = plan_for({"export_format": "onnx"}, model, None, processor, target="onnx")
    assert plan.config.dynamic is True and plan.config.dynamic_shapes is None
    assert plan.components["model"].dynamic_axes == {"*": "auto"}
    batch, seq = plan.inputs["input_ids"].shape
    assert batch >= 2
    assert seq not in (0, 1, 2) and seq != batch


@pytest.mark.parametrize("texts", [["a", "b"], ["hi", "yo", "ok"], ["x"] * 4])
def test_short_sample_texts_are_padded_off_special_lengths(bert, texts):
    _, model, processor = bert
    document = {"recipe_version": 1, "sample_inputs": {"text": texts}, "targets": {"t": {"export_format": "onnx"}}}
    plan = plan_for(document, model, None, processor)
    batch, seq = plan.inputs["input_ids"].shape
    assert batch == len(texts)
    assert seq > 2 and seq != batch
    assert plan.inputs["attention_mask"].shape == plan.inputs["input_ids"].shape


def test_a_named_dim_traced_at_size_one_is_a_plan_error(bert):
    _, model, processor = bert
    document = bert_recipe({"input_ids": {"0": "batch", "1": "seq"}}, sample_inputs={"text": ["only one sentence"]})
    with pytest.raises(PlanError, match=r"input_ids\.0: dim 'batch' is traced from a sample of size 1"):
        plan_for(document, model, None, processor)


def test_unknown_input_name_lists_the_real_inputs(bert):
    _, model, _ = bert
    with pytest.raises(PlanError) as caught:
        plan_for(bert_recipe({"input_idz": {"0": "batch"}}), model, ids(2, 7))
    message = str(caught.value)
    assert "'input_idz'" in message and "input_ids" in message and "attention_mask" in message
    assert message.startswith("targets.t.dynamic_shapes")


def test_engine_enum_and_options(bert):
    from transformers.exporters import ExportFormat, OnnxConfig

    recipe, model, processor = bert
    plan = build_plan(recipe, "onnx", model, None, processor)
    assert isinstance(plan.config, OnnxConfig)
    assert plan.config.export_format is ExportFormat.ONNX
    assert plan.config.opset_version == 18
    described = json.loads(json.dumps(plan.describe(), default=str))
    assert described["components"]["model"]["dynamic_axes"]["input_ids"] == {"0": "batch [1, 8]", "1": "seq [2, 64]"}


# ── Generation ───────────────────────────────────────────────────────────────


def llama_layout(llama_recipe, **generation) -> dict:
    """The example recipe whose `onnx-generation` target has the `generation` settings given (none: the default
    layout, a prefill and a one-token decode: `single_graph: false`, since ONNX defaults to one graph)."""
    document = copy.deepcopy(llama_recipe.document)
    target = document["targets"]["onnx-generation"]
    target["generation"] = generation or {"single_graph": False}
    return document


def test_generation_components_are_discovered(llama):
    recipe, model, processor = llama
    plan = plan_for(llama_layout(recipe), model, None, processor, target="onnx-generation")
    assert list(plan.components) == ["prefill", "decode"]
    assert set(plan.config) == {"prefill", "decode"}
    assert plan.components["decode"].input_shapes["input_ids"]["shape"][1] == 1
    assert all(component.config.dynamic for component in plan.components.values())
    assert not plan.single_graph and not plan.own_components


def test_an_onnx_generation_target_is_one_graph_by_default(llama):
    """The ONNX runtimes' contract is one decoder graph (hfexport.formats.onnx.decoder_contract): a plain `mode: generation` ONNX target
    of a decoder-only model plans as a single graph, and so does OpenVINO's (optimum-intel's one stateful graph,
    hfexport.formats.openvino.genai_layout); `generation.single_graph: false` keeps the prefill/decode pair."""
    recipe, model, processor = llama
    document = copy.deepcopy(recipe.document)
    document["targets"]["onnx-generation"].pop("generation", None)
    plan = plan_for(document, model, None, processor, target="onnx-generation")
    assert list(plan.components) == ["decode"] and plan.single_graph
    document["targets"]["openvino-generation"].pop("generation", None)
    plan = plan_for(document, model, None, processor, target="openvino-generation")
    assert list(plan.components) == ["decode"] and plan.single_graph
    document["targets"]["onnx-generation"]["generation"] = {"single_graph": False}
    plan = plan_for(document, model, None, processor, target="onnx-generation")
    assert list(plan.components) == ["prefill", "decode"] and not plan.single_graph


def test_a_single_graph_is_the_multi_token_decode_alone(llama):
    """`generation.single_graph` (the example recipe's layout): no prefill to trace; the decode takes several tokens
    (the sample's two) and is exported as hfexport's own component, with the shapes the default layout gives it."""
    recipe, model, processor = llama
    plan = build_plan(recipe, "onnx-generation", model, None, processor)
    assert recipe.target("onnx-generation").generation == {"single_graph": True}
    assert list(plan.components) == ["decode"] and list(plan.own_components) == ["decode"]
    assert plan.single_graph and plan.multi_token_decode and not plan.prefill_by_decode
    decode = plan.components["decode"]
    assert decode.input_shapes["input_ids"]["shape"][1] == 2
    cache = decode.config.dynamic_shapes["past_key_values"]
    assert all(spec == {0: Dim.AUTO, 2: Dim.AUTO} for spec in cache), cache


@pytest.mark.parametrize(("generation", "message"), [
    ({"single_graph": True, "cache_implementation": "static", "max_cache_len": 32},
     r"targets\.onnx-generation\.generation\.single_graph: a single graph runs the prompt on an empty DynamicCache"),
    ({"single_graph": True, "multi_token_decode": False},
     r"targets\.onnx-generation\.generation\.single_graph: a single graph is a multi-token decode"),
])
def test_single_graph_conflicts_are_recipe_errors(llama, generation, message):
    from hfexport.errors import RecipeError

    recipe, model, processor = llama
    with pytest.raises(RecipeError, match=message):
        recipe_from_document(llama_layout(recipe, **generation))


def test_generation_without_shapes_marks_only_a_caches_batch_and_sequence_axes(llama):
    """No dynamic_shapes in the recipe: the tensor inputs keep Dim.AUTO on every axis, but a cache tensor only on
    its batch and sequence axes (the engine's dynamic=True would put four symbols on each of them)."""
    recipe, model, processor = llama
    plan = plan_for(llama_layout(recipe), model, None, processor, target="onnx-generation")
    decode, prefill = plan.components["decode"], plan.components["prefill"]
    batch, seq = plan.components["prefill"].input_shapes["input_ids"]["shape"]
    cache = decode.config.dynamic_shapes["past_key_values"]
    assert len(cache) == 2 * model.config.num_hidden_layers
    assert all(spec == {0: Dim.AUTO, 2: Dim.AUTO} for spec in cache), cache
    assert decode.config.dynamic_shapes["attention_mask"] == {0: Dim.AUTO, 1: Dim.AUTO}
    assert prefill.config.dynamic_shapes["input_ids"] == {0: Dim.AUTO, 1: Dim.AUTO}
    assert decode.dynamic_axes["cache"] == "auto on the batch and sequence axes, other axes static"
    # Here the batch (2) equals the KV heads and the decode mask (seq + 1 = 16) the head_dim: neither pins them.
    assert decode.input_shapes["past_key_values"] == {"container": "DynamicCache"}
    assert (batch, seq) == (2, 15) and model.config.num_key_value_heads == 2


def cache_recipe(llama_recipe) -> dict:
    document = copy.deepcopy(llama_recipe.document)
    document.pop("default_target")
    document["dims"]["past"] = {"min": 2, "max": 127}
    seq = {"0": "batch", "1": "seq"}
    document["targets"] = {"gen": {
        "export_format": "dynamo", "mode": "generation",
        "options": {"prefer_deferred_runtime_asserts_over_guards": True},
        "dynamic_shapes": {"input_ids": seq, "attention_mask": seq, "position_ids": seq},
        "components": {"decode": {"dynamic_shapes": {
            "attention_mask": {"0": "batch", "1": "past+1"},
            "past_key_values": {"*": {"0": "batch", "2": "past"}},
        }}},
    }}
    return document


def test_star_cache_spec_covers_every_cache_tensor(llama):
    recipe, model, processor = llama
    plan = plan_for(cache_recipe(recipe), model, None, processor, target="gen")
    decode = plan.components["decode"]
    cache_specs = decode.config.dynamic_shapes["past_key_values"]
    layers = model.config.num_hidden_layers
    assert len(cache_specs) == 2 * layers  # a key and a value per layer
    assert all(spec == {0: plan.dims["batch"], 2: plan.dims["past"]} for spec in cache_specs)
    assert decode.dynamic_axes["past_key_values"] == {"*": {"0": "batch [1, 8]", "2": "past [2, 127]"},
                                                      "tensors": 2 * layers}
    mask = decode.config.dynamic_shapes["attention_mask"][1]
    assert mask.root is plan.dims["past"] and mask.fn(5) == 6
    # The target-wide seq dim meets the decode step's one-token axis: static there, not an error.
    assert decode.dynamic_axes["input_ids"]["1"] == "static (1 in this component)"
    prefill = plan.components["prefill"]
    assert prefill.config.dynamic_shapes["input_ids"] == {0: plan.dims["batch"], 1: plan.dims["seq"]}


def test_unknown_component_override(llama):
    recipe, model, processor = llama
    document = cache_recipe(recipe)
    document["targets"]["gen"]["components"]["vision_encoder"] = {"options": {"strict": False}}
    with pytest.raises(PlanError, match="no component 'vision_encoder'; this model's components are: prefill, decode"):
        plan_for(document, model, None, processor, target="gen")


def test_input_no_component_takes(llama):
    recipe, model, processor = llama
    document = cache_recipe(recipe)
    document["targets"]["gen"]["dynamic_shapes"]["pixel_values"] = {"0": "batch"}
    with pytest.raises(PlanError, match="no component takes 'pixel_values'"):
        plan_for(document, model, None, processor, target="gen")


def test_static_cache_generation_config(llama):
    recipe, model, processor = llama
    document = copy.deepcopy(recipe.document)
    document["targets"] = {"static": {"export_format": "dynamo", "mode": "generation",
                                      "generation": {"cache_implementation": "static", "max_cache_len": 48}}}
    document["default_target"] = "static"
    plan = plan_for(document, model, None, processor, target="static")
    assert plan.generation_config.cache_implementation == "static"
    assert plan.generation_config.max_cache_len == 48
    assert plan.components["decode"].input_shapes["past_key_values"] == {"container": "StaticCache"}
    assert model.generation_config.cache_implementation != "static", "the model's own config is not modified"


def test_star_cache_spec_exports_and_runs_at_another_past_length(llama):
    """The engine accepts the plan's cache spec (an empty prefill cache kept its container shape: it was None),
    and the decode graph runs with a cache longer than the one it was traced with."""
    from hfexport.export import run_plan
    from transformers import DynamicCache

    recipe, model, processor = llama
    plan = plan_for(cache_recipe(recipe), model, None, processor, target="gen")
    exported = run_plan(plan, model)
    assert list(exported.components) == ["prefill", "decode"]

    torch.manual_seed(0)
    prompt = torch.randint(3, model.config.vocab_size, (3, 9))
    with torch.no_grad():
        eager = model(input_ids=prompt, attention_mask=torch.ones_like(prompt), past_key_values=DynamicCache(config=model.config),
                      use_cache=True)
        next_token = eager.logits[:, -1:].argmax(-1)
        eager_step = model(input_ids=next_token, attention_mask=torch.ones(3, 10, dtype=torch.long),
                           position_ids=torch.full((3, 1), 9), past_key_values=copy.deepcopy(eager.past_key_values))
        step = exported.runners["decode"](
            input_ids=next_token, attention_mask=torch.ones(3, 10, dtype=torch.long), position_ids=torch.full((3, 1), 9),
            past_key_values=copy.deepcopy(eager.past_key_values),
        )
    torch.testing.assert_close(step.logits, eager_step.logits, atol=1e-4, rtol=1e-4)


@pytest.mark.parametrize("sample_inputs, path", [
    ({"tensors": {"input_ids": {"shape": [1073741824, 1073741824], "dtype": "int64"}}}, "sample_inputs.tensors.input_ids"),
    ({"tensors": {"input_ids": {"shape": ["batch", "seq"], "dtype": "float32"}}}, "sample_inputs.tensors.input_ids"),
    ({"images": {"count": 64, "height": 100000, "width": 100000}}, "sample_inputs.images"),
])
def test_oversized_samples_are_refused_before_allocating(bert, sample_inputs, path):
    """Every size a recipe may write is <= 2**30: without a bound on their product a recipe could exhaust memory."""
    _, model, processor = bert
    document = {"recipe_version": 1, "dims": {"batch": {"min": 70000}, "seq": {"min": 70000}},
                "sample_inputs": sample_inputs, "targets": {"t": {"export_format": "onnx"}}}
    with pytest.raises(PlanError, match=f"{path}.*too large"):
        plan_for(document, model, None, processor)


def test_single_graph_needs_an_attention_cache(session_dir):
    """A state-space decode (Mamba's `cache_params`) cannot run a prompt on an empty attention cache: refused at plan
    time, naming what the decode takes."""
    from hfexport.testing.models import make_model

    folder = make_model("tiny-mamba", session_dir / "plan-tiny-mamba")
    recipe = load_recipe(folder)
    document = copy.deepcopy(recipe.document)
    target = {"export_format": "onnx", "mode": "generation", "generation": {"single_graph": True}}
    document["targets"], document["default_target"] = {"gen": target}, "gen"
    model = load_model(folder, recipe)
    with pytest.raises(PlanError, match=r"targets\.gen\.generation\.single_graph: the decode takes .*cache_params.*"
                                        r"single_graph runs the prompt on an empty DynamicCache"):
        plan_for(document, model, None, load_processor(folder), target="gen")


def test_a_processor_missing_a_package_is_named_not_replaced_by_the_tokenizer(tiny_llama, monkeypatch):
    """A vision model's processor that needs torchvision must not fall back to the tokenizer silently: the samples
    would be text alone and the export would fail later on shapes, far from the cause."""
    import transformers

    from hfexport.errors import SourceError

    def needs_torchvision(*args, **kwargs):
        raise ImportError("Qwen2VLVideoProcessor requires the Torchvision library but it was not found")

    monkeypatch.setattr(transformers.AutoProcessor, "from_pretrained", needs_torchvision)
    with pytest.raises(SourceError, match="cannot load the model.s processor: .*Torchvision"):
        load_processor(tiny_llama)


def test_a_dry_plan_finds_what_the_model_cannot_do_from_its_config_alone(tiny_bert, tiny_llama):
    """Issue 44: generation on BERT and an input BERT does not take are errors on their JSON paths before anything
    but config.json is read (the model built on the meta device); the examples' own recipes have none."""
    from hfexport.plan.dry import model_problems
    from hfexport.recipe.data import recipe_from_document

    for folder in (tiny_bert, tiny_llama):
        recipe = json.loads((folder / "export_config.json").read_text())
        assert model_problems(recipe_from_document(recipe), json.loads((folder / "config.json").read_text())) == []
    recipe = json.loads((tiny_bert / "export_config.json").read_text())
    recipe["targets"]["onnx"]["mode"] = "generation"
    recipe["targets"]["pt2"]["dynamic_shapes"]["foo_ids"] = {"0": "batch"}
    problems = model_problems(recipe_from_document(recipe), json.loads((tiny_bert / "config.json").read_text()),
                              "user/bert/config.json")
    assert [problem.path for problem in problems] == ["targets.onnx.mode", "targets.pt2.dynamic_shapes.foo_ids"]
    assert "BertModel (task 'feature-extraction', from user/bert/config.json) does not" in problems[0].message
    assert "no input named 'foo_ids'; its inputs: input_ids, attention_mask" in problems[1].message
    assert model_problems(recipe_from_document(recipe), {"model_type": "no-such-architecture"}) == []


@pytest.fixture(scope="module")
def whisper(session_dir):
    from hfexport.testing.models import make_model

    folder = session_dir / "tiny-whisper"  # the session's copy (test_onnx_seq2seq, test_generate_seq2seq)
    if not (folder / "export_config.json").is_file():
        make_model("tiny-whisper", folder)
    recipe = load_recipe(folder)
    return recipe, load_model(folder, recipe), load_processor(folder)


def test_executorch_default_generation_shapes_are_bounded_by_the_batch_and_the_decoder_positions(whisper):
    """ExecuTorch plans every tensor's memory for its dims' upper bounds, and transformers 5.23's exporter caps an
    unbounded AUTO axis by a guess that ignores the tensor's width (Whisper large-v3-turbo's prefill: batch 256 x 256
    positions, 35 GiB, `std::bad_alloc` on load). Its default shapes are bounded by the recipe's batch (at least the
    verifier's probe) and the decoder's `max_target_positions`; the encoder's length stays the model's; other formats
    keep the unbounded AUTO."""
    recipe, model, processor = whisper
    batch, length = 8, model.config.max_target_positions
    plan = build_plan(recipe, "executorch-generation", model, processor=processor)
    prefill, decode = plan.components["prefill"].config.dynamic_shapes, plan.components["decode"].config.dynamic_shapes
    assert prefill["decoder_input_ids"] == {0: Dim.AUTO(max=batch), 1: Dim.AUTO(max=length)}
    layers = model.config.decoder_layers
    self_attention, cross_attention = decode["past_key_values"][:2 * layers], decode["past_key_values"][2 * layers:]
    assert all(spec == {0: Dim.AUTO(max=batch), 2: Dim.AUTO(max=length)} for spec in self_attention), self_attention
    assert all(spec == {0: Dim.AUTO(max=batch)} for spec in cross_attention), cross_attention  # the encoder's length
    assert plan.components["decode"].dynamic_axes["bounds"] == f"batch <= {batch}, sequence <= {length}"
    onnx = build_plan(recipe, "onnx-generation", model, processor=processor).components["prefill"]
    assert onnx.config.dynamic_shapes["decoder_input_ids"] == {0: Dim.AUTO, 1: Dim.AUTO}
    assert "bounds" not in onnx.dynamic_axes


def test_generation_bounds_take_the_recipes_batch_and_the_configs_positions():
    from hfexport.formats.executorch.llm_program import DEFAULT_MAX_CONTEXT
    from hfexport.plan.generation import generation_bounds
    from hfexport.plan.shapes import AUTO_PROBE_BATCH
    from transformers import BartConfig, LlamaConfig, T5Config, WhisperConfig

    def bounds(batch_max, config, **generation):
        recipe = recipe_from_document({
            "recipe_version": 1, "dims": {"batch": {"min": 1, "max": batch_max}},
            "targets": {"t": {"export_format": "executorch", "mode": "generation", "generation": generation}}})
        return generation_bounds(recipe, recipe.target("t"), config)

    assert bounds(16, WhisperConfig(max_target_positions=448)) == (16, 448)  # the decoder's, not the encoder's 1500
    assert bounds(2, BartConfig(max_position_embeddings=1024)) == (AUTO_PROBE_BATCH, 1024)
    assert bounds(8, LlamaConfig(max_position_embeddings=131072)) == (8, DEFAULT_MAX_CONTEXT)
    assert bounds(8, LlamaConfig(max_position_embeddings=131072), max_cache_len=4096) == (8, 4096)
    assert bounds(4, T5Config()) == (AUTO_PROBE_BATCH, None)  # relative positions: no limit stated
