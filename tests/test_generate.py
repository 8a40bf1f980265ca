"""Generation over exported graphs: `ExportedModel.generate` (reloaded from disk) against `model.generate` greedy, token
for token, on the tiny decoder, for every format and cache layout that exports it; EOS per row; verify_generation."""

from __future__ import annotations

import copy
import json

import pytest
import torch

MAX_NEW = 12
LAYOUTS = {
    "generation": {},
    "static": {"cache_implementation": "static", "max_cache_len": 64},
    "mtd": {"multi_token_decode": True},
    "single": {"single_graph": True},
}
OPTIONS = {
    "dynamo": {"dynamic": True},
    "onnx": {"dynamic": True},
    "openvino": {"dynamic": True},
    "executorch": {"dynamic": True, "backend": "xnnpack"},
}
# Exported per test session here (the example recipe's own generation targets, single graphs of onnx, openvino and
# executorch, come from `exported_llama`).
DEFAULT_LAYOUTS = ["dynamo-generation", "dynamo-static", "dynamo-mtd", "dynamo-single", "onnx-generation",
                   "onnx-static", "onnx-mtd"]
SLOW_LAYOUTS = ["openvino-generation", "openvino-static", "openvino-mtd", "executorch-generation", "executorch-static",
                "executorch-mtd"]
RECIPE_TARGETS = ["onnx-generation", "openvino-generation", "pte-generation"]


def _layout_recipe(tiny_llama, names: list[str], **extra_options) -> dict:
    """The example recipe with its targets replaced by `<format>-<layout>` generation targets."""
    recipe = json.loads((tiny_llama / "export_config.json").read_text())
    targets = {}
    for name in names:
        export_format, layout = name.split("-", 1)
        target = {"export_format": export_format, "mode": "generation",
                  "options": {**OPTIONS[export_format], **extra_options}}
        if LAYOUTS[layout]:
            target["generation"] = LAYOUTS[layout]
        elif export_format == "onnx":  # ONNX defaults to one graph (hfexport.formats.onnx.decoder_contract): ask for the pair
            target["generation"] = {"single_graph": False}
        targets[name] = target
    recipe["targets"], recipe["default_target"] = targets, names[0]
    return recipe


def _export(session_dir, tiny_llama, folder: str, names: list[str], **extra_options):
    from hfexport.job.run import run_job

    output = session_dir / folder
    # verify=False: these tests run the generation check themselves (the job's would double the time).
    report = run_job(tiny_llama, output, all_targets=True, recipe=_layout_recipe(tiny_llama, names, **extra_options),
                     verify=False)
    failed = {name: target.error for name, target in report.targets.items() if target.status != "ok"}
    assert not failed, failed
    return output


@pytest.fixture(scope="module")
def layout_exports(session_dir, tiny_llama):
    return _export(session_dir, tiny_llama, "generate-layouts", DEFAULT_LAYOUTS)


@pytest.fixture(scope="module")
def slow_layout_exports(session_dir, tiny_llama):
    return _export(session_dir, tiny_llama, "generate-layouts-slow", SLOW_LAYOUTS)


@pytest.fixture(scope="module")
def model(llama_model):
    return llama_model  # conftest: loaded once per session, this module's own copy


@pytest.fixture(scope="module")
def tokenizer(llama_tokenizer):
    return llama_tokenizer  # conftest: padding on the left, this module's own copy


@pytest.fixture(scope="module")
def batch2(tokenizer):
    """Two prompts of different lengths: the second row is left-padded."""
    encoded = tokenizer(["The capital of France is", "Hi there"], return_tensors="pt", padding=True)
    assert (encoded["attention_mask"] == 0).any()
    return dict(encoded)


@pytest.fixture(scope="module")
def batch1(tokenizer):
    return dict(tokenizer(["The quick brown fox"], return_tensors="pt"))


_LOADED: dict = {}


def _load(folder):
    """Each export reloaded from disk once per module (OpenVINO state is reset by every generate call), at f32:
    these tests check the graphs token for token, on any CPU (OpenVINO would run bf16 where the CPU has it)."""
    from hfexport import ExportedModel

    if folder not in _LOADED:
        _LOADED[folder] = ExportedModel.from_pretrained(folder, precision="f32")
    return _LOADED[folder]


def _reference(model, inputs, max_new_tokens=MAX_NEW, **kwargs):
    with torch.no_grad():
        return model.generate(**inputs, do_sample=False, max_new_tokens=max_new_tokens, **kwargs)


def _check_matches(exported, model, inputs, max_new_tokens=MAX_NEW):
    expected = _reference(model, inputs, max_new_tokens)
    got = exported.generate(inputs["input_ids"], inputs.get("attention_mask"), max_new_tokens=max_new_tokens)
    assert got.dtype == torch.long
    assert got.shape == expected.shape, (got.shape, expected.shape)
    assert torch.equal(got, expected), (f"\nexpected {expected[:, -max_new_tokens:].tolist()}"
                                        f"\ngot      {got[:, -max_new_tokens:].tolist()}")


@pytest.mark.parametrize("target", RECIPE_TARGETS)
def test_recipe_generation_targets_match_model_generate(exported_llama, model, batch2, batch1, target):
    output, report = exported_llama
    # Exported (the job's own verification may still mark it failed: this test is about generate).
    assert (output / target / "export.json").is_file(), report.targets[target].error
    exported = _load(output / target)
    _check_matches(exported, model, batch2)
    _check_matches(exported, model, batch1)


@pytest.mark.parametrize("target", DEFAULT_LAYOUTS)
def test_layouts_match_model_generate(layout_exports, model, batch2, batch1, target):
    exported = _load(layout_exports / target)
    _check_matches(exported, model, batch2)
    _check_matches(exported, model, batch1)


def test_a_one_token_decode_without_its_prefill_is_refused(layout_exports, batch1):
    """Only a multi-token decode can run a prompt: the default layout's decode alone is refused, saying why."""
    from hfexport import ExportedModel
    from hfexport.errors import GenerationError

    full = _load(layout_exports / "onnx-generation")
    decode_only = ExportedModel({"decode": full.components["decode"]}, full.export_format, config=full.config)
    with pytest.raises(GenerationError, match="its decode takes one token per step: generate runs a prompt only on a "
                                              "multi-token decode"):
        decode_only.generate(batch1["input_ids"], max_new_tokens=2)


@pytest.mark.slow
@pytest.mark.parametrize("target", SLOW_LAYOUTS)
def test_layouts_match_model_generate_all_formats(slow_layout_exports, model, batch2, batch1, target):
    exported = _load(slow_layout_exports / target)
    _check_matches(exported, model, batch2)
    _check_matches(exported, model, batch1)


@pytest.mark.parametrize("target", ["onnx-generation", "openvino-generation"])
def test_eos_stops_its_row_only(exported_llama, model, batch2, target):
    """EOS forced on row 0 at step k: that row emits EOS then pad tokens, row 1 keeps generating, like HF."""
    exported = _load(exported_llama[0] / target)
    prompt = batch2["input_ids"].shape[1]
    free = _reference(model, batch2)[:, prompt:]
    k = next(step for step in range(1, MAX_NEW - 2)
             if free[0, step] not in free[0, :step] and free[0, step] not in free[1])
    eos, pad = int(free[0, k]), 2
    expected = _reference(model, batch2, eos_token_id=eos, pad_token_id=pad)
    got = exported.generate(batch2["input_ids"], batch2["attention_mask"], max_new_tokens=MAX_NEW,
                            eos_token_id=eos, pad_token_id=pad)
    assert torch.equal(got, expected)
    new = got[:, prompt:]
    assert new.shape[1] == MAX_NEW  # row 1 did not stop
    assert new[0, k] == eos and (new[0, k + 1:] == pad).all()
    assert torch.equal(new[1], free[1])


def test_generation_stops_when_every_row_finished(exported_llama, model, batch1):
    exported = _load(exported_llama[0] / "onnx-generation")
    prompt = batch1["input_ids"].shape[1]
    free = _reference(model, batch1)[0, prompt:]
    k = next(step for step in range(1, MAX_NEW) if free[step] not in free[:step])
    expected = _reference(model, batch1, eos_token_id=int(free[k]), pad_token_id=2)
    got = exported.generate(batch1["input_ids"], max_new_tokens=MAX_NEW, eos_token_id=[int(free[k]), 383])
    assert torch.equal(got, expected)
    assert got.shape[1] == prompt + k + 1


def test_the_token_choice_runs_at_one_torch_thread_and_torch_gets_its_threads_back(exported_llama, layout_exports,
                                                                                     batch1):
    """ONNX: torch at `TOKEN_CHOICE_THREADS` for the whole decode loop (set once: the streamer's per-step calls run
    inside it); a `.pt2`, whose graphs run in torch: only during each step's token choice (the streamer at torch's
    own setting). Both restore torch's threads after, also when a stopping criterion raises mid-loop."""
    from transformers import StoppingCriteria, StoppingCriteriaList

    from hfexport.generate import TOKEN_CHOICE_THREADS

    class Streamer:
        def __init__(self):
            self.threads = []

        def put(self, value):
            self.threads.append(torch.get_num_threads())

        def end(self):
            pass

    class FailAtStep3(StoppingCriteria):
        def __init__(self):
            self.threads = []

        def __call__(self, input_ids, scores, **kwargs):
            self.threads.append(torch.get_num_threads())
            if len(self.threads) == 3:
                raise RuntimeError("stopped at step 3")
            return torch.zeros(input_ids.shape[0], dtype=torch.bool)

    own = TOKEN_CHOICE_THREADS + 2
    before = torch.get_num_threads()
    torch.set_num_threads(own)
    try:
        for folder, streamed_at in [(exported_llama[0] / "onnx-generation", TOKEN_CHOICE_THREADS),
                                    (layout_exports / "dynamo-generation", own)]:
            exported = _load(folder)
            streamer = Streamer()
            exported.generate(batch1["input_ids"], max_new_tokens=4, streamer=streamer)
            assert streamer.threads == [own] + [streamed_at] * 4, folder.name  # the prompt is put before the loop
            assert torch.get_num_threads() == own
            failing = FailAtStep3()
            with pytest.raises(RuntimeError, match="stopped at step 3"):
                exported.generate(batch1["input_ids"], max_new_tokens=8,
                                  stopping_criteria=StoppingCriteriaList([failing]))
            assert failing.threads == [TOKEN_CHOICE_THREADS] * 3 and torch.get_num_threads() == own, folder.name
    finally:
        torch.set_num_threads(before)


def test_static_cache_has_the_recipes_size(layout_exports, model, tokenizer):
    """`generation.max_cache_len` sizes the exported cache (it was ignored: the cache came out prompt + 1 long), so a
    generation longer than the sample's runs."""
    for target in ("dynamo-static", "onnx-static"):
        exported = _load(layout_exports / target)
        assert exported.runners["decode"].metadata.kwargs["attention_mask"]["shape"][-1] == 64
    inputs = dict(tokenizer(["The capital of France is"], return_tensors="pt"))
    _check_matches(_load(layout_exports / "onnx-static"), model, inputs, max_new_tokens=40)
    from hfexport.errors import GenerationError

    with pytest.raises(GenerationError, match="max_cache_len"):
        _load(layout_exports / "onnx-static").generate(inputs["input_ids"], max_new_tokens=60)


def test_static_decode_traced_at_batch_2_runs_other_batches(layout_exports, model, tokenizer, batch1):
    """transformers 5.23 pins a static-cache decode to its traced batch (the cache's `batch_size` is in the pytree
    context): generate runs it in chunks of that batch."""
    exported = _load(layout_exports / "dynamo-static")
    from transformers import StaticCache

    cache = StaticCache(config=exported.config, max_cache_len=64)
    ids = batch1["input_ids"]
    positions = torch.arange(ids.shape[1])[None]
    from hfexport.generate import static_attention_mask

    prefill = exported.runners["prefill"](
        input_ids=ids, position_ids=positions, past_key_values=cache,
        attention_mask=static_attention_mask(torch.ones_like(ids), 0, ids.shape[1], 64),
    )
    with pytest.raises(ValueError):  # the engine bug this works around; drop the chunking when this stops raising
        exported.runners["decode"](
            input_ids=ids[:, -1:], position_ids=positions[:, -1:] + 1, past_key_values=prefill.past_key_values,
            attention_mask=static_attention_mask(torch.ones(1, ids.shape[1] + 1, dtype=torch.long), ids.shape[1], 1,
                                                 64),
        )
    _check_matches(exported, model, batch1)
    three = dict(tokenizer(["The capital of France is", "Hi there", "The quick brown fox"], return_tensors="pt",
                           padding=True))
    _check_matches(exported, model, three)


def test_stateful_openvino_decode_needs_the_port_read(exported_llama, model, batch1):
    """transformers 5.23: the OpenVINO runner cannot unflatten a stateful decode's outputs (its out_spec still has
    the cache leaves folded into state), which generate (and `run_component`, which the quantized-vs-reference latency
    uses) works around by reading `logits` by port."""
    from hfexport.generate import run_component

    exported = _load(exported_llama[0] / "openvino-generation")
    decode = exported.runners["decode"]
    assert len(decode.request.query_state()) > 0  # the recipe's default: stateful
    ids = batch1["input_ids"]
    # the recipe's single graph: the decode runs the prompt from its variables' zero-length init
    kwargs = {"input_ids": ids, "attention_mask": torch.ones_like(ids), "position_ids": torch.arange(ids.shape[1])[None]}
    with pytest.raises(StopIteration):  # the engine bug; drop `_stateful_logits` when this stops raising
        decode(**kwargs)
    with torch.no_grad():
        expected = model(**kwargs).logits
    for _ in range(2):  # each call starts from the reset state
        torch.testing.assert_close(run_component(decode, kwargs), expected, atol=1e-4, rtol=1e-3)


@pytest.mark.slow
def test_stateful_openvino_static_cache_is_refused(session_dir, tiny_llama, batch1):
    """A static cache in a stateful OpenVINO decode is exported wrong by transformers 5.23 (its write position
    becomes a constant); the plan defaults such targets to stateful=False, and generate refuses one that is not."""
    from hfexport.errors import GenerationError

    output = _export(session_dir, tiny_llama, "generate-ov-static-stateful", ["openvino-static"], stateful=True)
    with pytest.raises(GenerationError, match="stateful"):
        _load(output / "openvino-static").generate(batch1["input_ids"], max_new_tokens=4)


def test_static_mask_is_the_one_generate_builds(model):
    """The 4D mask fed to a static-cache graph equals transformers' own for the prefill and for a decode step."""
    from hfexport.generate import static_attention_mask
    from transformers import StaticCache
    from transformers.masking_utils import create_masks_for_generate

    mask = torch.tensor([[1, 1, 1, 1, 1], [0, 0, 0, 1, 1]])
    cache = StaticCache(config=model.config, max_cache_len=9)
    positions = (mask.cumsum(-1) - 1).clamp(min=0)
    expected = create_masks_for_generate(config=model.config, inputs_embeds=torch.empty(2, 5, 0), attention_mask=mask,
                                         past_key_values=cache, position_ids=positions)
    assert torch.equal(static_attention_mask(mask, 0, 5, 9), expected)
    with torch.no_grad():
        model(input_ids=torch.tensor([[5] * 5, [2, 2, 2, 6, 7]]), attention_mask=expected, position_ids=positions,
              past_key_values=cache)
    step_mask = torch.cat([mask, torch.ones(2, 1, dtype=torch.long)], dim=-1)
    expected = create_masks_for_generate(config=model.config, inputs_embeds=torch.empty(2, 1, 0),
                                         attention_mask=step_mask, past_key_values=cache,
                                         position_ids=positions[:, -1:] + 1)
    assert torch.equal(static_attention_mask(step_mask, 5, 1, 9), expected)
    additive = static_attention_mask(step_mask, 5, 1, 9, torch.float32)
    assert torch.equal(additive == 0, expected)


def test_verify_generation_reports_agreement_and_the_first_divergence(exported_llama, model, batch2):
    from hfexport.generate import verify_generation

    exported = _load(exported_llama[0] / "onnx-generation")
    result = verify_generation(exported, model, batch2, 8)
    assert result["passed"] is True and result["first_divergence"] is None
    assert result["max_new_tokens"] == 8 and result["token_agreement"] == 1.0
    assert result["reference_tokens"] == result["exported_tokens"]
    assert [len(row) for row in result["exported_tokens"]] == [8, 8]

    wrong = copy.deepcopy(model)
    with torch.no_grad():
        wrong.lm_head.weight.mul_(-1.0)  # a different model: its greedy tokens differ from the first one on
    result = verify_generation(exported, wrong, batch2, 8)
    assert result["passed"] is False
    first = result["first_divergence"]
    assert set(first) == {"row", "position", "expected", "got"}
    assert first["position"] == 0 and first["expected"] != first["got"]
    assert first["expected"] == result["reference_tokens"][first["row"]][0]
    assert first["got"] == result["exported_tokens"][first["row"]][0]
    assert 0.0 <= result["token_agreement"] < 1.0
    json.dumps(result)  # goes into the report as it is


def test_generate_defaults_and_errors(exported_llama, batch1):
    from hfexport.errors import GenerationError
    from hfexport.generate import default_special_tokens

    output, _ = exported_llama
    exported = _load(output / "onnx-generation")
    assert default_special_tokens(exported) == (1, 2)  # tiny-llama's config
    unchanged = exported.generate(batch1["input_ids"], max_new_tokens=0)
    assert torch.equal(unchanged, batch1["input_ids"])
    with pytest.raises(GenerationError, match="prefill"):
        _load(output / "pt2").generate(batch1["input_ids"], max_new_tokens=2)
    with pytest.raises(GenerationError, match="attention_mask has shape"):
        exported.generate(batch1["input_ids"], torch.ones(1, 3, dtype=torch.long), max_new_tokens=2)
    # tiny-llama's vocabulary is 384 ids: a prompt id past it (or negative) is named, before ONNX Runtime's Gather
    with pytest.raises(GenerationError, match=r"token id 384, outside the model's vocabulary \(0\.\.383\)"):
        exported.generate(torch.tensor([[5, 384, 7]]), max_new_tokens=2)
    with pytest.raises(GenerationError, match="token id -1"):
        exported.generate(torch.tensor([[5, -1, 7]]), max_new_tokens=2)


def test_static_cache_openvino_targets_export_stateless(tiny_llama, model, tokenizer):
    """The plan keeps a static cache in an OpenVINO decode's inputs (`stateful: false`) unless the recipe says
    otherwise: transformers 5.23's stateful transformation freezes the static cache's write position."""
    from hfexport.plan import build_plan
    from hfexport.recipe.loading import load_recipe

    recipe = load_recipe(_layout_recipe(tiny_llama, ["openvino-static", "openvino-generation"]))
    static = build_plan(recipe, "openvino-static", model, processor=tokenizer)
    assert [component.config.stateful for component in static.components.values()] == [False, False]
    dynamic = build_plan(recipe, "openvino-generation", model, processor=tokenizer)  # one graph by default (#27)
    assert {name: component.config.stateful for name, component in dynamic.components.items()} == {"decode": True}
    document = _layout_recipe(tiny_llama, ["openvino-generation"])
    document["targets"]["openvino-generation"]["generation"] = {"single_graph": False}
    pair = load_recipe(document)
    pair_plan = build_plan(pair, "openvino-generation", model, processor=tokenizer)
    assert [component.config.stateful for component in pair_plan.components.values()] == [True, True]
    asked = load_recipe(_layout_recipe(tiny_llama, ["openvino-static"], stateful=True))
    asked_plan = build_plan(asked, "openvino-static", model, processor=tokenizer)
    assert all(component.config.stateful for component in asked_plan.components.values())


def test_generation_exports_carry_the_generation_config_they_were_traced_with(tiny_llama, tmp_path):
    """The engine (transformers 5.23) kept `generation_config=None` on a generation export made without an explicit
    one, so the folder had no generation_config.json."""
    from hfexport import ExportedModel
    from hfexport.job.run import run_job
    from transformers import GenerationConfig

    report = run_job(tiny_llama, tmp_path / "out", targets=["onnx-generation"], verify=False)
    folder = tmp_path / "out" / "onnx-generation"
    assert report.targets["onnx-generation"].status == "ok", report.targets["onnx-generation"].error
    assert (folder / "generation_config.json").is_file()
    assert "generation_config.json" in {entry["path"] for entry in report.targets["onnx-generation"].files}
    saved = GenerationConfig.from_pretrained(folder)
    original = GenerationConfig.from_pretrained(tiny_llama)
    assert (saved.eos_token_id, saved.bos_token_id, saved.pad_token_id) == \
        (original.eos_token_id, original.bos_token_id, original.pad_token_id)
    assert ExportedModel.from_pretrained(folder).generation_config.eos_token_id == original.eos_token_id


def test_chunked_static_decode_samples_and_refuses_a_streamer_for_more_rows(layout_exports, model, tokenizer, batch1):
    """A decode pinned to its traced batch (2) samples per chunk; at most one chunk can be streamed."""
    from hfexport.errors import GenerationError

    exported = _load(layout_exports / "dynamo-static")
    torch.manual_seed(5)
    with torch.no_grad():
        expected = model.generate(**batch1, do_sample=True, max_new_tokens=MAX_NEW)
    calls = []

    class Recorder:
        def put(self, value):
            calls.append(value.clone())

        def end(self):
            calls.append(None)

    got = exported.generate(batch1["input_ids"], max_new_tokens=MAX_NEW, do_sample=True, seed=5, streamer=Recorder())
    assert torch.equal(got, expected)  # one chunk: only the real row draws, as in model.generate
    assert calls[-1] is None and all(value.shape[0] == 1 for value in calls[:-1])  # the filler row is not streamed
    three = dict(tokenizer(["The capital of France is", "Hi there", "The quick brown fox"], return_tensors="pt",
                           padding=True))
    sampled = exported.generate(three["input_ids"], three["attention_mask"], max_new_tokens=MAX_NEW, do_sample=True,
                                seed=5)
    assert sampled.shape[0] == 3 and torch.equal(sampled[:, : three["input_ids"].shape[1]], three["input_ids"])
    with pytest.raises(GenerationError, match="streamer"):
        exported.generate(three["input_ids"], three["attention_mask"], max_new_tokens=MAX_NEW, streamer=Recorder())


@pytest.mark.parametrize("name", ["tiny-gemma3", "tiny-qwen2"])
def test_single_graph_of_other_decoders_matches_model_generate(session_dir, name):
    """`generation.single_graph` beyond Llama: Gemma3's sliding-window layer (the empty cache holds a sliding layer
    that the prompt then fills past its window) and Qwen2's biased projections, ONNX, verified by the job (the decode
    on the prompt against the eager prefill, then greedy tokens) and generated here against `model.generate`."""
    from hfexport.job.run import run_job
    from hfexport.testing.models import make_model
    from transformers import AutoModelForCausalLM, AutoTokenizer

    folder = make_model(name, session_dir / f"{name}-single-graph")
    recipe = json.loads((folder / "export_config.json").read_text())
    recipe["targets"] = {"onnx-single": {"export_format": "onnx", "mode": "generation",
                                         "generation": {"single_graph": True},
                                         "parity": {"generate": {"max_new_tokens": MAX_NEW}}}}
    recipe["default_target"] = "onnx-single"
    report = run_job(folder, session_dir / f"{name}-single-graph-out", recipe=recipe)
    target = report.targets["onnx-single"]
    assert target.status == "ok", target.error
    assert "decode (the prompt, on an empty cache)" in {probe["component"] for probe in target.verification["probes"]}
    assert target.verification["generation"]["token_agreement"] == 1.0
    exported = _load(session_dir / f"{name}-single-graph-out" / "onnx-single")
    assert list(exported.components) == ["decode"]
    tokenizer = AutoTokenizer.from_pretrained(folder, padding_side="left")
    # longer than Gemma3's sliding window (4), and left-padded
    inputs = dict(tokenizer(["The capital of France is a city", "Hi"], return_tensors="pt", padding=True))
    _check_matches(exported, AutoModelForCausalLM.from_pretrained(folder).eval(), inputs)
