"""Tampered exports of the bundled examples, loaded through `hfexport.load` / `ExportedModel.from_pretrained` /
`hfexport verify`: each attack class of issue 11 is refused with hfexport's own error naming the file, and no payload
runs. Payloads create a marker file when they execute (a pickle reducing to `open(marker, "w")`, a manifest context
naming `builtins:open`); every refusal test asserts the marker does not exist, and the control tests show the same
archives do run their payload under the engine's own loader, so the crafted files are real exploits.

The property tests at the end mutate real exports at random (archive members added, duplicated, renamed, headers
changed; manifest fields changed in type and size; files replaced by links and special files) and assert that only
`UnsafeExportError` / `CorruptExportError` ever come out, and that the marker never appears.
"""

from __future__ import annotations

import copy
import io
import json
import os
import pickle
import shutil
import uuid
import warnings
import zipfile
from pathlib import Path

import hfexport
import pytest
from hfexport.errors import CorruptExportError, HfExportError, UnsafeExportError
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

HYPOTHESIS = settings(max_examples=40, deadline=None, derandomize=True,
                      suppress_health_check=[HealthCheck.too_slow, HealthCheck.function_scoped_fixture])


class _Payload:
    """Unpickling this creates the marker file: harmless evidence that a pickle ran."""

    def __init__(self, marker):
        self.marker = str(marker)

    def __reduce__(self):
        return (open, (self.marker, "w"))


def _payload(marker: Path) -> bytes:
    return pickle.dumps(((), {"x": _Payload(marker)}))


def _inputs():
    import torch

    return {"input_ids": torch.ones(1, 5, dtype=torch.long), "attention_mask": torch.ones(1, 5, dtype=torch.long)}


@pytest.fixture
def marker(tmp_path) -> Path:
    path = tmp_path / f"pwned-{uuid.uuid4().hex[:8]}"
    assert not path.exists()
    return path


@pytest.fixture
def target(exported_bert, tmp_path):
    """`target("onnx")`: a private copy of that target folder of the session's tiny-bert export."""
    output, _ = exported_bert

    def copy_of(name: str) -> Path:
        folder = tmp_path / name
        shutil.copytree(output / name, folder)
        return folder

    return copy_of


def _refused(folder: Path, error=UnsafeExportError, *named: str, **kwargs) -> str:
    """Load `folder`, expecting `error` whose one-line message names each of `named`; return the message."""
    with pytest.raises(error) as raised:
        hfexport.load(folder, **kwargs)
    message = str(raised.value)
    assert "\n" not in message and "Traceback" not in message
    for name in named:
        assert name in message, message
    return message


# ── .pt2 archives ────────────────────────────────────────────────────────────


def _members(archive: Path) -> list[tuple[zipfile.ZipInfo, bytes]]:
    with zipfile.ZipFile(archive) as source:
        return [(info, source.read(info)) for info in source.infolist()]


def _write(archive: Path, items) -> None:
    """Write `(ZipInfo or name, bytes)` items in order (duplicates kept: zipfile only warns)."""
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        with zipfile.ZipFile(archive, "w") as target:
            for info, data in items:
                target.writestr(info, data)


def _root(items) -> str:
    return items[0][0].filename.split("/")[0]


def _legacy_weights(archive: Path, marker: Path) -> str:
    items = _members(archive)
    _write(archive, [*items, (f"{_root(items)}/data/weights/model.pt", _payload(marker))])
    return "data/weights/model.pt"


def _second_program(archive: Path, marker: Path) -> str:
    """A program in a subfolder of `models/`, with a legacy weights file the old check did not look at."""
    items = _members(archive)
    root, by_name = _root(items), {info.filename: data for info, data in items}
    extra = [(f"{root}/models/extra/model.json", by_name[f"{root}/models/model.json"]),
             (f"{root}/data/sample_inputs/extra/model.pt", by_name[f"{root}/data/sample_inputs/model.pt"]),
             (f"{root}/data/weights/extra/model.pt", _payload(marker)),
             (f"{root}/data/constants/extra/model_constants_config.json",
              by_name[f"{root}/data/constants/model_constants_config.json"])]
    _write(archive, [*items, *extra])
    return "models/extra/model.json"


def _duplicate_entry(archive: Path, marker: Path) -> str:
    """Two entries named like the sample inputs: torch's reader takes the first (the payload), zipfile the last."""
    items = _members(archive)
    name = f"{_root(items)}/data/sample_inputs/model.pt"
    original = next(data for info, data in items if info.filename == name)
    rest = [(info, data) for info, data in items if info.filename != name]
    _write(archive, [(name, _payload(marker)), *rest, (name, original)])
    return "duplicate zip entry"


def _legacy_format(archive: Path, marker: Path) -> str:
    """The pre-2.7 zip format, which `torch.export.load` falls back to when the current loader fails."""
    items = _members(archive)
    root, by_name = _root(items), {info.filename: data for info, data in items}
    _write(archive, [("version", b"8.20"),
                     ("serialized_exported_program.json", by_name[f"{root}/models/model.json"]),
                     ("serialized_state_dict.pt", _payload(marker)),
                     ("serialized_constants.pt", b""), ("serialized_example_inputs.pt", b"")])
    return "version"


CODE_EXECUTION = [_legacy_weights, _second_program, _duplicate_entry, _legacy_format]


@pytest.mark.parametrize("craft", CODE_EXECUTION, ids=lambda f: f.__name__.strip("_"))
def test_control_torch_runs_the_crafted_archive(target, marker, craft):
    """Control: `torch.export.load` (what the engine's loader calls) runs the payload of each crafted archive."""
    import torch

    folder = target("pt2")
    craft(folder / "model.pt2", marker)
    try:
        torch.export.load(folder / "model.pt2")
    except Exception:  # noqa: BLE001 - the payload runs before the load fails on what follows it
        pass
    assert marker.exists()


@pytest.mark.parametrize("craft", CODE_EXECUTION, ids=lambda f: f.__name__.strip("_"))
def test_crafted_archives_are_refused_and_nothing_runs(target, marker, craft):
    folder = target("pt2")
    named = craft(folder / "model.pt2", marker)
    message = _refused(folder, UnsafeExportError, "model.pt2", named)
    assert "refused" in message
    assert not marker.exists()


def test_local_header_naming_another_member_is_refused(target, marker):
    """A local header whose name differs from the central directory's (readers that walk local headers see another
    member)."""
    folder = target("pt2")
    archive = folder / "model.pt2"
    data = bytearray(archive.read_bytes())
    with zipfile.ZipFile(archive) as source:
        info = next(i for i in source.infolist() if i.filename.endswith("sample_inputs/model.pt"))
    start = info.header_offset + 30
    data[start:start + len(info.filename)] = info.filename.replace("model.pt", "pwned.pt").encode()
    archive.write_bytes(bytes(data))
    _refused(folder, UnsafeExportError, "model.pt2", "local header names", "pwned.pt")


def test_weights_only_unpickling_stops_a_payload_that_slipped_past(marker):
    """The second line: inside `weights_only_unpickling`, torch.load(weights_only=False) is still weights-only."""
    import torch
    from hfexport.formats.torch_export.pt2_safety import weights_only_unpickling

    with weights_only_unpickling(), pytest.raises(pickle.UnpicklingError):
        torch.load(io.BytesIO(pickle.dumps(_Payload(marker))), weights_only=False)
    assert not marker.exists()
    assert "TORCH_FORCE_WEIGHTS_ONLY_LOAD" not in os.environ


def test_allow_unsafe_pt2_loads_what_hfexport_cannot_vouch_for(target):
    """An extra member torch ignores: refused by default, loaded when the caller opts in."""
    folder = target("pt2")
    items = _members(folder / "model.pt2")
    _write(folder / "model.pt2", [*items, (f"{_root(items)}/extra/notes.txt", b"hello")])
    _refused(folder, UnsafeExportError, "extra/notes.txt", "not a member torch.export.save writes")
    model = hfexport.load(folder, allow_unsafe_pt2=True)
    assert model(**_inputs()).last_hidden_state.shape[:2] == (1, 5)


# ── nothing outside the folder is opened ─────────────────────────────────────


@pytest.fixture
def outside(tmp_path) -> Path:
    folder = tmp_path / "outside"
    folder.mkdir()
    return folder


@pytest.mark.parametrize("name", ["model.onnx", "model.onnx.data", "export.json", "config.json"])
def test_a_file_linked_outside_the_folder_is_refused(target, outside, name):
    folder = target("onnx")
    shutil.move(folder / name, outside / name)  # the real file, so a loader that followed the link would load it
    (folder / name).symlink_to(outside / name)
    _refused(folder, UnsafeExportError, f"{name}: resolves to", "outside the export folder")


def test_a_subfolder_linked_outside_is_refused(target, outside):
    folder = target("onnx")
    for name in ("model.onnx", "model.onnx.data"):
        shutil.move(folder / name, outside / name)
    (folder / "sub").symlink_to(outside, target_is_directory=True)
    manifest = json.loads((folder / "export.json").read_text())
    manifest["components"]["model"]["file"] = "sub/model.onnx"
    (folder / "export.json").write_text(json.dumps(manifest))
    _refused(folder, UnsafeExportError, "sub/model.onnx", "outside the export folder")


def test_a_target_folder_linked_outside_is_refused(exported_bert, tmp_path):
    """`load(folder, target=...)` stays inside `folder`: `exports/onnx` linking to another export is refused."""
    output, _ = exported_bert
    (tmp_path / "repo" / "exports").mkdir(parents=True)
    (tmp_path / "repo" / "exports" / "onnx").symlink_to(output / "onnx", target_is_directory=True)
    with pytest.raises(UnsafeExportError, match=r"exports/onnx: resolves to .*, outside .*repo: refused"):
        hfexport.load(tmp_path / "repo", target="onnx")


def test_openvino_weights_linked_outside_are_refused(target, outside):
    folder = target("openvino")
    shutil.move(folder / "openvino_model.bin", outside / "openvino_model.bin")
    (folder / "openvino_model.bin").symlink_to(outside / "openvino_model.bin")
    _refused(folder, UnsafeExportError, "openvino_model.bin", "outside the export folder")


def test_executorch_weights_linked_outside_are_refused(target, outside):
    folder = target("pte")
    shutil.move(folder / "model.ptd", outside / "model.ptd")
    (folder / "model.ptd").symlink_to(outside / "model.ptd")
    _refused(folder, UnsafeExportError, "model.ptd", "outside the export folder")


def _ptd_segment_index(path: Path) -> None:
    """Point a named entry of the `.ptd` at a segment the file does not have (its stored index patched in place; the
    first entry whose index is written out: flatbuffers omit an index of 0)."""
    import struct

    data = bytearray(path.read_bytes())

    def at(position: int, fmt: str = "<I") -> int:
        return struct.unpack_from(fmt, data, position)[0]

    root = at(0)
    named = root + at(root - at(root, "<i") + 8, "<H")
    vector = named + at(named)
    for index in range(at(vector)):
        entry = vector + 4 + 4 * index + at(vector + 4 + 4 * index)
        field = at(entry - at(entry, "<i") + 6, "<H")
        if field:
            struct.pack_into("<I", data, entry + field, 1 << 20)
            break
    path.write_bytes(bytes(data))


def _set_external_location(folder: Path, location: str, **fields) -> None:
    import onnx

    model = onnx.load(folder / "model.onnx", load_external_data=False)
    tensor = next(t for t in model.graph.initializer if t.data_location == onnx.TensorProto.EXTERNAL)
    values = {entry.key: entry.value for entry in tensor.external_data} | {"location": location} | fields
    del tensor.external_data[:]
    for key, value in values.items():
        tensor.external_data.add(key=key, value=value)
    (folder / "model.onnx").write_bytes(model.SerializeToString())


@pytest.mark.parametrize("location", ["../outside.data", "/etc/hostname", "sub/../../x.data"])
def test_onnx_external_data_outside_is_refused_before_onnx_runtime(target, outside, location):
    folder = target("onnx")
    _set_external_location(folder, location)
    _refused(folder, UnsafeExportError, "model.onnx", "external_data.location", repr(location))


def test_external_data_hidden_in_a_subgraph_attribute_is_refused(target):
    """A Constant node inside an If branch whose tensor lives in `/etc/hostname`: found by the walk over attributes."""
    import onnx
    from onnx import TensorProto, helper

    folder = target("onnx")
    model = onnx.load(folder / "model.onnx", load_external_data=False)
    tensor = helper.make_tensor("hidden", TensorProto.FLOAT, [1], [0.0])
    tensor.data_location = TensorProto.EXTERNAL
    tensor.ClearField("float_data")
    tensor.external_data.add(key="location", value="/etc/hostname")
    branch = helper.make_graph([helper.make_node("Constant", [], ["hidden_out"], value=tensor)], "branch", [],
                               [helper.make_tensor_value_info("hidden_out", TensorProto.FLOAT, [1])])
    model.graph.initializer.append(helper.make_tensor("hidden_cond", TensorProto.BOOL, [], [True]))
    model.graph.node.append(helper.make_node("If", ["hidden_cond"], ["hidden_if"], then_branch=branch,
                                             else_branch=branch))
    (folder / "model.onnx").write_bytes(model.SerializeToString())
    _refused(folder, UnsafeExportError, "model.onnx", "then_branch.g.node[0].attribute.value.t", "'/etc/hostname'")


def test_the_onnx_subset_reads_the_fields_onnx_declares():
    """`safety.onnx_proto`, which parses `.onnx` files for the external-data check without importing onnx, declares
    each field it reads with onnx's own number, type and cardinality, and sizes each element type as onnx does."""
    import onnx
    from google.protobuf.descriptor import FieldDescriptor
    from hfexport.formats.onnx import proto as onnx_proto

    scalars = {"string": FieldDescriptor.TYPE_STRING, "int64": FieldDescriptor.TYPE_INT64,
               "int32": FieldDescriptor.TYPE_INT32, "TensorProto.DataLocation": FieldDescriptor.TYPE_ENUM}
    ours = onnx_proto.model_proto().DESCRIPTOR
    for message, fields in onnx_proto.FIELDS.items():
        theirs = getattr(onnx, message).DESCRIPTOR
        assert theirs.file.name == "onnx/onnx-ml.proto"
        for name, number, kind, repeated in fields:
            field = theirs.fields_by_name[name]
            assert (field.number, field.is_repeated) == (number, repeated), (message, name)
            if kind in scalars:
                assert field.type == scalars[kind], (message, name)
            else:
                assert field.type == FieldDescriptor.TYPE_MESSAGE and field.message_type.name == kind
    assert dict(onnx.TensorProto.DataLocation.items()) == onnx_proto.DATA_LOCATION
    assert ours.full_name == f"{onnx_proto.PACKAGE}.ModelProto"  # its own pool: onnx's classes stay as they are
    for name, number in onnx.TensorProto.DataType.items():
        try:
            size = onnx.helper.tensor_dtype_to_np_dtype(number).itemsize
        except KeyError:
            size = None
        expected = None if size is None or number == onnx.TensorProto.STRING else size
        assert onnx_proto.ITEMSIZE.get(number) == expected, name
    packed = {"UINT4": 2, "INT4": 2, "FLOAT4E2M1": 2, "UINT2": 4, "INT2": 4}  # elements a byte, per onnx's spec
    assert onnx_proto.PACKED == {onnx.TensorProto.DataType.Value(name): count for name, count in packed.items()}


def test_the_onnx_subset_finds_every_external_tensor_onnx_finds(target):
    """On a real export with a tensor added in each place the check walks (an initializer, a sparse initializer, a
    node attribute in a subgraph, a local function), the subset parse sees the same external tensors, locations,
    offsets and lengths as onnx's own parse."""
    import onnx
    from hfexport.formats.onnx.file_check import onnx_tensors
    from hfexport.formats.onnx.proto import model_proto
    from onnx import TensorProto, helper

    folder = target("onnx")
    model = onnx.load(folder / "model.onnx", load_external_data=False)

    def external(name: str, location: str):
        tensor = helper.make_tensor(name, TensorProto.FLOAT, [2], [0.0, 0.0])
        tensor.data_location = TensorProto.EXTERNAL
        tensor.ClearField("float_data")
        for key, value in (("location", location), ("offset", "4096"), ("length", "8")):
            tensor.external_data.add(key=key, value=value)
        return tensor

    branch = helper.make_graph([helper.make_node("Constant", [], ["b"], value=external("in_branch", "/x"))], "g",
                               [], [helper.make_tensor_value_info("b", TensorProto.FLOAT, [2])])
    model.graph.node.append(helper.make_node("If", ["c"], ["d"], then_branch=branch, else_branch=branch))
    indices = helper.make_tensor("indices", TensorProto.INT64, [1], [0])
    model.graph.sparse_initializer.append(helper.make_sparse_tensor(external("sparse", "../y"), indices, [4]))
    model.functions.append(helper.make_function("local", "f", [], ["e"], [
        helper.make_node("Constant", [], ["e"], value=external("in_function", "z"))], [helper.make_opsetid("", 18)]))
    data = model.SerializeToString()

    def seen(proto) -> list:
        return sorted((where, tensor.name, tensor.data_type, list(tensor.dims),
                       sorted((entry.key, entry.value) for entry in tensor.external_data))
                      for tensor, where in onnx_tensors(proto) if tensor.data_location == 1)

    subset = model_proto()()
    subset.ParseFromString(data)
    found = seen(subset)
    assert found == seen(onnx.load_from_string(data)) and len(found) >= 4
    assert {"in_branch", "sparse", "in_function"} <= {name for _, name, *_ in found}


def test_a_fifo_is_refused_without_blocking(target):
    folder = target("onnx")
    (folder / "config.json").unlink()
    os.mkfifo(folder / "config.json")
    _refused(folder, UnsafeExportError, "config.json", "a FIFO")


def test_a_device_file_is_refused(target):
    folder = target("onnx")
    (folder / "model.onnx.data").unlink()
    try:
        os.mknod(folder / "model.onnx.data", 0o600 | 0o020000, os.makedev(1, 5))  # a character device, /dev/zero's
    except PermissionError:
        (folder / "model.onnx.data").symlink_to("/dev/zero")  # unprivileged: a link to it (outside, also refused)
        _refused(folder, UnsafeExportError, "model.onnx.data")
        return
    _refused(folder, UnsafeExportError, "model.onnx.data", "a device")


def test_from_the_hub_files_stay_in_the_snapshot_and_blob_store(hub, exported_bert, tmp_path):
    """A Hub download loads (its files are links into the blob store); a cache whose link was redirected out is
    refused."""
    output, _ = exported_bert
    repo = f"user/links-{uuid.uuid4().hex[:8]}"
    hub.seed_repo(repo, {f"exports/onnx/{p.name}": p.read_bytes() for p in (output / "onnx").iterdir()})
    cache = tmp_path / "cache"
    assert hfexport.load(repo, target="onnx", cache_dir=cache)(**_inputs()).last_hidden_state.shape[:2] == (1, 5)
    link = next(p for p in cache.rglob("model.onnx.data") if "snapshots" in p.parts)
    elsewhere = tmp_path / "elsewhere.data"
    shutil.copy(link, elsewhere)
    link.unlink()
    link.symlink_to(elsewhere)
    with pytest.raises(UnsafeExportError, match=rf"{repo}@\w+/exports/onnx/model.onnx.data: resolves to .*outside"):
        hfexport.load(repo, target="onnx", cache_dir=cache, local_files_only=True)


# ── one clear error, never a backend traceback ───────────────────────────────


def _truncate(path: Path, keep: float) -> None:
    data = path.read_bytes()
    path.write_bytes(data[: int(len(data) * keep)])


@pytest.mark.parametrize(
    ("name", "tamper", "named"),
    [
        ("onnx", lambda f: _truncate(f / "model.onnx.data", 0.5), ["model.onnx", "past the end of model.onnx.data"]),
        ("onnx", lambda f: (f / "model.onnx.data").unlink(), ["model.onnx", "model.onnx.data is missing"]),
        ("onnx", lambda f: _set_external_location(f, "model.onnx.data", length=str(10**15)),
         ["model.onnx", "external_data.length"]),
        ("onnx", lambda f: _set_external_location(f, "model.onnx.data", offset="-1"),
         ["model.onnx", "external_data.offset"]),
        ("onnx", lambda f: _set_external_location(f, "other.data"), ["model.onnx", "'other.data'"]),
        ("onnx", lambda f: (f / "model.onnx.data").write_bytes((f / "model.onnx.data").read_bytes() * 2),
         ["model.onnx.data has", "the graph declares"]),
        ("onnx", lambda f: (f / "model.onnx").write_bytes(b"\x0a\xff\xff\xff\xff garbage"),
         ["model.onnx", "not an ONNX model"]),
        ("onnx", lambda f: _truncate(f / "model.onnx", 0.5), ["model.onnx"]),
        ("pt2", lambda f: _truncate(f / "model.pt2", 0.5), ["model.pt2"]),
        ("pt2", lambda f: (f / "model.pt2").write_bytes(b"PK\x05\x06" + bytes(18)), ["model.pt2"]),
        ("openvino", lambda f: _truncate(f / "openvino_model.bin", 0.5),
         ["openvino_model.xml", "past the end of openvino_model.bin"]),
        ("openvino", lambda f: _truncate(f / "openvino_model.xml", 0.5), ["openvino_model.xml", "not XML"]),
        ("openvino", lambda f: (f / "openvino_model.bin").unlink(), ["openvino_model.bin", "missing"]),
        ("pte", lambda f: (f / "model.pte").write_bytes(b"\x00" * 64), ["model.pte", "not an ExecuTorch program"]),
        ("pte", lambda f: _truncate(f / "model.pte", 0.3), ["model.pte", "ExecuTorch cannot load it"]),
        ("pte", lambda f: (f / "model.ptd").write_bytes(b"\x00" * 64), ["model.ptd", "not an ExecuTorch data file"]),
        ("pte", lambda f: _truncate(f / "model.ptd", 0.5), ["model.ptd", "outside the file"]),
        ("pte", lambda f: _ptd_segment_index(f / "model.ptd"), ["model.ptd", "names segment"]),
        ("pte", lambda f: (f / "model.ptd").unlink(), ["model.pte", "model.ptd"]),
        ("onnx", lambda f: (f / "config.json").write_text('{"model_type": "bert", "model_type": "gpt2"}'),
         ["config.json", "duplicate key 'model_type'"]),
    ],
    ids=lambda value: value if isinstance(value, str) else None,
)
def test_broken_files_raise_one_corrupt_export_error(target, name, tamper, named):
    folder = target(name)
    tamper(folder)
    _refused(folder, CorruptExportError, *named)


def test_a_config_transformers_cannot_read_is_refused_when_the_config_is_first_read(target):
    """config.json is checked as strict JSON at load; the config object is built on first use (running the graphs
    does not need it): a config transformers cannot read is then one `CorruptExportError` naming the file, on every
    read."""
    folder = target("onnx")
    (folder / "config.json").write_text('{"model_type": 7}')
    model = hfexport.load(folder)
    assert model(**_inputs()).last_hidden_state.shape[:2] == (1, 5)
    for _ in range(2):
        with pytest.raises(CorruptExportError, match=r"config.json: transformers cannot load it") as raised:
            model.config  # noqa: B018 - the read is the test
        assert "\n" not in str(raised.value)


def _edit_manifest(folder: Path, edit) -> None:
    manifest = json.loads((folder / "export.json").read_text())
    edit(manifest)
    (folder / "export.json").write_text(json.dumps(manifest))


def _metadata(manifest: dict) -> dict:
    return manifest["components"]["model"]["metadata"]


@pytest.mark.parametrize(
    ("edit", "text", "named"),
    [
        (lambda m: m.__setitem__("schema_version", "1"), None, "$.schema_version: '1' is not of type 'integer'"),
        (lambda m: m.__setitem__("schema_version", 99), None, "$.schema_version: 99 is not allowed"),
        (None, lambda t: t.replace('"schema_version": 1', '"schema_version": 1e400'), "1e400 is not a finite number"),
        (None, lambda t: t.replace('"schema_version": 1', '"schema_version": NaN'), "NaN is not valid JSON"),
        (lambda m: _metadata(m).__setitem__("export_dtype", "os.system"), None,
         '$.components.model.metadata.export_dtype: "os.system" is not allowed'),
        (lambda m: _metadata(m).__setitem__("export_device", "cuda:99"), None,
         '$.components.model.metadata.export_device: "cuda:99" is not allowed'),
        (lambda m: _metadata(m)["kwargs"]["input_ids"].__setitem__("shape", [10**18, 14]), None,
         "$.components.model.metadata.kwargs.input_ids.shape[0]: 1000000000000000000 is greater than the maximum"),
        (None, lambda t: t.replace('"export_format": "onnx"', '"export_format": "onnx", "export_format": "dynamo"'),
         "duplicate key 'export_format'"),
        (lambda m: m["components"]["model"].pop("metadata"), None, "'metadata' is a required property"),
        (lambda m: _metadata(m).__setitem__("kwargs", []), None, "$.components.model.metadata.kwargs: [] is not of"),
        (lambda m: m.__setitem__("export_format", "pickle"), None, '$.export_format: "pickle" is not allowed'),
        (lambda m: m.__setitem__("components", {}), None, "$.components: {} should be non-empty"),
        (lambda m: _metadata(m).__setitem__("architecture", "x" * 10**6), None, "$.components.model.metadata."
                                                                              "architecture"),
        (None, lambda t: "[" * 100_000 + "]" * 100_000, "not valid JSON"),
    ],
)
def test_malformed_manifests_raise_one_corrupt_export_error(target, edit, text, named):
    folder = target("onnx")
    if edit is not None:
        _edit_manifest(folder, edit)
    else:
        (folder / "export.json").write_text(text((folder / "export.json").read_text()))
    message = _refused(folder, CorruptExportError, "export.json", named)
    assert message.startswith(str(folder / "export.json"))


@pytest.mark.parametrize("name", ["model.onnx\x00.txt", "model.onnx\x01", "\x00"])
def test_a_file_name_with_a_nul_or_control_character_is_refused_by_both_loaders(target, name):
    """Python's path functions raise a raw `ValueError: embedded null byte` on a NUL: the manifest check refuses it
    first, from `hfexport.load` and from `ExportedModel.from_pretrained` alike."""
    from hfexport import ExportedModel

    folder = target("onnx")
    _edit_manifest(folder, lambda m: m["components"]["model"].__setitem__("file", name))
    message = _refused(folder, UnsafeExportError, "export.json", "components.model.file")
    assert "\x00" not in message
    with pytest.raises(UnsafeExportError, match="components.model.file"):
        ExportedModel.from_pretrained(folder)


def test_openvino_custom_operations_and_runtime_options_are_refused(target):
    folder = target("openvino")
    xml = (folder / "openvino_model.xml").read_text()
    (folder / "openvino_model.xml").write_text(xml.replace('type="Tanh" version="opset1"',
                                                           'type="MyCustomOp" version="my_extension"', 1))
    _refused(folder, UnsafeExportError, "openvino_model.xml", "'MyCustomOp' of 'my_extension'")
    (folder / "openvino_model.xml").write_text(xml.replace("<KV_CACHE_PRECISION", '<CACHE_DIR value="/tmp/x" />'
                                                                                   "<KV_CACHE_PRECISION"))
    _refused(folder, UnsafeExportError, "openvino_model.xml", "runtime_options.CACHE_DIR")
    (folder / "openvino_model.xml").write_text(xml.replace('<?xml version="1.0"?>',
                                                           '<?xml version="1.0"?><!DOCTYPE net [<!ENTITY x SYSTEM '
                                                           '"file:///etc/hostname">]>'))
    _refused(folder, UnsafeExportError, "openvino_model.xml", "DTD or entity")


@pytest.mark.parametrize(
    ("name", "tamper", "named"),
    [("pt2", lambda f, marker: _legacy_weights(f / "model.pt2", marker), ["model.pt2", "data/weights/model.pt"]),
     ("onnx", lambda f, marker: _truncate(f / "model.onnx.data", 0.5), ["model.onnx", "past the end"])],
    ids=["unsafe", "corrupt"],
)
def test_verify_exits_2_for_an_export_that_cannot_be_loaded(target, tiny_bert, marker, cli, name, tamper, named):
    """Exit 2 (could not run) before the model loads, one line naming the file; 1 stays for parity failures."""
    folder = target(name)
    tamper(folder, marker)
    result = cli("verify", str(folder), "--model", str(tiny_bert))
    assert result.returncode == 2, result.stdout + result.stderr
    assert all(text in result.stderr for text in named), result.stderr
    assert "Traceback" not in result.stderr and "parity" not in (result.stdout + result.stderr).lower()
    assert not marker.exists()


# ── property tests: random mutations of real exports ─────────────────────────


def _load_and_run(folder: Path) -> None:
    """Load; if it loads, run it once (where the engine would rebuild outputs from contexts). Only hfexport's errors
    may come out of the load."""
    try:
        model = hfexport.load(folder)
    except HfExportError as error:
        assert isinstance(error, (UnsafeExportError, CorruptExportError)), repr(error)
        assert "\n" not in str(error)
        return
    try:
        model(**_inputs())
    except Exception:  # noqa: BLE001 - a mutated model may fail to run; only a payload running would matter
        pass


_INTERESTING = ["data/weights/model.pt", "data/constants/model.pt", "models/extra.json", "models/a/model.json",
                "data/aotinductor/model/model.so", "data/sample_inputs/extra.pt", "version", "extra/module_info.json",
                "data/weights/weight_999", "data/constants/custom_obj_0", "data/constants/opaque_obj_0",
                "serialized_state_dict.pt", "../escape", "data/weights/model_weights_config.json"]


@st.composite
def _archive_mutation(draw):
    kind = draw(st.sampled_from(["add", "duplicate_first", "duplicate_last", "rename", "delete", "header_name",
                                 "compress", "append", "prepend", "comment"]))
    name = draw(st.one_of(st.sampled_from(_INTERESTING),
                          st.text("abcdefghijklmnopqrstuvwxyz_./0123456789", min_size=1, max_size=30)))
    return kind, name, draw(st.integers(min_value=0, max_value=10_000)), draw(st.booleans())


def _mutate_archive(archive: Path, mutation, marker: Path) -> None:
    kind, name, index, with_root = mutation
    items = _members(archive)
    root = _root(items)
    full = f"{root}/{name}" if with_root else name
    chosen = items[index % len(items)]
    payload = _payload(marker)
    if kind == "add":
        items.append((full, payload))
    elif kind == "duplicate_first":
        items.insert(0, (chosen[0].filename, payload))
    elif kind == "duplicate_last":
        items.append((chosen[0].filename, payload))
    elif kind == "rename":
        items[index % len(items)] = (full, chosen[1])
    elif kind == "delete":
        del items[index % len(items)]
    elif kind == "compress":
        info = copy.copy(chosen[0])
        info.compress_type = zipfile.ZIP_DEFLATED
        items[index % len(items)] = (info, chosen[1])
    if kind not in ("header_name", "append", "prepend", "comment"):
        _write(archive, items)
        return
    data = bytearray(archive.read_bytes())
    if kind == "header_name":
        start = chosen[0].header_offset + 30 + (index % max(len(chosen[0].filename), 1))
        data[start] = ord("x") if data[start] != ord("x") else ord("y")
    elif kind == "append":
        data += payload
    elif kind == "prepend":
        data = bytearray(payload) + data
    else:
        with zipfile.ZipFile(archive, "a") as target:
            target.comment = name.encode()
        return
    archive.write_bytes(bytes(data))


RUNS: dict[str, int] = {}  # examples run per property test, checked so that a test cannot pass by running none


def _count(name: str) -> None:
    RUNS[name] = RUNS.get(name, 0) + 1


@settings(HYPOTHESIS, max_examples=100)
@given(mutation=_archive_mutation())
def test_property_mutated_pt2_archives_only_raise_hfexport_errors(exported_bert, tmp_path_factory, mutation):
    _count("pt2-archive")
    output, _ = exported_bert
    folder = tmp_path_factory.mktemp("pt2-mutation")
    shutil.copytree(output / "pt2", folder, dirs_exist_ok=True)
    marker = folder.parent / f"{folder.name}-pwned"
    _mutate_archive(folder / "model.pt2", mutation, marker)
    _load_and_run(folder)
    assert not marker.exists(), mutation
    shutil.rmtree(folder)


def _paths(value, prefix=()):
    """Every (path, value) of a JSON document."""
    yield prefix, value
    if isinstance(value, dict):
        for key, item in value.items():
            yield from _paths(item, (*prefix, key))
    elif isinstance(value, list):
        for index, item in enumerate(value):
            yield from _paths(item, (*prefix, index))


_JSON = st.recursive(
    st.none() | st.booleans() | st.integers(min_value=-(10**30), max_value=10**30)
    | st.floats(allow_nan=False, allow_infinity=False) | st.text(max_size=50)
    | st.sampled_from(["os:system", "builtins:open", "../../etc/passwd", "/etc/hostname", "cuda:99", "x" * 20_000]),
    lambda children: st.lists(children, max_size=4) | st.dictionaries(st.text(max_size=8), children, max_size=4),
    max_leaves=12,
)


@st.composite
def _manifest_mutation(draw, manifest: dict):
    paths = [path for path, _ in _paths(manifest) if path]
    path = draw(st.sampled_from(paths))
    kind = draw(st.sampled_from(["replace", "delete", "payload"]))
    return path, kind, draw(_JSON)


def _apply(manifest: dict, mutation, marker: Path) -> dict:
    path, kind, value = mutation
    crafted = copy.deepcopy(manifest)
    parent = crafted
    for part in path[:-1]:
        parent = parent[part]
    if kind == "delete":
        parent.pop(path[-1]) if isinstance(parent, dict) else parent.pop(path[-1])
    elif kind == "payload":
        parent[path[-1]] = json.dumps({"_t": "seq", "p": "builtins:open", "v": [str(marker), "w"]}) \
            if isinstance(parent[path[-1]], str) else {"_t": "seq", "p": "builtins:open", "v": [str(marker), "w"]}
    else:
        parent[path[-1]] = value
    return crafted


@pytest.mark.parametrize("name", ["onnx", "pt2"])
def test_property_mutated_manifests_only_raise_hfexport_errors(exported_bert, tmp_path_factory, name):
    output, _ = exported_bert
    manifest = json.loads((output / name / "export.json").read_text())
    work = tmp_path_factory.mktemp(f"manifest-{name}")
    shutil.copytree(output / name, work / "base")

    @settings(HYPOTHESIS, max_examples=60)
    @given(mutation=_manifest_mutation(manifest))
    def check(mutation):
        _count(f"manifest-{name}")
        folder = work / uuid.uuid4().hex[:8]
        shutil.copytree(work / "base", folder)
        marker = work / f"{folder.name}-pwned"
        (folder / "export.json").write_text(json.dumps(_apply(manifest, mutation, marker)))
        _load_and_run(folder)
        assert not marker.exists(), mutation
        shutil.rmtree(folder)

    check()
    assert RUNS[f"manifest-{name}"] >= 60


@st.composite
def _file_mutation(draw, files: list[str]):
    return draw(st.sampled_from(files)), draw(st.sampled_from(
        ["link_outside", "link_inside", "dangling", "fifo", "directory", "link_dev_zero", "link_parent", "empty"]))


@pytest.mark.parametrize("name", ["onnx", "openvino", "pt2", "pte"])
def test_property_links_and_special_files_only_raise_hfexport_errors(exported_bert, tmp_path_factory, name):
    output, _ = exported_bert
    files = sorted(p.name for p in (output / name).iterdir() if p.name not in ("export_report.json",
                                                                                 "export_config.json"))
    work = tmp_path_factory.mktemp(f"files-{name}")

    @settings(HYPOTHESIS, max_examples=16)
    @given(mutation=_file_mutation(files))
    def check(mutation):
        _count(f"files-{name}")
        file, kind = mutation
        folder = work / uuid.uuid4().hex[:8]
        shutil.copytree(output / name, folder)
        outside = work / f"{folder.name}-outside"
        outside.mkdir()
        shutil.move(folder / file, outside / file)
        path = folder / file
        if kind == "link_outside":
            path.symlink_to(outside / file)
        elif kind == "link_inside":
            path.symlink_to(folder / next(f for f in files if f != file))
        elif kind == "dangling":
            path.symlink_to(outside / "missing")
        elif kind == "fifo":
            os.mkfifo(path)
        elif kind == "directory":
            path.mkdir()
        elif kind == "link_dev_zero":
            path.symlink_to("/dev/zero")
        elif kind == "link_parent":
            path.symlink_to(folder.parent)
        else:
            path.write_bytes(b"")
        try:
            hfexport.load(folder)
        except (UnsafeExportError, CorruptExportError) as error:
            assert "\n" not in str(error)
            if kind in ("link_outside", "dangling", "fifo", "directory", "link_dev_zero", "link_parent"):
                assert isinstance(error, UnsafeExportError) and file in str(error), (mutation, error)
        else:
            assert kind == "link_inside" and file not in ("export.json",), mutation
        shutil.rmtree(folder)
        shutil.rmtree(outside)

    check()
    assert RUNS[f"files-{name}"] >= 16


# ── a generation .pt2 (its sample inputs hold a DynamicCache, which the unpickler allowlists) ──


@pytest.fixture(scope="module")
def llama_generation_pt2(session_dir, tiny_llama):
    """tiny-llama as a dynamo generation export (prefill.pt2, decode.pt2), unverified: the cheapest real cache export."""
    from hfexport.job.run import run_job

    recipe = json.loads((tiny_llama / "export_config.json").read_text())
    recipe["targets"] = {"pt2-generation": {"export_format": "dynamo", "mode": "generation",
                                            "options": {"dynamic": True}}}
    recipe["default_target"] = "pt2-generation"
    output = session_dir / "attacks-llama-pt2"
    report = run_job(tiny_llama, output, all_targets=True, recipe=recipe, verify=False)
    assert report.targets["pt2-generation"].status == "ok", report.targets["pt2-generation"].error
    return output / "pt2-generation"


def _cache_payload(archive: Path, marker: Path) -> None:
    """The sample inputs' DynamicCache (an allowlisted class) carrying a payload in its state."""
    import torch
    from hfexport.formats.torch_export.pt2_safety import pt2_unpickling_allowlist

    items = _members(archive)
    name = f"{_root(items)}/data/sample_inputs/model.pt"
    with torch.serialization.safe_globals(pt2_unpickling_allowlist()):
        args, kwargs = torch.load(io.BytesIO(dict((i.filename, d) for i, d in items)[name]), weights_only=True)
    cache = next(value for value in kwargs.values() if type(value).__name__.endswith("Cache"))
    cache.note = _Payload(marker)
    buffer = io.BytesIO()
    torch.save((args, kwargs), buffer)
    _write(archive, [(info, buffer.getvalue() if info.filename == name else data) for info, data in items])


def test_a_payload_inside_an_allowlisted_cache_is_refused(llama_generation_pt2, tmp_path, marker):
    import torch

    folder = tmp_path / "pt2"
    shutil.copytree(llama_generation_pt2, folder)
    control = tmp_path / "control.pt2"
    shutil.copy(folder / "decode.pt2", control)
    _cache_payload(control, marker)
    try:
        torch.export.load(control)  # control: torch falls back to weights_only=False and runs it
    except Exception:  # noqa: BLE001
        pass
    assert marker.exists()
    marker.unlink()
    _cache_payload(folder / "decode.pt2", marker)
    _refused(folder, UnsafeExportError, "decode.pt2", "data/sample_inputs/model.pt", "more than tensors")
    assert not marker.exists()


def test_the_clean_generation_export_loads(llama_generation_pt2):
    assert list(hfexport.load(llama_generation_pt2).runners) == ["prefill", "decode"]


@settings(HYPOTHESIS, max_examples=40)
@given(mutation=_archive_mutation(), component=st.sampled_from(["prefill.pt2", "decode.pt2"]))
def test_property_mutated_generation_archives_only_raise_hfexport_errors(llama_generation_pt2, tmp_path_factory,
                                                                          mutation, component):
    folder = tmp_path_factory.mktemp("generation-mutation")
    shutil.copytree(llama_generation_pt2, folder, dirs_exist_ok=True)
    marker = folder.parent / f"{folder.name}-pwned"
    _mutate_archive(folder / component, mutation, marker)
    _load_and_run(folder)
    assert not marker.exists(), mutation
    shutil.rmtree(folder)
