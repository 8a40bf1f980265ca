"""The gate's runtime step: ask `model.generate` what the recipe's sample prompts should give, then every deployment
runtime of the target's format (`hfexport.deployment.RUNTIMES`) on the saved files.

The expected tokens are greedy, at the model's own (float32) precision, on each prompt alone (batch 1) and on all
prompts in one left-padded batch, cut after the first EOS: the same answer every runtime is compared with, token
for token. They are generated when the first runtime that runs reads them: where no runtime of the format is
installed (each answers `not_checked`), the model does not generate for nothing.
"""

from __future__ import annotations

import copy
from pathlib import Path

from hfexport.deployment import PENDING, RUNTIMES, GenerationRequest, RuntimeCheck, run_checks
from hfexport.verify.thresholds import resolve


def has_runtimes(export_format: str) -> bool:
    """Whether any deployment runtime is checked for `export_format` (so the expected tokens are worth computing)."""
    return bool(RUNTIMES.get(str(export_format)))


def check_runtimes(folder: str | Path, model, plan, processor=None) -> list[RuntimeCheck]:
    """Every runtime of the plan's format on `folder` (a generation target's saved files), compared with the model."""
    export_format = str(plan.target.export_format)
    if not has_runtimes(export_format):
        return []
    request = generation_request(model, plan, processor)
    if request is None:
        return []
    return run_checks(export_format, Path(folder), request)


def generation_request(model, plan, processor=None) -> GenerationRequest | None:
    """The sample prompts and `model.generate`'s greedy tokens for them; None when the inputs have no token prompt."""
    import torch

    inputs = plan.inputs
    input_ids = inputs.get("input_ids")
    if input_ids is None:
        return None
    mask = inputs.get("attention_mask")
    if mask is None:
        mask = torch.ones_like(input_ids)
    prompts = [[int(token) for token, keep in zip(row, keep_row, strict=True) if keep]
               for row, keep_row in zip(input_ids.tolist(), mask.tolist(), strict=True)]
    config = copy.deepcopy(plan.generation_config or model.generation_config)
    max_new_tokens = resolve(plan.target).max_new_tokens
    config.do_sample, config.num_beams = False, 1
    config.max_new_tokens, config.min_new_tokens = max_new_tokens, None
    eos = config.eos_token_id
    eos_ids = [int(token) for token in (eos if isinstance(eos, list) else [eos] if eos is not None else [])]
    pad = config.pad_token_id if config.pad_token_id is not None else (eos_ids[0] if eos_ids else None)
    config.pad_token_id = pad
    extra = {key: value for key, value in inputs.items() if key not in ("input_ids", "attention_mask")}
    request = GenerationRequest(
        prompts=prompts, expected=PENDING, max_new_tokens=max_new_tokens, eos_token_id=eos_ids, pad_token_id=pad,
        padded_expected=PENDING, texts=list(plan.recipe.sample_inputs.get("text") or []) or None,
        model_type=getattr(model.config, "model_type", None),
        is_encoder_decoder=bool(getattr(model.config, "is_encoder_decoder", False)),
        extra={key: value.detach().cpu().numpy() for key, value in extra.items() if torch.is_tensor(value)})

    def answer() -> tuple[list[list[int]], list[list[int]] | None]:
        """`model.generate`'s tokens for each prompt alone, and for the left-padded batch (run when a runtime first
        reads them: none is run when no runtime is installed)."""
        expected, padded_expected = [], None
        was_training = model.training
        model.eval()
        try:
            with torch.no_grad():
                for index, prompt in enumerate(prompts):
                    row_extra = {key: value[index: index + 1] for key, value in extra.items()
                                 if torch.is_tensor(value)}
                    ids = torch.tensor([prompt], dtype=input_ids.dtype)
                    out = model.generate(input_ids=ids, attention_mask=torch.ones_like(ids),
                                         generation_config=config, **row_extra)
                    expected.append(request.cut(_new_tokens(out[0].tolist(), prompt, request)))
                if len(prompts) > 1 and pad is not None and not request.is_encoder_decoder:
                    width = max(map(len, prompts))
                    ids = torch.tensor([[pad] * (width - len(p)) + p for p in prompts], dtype=input_ids.dtype)
                    left_mask = torch.tensor([[0] * (width - len(p)) + [1] * len(p) for p in prompts],
                                             dtype=mask.dtype)
                    out = model.generate(input_ids=ids, attention_mask=left_mask, generation_config=config, **extra)
                    padded_expected = [request.cut(row[width:]) for row in out.tolist()]
        finally:
            model.train(was_training)
        return expected, padded_expected

    request.answer = answer
    return request


def _new_tokens(sequence: list[int], prompt: list[int], request: GenerationRequest) -> list[int]:
    """A decoder-only sequence without its prompt; an encoder-decoder's without its decoder start token."""
    if request.is_encoder_decoder:
        return sequence[1:]
    return sequence[len(prompt):] if sequence[: len(prompt)] == prompt else sequence
