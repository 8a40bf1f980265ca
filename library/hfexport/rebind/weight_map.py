"""The weight map: which parameters each stored tensor of an export holds, and how; and the rebind key.

Made at every full export by value, not by name: each stored tensor of the saved files (`hfexport.formats.onnx.weights`,
`openvino`, `pt2`, `pte`) is compared byte for byte with the model's parameters and buffers, as they are, transposed,
cast to the stored dtype (or, for an ONNX export converted to float16, clamped and cast as onnxruntime's converter
does: `cast_clamped`), reshaped, or several of them concatenated along an axis. What matches is recorded as plain
data in the export manifest (`export.json`'s `weight_map`, schema'd and checked on load like the rest).

The map says where a rebind would be wrong, so that it is refused rather than published:
- `degenerate`: parameters that were bit-identical to another (not tied) or constant at export time. The
  exporters deduplicate identical initializers (onnx_ir), drop a multiply by one (OpenVINO), so such a
  parameter may share a location or have none, which only its value at export time decided.
- `uncovered`: state_dict keys no stored tensor holds (folded into something else, or dropped).
- `unmapped`: floating stored tensors that match nothing (a transform the map does not know).
`apply` writes a new model's weights through the map; a location whose parameters now differ is refused.
"""

from __future__ import annotations

import hashlib
import json
from dataclasses import dataclass
from pathlib import Path

from hfexport.errors import RebindRefused
from hfexport.formats import format_traits
from hfexport.formats.programs import format_program
from hfexport.rebind.stored import FLOAT_DTYPES, Stored, release, write_at

MAP_VERSION = 1
#: A floating stored tensor at least this large that matches nothing is taken for a weight the map cannot explain.
UNMAPPED_MIN_BYTES = 64


def weight_writer(export_format):
    """The module that reads and rewrites the stored tensors of `export_format`'s files (its program's `weights`),
    None for a format without one."""
    return format_program(export_format).weights


@dataclass
class _Variant:
    """One form a parameter may be stored in, made when compared (a cast is a copy): the variants of a whole model
    are never held at once, so making the map takes one parameter's forms in memory, not the model's."""

    keys: list[str]
    transform: list[str]
    source: object  # torch.Tensor: the parameter (a view of it for "transpose")
    dtype: object = None  # torch.dtype the form has (None: the source's, a form made already)

    def __post_init__(self):
        if self.dtype is None:
            self.dtype = self.source.dtype

    @property
    def tensor(self):
        return _transformed(self.source, self.transform, self.dtype)

    @property
    def shape(self):
        return self.source.shape

    @property
    def large(self) -> bool:
        """Over `BLOCK_BYTES` in its stored form: sampled and compared a block of rows at a time, never made whole
        (a placeholder's form, stride 0, would be materialized by a cast or a copy: a vocabulary's table, 1 GB)."""
        return self.source.dim() == 2 and self.source.numel() * self.dtype.itemsize > BLOCK_BYTES

    def rows(self, start: int, stop: int):
        """Rows `start:stop` of the form, transformed."""
        return _transformed(self.source[start:stop], self.transform, self.dtype)

    def sample(self) -> tuple[int, bytes]:
        """(bytes, `_sample` of them) of the form, from the few elements the sample covers where it is `large`."""
        if not self.large:
            data = _u8(self.tensor)
            return len(data), _sample(data)
        import torch

        size = self.dtype.itemsize
        n, picked = self.source.numel() * size, b""
        for a, b in _sampled(n):
            first, last = a // size, (b - 1) // size + 1
            rows, columns = torch.unravel_index(torch.arange(first, last), tuple(self.source.shape))
            values = _transformed(self.source[rows, columns], self.transform, self.dtype)
            picked += _u8(values).numpy().tobytes()[a - first * size:b - first * size]
        return n, picked

    def equals(self, data) -> bool:
        """Whether the form's bytes are `data` (a flat uint8 tensor), compared a block of rows at a time where it is
        `large`."""
        import torch

        if not self.large:
            return torch.equal(_u8(self.tensor), data)
        rows, width = self.source.shape
        if len(data) != rows * width * self.dtype.itemsize:
            return False
        step, position = max(1, BLOCK_BYTES // (width * 4)), 0
        for start in range(0, rows, step):
            block = _u8(self.rows(start, min(rows, start + step)))
            if not torch.equal(block, data[position:position + len(block)]):
                return False
            position += len(block)
        return True


def _transformed(tensor, transform, dtype):
    """`tensor` (a form, its rows or elements) cast or clamped as `transform` says: "cast_clamped" to float16,
    "cast" to `dtype` (None: a stored dtype that is not floating, left as it is)."""
    if "cast_clamped" in transform:
        return clamped_float16(tensor)
    return tensor.to(dtype) if "cast" in transform and dtype is not None else tensor


def _sampled(n: int) -> list[tuple[int, int]]:
    """The byte ranges `_sample` reads of `n` bytes."""
    return [(a, min(b, n)) for a, b in ((0, 16), (n // 2, n // 2 + 16), (max(0, n - 16), n)) if min(b, n) > a]


def sources(model) -> tuple[dict, list[str], list[list[str]]]:
    """(tensor by name, the state_dict keys, the ties: names sharing one storage) of a model's parameters and
    buffers (non-persistent buffers too: they are derived from the config, and graphs may hold them)."""
    tensors, by_storage = {}, {}
    for name, tensor in [*model.named_parameters(remove_duplicate=False), *model.named_buffers(remove_duplicate=False)]:
        tensors[name] = tensor.detach()
        by_storage.setdefault((tensor.untyped_storage().data_ptr(), tensor.storage_offset(), tuple(tensor.shape)),
                              []).append(name)
    keys = list(model.state_dict().keys())
    ties = sorted(sorted(names) for names in by_storage.values() if len(names) > 1)
    return tensors, keys, ties


def rebind_key(model, target_hash: str, packages: dict) -> str:
    """Everything a cache key holds except the weights: the config (and generation config), the recipe target,
    the package versions, the state_dict's keys, shapes and dtypes, and which of them are tied."""
    tensors, keys, ties = sources(model)
    config = {k: v for k, v in model.config.to_dict().items() if k not in ("_name_or_path", "transformers_version")}
    generation = getattr(model, "generation_config", None)
    document = {
        "map_version": MAP_VERSION, "config": config,
        "generation_config": generation.to_diff_dict() if generation is not None else None,
        "recipe_target": target_hash, "packages": packages,
        "state_dict": {key: [list(tensors[key].shape), str(tensors[key].dtype)] for key in keys if key in tensors},
        "ties": ties,
    }
    document["generation_config"] = {k: v for k, v in (document["generation_config"] or {}).items()
                                     if k != "transformers_version"}
    return hashlib.sha256(json.dumps(document, sort_keys=True, default=str).encode()).hexdigest()


def stored_tensors(folder: Path, manifest: dict) -> dict[str, dict[str, Stored]]:
    """Every stored tensor of the export in `folder`, by component program file, then by locator."""
    module = weight_writer(manifest["export_format"])
    files = dict.fromkeys(entry["file"] for entry in manifest["components"].values())
    return {file: {entry.name: entry for entry in module.read(folder, file)} for file in files}


def _torch_dtype(name: str):
    import torch

    return getattr(torch, name)


def _stored_u8(entry: Stored):
    """The stored bytes as a uint8 tensor over the file's memory (no copy; never written through)."""
    import warnings

    import torch

    with warnings.catch_warnings():
        warnings.simplefilter("ignore", UserWarning)  # a read-only buffer: torch warns that writes are undefined
        return torch.frombuffer(entry.data, dtype=torch.uint8) if entry.nbytes else torch.empty(0, dtype=torch.uint8)


def _as_tensor(entry: Stored):
    """The stored bytes as a tensor of the stored dtype and shape (None where the format does not say)."""
    if entry.dtype not in FLOAT_DTYPES or entry.shape is None or not entry.nbytes:
        return None
    return _stored_u8(entry).view(_torch_dtype(entry.dtype)).reshape(entry.shape)


def _u8(tensor):
    """A tensor's bytes as a flat uint8 tensor (a view when it is contiguous)."""
    import torch

    return tensor.contiguous().view(-1).view(torch.uint8)


def _bytes(tensor) -> bytes:
    return _u8(tensor).numpy().tobytes()


def _sample(data) -> bytes:
    """A few bytes of a flat uint8 tensor (start, middle, end): the index key that finds candidates to compare."""
    n = len(data)
    return b"".join(data[a:b].numpy().tobytes() for a, b in ((0, 16), (n // 2, n // 2 + 16), (max(0, n - 16), n)))


def _groups(tensors: dict, ties: list[list[str]]) -> tuple[list[list[str]], list[str]]:
    """Names grouped by identical values (ties, and parameters that happen to be bit-identical), and the degenerate
    names: bit-identical without being tied, constant (every element equal, more than one), or a symmetric matrix."""
    import torch

    tied = {name: tuple(group) for group in ties for name in group}
    by_value: dict[tuple, list[str]] = {}
    degenerate = []
    for name in tensors:
        if _read_in_blocks(tensors, name):
            dtype, digest, constant = _blocked_digest(tensors, name)
            by_value.setdefault((str(dtype), tuple(tensors.shape(name)), digest), []).append(name)
            if constant:
                degenerate.append(name)
            continue
        tensor = tensors[name]
        if tensor.dim() == 2 and tensor.shape[0] > 1 and tensor.stride(0) == 0:  # one row repeated (a placeholder):
            by_value.setdefault((str(tensor.dtype), tuple(tensor.shape), "rows", _digest(tensor[0])), []).append(name)
            if tensor.is_floating_point() and tensor.shape[1] > 1 and bool((tensor[0] == tensor[0, 0]).all()):
                degenerate.append(name)  # its row and shape say it all, never made whole
            continue
        flat = tensor.reshape(-1)
        digest = hashlib.sha256(_u8(tensor).numpy()).hexdigest()
        by_value.setdefault((str(tensor.dtype), tuple(tensor.shape), digest), []).append(name)
        if flat.numel() > 1 and tensor.is_floating_point() and bool((flat == flat[0]).all()):
            degenerate.append(name)
        elif tensor.is_floating_point() and tensor.dim() == 2 and tensor.shape[0] == tensor.shape[1] \
                and torch.equal(tensor, tensor.t()):
            degenerate.append(name)  # symmetric: stored as it is or transposed, the bytes cannot tell
    groups = list(by_value.values())
    for names in groups:
        if len({tied.get(name, (name,)) for name in names}) > 1:
            degenerate.extend(names)
    return groups, sorted(set(degenerate))


def _read_in_blocks(tensors, name: str) -> bool:
    """Whether `tensors` (a checkpoint's: `rows`) holds `name` as a 2-D tensor over `BLOCK_BYTES` at float32 (a
    vocabulary's table): `_groups` reads it a block of rows at a time."""
    if not hasattr(tensors, "rows"):
        return False
    shape = tensors.shape(name)
    return len(shape) == 2 and shape[0] > 1 and shape[0] != shape[1] and shape[0] * shape[1] * 4 > BLOCK_BYTES


def _blocked_digest(tensors, name: str) -> tuple[object, str, bool]:
    """(dtype, sha256 of the bytes, whether it is floating with every element equal) of `tensors[name]`, read a
    block of rows at a time: what `_groups` takes of the whole tensor. Not square, so never symmetric."""
    rows, width = tensors.shape(name)
    digest, first, constant, dtype = hashlib.sha256(), None, True, None
    step = max(1, BLOCK_BYTES // (width * 4))
    for start in range(0, rows, step):
        block = tensors.rows(name, start, min(rows, start + step))
        digest.update(_u8(block).numpy())
        dtype, first = block.dtype, block.reshape(-1)[0] if first is None else first
        constant = constant and block.is_floating_point() and bool((block == first).all())
    return dtype, digest.hexdigest(), constant


def degenerate_keys(model, tensors=None) -> list[str]:
    """The state_dict keys of `model` whose value is bit-identical to another's (not tied), constant or symmetric.
    `tensors`: the values by key instead of the model's (a checkpoint's shards, `CheckpointTensors`: read one at a
    time, so the model may be its structure alone)."""
    own, keys, ties = sources(model)
    return [name for name in _groups(own if tensors is None else tensors, ties)[1] if name in keys]


def build(folder: Path, manifest: dict, model, key: str) -> dict:
    """The weight map of the export saved in `folder` (its `manifest`) from `model`, the model it was exported from,
    every entry verified by recomputing it from the parameters and comparing bytes."""
    import torch

    tensors, keys, ties = sources(model)
    groups, degenerate = _groups(tensors, ties)
    stored = stored_tensors(folder, manifest)
    dtypes = {entry.dtype for file in stored.values() for entry in file.values() if entry.dtype in FLOAT_DTYPES}
    clamped = converted_to_float16(manifest)
    variants: list[_Variant] = []
    for names in groups:
        tensor = tensors[names[0]]
        forms = [([], tensor)]
        if tensor.dim() == 2:
            forms.append((["transpose"], tensor.t()))
        for transform, form in list(forms):
            variants.append(_Variant(names, transform or [], form, tensor.dtype))
            for dtype in dtypes:
                if tensor.is_floating_point() and str(tensor.dtype).removeprefix("torch.") != dtype:
                    if clamped and dtype == "float16" and tensor.dtype == torch.float32:
                        variants.append(_Variant(names, [*transform, "cast_clamped"], form, torch.float16))
                    else:
                        variants.append(_Variant(names, [*transform, "cast"], form, _torch_dtype(dtype)))
    index: dict[tuple, list[_Variant]] = {}
    for variant in variants:
        index.setdefault(variant.sample(), []).append(variant)

    entries, unmapped, covered = [], [], set()
    for file, by_name in stored.items():
        for name, entry in by_name.items():
            parts, axis = _match(entry, index, variants)
            if parts is None:
                if entry.floating and entry.nbytes >= UNMAPPED_MIN_BYTES and not _constant(entry):
                    unmapped.append(f"{file}:{name}")
                release(entry)
                continue
            record = {"file": file, "name": name, "nbytes": entry.nbytes, "dtype": entry.dtype, "shape": entry.shape,
                      "concat_axis": axis, "parts": parts}
            if not _recomputes(record, entry, tensors):  # the exact comparison every entry passes
                raise AssertionError(f"weight map: {file}:{name} does not recompute to its stored bytes")
            release(entry)  # one stored tensor's pages at a time, not the export's
            covered.update(key for part in parts for key in part["keys"])
            entries.append(record)
    uncovered = [name for name in keys if name not in covered]
    return {
        "version": MAP_VERSION,
        "rebind_key": key,
        "degenerate": [name for name in degenerate if name in keys],
        "uncovered": uncovered,
        "uncovered_sha256": {name: _digest(tensors[name]) for name in uncovered if name in tensors},
        "unmapped": sorted(unmapped)[:1000],
        "tensors": entries,
    }


def _recomputes(record: dict, entry: Stored, tensors: dict) -> bool:
    """Whether the map entry `record`, recomputed from `tensors`, is the stored bytes; one of a single 2-D tensor over
    `BLOCK_BYTES` (a vocabulary's table) compared a block of rows at a time, never made whole."""
    import torch

    part = record["parts"][0]
    if record["concat_axis"] is None and len(record["parts"]) == 1 and \
            set(part["transform"]) <= _BLOCK_TRANSFORMS and \
            len({(tensors[key].data_ptr(), tuple(tensors[key].shape), tensors[key].stride())
                 for key in part["keys"]}) == 1:  # tied: one storage (each name's own detached view)
        source = tensors[part["keys"][0]]
        form = source.t() if "transpose" in part["transform"] else source
        dtype = _torch_dtype(record["dtype"]) if record["dtype"] in FLOAT_DTYPES else form.dtype
        variant = _Variant(part["keys"], [t for t in part["transform"] if t not in ("reshape", "transpose")], form,
                           dtype if {"cast", "cast_clamped"} & set(part["transform"]) else form.dtype)
        if variant.large:
            return variant.equals(_stored_u8(entry))
    return torch.equal(_compute(record, tensors), _stored_u8(entry))


def converted_to_float16(manifest: dict) -> bool:
    """Whether the export's float16 tensors were made by onnxruntime's float16 converter (a recipe target's
    `"dtype": "float16"`, `hfexport.formats.onnx.float16`): an ONNX export whose manifest says float16."""
    components = (manifest.get("components") or {}).values()
    return format_traits(manifest.get("export_format")).converts_to_float16 and bool(components) and all(
        str((entry.get("metadata") or {}).get("export_dtype")) == "float16" for entry in components)


def clamped_float16(tensor):
    """A float32 tensor as onnxruntime's float16 converter stores it (`convert_np_to_float16` with
    `convert_float_to_float16`'s defaults): a value strictly between 0 and 5.96e-08 (float16's smallest subnormal)
    becomes 5.96e-08, one beyond 65504 (its largest finite value) becomes 65504, signs kept, then rounded to float16;
    a plain cast would flush the first to 0 and the second to inf."""
    import torch

    low, high = 5.96e-08, 65504.0
    x = tensor.to(torch.float32)
    x = torch.where((x > 0) & (x < low), low, x)
    x = torch.where((x < 0) & (x > -low), -low, x)
    x = torch.where((x > high) & (x < float("inf")), high, x)
    x = torch.where((x < -high) & (x > float("-inf")), -high, x)
    return x.to(torch.float16)


def _digest(tensor) -> str:
    return hashlib.sha256(_u8(tensor).numpy()).hexdigest()


def _changed(weight_map: dict, model) -> list[str]:
    """The uncovered state_dict keys whose value is not the one the previous export was made from (all of them when
    the map recorded no values, or no model is given)."""
    recorded = weight_map.get("uncovered_sha256") or {}
    if model is None or not recorded:
        return list(weight_map["uncovered"])
    tensors, _, _ = sources(model)
    return [name for name in weight_map["uncovered"]
            if name not in tensors or recorded.get(name) != _digest(tensors[name])]


def _constant(entry: Stored) -> bool:
    data = bytes(entry.data[:4096])
    return len(set(data[i:i + 4] for i in range(0, min(len(data), 4096), 4))) <= 1


def _match(entry: Stored, index: dict, variants: list[_Variant]) -> tuple[list[dict] | None, int | None]:
    """The parts a stored tensor is made of: one variant (identity, transpose, cast, reshape), or several
    concatenated along an axis; (None, None) when nothing matches."""
    if entry.nbytes == 0:
        return None, None
    data = _stored_u8(entry)
    for variant in index.get((len(data), _sample(data)), []):
        if entry.dtype is None and "cast" in variant.transform:
            continue  # an untyped storage (.pt2, .pte named data) holds the parameter's own dtype
        if (entry.dtype is None or str(variant.dtype).endswith(entry.dtype)) and variant.equals(data):
            return [_part(variant, entry.shape)], None
    stored = _as_tensor(entry)
    if stored is None or stored.dim() not in (1, 2):
        return None, None
    for axis in range(stored.dim()):
        parts = _concat(stored, axis, variants)
        if parts:
            return parts, axis
    return None, None


def _part(variant: _Variant, shape: list[int] | None) -> dict:
    transform = list(variant.transform)
    if shape is not None and list(variant.shape) != list(shape):
        transform.append("reshape")
    return {"keys": list(variant.keys), "transform": transform or ["identity"]}


def _concat(stored, axis: int, variants: list[_Variant]) -> list[dict] | None:
    import torch

    size, position, parts = stored.shape[axis], 0, []
    others = [d for i, d in enumerate(stored.shape) if i != axis]
    candidates = [v for v in variants if v.dtype == stored.dtype and len(v.shape) == stored.dim()
                  and [d for i, d in enumerate(v.shape) if i != axis] == others]
    while position < size:
        for variant in candidates:
            length = variant.shape[axis]
            if length <= size - position and length < size and torch.equal(stored.narrow(axis, position, length),
                                                                          variant.tensor):
                parts.append({"keys": list(variant.keys), "transform": list(variant.transform) or ["identity"],
                              "length": int(length)})
                position += length
                break
        else:
            return None
    return parts if len(parts) > 1 else None


def _compute(record: dict, tensors: dict):
    """A map entry's bytes from `tensors` (the parameters by name): each part transformed, concatenated, reshaped."""
    import torch

    pieces = []
    dtype = _torch_dtype(record["dtype"]) if record["dtype"] in FLOAT_DTYPES else None
    for part in record["parts"]:
        values = [tensors[key] for key in part["keys"]]
        first = values[0]
        for other, key in zip(values[1:], part["keys"][1:]):
            if other.shape != first.shape or not torch.equal(other, first):
                raise RebindRefused(f"{record['file']}:{record['name']} serves {part['keys'][0]} and {key}, whose new "
                                    "values differ (one stored tensor, several parameters)", file=record["file"])
        pieces.append(_transformed(first.t() if "transpose" in part["transform"] else first, part["transform"], dtype))
    tensor = torch.cat(pieces, dim=record["concat_axis"]) if record["concat_axis"] is not None else pieces[0]
    return _u8(tensor)


#: A stored tensor larger than this (bytes at the export's dtype) is written from a checkpoint's shards in blocks of
#: rows of about this size (`_write_blocks`): a vocabulary's embedding or head (Llama-3.2-1B's 128256 x 2048 is 1 GB
#: at float32) never whole in memory, nor its float16 copy, nor the temporaries of `clamped_float16`.
BLOCK_BYTES = 64 << 20
_BLOCK_TRANSFORMS = {"identity", "cast", "cast_clamped", "reshape", "transpose"}


def _in_blocks(record: dict, entry: Stored, tensors) -> bool:
    """Whether the entry is written in row blocks (`_write_blocks`): a checkpoint's tensors (`rows`), a stored
    tensor over `BLOCK_BYTES` made of one 2-D source tensor (its keys tied or identical: one stored name), cast,
    clamped, transposed or reshaped, nothing concatenated."""
    parts = record["parts"]
    if not hasattr(tensors, "rows") or record["concat_axis"] is not None or len(parts) != 1 \
            or entry.nbytes <= BLOCK_BYTES or not set(parts[0]["transform"]) <= _BLOCK_TRANSFORMS:
        return False
    names = {tensors.stored_name(key) for key in parts[0]["keys"]}
    return len(names) == 1 and len(tensors.shape(parts[0]["keys"][0])) == 2 and \
        ("transpose" not in parts[0]["transform"] or "reshape" not in parts[0]["transform"])


def _write_blocks(folder: Path, record: dict, entry: Stored, tensors) -> int:
    """The entry's bytes made and written a block of its rows at a time (a transposed one's rows are the source's
    columns), each compared with the stored block first; returns the bytes written. One block's source rows, their
    converted copy and the bytes in memory, never the tensor."""
    import torch

    part = record["parts"][0]
    key, transpose = part["keys"][0], "transpose" in part["transform"]
    dtype = _torch_dtype(record["dtype"]) if record["dtype"] in FLOAT_DTYPES else None
    rows, width = tensors.shape(key)[::-1] if transpose else tensors.shape(key)
    stored, written, position = _stored_u8(entry), 0, 0
    step = max(1, BLOCK_BYTES // max(1, width * 4))
    for start in range(0, rows, step):
        tensor = tensors.rows(key, start, min(rows, start + step), columns=transpose)
        data = _u8(_transformed(tensor.t() if transpose else tensor, part["transform"], dtype))
        if position + len(data) > entry.nbytes:
            raise RebindRefused(f"{record['file']}:{record['name']}: the new weights make more than the stored "
                                f"tensor's {entry.nbytes} bytes", file=record["file"])
        if not torch.equal(data, stored[position:position + len(data)]):
            write_at(folder / entry.file, [(entry.offset + position, data.numpy().tobytes())])
            written += len(data)
        position += len(data)
    if position != entry.nbytes:
        raise RebindRefused(f"{record['file']}:{record['name']}: the new weights make {position} bytes, the stored "
                            f"tensor has {entry.nbytes}", file=record["file"])
    return written


def refusal(weight_map: dict | None, key: str, model=None) -> str | None:
    """Why this map cannot take `model`'s weights with rebind key `key` (None: it can). A state_dict key that no
    stored tensor holds is let through only when its value is the one the previous export was made from (a parameter
    the graphs never read, such as an untied encoder-decoder's unused `model.shared.weight`, which training leaves
    as it is): wherever it went, the artifact then holds its new value already. Where a folded tensor made from it
    is stored, that tensor matches no parameter and `unmapped` refuses the map."""
    if not weight_map:
        return "the previous export has no weight map"
    if weight_map.get("version") != MAP_VERSION:
        return f"the previous export's weight map is version {weight_map.get('version')}, not {MAP_VERSION}"
    if weight_map.get("rebind_key") != key:
        return "the previous export's rebind key differs (config, recipe target, packages or parameter shapes)"
    if weight_map.get("degenerate"):
        names = weight_map["degenerate"]
        return (f"the previous export came from a degenerate checkpoint: {len(names)} parameter(s) bit-identical to "
                f"another or constant (e.g. {names[0]}), which the exporters may have merged or dropped")
    changed = _changed(weight_map, model) if weight_map.get("uncovered") else []
    if changed:
        return f"state_dict key {changed[0]} maps to no stored tensor of the previous export" + (
            ", and its value changed" if model is not None and weight_map.get("uncovered_sha256") else "")
    if weight_map.get("unmapped"):
        return f"stored tensor {weight_map['unmapped'][0]} of the previous export maps to no parameter"
    return None


def apply(folder: Path, manifest: dict, weight_map: dict, model=None, tensors=None) -> int:
    """Write `model`'s weights into the export in `folder` through `weight_map` (checked with `refusal` first).
    Each entry must still be where the map says, with its size, dtype and shape. Returns the bytes written.

    `tensors` instead of `model`: the tensors by state_dict key, read as each entry needs them (a checkpoint's
    shards, `hfexport.rebind.checkpoint.CheckpointTensors`: one entry's tensors in memory at a time, each entry
    written as it is made). Its `derived(keys)`, where it has one, names the keys that no checkpoint holds (buffers
    the config derives, which the rebind key pins): an entry made of those alone keeps its stored bytes."""
    import torch

    if tensors is None:
        tensors, _, _ = sources(model)
    stored = stored_tensors(folder, manifest)
    module = weight_writer(manifest["export_format"])
    streamed = model is None
    derived = getattr(tensors, "derived", lambda keys: False)
    written = 0
    updates: dict[str, dict[str, bytes]] = {}
    for record in weight_map["tensors"]:
        entry = stored.get(record["file"], {}).get(record["name"])
        if entry is None or entry.nbytes != record["nbytes"] or entry.dtype != record["dtype"] \
                or entry.shape != record["shape"]:
            raise RebindRefused(f"{record['file']}:{record['name']} is not in the previous export as its weight map "
                                "says", file=record["file"])
        if derived([key for part in record["parts"] for key in part["keys"]]):
            continue
        for part in record["parts"]:
            missing = [key for key in part["keys"] if key not in tensors]
            if missing:
                raise RebindRefused(f"{record['file']}:{record['name']} maps to {missing[0]}, which the model lacks",
                                    file=record["file"])
        if streamed and entry.offset is not None and _in_blocks(record, entry, tensors):
            written += _write_blocks(folder, record, entry, tensors)
            release(entry)
            continue
        data = _compute(record, tensors)
        if len(data) != entry.nbytes:
            raise RebindRefused(f"{record['file']}:{record['name']}: the new weights make {len(data)} bytes, the "
                                f"stored tensor has {entry.nbytes}", file=record["file"])
        if not torch.equal(data, _stored_u8(entry)):
            if streamed and entry.offset is not None:  # written now: nothing but this entry's bytes held
                module.write(folder, record["file"], stored[record["file"]], {record["name"]: data.numpy().tobytes()})
                written += len(data)
            else:
                updates.setdefault(record["file"], {})[record["name"]] = data.numpy().tobytes()
        release(entry)  # its pages read (and, streamed, written): handed back before the next entry's
    for file, changes in updates.items():
        module.write(folder, file, stored[file], changes)
    return written + sum(len(data) for changes in updates.values() for data in changes.values())
