"""What differs between hfexport's OpenVINO variant and optimum-intel's of the same bits, besides the weights, and
which of it decides LLMPipeline's decode speed (issue 46: hfexport int8 0.915x optimum-intel's at 1.7B in
results/variant_speed_1.7b_zen5.json, 1.005x in an earlier run of the same files, 1.44x at 135M).

`settings`: per folder of a pair (`benchmarks/variant_speed.py`'s make phase under WORK/openvino/): the JSON files
beside the graph (openvino_config.json, generation_config.json, config.json; what differs), the IR's rt_info
(`runtime_options`, which OpenVINO applies when it compiles, and NNCF's record), its op types and its constants'
element types (counted), and the graph compiled on the CPU as LLMPipeline compiles it (OpenVINO GenAI's venv,
`INFERENCE_NUM_THREADS` THREADS): the precisions it resolved (`get_property`: INFERENCE_PRECISION_HINT,
KV_CACHE_PRECISION, KEY/VALUE_CACHE_PRECISION and group sizes, DYNAMIC_QUANTIZATION_GROUP_SIZE, ...) and its runtime
graph's FullyConnected kernels (layer type, primitive, runtime precision; counted).

`speed`: each side of the pair in LLMPipeline as variant_speed.py runs it, and each side again with the other side's
precisions passed as properties (`LLMPipeline(folder, "CPU", INFERENCE_NUM_THREADS=..., **properties)`),
alternated (`_process.alternate_workers`, ROUNDS over GENERATIONS sets of processes); decode tokens/s and TTFT per
call, the ratios to the peer's side as it is. If a side with the other's properties decodes as the other, the
properties are the difference. The other's precisions: INFERENCE_PRECISION_HINT and KV_CACHE_PRECISION as its IR's
`runtime_options` name them, else as its compiled model resolved them (OpenVINO 2026.4.1's `compile_model` applies
an IR's KV_CACHE_PRECISION but reports the CPU's default for its INFERENCE_PRECISION_HINT; the 1.7B result
keeps an earlier run, `earlier_speed`, which passed only the resolved ones: the KV cache's).

Run: `flock /tmp/hfexport-heavy.lock env PYTHONPATH=library .venv/bin/python benchmarks/openvino_variant_settings.py`
(WORK, the variant_speed.py WORK of the exports; PAIR, default `hfexport int8,optimum-intel int8`; PHASES
`settings,speed`; ROUNDS 6; GENERATIONS 3; NEW_TOKENS 32; THREADS 2; OUT, default
results/openvino_variant_settings.json). results/openvino_variant_settings_1.7b_zen5.json: the 1.7B-class exports of
results/variant_speed_1.7b_zen5.json, AMD EPYC Zen 5 (family 26 model 2).
"""

from __future__ import annotations

import json
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parent / "library"))
sys.path.insert(0, str(HERE))

from _process import alternate_workers, load, machine  # noqa: E402 - the benchmarks' harness
from variant_speed import CHAT, OPENVINO_WORKER, SMOLLM2, slug  # noqa: E402 - the same runs as variant_speed.py

WORK = Path(os.environ.get("WORK", Path(tempfile.gettempdir()) / "hfexport-variant-speed"))
PAIR = os.environ.get("PAIR", "hfexport int8,optimum-intel int8").split(",")
PHASES = os.environ.get("PHASES", "settings,speed").split(",")
ROUNDS = int(os.environ.get("ROUNDS", "6"))
GENERATIONS = min(int(os.environ.get("GENERATIONS", "3")), ROUNDS)
NEW_TOKENS = int(os.environ.get("NEW_TOKENS", "32"))
THREADS = int(os.environ.get("THREADS", "2"))
OUT = Path(os.environ.get("OUT", HERE / "results" / "openvino_variant_settings.json"))
#: the compiled model's properties that decide its arithmetic (the rest are threads and streams)
PRECISIONS = ("INFERENCE_PRECISION_HINT", "KV_CACHE_PRECISION", "KEY_CACHE_PRECISION", "VALUE_CACHE_PRECISION",
              "KEY_CACHE_GROUP_SIZE", "VALUE_CACHE_GROUP_SIZE", "DYNAMIC_QUANTIZATION_GROUP_SIZE",
              "EXECUTION_MODE_HINT", "ACTIVATIONS_SCALE_FACTOR")

# OpenVINO GenAI's venv: argv FOLDER THREADS; prints one JSON line
SETTINGS_WORKER = r"""
import collections, json, sys
import openvino as ov
folder, threads = sys.argv[1], int(sys.argv[2])
names = __PRECISIONS__
core = ov.Core()
model = core.read_model(folder + "/openvino_model.xml")
def section(name):
    if not model.has_rt_info(name):
        return {}
    return {key: value.astype(str) for key, value in model.get_rt_info(name).astype(dict).items()}
ops = list(model.get_ordered_ops())
answer = {"runtime_options": section("runtime_options"),
          "rt_info_sections": sorted(model.get_rt_info().keys()),
          "op_types": dict(sorted(collections.Counter(op.get_type_name() for op in ops).items())),
          "constant_types": dict(collections.Counter(str(op.get_element_type()) for op in ops
                                                     if op.get_type_name() == "Constant"))}
compiled = core.compile_model(model, "CPU", {"INFERENCE_NUM_THREADS": threads})
supported = {str(name) for name in compiled.get_property("SUPPORTED_PROPERTIES")}
def plain(value):
    return value.get_type_name() if hasattr(value, "get_type_name") else str(value)
answer["compiled"] = {name: plain(compiled.get_property(name)) for name in names if name in supported}
kernels = collections.Counter()
for op in compiled.get_runtime_model().get_ordered_ops():
    info = op.get_rt_info()
    text = {key: info[key].astype(str) for key in ("layerType", "primitiveType", "runtimePrecision") if key in info}
    if text.get("layerType") in ("FullyConnected", "Gather", "MatMul", "ScaledDotProductAttention"):
        kernels[" / ".join(text.values())] += 1
answer["runtime_kernels"] = dict(sorted(kernels.items()))
print(json.dumps(answer))
"""

# OpenVINO GenAI: variant_speed.py's worker, with properties (argv[4], JSON) passed to LLMPipeline
WORKER = OPENVINO_WORKER.replace('INFERENCE_NUM_THREADS=int(sys.argv[3]))',
                                 'INFERENCE_NUM_THREADS=int(sys.argv[3]), **json.loads(sys.argv[4]))')
assert WORKER != OPENVINO_WORKER


def folders() -> dict[str, Path]:
    return {side: WORK / "openvino" / slug(side) for side in PAIR}


def json_files(folder: Path) -> dict:
    return {name: json.loads((folder / name).read_text()) for name in ("openvino_config.json", "config.json",
                                                                        "generation_config.json")
            if (folder / name).is_file()}


def differences(a, b, path: str = "") -> dict:
    """The keys whose values differ between two JSON values (`path` -> [a, b]); a missing key is None."""
    if isinstance(a, dict) and isinstance(b, dict):
        found = {}
        for key in sorted(set(a) | set(b)):
            found.update(differences(a.get(key), b.get(key), f"{path}.{key}" if path else key))
        return found
    return {} if a == b else {path: [a, b]}


def settings() -> dict:
    import subprocess

    from hfexport.testing import peers

    python = str(peers.openvino_genai_venv())
    script = SETTINGS_WORKER.replace("__PRECISIONS__", repr(PRECISIONS))
    sides = {}
    for side, folder in folders().items():
        answer = subprocess.run([python, "-c", script, str(folder), str(THREADS)], check=True, capture_output=True,
                                text=True).stdout
        sides[side] = {**json.loads(answer.strip().splitlines()[-1]), "files": json_files(folder)}
        print(side, json.dumps(sides[side], indent=1), file=sys.stderr, flush=True)
    a, b = (sides[side] for side in PAIR)
    return {"sides": sides, "differences": {key: differences(a[key], b[key]) for key in a}}


def speed(sides: dict) -> dict:
    """Each side as it is and with the other's precisions (`sides`: the settings phase's, side -> its IR's
    `runtime_options` and its compiled properties): what the other's IR asks for, else what its compile resolved."""
    from transformers import AutoTokenizer

    from hfexport.testing import peers

    python = str(peers.openvino_genai_venv())
    ours, theirs = PAIR
    asked = {side: {name: values["runtime_options"].get(name, values["compiled"][name])
                    for name in ("INFERENCE_PRECISION_HINT", "KV_CACHE_PRECISION")} for side, values in sides.items()}
    overrides = {side: {name: value for name, value in asked[other].items() if asked[side][name] != value}
                 for side, other in ((ours, theirs), (theirs, ours))}
    runs_of = {ours: (ours, {}), theirs: (theirs, {}), f"{ours} with {theirs}'s precisions": (ours, overrides[ours]),
               f"{theirs} with {ours}'s precisions": (theirs, overrides[theirs])}
    paths = folders()
    commands = {name: [python, "-c", WORKER, str(paths[side]), str(NEW_TOKENS), str(THREADS), json.dumps(props)]
                for name, (side, props) in runs_of.items()}
    tokenizer = AutoTokenizer.from_pretrained(SMOLLM2)
    prompts = [tokenizer(tokenizer.apply_chat_template([{"role": "user", "content": text}],
                                                       add_generation_prompt=True, tokenize=False))["input_ids"]
               for text in CHAT]
    before = load()
    runs, _ = alternate_workers(commands, prompts, ROUNDS, reference=theirs, keys=(), settle_s=0.2,
                                generations=GENERATIONS, env={**os.environ, "TOKENIZERS_PARALLELISM": "false"})
    after = load()
    ratios = {}
    for name, calls in runs.items():
        pairs = list(zip(calls, runs[theirs], strict=True))
        ratios[f"{name} / {theirs}"] = {
            "decode_tokens_per_s_ratio": round(statistics.median(a["tokens_per_s"] / b["tokens_per_s"]
                                                                 for a, b in pairs), 3),
            "ttft_ratio": round(statistics.median(a["ttft_ms"] / b["ttft_ms"] for a, b in pairs), 3),
            "by_generation": [round(statistics.median(a["tokens_per_s"] / b["tokens_per_s"] for a, b in pairs
                                                      if a["generation"] == generation), 3)
                              for generation in range(GENERATIONS)],
            "same_tokens_as_reference": all(a["tokens"] == b["tokens"] for a, b in pairs)}
    return {"properties": {name: props for name, (_, props) in runs_of.items()},
            "load_average_before": before, "load_average_after": after,
            "median": {name: {"decode_tokens_per_s": round(statistics.median(c["tokens_per_s"] for c in calls), 2),
                              "ttft_ms": round(statistics.median(c["ttft_ms"] for c in calls), 2)}
                       for name, calls in runs.items()},
            "ratios": ratios, "calls_per_side": len(runs[theirs])}


def main() -> dict:
    result = json.loads(OUT.read_text()) if OUT.is_file() else {}
    result.update({"about": __doc__.split("\n\n")[0], "machine": machine(), "pair": PAIR, "work": str(WORK),
                   "threads": THREADS})
    if "settings" in PHASES:
        result["settings"] = settings()
    if "speed" in PHASES:
        if "speed" in result:  # an earlier run's, kept
            result.setdefault("earlier_speed", []).append(result.pop("speed"))
        result["speed"] = {"rounds": ROUNDS, "generations": GENERATIONS, "new_tokens": NEW_TOKENS,
                           "prompts": len(CHAT), **speed(result["settings"]["sides"]),
                           "generated": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())}
    OUT.parent.mkdir(parents=True, exist_ok=True)
    OUT.write_text(json.dumps(result, indent=2) + "\n")
    print(json.dumps({key: result[key] for key in ("settings", "speed") if key in result}.get("speed", {}).get(
        "ratios"), indent=1), file=sys.stderr)
    return result


if __name__ == "__main__":
    main()
