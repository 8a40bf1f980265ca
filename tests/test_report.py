"""The report's recorded facts."""


def test_the_reports_hfexport_version_is_the_sources():
    """An editable install's metadata keeps the version it was installed at; the cache key must change with the
    source's version (a changed published layout), so the report takes `hfexport.__version__`."""
    import hfexport
    from hfexport.report.model import package_versions

    assert package_versions()["hfexport"] == hfexport.__version__
