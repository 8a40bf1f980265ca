""".pt2 exports are checked before torch unpickles them: torch 2.13's `torch.export.load` runs pickles with
`weights_only=False` (sample inputs after a failed weights-only load, `use_pickle` weights and constants), so a
crafted archive would run code on load. A generation export (its sample inputs hold a cache) loads cleanly."""

from __future__ import annotations

import json
import pickle
import shutil
import zipfile

import pytest


class _Payload:
    """Unpickling this creates a file: harmless evidence that the pickle ran."""

    def __init__(self, marker):
        self.marker = str(marker)

    def __reduce__(self):
        return (open, (self.marker, "w"))


def _rewrite(archive, replace: dict) -> None:
    """Rewrite members of a zip archive (by path suffix)."""
    with zipfile.ZipFile(archive) as source:
        items = [(info, source.read(info.filename)) for info in source.infolist()]
    with zipfile.ZipFile(archive, "w") as target:
        for info, data in items:
            for suffix, new in replace.items():
                if info.filename.endswith(suffix):
                    data = new(data) if callable(new) else new
            target.writestr(info, data)


@pytest.fixture
def pt2_copy(exported_llama, tmp_path):
    output, _ = exported_llama
    folder = tmp_path / "pt2"
    shutil.copytree(output / "pt2", folder)
    return folder


def test_sample_inputs_pickle_is_refused_before_it_runs(pt2_copy, tmp_path):
    from hfexport import ExportedModel
    from hfexport.errors import UnsafeExportError

    marker = tmp_path / "ran"
    _rewrite(pt2_copy / "model.pt2", {"sample_inputs/model.pt": pickle.dumps(((), {"x": _Payload(marker)}))})
    with pytest.raises(UnsafeExportError, match="sample_inputs"):
        ExportedModel.from_pretrained(pt2_copy)
    assert not marker.exists()


def test_pickled_weight_is_refused_before_it_runs(pt2_copy, tmp_path):
    from hfexport import ExportedModel
    from hfexport.errors import UnsafeExportError

    marker = tmp_path / "ran"

    def flag_pickled(data: bytes) -> bytes:
        config = json.loads(data)
        first = next(iter(config["config"].values()))
        first["use_pickle"] = True
        return json.dumps(config).encode()

    with zipfile.ZipFile(pt2_copy / "model.pt2") as archive:
        config = json.loads(archive.read(next(n for n in archive.namelist() if n.endswith("weights_config.json"))))
    weight = next(iter(config["config"].values()))["path_name"]
    _rewrite(pt2_copy / "model.pt2", {"weights_config.json": flag_pickled,
                                      f"data/weights/{weight}": pickle.dumps(_Payload(marker))})
    with pytest.raises(UnsafeExportError, match="weights"):
        ExportedModel.from_pretrained(pt2_copy)
    assert not marker.exists()


def test_aotinductor_package_is_refused(pt2_copy):
    from hfexport.errors import UnsafeExportError
    from hfexport.formats.torch_export.pt2_safety import check_pt2_archive

    with zipfile.ZipFile(pt2_copy / "model.pt2", "a") as archive:
        root = archive.namelist()[0].split("/")[0]
        archive.writestr(f"{root}/data/aotinductor/model/model.so", b"\x7fELF")
    with pytest.raises(UnsafeExportError, match="AOTInductor"):
        check_pt2_archive(pt2_copy / "model.pt2")


def test_generation_pt2_loads_without_torchs_unsafe_fallback(layout_pt2, caplog):
    """A generation export's sample inputs hold a DynamicCache: loaded weights-only with the cache classes allowed,
    torch never reaches its `weights_only=False` fallback (which logs, and under pytest raised a TypeError)."""
    from hfexport import ExportedModel

    with caplog.at_level("WARNING", logger="torch._export.serde.serialize"):
        exported = ExportedModel.from_pretrained(layout_pt2)
    assert list(exported.runners) == ["prefill", "decode"]
    assert not [r for r in caplog.records if "weights_only=False" in r.msg]


@pytest.fixture(scope="module")
def layout_pt2(session_dir, tiny_llama):
    """A dynamo generation export (the cheapest format: no lowering)."""
    from hfexport.job.run import run_job

    recipe = json.loads((tiny_llama / "export_config.json").read_text())
    recipe["targets"] = {"pt2-generation": {"export_format": "dynamo", "mode": "generation",
                                            "options": {"dynamic": True}}}
    recipe["default_target"] = "pt2-generation"
    output = session_dir / "pt2-safety"
    report = run_job(tiny_llama, output, all_targets=True, recipe=recipe, verify=False)
    assert report.targets["pt2-generation"].status == "ok", report.targets["pt2-generation"].error
    return output / "pt2-generation"


def test_a_pt2_saved_without_example_inputs_passes_the_archive_check(tmp_path):
    """An encoder-decoder's .pt2 drops its `BaseModelOutput` example inputs (hfexport.export): torch.export.save
    then writes an empty `data/sample_inputs/model.pt`, which is no pickle to refuse."""
    import torch

    from hfexport.formats.torch_export.pt2_safety import check_pt2_archive

    class Double(torch.nn.Module):
        def forward(self, x):
            return x * 2

    program = torch.export.export(Double(), (torch.randn(2, 3),))
    program._example_inputs = None
    torch.export.save(program, tmp_path / "model.pt2")
    check_pt2_archive(tmp_path / "model.pt2")
