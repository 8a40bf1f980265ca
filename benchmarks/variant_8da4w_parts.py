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
kernels: optimum-executorch's form agrees 0.34 there, 0.14 here).

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
}


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

    def weights(kind, group, alg, which):
        """The part's weights quantized by torchao and dequantized to float32, by module name (cached)."""
        key = (kind, group, alg, which)
        if key not in cache:
            model, keep = copy.deepcopy(base).eval(), part_filter(which)
            with torch.no_grad():
                if which != "emb":  # untied first, as optimum-executorch's order (embedding first) leaves it
                    model.lm_head.weight = torch.nn.Parameter(model.lm_head.weight.detach().clone())
                quantize_(model, config(kind, group, alg), keep)
            cache[key] = {name: module.weight.dequantize().float().clone() for name, module in model.named_modules()
                          if keep(module, name)}
            del model
        return cache[key]

    def int8_per_token(module, args):
        x = args[0]
        low = torch.clamp(x.amin(-1, keepdim=True), max=0)
        high = torch.clamp(x.amax(-1, keepdim=True), min=0)
        scale = torch.clamp((high - low) / 255, min=torch.finfo(torch.float32).eps)
        zero = torch.clamp(torch.round(-128 - low / scale), -128, 127)
        return ((torch.clamp(torch.round(x / scale) + zero, -128, 127) - zero) * scale,)

    original, hooks = {}, []

    def make(emb=("8w", 0), lin=("8da4w", 32), head="same", alg="hqq_scale_only"):
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
        for spec, which in ((emb, "emb"), (lin if head == "same" else head, "head"), (lin, "lin")):
            if not spec:
                continue
            for name, weight in weights(spec[0], spec[1], alg, which).items():
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
        for key in [key for key in cache if key != ("8da4w", 32, "hqq_scale_only", "lin")]:
            del cache[key]


if __name__ == "__main__":
    main(sys.argv[1:])
