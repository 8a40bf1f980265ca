"""Initializers computed while `onnx_ir.save` writes them (issue 45): a variant's quantized, packed or transposed
weights are made one at a time from the float32 graph's data file, never all held at once.

`onnx_ir.load` leaves a graph's external initializers on disk (`ExternalTensor`); `read` gives one's values read
with `numpy.fromfile` (no memory map left behind, whose pages the resident set would count), `rows` a block of a
2-D one's rows; `lazy` is an `onnx_ir.LazyTensor` whose values `compute()` makes when it is written; `Parts` shares
one computation among the tensors it makes together (a weight's 4-bit blocks, scales and zero points), each part
dropped once it is taken.
"""

from __future__ import annotations

import threading
from collections.abc import Callable


def read(tensor):
    """The values of an `onnx_ir` tensor as a numpy array: an external one read from its file (a copy, no map)."""
    import numpy as np
    import onnx_ir

    if isinstance(tensor, onnx_ir.ExternalTensor):
        raw = np.fromfile(tensor.path, dtype=np.uint8, count=tensor.nbytes, offset=tensor.offset or 0)
        return raw.view(tensor.dtype.numpy()).reshape(tuple(tensor.shape.numpy()))
    return tensor.numpy()


def rows(tensor, start: int, stop: int):
    """Rows `start:stop` of a 2-D `onnx_ir` tensor as a numpy array (an external one's read alone from its file)."""
    import numpy as np
    import onnx_ir

    if isinstance(tensor, onnx_ir.ExternalTensor):
        width = int(tensor.shape[1])
        row = width * int(tensor.dtype.itemsize)
        raw = np.fromfile(tensor.path, dtype=np.uint8, count=(stop - start) * row,
                          offset=(tensor.offset or 0) + start * row)
        return raw.view(tensor.dtype.numpy()).reshape(stop - start, width)
    return tensor.numpy()[start:stop]


def lazy(name: str, compute: Callable, dtype, shape):
    """A tensor `name` of `dtype` and `shape` whose values (a numpy array) `compute()` makes each time it is read."""
    import onnx_ir

    def evaluate():
        return onnx_ir.tensor(compute(), name=name)

    return onnx_ir.LazyTensor(evaluate, dtype=dtype, shape=onnx_ir.Shape(list(shape)), name=name)


class Parts:
    """The arrays `compute()` returns, computed when the first is asked for (`part(index)`) and each dropped once
    taken: the tensors written one after another hold them for that long only (asked again: computed again)."""

    def __init__(self, compute: Callable, wanted: tuple[int, ...]):
        self._compute, self.wanted, self._held, self._lock = compute, wanted, {}, threading.Lock()

    def part(self, index: int) -> Callable:
        def take():
            with self._lock:
                if index not in self._held:
                    arrays = self._compute()
                    self._held = {i: arrays[i] for i in self.wanted}
                return self._held.pop(index)

        return take
