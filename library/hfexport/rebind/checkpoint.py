"""A checkpoint's tensors read from its safetensors shards one at a time, for writing weights into a finished export
through its weight map without loading the model (`hfexport.rebind.weight_map.apply(..., tensors=...)`).

The shards are opened memory-mapped (`safetensors.safe_open`); a tensor is read when an entry of the map needs it,
converted to the dtype the export was made at (a bfloat16 checkpoint exported at float32: the map's transforms start
from the float32 parameter), and dropped once the entry is written. So the memory the weights take is the largest
entry's tensors (a concatenation's parts), not the model. Keys the checkpoint does not hold: a tied parameter is
read under the name the checkpoint saved it by (the map lists tied and identical names together in one part); a
buffer that is not in the state_dict (rotary `inv_freq`: derived from the config, which the rebind key pins) keeps
the bytes the export has (`derived`).
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from pathlib import Path

from hfexport.errors import RebindRefused

INDEX_FILE = "model.safetensors.index.json"


def shard_files(folder: Path) -> dict[str, Path]:
    """The shard holding each tensor of the checkpoint in `folder` (its index, else `model.safetensors`)."""
    from safetensors import safe_open

    folder = Path(folder)
    if (folder / INDEX_FILE).is_file():
        index = json.loads((folder / INDEX_FILE).read_text(encoding="utf-8"))
        where = {}
        for key, name in (index.get("weight_map") or {}).items():
            path = folder / name
            if "/" in name or "\\" in name or not path.is_file():
                raise RebindRefused(f"{INDEX_FILE}: weight_map.{key} names {name!r}, not a shard in {folder}",
                                    file=INDEX_FILE)
            where[key] = path
        return where
    path = folder / "model.safetensors"
    if not path.is_file():
        raise RebindRefused(f"{folder}: no model.safetensors nor {INDEX_FILE} (only safetensors checkpoints stream)")
    with safe_open(str(path), framework="pt") as handle:
        return dict.fromkeys(handle.keys(), path)


class CheckpointTensors(Mapping):
    """The tensors of the checkpoint in `folder` by state_dict key, each read from its shard when asked for, at
    `dtype` (a torch dtype: the one the export was made at; None: as stored). `state_dict_keys`: the model's
    state_dict keys (from a model built on the meta device: no weights); a key outside them that the checkpoint
    lacks is a derived buffer. `aliases` (key -> the name it is stored under) are added with `alias_parts`."""

    def __init__(self, folder: str | Path, dtype=None, state_dict_keys=None):
        self.folder, self.dtype = Path(folder), dtype
        self.where = shard_files(self.folder)
        self.state_dict_keys = set(state_dict_keys) if state_dict_keys is not None else None
        self.aliases: dict[str, str] = {}
        self.handles: dict[Path, object] = {}
        self.reads = 0

    def alias_parts(self, weight_map: dict) -> CheckpointTensors:
        """A key the checkpoint does not hold, listed in one part of the map with a key it holds (tied, or identical
        when the export was made), is read as that key. Returns self."""
        for record in weight_map.get("tensors", []):
            for part in record["parts"]:
                held = [key for key in part["keys"] if key in self.where]
                for key in part["keys"]:
                    if key not in self.where and held:
                        self.aliases[key] = held[0]
        return self

    def derived(self, keys) -> bool:
        """Whether `keys` are all buffers outside the state_dict that the checkpoint does not hold."""
        return self.state_dict_keys is not None and all(
            key not in self.where and key not in self.aliases and key not in self.state_dict_keys for key in keys)

    def close(self) -> None:
        """Nothing left to unmap: each read opens its shard and unmaps it again (below)."""
        self.handles.clear()

    def __getitem__(self, key: str):
        from safetensors import safe_open

        name = self.aliases.get(key, key)
        if name not in self.where:
            raise KeyError(key)
        # The shard mapped for this read only: the pages a read touches count in the resident set while the shard is
        # mapped, so a handle kept open would hold the whole checkpoint once every tensor has been read (issue 45).
        with safe_open(str(self.where[name]), framework="pt") as handle:
            tensor = handle.get_tensor(name)
        return self._read(tensor)

    def _read(self, tensor):
        """A tensor just read, counted (`reads`) and converted to `dtype` where it is floating."""
        self.reads += 1
        if self.dtype is not None and tensor.is_floating_point() and tensor.dtype != self.dtype:
            tensor = tensor.to(self.dtype)
        return tensor

    def stored_name(self, key: str) -> str:
        """The name `key` is read under (itself, or the saved name of a tied or identical key: `alias_parts`)."""
        return self.aliases.get(key, key)

    def shape(self, key: str) -> tuple[int, ...]:
        """The stored shape of `key`, from its shard's header (nothing read)."""
        from safetensors import safe_open

        name = self.stored_name(key)
        with safe_open(str(self.where[name]), framework="pt") as handle:
            return tuple(handle.get_slice(name).get_shape())

    def rows(self, key: str, start: int, stop: int, columns: bool = False):
        """Rows `start:stop` of `key` (`columns`: its columns, every row's), read from the shard and converted as
        `__getitem__` converts the whole tensor: a block of a large tensor (a vocabulary's embedding or head) without
        the whole of it in memory, at its stored dtype or the converted one."""
        from safetensors import safe_open

        name = self.stored_name(key)
        with safe_open(str(self.where[name]), framework="pt") as handle:
            part = handle.get_slice(name)
            tensor = part[:, start:stop] if columns else part[start:stop]
        return self._read(tensor)

    def take(self, key: str, indices: list[int]):
        """The rows of `key` that `indices` name, in that order, read in one opening of the shard and converted as
        `rows` converts (an embedding's rows for the ids of a batch)."""
        import torch
        from safetensors import safe_open

        name = self.stored_name(key)
        with safe_open(str(self.where[name]), framework="pt") as handle:
            part = handle.get_slice(name)
            tensor = torch.cat([part[index:index + 1] for index in indices])
        return self._read(tensor)

    def __contains__(self, key) -> bool:
        return self.aliases.get(key, key) in self.where

    def __iter__(self):
        return iter(self.where)

    def __len__(self) -> int:
        return len(self.where)
