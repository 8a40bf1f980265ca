"""`hfexport init`: propose a recipe for a model that has none, then keep only the targets that export and verify.

`propose_recipe` reads the model's config only (no weights): the task (and so the model class) from
`config.architectures`, dims from the config (sequence up to `max_position_embeddings`, capped at `SEQ_CAP`, from 3
for encoder-decoders; batch 1..8), and a target per requested format in the mode that fits: `generation` for
generative models (prefill/decode graphs, axes left to torch.export), `forward` otherwise with named `batch`/`seq`
dims; OpenVINO targets pinned to f32. docs/init_matrix.md (scripts/init_matrix.py) is what it gives on every
matrix model. `init_recipe` runs a real job
with that recipe (export, then parity verification of each target reloaded from disk) and writes a recipe holding
only the targets that passed, with `validated_with` filled in. The Space reuses `propose_recipe`.
"""

from __future__ import annotations

import copy
import json
import tempfile
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from hfexport.errors import SourceError
from hfexport.files import write_json_atomic
from hfexport.formats import format_backend, format_traits
from hfexport.formats import formats as all_formats
from hfexport.hub import looks_like_repo_id
from hfexport.inputs import DEFAULT_TEXTS, default_sample_spec
from hfexport.job.run import run_job
from hfexport.models import GENERATIVE_TASKS, infer_task, load_config, multi_axis_rope, sequence_limit
from hfexport.recipe.loading import load_recipe
from hfexport.report.data import package_versions
from hfexport.verify.thresholds import DEFAULT_MAX_NEW_TOKENS

TARGET_NAMES = {backend.name: backend.target_name for backend in all_formats()}
DEFAULT_FORMATS = ("onnx",)
SEQ_CAP = 2048
BATCH = {"min": 1, "max": 8}
# Each format's own: its options (`init_options`) and `runtime` section (`init_runtime`: OpenVINO pins f32, so that
# what init verified holds on every CPU; docs/parity.md), the packages whose versions `validated_with` names.
# Encoder-decoders (BART, T5, Marian, mBART) guard seq >= 3 under torch.export ("Suggested fixes: seq =
# Dim('seq', min=3, ...)"), so their proposals start the sequence at 3.
ENCODER_DECODER_SEQ_MIN = 3


def _seq_min(config) -> int:
    return ENCODER_DECODER_SEQ_MIN if getattr(config, "is_encoder_decoder", False) else 2


_TEXT_INPUTS = {"automatic-speech-recognition": None, "audio-classification": "input_values",
                "image-classification": "pixel_values", "image-feature-extraction": "pixel_values"}


def propose_recipe(model: str | Path | None = None, formats: list[str] | tuple[str, ...] | None = None, *,
                   config=None, revision: str | None = None, token: str | None = None,
                   trust_remote_code: bool = False) -> dict:
    """A full recipe dict for `model` (or its `config`), one target per format in `formats` (default: onnx)."""
    if config is None:
        check_model_source(model)
        config = load_config(model, revision, token, trust_remote_code)
    formats = list(dict.fromkeys(formats or DEFAULT_FORMATS))
    unknown = [fmt for fmt in formats if fmt not in TARGET_NAMES]
    if unknown:
        raise ValueError(f"unknown format(s) {unknown}; choose from {', '.join(TARGET_NAMES)}")
    task = infer_task(config)
    # A multi-axis rope (Qwen2-VL-class: positions from `get_rope_index` over the image grids) gets the forward, whole
    # and static as a vision-language forward is (a prompt holds a fixed number of image tokens per image).
    # hfexport's generate now runs such an export (docs/generation.md, from a recipe's generation target); init
    # still proposes the forward, whose proposal tests/test_init.py checks.
    static_forward = task == "image-text-to-text" and multi_axis_rope(config)
    generative = task in GENERATIVE_TASKS and not static_forward
    limit = sequence_limit(config)
    dims: dict[str, dict] = {"batch": dict(BATCH)}
    # A decoder whose prompt holds the audio's tokens (Qwen3-ASR), not an encoder-decoder over the audio (Whisper):
    # it takes prompts too, to which its processor adds each clip's placeholders.
    audio_prompt = task == "automatic-speech-recognition" and getattr(config, "audio_token_id", None) is not None
    main_input = "input_ids" if audio_prompt else _TEXT_INPUTS.get(task, "input_ids")
    if main_input == "input_ids":
        dims["seq"] = {"min": _seq_min(config), "max": min(limit or SEQ_CAP, SEQ_CAP)}
    sample = default_sample_spec(task)
    if audio_prompt:
        sample["text"] = list(DEFAULT_TEXTS)
    if "text" in sample:
        sample = {**sample, "text": list(DEFAULT_TEXTS)}
    targets: dict[str, dict] = {}
    for fmt in formats:
        options: dict[str, Any] = dict(format_backend(fmt).init_options)
        runtime = dict(format_backend(fmt).init_runtime)
        if generative:
            targets[f"{TARGET_NAMES[fmt]}-generation"] = {
                "export_format": fmt,
                "mode": "generation",
                "options": {"dynamic": True, **options},
                **({"runtime": runtime} if runtime else {}),
                "parity": {"generate": {"max_new_tokens": DEFAULT_MAX_NEW_TOKENS}},
            }
            continue
        target: dict[str, Any] = {"export_format": fmt, "mode": "forward"}
        if runtime:
            target["runtime"] = runtime
        if options:
            target["options"] = options
        if static_forward:
            target["dynamic_shapes"] = {"input_ids": {"0": "static", "1": "static"}, "pixel_values": {"0": "static"}}
        elif main_input is not None:
            target["dynamic_shapes"] = {main_input: {"0": "batch", **({"1": "seq"} if "seq" in dims else {})}}
        else:
            target.setdefault("options", {})["dynamic"] = True
        targets[TARGET_NAMES[fmt]] = target
    name = (getattr(config, "_name_or_path", None) or str(model or "")).rstrip("/").split("/")[-1]
    return {
        "recipe_version": 1,
        "task": task,
        "description": f"Proposed by `hfexport init` for {name or 'this model'}.",
        "default_target": next(iter(targets)),
        "dims": dims,
        "sample_inputs": sample,
        "targets": targets,
    }


def check_model_source(model: str | Path) -> None:
    """Say what is missing, in the user's terms, before transformers says it in its own: a local folder needs a
    `config.json` (an empty folder used to get "Should have a `model_type` key in its config.json")."""
    path = Path(str(model))
    if path.is_dir():
        if not (path / "config.json").is_file():
            raise SourceError(f"{model} has no config.json: `hfexport init` needs a model folder (config.json and "
                              "weights, as `save_pretrained` writes them) or a Hub repo id")
        return
    if path.exists():
        raise SourceError(f"{model} is a file: `hfexport init` needs a model folder or a Hub repo id")
    text = str(model)
    local_parent = "/" in text and Path(text.split("/")[0]).is_dir()
    if text.startswith((".", "/", "~")) or local_parent or not looks_like_repo_id(text):
        raise SourceError(f"{model}: no such folder, and not a Hub repo id")


def validated_with(formats) -> dict[str, str]:
    """Versions of hfexport, transformers, torch and the packages of `formats`, as recipes record them."""
    versions = package_versions()
    wanted = ["hfexport", "transformers", "torch"] + [name for fmt in formats for name in format_traits(fmt).packages]
    return {name: versions[name] for name in dict.fromkeys(wanted) if name in versions}


@dataclass
class InitResult:
    """What `init_recipe` proposed, which targets passed (written) and which failed (with the reason)."""

    proposed: dict
    recipe: dict | None
    passed: list[str] = field(default_factory=list)
    failed: dict[str, str] = field(default_factory=dict)
    report: Any = None
    output: Path | None = None


def default_output(model: str | Path) -> Path:
    """MODEL/export_config.json for a local folder, else ./export_config.json."""
    path = Path(str(model))
    return path / "export_config.json" if path.is_dir() else Path("export_config.json")


def init_recipe(model: str | Path, formats=None, output: str | Path | None = None, *, revision: str | None = None,
                token: str | None = None, trust_remote_code: bool = False, progress=None,
                exports: str | Path | None = None, workers: int | str = 1) -> InitResult:
    """Propose a recipe, export and verify every target (into `exports`, else a temporary folder), and write to
    `output` (when given) a recipe with only the targets that passed and `validated_with` filled in. `workers`:
    `JobOptions.workers`."""
    proposed = propose_recipe(model, formats, revision=revision, token=token, trust_remote_code=trust_remote_code)
    with tempfile.TemporaryDirectory(prefix="hfexport-init-") as scratch:
        report = run_job(model, Path(exports) if exports else Path(scratch), all_targets=True, recipe=proposed,
                         revision=revision, token=token, trust_remote_code=trust_remote_code, progress=progress,
                         force=True, verify=True, workers=workers)
    passed = [name for name, target in report.targets.items() if target.status == "ok"]
    failed = {name: target.error or target.status for name, target in report.targets.items() if name not in passed}
    result = InitResult(proposed, None, passed, failed, report)
    if not passed:
        return result
    recipe = copy.deepcopy(proposed)
    recipe["targets"] = {name: recipe["targets"][name] for name in passed}
    recipe["default_target"] = passed[0]
    recipe["description"] += " Every target was exported and passed parity verification with the versions below."
    recipe["validated_with"] = validated_with([recipe["targets"][name]["export_format"] for name in passed])
    load_recipe(recipe)  # what init writes must load back
    result.recipe = recipe
    if output is not None:
        result.output = Path(output)
        write_json_atomic(result.output, json.dumps(recipe, indent=2) + "\n")
    return result
