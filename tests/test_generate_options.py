"""Generation options over exported graphs (`ExportedModel.generate`): sampling with a seed, logits processors,
stopping criteria, streamers and the saved generation config, each against `model.generate` token for token on the
tiny decoder's ONNX and OpenVINO (f32) generation exports; beam search and other options refused by name."""

from __future__ import annotations

import copy

import pytest
import torch

TARGETS = ["onnx-generation", "openvino-generation"]
MAX_NEW = 12
SEED = 1234
SAMPLING = {
    "plain": {"do_sample": True},
    "warped": {"do_sample": True, "temperature": 0.7, "top_k": 20, "top_p": 0.9},
    "penalized": {"do_sample": True, "temperature": 1.3, "top_k": 0, "repetition_penalty": 1.4, "min_new_tokens": 6},
}


@pytest.fixture(scope="module")
def exports(session_dir, tiny_llama):
    """The example recipe's ONNX and OpenVINO generation targets (no job verification: these tests compare)."""
    from hfexport.job.run import run_job

    output = session_dir / "generate-options"
    report = run_job(tiny_llama, output, targets=TARGETS, verify=False)
    failed = {name: target.error for name, target in report.targets.items() if target.status != "ok"}
    assert not failed, failed
    return output


_LOADED: dict = {}


def _load(folder):
    """Loaded once per module, at f32: token-exact on any CPU (OpenVINO computes bf16 where the CPU has it)."""
    from hfexport import ExportedModel

    if folder not in _LOADED:
        _LOADED[folder] = ExportedModel.from_pretrained(folder, precision="f32")
    return _LOADED[folder]


@pytest.fixture(scope="module")
def model(llama_model):
    return llama_model  # conftest: loaded once per session, this module's own copy


@pytest.fixture(scope="module")
def tokenizer(llama_tokenizer):
    return llama_tokenizer  # conftest: padding on the left, this module's own copy


@pytest.fixture(scope="module")
def prompts(tokenizer):
    batch2 = dict(tokenizer(["The capital of France is", "Hi there"], return_tensors="pt", padding=True))
    assert (batch2["attention_mask"] == 0).any()  # the second row is left-padded
    return {"batch2": batch2, "batch1": dict(tokenizer(["The quick brown fox"], return_tensors="pt"))}


def _reference(model, inputs, seed=None, **kwargs):
    """`model.generate` in torch, after `torch.manual_seed(seed)` when sampling."""
    if seed is not None:
        torch.manual_seed(seed)
    with torch.no_grad():
        return model.generate(**inputs, **kwargs)


def _assert_same(got, expected):
    assert got.dtype == torch.long and got.shape == expected.shape, (got.shape, expected.shape)
    assert torch.equal(got, expected), f"\nexpected {expected.tolist()}\ngot      {got.tolist()}"


@pytest.mark.parametrize("settings", list(SAMPLING))
@pytest.mark.parametrize("batch", ["batch2", "batch1"])
@pytest.mark.parametrize("target", TARGETS)
def test_sampling_with_a_seed_matches_model_generate(exports, model, prompts, target, batch, settings):
    exported, inputs, options = _load(exports / target), prompts[batch], SAMPLING[settings]
    expected = _reference(model, inputs, seed=SEED, max_new_tokens=MAX_NEW, **options)
    got = exported.generate(inputs["input_ids"], inputs["attention_mask"], max_new_tokens=MAX_NEW, seed=SEED,
                            **options)
    _assert_same(got, expected)
    # The same draws through an explicit generator, and through torch's global one (model.generate's default).
    generator = torch.Generator().manual_seed(SEED)
    _assert_same(exported.generate(inputs["input_ids"], inputs["attention_mask"], max_new_tokens=MAX_NEW,
                                   generator=generator, **options), expected)
    torch.manual_seed(SEED)
    _assert_same(exported.generate(inputs["input_ids"], inputs["attention_mask"], max_new_tokens=MAX_NEW, **options),
                 expected)


def test_sampling_is_not_greedy_and_follows_the_seed(exports, model, prompts):
    """The sampling tests above would pass trivially if generate ignored do_sample or the seed."""
    exported, inputs = _load(exports / "onnx-generation"), prompts["batch2"]
    greedy = exported.generate(inputs["input_ids"], inputs["attention_mask"], max_new_tokens=MAX_NEW)
    _assert_same(greedy, _reference(model, inputs, max_new_tokens=MAX_NEW, do_sample=False))
    draws = [exported.generate(inputs["input_ids"], inputs["attention_mask"], max_new_tokens=MAX_NEW, seed=seed,
                               do_sample=True) for seed in (1, 2)]
    assert not torch.equal(draws[0], greedy) and not torch.equal(draws[0], draws[1])


@pytest.mark.parametrize("target", TARGETS)
def test_num_return_sequences_samples_each_prompt_n_times(exports, model, prompts, target):
    exported, inputs = _load(exports / target), prompts["batch2"]
    options = {"do_sample": True, "num_return_sequences": 2, "max_new_tokens": 8}
    got = exported.generate(inputs["input_ids"], inputs["attention_mask"], seed=SEED, **options)
    _assert_same(got, _reference(model, inputs, seed=SEED, **options))
    assert got.shape[0] == 4


def test_defaults_come_from_the_saved_generation_config(exports, model, prompts):
    """The job saves the model's generation config beside a generation export; its fields are generate's defaults,
    under the caller's generation_config and kwargs, as model.generate treats model.generation_config."""
    folder = exports / "onnx-generation"
    assert (folder / "generation_config.json").is_file()
    exported = copy.copy(_load(folder))
    assert exported.generation_config.eos_token_id == 1 and exported.generation_config.pad_token_id == 2
    exported.generation_config = copy.deepcopy(exported.generation_config)
    exported.generation_config.update(do_sample=True, top_k=5, max_new_tokens=7)
    owner = copy.copy(model)
    owner.generation_config = copy.deepcopy(exported.generation_config)
    inputs = prompts["batch2"]
    got = exported.generate(inputs["input_ids"], inputs["attention_mask"], seed=SEED)
    assert got.shape[1] == inputs["input_ids"].shape[1] + 7
    _assert_same(got, _reference(owner, inputs, seed=SEED))
    # kwargs over the saved config
    got = exported.generate(inputs["input_ids"], inputs["attention_mask"], seed=SEED, top_k=2, max_new_tokens=5)
    _assert_same(got, _reference(owner, inputs, seed=SEED, top_k=2, max_new_tokens=5))
    # a GenerationConfig over the saved one (its unset fields still come from the saved config)
    from transformers import GenerationConfig

    passed = GenerationConfig(do_sample=False, max_new_tokens=4)
    got = exported.generate(inputs["input_ids"], inputs["attention_mask"], generation_config=passed)
    _assert_same(got, _reference(owner, inputs, generation_config=passed))


def test_max_new_tokens_defaults_to_twenty_like_model_generate(exports, model, prompts):
    exported, inputs = _load(exports / "onnx-generation"), prompts["batch1"]
    got = exported.generate(inputs["input_ids"])
    assert got.shape[1] == inputs["input_ids"].shape[1] + 20
    _assert_same(got, _reference(model, inputs, do_sample=False))


@pytest.mark.parametrize("target", TARGETS)
def test_min_new_tokens_holds_back_eos(exports, model, prompts, target):
    """An EOS the model would emit early is suppressed until min_new_tokens (MinNewTokensLengthLogitsProcessor)."""
    exported, inputs = _load(exports / target), prompts["batch1"]
    prompt = inputs["input_ids"].shape[1]
    free = _reference(model, inputs, do_sample=False, max_new_tokens=MAX_NEW)[0, prompt:]
    eos = int(free[1])  # the second greedy token becomes EOS: without min_new_tokens generation stops there
    stopped = exported.generate(inputs["input_ids"], max_new_tokens=MAX_NEW, eos_token_id=eos)
    assert stopped.shape[1] == prompt + 2
    options = {"max_new_tokens": MAX_NEW, "eos_token_id": eos, "min_new_tokens": 6}
    got = exported.generate(inputs["input_ids"], **options)
    _assert_same(got, _reference(model, inputs, do_sample=False, **options))
    assert got.shape[1] > prompt + 6 and eos not in got[0, prompt:prompt + 6].tolist()


@pytest.mark.parametrize("target", TARGETS)
def test_custom_logits_processor_and_stopping_criteria(exports, model, prompts, target):
    from transformers import (
        LogitsProcessorList,
        MaxLengthCriteria,
        NoRepeatNGramLogitsProcessor,
        StoppingCriteria,
        StoppingCriteriaList,
        SuppressTokensLogitsProcessor,
    )

    class StopAfterToken(StoppingCriteria):
        """A user's own criterion: a row stops once it emits `token`."""

        def __init__(self, token):
            self.token = token

        def __call__(self, input_ids, scores, **kwargs):
            return input_ids[:, -1] == self.token

    exported, inputs = _load(exports / target), prompts["batch2"]
    prompt = inputs["input_ids"].shape[1]
    free = _reference(model, inputs, do_sample=False, max_new_tokens=MAX_NEW)[:, prompt:]
    banned = [int(free[0, 0]), int(free[1, 0])]
    stop = int(free[1, 3])
    for options in (
        {"logits_processor": LogitsProcessorList([SuppressTokensLogitsProcessor(banned)])},
        {"logits_processor": LogitsProcessorList([NoRepeatNGramLogitsProcessor(2)]), "do_sample": True},
        {"stopping_criteria": StoppingCriteriaList([MaxLengthCriteria(prompt + 5)])},  # replaces the built one
        {"stopping_criteria": StoppingCriteriaList([StopAfterToken(stop)])},
    ):
        expected = _reference(model, inputs, seed=SEED, max_new_tokens=MAX_NEW, **options)
        got = exported.generate(inputs["input_ids"], inputs["attention_mask"], max_new_tokens=MAX_NEW, seed=SEED,
                                **options)
        _assert_same(got, expected)
    got = exported.generate(inputs["input_ids"], inputs["attention_mask"], max_new_tokens=MAX_NEW,
                            logits_processor=LogitsProcessorList([SuppressTokensLogitsProcessor(banned)]))
    assert got[0, prompt] != banned[0] and got[1, prompt] != banned[1]


def test_stop_strings_need_the_tokenizer(exports, model, prompts, tokenizer):
    from hfexport.errors import GenerationError

    exported, inputs = _load(exports / "onnx-generation"), prompts["batch1"]
    prompt = inputs["input_ids"].shape[1]
    free = _reference(model, inputs, do_sample=False, max_new_tokens=MAX_NEW)
    text = tokenizer.decode(free[0, prompt + 2:prompt + 3])
    assert text.strip()
    expected = _reference(model, inputs, do_sample=False, max_new_tokens=MAX_NEW, stop_strings=[text],
                          tokenizer=tokenizer)
    got = exported.generate(inputs["input_ids"], max_new_tokens=MAX_NEW, stop_strings=[text], tokenizer=tokenizer)
    _assert_same(got, expected)
    assert got.shape[1] < prompt + MAX_NEW
    with pytest.raises(GenerationError, match="tokenizer"):
        exported.generate(inputs["input_ids"], max_new_tokens=MAX_NEW, stop_strings=[text])


class Recorder:
    """A streamer: records what generate hands it, in order."""

    def __init__(self):
        self.calls = []

    def put(self, value):
        self.calls.append(("put", value.clone()))

    def end(self):
        self.calls.append(("end", None))


@pytest.mark.parametrize("target", TARGETS)
def test_streamer_is_called_as_model_generate_calls_it(exports, model, prompts, tokenizer, target):
    from transformers import TextIteratorStreamer

    exported, inputs = _load(exports / target), prompts["batch1"]
    theirs, ours = Recorder(), Recorder()
    _reference(model, inputs, seed=SEED, do_sample=True, max_new_tokens=MAX_NEW, streamer=theirs)
    got = exported.generate(inputs["input_ids"], max_new_tokens=MAX_NEW, seed=SEED, do_sample=True, streamer=ours)
    assert [kind for kind, _ in ours.calls] == [kind for kind, _ in theirs.calls]
    assert ours.calls[0][0] == "put" and ours.calls[-1] == ("end", None)
    assert len(ours.calls) == MAX_NEW + 2  # the prompt, each new token, end
    for (_, mine), (_, reference) in zip(ours.calls[:-1], theirs.calls[:-1]):
        assert torch.equal(mine, reference)
    assert torch.equal(torch.cat([ours.calls[0][1][0]] + [value for _, value in ours.calls[1:-1]]), got[0])

    streamer = TextIteratorStreamer(tokenizer, skip_prompt=True)
    exported.generate(inputs["input_ids"], max_new_tokens=MAX_NEW, streamer=streamer)
    text = "".join(streamer)
    greedy = _reference(model, inputs, do_sample=False, max_new_tokens=MAX_NEW)
    assert text == tokenizer.decode(greedy[0, inputs["input_ids"].shape[1]:])


def test_unsupported_options_are_refused_by_name(exports, prompts):
    from hfexport.errors import GenerationError

    exported, ids = _load(exports / "openvino-generation"), prompts["batch1"]["input_ids"]
    with pytest.raises(GenerationError, match="beam search.*beam_idx.*ONNX"):
        exported.generate(ids, max_new_tokens=4, num_beams=2)
    with pytest.raises(GenerationError, match="guidance_scale"):
        exported.generate(ids, max_new_tokens=4, guidance_scale=2.0)
    with pytest.raises(GenerationError, match="return_dict_in_generate"):
        exported.generate(ids, max_new_tokens=4, return_dict_in_generate=True)
    with pytest.raises(GenerationError, match="not generation options"):
        exported.generate(ids, max_new_tokens=4, temprature=0.5)
    with pytest.raises(GenerationError, match="not a transformers.GenerationConfig"):
        exported.generate(ids, None, 4)  # the old third positional argument, max_new_tokens
    with pytest.raises(GenerationError, match="seed or a generator"):
        exported.generate(ids, max_new_tokens=4, seed=1, generator=torch.Generator())


def test_global_defaults_are_transformers_own():
    """hfexport applies transformers' global generation defaults itself (transformers keeps them behind a private
    method); this test notices when transformers changes them."""
    from hfexport.generate import DEFAULT_NEW_TOKENS, GLOBAL_DEFAULTS
    from transformers import GenerationConfig

    theirs = GenerationConfig._get_default_generation_params()
    assert {key: theirs[key] for key in GLOBAL_DEFAULTS} == GLOBAL_DEFAULTS
    assert theirs["max_length"] == DEFAULT_NEW_TOKENS
