"""The reader's side of a sharded output (:mod:`h5batch.shards`): its shards read as one split.

:class:`~h5batch.torch.H5Dataset` on a sharded output checks that every shard is there with
its recorded size and rows (a missing or changed one is an error naming it, never the fill
values HDF5 gives a missing virtual source), then opens each shard as an ``H5Dataset`` of its
own, with all of its fast paths; the joined file's virtual datasets are never read. Index
``i`` of the split is row ``i - base[k]`` of shard ``k``, the shard holding it.

A batch within one shard is that shard's batch, with no copy: a
:class:`~h5batch.torch.ChunkShuffleSampler`'s are, but where a chunk group of its window
meets another shard's, since chunk groups never span shards (:meth:`Shards.chunk_starts`).
A batch across shards is read shard by shard and assembled as a
:class:`~h5batch.torch.MixedDataset` assembles one (one copy more).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np

from .mixing import MixedDataset


class Shards:
    """``parts``: one H5Dataset per shard, in order, same split and settings."""

    def __init__(self, parts: Sequence[Any]):
        self.parts = list(parts)
        self.mixed = MixedDataset(self.parts)  # its locate() and _assemble()
        self.base = self.mixed.offsets
        self._index: dict[str, np.ndarray] = {}

    def __len__(self) -> int:
        return len(self.mixed)

    def getitem(self, i: int) -> Any:
        k, local = self.mixed.locate([i])
        return self.parts[int(k[0])][int(local[0])]

    def getitems(self, indices: Sequence[int]) -> Any:
        k, local = self.mixed.locate(indices)
        if not k.size or np.all(k == k[0]):
            return self.parts[int(k[0]) if k.size else 0].__getitems__(local)
        parts = [(pos, self.parts[src].__getitems__(local[pos]))
                 for src in np.unique(k).tolist() for pos in [np.flatnonzero(k == src)]]
        return self.mixed._assemble(parts, len(k))

    def chunk_starts(self) -> np.ndarray:
        """Every shard's chunk groups, shifted to split positions: a shard starts a group."""
        out = [p.chunk_starts() + b for p, b in zip(self.parts, self.base[:-1].tolist(), strict=True) if len(p)]
        return np.concatenate(out).astype(np.int64) if out else np.zeros(0, np.int64)

    def index_array(self, key: str, offsets: bool) -> np.ndarray:
        """A per-sample index array of the whole split (``offsets``: the shards' rebased)."""
        if key not in self._index:
            arrays = [p._index_array(key) for p in self.parts]
            if offsets:
                bases = np.cumsum([0] + [int(a[-1]) for a in arrays[:-1]])
                arrays = [arrays[0]] + [a[1:] + b for a, b in zip(arrays[1:], bases[1:].tolist(), strict=True)]
            self._index[key] = np.concatenate(arrays)
        return self._index[key]

    def close(self) -> None:
        for p in self.parts:
            p.close()
