"""A float32 ONNX export converted to float16 when it is saved: the recipe target's `"dtype": "float16"`.

The engine exports at the model's own dtype, and hfexport loads every checkpoint at float32
(`hfexport.models.EXPORT_DTYPE`), so a job's ONNX export is a float32 graph; transformers.js' `dtype: "fp16"` file (`onnx/model_fp16.onnx`) is that graph in float16, weights,
inputs and outputs (logits and the KV cache) alike. The conversion is onnxruntime's own
`onnxruntime.transformers.float16.convert_float_to_float16`, as onnxruntime and optimum ship it, with its defaults:
`keep_io_types=False` (the graph's float inputs and outputs become float16, as transformers.js' fp16 models have them,
so every runtime builds a float16 cache from the graph's input types), its `DEFAULT_OP_BLOCK_LIST` (ops such as
`Range`, `CumSum`, `Max` kept in float32 behind Casts) and its value clamping (a float32 value below float16's smallest
subnormal, or beyond its largest finite value, is clamped, not flushed to 0 or inf). It runs ONNX's shape inference
from each graph's file (`infer_shapes_path`, which takes models over 2 GB), as the converter does when given a path.

The converter is given the graph without its large initializers' data (issue 45: the float32 graph is never read
whole): it changes their types only, and each is read from the float32 data file, converted by the converter's own
`convert_np_to_float16` and written one at a time when the graph is saved (`onnx_ir.LazyTensor`), so converting
holds one tensor, not the weights; the files are byte for byte those of the converter run on the whole graph
(`tests/test_onnx_float16.py`). The fp16 and q4f16 variants (`hfexport.formats.onnx.variants`) convert the same way.

`convert(folder)` rewrites every component graph saved in `folder` in place (same file names, same external data
name) and records `float16` as the manifest's `metadata.export_dtype` of each, which the layout
(`hfexport.layout.artifact_name`: `model_fp16.onnx`), the loaders (`hfexport.generate`'s empty cache), verification
and the gate read. Runs before `hfexport.formats.onnx.decoder_contract.to_contract` renames the graph, and before the weight map is
made, so the map records each weight as `cast` (`hfexport.rebind`).
"""

from __future__ import annotations

import json
from pathlib import Path

from hfexport.errors import SaveError
from hfexport.files import MANIFEST_FILE
from hfexport.formats.onnx.decoder_contract import onnx_tensors
from hfexport.formats.onnx.onnxruntime_workarounds import value_info_from_dims

FLOAT16 = "float16"
#: External initializers at least this large are converted while they are written, one at a time, read from the
#: float32 data set aside under the data file's name + ASIDE_SUFFIX; smaller tensors are read with the graph, as
#: `onnx.load` reads them.
STREAMED_BYTES = 1 << 20
ASIDE_SUFFIX = ".float32"
#: Elements converted at once (`convert_np_to_float16` is elementwise; its temporaries are several times its input).
CHUNK = 1 << 22
#: The `dtype` values a recipe target may name (the schema's enum): what its ONNX graph is converted to.
TARGET_DTYPES = (FLOAT16,)


class Float16Error(SaveError):
    """An export that cannot be converted to float16 (a bfloat16 graph: onnxruntime's converter takes float32)."""


def convert(folder: Path, target: str | None = None) -> bool:
    """Convert every component graph of the ONNX export saved in `folder` to float16, in place; False when there was
    nothing to convert (every component is float16 already: a float16 model object given to the API).

    Raises `Float16Error` for a graph exported at another dtype than float32 or float16."""
    import onnx_ir

    folder = Path(folder)
    manifest_path = folder / MANIFEST_FILE
    manifest = json.loads(manifest_path.read_text(encoding="utf-8"))
    changed = False
    for name, entry in (manifest.get("components") or {}).items():
        metadata = entry.setdefault("metadata", {})
        dtype = str(metadata.get("export_dtype") or "float32").removeprefix("torch.")
        if dtype == FLOAT16:
            continue
        if dtype != "float32":
            where = f"targets.{target}.dtype" if target else "dtype"
            raise Float16Error(f"{where}: float16 converts a float32 graph; component {name!r} was exported at "
                               f"{dtype} (the checkpoint's dtype)")
        path = folder / entry["file"]
        data = _external_data_files(path)
        aside = {name: folder / f"{name}{ASIDE_SUFFIX}" for name in data}
        for name, moved in aside.items():  # read from there while the float16 data is written under the name
            (folder / name).replace(moved)
        try:
            onnx_ir.save(streamed_float16_model(path, aside), str(path), external_data=data[0] if data else None)
        finally:
            for moved in aside.values():
                moved.unlink(missing_ok=True)
        metadata["export_dtype"] = FLOAT16
        changed = True
    if changed:
        manifest_path.write_text(json.dumps(manifest, indent=2) + "\n", encoding="utf-8")
    return changed


def float16_model(path: Path):
    """The float32 ONNX graph at `path` in float16 (a proto): onnxruntime's `convert_float_to_float16` with its
    defaults and float16 inputs and outputs, given the path so that shape inference takes graphs over 2 GB."""
    from onnxruntime.transformers.float16 import convert_float_to_float16

    return convert_float_to_float16(str(path), keep_io_types=False)


def streamed_float16_model(path: Path, aside: dict[str, Path] | None = None):
    """The float32 graph at `path` in float16, as `float16_model` makes it, as an `onnx_ir` model whose large
    initializers (`STREAMED_BYTES`) are read and converted when they are written (`onnx_ir.LazyTensor`): the
    converter runs on the graph without their data (only their types change), so converting holds one tensor, not
    the weights. Saving it writes the bytes `float16_model`'s proto writes (`tests/test_onnx_float16.py`,
    `tests/test_dtype_variants.py`). `aside`: the external data file's name as the graph says it -> where its
    float32 bytes are now (`convert` moves them aside to write the float16 data under the name); a name it does not
    hold is read where the graph says, beside `path` (a variant written to another folder)."""
    import os
    import tempfile
    from functools import partial
    import onnx
    import onnx_ir
    from onnx.external_data_helper import ExternalDataInfo, uses_external_data
    from onnx.shape_inference import infer_shapes_path
    from onnxruntime.transformers import float16 as converter

    with tempfile.NamedTemporaryFile(dir=path.parent, delete=False) as handle:  # as the converter does for a path
        inferred = handle.name
    try:
        infer_shapes_path(str(path), inferred)
        model = onnx.load(inferred, load_external_data=False)
    finally:
        os.remove(inferred)

    def where(location: str) -> Path:
        return (aside or {}).get(location, path.parent / location)

    streamed = {}
    for tensor in model.graph.initializer:
        if uses_external_data(tensor) and tensor.data_type == onnx.TensorProto.FLOAT:
            info = ExternalDataInfo(tensor)
            if info.length >= STREAMED_BYTES:
                streamed[tensor.name] = (where(info.location), info.offset, info.length)
    main = len(model.graph.initializer)
    for index, tensor in enumerate(onnx_tensors(model)):  # the graph's own initializers first
        if not uses_external_data(tensor) or index < main and tensor.name in streamed:
            continue
        info = ExternalDataInfo(tensor)  # read with the graph, as `onnx.load_external_data_for_tensor` reads it
        with where(info.location).open("rb") as data:
            data.seek(info.offset)
            tensor.raw_data = data.read(info.length)
        tensor.data_location = onnx.TensorProto.DEFAULT
        del tensor.external_data[:]
    with value_info_from_dims(converter):  # the converter would read each initializer's data for its shape
        model = converter.convert_float_to_float16(model, keep_io_types=False, disable_shape_infer=True)
    ir_model = onnx_ir.from_proto(model)
    for value in ir_model.graph.initializers.values():
        if value.name in streamed:
            tensor = value.const_value
            read = partial(_converted, *streamed[value.name], tuple(tensor.shape.numpy()),
                           tensor.dtype == onnx_ir.DataType.FLOAT16)
            value.const_value = onnx_ir.LazyTensor(read, dtype=tensor.dtype, shape=tensor.shape, name=tensor.name,
                                                   doc_string=tensor.doc_string, metadata_props=tensor.metadata_props)
    return ir_model


def _converted(source: Path, offset: int, length: int, shape: tuple, float16: bool):
    """One float32 initializer read from `source`, in float16 as the converter makes it where `float16`
    (`convert_np_to_float16`, `CHUNK` elements read and converted at a time: a vocabulary's 1 GB float32 table never
    whole in memory beside its float16 copy), else as it is."""
    import numpy
    import onnx_ir
    from onnxruntime.transformers.float16 import convert_np_to_float16

    if not float16:
        values = numpy.fromfile(source, dtype=numpy.float32, count=length // 4, offset=offset)
        return onnx_ir.tensor(values.reshape(shape))
    half = numpy.empty(length // 4, dtype=numpy.float16)  # the float32 data read a chunk at a time, never whole
    with open(source, "rb") as handle:
        handle.seek(offset)
        for start in range(0, len(half), CHUNK):
            chunk = numpy.fromfile(handle, dtype=numpy.float32, count=min(CHUNK, len(half) - start))
            half[start:start + len(chunk)] = convert_np_to_float16(chunk)
    return onnx_ir.tensor(half.reshape(shape))


def _external_data_files(path: Path) -> list[str]:
    """The external data files (relative names) the graph at `path` points at."""
    import onnx

    model = onnx.load(str(path), load_external_data=False)
    return sorted({entry.value for tensor in onnx_tensors(model) for entry in tensor.external_data
                   if entry.key == "location"})
