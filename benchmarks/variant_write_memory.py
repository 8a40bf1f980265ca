"""Peak memory of making one ONNX variant (`hfexport.formats.onnx.variants.write`) from a saved float32 export, this
tree against another (issue 45: the weight-only variants made one weight at a time, where ONNX Runtime's
`MatMulNBitsQuantizer` loaded the whole float32 graph), and whether both trees write the same bytes.

Each (export, variant, tree) runs `write` in a fresh process (`--child`), the trees alternated per pair: the
process's peak RSS (`wait4`), the peak after the imports (`VmHWM` before `write`: the libraries) and after `write`,
wall and CPU, and the sha256 of the `model.onnx` and `model.onnx_data` written.

Run: `PYTHONPATH=library .venv/bin/python benchmarks/variant_write_memory.py` with env SOURCES (folders holding a
float32 `model.onnx` + `config.json`, comma-separated), VARIANTS (default q4,q8,q4f16), BEFORE (another tree's
`library` folder, e.g. `git archive REV | tar -x -C /tmp/before`), NOTE (what the sources are), WORK, RESULT (default
variant_write_memory.json; variant_write_memory_float16.json: fp16 and q4f16 streamed) -> benchmarks/results/RESULT.
Each process holds up to the old path's peak (about 2.3 x the float32 weights): under `flock /tmp/hfexport-heavy.lock`.
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import sys
import tempfile
from pathlib import Path

from _process import ROOT, machine_and_versions, run_checked, write_result


def child(source: str, variant: str, out: str) -> None:
    import onnx  # noqa: F401 - the libraries `write` imports, before the baseline is read
    import onnx_ir  # noqa: F401
    import onnxruntime  # noqa: F401
    import onnxscript.rewriter  # noqa: F401
    from onnxruntime.quantization.matmul_nbits_quantizer import MatMulNBitsQuantizer  # noqa: F401

    from hfexport.formats.onnx.variants import write
    from hfexport.quantization.variants import settings

    def high_water() -> float:
        with open("/proc/self/status") as status:
            return next(int(line.split()[1]) / 1024 for line in status if line.startswith("VmHWM"))

    shutil.rmtree(out, ignore_errors=True)  # `write` lays a fresh stage out
    baseline = high_water()
    write(Path(source), settings({"name": variant}), Path(out))
    peak = high_water()
    digests = {}
    for name in ("model.onnx", "model.onnx_data"):
        digest = hashlib.sha256()
        with (Path(out) / name).open("rb") as file:
            for block in iter(lambda: file.read(1 << 20), b""):  # noqa: B023 - read here, not kept
                digest.update(block)
        digests[name] = digest.hexdigest()
    print(json.dumps({"libraries_mb": round(baseline, 1), "write_peak_mb": round(peak, 1), "sha256": digests}))


def main() -> None:
    sources = [Path(item) for item in os.environ["SOURCES"].split(",")]
    variants = os.environ.get("VARIANTS", "q4,q8,q4f16").split(",")
    trees = {"after": str(ROOT / "library")}
    if os.environ.get("BEFORE"):
        trees = {"before": os.environ["BEFORE"], **trees}
    work = Path(os.environ.get("WORK") or tempfile.mkdtemp(prefix="variant-write-memory-"))
    runs = []
    for index, (source, variant) in enumerate((s, v) for s in sources for v in variants):
        names = list(trees) if index % 2 == 0 else list(trees)[::-1]  # alternated
        for tree in names:
            out = work / f"{source.name}-{variant}-{tree}"
            env = {**os.environ, "PYTHONPATH": trees[tree]}
            figures = run_checked(f"{source.parent.name}-{variant}-{tree}",
                                  [sys.executable, __file__, "--child", str(source), variant, str(out)], work / "logs",
                                  env=env)
            printed = (work / "logs" / f"{source.parent.name}-{variant}-{tree}.out").read_text().splitlines()[-1]
            weights = (source / "model.onnx_data").stat().st_size / (1 << 20)
            runs.append({"source": str(source), "float32_data_mb": round(weights, 1), "variant": variant,
                         "tree": tree, **figures, **json.loads(printed)})
            print(json.dumps(runs[-1]), flush=True)
    same = {}
    for run in runs:
        key = f"{run['source']}:{run['variant']}"
        same.setdefault(key, set()).add(json.dumps(run["sha256"], sort_keys=True))
    write_result(os.environ.get("RESULT", "variant_write_memory.json"), {
        "runs": runs, "identical_bytes": {key: len(digests) == 1 for key, digests in same.items()},
        "note": os.environ.get("NOTE", ""), **machine_and_versions()})


if __name__ == "__main__":
    if sys.argv[1:2] == ["--child"]:
        child(*sys.argv[2:5])
    else:
        main()
