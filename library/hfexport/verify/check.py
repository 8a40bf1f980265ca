"""Parity verification: does the artifact on disk compute what the model computes? A gate, not a warning.

The target folder is reloaded from disk (`ExportedModel.from_pretrained`) and run next to the eager model (eval
mode, no grad) on the same probe inputs. Probes cover the declared dynamic ranges: for every dynamic dim its min,
an odd value inside (37 when it fits) and its max, or the values the recipe lists in `parity.probe`; the i-th
probe takes every dim's i-th value, so batch is > 1 on the last probe whenever batch is dynamic. Where the axes are
"auto" (torch.export decides), batch 1 and 8 and two sequence lengths are probed: that is how a batch silently
pinned to the sample's 1 is caught. A probe costs at most `parity.max_probe_elements` input elements (default
`DEFAULT_MAX_PROBE_ELEMENTS`); larger dims are halved until it fits and the report says so.

Every output leaf (named as the model's output fields; cache leaves grouped as `past_key_values`) gets max abs
diff, max rel diff, cosine similarity and, for logits, top-1 agreement, checked against thresholds: the recipe's
`parity` (global, then per output) over defaults per format and dtype (`hfexport.verify.thresholds.resolve`, docs/parity.md).
A probe the artifact rejects is a failure carrying the backend's message. Generation targets also decode greedily
over the exported graphs (`hfexport.generate.generate`) and must agree token for token with `model.generate`.
"""

from __future__ import annotations

import contextlib
import copy
import json
import os
import time
from pathlib import Path
from types import SimpleNamespace
from typing import Any

from hfexport.engine import traced_cache_layout
from hfexport.errors import redact
from hfexport.files import MANIFEST_FILE, current_rss, dropping_mapped_folder
from hfexport.formats import format_traits
from hfexport.formats.programs import format_program
from hfexport.models import on_empty_cache
from hfexport.plan import generation_stages, image_token_id, traced_inputs
from hfexport.progress import ProgressCallback, Step
from hfexport.safety.artifacts import check_manifest_file
from hfexport.machine import (
    cpu_info,
    has_runtime_precision,
    joined_precision,
    pinned_precision,
    read_back,
)
from hfexport.verify import artifact
from hfexport.verify.artifact import backend_message
from hfexport.verify.parity import as_array, compare_outputs
from hfexport.verify.probes import (
    keep_image_tokens,
    mask_of,
    plan_probes,
    probe_axes,
    probe_label,
    representative_probe,
    resize_inputs,
    shapes_of,
)
from hfexport.verify.thresholds import (
    DEFAULT_MAX_NEW_TOKENS,
    EXACT_TOKEN_AGREEMENT,
    SHAPE_ONLY,
    Thresholds,
    resolve,
)

# ── Running a target ─────────────────────────────────────────────────────────
#
# The gate runs in two passes so that the eager model and the artifact's runtime are never in memory together
# (issue 45): `_references` runs the eager model on every probe (and `model.generate` on the sample prompts) and
# keeps what the comparison needs, the model's outputs and the inputs the artifact is fed, reading the artifact's
# layout (component names and traced kwargs) from its manifest only; then the caller may release the model, and
# `_compare` loads nothing but the artifact and compares it with those references.


def _traced(runner, inputs: dict) -> dict:
    """Only the kwargs the graph was traced with, as `ExportedModel.__call__` does for a single graph."""
    traced = runner.metadata.kwargs
    return {key: value for key, value in inputs.items() if key in traced}


class _Layout:
    """An export's components and their traced metadata, read from its checked manifest without opening a runtime:
    what the eager pass needs of the artifact (`components`, each runner's `metadata`)."""

    def __init__(self, folder: Path):
        from transformers.exporters import ExportMetadata

        manifest = check_manifest_file(folder / MANIFEST_FILE, f"{folder.name}/{MANIFEST_FILE}")
        self.runners = {name: SimpleNamespace(metadata=ExportMetadata.from_dict(entry["metadata"]))
                        for name, entry in manifest["components"].items()}
        self.components = dict.fromkeys(self.runners)
        self.files = {name: folder / str(entry.get("file") or "") for name, entry in manifest["components"].items()}
        self.export_format = manifest.get("export_format")
        self.config = self.generation_config = None  # set by the own-process gate (`_own_process`)

    def export_dtype(self) -> str:
        return next(iter(self.runners.values())).metadata.export_dtype or "float32"


def _forward_reference(model, inputs: dict, prepared: bool = False) -> dict:
    """The eager model's outputs on a forward probe, and what the artifact is fed. `prepared`: the engine's input
    preparers changed the traced inputs (the report's `prepared_inputs`), so the artifact is fed the probe's inputs
    prepared the same way; the eager model takes them as they are."""
    import torch

    with torch.no_grad():
        eager = model(**copy.deepcopy(inputs))
    return {"component": "model", "shapes": shapes_of(inputs), "eager": eager, "mask": mask_of(inputs),
            "fed": traced_inputs(model, inputs) if prepared else inputs}


def _generation_references(layout, model, plan, inputs: dict) -> list[dict]:
    """Decompose `generate` on the probe prompt (as the export did), and run every component's eager twin on the
    kwargs it received. Cache layers behave as the export traced them (`traced_cache_layout`: a sliding-window
    layer holds every token), for the capture, the eager twin and the cache length alike."""
    import torch

    with traced_cache_layout(), torch.no_grad():  # the engine's stages, and a VLM's image encoder and embedding merge
        stages = generation_stages(model, copy.deepcopy(inputs), generation_config=plan.generation_config,
                                   multi_token_decode=plan.multi_token_decode)
        cases = []
        for name, (submodel, subinputs) in stages.items():
            component = name
            if name == "prefill" and plan.single_graph:
                # The decode runs the prompt too, on an empty cache: compared with the eager prefill on the same prompt.
                component, subinputs = "decode", on_empty_cache(subinputs, model)
            if component not in layout.components:
                continue
            subinputs = _with_full_mask(layout.runners[component], subinputs)
            eager = submodel(**copy.deepcopy(subinputs))
            fed = copy.deepcopy(subinputs)
            planned = plan.components.get(component)
            if planned is not None and planned.prepared_inputs:
                # the engine's input preparers computed some of this component's inputs at export (the report's
                # `prepared_inputs`: a NaViT encoder's window index from `target_sizes`): computed again from the probe's
                fed = traced_inputs(submodel, fed)
            cases.append({"component": component, "name": component if component == name else
                          f"{component} (the prompt, on an empty cache)", "shapes": shapes_of(subinputs),
                          "eager": eager, "fed": fed, "mask": mask_of(subinputs)})
    return cases


def _compare_case(exported, case: dict, thresholds: dict) -> dict:
    """One reference case run through the artifact: its entry (`outputs`, or the backend's `error`)."""
    from hfexport.generate import as_traced

    entry = {"component": case["name"], "shapes": case["shapes"]} if "name" in case else {}
    if isinstance(exported, _Answers):  # run in the artifact's own process (`_own_process`)
        return {**entry, "outputs": {}, **exported.cases[id(case)]}
    runner = exported.runners[case["component"]]
    if "name" in case and _is_stateful(runner):
        return {**entry, "skipped": STATE_SKIPPED, "outputs": {}}
    try:
        if "name" in case:  # a generation component
            got = runner(**as_traced(runner, _traced(runner, copy.deepcopy(case["fed"]))))
        else:
            got = exported(**case["fed"])
    except Exception as error:  # noqa: BLE001 - the backend rejecting a probe is a parity failure, not a crash
        return {**entry, "error": backend_message(error), "outputs": {}}
    return {**entry, "outputs": compare_outputs(got, case["eager"], thresholds, case["mask"])}


#: A generation probe's entry on a component whose cache is kept in its runtime's state (an OpenVINO stateful decode)
STATE_SKIPPED = "its cache lives in the OpenVINO infer request: checked by greedy generation"


def _with_full_mask(runner, inputs: dict) -> dict:
    """`generate` leaves out an attention_mask of all ones (an unpadded batch of 1); a graph traced with one still
    takes it. Both sides then get the explicit all-ones mask over cache + new tokens (the same computation)."""
    import torch

    ids = inputs.get("input_ids")
    if ids is None and inputs.get("inputs_embeds") is not None:  # a multimodal language model: its prompt's rows
        ids = inputs["inputs_embeds"][..., 0]
    traced = runner.metadata.kwargs.get("attention_mask")
    if traced is None or traced.get("container") == "NoneType" or inputs.get("attention_mask") is not None or ids is None:
        return inputs  # (a graph traced with attention_mask=None, Mamba's decode, takes no mask)
    if runner.metadata.kwargs["attention_mask"].get("rank", 2) != 2:
        return inputs  # a 4-D (static cache) mask is built by generate, never left out
    cache = inputs.get("past_key_values")
    past = int(cache.get_seq_length()) if cache is not None and hasattr(cache, "get_seq_length") else 0
    return {**inputs, "attention_mask": torch.ones(ids.shape[0], past + ids.shape[1], dtype=torch.long)}


def _is_stateful(runner) -> bool:
    """An OpenVINO request holding state (a decode whose cache became internal variables): it cannot be fed a
    captured cache, so `hfexport.generate` (which seeds that state) checks it."""
    request = getattr(runner, "request", None)
    return request is not None and hasattr(request, "query_state") and bool(list(request.query_state()))


def _finish(probe: dict) -> dict:
    if probe.get("skipped"):
        probe["passed"] = True
        return probe
    probe["passed"] = not probe.get("error") and bool(probe.get("outputs")) and all(
        entry["passed"] for entry in probe["outputs"].values())
    return probe


def check_generation(exported, model, plan, processor=None, max_new_tokens: int = DEFAULT_MAX_NEW_TOKENS,
                     min_token_agreement: float = EXACT_TOKEN_AGREEMENT) -> dict:
    """Greedy decoding over the exported graphs vs `model.generate(do_sample=False)` on the sample prompts."""
    return _compare_generation(exported, _generation_reference(model, plan, max_new_tokens), processor,
                               min_token_agreement)


def _generation_reference(model, plan, max_new_tokens: int) -> dict:
    """`model.generate(do_sample=False)`'s sequences on the sample prompts, and what the exported side is given."""
    import torch

    inputs = plan.inputs
    reference: dict[str, Any] = {"result": {"max_new_tokens": max_new_tokens}}
    input_ids = inputs.get("input_ids")
    input_features = inputs.get("input_features")  # speech encoder-decoders (Whisper) generate from audio
    if input_ids is None and input_features is None:
        reference["error"] = "the sample inputs have no input_ids (or input_features) to generate from"
        return reference
    attention_mask = inputs.get("attention_mask")
    generation_config = copy.deepcopy(plan.generation_config or model.generation_config)
    generation_config.do_sample, generation_config.num_beams = False, 1
    generation_config.max_new_tokens, generation_config.min_new_tokens = max_new_tokens, None
    eos = generation_config.eos_token_id
    prompts = input_ids if input_ids is not None else input_features
    reference["result"].update(prompts=int(prompts.shape[0]), eos_token_id=eos)
    extra = {key: value for key, value in inputs.items() if key not in ("input_ids", "attention_mask")}
    with torch.no_grad():
        given = {key: value for key, value in (("input_ids", input_ids), ("attention_mask", attention_mask))
                 if value is not None}  # Whisper's generate takes input_features alone
        eager = model.generate(**given, generation_config=generation_config, **extra)
    reference.update(eager=eager, input_ids=input_ids, attention_mask=attention_mask,
                     generation_config=generation_config, extra=extra,
                     is_encoder_decoder=bool(getattr(model.config, "is_encoder_decoder", False)))
    return reference


def _compare_generation(exported, reference: dict, processor, min_token_agreement: float) -> dict:
    """Greedy decoding over the exported graphs against `reference` (`_generation_reference`)."""
    import torch

    from hfexport.generate import generate, prompt_input_names

    result: dict[str, Any] = {**reference["result"], "min_token_agreement": min_token_agreement}
    if "error" in reference:
        result.update(passed=False, error=reference["error"])
        return result
    extra, input_ids, generation_config = reference["extra"], reference["input_ids"], reference["generation_config"]
    eos = generation_config.eos_token_id
    model_inputs = {key: extra[key] for key in ("input_features", "decoder_input_ids",
                                                *prompt_input_names(exported))
                    if key in extra}  # a VLM's images (pixel_values, ...) and rope inputs (mm_token_type_ids, ...)
    try:
        if isinstance(exported, _Answers):  # decoded in the artifact's own process (`_own_process`)
            if "error" in exported.generation:
                result.update(passed=False, error=exported.generation["error"])
                return result
            got = torch.tensor(exported.generation["sequences"], dtype=torch.long)
        else:
            got = generate(exported, input_ids, attention_mask=reference["attention_mask"],
                           generation_config=generation_config, **model_inputs)
    except Exception as error:  # noqa: BLE001 - the exported graphs failing to decode is a parity failure
        result.update(passed=False, error=backend_message(error))
        return result
    if reference["is_encoder_decoder"]:
        # An encoder-decoder returns decoder sequences: the generated tokens follow its decoder prompt.
        from hfexport.generate import decoder_prompt

        decoder_ids = model_inputs.get("decoder_input_ids")
        length = decoder_ids.shape[1] if decoder_ids is not None else len(decoder_prompt(exported, generation_config))
        input_ids = got[:, :length]
    prompt = input_ids.shape[1]
    eager_new, got_new = _new_tokens(reference["eager"], input_ids), _new_tokens(got, input_ids)
    eos_ids = set(eos if isinstance(eos, list) else [eos] if eos is not None else [])
    matched = total = 0
    first = None
    for row in range(input_ids.shape[0]):
        want, have = _until_eos(eager_new[row], eos_ids), _until_eos(got_new[row], eos_ids)
        agree = 0
        while agree < min(len(want), len(have)) and want[agree] == have[agree]:
            agree += 1
        matched += agree
        total += max(len(want), len(have))
        if first is None and (agree < len(want) or agree < len(have)):
            first = {"prompt": row, "position": agree,
                     "eager_token": want[agree] if agree < len(want) else None,
                     "exported_token": have[agree] if agree < len(have) else None}
            tokenizer = getattr(processor, "tokenizer", processor)
            if tokenizer is not None and hasattr(tokenizer, "decode"):
                for side in ("eager", "exported"):
                    token = first[f"{side}_token"]
                    first[f"{side}_text"] = None if token is None else tokenizer.decode([token])
    agreement = matched / total if total else 1.0
    result.update(prompt_length=int(prompt), token_agreement=agreement, first_divergence=first,
                  passed=agreement >= min_token_agreement)
    return result


def _new_tokens(sequences, prompt) -> list[list[int]]:
    """The generated tokens of each row (the prompt stripped when the sequences start with it)."""
    import torch

    sequences = torch.as_tensor(sequences)
    length = prompt.shape[1]
    if sequences.shape[1] >= length and torch.equal(sequences[:, :length].to(prompt.device), prompt):
        sequences = sequences[:, length:]
    return [[int(token) for token in row] for row in sequences]


def _until_eos(tokens: list[int], eos_ids: set) -> list[int]:
    for index, token in enumerate(tokens):
        if token in eos_ids:
            return tokens[: index + 1]
    return tokens


def _load(folder: Path, export_format: str, precision: str | None, lean: bool = False):
    """The artifact reloaded from disk as a user gets it (`hfexport.load`), at `precision` where the format has a
    runtime precision. OpenVINO is compiled for the CPU explicitly, so the precision it picked can be read back
    (AUTO does not expose it). `lean`: the weights left memory-mapped, not copied by the runtime (the format's
    `lean_load_options`), for a gate that released the model to save memory; else, and for a format whose runtime
    copies what it maps whatever it is told (`FormatProgram.repacks_mapped_weights`: OpenVINO's CPU plugin), the
    artifact's files' pages the runtime mapped are handed back as it loads (`dropping_mapped_folder`: read again
    where it reads them again)."""
    from hfexport.exported import ExportedModel

    options = dict(format_traits(export_format).verify_load_options)
    program = format_program(export_format)
    if lean and not program.repacks_mapped_weights:
        options.update(program.lean_load_options())
        return ExportedModel.from_pretrained(Path(folder), precision=precision or "auto", **options)
    with dropping_mapped_folder(Path(folder)):  # the runtime copies the weights it mapped (OpenVINO's CPU plugin)
        return ExportedModel.from_pretrained(Path(folder), precision=precision or "auto", **options)


def _dropping_read_again(folder, export_format):
    """Around the comparison of a format whose runtime repacked the weights it mapped (OpenVINO): the pages of the
    artifact's files it reads again as it runs (the embedding rows its Gather reads from the mapped `.bin`) handed
    back as they come (`dropping_mapped_folder`); nothing for another format (ONNX Runtime's lean session computes
    from its mapping)."""
    if format_program(str(export_format)).repacks_mapped_weights:
        return dropping_mapped_folder(Path(folder))
    return contextlib.nullcontext()


def _references(layout, model, plan, probes: list[dict], refs, representative: dict | None) -> dict:
    """The eager pass: the model's outputs on every probe (and, for generation targets, `model.generate`'s tokens),
    with what the artifact is to be fed; `layout`: the artifact's components and traced metadata (`_Layout`).

    `representative`, for quantized targets, is the quality probe on real inputs (role "quality"); the shape probes
    (role "shape") are then judged by shapes and finite values only (`SHAPE_ONLY`, in `_compare`)."""
    generation = plan.target.mode == "generation"
    runs = [(probe, "shape" if representative is not None else None) for probe in probes]
    if representative is not None:
        runs.append((representative, "quality"))
    cases = []
    for probe, role in runs:
        started = time.perf_counter()
        inputs = probe.get("inputs") or keep_image_tokens(resize_inputs(plan.inputs, refs, probe["dims"]),
                                                          plan.inputs, image_token_id(model.config))
        base = {"name": probe.get("name") or probe_label(probe["dims"]), "dims": probe["dims"],
                **({"capped": probe["capped"]} if probe.get("capped") else {}), **({"role": role} if role else {})}
        entries, error = [], None
        if generation:
            try:
                entries = _generation_references(layout, model, plan, inputs)
            except Exception as failure:  # noqa: BLE001 - the eager side could not build this probe
                error = backend_message(failure)
        else:
            entries = [_forward_reference(model, inputs, prepared=bool(plan.components["model"].prepared_inputs))]
        cases.append({"base": base, "entries": entries, "error": error, "seconds": time.perf_counter() - started})
    generation_reference = None
    if generation:
        started = time.perf_counter()
        generation_reference = _generation_reference(model, plan, resolve(plan.target).max_new_tokens)
        generation_reference["seconds"] = time.perf_counter() - started
    return {"cases": cases, "generation": generation_reference}


def _compare(exported, plan, processor, references: dict, resolved: Thresholds, on_probe=None) -> dict:
    """Every probe (and, for generation targets, greedy decoding) of one loaded artifact against the eager pass's
    `references` (`_references`), judged by `resolved`."""
    thresholds = resolved.tolerances
    results: list[dict] = []
    for case in references["cases"]:
        started = time.perf_counter()
        base, entries = case["base"], case["entries"]
        probe_thresholds = SHAPE_ONLY if base.get("role") == "shape" else thresholds
        error = case["error"]
        if plan.target.mode == "generation" and error is None:
            try:
                with traced_cache_layout():
                    entries = [_compare_case(exported, entry, probe_thresholds) for entry in entries]
            except Exception as failure:  # noqa: BLE001 - as when the eager side could not build this probe
                error = backend_message(failure)
        if error is not None:
            entries = [{"component": None, "error": f"could not capture the probe's stage inputs: {error}",
                        "outputs": {}}]
        elif plan.target.mode != "generation":
            entries = [{"component": "model", "shapes": entries[0]["shapes"],
                        **_compare_case(exported, entries[0], probe_thresholds)}]
        elsewhere = sum(entry.pop("seconds", 0.0) for entry in entries)  # the artifact's own process's time
        seconds = (case["seconds"] + elsewhere + time.perf_counter() - started) / max(len(entries), 1)
        for entry in entries:
            results.append(_finish({**base, **entry, "seconds": round(seconds, 4)}))
            if on_probe is not None:
                on_probe(results[-1])
    generation_result = None
    if references["generation"] is not None:
        started = time.perf_counter()
        generation_result = _compare_generation(exported, references["generation"], processor,
                                                resolved.min_token_agreement)
        if on_probe is not None:
            elsewhere = exported.generation.get("seconds", 0.0) if isinstance(exported, _Answers) else 0.0
            on_probe({"name": "greedy generation", "passed": generation_result["passed"],
                      "seconds": round(references["generation"]["seconds"] + elsewhere + time.perf_counter() - started,
                                       4)})
    failures = [_failure_line(probe) for probe in results if not probe["passed"]]
    if generation_result is not None and not generation_result["passed"]:
        failures.append(_generation_failure_line(generation_result))
    return {"passed": not failures, "thresholds": thresholds, "probes": results, "generation": generation_result,
            "failures": failures}


# ── The artifact's side in a process of its own (ONNX, OpenVINO) ─────────────
#
# A process that imports torch holds ~440 MB of libraries (SmolLM2-135M's bound: those libraries + its f32 weights),
# and the exporting process also keeps what the export left on its heap; so where it can, the gate runs the artifact
# in `python -m hfexport.verify.artifact`, without torch, on the references the eager pass computed here (the
# format's pieces of that process: `hfexport.formats.<format>.gate_process`), and the verification dict is assembled
# here from its answers with the same code (`_compare`, `_runtime_precision_check`).


class _Answers:
    """What the artifact's own process answered for one check (`hfexport.verify.artifact`: the graph's, or an
    OpenVINO runtime precision's), in place of a loaded artifact for `_compare`: per reference case (by `id`) its
    compared `outputs`, `error` or `skipped` entry, the greedy `generation`'s sequences or error, and what
    `read_back` reads of a loaded one."""

    def __init__(self, layout: _Layout, check: dict, cases: dict, skipped: dict):
        self.runners, self.components = layout.runners, layout.components
        self.cases = {key: check["cases"][index] for key, index in cases.items()} if "cases" in check else {}
        self.cases.update(skipped)
        self.generation = check.get("generation") or {}
        self.read = {"backend": format_traits(str(layout.export_format)).runtime_package,
                     "components": check["components"], "precision": joined_precision(check["components"])}
        self.load_s = float(check.get("load_s") or 0.0)
        self.peak_rss_mb: float | None = None  # that process's own peak
        self.parent_rss_mb: float | None = None  # the caller's resident set while that process ran


def artifact_process_refusal(folder: str | Path, plan, config) -> str | None:
    """Why the gate's artifact side of `plan` (saved in `folder`, of a model whose config is `config`) is checked in
    the exporting process (None: in `hfexport.verify.artifact`, a process of its own, where the gate opens the
    artifact lean and its greedy check is a plain loop, `verify_exported`): `_layout_refusal`, the one rule, read
    before the eager reference is made (`hfexport.job.structure.load_reference`: the streamed reference then keeps
    no converted weights between forwards, the exporting process running no more than the eager side)."""
    try:
        layout = _Layout(Path(folder))
    except Exception:  # noqa: BLE001 - a manifest that does not read: the gate loads it in process and says why
        return "its manifest does not read"
    layout.config, layout.generation_config = config, _saved_generation_config(Path(folder))
    return _layout_refusal(layout, plan)


def _own_process_refusal(layout: _Layout | None, plan, references: dict) -> str | None:
    """Why the artifact of `plan` is checked in process (None: it can run in `hfexport.verify.artifact`):
    `_layout_refusal`, or a greedy check that is not a plain greedy loop (`_greedy`)."""
    from hfexport.generate import generation_layout

    refusal = _layout_refusal(layout, plan)
    if refusal is not None:
        return refusal
    reference = references["generation"]
    if reference is not None and "error" not in reference and \
            _greedy(layout, generation_layout(layout), reference) is None:
        return "its greedy check is not a plain greedy loop (logits processors, other stopping criteria, inputs)"
    return None


def _layout_refusal(layout: _Layout | None, plan) -> str | None:
    """The rule: a generation target (not quantized) of a format whose gate runs apart (`gate_in_own_process`: ONNX,
    OpenVINO), its graphs on the CPU (ONNX Runtime's CPU provider; OpenVINO's gate compiles for the CPU), of a
    decoder-only model over a DynamicCache, whose prompt runs on the prefill without a cache or on a single graph's
    decode (what the child's loop is); of a format that can keep the cache as state (`cache_state_option`), a
    single decode that keeps it so (its probes skipped, as in process: checked by greedy generation); None where
    it is one."""
    from hfexport.formats.onnx.file_runner import runs_here
    from hfexport.generate import CACHE, generation_layout

    target = plan.target
    traits = format_traits(str(target.export_format)) if layout is not None else None
    if traits is None or not traits.gate_in_own_process or target.mode != "generation" or target.quantization:
        return "not a generation target of a format whose gate runs apart (ONNX, OpenVINO)"
    if not runs_here(traits.verify_load_options.get("device")) or \
            not all(path.is_file() for path in layout.files.values()):
        return "not files its runtime runs on the CPU"
    try:
        generation = generation_layout(layout)
    except Exception as error:  # noqa: BLE001 - the in-process check reports it as a user sees it
        return f"its generation layout: {error}"
    if generation.seq2seq or generation.multimodal or generation.prefill_by_decode or generation.llm_program or \
            generation.static_cache_len is not None or generation.cache_kwarg != CACHE or any(generation.stateful.values()) \
            or (not generation.single_graph and CACHE in layout.runners[generation.prefill].metadata.kwargs):
        return "not a decoder over a DynamicCache"
    if traits.cache_state_option and not (generation.single_graph and all(_state_kept(layout).values())):
        return "not a single decode that keeps its cache as state"
    return None


def _state_kept(layout: _Layout) -> dict[str, bool]:
    """Per component, whether it was exported with its cache kept as its runtime's state (the format's
    `cache_state_option`, OpenVINO's `stateful`), read from its traced metadata: what `_is_stateful` reads of a
    loaded runner."""
    option = format_traits(str(layout.export_format)).cache_state_option
    return {name: bool(option and (runner.metadata.export_config or {}).get(option))
            for name, runner in layout.runners.items()}


def _greedy(layout: _Layout, generation, reference: dict) -> dict | None:
    """The child's greedy loop (`hfexport.generate.plain_greedy`) for the reference's prompts; None where `generate`
    would do more than that loop."""
    from hfexport.generate import plain_greedy

    if reference["extra"] or reference["is_encoder_decoder"]:
        return None
    return plain_greedy(layout, generation, reference["generation_config"], reference["input_ids"],
                        reference["attention_mask"])


def _out_paths(metadata) -> list[str]:
    """The leaf paths (`get_leaf_tensors`' names) of a component's flat graph outputs, in order, as the runner's
    `unflatten` rebuilds them: read from the traced output spec with a placeholder per output."""
    import torch
    from transformers.exporters import ModelRunner
    from transformers.exporters.utils import get_leaf_tensors

    class Spec(ModelRunner):  # the engine's runner for its output spec alone (`unflatten`), running nothing
        device = None

        @classmethod
        def from_program(cls, program, metadata, device=None):
            raise NotImplementedError

        def __call__(self, share_inputs: bool = True, share_outputs: bool = False, **kwargs):
            raise NotImplementedError

    spec = Spec(metadata)
    count = spec.out_spec.num_leaves - len(spec.out_constants)
    rebuilt = spec.unflatten([torch.tensor(index) for index in range(count)])
    paths = [None] * count
    for path, tensor in get_leaf_tensors(rebuilt).items():
        if tensor.dim() == 0 and tensor.dtype == torch.int64 and 0 <= int(tensor) < count and paths[int(tensor)] is None:
            paths[int(tensor)] = path
    if any(path is None for path in paths) or len(get_leaf_tensors(rebuilt)) != count:
        raise ValueError("an output spec whose leaves are not one a graph output")
    return paths


def _own_process(folder: Path, layout: _Layout, plan, references: dict, resolved: Thresholds, dtype: str,
                 pinned: str | None) -> list[_Answers] | dict | None:
    """The artifact's side run in `python -m hfexport.verify.artifact` (spawned: a new process image, which holds
    none of this one's memory) on `references`: its `_Answers`, one per check (the graph's; for a format with a
    runtime precision, `pinned`'s too where that process ran it: `_runtime_precision_check`); None where it cannot
    run there (the caller loads the artifact in process); a failed verification dict where the process died
    without answering."""
    import subprocess
    import sys
    import tempfile

    import numpy
    from transformers.exporters.utils import get_leaf_tensors

    from hfexport.generate import as_traced, generation_layout

    arrays: dict[str, Any] = {}

    def put(value) -> str:
        key = f"a{len(arrays)}"
        arrays[key] = numpy.ascontiguousarray(as_array(value))
        return key

    try:
        out_paths = {name: _out_paths(runner.metadata) for name, runner in layout.runners.items()}
    except Exception:  # noqa: BLE001 - an output spec this gate does not map: in process
        return None
    state = _state_kept(layout)
    cases, index, skipped = [], {}, {}
    for case in references["cases"]:
        if case["error"] is not None:
            continue
        thresholds = SHAPE_ONLY if case["base"].get("role") == "shape" else resolved.tolerances
        for entry in case["entries"]:
            if state[entry["component"]]:  # as in process: its cache is the request's state (`_compare_case`)
                skipped[id(entry)] = {"skipped": STATE_SKIPPED}
                # never compared, here or there: its eager outputs and inputs (SmolLM2's batch-8 prompt logits
                # alone 58 MB) released before that process spawns, not held beside it
                entry["eager"] = entry["fed"] = None
                continue
            runner = layout.runners[entry["component"]]
            fed = as_traced(runner, _traced(runner, entry["fed"]))
            index[id(entry)] = len(cases)
            cases.append({"component": entry["component"], "kwargs": list(fed),
                          "fed": {path: put(tensor) for path, tensor in get_leaf_tensors(fed).items()},
                          "eager": {path: put(tensor) for path, tensor in get_leaf_tensors(entry["eager"]).items()},
                          "mask": put(entry["mask"]) if entry["mask"] is not None else None,
                          "thresholds": thresholds})
    generation = None
    reference = references["generation"]
    if reference is not None and "error" not in reference:
        spec = _greedy(layout, generation_layout(layout), reference)
        generation = {**spec, "input_ids": put(spec["input_ids"]), "attention_mask": put(spec["attention_mask"]),
                      "initial_cache": {path: put(tensor) for path, tensor in spec["initial_cache"].items()}}
    # the graph's check (OpenVINO at f32, `_load`; an ONNX graph at its own types), then the runtime's precision
    checks = [{"precision": "f32"}, {"precision": pinned}] if pinned is not None else \
        [{"precision": "f16" if dtype == "float16" else "f32"}]
    request = {"format": str(layout.export_format), "folder": str(folder), "checks": checks,
               "components": {name: {"path": str(path), "out_paths": out_paths[name]}
                              for name, path in layout.files.items()},
               "cases": cases, "generation": generation}
    label = format_traits(str(layout.export_format)).runtime_label
    with tempfile.TemporaryDirectory(prefix="hfexport-gate-") as work:
        work = Path(work)
        numpy.savez(work / artifact.ARRAYS, **arrays)
        arrays.clear()
        (work / artifact.REQUEST).write_text(json.dumps(request))
        package = str(Path(artifact.__file__).resolve().parents[2])
        env = {**os.environ, "PYTHONPATH": os.pathsep.join([package, *filter(None, [os.environ.get("PYTHONPATH")])])}
        beside = current_rss()  # what this process holds while the artifact's runs (the stage counts both)
        done = subprocess.run([sys.executable, "-m", "hfexport.verify.artifact", str(work)], env=env,
                              capture_output=True, text=True, check=False)
        answer = work / artifact.RESULT
        result = json.loads(answer.read_text()) if done.returncode == 0 and answer.is_file() else None
    if result is None or "crash" in result:
        why = result["crash"] if result else f"exit status {done.returncode}: " + " ".join(
            line.strip() for line in done.stderr.strip().splitlines()[-3:])
        return _process_failed(f"the artifact's runtime process ({label}, python -m hfexport.verify.artifact) "
                               f"failed: {why}")
    if "fallback" in result and skipped:  # a decode the manifest says keeps its cache as state, which keeps none
        return _process_failed(f"the artifact's runtime process ({label}) cannot check it: {result['fallback']}")
    if "fallback" in result or "load_error" in result:
        return None  # (a load error: the runtime's own message in process, where the skipped entries stay skipped)
    answers = [_Answers(layout, check, index, skipped) for check in result["checks"]]
    answers[0].peak_rss_mb = result.get("peak_rss_mb")
    answers[0].parent_rss_mb = round(beside / (1 << 20), 1)
    return answers


def _process_failed(message: str) -> dict:
    """The failed verification of an artifact its own process could not check: `message` (redacted, cut to 800
    characters) its one failure line."""
    message = redact(message)[:800]
    return {"passed": False, "reloaded_from_disk": True, "error": message, "probes": [], "failures": [message]}


def verify_exported(folder: str | Path, model, plan, processor=None, progress: ProgressCallback | None = None,
                    release=None, lean: bool | None = None, own_process: bool | None = None) -> dict:
    """Reload `folder` from disk and check it against `model` on probes of `plan`; the report's verification dict.

    The eager model runs first, on every probe and the generation check (`_references`), reading the artifact's
    layout from its manifest; then `release()` (where given) lets the caller drop its own reference to the model,
    this function drops its own, and only then is the artifact loaded and compared: the model and the artifact's
    runtime are never in memory together, where the caller releases the model (issue 45); the artifact is then opened
    with its weights left memory-mapped where the runtime would copy them (`_load`'s `lean`: ONNX Runtime's
    prepacking off; `lean`: whether to, by default where `release` is given).

    Where the format has a runtime precision (OpenVINO), the graph is checked at float32 against the strict
    thresholds, and then at the precision a user of `hfexport.load` gets on this machine (the recipe's
    `runtime.precision`, else the device default, read back from the compiled model) against thresholds for that
    precision (a recipe pinning f32: the graph check's compiled model read back, not compiled a second time); the
    target passes when both do. `verification["runtime"]` names the CPU, backend, device and precision of each
    check. `progress` gets a `probe` step as each probe (and the generation check) ends. `own_process` (by default
    where the artifact is opened lean): an ONNX or OpenVINO generation target's artifact side (OpenVINO's runtime
    precision check too) runs in a torch-free process of its own where `_own_process_refusal` allows it
    (`runtime.process` "separate"; its rule read before the reference is made too: `artifact_process_refusal`),
    else here."""
    import torch

    started = time.perf_counter()
    target = plan.target
    parity = target.parity or {}
    if parity.get("skip"):
        return {"passed": True, "skipped": True, "reason": "parity.skip is set in the recipe", "probes": [],
                "failures": [], "seconds": 0.0}
    export_format = str(target.export_format)
    pinned = pinned_precision(target.runtime)
    has_precision = has_runtime_precision(export_format)
    exported = None
    try:
        layout = _Layout(Path(folder))
    except Exception:  # noqa: BLE001 - a manifest that does not read: the backend's load says why, as a user sees it
        layout = None
    if layout is None:
        try:
            layout = exported = _load(Path(folder), export_format, "f32" if has_precision else pinned)
        except Exception as error:  # noqa: BLE001 - an artifact that does not load back fails verification
            return _not_loaded(folder, error, started)
    dtype = layout.export_dtype() if exported is None else \
        next(iter(exported.components.values())).metadata.export_dtype or "float32"
    generation = target.mode == "generation"
    config = model.config
    probes, cost_bound = plan_probes(plan, config, reserve=4 if generation else 0)
    refs, _ = probe_axes(plan)
    representative = representative_probe(plan, processor) if target.quantization else None
    model_dtype = str(getattr(model, "dtype", "float32")).removeprefix("torch.")
    was_training = model.training
    model.eval()
    try:
        references = _references(layout, model, plan, probes, refs, representative)
    finally:
        model.train(was_training)
    lean = release is not None if lean is None else lean
    separate = (lean if own_process is None else own_process) and exported is None
    if separate:
        layout.config, layout.generation_config = config, _saved_generation_config(Path(folder))
        separate = _own_process_refusal(layout, plan, references) is None
    kept = layout if separate else None
    del model, layout
    if release is not None:
        release()
    load_started = time.perf_counter()
    answers = None
    if separate:
        answers = _own_process(Path(folder), kept, plan, references,
                               resolve(target, dtype, "f32" if has_precision else _graph_precision(dtype, model_dtype)),
                               dtype, pinned if has_precision else None)
        if isinstance(answers, dict):  # the process died without answering
            return {**answers, "seconds": round(time.perf_counter() - started, 4)}
    if answers is not None:
        exported = answers[0]
    elif exported is None:
        try:
            exported = _load(Path(folder), export_format, "f32" if has_precision else pinned, lean=lean)
        except Exception as error:  # noqa: BLE001 - an artifact that does not load back fails verification
            return _not_loaded(folder, error, started)
    reload_s = exported.load_s if answers is not None else time.perf_counter() - load_started
    runtime: dict[str, Any] = {"cpu": cpu_info(), "checks": []}
    if answers is not None:
        runtime.update(process="separate", **({"process_peak_rss_mb": exported.peak_rss_mb,
                                               "process_parent_rss_mb": exported.parent_rss_mb}
                                              if exported.peak_rss_mb is not None else {}))
    graph_read = exported.read if answers is not None else read_back(exported)
    graph_precision = graph_read["precision"] if has_precision else _graph_precision(dtype, model_dtype)
    with _dropping_read_again(folder, export_format):
        graph = _compare(exported, plan, processor, references, resolve(target, dtype, graph_precision),
                         on_probe=_probe_steps(progress, target.name, f"at {graph_precision}: " if has_precision else
                                               ""))
    runtime["backend"] = graph_read["backend"]
    runtime["checks"].append({"name": "graph" if has_precision else "runtime", "requested": "f32" if
                              has_precision else pinned, "precision": graph_read["precision"] or "unknown",
                              "components": graph_read["components"], "passed": graph["passed"]})
    del exported
    runtime_check = None
    if has_precision:
        check, runtime_check = _runtime_precision_check(folder, plan, processor, references, dtype, pinned, graph_read,
                                                        progress, answers[1:] if answers is not None else None)
        runtime["checks"].append(check)
    user = runtime["checks"][-1]
    runtime.update(precision=user["precision"], requested=pinned, device=_device_of(user.get("components") or {}))
    failures = list(graph["failures"])
    if runtime_check is not None:
        precision = runtime["precision"]
        failures += [f"at {precision} ({_why(pinned)}): {line}" for line in runtime_check["failures"]]
    result = {
        "passed": not failures,
        "reloaded_from_disk": True,
        "export_dtype": dtype,
        "thresholds": graph["thresholds"],
        "cost_bound": cost_bound,
        "probes": graph["probes"],
        "generation": graph["generation"],
        "runtime": runtime,
        "failures": failures,
        "reload_s": round(reload_s, 4),
        "seconds": round(time.perf_counter() - started, 4),
        "torch_threads": torch.get_num_threads(),
    }
    if representative is not None:
        result["representative"] = {"source": representative["source"], "real_text": representative["real_text"]}
    if runtime_check is not None:
        result["runtime_check"] = runtime_check
    return result


def _saved_generation_config(folder: Path):
    """The artifact's `generation_config.json` as `ExportedModel.from_pretrained` reads it (None without one)."""
    from transformers import GenerationConfig

    if not (folder / "generation_config.json").is_file():
        return None
    return GenerationConfig.from_pretrained(folder)


def _not_loaded(folder, error: BaseException, started: float) -> dict:
    """The verification of an artifact that does not load back: failed, with the backend's words."""
    message = f"the artifact does not load back from {Path(folder).name}: {backend_message(error)}"
    return {"passed": False, "reloaded_from_disk": True, "error": message, "probes": [], "failures": [message],
            "seconds": round(time.perf_counter() - started, 4)}


def _graph_precision(dtype: str, model_dtype: str) -> str:
    """The precision a graph without a runtime precision is judged at: "f16" for a float16 graph of a wider model
    (a target converted to float16, `hfexport.formats.onnx.float16`: it computes in float16 against the float32 model,
    so it is judged as OpenVINO at f16 is, by direction, decisions and the f16 token agreement floor); else "f32" (a
    float16 checkpoint's graph is compared with the float16 model itself). `model_dtype`: the model's, "float32"."""
    return "f16" if dtype == "float16" and model_dtype != "float16" else "f32"


def _why(pinned: str) -> str:
    return "the recipe's runtime.precision" if pinned != "auto" else "the device's default precision on this CPU"


def _device_of(components: dict) -> str:
    devices = sorted({str(entry.get("device")) for entry in components.values() if entry.get("device")})
    return ",".join(devices) or "cpu"


def _runtime_precision_check(folder, plan, processor, references: dict, dtype: str, pinned: str, graph_read: dict,
                             progress: ProgressCallback | None = None,
                             answered: list | None = None) -> tuple[dict, dict | None]:
    """The artifact at the precision `hfexport.load` gives on this machine, judged by that precision's thresholds
    against the same eager references: (the check's entry in `runtime.checks`, the report's `runtime_check`).
    Identical to the graph check (and not run again, `runtime_check` None) where the runtime computes at f32 anyway;
    a recipe pinning the f32 the graph check ran at (`graph_read`, its compiled model's read-back) is not compiled a
    second time. `answered`: the artifact's own process ran it (`_own_process`: its `_Answers` after the graph's)."""
    target = plan.target
    if pinned == "f32" and graph_read["precision"] == "f32":
        return _same_as_graph(pinned, graph_read), None
    exported = answered[0] if answered else _load(Path(folder), str(target.export_format), pinned)
    try:
        read = exported.read if answered else read_back(exported)
        precision = read["precision"] or "unknown"
        if precision == "f32":
            return _same_as_graph(pinned, read), None
        check = {"name": "runtime", "requested": pinned, "precision": precision, "components": read["components"]}
        with _dropping_read_again(folder, target.export_format):
            result = _compare(exported, plan, processor, references, resolve(target, dtype, precision),
                              on_probe=_probe_steps(progress, target.name, f"at {precision}: "))
    finally:
        del exported
    check["passed"] = result["passed"]
    return check, {"precision": precision, "requested": pinned, **result}


def _same_as_graph(pinned: str, read: dict) -> dict:
    """The runtime check's entry where the runtime computes at f32, as the graph check did (`read`: a compiled
    model's read-back): that check covers it."""
    return {"name": "runtime", "requested": pinned, "precision": "f32", "components": read["components"],
            "passed": True, "same_as": "graph"}


def _probe_steps(progress: ProgressCallback | None, target: str, stage: str):
    """`on_probe(probe)` for `_run_checks`: one `probe` progress step per finished probe (None without progress)."""
    if progress is None:
        return None

    def on_probe(probe: dict) -> None:
        where = probe["name"] + (f" [{probe['component']}]" if probe.get("component") not in (None, "model") else "")
        progress(Step("probe", "done" if probe["passed"] else "error", target, f"{stage}{where}", probe.get("seconds")))

    return on_probe


def _failure_line(probe: dict) -> str:
    where = f"probe {probe['name']}" + (f" [{probe['component']}]" if probe.get("component") not in (None, "model") else "")
    if probe.get("error"):
        return f"{where}: the artifact rejected the input: {probe['error']}"
    bad = [(name, entry) for name, entry in probe["outputs"].items() if not entry["passed"]]
    if not bad:
        return f"{where}: no outputs to compare"
    name, entry = bad[0]
    return f"{where}: {name}: {entry['failures'][0] if entry['failures'] else 'failed'}"


def _generation_failure_line(result: dict) -> str:
    if result.get("error"):
        return f"generation: {result['error']}"
    first = result.get("first_divergence") or {}
    return (f"generation: token agreement {result['token_agreement']:.3f} < {result['min_token_agreement']}; first "
            f"divergence at prompt {first.get('prompt')} position {first.get('position')}: eager "
            f"{first.get('eager_token')} vs exported {first.get('exported_token')}")


def summary(verification: dict | None) -> str:
    """One line: passed, skipped, or the first failure."""
    if not verification:
        return "not verified"
    if verification.get("skipped"):
        return "skipped (parity.skip)"
    if verification.get("passed"):
        count = len(verification.get("probes", []))
        return f"passed ({count} probe{'s' if count != 1 else ''})"
    failures = verification.get("failures") or [verification.get("error") or "failed"]
    more = f" (+{len(failures) - 1} more)" if len(failures) > 1 else ""
    return f"parity failed: {failures[0]}{more}"
