"""SmolLM2-135M-Instruct (real weights): which part of ExecuTorch's 8da4w loses its quality, measured in eager PyTorch
(docs/quantization.md, "Variants": why the 8da4w variant's head is 8-bit and its embedding 4-bit by default).

Each configuration quantizes the model's parts with torchao's configs as `hfexport.formats.executorch.variants`
(and optimum-executorch's `quantize_model_`) call them (scales by `hqq_scale_only` unless `alg` says otherwise), then
puts each quantized weight back as the float weight it dequantizes to, and, where the form quantizes activations
(`8da*`), quantizes each linear layer's input to int8 per token (asymmetric, torchao's per-token dynamic
quantization) in a forward pre-hook: the numbers XNNPACK's kernels compute up to float rounding, at the speed of
float32 (torchao's eager quantized tensors took 7 s per token here). Measured per configuration, on
variant_quality.py's 8 passages, as hfexport's variant gate measures them: the greedy token agreement with the float32
model's `generate` (16 new tokens per passage, the tokens before each passage's first divergence), the perplexity ratio
over every next token of the passages and the share of positions whose argmax is float32's. Eager PyTorch only: the
runtimes' own agreement is tests/test_smollm2_executorch_variants.py's (greedy near-ties fall differently in XNNPACK's
kernels: optimum-executorch's form agrees 0.34 there, 0.14 here). The `head_clip*`, `head_awq*` and `head_gptq`
configurations (issue 46: a 4-bit head as fast as the peer's at the 8-bit head's quality?) put a better grid under the
4-bit head first (`clip_to_best_grid`, activation-aware input scaling, `gptq_grid`), calibrated on the chat prompts.

Run: `PYTHONPATH=library .venv/bin/python benchmarks/variant_8da4w_parts.py [CONFIG ...]` (`SMOLLM2_DIR`: the built
checkpoint, default /tmp/hfexport-smollm2) -> one JSON line per configuration; results/variant_8da4w_parts.json.
"""

from __future__ import annotations

import copy
import json
import math
import os
import sys
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))

#: name -> the parts' forms: `emb`, `lin` (every linear layer but the head), `head` ("same": as `lin`; None: float32),
#: each (form, group: 0 per row/channel), and `alg` (torchao's qparams algorithm)
CONFIGS = {
    "peer": {},  # optimum-executorch's --qlinear 8da4w --qembedding 8w
    "head_f32": {"head": None},
    "emb_f32": {"emb": None},
    "head_8da8w": {"head": ("8da8w", 0)},
    "head_4w_wo": {"head": ("4w", 32)},
    "g16": {"lin": ("8da4w", 16)},
    "g64": {"lin": ("8da4w", 64)},
    "affine": {"alg": "affine"},
    "emb4w32_head8da8w": {"emb": ("4w", 32), "head": ("8da8w", 0)},  # hfexport's defaults
    # the 4-bit head's groups clipped to their least-squares grid first (variants.clip_to_best_grid), then torchao's
    # symmetric min-max mapping (`affine`: the grid found) or `hqq_scale_only` from the clipped weights
    "head_clip_affine": {"clip": ("head",), "head_alg": "affine"},
    "head_clip_hqq": {"clip": ("head",)},
    "all_clip_affine": {"clip": ("head", "lin"), "head_alg": "affine", "lin_alg": "affine"},
    # the 4-bit head's input channels scaled by s = mean|x|^alpha before quantizing (activation-aware, AWQ's scaling;
    # x: the head's input on llm_runtimes.CHAT's chat prompts, not the scored passages), divided out after
    "head_awq50": {"awq": 0.5},
    "head_awq25": {"awq": 0.25},
    # the 4-bit head by GPTQ (`gptq_grid`): its columns rounded in order onto torchao's symmetric grid of each group
    # of 32 (scale = the group's largest magnitude / 7.5), each rounding error spread over the columns not yet
    # rounded through the inverse Hessian of the head's input (x: llm_runtimes.CHAT's chat prompts and the float32
    # model's own 96 greedy tokens after each, not the scored passages)
    "head_gptq": {"gptq": 0.01},  # the value: GPTQ's damping, the share of the Hessian's mean diagonal added
    "head_gptq_damp10": {"gptq": 0.1},
    "head_g16": {"head": ("8da4w", 16)},  # the 4-bit head in groups of 16 (scales read: 2x the groups of 32's)
}


def clip_to_best_grid(weight, group: int, bits: int = 4, steps: int = 26, lowest: float = 0.5):
    """`weight` (`[out, in]`) with each group of `group` input values (-1: each row) clipped to the symmetric range
    whose grid has the least squared error: torchao's symmetric min-max mapping of the clipped group (scale = its
    largest magnitude / 7.5 at 4 bits, values rounded and clamped to -8..7) then lands on that grid. The range is
    searched over `steps` fractions of the group's largest magnitude from `lowest` to 1 (1: no clipping)."""
    import torch

    rows, columns = weight.shape
    size = columns if group == -1 else group
    grouped = weight.detach().float().reshape(rows, columns // size, size)
    largest = grouped.abs().amax(dim=-1, keepdim=True).clamp_min(torch.finfo(torch.float32).tiny)
    low, high = -(2 ** (bits - 1)), 2 ** (bits - 1) - 1
    best_error, best = torch.full_like(largest, float("inf")), torch.ones_like(largest)
    for fraction in torch.linspace(lowest, 1.0, steps).tolist():
        scale = largest * fraction / ((high - low) / 2)
        error = ((torch.clamp(torch.round(grouped / scale), low, high) * scale - grouped) ** 2).sum(-1, keepdim=True)
        better = error < best_error
        best_error, best = torch.where(better, error, best_error), torch.where(better, fraction, best)
    limit = largest * best
    return torch.maximum(torch.minimum(grouped, limit), -limit).reshape(rows, columns).to(weight.dtype)


def gptq_grid(weight, hessian, group: int, damp: float = 0.01, block: int = 128):
    """`weight` (`[out, in]`) rounded column by column onto torchao's symmetric 4-bit grid of each group of `group`
    input values (scale: the group's largest magnitude, as updated when its first column is reached, / 7.5; -8..7),
    each column's error spread over the later columns through the inverse of `hessian` (`sum x x^T` of the layer's
    input; GPTQ, Frantar et al. 2022); the float weight each quantized value stands for."""
    import torch

    work, columns = weight.detach().float().clone(), weight.shape[1]
    hessian = hessian.double().clone()
    hessian += damp * hessian.diagonal().mean() * torch.eye(columns, dtype=hessian.dtype)
    inverse = torch.linalg.cholesky(torch.cholesky_inverse(torch.linalg.cholesky(hessian)), upper=True).float()
    out, scale = torch.zeros_like(work), None
    for start in range(0, columns, block):
        stop = min(start + block, columns)
        part, local = work[:, start:stop].clone(), inverse[start:stop, start:stop]
        errors = torch.zeros_like(part)
        for index in range(stop - start):
            if (start + index) % group == 0:
                scale = (part[:, index:index + group].abs().amax(1) / 7.5).clamp_min(1e-12)
            column = part[:, index]
            rounded = torch.clamp(torch.round(column / scale), -8, 7) * scale
            out[:, start + index] = rounded
            error = (column - rounded) / local[index, index]
            part[:, index:] -= error.unsqueeze(1) * local[index, index:].unsqueeze(0)
            errors[:, index] = error
        work[:, stop:] -= errors @ inverse[start:stop, stop:]
    return out


def main(names: list[str]) -> None:
    import torch
    from torchao.quantization.granularity import PerAxis, PerGroup
    from torchao.quantization.quant_api import (Int8DynamicActivationIntxWeightConfig, IntxWeightOnlyConfig,
                                                quantize_)
    from transformers import AutoModelForCausalLM, AutoTokenizer
    from variant_quality import TEXTS

    from hfexport.deployment import token_agreement

    torch.manual_seed(0)
    torch.set_num_threads(2)
    folder = os.environ.get("SMOLLM2_DIR", "/tmp/hfexport-smollm2")
    tokenizer = AutoTokenizer.from_pretrained(folder)
    base = AutoModelForCausalLM.from_pretrained(folder, dtype=torch.float32).eval()
    rows = [tokenizer(text)["input_ids"] for text in TEXTS]

    @torch.no_grad()
    def generate(model):
        out = []
        for row in rows:
            ids = torch.tensor([row])
            new = model.generate(ids, attention_mask=torch.ones_like(ids), max_new_tokens=16, do_sample=False,
                                 num_beams=1, pad_token_id=tokenizer.eos_token_id)
            out.append(new[0, len(row):].tolist())
        return out

    @torch.no_grad()
    def scores(model):
        out = []
        for row in rows:
            log_probs = torch.log_softmax(model(torch.tensor([row])).logits[0].double(), -1)
            out.append(([float(log_probs[i, row[i + 1]]) for i in range(len(row) - 1)], log_probs.argmax(-1).tolist()))
        return out

    def config(kind, group, alg):
        granularity = PerAxis(0) if group in (0, -1) else PerGroup(group)
        if kind.startswith("8da"):
            return Int8DynamicActivationIntxWeightConfig(weight_dtype=torch.int4 if kind == "8da4w" else torch.int8,
                                                         weight_granularity=granularity,
                                                         intx_choose_qparams_algorithm=alg)
        return IntxWeightOnlyConfig(weight_dtype=torch.int4 if kind == "4w" else torch.int8, granularity=granularity,
                                    intx_choose_qparams_algorithm=alg)

    def part_filter(which):
        if which == "emb":
            return lambda module, name: isinstance(module, torch.nn.Embedding)
        if which == "head":
            return lambda module, name: isinstance(module, torch.nn.Linear) and name == "lm_head"
        return lambda module, name: isinstance(module, torch.nn.Linear) and name != "lm_head"

    cache = {}

    def head_input_scale(alpha):
        """AWQ's per-input-channel scale of the head: mean |x|^alpha over the chat prompts, normalized."""
        from llm_runtimes import CHAT

        seen = []
        hook = base.lm_head.register_forward_pre_hook(
            lambda module, args: seen.append(args[0].reshape(-1, args[0].shape[-1])))
        with torch.no_grad():
            for text in CHAT:
                ids = tokenizer.apply_chat_template([{"role": "user", "content": text}], add_generation_prompt=True)
                ids = ids["input_ids"] if isinstance(ids, dict) or hasattr(ids, "keys") else ids
                base(torch.tensor([ids]))
        hook.remove()
        scale = torch.cat(seen).abs().mean(0).clamp_min(1e-5) ** alpha
        return scale / (scale.max() * scale.min()).sqrt()

    def head_hessian():
        """`sum x x^T` of the head's input over the chat prompts and the float32 model's greedy continuations."""
        from llm_runtimes import CHAT

        total = torch.zeros(base.lm_head.in_features, base.lm_head.in_features, dtype=torch.float64)

        def add(module, args):
            nonlocal total
            x = args[0].reshape(-1, args[0].shape[-1]).double()
            total += x.T @ x

        with torch.no_grad():
            for text in CHAT:
                ids = tokenizer.apply_chat_template([{"role": "user", "content": text}], add_generation_prompt=True)
                ids = torch.tensor([ids["input_ids"] if hasattr(ids, "keys") else ids])
                full = base.generate(ids, attention_mask=torch.ones_like(ids), max_new_tokens=96, do_sample=False,
                                     pad_token_id=tokenizer.eos_token_id)
                hook = base.lm_head.register_forward_pre_hook(add)
                base(full)
                hook.remove()
        return total

    def weights(kind, group, alg, which, clip=False, awq=None, gptq=None):
        """The part's weights quantized by torchao and dequantized to float32, by module name (cached)."""
        key = (kind, group, alg, which, clip, awq, gptq)
        if gptq and key not in cache:
            cache[key] = {"lm_head": gptq_grid(base.lm_head.weight, hessians[0], group, damp=gptq)}
        if key not in cache:
            model, keep = copy.deepcopy(base).eval(), part_filter(which)
            scale = head_input_scale(awq) if awq else None
            with torch.no_grad():
                if which != "emb":  # untied first, as optimum-executorch's order (embedding first) leaves it
                    model.lm_head.weight = torch.nn.Parameter(model.lm_head.weight.detach().clone())
                if scale is not None:
                    model.lm_head.weight = torch.nn.Parameter(model.lm_head.weight.detach() * scale)
                if clip:
                    for name, module in model.named_modules():
                        if keep(module, name):
                            module.weight = torch.nn.Parameter(clip_to_best_grid(
                                module.weight, group if group else -1, 4 if kind.endswith("4w") else 8))
                quantize_(model, config(kind, group, alg), keep)
            cache[key] = {name: module.weight.dequantize().float().clone() / (1 if scale is None else scale)
                          for name, module in model.named_modules() if keep(module, name)}
            del model
        return cache[key]

    def int8_per_token(module, args):
        x = args[0]
        low = torch.clamp(x.amin(-1, keepdim=True), max=0)
        high = torch.clamp(x.amax(-1, keepdim=True), min=0)
        scale = torch.clamp((high - low) / 255, min=torch.finfo(torch.float32).eps)
        zero = torch.clamp(torch.round(-128 - low / scale), -128, 127)
        return ((torch.clamp(torch.round(x / scale) + zero, -128, 127) - zero) * scale,)

    original, hooks, hessians = {}, [], []

    def make(emb=("8w", 0), lin=("8da4w", 32), head="same", alg="hqq_scale_only", clip=(), head_alg=None,
             lin_alg=None, awq=None, gptq=None):
        """`base` with the configuration's weights and activation hooks in place of the last one's."""
        if not original:
            base.lm_head.weight = torch.nn.Parameter(base.lm_head.weight.detach().clone(), requires_grad=False)
            original.update({name: module.weight for name, module in base.named_modules()
                             if isinstance(module, (torch.nn.Linear, torch.nn.Embedding))})
        for hook in hooks:
            hook.remove()
        hooks.clear()
        modules = dict(base.named_modules())
        for name, weight in original.items():
            modules[name].weight = weight
        if gptq and not hessians:  # on the float32 model
            hessians.append(head_hessian())
        for spec, which in ((emb, "emb"), (lin if head == "same" else head, "head"), (lin, "lin")):
            if not spec:
                continue
            part_alg = {"head": head_alg, "lin": lin_alg}.get(which) or alg
            for name, weight in weights(spec[0], spec[1], part_alg, which, which in clip,
                                        awq if which == "head" else None, gptq if which == "head" else None).items():
                modules[name].weight = torch.nn.Parameter(weight.clone(), requires_grad=False)
                if spec[0].startswith("8da"):
                    hooks.append(modules[name].register_forward_pre_hook(int8_per_token))
        return base

    reference_tokens, reference = generate(base), scores(base)
    reference_nll = sum(-x for row, _ in reference for x in row) / sum(len(row) for row, _ in reference)
    for name in names or CONFIGS:
        started = time.time()
        model = make(**CONFIGS[name])
        tokens, scored = generate(model), scores(model)
        nll = sum(-x for row, _ in scored for x in row) / sum(len(row) for row, _ in scored)
        top1 = [a == b for (_, want), (_, got) in zip(reference, scored, strict=True)
                for a, b in zip(want[:-1], got[:-1], strict=True)]
        print(json.dumps({"config": name, "greedy_agreement": round(token_agreement(reference_tokens, tokens), 3),
                          "nll_ratio": round(math.exp(nll - reference_nll), 4),
                          "top1": round(sum(top1) / len(top1), 3), "s": round(time.time() - started)}), flush=True)
        for key in [key for key in cache if key != ("8da4w", 32, "hqq_scale_only", "lin", False, None, None)]:
            del cache[key]


if __name__ == "__main__":
    main(sys.argv[1:])
