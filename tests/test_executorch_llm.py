"""ExecuTorch generation exports in the LLM runner's contract (issue 27): one `model.pte` that holds its KV cache, its
weights and the runner's metadata methods, `tokenizer.json` beside it; ExecuTorch's own `TextLLMRunner` and
optimum-executorch run them as their users do, token for token against `model.generate`, in the gate and from the
README's snippets; hfexport's `generate` runs the same files, and a program hfexport 0.1 published with its weights in
`model.ptd` still loads."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from hfexport.deployment import FAILED, NOT_CHECKED, PASSED, GenerationRequest, run_checks
from hfexport.testing.readme import readme_snippet

MAX_NEW_TOKENS = 8
TARGET = "pte-llm"


@pytest.fixture(scope="session")
def optimum_executorch():
    """optimum-executorch's own environment (hfexport.testing.peers), built once and cached."""
    from hfexport.testing import peers

    try:
        return peers.optimum_executorch_venv()
    except peers.PeerSetupError as error:
        pytest.fail(f"optimum-executorch's environment could not be built: {error}")


@pytest.fixture(scope="session")
def pte_llama(session_dir, tiny_llama, optimum_executorch):
    """tiny-llama with a recipe whose ExecuTorch generation target says nothing of its layout (the default), exported
    by a job with the gate's runtimes on (TextLLMRunner beside hfexport, optimum-executorch in its venv), once per
    session."""
    import os
    from unittest import mock

    from hfexport.job.run import run_job

    model = session_dir / "pte-llama-model"
    model.mkdir()
    for file in tiny_llama.iterdir():
        if file.name != "export_config.json":
            (model / file.name).symlink_to(file)
    recipe = json.loads((tiny_llama / "export_config.json").read_text())
    recipe["targets"] = {TARGET: {"export_format": "executorch", "mode": "generation", "options": {"backend": "xnnpack"},
                                  "parity": {"generate": {"max_new_tokens": MAX_NEW_TOKENS}}}}
    recipe["default_target"] = TARGET
    (model / "export_config.json").write_text(json.dumps(recipe))
    output = session_dir / "pte-llama"
    with mock.patch.dict(os.environ, {"HFEXPORT_RUNTIME_OPTIMUM_EXECUTORCH": str(optimum_executorch)}):
        report = run_job(model, output, latency=False)
    return output / TARGET, report


@pytest.fixture(scope="session")
def llama_texts(tiny_llama) -> list[str]:
    return json.loads((tiny_llama / "export_config.json").read_text())["sample_inputs"]["text"]


def test_the_default_executorch_generation_target_is_the_runners_program(pte_llama):
    from executorch.runtime import Runtime

    folder, report = pte_llama
    target = report.targets[TARGET]
    assert target.status == "ok", target.error
    assert {"model.pte", "tokenizer.json", "config.json", "generation_config.json"} <= \
        {path.name for path in folder.iterdir()}
    assert not (folder / "model.ptd").exists()  # the weights are inside: optimum-executorch reads no .ptd
    program = Runtime.get().load_program(folder / "model.pte")
    methods = set(program.method_names)
    assert {"forward", "get_max_seq_len", "get_max_context_len", "use_kv_cache", "enable_dynamic_shape",
            "use_sdpa_with_kv_cache", "get_eos_ids", "get_bos_id", "get_vocab_size"} <= methods
    assert program.load_method("get_max_seq_len").execute([])[0] == 256  # tiny-llama's max_position_embeddings
    assert list(program.load_method("get_eos_ids").execute([])) == [1]
    runtimes = {check["runtime"]: check for check in target.runtimes}
    check = runtimes["executorch-llm-runner"]
    assert check["verdict"] == PASSED, check
    assert check["version"] == "1.5.1" and check["batch_sizes"] == [1]
    check = runtimes["optimum-executorch"]
    assert check["verdict"] == PASSED, check
    assert check["version"] == "1.1.0" and check["batch_sizes"] == [1]


def test_the_program_returns_the_last_positions_logits(pte_llama, tiny_llama):
    """The runners read only the last position's logits (TextLLMRunner's `logits_to_token`, optimum-executorch's
    `logits[0, -1]`), so the program computes no others, as executorch's own Llama export: the same values as the
    model's last position."""
    import torch
    from executorch.runtime import Runtime
    from transformers import AutoModelForCausalLM

    from hfexport.formats.executorch.llm_program import register_custom_ops

    register_custom_ops()
    folder, report = pte_llama
    manifest = json.loads((folder / "export.json").read_text())
    assert manifest["components"]["model"]["metadata"]["export_config"]["last_logits"] is True
    method = Runtime.get().load_program(folder / "model.pte").load_method("forward")
    ids = torch.tensor([[1, 15, 65, 30, 43]])
    (logits,) = method.execute([ids, torch.arange(ids.shape[1])])
    model = AutoModelForCausalLM.from_pretrained(tiny_llama, dtype=torch.float32).eval()
    with torch.no_grad():
        want = model(ids).logits[:, -1:]
    assert logits.shape == want.shape == (1, 1, model.config.vocab_size)
    torch.testing.assert_close(logits, want, rtol=1e-4, atol=1e-4)


def test_the_program_attends_through_executorchs_llm_kernels(pte_llama):
    """Attention and the cache write are ExecuTorch's LLM kernels (issue 27's speed: the portable ops read, copy and
    mask all max_len cache slots every step; the kernels write in place and attend over the filled ones), recorded in
    the export config, and the portable ops that handled the whole cache are gone."""
    folder, report = pte_llama
    program = (folder / "model.pte").read_bytes()  # the flatbuffer names each operator the program calls
    assert b"llama::custom_sdpa" in program and b"llama::update_cache" in program
    for portable in (b"aten::index_put", b"aten::expand_copy", b"aten::logical_not"):
        assert portable not in program, portable
    manifest = json.loads((folder / "export.json").read_text())
    assert manifest["components"]["model"]["metadata"]["export_config"]["attention"] == "custom_sdpa"


def test_hfexports_generate_runs_the_same_files(pte_llama, tiny_llama, llama_texts):
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from hfexport import load

    tokenizer = AutoTokenizer.from_pretrained(tiny_llama)
    tokenizer.padding_side = "left"
    model = AutoModelForCausalLM.from_pretrained(tiny_llama, dtype=torch.float32).eval()
    inputs = tokenizer(llama_texts, return_tensors="pt", padding=True)
    exported = load(pte_llama[0])
    assert list(exported.components) == ["model"]
    want = model.generate(**inputs, max_new_tokens=12, do_sample=False)
    assert torch.equal(exported.generate(**inputs, max_new_tokens=12), want)  # batch 2, left-padded
    right = tokenizer(llama_texts[:1], return_tensors="pt")
    assert torch.equal(exported.generate(**right, max_new_tokens=12)[0], want[0][-right.input_ids.shape[1] - 12:])


def test_a_runner_that_differs_crashes_or_is_absent(pte_llama, monkeypatch, tmp_path):
    from hfexport.formats.executorch.runtimes import executorch_llm_runner

    folder = pte_llama[0]
    prompts, texts = [[0, 279]], ["The"]
    wrong = GenerationRequest(prompts, [[5, 6, 7]], 3, [1], texts=texts)
    check = executorch_llm_runner.check_generation(folder, wrong)
    assert check.verdict == FAILED and check.first_difference["position"] == 0
    with monkeypatch.context() as patched:
        patched.setattr(executorch_llm_runner, "interpreter", lambda runtime, name: None)
        assert [check.verdict for check in run_checks("executorch", folder, wrong)] == [NOT_CHECKED, NOT_CHECKED]
    crash = crashing_interpreter(tmp_path)
    monkeypatch.setenv("HFEXPORT_RUNTIME_EXECUTORCH_LLM_RUNNER", str(crash))
    crashed = executorch_llm_runner.check_generation(folder, wrong)
    assert crashed.verdict == FAILED and "exited 139" in crashed.reason
    monkeypatch.delenv("HFEXPORT_RUNTIME_EXECUTORCH_LLM_RUNNER")
    not_text = executorch_llm_runner.check_generation(folder, GenerationRequest(prompts, [[5]], 1, [1]))
    assert not_text.verdict == NOT_CHECKED and "text" in not_text.reason
    assert executorch_llm_runner.check_generation(tmp_path, wrong).verdict == NOT_CHECKED  # not the runner's contract


def crashing_interpreter(folder: Path) -> Path:
    """A "python" that dies as a segfaulting runtime does: the gate must fail the check with its message."""
    crash = folder / "crash"
    crash.write_text("#!/bin/sh\necho 'Segmentation fault' >&2\nexit 139\n")
    crash.chmod(0o755)
    return crash


def test_the_readme_snippet_runs_the_export_in_textllmrunner(pte_llama, tiny_llama, llama_texts, tmp_path):
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    (tmp_path / "out").mkdir()
    (tmp_path / "out" / TARGET).symlink_to(pte_llama[0])
    script = tmp_path / "snippet.py"
    script.write_text(readme_snippet("readme-llm-executorch"))
    done = subprocess.run([sys.executable, str(script)], cwd=tmp_path, capture_output=True, timeout=300)
    assert done.returncode == 0, done.stderr[-2000:]
    tokenizer = AutoTokenizer.from_pretrained(tiny_llama)
    model = AutoModelForCausalLM.from_pretrained(tiny_llama, dtype=torch.float32).eval()
    ids = tokenizer(llama_texts[0], return_tensors="pt").input_ids  # the README's prompt is the first sample
    new = model.generate(ids, max_new_tokens=MAX_NEW_TOKENS, do_sample=False)[0, ids.shape[1]:]
    first = tokenizer.decode(new[:1])  # the runner prints each piece's bytes on stdout as it goes
    assert first.strip() and first.encode() in done.stdout


def test_the_readme_snippet_runs_the_export_in_optimum_executorch(pte_llama, tiny_llama, llama_texts, tmp_path,
                                                                   optimum_executorch):
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    (tmp_path / "out").mkdir()
    (tmp_path / "out" / TARGET).symlink_to(pte_llama[0])
    script = tmp_path / "snippet.py"
    script.write_text(readme_snippet("readme-llm-optimum-executorch"))
    done = subprocess.run([str(optimum_executorch), str(script)], cwd=tmp_path, capture_output=True, text=True,
                          timeout=300)
    assert done.returncode == 0, done.stderr[-2000:]
    tokenizer = AutoTokenizer.from_pretrained(tiny_llama)
    model = AutoModelForCausalLM.from_pretrained(tiny_llama, dtype=torch.float32).eval()
    ids = tokenizer(llama_texts[0], return_tensors="pt").input_ids  # the README's prompt is the first sample
    new = model.generate(ids, max_new_tokens=MAX_NEW_TOKENS, do_sample=False)[0, ids.shape[1]:].tolist()
    printed = done.stdout.strip().splitlines()[-1]
    assert printed.startswith(str(new[:new.index(1) + 1] if 1 in new else new)), (printed, new)


def test_optimum_executorch_that_differs_crashes_is_absent_or_meets_a_ptd(pte_llama, optimum_executorch, monkeypatch,
                                                                          tmp_path):
    """A wrong expectation fails at its first differing token; a crash fails with its message; no environment, or a
    folder whose weights are in model.ptd (as hfexport 0.1 published them), is not checked, with the reason."""
    from hfexport.formats.executorch.runtimes import optimum_executorch as runtime

    folder = pte_llama[0]
    wrong = GenerationRequest([[1, 15, 65]], [[5, 6, 7]], 3, [1])
    monkeypatch.setenv("HFEXPORT_RUNTIME_OPTIMUM_EXECUTORCH", str(optimum_executorch))
    check = runtime.check_generation(folder, wrong)
    assert check.verdict == FAILED and check.first_difference["position"] == 0, check
    crash = crashing_interpreter(tmp_path)
    monkeypatch.setenv("HFEXPORT_RUNTIME_OPTIMUM_EXECUTORCH", str(crash))
    crashed = runtime.check_generation(folder, wrong)
    assert crashed.verdict == FAILED and "exited 139" in crashed.reason
    monkeypatch.setenv("HFEXPORT_RUNTIME_OPTIMUM_EXECUTORCH", str(tmp_path / "no-python"))
    absent = runtime.check_generation(folder, wrong)
    assert absent.verdict == NOT_CHECKED and "HFEXPORT_RUNTIME_OPTIMUM_EXECUTORCH" in absent.reason
    legacy = tmp_path / "legacy"
    legacy.mkdir()
    for file in folder.iterdir():
        (legacy / file.name).symlink_to(file)
    (legacy / "model.ptd").write_bytes(b"")
    assert "model.ptd" in runtime.check_generation(legacy, wrong).reason
    assert runtime.check_generation(tmp_path, wrong).verdict == NOT_CHECKED  # not the runner's contract


def test_a_program_published_with_its_weights_in_model_ptd_still_loads(tiny_llama, llama_texts, tmp_path,
                                                                        monkeypatch):
    """hfexport 0.1 published the LLM runner program with its weights in `model.ptd` beside it; such a folder still
    loads (the loader hands ExecuTorch the data file) and generates token for token. Made here as 0.1 wrote it: the
    program's constants tagged external, the data file written beside the `.pte`."""
    import shutil

    import executorch.exir
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from hfexport import load
    from hfexport.formats.executorch.llm_program import export

    real_config, real_write = executorch.exir.ExecutorchBackendConfig, executorch.exir.ExecutorchProgramManager.write_to_file

    def write_with_data(manager, file):
        real_write(manager, file)
        manager.write_tensor_data_to_file(str(Path(file.name).parent))

    monkeypatch.setattr(executorch.exir, "ExecutorchBackendConfig",
                        lambda **options: real_config(external_constants=lambda node: "model", **options))
    monkeypatch.setattr(executorch.exir.ExecutorchProgramManager, "write_to_file", write_with_data)
    model = AutoModelForCausalLM.from_pretrained(tiny_llama, dtype=torch.float32).eval()
    tokenizer = AutoTokenizer.from_pretrained(tiny_llama)
    exported = export(model, None, {"max_cache_len": 64})
    monkeypatch.undo()
    folder = tmp_path / "published-by-0.1"
    exported.save_pretrained(folder, tokenizer=tokenizer)
    shutil.copyfile(Path(exported.components["model"].program.path).with_suffix(".ptd"), folder / "model.ptd")
    loaded = load(folder)
    ids = tokenizer(llama_texts[:1], return_tensors="pt").input_ids
    want = model.generate(ids, max_new_tokens=8, do_sample=False)
    assert torch.equal(loaded.generate(ids, max_new_tokens=8), want)
    (folder / "model.ptd").unlink()  # the program needs it: without it, no silent garbage
    with pytest.raises(Exception, match="model.ptd|external|data"):
        load(folder).generate(ids, max_new_tokens=8)


def test_an_executorch_target_that_asks_for_the_engines_graphs_keeps_them():
    from hfexport.recipe.data import Target

    def target(generation=None, **extra):
        return Target.from_dict("t", {"export_format": "executorch", "mode": "generation",
                                      "generation": generation or {}, **extra})

    assert target().llm_runner_by_default
    assert target({"max_cache_len": 64}).llm_runner_by_default  # the runner's cache size
    assert not target({"single_graph": True}).llm_runner_by_default
    assert not target({"single_graph": False}).llm_runner_by_default
    assert not target({"multi_token_decode": True}).llm_runner_by_default
    assert not target({"cache_implementation": "static", "max_cache_len": 64}).llm_runner_by_default
    assert not Target.from_dict("t", {"export_format": "onnx", "mode": "generation"}).llm_runner_by_default


def test_the_card_shows_the_runner_snippet_only_when_it_passed(pte_llama):
    import copy

    from hfexport.layout import Place
    from hfexport.report.card import loading_snippets

    report = copy.deepcopy(pte_llama[1])
    places = {TARGET: Place("executorch")}
    text = "\n".join(loading_snippets("me/llama", report, places))  # the gate passed it
    assert 'TextLLMRunner(f"{local}/model.pte", f"{local}/tokenizer.json")' in text
    assert "ExecuTorchModelForCausalLM.from_pretrained(local)" in text
    report.targets[TARGET].runtimes = [{"runtime": "executorch-llm-runner", "verdict": "failed", "reason": "differs"},
                                       {"runtime": "optimum-executorch", "verdict": "not_checked", "reason": "absent"}]
    text = "\n".join(loading_snippets("me/llama", report, places))
    assert "TextLLMRunner" not in text and "ExecuTorchModelForCausalLM" not in text


def test_inverse_transpose_pairs_are_dropped_from_the_traced_program():
    """The sequence-major cache update transposes the model's `[batch, heads, seq, head_dim]` values back: the pair is
    the identity, and kept it holds the value projection in an XNNPACK delegate of its own, ahead of the rotary
    embedding (benchmarks/README.md, ExecuTorch: 2-4% of SmolLM2's decode on 2 threads). A pair that is not inverse,
    or whose result is the program's output, stays."""
    import torch

    from hfexport.formats.executorch.llm_program import _drop_inverse_transposes

    class Attention(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.values = torch.nn.Linear(8, 8)

        def forward(self, x):
            values = self.values(x).view(1, 3, 2, 4).transpose(1, 2)  # the model's layout
            cached = values.transpose(1, 2) * 2  # the cache's layout again: the pair is dropped
            other = values.transpose(2, 3) + 1  # not the inverse: kept
            return cached, other, values.transpose(1, 2)  # the inverse too, but the program's output: kept

    module = Attention().eval()
    x = torch.randn(1, 3, 8)
    program = torch.export.export(module, (x,), strict=True)
    transposes = [node for node in program.graph.nodes if node.target == torch.ops.aten.transpose.int]
    assert len(transposes) == 4
    assert _drop_inverse_transposes(program) == 1
    assert len([node for node in program.graph.nodes if node.target == torch.ops.aten.transpose.int]) == 3
    for got, want in zip(program.module()(x), module(x), strict=True):
        assert torch.equal(got, want)
