"""An int8-weight OpenVINO generation target exported from the model's placeholder twin (issue 45,
`hfexport.rebind.placeholders`), so the export never holds the float32 (or bfloat16) model (a float32 target: steps
1 and 2 only, the weight map kept):

1. the twin is converted without the target's quantizer, each placeholder parameter's constant file-backed
   (`file_backed_constants`): OpenVINO's PyTorch frontend makes every constant contiguous (`.contiguous()` in
   `torch_tensor_to_ov_const`), which turns a one-row placeholder into the whole float32 tensor; here that copy is
   written into an unlinked scratch file and mapped, so its pages are clean page cache the kernel (or a memory
   cgroup) takes back, not anonymous memory the size of the model;
2. the float32 IR is saved and the weights written into its `.bin` from the checkpoint's shards through the weight
   map, entry by entry (`hfexport.rebind.placeholders.write_weights`, as for ONNX);
3. the target's own quantizer (NNCF's data-free `compress_weights`, INT8_ASYM: the same call and settings as the
   export from the weights) compresses the IR read back memory-mapped (`compress_written`): NNCF reads one constant
   at a time and keeps the int8 weights, zero points and scales, a quarter of the float32 model; the float32 `.bin`
   is then replaced by the compressed IR. The float32 weights are never resident at once there: the converted
   graph's scratch pages are handed back first (`release_scratch`), and each constant NNCF read is handed back
   when it reads the next (`constants_released_as_read`): only file pages, read again from the file if touched,
   so the files are the same byte for byte.

docs/rebind.md, "The structure traced without weights".
"""

from __future__ import annotations

import contextlib
import json
import mmap
import os
import tempfile
import weakref
from pathlib import Path

from hfexport.files import MANIFEST_FILE, drop_file_pages, repeating
from hfexport.formats.openvino.genai_layout import OPENVINO_MODEL
from hfexport.workarounds import replaced

#: A placeholder constant smaller than this is made in memory as the frontend makes it (norms, biases).
FILE_BACKED_MIN_BYTES = 1 << 20
#: The target quantization compressed after the weights are written: data-free int8 weight compression, NNCF's
#: defaults otherwise (a ratio, group size or ignored scope would be the same call, untested here).
STRUCTURE_QUANTIZATION = {"method": "nncf_weights", "params": {"mode": "int8_asym"}}
#: NNCF's OpenVINO weight-compression backend reads each weight constant through these (nncf 3.4:
#: `nncf.openvino.graph.node_utils`, imported by name into the backend's module)
NNCF_CONSTANT_READERS = ("get_const_value_as_ov_tensor", "get_const_value_as_numpy_tensor")
#: the scratch files' mappings made by `file_backed_constants` that are still alive (the converted graph's)
_scratch_mappings: list = []


def traced_without_weights(quantization, options=None) -> bool:
    """Whether an OpenVINO generation target with `quantization` (its recipe section) and `options` is exported from
    the twin: a float32 one (no quantization, its weights not compressed to float16: `compress_to_fp16` keeps an
    out-of-range weight at float32, which a placeholder never is) or the data-free int8 one."""
    if (options or {}).get("compress_to_fp16"):
        return False
    return not quantization or {key: quantization.get(key) for key in ("method", "params")} == \
        STRUCTURE_QUANTIZATION and not quantization.get("calibration") and not quantization.get("preset")


@contextlib.contextmanager
def file_backed_constants(scratch: Path):
    """OpenVINO's PyTorch frontend, while converting, makes each large placeholder's constant (a tensor with a
    stride of 0) in a mapped scratch file under `scratch` (unlinked at once: the mappings hold it) instead of
    anonymous memory; its pages are written back and dropped from this process once filled."""
    import numpy as np
    from openvino import op
    from openvino.frontend.pytorch import fx_decoder

    convert = fx_decoder.torch_tensor_to_ov_const

    def constant(tensor, shared_memory=True):
        if tensor.dim() < 2 or 0 not in tensor.stride() or tensor.is_complex() or \
                tensor.numel() * tensor.element_size() < FILE_BACKED_MIN_BYTES or not tensor.dtype.is_floating_point \
                or tensor.dtype.itemsize != 4:
            return convert(tensor, shared_memory=shared_memory)
        array = _mapped(scratch, tuple(tensor.shape), np.dtype(np.float32))
        array[...] = tensor.detach().numpy()  # one row broadcast, written page by page into the file
        _written_back(array)
        return op.Constant(array, shared_memory=True)

    fx_decoder.torch_tensor_to_ov_const = constant
    try:
        with scratch_released():  # what the converter reads of them again (its passes over the graph) handed back
            yield
    finally:
        fx_decoder.torch_tensor_to_ov_const = convert


def _mapped(scratch: Path, shape: tuple, dtype):
    """A writable array of `shape` mapped from a new, already unlinked file in `scratch`."""
    import numpy as np

    scratch.mkdir(parents=True, exist_ok=True)
    size = max(1, int(np.prod(shape)) * dtype.itemsize)
    descriptor, name = tempfile.mkstemp(dir=scratch, prefix=".placeholder-")
    try:
        os.unlink(name)
        os.ftruncate(descriptor, size)
        mapping = mmap.mmap(descriptor, size, mmap.MAP_SHARED, mmap.PROT_READ | mmap.PROT_WRITE)
    finally:
        os.close(descriptor)
    _scratch_mappings[:] = [ref for ref in _scratch_mappings if ref() is not None] + [weakref.ref(mapping)]
    return np.frombuffer(mapping, dtype=dtype).reshape(shape)


def release_scratch() -> None:
    """The resident pages of every live scratch mapping (the converted graph's placeholder constants, read again
    when the graph was saved) handed back: they stay in their files, read again if the graph is."""
    for ref in _scratch_mappings:
        mapping = ref()
        if mapping is not None and not mapping.closed:
            mapping.madvise(mmap.MADV_DONTNEED)  # a shared file mapping: nothing is lost, dirty pages are written


@contextlib.contextmanager
def scratch_released(every: float = 0.05):
    """`release_scratch` every `every` seconds from a thread while the block runs (the twin converted, its IR saved:
    OpenVINO reads the placeholder constants again, each page then resident until the kernel needs it), and once
    when it ends: the scratch pages never all resident at once. Safe at any time: the mappings are shared, so a
    page handed back while it is written keeps its bytes in the page cache and file."""
    try:
        with repeating(release_scratch, every, "hfexport-release-scratch"):
            yield
    finally:
        release_scratch()


def release_constant(node) -> int:
    """The resident file pages of an OpenVINO constant's data (a memory-mapped `.bin`'s) handed back
    (`hfexport.files.drop_file_pages`: read again from the file if touched); bytes dropped."""
    import numpy as np

    try:
        data = np.asarray(node.data)
    except (RuntimeError, TypeError, ValueError):  # not a constant whose data numpy reads
        return 0
    start = data.__array_interface__["data"][0]
    return drop_file_pages(start, start + data.nbytes)


@contextlib.contextmanager
def constants_released_as_read():
    """NNCF's OpenVINO weight compression (`compress_weights`) of a memory-mapped IR with each weight constant's
    pages handed back (`release_constant`) when it reads the next one, and the last ones on leaving: NNCF reads and
    compresses a weight at a time, but the pages it read stay resident (file pages, the mapped `.bin`'s) until the
    kernel needs them, so its peak resident set was the whole float32 model. Nothing NNCF computes changes."""
    from nncf.quantization.algorithms.weight_compression import openvino_backend as backend

    read: list = []

    def released(function):
        def reading(node):
            while read:
                release_constant(read.pop())
            read.append(node)
            return function(node)
        return reading

    with replaced(*((backend, name, released(getattr(backend, name))) for name in NNCF_CONSTANT_READERS
                    if hasattr(backend, name))):
        try:
            yield
        finally:
            while read:
                release_constant(read.pop())


def _written_back(array) -> None:
    """The array's dirty pages written to its file and dropped from this process (re-read from the page cache or
    the file when the constant is next read)."""
    mapping = array.base
    while mapping is not None and not isinstance(mapping, mmap.mmap):
        mapping = getattr(mapping, "base", None) or getattr(mapping, "obj", None)
    if isinstance(mapping, mmap.mmap):
        mapping.flush()
        mapping.madvise(mmap.MADV_DONTNEED)


def compress_written(folder: Path, quantizer) -> None:
    """The float32 IR saved in `folder` (its weights written) compressed by the target's `quantizer`, in place: the
    `.xml` and `.bin` replaced by the compressed ones, the manifest's weight map (the float32 IR's) dropped, as a
    quantized export records none."""
    import openvino as ov
    from transformers.exporters import ExportFormat

    folder = Path(folder)
    release_scratch()  # the converted graph's placeholders, read when it was saved
    model = ov.Core().read_model(str(folder / OPENVINO_MODEL))  # the .bin memory-mapped (ENABLE_MMAP)
    with constants_released_as_read():
        compressed = quantizer.quantize(model, {}, ExportFormat.OPENVINO)
    staged = folder / f".compressed-{OPENVINO_MODEL}"
    ov.save_model(compressed, str(staged), compress_to_fp16=False)
    del model, compressed
    binary = Path(OPENVINO_MODEL).with_suffix(".bin").name
    os.replace(staged.with_suffix(".bin"), folder / binary)
    os.replace(staged, folder / OPENVINO_MODEL)
    manifest = json.loads((folder / MANIFEST_FILE).read_text(encoding="utf-8"))
    manifest.pop("weight_map", None)
    (folder / MANIFEST_FILE).write_text(json.dumps(manifest, indent=2) + "\n", encoding="utf-8")
