"""The gate's runtime step (hfexport.deployment): the expected tokens every deployment runtime is held to, the
verdicts, and a runtime that crashes or hangs failing its own check while the others still run."""

from __future__ import annotations

import sys
import types

import pytest

from hfexport import deployment
from hfexport.formats import format_backend
from hfexport.deployment import FAILED, NOT_CHECKED, PASSED, RuntimeCheck, compare_tokens, first_difference


def test_first_difference_names_the_prompt_and_position():
    assert first_difference([[1, 2, 3]], [[1, 2, 3]]) is None
    assert first_difference([[1, 2, 3], [4, 5]], [[1, 2, 3], [4, 6]]) == {
        "prompt": 1, "position": 1, "expected": 5, "got": 6}
    assert first_difference([[1, 2]], [[1, 2, 9]]) == {"prompt": 0, "position": 2, "expected": None, "got": 9}
    check = compare_tokens("rt", [[1, 2]], [[1, 3]], version="1.0")
    assert (check.verdict, check.version, check.first_difference["position"]) == (FAILED, "1.0", 1)
    assert "differs at new token 1" in check.reason
    assert compare_tokens("rt", [[7]], [[7]]).to_dict() == {"runtime": "rt", "verdict": PASSED}


@pytest.fixture(scope="module")
def llama_plan(tiny_llama):
    from hfexport.models import load_model, load_processor
    from hfexport.plan import build_plan
    from hfexport.recipe.loading import load_recipe

    recipe = load_recipe(tiny_llama)
    model = load_model(tiny_llama, recipe)
    processor = load_processor(tiny_llama)
    return model, build_plan(recipe, "onnx-generation", model, processor=processor), processor


def test_the_request_holds_model_generate_per_prompt_and_left_padded(llama_plan):
    import torch

    from hfexport.deployment.gate import generation_request

    model, plan, processor = llama_plan
    request = generation_request(model, plan, processor)
    assert request.texts == plan.recipe.sample_inputs["text"]
    assert len(request.prompts) == len(request.expected) == 2
    assert len(request.prompts[0]) != len(request.prompts[1])  # so the padded batch really pads
    for prompt, expected in zip(request.prompts, request.expected, strict=True):
        ids = torch.tensor([prompt])
        with torch.no_grad():
            out = model.generate(ids, attention_mask=torch.ones_like(ids), do_sample=False,
                                 max_new_tokens=request.max_new_tokens, pad_token_id=request.pad_token_id)
        assert request.cut(out[0, len(prompt):].tolist()) == expected
        assert 0 < len(expected) <= request.max_new_tokens
    assert request.padded_expected is not None and len(request.padded_expected) == 2


def test_a_crashing_runtime_fails_its_check_and_the_others_still_run(llama_plan, monkeypatch, tmp_path):
    from hfexport.deployment.gate import generation_request

    model, plan, processor = llama_plan
    request = generation_request(model, plan, processor)

    def crash(folder, request):
        raise OSError("libfoo.so: cannot open shared object file (token hf_secretsecretsecret)")

    def absent(folder, request):
        return RuntimeCheck("absent-runtime", NOT_CHECKED, reason="not installed")

    for name, check in (("crashing", crash), ("absent", absent)):
        module = types.ModuleType(f"hfexport.deployment.{name}")
        module.RUNTIME, module.check_generation = f"{name}-runtime", check
        monkeypatch.setitem(sys.modules, module.__name__, module)
    monkeypatch.setattr(format_backend("onnx"), "runtimes",
                        ("hfexport.deployment.crashing", "hfexport.deployment.absent"))
    from hfexport.errors import register_secret

    register_secret("hf_secretsecretsecret")
    checks = deployment.run_checks("onnx", tmp_path, request)
    assert [(c.runtime, c.verdict) for c in checks] == [("crashing-runtime", FAILED), ("absent-runtime", NOT_CHECKED)]
    assert "cannot open shared object" in checks[0].reason and "hf_secret" not in checks[0].reason


def test_a_hanging_client_is_stopped_and_named():
    with pytest.raises(deployment.RuntimeClientError, match="time limit of 1 s"):
        deployment.run_client([sys.executable, "-c", "import time; time.sleep(30)"], timeout=1)
    with pytest.raises(deployment.RuntimeClientError, match="exited 3"):
        deployment.run_client([sys.executable, "-c", "import sys; print('boom', file=sys.stderr); sys.exit(3)"],
                              timeout=30)
    assert deployment.run_client([sys.executable, "-c", "print('log'); print('{\"a\": 1}')"], timeout=30) == {"a": 1}


def test_a_client_killed_for_memory_is_named_so():
    """A runtime the OOM killer or a cgroup limit ends (SIGKILL) says so, not only "exited -9" (a float16 1B model's
    runtimes in 3 GB, issue 45)."""
    script = "import os, signal; os.kill(os.getpid(), signal.SIGKILL)"
    with pytest.raises(deployment.RuntimeClientError) as killed:
        deployment.run_client([sys.executable, "-c", script], timeout=30)
    assert str(killed.value).startswith("exited -9 (killed by signal 9: out of memory?)")


def test_a_runtimes_time_limit_grows_with_the_model():
    """300 s for a tiny model, 300 s more per billion parameters (a 1.2B model's runtime took 297 s on loaded cores)."""
    import torch

    from hfexport.deployment.gate import runtime_time_limit

    with torch.device("meta"):
        tiny, billion = torch.nn.Linear(10, 10), torch.nn.Linear(50_000, 20_000, bias=False)
    assert runtime_time_limit(tiny) == pytest.approx(300.0, abs=0.1)
    assert runtime_time_limit(billion) == pytest.approx(600.0)


def test_the_report_renders_each_runtimes_verdict():
    from hfexport.report.markdown import runtimes_markdown
    from hfexport.report.data import JobReport, TargetReport

    checks = [RuntimeCheck("onnxruntime-genai", PASSED, version="0.9.0", batch_sizes=[1, 2]).to_dict(),
              RuntimeCheck("transformers.js", NOT_CHECKED, reason="Node.js is not installed").to_dict()]
    text = runtimes_markdown(checks)
    assert "| onnxruntime-genai | 0.9.0 | ✅ passed | 1, 2 |" in text
    assert "➖ not checked" in text and "Node.js is not installed" in text
    target = TargetReport("onnx-generation", "onnx", "generation", runtimes=checks)
    report = JobReport(source={"model": "m", "recipe_sha256": "0" * 64}, targets={"onnx-generation": target})
    assert JobReport.from_dict(report.to_dict()).targets["onnx-generation"].runtimes == checks  # schema-valid


def test_the_model_generates_only_when_a_runtime_reads_the_tokens(llama_plan, monkeypatch, tmp_path):
    """Where no runtime of the format runs (none installed), the gate does not make the model generate; the first
    runtime that reads the tokens gets the same ones `model.generate` gives, generated once."""
    from hfexport.deployment.gate import check_runtimes, generation_request

    model, plan, processor = llama_plan
    expected = generation_request(model, plan, processor)
    expected = (expected.expected, expected.padded_expected)
    calls = []
    generate = model.generate
    monkeypatch.setattr(model, "generate", lambda *args, **kwargs: calls.append(1) or generate(*args, **kwargs))

    def absent(folder, request):
        return RuntimeCheck("absent-runtime", NOT_CHECKED, reason="not installed")

    def reader(folder, request):
        return compare_tokens("reader-runtime", request.expected, request.expected)

    for name, check in (("absent", absent), ("reader", reader)):
        module = types.ModuleType(f"hfexport.deployment.{name}")
        module.RUNTIME, module.check_generation = f"{name}-runtime", check
        monkeypatch.setitem(sys.modules, module.__name__, module)
    monkeypatch.setattr(format_backend("onnx"), "runtimes", ("hfexport.deployment.absent",))
    assert [c.verdict for c in check_runtimes(tmp_path, model, plan, processor)] == [NOT_CHECKED]
    assert not calls
    monkeypatch.setattr(format_backend("onnx"), "runtimes",
                        ("hfexport.deployment.absent", "hfexport.deployment.reader", "hfexport.deployment.reader"))
    request = generation_request(model, plan, processor)
    assert not calls
    assert [c.verdict for c in deployment.run_checks("onnx", tmp_path, request)] == [NOT_CHECKED, PASSED, PASSED]
    assert (request.expected, request.padded_expected) == expected and len(calls) == 3  # 2 prompts + padded batch


CLIENT = """import json, sys
import warm_probe_module

mode = json.load(open(sys.argv[2]))["mode"]
if mode == "crash":
    print("RuntimeError: the runtime crashed", file=sys.stderr)
    sys.exit(3)
if mode == "hang":
    import time
    time.sleep(30)
print("a log line")
print(json.dumps({"folder": sys.argv[1], "cwd": __import__("os").getcwd(), "stdin": sys.stdin.read(),
                  "imports": open(warm_probe_module.COUNT).read(), "name": __name__}))
"""


def test_warm_clients_run_each_client_as_its_own_process_after_one_import(tmp_path, monkeypatch):
    """Inside `warm_clients()` a Python runtime's client is forked from a server that ran its imports once: the same
    answer, error line and time limit as a cold start (`run_client`), the imports counted once for three runs; an
    interpreter that is no fork server (a wrapper script) is run cold, as before."""
    from hfexport.deployment._python import run_python_client
    from hfexport.deployment.warm import warm_clients

    (tmp_path / "warm_probe_module.py").write_text(
        f"COUNT = {str(tmp_path / 'count')!r}\nwith open(COUNT, 'a') as f:\n    f.write('i')\n")
    client = tmp_path / "client.py"
    client.write_text(CLIENT)
    monkeypatch.setenv("PYTHONPATH", str(tmp_path))

    def run(mode: str, timeout: float = 60, python: str = sys.executable):
        return run_python_client(python, client, tmp_path / "model", {"mode": mode}, timeout)

    cold = run("ok")
    assert cold["imports"] == "i" and cold["stdin"] == "" and cold["name"] == "__main__"
    with pytest.raises(deployment.RuntimeClientError) as cold_crash:
        run("crash")
    (tmp_path / "count").unlink()
    with warm_clients():
        warm = [run("ok") for _ in range(2)]
        with pytest.raises(deployment.RuntimeClientError) as warm_crash:
            run("crash")
        with pytest.raises(deployment.RuntimeClientError, match="time limit of 1 s"):
            run("hang", timeout=1)
        warm.append(run("ok"))  # the server goes on after a client it stopped
        wrapper = tmp_path / "python-wrapper"  # a launcher that runs client scripts only
        wrapper.write_text(f"#!/bin/sh\ncase \"$1\" in *warm_server.py) echo 'clients only'; exit 2;; esac\n"
                           f"exec {sys.executable} \"$@\"\n")
        wrapper.chmod(0o755)
        assert run("ok", python=str(wrapper))["imports"] == "ii"  # its own interpreter start: run cold
    assert all(answer["imports"] == "i" for answer in warm[:3]), warm  # one import for the three forked runs
    assert [{**answer, "imports": None, "cwd": None} for answer in warm] == [{**cold, "imports": None, "cwd": None}] * 3
    assert str(warm_crash.value) == str(cold_crash.value) == "exited 3: RuntimeError: the runtime crashed"
