"""The gate's runtime step: ask `model.generate` what the recipe's sample prompts should give, then every deployment
runtime of the target's format (its `runtimes`: `hfexport.formats`) on the saved files.

The expected tokens are greedy, at the model's own (float32) precision, on each prompt alone (batch 1) and on all
prompts in one left-padded batch, cut after the first EOS: the same answer every runtime is compared with, token
for token. They are generated when the first runtime that runs reads them: where no runtime of the format is
installed (each answers `not_checked`), the model does not generate for nothing.
"""

from __future__ import annotations

import copy
import json
from pathlib import Path

from hfexport.deployment import PENDING, GenerationRequest, RuntimeCheck, run_checks
from hfexport.files import MANIFEST_FILE
from hfexport.formats import format_traits
from hfexport.layout import artifact_name
from hfexport.preparers import image_count, image_slice
from hfexport.verify.thresholds import resolve


def runtime_time_limit(model) -> float:
    """Seconds one deployment runtime may take on this model: 300, plus 300 per billion parameters (a runtime loads,
    prefills and decodes every weight; Llama-3.2-1B's 1.2B took 297 s in transformers.js on 2 loaded cores)."""
    parameters = sum(parameter.numel() for parameter in model.parameters())
    return 300.0 + 300.0 * parameters / 1e9


def has_runtimes(export_format: str) -> bool:
    """Whether any deployment runtime is checked for `export_format` (so the expected tokens are worth computing)."""
    return bool(format_traits(export_format).runtimes)


def check_runtimes(folder: str | Path, model, plan, processor=None, request=None) -> list[RuntimeCheck]:
    """Every runtime of the plan's format on `folder` (a generation target's saved files), compared with the model;
    `request`: the model's answer made beforehand (`answered_request`), the model then not used."""
    export_format = str(plan.target.export_format)
    if not has_runtimes(export_format):
        return []
    request = request or generation_request(model, plan, processor)
    if request is None:
        return []
    if format_traits(export_format).generation_variants:  # the runtimes open the variant the target is published as
        request.file_name = published_file_name(Path(folder), plan.target)
        if request.file_name == "model_fp16.onnx":  # a float16 graph: judged by hfexport's f16 token agreement floor
            request.min_token_agreement = resolve(plan.target, "float16", precision="f16").min_token_agreement
    return run_checks(export_format, Path(folder), request)


def _prompt_extra(extra: dict, index: int, count: int, input_ids, mask) -> dict:
    """Prompt `index`'s own inputs beside its token ids: its row of each batch tensor, its images' patch rows where
    they come packed by an image grid (Qwen2-VL-class: `hfexport.preparers.image_slice`, one image per prompt), and
    per-token tensors (`mm_token_type_ids`) without the row's padding, as the prompt is handed over."""
    import torch

    tensors = {key: value for key, value in extra.items() if torch.is_tensor(value)}
    tokens = {key: value[index][mask[index].bool()][None] for key, value in tensors.items()
              if key.endswith("token_type_ids") and value.shape == input_ids.shape}
    rest = {key: value for key, value in tensors.items() if key not in tokens}
    packed = any(key.endswith("grid_thw") for key in rest) and image_count(rest) == count
    rows = image_slice(rest, index, index + 1) if packed else {key: value[index : index + 1] for key, value in rest.items()}
    return {**rows, **tokens}


def answered_request(model, plan, processor=None) -> GenerationRequest | None:
    """`generation_request` with `model.generate`'s tokens generated now, not when a runtime first reads them: for a
    gate that releases the model before the runtimes run (`hfexport.job.structure.gate_releases`)."""
    request = generation_request(model, plan, processor)
    if request is not None:
        _ = request.expected  # answers both `expected` and `padded_expected`
    return request


def published_file_name(folder: Path, target) -> str:
    """The ONNX file name a target is published under (`hfexport.layout.artifact_name`, or the recipe's `file_name`):
    `model_quantized.onnx` for an 8-bit target, `model_fp16.onnx` for a float16 graph, ... (transformers.js' dtype
    suffixes), else `model.onnx`."""
    if target.file_name:
        return target.file_name
    try:
        components = json.loads((folder / MANIFEST_FILE).read_text(encoding="utf-8"))["components"]
        dtypes = {str((entry.get("metadata") or {}).get("export_dtype")) for entry in components.values()}
    except (OSError, ValueError, KeyError, TypeError, AttributeError):
        dtypes = set()
    dtype = dtypes.pop() if len(dtypes) == 1 else None
    return artifact_name("onnx", target.quantization, dtype) or "model.onnx"


def generation_request(model, plan, processor=None) -> GenerationRequest | None:
    """The sample prompts and `model.generate`'s greedy tokens for them; None when the inputs have no token prompt
    (nor, for a speech encoder-decoder, `input_features`)."""
    import torch

    inputs = plan.inputs
    input_ids = inputs.get("input_ids")
    is_encoder_decoder = bool(getattr(model.config, "is_encoder_decoder", False))
    features = inputs.get("input_features") if is_encoder_decoder else None
    if input_ids is None and features is None:
        return None
    if input_ids is None:  # Whisper: the audio's features are the prompt; no token prompt
        input_ids = torch.zeros((features.shape[0], 0), dtype=torch.long)
    mask = inputs.get("attention_mask")
    if mask is None:
        mask = torch.ones_like(input_ids)
    prompts = [[int(token) for token, keep in zip(row, keep_row, strict=True) if keep]
               for row, keep_row in zip(input_ids.tolist(), mask.tolist(), strict=True)]
    config = copy.deepcopy(plan.generation_config or model.generation_config)
    thresholds = resolve(plan.target)
    max_new_tokens = thresholds.max_new_tokens
    config.do_sample, config.num_beams = False, 1
    config.max_new_tokens, config.min_new_tokens = max_new_tokens, None
    eos = config.eos_token_id
    eos_ids = [int(token) for token in (eos if isinstance(eos, list) else [eos] if eos is not None else [])]
    pad = config.pad_token_id if config.pad_token_id is not None else (eos_ids[0] if eos_ids else None)
    config.pad_token_id = pad
    # An encoder-decoder generates from its encoder's input alone (the recipe's decoder_input_ids are trace samples).
    skipped = ("input_ids", "attention_mask", "decoder_input_ids", "decoder_attention_mask")
    extra = {key: value for key, value in inputs.items() if key not in skipped}
    request = GenerationRequest(
        prompts=prompts, expected=PENDING, max_new_tokens=max_new_tokens, eos_token_id=eos_ids, pad_token_id=pad,
        padded_expected=PENDING, texts=list(plan.recipe.sample_inputs.get("text") or []) or None,
        model_type=getattr(model.config, "model_type", None), is_encoder_decoder=is_encoder_decoder,
        decoder_start_token_id=_decoder_start(config, model) if is_encoder_decoder else None,
        padding_side="right" if is_encoder_decoder else "left",  # set now: a runtime may read it before `expected`
        min_token_agreement=thresholds.min_token_agreement, timeout_s=runtime_time_limit(model),
        extra={key: value.detach().cpu().numpy() for key, value in extra.items() if torch.is_tensor(value)})

    def answer() -> tuple[list[list[int]], list[list[int]] | None]:
        """`model.generate`'s tokens for each prompt alone, and for the padded batch (run when a runtime first reads
        them: none is run when no runtime is installed)."""
        expected, padded_expected = [], None
        was_training = model.training
        model.eval()
        try:
            with torch.no_grad():
                for index, prompt in enumerate(prompts):
                    row_extra = _prompt_extra(extra, index, len(prompts), input_ids, mask)
                    ids = torch.tensor([prompt], dtype=input_ids.dtype)
                    prompt_inputs = {"input_ids": ids, "attention_mask": torch.ones_like(ids)} if prompt else {}
                    out = model.generate(**prompt_inputs, generation_config=config, **row_extra)
                    expected.append(request.cut(_new_tokens(out[0].tolist(), prompt, request)))
                if len(prompts) > 1 and (pad is not None or features is not None):
                    padded_expected = _padded_batch(model, config, prompts, input_ids, mask, extra, request)
        finally:
            model.train(was_training)
        return expected, padded_expected

    request.answer = answer
    return request


def _padded_batch(model, config, prompts, input_ids, mask, extra, request) -> list[list[int]]:
    """`model.generate` on all prompts in one batch: a decoder-only's left-padded, an encoder-decoder's encoder input
    padded on its tokenizer's side (`request.padding_side`, right for T5, BART, Marian, mBART), Whisper's features as
    they are (same length)."""
    import torch

    width = max(map(len, prompts))
    if request.is_encoder_decoder and width == 0:  # Whisper
        out = model.generate(generation_config=config, **extra)
        return [request.cut(_new_tokens(row, [], request)) for row in out.tolist()]
    pad, left = request.pad_token_id, request.padding_side == "left"
    ids = torch.tensor([[pad] * (width - len(p)) + p if left else p + [pad] * (width - len(p)) for p in prompts],
                       dtype=input_ids.dtype)
    padded_mask = torch.tensor([[0] * (width - len(p)) + [1] * len(p) if left else [1] * len(p) + [0] * (width - len(p))
                                for p in prompts], dtype=mask.dtype)
    out = model.generate(input_ids=ids, attention_mask=padded_mask, generation_config=config, **extra)
    if request.is_encoder_decoder:
        return [request.cut(_new_tokens(row, [], request)) for row in out.tolist()]
    return [request.cut(row[width:]) for row in out.tolist()]


def _decoder_start(config, model) -> int | None:
    start = config.decoder_start_token_id
    if start is None:
        start = getattr(model.config, "decoder_start_token_id", None)
    return int(start) if isinstance(start, int) else None


def _new_tokens(sequence: list[int], prompt: list[int], request: GenerationRequest) -> list[int]:
    """A decoder-only sequence without its prompt; an encoder-decoder's without its decoder start token, where it
    starts with it (transformers 5's Whisper generate leaves it out when given a generation config)."""
    if request.is_encoder_decoder:
        start = request.decoder_start_token_id
        return sequence[1:] if start is None or sequence[:1] == [start] else sequence
    return sequence[len(prompt):] if sequence[: len(prompt)] == prompt else sequence
