"""Latency in the report: per target (a forward call, or a whole greedy generation), the artifact next to eager
torch at batch 1 and the largest declared batch (median of a few runs) on the verifying machine, in the report JSON,
its Markdown and the model card."""

from __future__ import annotations

import json

import pytest
from hfexport.latency import chart_rows, latency_markdown
from hfexport.report.card import render_section
from hfexport.report.markdown import report_markdown
from hfexport.report.model import JobReport, TargetReport


@pytest.fixture(scope="module")
def timed_job(tmp_path_factory, tiny_bert):
    """tiny-bert onnx + pt2 (forward, batch dim declared 1..8), one job."""
    from hfexport.job.run import run_job

    root = tmp_path_factory.mktemp("latency")
    bert = run_job(tiny_bert, root / "bert", targets=["onnx", "pt2"])
    return root, bert


def test_forward_targets_are_timed_at_batch_1_and_the_declared_maximum(timed_job):
    root, report = timed_job
    for name in ("onnx", "pt2"):
        target = report.targets[name]
        assert target.status == "ok", target.error
        latency = target.latency
        assert latency["runs"] == 5 and latency["cpu"] and latency["threads"] >= 1
        assert [point["batch"] for point in latency["points"]] == [1, 8]  # dims.batch.max of tiny-bert's recipe
        for point in latency["points"]:
            assert point["shapes"]["input_ids"][0] == point["batch"] == point["shapes"]["attention_mask"][0]
            assert point["artifact_ms"] > 0 and point["eager_ms"] > 0
            assert point["speedup"] == pytest.approx(point["eager_ms"] / point["artifact_ms"], rel=1e-2)
        assert target.timings["latency_s"] > 0
    # One job, one model, the same inputs: eager torch is timed once (with onnx, the first), pt2 reuses it.
    onnx_points, pt2_points = (report.targets[name].latency["points"] for name in ("onnx", "pt2"))
    assert all("eager_measured_with" not in point for point in onnx_points)
    assert [point.get("eager_measured_with") for point in pt2_points] == ["onnx", "onnx"]
    assert [point["eager_ms"] for point in pt2_points] == [point["eager_ms"] for point in onnx_points]
    saved = json.loads((root / "bert" / "onnx" / "export_report.json").read_text())
    assert saved["targets"]["onnx"]["latency"] == report.targets["onnx"].latency  # validated against the schema
    assert JobReport.read(root / "bert").targets["pt2"].latency == report.targets["pt2"].latency


def test_latency_is_rendered_in_the_report_and_the_card(timed_job):
    _, report = timed_job
    markdown = report_markdown(report)
    assert "### Latency on the verifying machine" in markdown and "median of 5 runs" in markdown
    rows = [line for line in markdown.splitlines() if line.startswith(("| `onnx` |", "| `pt2` |"))
            and line.count("|") == 7]
    assert len(rows) == 4, markdown  # two targets x two batch sizes
    card = render_section("user/model", report)
    section_start = card.index("### Latency")
    assert section_start < card.index("<details>")  # seen without opening the report
    rows = chart_rows(report)
    assert {row["run"] for row in rows} >= {"onnx · batch 1", "pt2 · batch 8", "eager torch · batch 1"}


def test_the_text_chart_scales_bars_to_the_slowest_of_each_batch():
    report = JobReport(source={"model": "m", "recipe_sha256": "0" * 64})
    point = lambda batch, artifact, eager: {"batch": batch, "artifact_ms": artifact, "eager_ms": eager,  # noqa: E731
                                            "speedup": round(eager / artifact, 3)}
    latency = lambda *points: {"runs": 5, "cpu": "Test CPU", "threads": 2, "cores": 2, "points": list(points)}  # noqa: E731
    report.targets["fast"] = TargetReport("fast", "onnx", "forward", latency=latency(point(1, 1.0, 10.0)))
    report.targets["slow"] = TargetReport("slow", "dynamo", "forward", latency=latency(point(1, 20.0, 10.0)))
    text = latency_markdown(report, bar_width=20)
    fast = next(line for line in text.splitlines() if line.startswith("| `fast`"))
    slow = next(line for line in text.splitlines() if line.startswith("| `slow`"))
    assert "10.00x faster" in fast and "0.50x slower" in slow
    assert fast.count("█") == 1 and slow.count("█") == 20
    assert text.index("`fast`") < text.index("`slow`")  # fastest first
    assert latency_markdown(JobReport(source={"model": "m"})) == ""


def test_a_job_without_verification_is_not_timed(tiny_llama, tmp_path):
    from hfexport.job.run import run_job

    report = run_job(tiny_llama, tmp_path / "out", targets=["pt2"], verify=False)
    assert report.targets["pt2"].latency is None


def test_generation_targets_are_timed_over_a_whole_greedy_generation(exported_llama):
    _, report = exported_llama
    for name in ("onnx-generation", "openvino-generation"):
        target = report.targets[name]
        assert target.status == "ok", target.error
        latency = target.latency
        assert "error" not in latency, latency
        assert [point["batch"] for point in latency["points"]] == [1, 8]  # axes left to torch.export: 1 and 8
        for point in latency["points"]:
            assert point["new_tokens"] == 8
            assert point["artifact_ms_per_token"] == pytest.approx(point["artifact_ms"] / 8, rel=1e-2)
            assert point["eager_ms"] > 0 and point["shapes"]["input_ids"][0] == point["batch"]
    text = latency_markdown(report)
    assert "`onnx-generation` (generate, 8 tokens)" in text
    assert any(row["run"].startswith("eager generate") for row in chart_rows(report))
