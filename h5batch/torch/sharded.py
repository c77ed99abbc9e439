"""The reader's side of a sharded output (:mod:`h5batch.shards`): its shards read as one split.

:class:`~h5batch.torch.H5Dataset` on a sharded output checks that every shard is there with
its recorded size and rows (a missing or changed one is an error naming it, never the fill
values HDF5 gives a missing virtual source), then opens each shard as an ``H5Dataset`` of its
own, with all of its fast paths; the joined file's virtual datasets are never read. Index
``i`` of the split is row ``i - base[k]`` of shard ``k``, the shard holding it.

A batch is read as from one file: one allocation for the batch, and each column filled by one
gather over the shards' chunk stores (:meth:`Shards.stores`; ``which`` shard holds each
sample: :mod:`h5batch.torch.chunks`), so a batch across shards costs what a batch of one file
does. The index arrays the batch needs (offsets, shapes, labels) are the shards' joined,
offsets rebased: a shard's own are the joined less the offset at its first row.

On object storage (``s3://.../OUT.h5``) the shards are the objects beside it (uploaded first,
``OUT.h5`` last: :mod:`h5batch.remote.upload`). Every shard object's size is checked with a
HEAD (a missing one is a ``FileNotFoundError`` naming its URL) and its ``created`` attribute
once opened; each is then a remote ``H5Dataset`` of its own (its node cache, a share of
``cache_dir_bytes`` by its size, and in a loader its own prefetcher: :class:`ShardPrefetch`).
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
from ..remote.client import ObjectClient
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
        records = shards.records(f)
        obj = ds._object
        if obj is None:
            paths = shards.check(ds.path, f)
        else:  # s3://: the objects beside OUT.h5, each a remote dataset with its share of the cache bound
            paths = _check_objects(ds.path, records, obj.client.storage_options)
            total = sum(r.bytes for r in records) or 1
            kw.update(storage_options=obj.client.storage_options, cache_dir=obj.root)
        parts = []
        for p, r in zip(paths, records, strict=True):
            if not r.rows[ds.split]:  # no sample of this split: its fields' datasets were never made
                continue
            if obj is not None and obj.max_bytes is not None:
                kw["cache_dir_bytes"] = max(1, obj.max_bytes * r.bytes // total)
            part = type(ds)(p, ds.split, **kw)
            if len(part) != r.rows[ds.split]:
                raise CorruptFileError(ds.path, f"shard {p}", f"{len(part)} samples of split {ds.split!r}, the "
                                                              f"output recorded {r.rows[ds.split]}")
            if obj is not None:
                with part._open(metadata_only=True) as sf:
                    created = str(sf.attrs.get(fmt.ATTR_CREATED, ""))
                if created != r.created:
                    raise CorruptFileError(ds.path, f"shard {p}", f"created {created}, the output recorded "
                                                                  f"{r.created}: the shard was written again since")
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

    def stores(self, fi: Any) -> list[Any]:
        """Every shard's chunk store of field ``fi`` (opened in this process first)."""
        for p in self.parts:
            p._ensure_open()
        return [p._store(fi) for p in self.parts]

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


def located(ds: Any, fi: Any, idx: np.ndarray) -> tuple[list[Any], np.ndarray, np.ndarray]:
    """``(stores, which, rows)`` of H5Dataset ``ds``'s field ``fi`` and split rows ``idx``: its
    chunk stores (one, or one per shard), which holds each sample, and its row there."""
    if ds._shards is None:
        return [ds._store(fi)], np.zeros(len(idx), np.intp), idx
    which, rows = ds._shards.locate(idx)
    return ds._shards.stores(fi), which, rows


def _check_objects(url: str, records: list[shards.ShardRecord], storage_options: dict[str, Any]) -> list[str]:
    """The URLs of the shard objects beside ``url``, after one HEAD each: there, with the
    recorded size; else ``FileNotFoundError`` / ``CorruptFileError`` naming the shard's URL."""
    folder = url.rsplit("/", 1)[0]
    out = []
    for r in records:
        u = f"{folder}/{r.path}"
        head = ObjectClient(u, storage_options, helper=True).head()
        if head is None:
            raise FileNotFoundError(f"{url}: its shard {u} is missing (a sharded output's shard objects "
                                    f"must stay beside it)")
        if head[1] != r.bytes:
            raise CorruptFileError(url, f"shard {u}", f"{head[1]} bytes, the output recorded {r.bytes}: "
                                                      f"the shard changed since the output was joined")
        out.append(u)
    return out


class ShardPrefetch:
    """The prefetch of a sharded ``s3://`` dataset (:mod:`h5batch.remote.prefetch`): one
    :class:`~h5batch.remote.prefetch.Prefetcher` per shard object, each given its shard's
    samples of the epoch's order (in that order, as shard rows) and told how many of them
    the batches delivered so far held."""

    def __init__(self, shards: Shards):
        from ..remote.prefetch import Prefetcher

        self.shards = shards
        self.each = [Prefetcher(p._object) for p in shards.parts]
        self.order = np.zeros(0, np.int64)  # the epoch's shard per sample
        self.done = 0  # samples delivered

    def start_epoch(self, ds: Any, this: np.ndarray, following: np.ndarray | None) -> None:
        k, rows = self.shards.locate(np.asarray(this, dtype=np.int64))
        nk, nrows = self.shards.locate(np.asarray(following, dtype=np.int64)) if following is not None else (None, None)
        self.order, self.done = k, 0
        for s, (part, pf) in enumerate(zip(self.shards.parts, self.each, strict=True)):
            pf.start_epoch(part, rows[k == s], None if nk is None else nrows[nk == s])

    def delivered(self, n: int) -> None:
        counts = np.bincount(self.order[self.done: self.done + n], minlength=len(self.each))
        self.done += n
        for pf, c in zip(self.each, counts.tolist(), strict=True):
            if c:
                pf.delivered(c)

    def close(self) -> None:
        for pf in self.each:
            pf.close()
