"""Plan: a recipe target resolved against one concrete model. Pure data in, engine objects out; nothing traced.

A plan holds, per component, the engine config (with `torch.export.Dim`s built from the recipe's dims), the
inputs the engine will trace with (keys as they are after the engine's `prepare_for_export`), and a readable
statement of which axes are dynamic. Mode `forward` is one `"model"` component; mode `generation` has the
components the engine's `decompose_for_generation` finds for this model (`prefill`/`decode`, or encoders, ...).

Modules: `model` (the `Plan` data), `shapes` (dims and dynamic shapes), `tracing` (the engine's config and traced
inputs), `build` (`build_plan`), `generation` (what every generation family shares), `memory_plan` (what a program
planned for its dims' upper bounds allocates at load), and one module per family:
`decoder`, `seq2seq`, `vision_language`, `state_space`.
"""

from hfexport.plan.build import build_plan
from hfexport.plan.generation import OWN_COMPONENTS, generation_stages
from hfexport.plan.data import ComponentPlan, Plan
from hfexport.plan.shapes import build_dims
from hfexport.plan.tracing import preparer_record, traced_inputs
from hfexport.plan.vision_language import EMBED, IMAGE_ENCODER, image_token_id

__all__ = ["EMBED", "IMAGE_ENCODER", "OWN_COMPONENTS", "ComponentPlan", "Plan", "build_dims", "build_plan",
           "generation_stages", "image_token_id", "preparer_record", "traced_inputs"]
