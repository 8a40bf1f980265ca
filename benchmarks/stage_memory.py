"""Where an export's memory goes, stage by stage, and what streaming the weights from the shards saves (issue 45).

The model: a zoo config (`hfexport.testing.zoo`, default SmolLM2-135M's at its full depth, 30 layers; the zoo
tokenizer's vocabulary, so the embedding is small), random seeded weights in the published dtype. Each measurement
is a fresh process (`_process.run_measured`: its peak RSS from wait4):

- `export`: `python -m hfexport export MODEL --target onnx-generation -o OUT --json --no-latency --workers 1`: the
  report's per-stage peaks (`memory`, hfexport.job.memory) beside the preflight's estimate per stage, and the
  process's peak and wall (the gate's runtimes included where installed);
- `write_loaded` / `write_streamed`: a second checkpoint (every weight moved by seeded noise) written into that
  export through its weight map (`hfexport.rebind`), from the model loaded as a job loads it (float32), or streamed
  from its safetensors shards (`hfexport.rebind.checkpoint.CheckpointTensors`); each child resets its own
  high-water mark (VmHWM) once the model is loaded (or the meta model built), so its `write_peak_mb` and its wait4
  peak are the write's. Constant tensors (a fresh init's norms) are left as they are in the push: the first
  export's map merged them.

Run: `PYTHONPATH=library .venv/bin/python benchmarks/stage_memory.py` (env ZOO default smollm2-135m, LAYERS default
the config's, WORK; SKIP_EXPORT=1 redoes the writes only, on WORK's export) -> benchmarks/results/stage_memory_<ZOO>.json. Heavy: run it under
`flock /tmp/hfexport-heavy.lock` on a shared machine.

The job exported from its structure (issue 45: hfexport.job.structure, the gate releasing the model): DISTINCT=1
moves every parameter by seeded noise (a trained model's checkpoint: a fresh init's constant norms send the job to
the weights export), WRITES=0 leaves out the two weight writes, LIBRARY=<a tree's library/> exports with that tree
(a before/after pair), LABEL names the result: `stage_memory_<ZOO>-<LAYERS>l-<LABEL>.json`.
"""

from __future__ import annotations

import json
import os
import shutil
import sys
import tempfile
from pathlib import Path

from _process import ROOT, machine_and_versions, run_measured

MB = 1 << 20


def _vm(field: str) -> float:
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith(field + ":"):
            return int(line.split()[1]) / 1024
    return 0.0


def child(mode: str, export: Path, checkpoint: Path, out: Path) -> None:
    """Write `checkpoint`'s weights into a copy of `export` (`mode`: loaded or streamed); print the figures."""
    import torch
    from transformers import AutoConfig, AutoModelForCausalLM

    from hfexport.files import MANIFEST_FILE
    from hfexport.rebind.checkpoint import CheckpointTensors
    from hfexport.rebind.folder import rebind_copy
    from hfexport.safety.artifacts import check_manifest_file

    manifest = check_manifest_file(export / MANIFEST_FILE)
    before = _vm("VmRSS")
    if mode == "loaded":
        model = AutoModelForCausalLM.from_pretrained(checkpoint, dtype=torch.float32)
        Path("/proc/self/clear_refs").write_text("5")
        written = rebind_copy(export, out, manifest, model)
    else:
        with torch.device("meta"):
            keys = AutoModelForCausalLM.from_config(AutoConfig.from_pretrained(checkpoint)).state_dict().keys()
        Path("/proc/self/clear_refs").write_text("5")
        tensors = CheckpointTensors(checkpoint, torch.float32, keys).alias_parts(manifest["weight_map"])
        written = rebind_copy(export, out, manifest, tensors=tensors)
    print(json.dumps({"mode": mode, "bytes_written": written, "rss_before_write_mb": round(before, 1),
                      "write_peak_mb": round(_vm("VmHWM"), 1), "write_grew_mb": round(_vm("VmHWM") - before, 1)}))


def _perturbed(source: Path, destination: Path) -> None:
    import torch
    from transformers import AutoModelForCausalLM

    shutil.copytree(source, destination)
    model = AutoModelForCausalLM.from_pretrained(source)
    generator = torch.Generator().manual_seed(2)
    with torch.no_grad():
        for parameter in model.parameters():
            if bool((parameter == parameter.reshape(-1)[0]).all()):
                continue  # a fresh init's norms (all ones): the first export's map merged them, so they stay
            parameter.add_((torch.randn(parameter.shape, generator=generator) * 1e-3).to(parameter.dtype))
    for file in destination.glob("*.safetensors"):
        file.unlink()
    model.save_pretrained(destination)


def main() -> None:
    from hfexport.job.preflight import weights_metadata
    from hfexport.testing.zoo import ZOO, build

    name = os.environ.get("ZOO", "smollm2-135m")
    layers = int(os.environ.get("LAYERS", ZOO[name].config["num_hidden_layers"]))
    work = Path(os.environ.get("WORK") or tempfile.mkdtemp(prefix="stage-memory-"))
    label = os.environ.get("LABEL")
    out = ROOT / "benchmarks" / "results" / (f"stage_memory_{name}-{layers}l-{label}.json" if label else
                                             f"stage_memory_{name}.json")
    python = sys.executable
    env = {**os.environ, "PYTHONPATH": os.environ.get("LIBRARY") or str(ROOT / "library")}
    if os.environ.get("WRITES") == "0":
        _export_only(name, layers, work, python, env, out)
        return
    if os.environ.get("SKIP_EXPORT"):  # WORK's model and export, and the export's figures, from the last run
        shutil.rmtree(work / "pushed", ignore_errors=True)
        _perturbed(work / "model", work / "pushed")
        result = json.loads(out.read_text())
        result["write"] = {}
        _write(result, work, python, env, out)
        return
    model = build(name, work / "model", layers=layers)
    _perturbed(model, work / "pushed")
    weights, dtypes = weights_metadata(model)
    export = run_measured([python, "-m", "hfexport", "export", str(model), "--target", "onnx-generation", "-o",
                           str(work / "out"), "--json", "--no-latency", "--workers", "1"],
                          work / "export.out", work / "export.err", env=env)
    report = json.loads((work / "out" / "export_report.json").read_text())
    target = report["targets"]["onnx-generation"]
    result = {
        "model": {"zoo": name, "layers": layers, "weights_bytes": weights, "dtypes": dtypes},
        "export": {**export, "status": target["status"], "job_memory": report.get("memory"),
                   "target_memory": target.get("memory"), "peak_rss_mb_report": report.get("peak_rss_mb"),
                   "timings": target.get("timings")},
        "write": {},
        **machine_and_versions(),
    }
    _write(result, work, python, env, out)


def _export_only(name: str, layers: int, work: Path, python: str, env: dict, out: Path) -> None:
    """The export (gate on, no latency, no rebind) of WORK's model (built, and made distinct with DISTINCT=1, when
    WORK has none), measured; the result saved."""
    from hfexport.job.preflight import weights_metadata
    from hfexport.testing.zoo import build, make_weights_distinct

    model = work / "model"
    if not (model / "config.json").is_file():
        build(name, model, layers=layers)
        if os.environ.get("DISTINCT") == "1":
            make_weights_distinct(model)
    weights, dtypes = weights_metadata(model)
    shutil.rmtree(work / "out", ignore_errors=True)
    export = run_measured([python, "-m", "hfexport", "export", str(model), "--target", "onnx-generation", "-o",
                           str(work / "out"), "--json", "--no-latency", "--no-rebind", "--workers", "1"],
                          work / "export.out", work / "export.err", env=env)
    report = json.loads((work / "out" / "export_report.json").read_text())
    target = report["targets"]["onnx-generation"]
    result = {
        "model": {"zoo": name, "layers": layers, "weights_bytes": weights, "dtypes": dtypes,
                  "distinct": os.environ.get("DISTINCT") == "1", "library": env["PYTHONPATH"]},
        "export": {**export, "status": target["status"], "error": target.get("error"),
                   "job_memory": report.get("memory"), "target_memory": target.get("memory"),
                   "peak_rss_mb_report": report.get("peak_rss_mb"), "timings": target.get("timings"),
                   "job_timings": report.get("timings"), "runtimes": [
                       {key: check.get(key) for key in ("runtime", "verdict")} for check in target.get("runtimes") or []]},
        **machine_and_versions(),
    }
    out.write_text(json.dumps(result, indent=2) + "\n")
    print(json.dumps(result["export"], indent=2))


def _write(result: dict, work: Path, python: str, env: dict, out: Path) -> None:
    """The two weight writes of `work/pushed` into `work/out`'s export, each a fresh process; the result saved."""
    for mode in ("loaded", "streamed"):
        run = run_measured([python, __file__, "--child", mode, str(work / "out" / "onnx-generation"),
                            str(work / "pushed"), str(work / f"written-{mode}")],
                           work / f"{mode}.out", work / f"{mode}.err", env=env)
        lines = (work / f"{mode}.out").read_text().strip().splitlines()
        result["write"][mode] = {**run, **(json.loads(lines[-1]) if lines and run["returncode"] == 0 else {})}
    same = all((work / "written-loaded" / f.relative_to(work / "written-streamed")).read_bytes() == f.read_bytes()
               for f in (work / "written-streamed").rglob("*") if f.is_file())
    result["write"]["byte_identical"] = same
    result["write"]["machine"] = machine_and_versions()["machine"]
    out.write_text(json.dumps(result, indent=2) + "\n")
    print(json.dumps({k: result[k] for k in ("model", "write")}, indent=2))
    print(json.dumps(result["export"]["target_memory"]), json.dumps(result["export"]["job_memory"]))


if __name__ == "__main__":
    if sys.argv[1:2] == ["--child"]:
        child(sys.argv[2], Path(sys.argv[3]), Path(sys.argv[4]), Path(sys.argv[5]))
    else:
        main()
