"""The reader's side of a sharded output (:mod:`h5batch.shards`): its shards read as one split.

:class:`~h5batch.torch.H5Dataset` on a sharded output checks that every shard is there with
its recorded size and rows (a missing or changed one is an error naming it, never the fill
values HDF5 gives a missing virtual source), then opens each shard as an ``H5Dataset`` of its
own, with all of its fast paths; the joined file's virtual datasets are never read. Index
``i`` of the split is row ``i - base[k]`` of shard ``k``, the shard holding it.

A batch is read as from one file: one allocation for the batch, and each shard holding some
of its samples copies them straight into their rows (:meth:`Shards.split`), so a batch across
shards costs what a batch of one file does. The index arrays the batch needs first (offsets,
shapes, labels) are the shards' joined, offsets rebased.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from typing import Any

import h5py
import numpy as np

from .. import format as fmt
from .. import shards
from ..errors import CorruptFileError
from ..tools.index import check_complete


class Shards:
    """``parts``: one H5Dataset per shard holding samples of the split, in order, same settings."""

    def __init__(self, parts: Sequence[Any]):
        self.parts = list(parts)
        self.base = np.cumsum([0] + [len(p) for p in self.parts]).astype(np.int64)
        self._index: dict[str, np.ndarray] = {}

    @classmethod
    def open(cls, ds: Any, f: h5py.File, fields: Sequence[str] | None) -> Shards:
        """The shards of the joined output ``f`` that hold samples of ``ds.split``, each
        opened as ``type(ds)`` with ``ds``'s settings, once all of them are checked; ``ds``
        takes the first's layout (fields, labels, ...) and the split's length."""
        check_complete(f, ds.path)
        splits = json.loads(f.attrs[fmt.ATTR_SPLITS])
        if ds.split not in splits:
            raise KeyError(f"{ds.path}: no split {ds.split!r} (splits: {', '.join(splits)})")
        kw = dict(fields=fields, transform=None, as_float=ds.as_float, with_source=ds.with_source,
                  cache_bytes=ds.cache_bytes, channels_first=ds.channels_first, locking=ds.locking,
                  direct_chunks=ds.direct_chunks, shared_memory=ds.shared_memory, mmap=ds.mmap,
                  recycle=ds._pool is not None)
        parts = []
        for p, r in zip(shards.check(ds.path, f), shards.records(f), strict=True):
            if not r.rows[ds.split]:  # no sample of this split: its fields' datasets were never made
                continue
            part = type(ds)(p, ds.split, **kw)
            if len(part) != r.rows[ds.split]:
                raise CorruptFileError(ds.path, f"shard {p}", f"{len(part)} samples of split {ds.split!r}, the "
                                                              f"output recorded {r.rows[ds.split]}")
            parts.append(part)
        for name in ("fields", "_encoded", "_text", "labelled", "class_names", "_source_tuple", "_h5_cache"):
            setattr(ds, name, getattr(parts[0], name))
        ds._n, ds._index = sum(len(p) for p in parts), {}
        ds._rows = ds._selected_rows(f)  # the joined file's view and tombstones (rows of the joined split)
        return cls(parts)

    def __len__(self) -> int:
        return int(self.base[-1])

    def locate(self, idx: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """``(shard, row in it)`` of split rows ``idx`` (in range)."""
        k = np.searchsorted(self.base, idx, side="right") - 1
        return k, idx - self.base[k]

    def split(self, idx: np.ndarray, order: np.ndarray) -> list[tuple[Any, np.ndarray, np.ndarray]]:
        """Per shard holding samples of the batch ``idx`` (split rows; ``order`` sorts them):
        ``(shard, rows, positions)``: ``rows[j]`` is batch sample ``j``'s row in that shard
        (0 where another shard holds it), ``positions`` the batch positions it fills, in
        file order, as :meth:`H5Dataset._read_fixed` and ``_read_variable`` take them."""
        k, local = self.locate(idx)
        out = []
        for s in np.unique(k).tolist():
            mine = k == s
            self.parts[s]._ensure_open()
            out.append((self.parts[s], np.where(mine, local, 0), order[mine[order]]))
        return out

    def _read_sources(self, idx: np.ndarray) -> list[Any]:
        k, local = self.locate(idx)
        out: list[Any] = [None] * len(idx)
        for s in np.unique(k).tolist():
            pos = np.flatnonzero(k == s)
            self.parts[s]._ensure_open()
            for j, src in zip(pos.tolist(), self.parts[s]._read_sources(local[pos]), strict=True):
                out[j] = src
        return out

    def chunk_starts(self, rows: np.ndarray | None) -> np.ndarray:
        """Every shard's chunk groups, shifted to split positions: a shard starts a group.
        ``rows`` (a view's, sorted): the positions in it where its rows enter a new group."""
        out = [p.chunk_starts() + b for p, b in zip(self.parts, self.base[:-1].tolist(), strict=True)]
        starts = np.concatenate(out).astype(np.int64) if out else np.zeros(0, np.int64)
        if rows is None:
            return starts
        group = np.searchsorted(starts, rows, side="right")
        return np.flatnonzero(np.diff(group, prepend=-1)).astype(np.int64)

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
