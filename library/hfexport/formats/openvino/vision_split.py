"""The vision graphs OpenVINO GenAI's `VLMPipeline` runs a Qwen2-VL-class model on, made from the model's own modules.

VLMPipeline 2026.4.1 (src/cpp/src/visual_language/qwen2vl/classes.cpp) splits a `qwen2_vl` vision tower in two and
computes what joins them from the image grid itself:

- `openvino_vision_embeddings_model.xml`: one input, the patches `[patches, channels x temporal x patch x patch]`
  (`hidden_states`; VLMPipeline puts its own resize, normalization and patching in front of it,
  `patch_preprocess_into_model`) -> the patch embeddings `[patches, embed_dim]`: the tower's `patch_embed`;
- `openvino_vision_embeddings_merger_model.xml`: `hidden_states` (those embeddings), `attention_mask` `[1, patches,
  patches]` (0 within an image, -inf across images; `cu_seq_lens` instead where the CPU plugin's VLSDPA rewrite
  takes it) and `rotary_pos_emb` `[patches, head_dim / 2]` (the h and w angles per patch, from an inverse frequency
  of theta 10000, `get_rotary_pos_emb`; its width read from this input's static dim 1) -> the merged image tokens
  `[tokens, hidden]`: the tower's blocks, each attention fed that mask (transformers 5.23 splits the sequence by
  `cu_seqlens` instead, which the graph cannot take), then its `merger`. optimum-intel's export of the same model
  patches the blocks so (`patch_qwen2vl_vision_blocks`, optimum/exporters/openvino/model_patcher.py).

`vision_split` makes both with `torch.export` and OpenVINO's converter, at float32, from the tower found in the model
(the module holding `patch_embed`, `blocks` and `merger`); `refusal` says, from the config, why it would not match
what VLMPipeline feeds.
"""

from __future__ import annotations

import inspect

from hfexport.formats.openvino.backend import VISION_EMBEDDINGS_FILE, VISION_MERGER_FILE
from hfexport.formats.openvino.backend import VLM_IMAGE_TAG as IMAGE_TAG
from hfexport.formats.openvino.backend import VLM_SPLIT_TYPES as SPLIT_TYPES

__all__ = ["IMAGE_TAG", "SPLIT_TYPES", "VISION_EMBEDDINGS_FILE", "VISION_MERGER_FILE", "vision_split"]
#: VLMPipeline's rotary base for the vision angles (`get_rotary_pos_emb`: `const float theta = 10000.0f`).
VLMPIPELINE_VISION_THETA = 10000.0


def refusal(config) -> str | None:
    """Why VLMPipeline would not run this config's vision tower as `vision_split` makes it (None: it would)."""
    vision = getattr(config, "vision_config", None)
    if getattr(config, "model_type", None) not in SPLIT_TYPES or vision is None:
        return f"VLMPipeline's Qwen2-VL vision split is made for {', '.join(SPLIT_TYPES)} only"
    theta = (getattr(vision, "rope_parameters", None) or {}).get("rope_theta", VLMPIPELINE_VISION_THETA)
    if float(theta) != VLMPIPELINE_VISION_THETA:
        return (f"VLMPipeline computes the vision rotary angles with theta {VLMPIPELINE_VISION_THETA:g} "
                f"(get_rotary_pos_emb, qwen2vl/classes.cpp); vision_config.rope_parameters.rope_theta is {theta}")
    if getattr(vision, "temporal_patch_size", 2) != 2:
        return "VLMPipeline asserts temporal_patch_size == 2 (qwen2vl/classes.cpp)"
    return None


def vision_tower(model):
    """The module of `model` holding `patch_embed`, `blocks` and `merger` (Qwen2-VL-class), or None."""
    return next((module for module in model.modules()
                 if all(hasattr(module, name) for name in ("patch_embed", "blocks", "merger"))), None)


def vision_split(model) -> dict:
    """{file: `openvino.Model`} of the two graphs (module docstring), {} where `refusal` refuses the model's config
    or it holds no such tower."""
    import torch

    tower = vision_tower(model)
    if refusal(model.config) or tower is None:
        return {}
    vision = model.config.vision_config
    features = vision.in_channels * vision.temporal_patch_size * vision.patch_size ** 2
    merge = vision.spatial_merge_size ** 2
    patches = 4 * merge  # a sample of whole merge units; the patch axis is dynamic
    dtype = next(tower.parameters()).dtype
    head_dim = vision.embed_dim // vision.num_heads
    samples = {
        VISION_EMBEDDINGS_FILE: (patch_embeddings(tower), (torch.zeros(patches, features, dtype=dtype),),
                                 {"hidden_states": {0: torch.export.Dim.AUTO}}),
        VISION_MERGER_FILE: (blocks_and_merger(tower), (torch.zeros(patches, vision.embed_dim, dtype=dtype),
                                                      torch.zeros(1, patches, patches, dtype=torch.float32),
                                                      torch.zeros(patches, head_dim // 2, dtype=torch.float32)),
                             {"hidden_states": {0: torch.export.Dim.AUTO},
                              "attention_mask": {1: torch.export.Dim.AUTO, 2: torch.export.Dim.AUTO},
                              "rotary_pos_emb": {0: torch.export.Dim.AUTO}}),
    }
    return {file: _convert(module, args, shapes) for file, (module, args, shapes) in samples.items()}


def _convert(module, args, dynamic_shapes):
    import openvino as ov
    import torch

    with torch.no_grad():
        program = torch.export.export(module.eval(), args, dynamic_shapes=dynamic_shapes, strict=False)
    converted = ov.convert_model(program.run_decompositions())
    names = list(inspect.signature(module.forward).parameters)
    for port, name in zip(converted.inputs, names, strict=True):
        port.get_tensor().set_names({name})
    # the converter leaves every axis dynamic: only the exported ones are (VLMPipeline reads the rotary width)
    converted.reshape({name: ov.PartialShape([-1 if axis in dynamic_shapes[name] else size
                                              for axis, size in enumerate(sample.shape)])
                       for name, sample in zip(names, args, strict=True)})
    converted.outputs[0].get_tensor().set_names({"last_hidden_state"})
    return converted


def patch_embeddings(tower):
    """The tower's `patch_embed` on the patches (`hidden_states`), as a module of its own."""
    import torch

    class PatchEmbeddings(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.patch_embed = tower.patch_embed

        def forward(self, hidden_states):
            return self.patch_embed(hidden_states)

    return PatchEmbeddings()


def blocks_and_merger(tower):
    """The tower's blocks, each attention masked by `attention_mask` and rotated by `rotary_pos_emb` (as VLMPipeline
    feeds them), then its `merger`, as a module of its own."""
    import torch

    rotate = inspect.getmodule(type(tower)).apply_rotary_pos_emb_vision  # the model's own rotation

    class BlocksAndMerger(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.blocks, self.merger = tower.blocks, tower.merger

        def forward(self, hidden_states, attention_mask, rotary_pos_emb):
            angles = torch.cat((rotary_pos_emb, rotary_pos_emb), dim=-1)
            cos, sin = angles.cos(), angles.sin()
            for block in self.blocks:
                hidden_states = hidden_states + _attention(block.attn, block.norm1(hidden_states), attention_mask,
                                                           cos, sin, rotate)
                hidden_states = hidden_states + block.mlp(block.norm2(hidden_states))
            return self.merger(hidden_states)

    return BlocksAndMerger()


def _attention(attn, hidden_states, attention_mask, cos, sin, rotate):
    """Qwen2-VL's `VisionAttention` over the whole sequence, masked by `attention_mask` `[1, patches, patches]` where
    transformers 5.23 splits the sequence at `cu_seqlens`: the same attention within each image."""
    import torch

    length = hidden_states.shape[0]
    query, key, value = attn.qkv(hidden_states).reshape(length, 3, attn.num_heads, -1).permute(1, 0, 2, 3).unbind(0)
    query, key = rotate(query, key, cos, sin)
    query, key, value = (tensor.transpose(0, 1).unsqueeze(0) for tensor in (query, key, value))
    output = torch.nn.functional.scaled_dot_product_attention(
        query, key, value, attn_mask=attention_mask.unsqueeze(1).to(query.dtype), scale=attn.scaling)
    return attn.proj(output.squeeze(0).transpose(0, 1).reshape(length, -1))
