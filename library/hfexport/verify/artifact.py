"""The parity gate's artifact side in a process of its own, without torch (issue 45: a gate that fits).

A process that imports torch holds ~440 MB of libraries before any weight (SmolLM2-135M: the bound is those
libraries + the f32 weights), and the exporting process also keeps what the export left on its heap; ONNX Runtime
with NumPy costs ~55 MB, OpenVINO with its CPU plugin ~100 MB (tiny-llama's process: 105 MB at its peak). So `hfexport.verify.check` computes the eager references
first, releases the model, and hands the artifact's side to `python -m hfexport.verify.artifact FOLDER`, spawned (a
new process image, not a fork of the exporting one): `FOLDER/request.json` says what to run, `FOLDER/arrays.npz`
holds every input and eager output as NumPy arrays (read with `allow_pickle=False`), and the child writes
`FOLDER/result.json`. The format's own pieces are `hfexport.formats.<format>.gate_process` (its components: opened
at a precision, fed and answering by leaf path, `read` as `hfexport.machine.read_back` reports them); here:

- `checks`: per check the request lists (ONNX: one; OpenVINO: the graph at f32, then the runtime's precision, not
  compiled where it is the f32 already checked, nor run where it compiles to f32: `same_as_graph`), its components'
  read-back and, per probe entry, the artifact's outputs compared with the eager ones (`hfexport.verify.parity`,
  the same code as in process: `{"outputs": ...}`) or the backend's `error`, and `generation`: the greedy
  sequences over the exported graphs (`{"sequences": ...}` or `{"error": ...}`), the loop of
  `hfexport.generate.loop.sample_tokens` for a plain decoder without logits processors;
- or `fallback` (an artifact this process does not run: the caller runs it in process) / `load_error` (a component
  that does not open: the caller loads it in process for its own message).

The caller (`check.py`) assembles the verification dict from these with the in-process code, so it is the same.
Imports here stay torch-free (tests/test_verify_artifact_process.py checks it).
"""

from __future__ import annotations

import gc
import importlib
import json
import sys
import time
import traceback
from pathlib import Path

from hfexport.errors import redact
from hfexport.formats import format_traits
from hfexport.machine import joined_precision
from hfexport.verify.parity import compare_leaves

REQUEST, ARRAYS, RESULT = "request.json", "arrays.npz", "result.json"
_MESSAGE_CHARS = 600


def backend_message(error: BaseException) -> str:
    """The backend's own words: the error's first lines, following the cause chain, without tokens."""
    parts, current = [], error
    while current is not None and len(parts) < 3:
        text = " ".join(line.strip() for line in str(current).strip().splitlines()[:4] if line.strip())
        if not text and current.__traceback__ is not None:
            frame = traceback.extract_tb(current.__traceback__)[-1]
            text = f"(no message) at {Path(frame.filename).name}:{frame.lineno} in {frame.name}"
        parts.append(f"{type(current).__name__}: {text}".strip())
        current = current.__cause__ or current.__context__
    return redact(" <- ".join(parts))[:_MESSAGE_CHARS]


def format_module(export_format: str):
    """`hfexport.formats.<format>.gate_process`, the format's pieces of this process (its backend's
    `gate_in_own_process`)."""
    traits = format_traits(export_format)
    if not traits.gate_in_own_process:
        raise ValueError(f"{export_format} runs no gate in a process of its own")
    return importlib.import_module(f"hfexport.formats.{traits.name}.gate_process")


def run(folder: Path) -> dict:
    """The request in `folder` run: the result written to `result.json` (module docstring)."""
    import numpy

    request = json.loads((folder / REQUEST).read_text())
    arrays = numpy.load(folder / ARRAYS, allow_pickle=False)
    runtime = format_module(request["format"])
    artifact = Path(request["folder"])
    checks: list[dict] = []
    for index, check in enumerate(request["checks"]):
        if index and check["precision"] == "f32" and joined_precision(checks[0]["components"]) == "f32":
            break  # the f32 the graph check compiled and ran: not compiled again (`_runtime_precision_check`)
        components = {}
        started = time.perf_counter()
        try:
            with runtime.opening(artifact):
                for name, entry in request["components"].items():
                    components[name] = runtime.open_component(entry, check["precision"])
        except Exception as error:  # noqa: BLE001 - the caller loads it in process, for the message a user gets
            return {"load_error": backend_message(error)}
        for name, component in components.items():
            if component.unsupported:
                return {"fallback": f"{name}: {component.unsupported}"}
        result: dict = {"components": {name: component.read() for name, component in components.items()},
                        "load_s": round(time.perf_counter() - started, 4)}
        checks.append(result)
        if index and joined_precision(result["components"]) == "f32":
            result["same_as_graph"] = True  # the runtime computes at f32, as the graph check did
        else:
            with runtime.running(artifact):
                _run_check(result, components, request, arrays)
        components.clear()  # the compiled models released before the next check compiles its own
        gc.collect()
    return {"checks": checks}


def _run_check(result: dict, components: dict, request: dict, arrays) -> None:
    """Every probe entry of `request` and its greedy generation on the opened `components`, into `result`."""
    result["cases"] = []
    for case in request["cases"]:
        got, case_started = None, time.perf_counter()
        try:
            got = components[case["component"]]({path: arrays[key] for path, key in case["fed"].items()},
                                                case["kwargs"])
            eager = {path: arrays[key] for path, key in case["eager"].items()}
            mask = arrays[case["mask"]] if case.get("mask") else None
            result["cases"].append({"outputs": compare_leaves(got, eager, case["thresholds"], mask)})
        except Exception as error:  # noqa: BLE001 - the backend rejecting a probe is a parity failure
            result["cases"].append({"error": backend_message(error)})
        result["cases"][-1]["seconds"] = time.perf_counter() - case_started
        del got
    if request.get("generation") is not None:
        started = time.perf_counter()
        try:
            result["generation"] = {"sequences": _greedy(components, request["generation"], arrays).tolist()}
        except Exception as error:  # noqa: BLE001 - the exported graphs failing to decode is a parity failure
            result["generation"] = {"error": backend_message(error)}
        result["generation"]["seconds"] = time.perf_counter() - started


def _greedy(components: dict, spec: dict, arrays):
    """`hfexport.generate.loop.sample_tokens` for a decoder whose generation has no logits processors and stops at
    `max_length` or an EOS token (what the caller checked): the prompt on the prefill (or a single graph's decode on
    an empty cache), then one argmax token a step, finished rows padded, the cache carried between calls."""
    import numpy

    input_ids, mask = arrays[spec["input_ids"]], arrays[spec["attention_mask"]]
    batch = input_ids.shape[0]
    cache = {path: arrays[key] for path, key in spec["initial_cache"].items()}
    positions = numpy.where(mask == 0, 0, numpy.cumsum(mask, -1) - 1)
    eos, pad, pads = numpy.array(spec["eos"], dtype=numpy.int64), spec["pad"], spec["pads"]
    for component in components.values():
        component.reset()  # a stateful decode's cache back to empty (as `GenerationSession` starts it)

    def step(name: str, ids, mask, positions):
        feeds = spec["feeds"][name]
        leaves, kwargs = {"input_ids": ids}, ["input_ids"]
        if feeds["attention_mask"]:
            leaves["attention_mask"], kwargs = mask, [*kwargs, "attention_mask"]
        if feeds["position_ids"]:
            leaves["position_ids"], kwargs = positions, [*kwargs, "position_ids"]
        for key in feeds["zeros"]:
            leaves[key], kwargs = numpy.zeros_like(ids), [*kwargs, key]
        if feeds["cache"]:
            leaves.update(cache)
            kwargs = [*kwargs, "past_key_values"]
        outputs = components[name](leaves, kwargs)
        if feeds["cache"] or name == spec["prefill"]:
            cache.clear()
            cache.update({path: value for path, value in outputs.items() if path.startswith("past_key_values.")})
        return outputs["logits"]

    logits = step(spec["prefill"], input_ids, mask, positions)
    sequences = input_ids
    unfinished = numpy.ones(batch, dtype=bool)
    while True:
        next_tokens = logits[:, -1, :].astype(numpy.float32).argmax(-1).astype(numpy.int64)
        if pads:
            next_tokens = numpy.where(unfinished, next_tokens, numpy.int64(pad))
        sequences = numpy.concatenate([sequences, next_tokens[:, None]], axis=-1)
        done = numpy.isin(next_tokens, eos) | (sequences.shape[-1] >= spec["max_length"])
        unfinished &= ~done
        if not unfinished.any():
            return sequences
        mask = numpy.concatenate([mask, numpy.ones((batch, 1), dtype=mask.dtype)], axis=-1)
        positions = positions[..., -1:] + 1
        logits = step("decode", next_tokens[:, None], mask, positions)


def _peak_rss_mb() -> float | None:
    """This process's own resident high-water mark (VmHWM), in MB: its `ru_maxrss` as its parent reads it would
    start from the parent's (Linux records the old address space's mark at exec)."""
    try:
        line = next(line for line in Path("/proc/self/status").read_text().splitlines() if line.startswith("VmHWM:"))
    except (OSError, StopIteration):
        return None
    return round(int(line.split()[1]) / 1024, 1)


def main(argv: list[str]) -> int:
    folder = Path(argv[0])
    try:
        result = run(folder)
    except Exception as error:  # noqa: BLE001 - a request this process cannot read: one line for the caller
        result = {"crash": backend_message(error)}
    result["torch_imported"] = "torch" in sys.modules
    result["peak_rss_mb"] = _peak_rss_mb()
    (folder / RESULT).write_text(json.dumps(result))
    return 0


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
