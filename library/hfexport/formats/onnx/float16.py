"""A float32 ONNX export converted to float16 when it is saved: the recipe target's `"dtype": "float16"`.

The engine exports at the model's own dtype, and hfexport loads every checkpoint at float32
(`hfexport.models.EXPORT_DTYPE`), so a job's ONNX export is a float32 graph; transformers.js' `dtype: "fp16"` file (`onnx/model_fp16.onnx`) is that graph in float16, weights,
inputs and outputs (logits and the KV cache) alike. The conversion is onnxruntime's own
`onnxruntime.transformers.float16.convert_float_to_float16`, as onnxruntime and optimum ship it, with its defaults:
`keep_io_types=False` (the graph's float inputs and outputs become float16, as transformers.js' fp16 models have them,
so every runtime builds a float16 cache from the graph's input types), its `DEFAULT_OP_BLOCK_LIST` (ops such as
`Range`, `CumSum`, `Max` kept in float32 behind Casts) and its value clamping (a float32 value below float16's smallest
subnormal, or beyond its largest finite value, is clamped, not flushed to 0 or inf). It is given each graph's path, so
it runs ONNX's shape inference from the file (`infer_shapes_path`, which takes models over 2 GB).

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

FLOAT16 = "float16"
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
        model = float16_model(path)
        for old in data:  # ONNX appends to an existing data file: the float32 data goes first
            (folder / old).unlink(missing_ok=True)
        onnx_ir.save(onnx_ir.from_proto(model), str(path), external_data=data[0] if data else None)
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


def _external_data_files(path: Path) -> list[str]:
    """The external data files (relative names) the graph at `path` points at."""
    import onnx

    model = onnx.load(str(path), load_external_data=False)
    return sorted({entry.value for tensor in onnx_tensors(model) for entry in tensor.external_data
                   if entry.key == "location"})
