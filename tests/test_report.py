"""The report's recorded facts."""


def test_the_reports_hfexport_version_is_the_sources():
    """An editable install's metadata keeps the version it was installed at; the cache key must change with the
    source's version (a changed published layout), so the report takes `hfexport.__version__`."""
    import hfexport
    from hfexport.report.data import package_versions

    assert package_versions()["hfexport"] == hfexport.__version__


def test_the_report_names_each_format_by_its_one_name():
    """Issue 44: the report's format column says "torch.export" / "ExecuTorch", not the engine's `dynamo`."""
    from hfexport.report.markdown import report_markdown
    from hfexport.report.data import JobReport, TargetReport

    report = JobReport(source={"model": "m", "recipe_sha256": "0" * 64})
    report.targets["pt2"] = TargetReport("pt2", "dynamo", "forward")
    report.targets["pte"] = TargetReport("pte", "executorch", "forward")
    text = report_markdown(report)
    assert "| `pt2` | torch.export | forward |" in text and "| `pte` | ExecuTorch | forward |" in text, text
    assert "dynamo" not in text
