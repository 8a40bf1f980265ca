"""SmolLM2-135M-Instruct (real weights): each hfexport variant beside the peer's own variant of the same bits, in the
same runtime (issue 46's speed part): size on disk, perplexity ratio to float32, decode tokens/s and time to first
token.

Exports (`make`, once per FORMAT, cached under WORK/<format>/, a side made again only when its folder is missing):
- hfexport: the format's plain generation target (`run_job`, no gate: the float32 export's parity is the runtime
  benchmarks'), then each variant made from it by the format's own `write_variant` (what a job's variant gate does,
  `hfexport.verify.variants`), each in a folder of its own that the runtimes open as the gate's runtimes do (the
  variant's graph under the contract's name, every other file linked);
- the peers, in their own venvs (`hfexport.testing.peers`): `openvino`: `optimum-cli export openvino --weight-format
  int8|int4` (optimum-intel 1.27, its defaults but int4's `--group-size 64`: its default 128 fails on SmolLM2); `onnx`: onnxruntime-genai 0.18's model builder `-p int4 -e cpu`
  (its own defaults; run from hfexport's venv, which has the torch, transformers and onnx_ir it imports, with the
  genai venv's package on the path); `executorch`: `optimum-cli export executorch --recipe xnnpack --use_custom_sdpa
  --use_custom_kv_cache --qlinear 8da4w --qembedding 8w` (optimum-executorch 1.1.0, as benchmarks/variant_quality.py).
  `transformers.js` (the ONNX export's q4, q8 and q4f16): transformers.js' own q4, q8 and q4f16
  of the checkpoint, `optimum-cli export onnx --task text-generation-with-past` (optimum-onnx 0.1.0, the peers'
  venv) then transformers.js' scripts/quantize.py rules with its defaults (TJS_QUANTIZE: q8 `quantize_dynamic`'s
  quantizer over IntegerOpsRegistry's ops, per tensor, int8 weights; q4 `MatMulNBitsQuantizer` blocks of 32,
  symmetric; q4f16 that q4, then its float16 rules, float32 inputs and outputs kept: TJS_PACKAGES), run with
  hfexport's venv's onnxruntime 1.32 (the peers' has the same version, not the onnx_ir it imports).
- quality: every side scored by `hfexport.verify.variants.quality` against hfexport's float32 export, on
  benchmarks/variant_quality.py's TEXTS (the format's `next_token_scores` on each folder): the perplexity ratio to
  float32 and the next-token agreement, the figures of the variant gate.

Speed (`speed`): per format, the runtime that its peer's variant is made for, every side in a long-lived process of
its own (`_process.alternate_workers`: the order reversed each round, ROUNDS rounds over GENERATIONS fresh sets of
processes, SETTLE_S before each call), greedy, batch 1, chat prompts as token ids, exactly NEW_TOKENS new tokens
where the runtime can force them, THREADS threads set explicitly on every side where the runtime takes a number:
- `openvino`: OpenVINO GenAI's `LLMPipeline(folder, "CPU", INFERENCE_NUM_THREADS=THREADS)` (its default
  PagedAttention backend and each export's own precision defaults: what a user gets); figures from GenAI's
  `perf_metrics` (TTFT, decode throughput);
- `onnx`: onnxruntime-genai (`og.Model` on a copy of each folder's `genai_config.json` with `intra_op_num_threads`
  THREADS, and over it what the README's snippet overlays for hfexport's variants (`genai_overlay`: shared
  past/present buffers for a fused graph), or a side's `GENAI_OVERLAY`: one side unshared); TTFT = the prompt's pass
  and first token, tokens/s over the rest;
- `transformers.js`: transformers.js 4.3.2 on Node (`hfexport.testing.peers.node_modules`), each side opened by its
  `dtype` from a repo-like folder (the graph under the dtype's file name), onnxruntime-node's default threads;
  TTFT = the call to the first new token, tokens/s over the rest;
- `executorch`: ExecuTorch's TextLLMRunner (benchmarks/llm_runtimes_executorch.py's worker: its thread pool is
  XNNPACK's default, the cores, recorded); tokens/s over the tokens every side produced.
A pair's ratio is hfexport's over the peer's per call (the calls neighbours in time), then the median; decode
tokens/s > 1 and TTFT < 1 mean hfexport's variant is faster.

Run: `flock /tmp/hfexport-heavy.lock env PYTHONPATH=library .venv/bin/python benchmarks/variant_speed.py` (FORMATS,
default `openvino,onnx,executorch`; PHASES, default `make,speed`, or `gate`: executorch's or onnx's sides' runtime checks as
the variant gate runs them; ONLY: the side names to make and time, comma-separated, else all; ROUNDS 6; GENERATIONS 3; SETTLE_S 0.2;
NEW_TOKENS 32; THREADS 2; WORK /tmp/hfexport-variant-speed; SMOLLM2_DIR; CHECKPOINT: another checkpoint with its tokenizer,
the 1.7B-class one) -> benchmarks/results/variant_speed.json (or
OUT; formats measured earlier in that file are kept; FORMATS may also name `transformers.js`). The CPU and the load
average before and after are recorded. results/variant_speed_zen5.json: `FORMATS=transformers.js,executorch
OUT=results/variant_speed_zen5.json`, on an AMD EPYC Zen 5 (family 26 model 2), with transformers.js' sides then
(the defaults and `accuracy_level` 4 apart); results/variant_speed_tjs_fused_zen5.json: `FORMATS=transformers.js
ROUNDS=3 NEW_TOKENS=16`, the fused, `accuracy_level` 4 defaults against transformers.js' own;
results/variant_speed_tjs_q4f16_zen5.json: the same with q4f16's pair added (`FORMATS=transformers.js ROUNDS=3
NEW_TOKENS=16`); results/variant_speed_onnx_zen5.json: `FORMATS=onnx OUT=results/variant_speed_onnx_zen5.json`, q4 against the model
builder's int4 in onnxruntime-genai; results/variant_speed_executorch_zen5.json: `FORMATS=executorch ROUNDS=8
GENERATIONS=4`, PHASES make, speed, gate run apart: the 8da4w defaults, the peer's form and the head 4-bit with the 4-bit
embedding against optimum-executorch's 8da4w (what decides the defaults: docs/quantization.md, "Variants");
results/variant_speed_head_bits_zen5.json: `FORMATS=onnx ONLY="hfexport q4,hfexport q4 head_bits 4,onnxruntime-genai
builder int4"`, the equal-bit pair (q4 with the builder's 4-bit head) and the default beside it (`..._run2.json` again,
with `PHASES=gate`'s runtimes); results/variant_speed_rotary_in_gqa_zen5.json: the same with the fused variants' rotary
inside GroupQueryAttention at the cache slots (tried, reverted: docs/quantization.md).
"""

from __future__ import annotations

import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent
sys.path.insert(0, str(ROOT / "library"))
sys.path.insert(0, str(HERE))

from _process import alternate_workers, load, machine  # noqa: E402 - the benchmarks' harness
from llm_runtimes import _peer_model  # noqa: E402
from smollm2_runtimes import GENAI_WORKER, JS_WORKER  # noqa: E402 - the runtimes' timed workers
from variant_quality import TEXTS  # noqa: E402 - the quality measure's fixed texts

FORMATS = [name for name in os.environ.get("FORMATS", "openvino,onnx,executorch").split(",") if name]  # or transformers.js
PHASES = os.environ.get("PHASES", "make,speed").split(",")
ROUNDS = int(os.environ.get("ROUNDS", "6"))
GENERATIONS = min(int(os.environ.get("GENERATIONS", "3")), ROUNDS)
SETTLE_S = float(os.environ.get("SETTLE_S", "0.2"))
NEW_TOKENS = int(os.environ.get("NEW_TOKENS", "32"))
THREADS = int(os.environ.get("THREADS", "2"))
WORK = Path(os.environ.get("WORK", Path(tempfile.gettempdir()) / "hfexport-variant-speed"))
SMOLLM2 = Path(os.environ.get("SMOLLM2_DIR", Path(tempfile.gettempdir()) / "hfexport-smollm2"))
#: another checkpoint with SmolLM2's tokenizer (the 1.7B-class random-weight one of benchmarks/export_memory.py), in
#: place of SmolLM2-135M-Instruct's real weights; its tokenizer is read from SMOLLM2 all the same
CHECKPOINT = Path(os.environ["CHECKPOINT"]) if os.environ.get("CHECKPOINT") else None
OUT = Path(os.environ.get("OUT", HERE / "results" / "variant_speed.json"))
#: the sides to make and time (comma-separated side names; the pairs whose two sides are both kept), else all
ONLY = {name.strip() for name in os.environ.get("ONLY", "").split(",") if name.strip()}
CHAT = ["Write a short story about a robot who learns to paint.", "Explain in detail how a bicycle works.",
        "Describe the water cycle step by step.", "List ten fruits and describe each one."]

#: in a peer's options: the group size hfexport's int4 side resolved for the model
GROUP_SIZE = "<hfexport's int4 group size>"
#: per format: the float32 target, hfexport's sides (side name -> variant settings), the peers' sides (side name ->
#: how to make it), the pairs compared (hfexport's side, the peer's side), the files that hold the program
SIDES = {
    "openvino": {"target": "openvino-generation",
                 "hfexport": {"hfexport int8": {"name": "int8"}, "hfexport int4": {"name": "int4"}},
                 "peers": {"optimum-intel int8": ("--weight-format", "int8"),
                           # the group size hfexport resolved for its int4 (`GROUP_SIZE`): optimum-intel's default
                           # (128) fails on SmolLM2 (NNCF's InvalidGroupSizeError: 576 % 128), where 64 is what
                           # hfexport resolves and what the error leaves a user to pick; a 2048-wide model takes 128
                           "optimum-intel int4": ("--weight-format", "int4", "--group-size", GROUP_SIZE)},
                 "pairs": [("hfexport int8", "optimum-intel int8"), ("hfexport int4", "optimum-intel int4")],
                 "files": ("openvino_model.xml", "openvino_model.bin")},
    "onnx": {"target": "onnx-generation",
             # q4's defaults (attention fused, accuracy_level 4) as published (the README's overlay: shared
             # past/present buffers), the same with the buffers unshared (GENAI_OVERLAY: what sharing gives), and
             # with the head 4-bit as the builder's (what the 8-bit head costs: not a default, it fails q4's bound)
             "hfexport": {"hfexport q4": {"name": "q4"},
                          "hfexport q4 unshared": {"name": "q4"},
                          "hfexport q4 head_bits 4": {"name": "q4", "head_bits": 4}},
             "peers": {"onnxruntime-genai builder int4": ("-p", "int4", "-e", "cpu")},
             "pairs": [("hfexport q4", "onnxruntime-genai builder int4"),
                       ("hfexport q4 unshared", "onnxruntime-genai builder int4"),
                       ("hfexport q4 head_bits 4", "onnxruntime-genai builder int4")],
             "files": ("model.onnx", "model.onnx_data", "model.onnx.data")},
    # transformers.js' own q4/q8 of the checkpoint: optimum's ONNX export with past, then transformers.js'
    # scripts/quantize.py rules (TJS_QUANTIZE); each side opened by its dtype (`dtype` below)
    "transformers.js": {"format": "onnx", "target": "onnx-generation",
                        # the defaults (fused attention, accuracy_level 4: int8 activations inside MatMulNBits, the
                        # only 8-bit kernel ONNX Runtime has on CPU), and accuracy_level 0 (unset): without it an 8-bit
                        # block graph dequantizes every weight on every call (results/variant_speed_zen5.json)
                        # q4f16: hfexport's (q4, then its float16 conversion: float16 inputs, outputs and cache)
                        # against transformers.js' (q4, then its float16 rules with float32 inputs and outputs)
                        "hfexport": {"hfexport q4": {"name": "q4"}, "hfexport q8": {"name": "q8"},
                                     "hfexport q4f16": {"name": "q4f16"}},
                        "peers": {"transformers.js q4": ("q4",), "transformers.js q8": ("q8",),
                                  "transformers.js q4f16": ("q4f16",)},
                        "pairs": [("hfexport q4", "transformers.js q4"), ("hfexport q8", "transformers.js q8"),
                                  ("hfexport q4f16", "transformers.js q4f16")],
                        "dtype": {"hfexport q4": "q4", "transformers.js q4": "q4", "hfexport q8": "q8",
                                  "transformers.js q8": "q8", "hfexport q4f16": "q4f16",
                                  "transformers.js q4f16": "q4f16"},
                        "files": ("model.onnx", "model.onnx_data")},
    "executorch": {"target": "executorch-generation",
                   # the defaults, optimum-executorch's form made by hfexport (its head 4-bit, its embedding 8w:
                   # the program hfexport lowers, the peer's parts; what the 8-bit head costs in decode), and the head
                   # 4-bit with the default 4-bit embedding (the smallest: what the embedding's form costs)
                   "hfexport": {"hfexport 8da4w": {"name": "8da4w"},
                                "hfexport 8da4w head 8da4w embedding 8w": {"name": "8da4w", "head": "8da4w",
                                                                           "embedding": "8w"},
                                "hfexport 8da4w head 8da4w": {"name": "8da4w", "head": "8da4w"}},
                   "peers": {"optimum-executorch 8da4w": ("--use_custom_sdpa", "--use_custom_kv_cache", "--qlinear",
                                                          "8da4w", "--qembedding", "8w")},
                   "pairs": [("hfexport 8da4w", "optimum-executorch 8da4w"),
                             ("hfexport 8da4w head 8da4w embedding 8w", "optimum-executorch 8da4w"),
                             ("hfexport 8da4w head 8da4w", "optimum-executorch 8da4w")],
                   "files": ("model.pte", "model.ptd")},
}


if ONLY:  # each format's sides and pairs cut to ONLY's
    for _spec in SIDES.values():
        _spec["hfexport"] = {side: item for side, item in _spec["hfexport"].items() if side in ONLY}
        _spec["peers"] = {side: options for side, options in _spec["peers"].items() if side in ONLY}
        _spec["pairs"] = [pair for pair in _spec["pairs"] if set(pair) <= ONLY]


#: per side: what is overlaid on its genai_config.json in onnxruntime-genai (a user's `og.Config.overlay`) in place of
#: what the README's snippet overlays for hfexport's variants (`decoder_contract.genai_overlay`)
GENAI_OVERLAY = {"hfexport q4 unshared": {"search": {"past_present_share_buffer": False}}}


def slug(side: str) -> str:
    return side.replace(" ", "-")


def program_format(key: str) -> str:
    """The export format of the sides of `key` (a format, or a runtime of one: `transformers.js`)."""
    return SIDES[key].get("format", key)


def program_bytes(key: str, folder: Path) -> int:
    """The bytes of the files that hold the program (graph and weights; links followed), tokenizers left out."""
    return sum((folder / name).stat().st_size for name in SIDES[key]["files"] if (folder / name).exists())


def make(export_format: str) -> dict:
    """The float32 export, hfexport's variants and the peers' of `export_format` under WORK/<format>/ (each made
    once), and each side's quality against the float32 export; the sides' folders, sizes and quality."""
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from hfexport.formats.programs import format_program
    from hfexport.job.run import run_job
    from hfexport.plan import build_plan
    from hfexport.quantization.variants import settings
    from hfexport.recipe.loading import load_recipe
    from hfexport.testing.models import build_smollm2
    from hfexport.verify.variants import quality, token_rows

    key, export_format = export_format, program_format(export_format)
    spec, work = SIDES[key], WORK / key
    checkpoint = CHECKPOINT or build_smollm2(SMOLLM2)
    name = spec["target"]
    recipe = load_recipe({"recipe_version": 1, "task": "text-generation", "sample_inputs": {"text": TEXTS},
                          "targets": {name: {"export_format": export_format, "mode": "generation"}}})
    f32 = WORK / export_format / "f32" / name  # one float32 export per format, whichever runtime's sides use it
    timings = {}
    if not (f32 / "export_report.json").is_file() and not (f32.parent / "export_report.json").is_file():
        shutil.rmtree(f32.parent, ignore_errors=True)
        started = time.perf_counter()
        report = run_job(checkpoint, f32.parent, recipe=recipe, verify=False, latency=False)
        assert report.targets[name].status == "ok", report.targets[name].error
        timings["f32 export"] = round(time.perf_counter() - started, 1)
    model = AutoModelForCausalLM.from_pretrained(checkpoint, dtype=torch.float32).eval()
    tokenizer = AutoTokenizer.from_pretrained(checkpoint)
    rows = [row for row in token_rows(build_plan(recipe, name, model, None, tokenizer)) if len(row) > 1]
    program = format_program(export_format)
    reference = program.next_token_scores(f32, rows)
    folders = {}
    for side, item in spec["hfexport"].items():
        folder = work / slug(side)
        if not (folder / ".made").is_file():
            shutil.rmtree(folder, ignore_errors=True)
            started = time.perf_counter()
            resolved = program.write_variant(f32, settings(item), folder, model) or {}
            (folder / ".made").write_text(json.dumps({**settings(item), **resolved}))
            timings[side] = round(time.perf_counter() - started, 1)
        folders[side] = folder
    for side, options in spec["peers"].items():
        folder = work / slug(side)
        if not (folder / ".made").is_file():
            shutil.rmtree(folder, ignore_errors=True)
            started = time.perf_counter()
            if GROUP_SIZE in options:  # hfexport's int4 side is made first
                group = json.loads((work / slug("hfexport int4") / ".made").read_text())["group_size"]
                options = tuple(str(group) if option == GROUP_SIZE else option for option in options)
            make_peer(key, checkpoint, folder, options)
            (folder / ".made").write_text(json.dumps(options))
            timings[side] = round(time.perf_counter() - started, 1)
        folders[side] = folder
    f32_bytes = program_bytes(key, f32)
    sides = {}
    for side, folder in folders.items():
        scores = quality(reference, program.next_token_scores(scoring_folder(export_format, folder, work), rows))
        size = program_bytes(key, folder)
        sides[side] = {"folder": str(folder), "bytes": size, "size_ratio_to_f32": round(size / f32_bytes, 4),
                       "settings": json.loads((folder / ".made").read_text()), **scores}
        print(side, json.dumps(sides[side]), file=sys.stderr, flush=True)
    return {"f32": {"folder": str(f32), "bytes": f32_bytes}, "sides": sides, "make_seconds": timings,
            "quality_texts": len(TEXTS)}


def scoring_folder(export_format: str, folder: Path, work: Path) -> Path:
    """`folder` as its format's `next_token_scores` takes it. The model builder's graph names its cache's head axis
    (`kv_cache_dim`) where the contract's is a number: a copy of its graph with the genai_config's `head_size` there,
    its weights hard-linked (the graph's computation untouched)."""
    if export_format != "onnx" or not (folder / "model.onnx.data").is_file():
        return folder
    import onnx

    copy = work / f".scoring-{folder.name}"
    shutil.rmtree(copy, ignore_errors=True)
    copy.mkdir(parents=True)
    os.link(folder / "model.onnx.data", copy / "model.onnx.data")  # ONNX Runtime refuses a link out of the folder
    head_size = json.loads((folder / "genai_config.json").read_text())["model"]["decoder"]["head_size"]
    graph = onnx.load(str(folder / "model.onnx"), load_external_data=False)
    for value in graph.graph.input:
        if value.name.startswith("past_key_values."):
            value.type.tensor_type.shape.dim[3].dim_value = head_size
    onnx.save(graph, str(copy / "model.onnx"))
    return copy


def make_peer(export_format: str, checkpoint: Path, folder: Path, options: tuple[str, ...]) -> None:
    """The peer's own variant of `checkpoint` in `folder` (its tool, its venv, its defaults but `options`)."""
    from hfexport.testing import peers

    scratch = folder.with_name(folder.name + ".partial")
    shutil.rmtree(scratch, ignore_errors=True)
    peer_model = _peer_model(checkpoint, WORK)
    if export_format == "transformers.js":  # its tokenizer_config patched: a view of its own
        source = optimum_onnx(_peer_model(checkpoint, folder.parent), folder.parent / "optimum-onnx")
        shutil.copytree(source, scratch, ignore=shutil.ignore_patterns("model.onnx", "model.onnx_data"))
        # in hfexport's venv: the same onnxruntime (1.32) as the peers', whose venv lacks the onnx_ir it imports
        subprocess.run([sys.executable, "-c", TJS_QUANTIZE, str(source / "model.onnx"),
                        str(scratch / "model.onnx"), *options, str(tjs_packages())], check=True)
        scratch.rename(folder)
        return
    if export_format == "openvino":
        command = [str(peers.peer_venv().parent / "optimum-cli"), "export", "openvino", "--model", str(peer_model),
                   "--task", "text-generation-with-past", *options, str(scratch)]
    elif export_format == "executorch":
        command = [str(peers.optimum_executorch_venv().parent / "optimum-cli"), "export", "executorch", "--model",
                   str(peer_model), "--task", "text-generation", "--recipe", "xnnpack", *options, "--max_seq_len",
                   "2048", "--output_dir", str(scratch)]
    else:  # onnxruntime-genai's model builder: its package from the genai venv, torch + transformers from hfexport's
        site = next(Path(peers.genai_venv()).parent.parent.glob("lib/python*/site-packages"))
        launcher = (f"import runpy, sys; sys.path.append({str(site)!r}); sys.argv[0] = 'builder'; "
                    "runpy.run_module('onnxruntime_genai.models.builder', run_name='__main__')")
        command = [sys.executable, "-c", launcher, "-m", "HuggingFaceTB/SmolLM2-135M-Instruct", "-i", str(checkpoint),
                   "-o", str(scratch), *options, "-c", str(WORK / "genai-builder-cache")]
    subprocess.run(command, check=True)
    scratch.rename(folder)


def optimum_onnx(peer_model: Path, folder: Path) -> Path:
    """optimum-cli's ONNX export of `peer_model` with past (optimum-onnx, the peers' venv) in `folder`, made once;
    its tokenizer_config names GPT2Tokenizer (transformers 4.57 there has no TokenizersBackend:
    benchmarks/smollm2_runtimes.py)."""
    from hfexport.testing import peers

    if (folder / "model.onnx").is_file():
        return folder
    tokenizer_config = peer_model / "tokenizer_config.json"
    settings = json.loads(tokenizer_config.read_text())
    settings["tokenizer_class"] = "GPT2Tokenizer"
    tokenizer_config.unlink()
    tokenizer_config.write_text(json.dumps(settings, indent=1))
    scratch = folder.with_name(folder.name + ".partial")
    shutil.rmtree(scratch, ignore_errors=True)
    subprocess.run([str(peers.peer_venv().parent / "optimum-cli"), "export", "onnx", "--model", str(peer_model),
                    "--task", "text-generation-with-past", str(scratch)], check=True)
    scratch.rename(folder)
    return folder


#: the packages of transformers.js' scripts/requirements.txt that its float16 rules (q4f16) need and hfexport's venv
#: lacks: its float16.py is onnxconverter-common's converter (the version it pins) with a longer op block list,
#: and the result is slimmed by onnxslim (the version it pins); installed apart (`pip --target`, no dependencies:
#: onnx, numpy, sympy, ml_dtypes come from hfexport's venv)
TJS_PACKAGES = ("onnxconverter-common==1.14.0", "onnxslim==0.1.48", "colorama")


def tjs_packages() -> Path:
    """A folder holding TJS_PACKAGES (made once under WORK), which TJS_QUANTIZE puts on its path."""
    folder = WORK / "tjs-packages"
    if not (folder / ".made").is_file():
        shutil.rmtree(folder, ignore_errors=True)
        subprocess.run([sys.executable, "-m", "pip", "install", "--quiet", "--no-deps", "--target", str(folder),
                        *TJS_PACKAGES], check=True)
        (folder / ".made").write_text(json.dumps(TJS_PACKAGES))
    return folder


# transformers.js' scripts/quantize.py (its last version, before its removal from the repo: commit 4e1b4b6~1),
# `quantize_q8`, `quantize_q4` and `quantize_fp16` with its defaults: argv SOURCE OUTPUT MODE PACKAGES; saved inline
# as its `check_and_save_model` saves a graph under 2 GB. q4f16 is its q4 then its float16 rules: float32 inputs and
# outputs kept (`keep_io_types`), values clamped to [1e-7, 1e4] in magnitude (its converter's defaults), its op block
# list (onnxconverter-common's without Range, with RandomNormalLike and Cast), then `onnxslim.slim`; its float16.py
# is onnxconverter-common 1.14.0's converter as modified there (loaded from its file: the package's __init__ imports
# `onnx.mapping`, gone from onnx since), whose other changes (casts of a graph input shared, a topological sort) do
# not change what is computed
TJS_QUANTIZE = r"""
import importlib.util
import logging
import sys
import onnx
from onnxruntime.quantization import QuantType, QuantizationMode
from onnxruntime.quantization.onnx_quantizer import ONNXQuantizer
from onnxruntime.quantization.registry import IntegerOpsRegistry
from onnxruntime.quantization.matmul_nbits_quantizer import MatMulNBitsQuantizer
source, output, mode = sys.argv[1:4]
logging.getLogger("onnxruntime.quantization").setLevel(logging.WARNING)
model = onnx.load_model(source)
if mode == "q8":
    ops = set()
    def walk(graph):
        for node in graph.node:
            ops.add(node.op_type)
            for attribute in node.attribute:
                if attribute.type == onnx.AttributeProto.GRAPH:
                    walk(attribute.g)
    walk(model.graph)
    weight_type = QuantType.QUInt8 if ops & {"Conv", "GroupQueryAttention", "MultiHeadAttention"} else QuantType.QInt8
    quantizer = ONNXQuantizer(model, False, False, mode=QuantizationMode.IntegerOps, static=False,
                              weight_qType=weight_type, activation_qType=QuantType.QUInt8, tensors_range=None,
                              nodes_to_quantize=[], nodes_to_exclude=[],
                              op_types_to_quantize=set(IntegerOpsRegistry.keys()),
                              extra_options=dict(EnableSubgraph=True, MatMulConstBOnly=True))
    quantizer.quantize_model()
else:
    quantizer = MatMulNBitsQuantizer(model=model, block_size=32, is_symmetric=True, accuracy_level=None)
    quantizer.process()
model = quantizer.model.model
if mode == "q4f16":
    sys.path.append(sys.argv[4])
    import onnxslim
    spec = importlib.util.spec_from_file_location("float16", sys.argv[4] + "/onnxconverter_common/float16.py")
    float16 = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(float16)
    import numpy as np
    as_written = float16.convert_tensor_float_to_float16
    def raw_to_float16(tensor, min_positive_val=1e-7, max_finite_val=1e4):
        # its raw_data path as written (np.fromstring, ndarray.tostring: gone from numpy 2), the same values
        if tensor.data_type != onnx.TensorProto.FLOAT or not tensor.raw_data:
            return as_written(tensor, min_positive_val, max_finite_val)
        values = np.frombuffer(tensor.raw_data, dtype="float32")
        tensor.data_type = onnx.TensorProto.FLOAT16
        tensor.raw_data = float16.convert_np_to_float16(values, min_positive_val, max_finite_val).tobytes()
        return tensor
    float16.convert_tensor_float_to_float16 = raw_to_float16
    blocked = [op for op in float16.DEFAULT_OP_BLOCK_LIST if op != "Range"] + ["RandomNormalLike", "Cast"]
    model = float16.convert_float_to_float16(model, keep_io_types=True, op_block_list=blocked,
                                             disable_shape_infer=model.ByteSize() >= onnx.checker.MAXIMUM_PROTOBUF)
    model = onnxslim.slim(model)
onnx.save(model, output, convert_attribute=True)
"""


# OpenVINO GenAI: one LLMPipeline per process (folder, new tokens, threads); each stdin line a prompt (token ids)
OPENVINO_WORKER = r"""
import json, sys
import numpy as np, openvino as ov, openvino_genai as g
pipe = g.LLMPipeline(sys.argv[1], "CPU", INFERENCE_NUM_THREADS=int(sys.argv[3]))
config = pipe.get_generation_config()
config.max_new_tokens = config.min_new_tokens = int(sys.argv[2])
config.do_sample = False
print(json.dumps({"ready": True}), flush=True)
for line in sys.stdin:
    ids = np.asarray([json.loads(line)], dtype=np.int64)
    result = pipe.generate(g.TokenizedInputs(ov.Tensor(ids), ov.Tensor(np.ones_like(ids))), config)
    metrics = result.perf_metrics
    print(json.dumps({"ttft_ms": metrics.get_ttft().mean, "tokens_per_s": metrics.get_throughput().mean,
                      "tokens": [int(t) for t in result.tokens[0]]}), flush=True)
"""


def genai_folder(folder: Path, stage: Path, overlay: dict) -> Path:
    """`folder` as onnxruntime-genai opens it with THREADS intra-op threads: its files linked, its genai_config.json
    copied with `session_options.intra_op_num_threads` set and `overlay`'s sections' keys over its own."""
    shutil.rmtree(stage, ignore_errors=True)
    stage.mkdir(parents=True)
    for item in folder.iterdir():
        if item.name != "genai_config.json" and not item.name.startswith("."):
            (stage / item.name).symlink_to(item.resolve())
    config = json.loads((folder / "genai_config.json").read_text())
    config["model"]["decoder"].setdefault("session_options", {})["intra_op_num_threads"] = THREADS
    for section, values in overlay.items():
        config[section].update(values)
    (stage / "genai_config.json").write_text(json.dumps(config, indent=2))
    return stage


def js_stage(folder: Path, dtype: str, stage: Path) -> list[str]:
    """`folder` laid out in `stage` as a repo that transformers.js opens by `dtype` (config.json at the root, the
    graph under its dtype's name in onnx/, its external data renamed with it as the publication renames it); the
    worker's command."""
    from hfexport.formats.onnx.decoder_contract import DATA_FILE, MODEL_FILE, relocated
    from hfexport.testing import peers

    name = {"q4": "model_q4.onnx", "q8": "model_quantized.onnx", "q4f16": "model_q4f16.onnx"}[dtype]
    shutil.rmtree(stage, ignore_errors=True)
    (stage / "models" / "model" / "onnx").mkdir(parents=True)
    shutil.copyfile(folder / "config.json", stage / "models" / "model" / "config.json")
    external = (folder / DATA_FILE).is_file()
    if external:
        # hard-linked: onnxruntime-node refuses external data that resolves out of the graph's folder
        os.link((folder / DATA_FILE).resolve(), stage / "models" / "model" / "onnx" / (name + "_data"))
        (stage / "models" / "model" / "onnx" / name).write_bytes(relocated(folder / MODEL_FILE, DATA_FILE,
                                                                           name + "_data"))
    else:
        (stage / "models" / "model" / "onnx" / name).symlink_to((folder / MODEL_FILE).resolve())
    (stage / "node_modules").symlink_to(peers.node_modules() / "node_modules", target_is_directory=True)
    (stage / "worker.mjs").write_text(JS_WORKER)
    return ["node", str(stage / "worker.mjs"), str(stage / "models"), dtype, str(NEW_TOKENS), "1" if external else "0"]


def speed(export_format: str, made: dict) -> dict:
    """Every side of `export_format` (a format, or `transformers.js`) in its runtime, alternated; the medians and
    each pair's ratios."""
    from transformers import AutoTokenizer

    from hfexport.testing import peers

    spec = SIDES[export_format]
    folders = {side: Path(entry["folder"]) for side, entry in made["sides"].items()}
    tokenizer = AutoTokenizer.from_pretrained(SMOLLM2)
    texts = [tokenizer.apply_chat_template([{"role": "user", "content": text}], add_generation_prompt=True,
                                           tokenize=False) for text in CHAT]
    ready: dict[str, dict] = {}
    if export_format == "openvino":
        python = str(peers.openvino_genai_venv())
        commands = {side: [python, "-c", OPENVINO_WORKER, str(folder), str(NEW_TOKENS), str(THREADS)]
                    for side, folder in folders.items()}
        prompts, popen = [tokenizer(text)["input_ids"] for text in texts], {}
    elif export_format == "onnx":
        python = str(peers.genai_venv())
        from hfexport.formats.onnx.decoder_contract import genai_overlay

        overlays = {side: GENAI_OVERLAY.get(side, genai_overlay(folder / "model.onnx") if side in spec["hfexport"]
                                            else {}) for side, folder in folders.items()}
        commands = {side: [python, "-c", GENAI_WORKER, str(genai_folder(folder, WORK / "genai" / slug(side),
                                                                        overlays[side])),
                           str(NEW_TOKENS)] for side, folder in folders.items()}
        prompts, popen = [tokenizer(text)["input_ids"] for text in texts], {}
    elif export_format == "transformers.js":
        commands = {side: js_stage(folder, spec["dtype"][side], WORK / "js" / slug(side))
                    for side, folder in folders.items()}
        prompts, popen = [tokenizer(text)["input_ids"] for text in texts], {}
    else:
        from llm_runtimes_executorch import WORKER

        commands = {side: [sys.executable, "-c", WORKER, str(folder), str(SMOLLM2 / "tokenizer.json"),
                           str(NEW_TOKENS)] for side, folder in folders.items()}
        prompts, popen = texts, {"stderr": subprocess.DEVNULL}
    load_before = load()
    reference = spec["pairs"][0][1]
    runs, _ = alternate_workers(commands, prompts, ROUNDS, reference=reference, keys=(), ready=ready,
                                settle_s=SETTLE_S, generations=GENERATIONS,
                                env={**os.environ, "TOKENIZERS_PARALLELISM": "false"}, **popen)
    load_after = load()
    if export_format in ("onnx", "transformers.js"):  # these workers answer seconds: the same figures as the others'
        for call in (call for calls in runs.values() for call in calls):
            decode_s = call.pop("decode_s")
            call["ttft_ms"] = call.pop("ttft") * 1000
            call["tokens_per_s"] = (len(call["tokens"]) - 1) / decode_s
    if export_format == "executorch":  # tokens/s over the tokens every side produced (the runner may stop at EOS)
        for calls in zip(*runs.values(), strict=True):
            n = min(len(call["tokens"]) for call in calls)
            for call in calls:
                seconds = (call["token_ms"][n - 1] - call["token_ms"][0]) / 1000
                call["tokens_per_s"], call["decode_tokens"] = (n - 1) / seconds if seconds > 0 else None, n - 1
                del call["token_ms"]
    pairs = {}
    for ours, theirs in spec["pairs"]:
        calls = list(zip(runs[ours], runs[theirs], strict=True))
        ratios = {"tokens_per_s": [a["tokens_per_s"] / b["tokens_per_s"] for a, b in calls
                                   if a["tokens_per_s"] and b["tokens_per_s"]],
                  "ttft_ms": [a["ttft_ms"] / b["ttft_ms"] for a, b in calls if b["ttft_ms"]]}
        by_generation = [{key: round(statistics.median(
            value for value, (a, _) in zip(values, calls) if a["generation"] == generation), 3)
            for key, values in ratios.items()} for generation in range(GENERATIONS)]
        mine, peer = made["sides"][ours], made["sides"][theirs]
        pairs[f"{ours} / {theirs}"] = {
            "decode_tokens_per_s_ratio": round(statistics.median(ratios["tokens_per_s"]), 3),
            "ttft_ratio": round(statistics.median(ratios["ttft_ms"]), 3),
            "ratios_by_generation": by_generation,
            "size_ratio": round(mine["bytes"] / peer["bytes"], 4),
            "nll_ratio": [mine["nll_ratio"], peer["nll_ratio"]],
            "top1_agreement": [mine["top1_agreement"], peer["top1_agreement"]],
            "calls": len(calls),
        }
    return {
        "runtime": {"openvino": "OpenVINO GenAI LLMPipeline (CPU, PagedAttention, INFERENCE_NUM_THREADS)",
                    "onnx": "onnxruntime-genai og.Model (CPU, intra_op_num_threads)",
                    "transformers.js": "transformers.js (Node, onnxruntime-node CPU, its default threads), by dtype",
                    "executorch": "ExecuTorch TextLLMRunner (XNNPACK, default thread pool)"}[export_format],
        "threads": {"executorch": {side: ready[side].get("threads") for side in ready},
                    "transformers.js": "onnxruntime-node's default"}.get(export_format, THREADS),
        "load_average_before": load_before, "load_average_after": load_after,
        "median": {side: {"decode_tokens_per_s": round(statistics.median(call["tokens_per_s"] for call in calls
                                                                          if call["tokens_per_s"]), 2),
                          "ttft_ms": round(statistics.median(call["ttft_ms"] for call in calls), 2)}
                   for side, calls in runs.items()},
        "pairs": pairs,
        "new_tokens": {side: calls[0]["tokens"] for side, calls in runs.items()},
    }


def gate(export_format: str, made: dict) -> dict:
    """Per hfexport side of `export_format` (`executorch` or `onnx`: its sides' folders are the gate's stage): the
    runtimes' greedy token agreement with model.generate on TEXTS, as the variant gate judges it
    (`hfexport.verify.variants`: `run_checks` against the variant's floor, `runtime_floor`); optimum-executorch from
    its venv (`hfexport.testing.peers`), as tests/test_smollm2_executorch_variants.py."""
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from hfexport.deployment import run_checks
    from hfexport.deployment.gate import generation_request
    from hfexport.formats import format_backend
    from hfexport.plan import build_plan
    from hfexport.recipe.loading import load_recipe
    from hfexport.verify.variants import runtime_floor

    from hfexport.testing import peers

    if export_format == "executorch":
        os.environ.setdefault("HFEXPORT_RUNTIME_OPTIMUM_EXECUTORCH", str(peers.optimum_executorch_venv()))
    else:  # as tests/conftest.py's runtime_env
        os.environ.setdefault("HFEXPORT_RUNTIME_OPTIMUM", str(peers.peer_venv()))
        os.environ.setdefault("HFEXPORT_RUNTIME_ONNXRUNTIME_GENAI", str(peers.genai_venv()))
        os.environ.setdefault("HFEXPORT_RUNTIME_TRANSFORMERS_JS", str(peers.node_modules()))
    spec = SIDES[export_format]
    name = spec["target"]
    recipe = load_recipe({"recipe_version": 1, "task": "text-generation", "sample_inputs": {"text": TEXTS},
                          "targets": {name: {"export_format": export_format, "mode": "generation"}}})
    model = AutoModelForCausalLM.from_pretrained(SMOLLM2, dtype=torch.float32).eval()
    request = generation_request(model, build_plan(recipe, name, model, None, AutoTokenizer.from_pretrained(SMOLLM2)),
                                 AutoTokenizer.from_pretrained(SMOLLM2))
    checked = {}
    for side, item in spec["hfexport"].items():
        request.file_name = format_backend(export_format).variant_file(item["name"])
        request.min_token_agreement = runtime_floor(item["name"])
        checks = run_checks(export_format, Path(made["sides"][side]["folder"]), request)
        checked[side] = {check.runtime: {"verdict": check.verdict, "token_agreement": check.to_dict().get(
            "token_agreement"), "floor": request.min_token_agreement} for check in checks}
        print(side, json.dumps(checked[side]), file=sys.stderr, flush=True)
    return checked


def main() -> dict:
    result = json.loads(OUT.read_text()) if OUT.is_file() else {}
    result.update({"about": __doc__.split("\n\n")[0], "machine": machine(), "rounds": ROUNDS,
                   "generations": GENERATIONS, "settle_s": SETTLE_S, "new_tokens": NEW_TOKENS, "prompts": len(CHAT)})
    result.setdefault("formats", {})
    for export_format in FORMATS:
        made_file = WORK / export_format / "made.json"
        if "make" in PHASES or not made_file.is_file():
            made = make(export_format)
            made_file.write_text(json.dumps(made, indent=2))
        made = json.loads(made_file.read_text())
        entry = {"sides": {side: {key: value for key, value in values.items() if key != "folder"}
                           for side, values in made["sides"].items()},
                 "f32_bytes": made["f32"]["bytes"], "make_seconds": made["make_seconds"]}
        if "gate" in PHASES and export_format in ("executorch", "onnx"):
            entry["gate"] = {"load_average_before": load(), "runtimes": gate(export_format, made)}
            entry["gate"]["load_average_after"] = load()
        if "speed" in PHASES:
            entry.update(speed(export_format, made))
            entry["generated"] = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())
        result["formats"][export_format] = {**result["formats"].get(export_format, {}), **entry}
        OUT.parent.mkdir(parents=True, exist_ok=True)
        OUT.write_text(json.dumps(result, indent=2) + "\n")
        print(export_format, json.dumps(result["formats"][export_format].get("pairs"), indent=2), file=sys.stderr,
              flush=True)
    return result


if __name__ == "__main__":
    main()
