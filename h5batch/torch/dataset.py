"""``H5Dataset``: a map-style torch Dataset over one split of an h5batch file.

The file is opened lazily, once per process (keyed on ``os.getpid()``), read-only; the
object pickles without any HDF5 handle, so DataLoader workers (fork or spawn) each open
their own. A whole batch is read by :meth:`H5Dataset.__getitems__` (torch >= 2.0 fetchers
call it with the batch's indices) chunk by chunk, straight into the output tensors.
"""

from __future__ import annotations

import json
import math
import mmap
import operator
import os
from collections.abc import Callable, Sequence
from typing import Any

import h5py
import hdf5plugin  # noqa: F401  -- registers the plugin codecs (zstd, blosc2) with HDF5
import numpy as np
import torch
from torch.utils.data import Dataset, get_worker_info

from .. import format as fmt
from ..remote.rfile import node_object, open_h5
from ..tools.index import check_complete, live_rows, offsets_key, open_file, read_index, shapes_key
from ..tools.views import read_view
from .batch import Batch, Ragged, divide_in_place, empty_columns, float_copy, stored_axes
from .chunks import ChunkStore, gather_padded, gather_rows, gather_span
from .fieldinfo import FieldInfo, encoded_fields, field_info
from .recycle import PrivatePool, shared_pool
from .sharded import Shards, located
from .single import read_one

DEFAULT_WINDOW = 12  # chunk groups the default cache holds: one ChunkShuffleSampler window
CACHE_SLACK = 2  # extra chunks for samples that straddle a chunk boundary
DEFAULT_SAMPLER_CHUNK = 64  # rows per "chunk" when a file has no chunked field to go by


class H5Dataset(Dataset):
    """One split of an h5batch file as a map-style torch ``Dataset``.

    ``ds[i]`` is a dict: a tensor per field, ``label`` (int64 scalar) when labelled, ``source``
    (``str``, or a tuple for one file per field) when ``with_source``. ``__getitems__(indices)``
    returns a :class:`Batch` of already batched tensors; use
    ``collate_fn=h5batch.torch.collate`` to avoid re-stacking.

    Parameters
    ----------
    path : str or PathLike
        A complete h5batch file.
    split : str
        Group to read (``train``, ``test``, ...).
    fields : sequence of str, optional
        Fields to return, in this order; default all, in file order.
    transform : callable, optional
        Applied to each sample dict (after ``as_float``/``channels_first``); ``__getitems__``
        then returns a plain list.
    as_float : bool
        int16 audio -> float32 ``x / 32768``, uint8 images -> float32 ``x / 255``, by the
        field's kind (unknown kind: by dtype); other dtypes as stored.
    with_source : bool
        Add each sample's source path(s), relative to the corpus root.
    cache_bytes : int, optional
        Decoded-chunk cache per field and process. Default: one
        :class:`~h5batch.torch.ChunkShuffleSampler` window of 12 chunk groups (scaled per field,
        doubled for variable fields) plus 2. BEWARE: a cache smaller than a window makes a
        chunk-shuffled epoch decompress chunks several times.
    channels_first : bool
        Images as ``(C, H, W)`` instead of the stored ``(H, W, C)``.
    locking : bool, optional
        HDF5 file locking; ``False`` for NFS/Lustre (h5py#1082). ``None``: HDF5's default.
    direct_chunks : bool
        Read chunks with ``read_direct_chunk`` and decode in Python where the codec allows
        (checked on the first chunk); ``False`` lets HDF5 decode.
    shared_memory : bool, optional
        Batch tensors in shared memory; default: only inside DataLoader workers.
    mmap : bool
        Uncompressed chunks used in place from a read-only mapping of the file, compressed
        ones decoded from it (:mod:`h5batch.torch.chunks`).
    recycle : bool
        Reuse a batch's memory once every tensor on it is dropped (:mod:`h5batch.torch.recycle`).
        Turn off if the main process hands batch tensors to another process without copying them.
    view : str, optional
        Read only the rows of the split's view ``name`` (``/<split>/views/<name>``): ``len`` is
        the view's size, index ``i`` its ``i``-th row, :meth:`chunk_starts` groups them by chunk.
    storage_options, cache_dir, cache_dir_bytes
        ``s3://bucket/key.h5`` paths: s3fs-style keys, node chunk cache and its bound (docs/cloud.md).

    Notes
    -----
    The constructor opens the file only to read its layout and check its index (raising
    ``CorruptFileError``, ``FileNotFoundError`` for a partial, ``BlockingIOError`` for a file
    being written), then closes it; each process opens its own handle on first access.
    ``label`` values index ``class_names``.
    """

    def __init__(self, path: str | os.PathLike[str], split: str = "train",
                 fields: Sequence[str] | None = None,
                 transform: Callable[[dict[str, Any]], Any] | None = None,
                 as_float: bool = True, with_source: bool = False,
                 cache_bytes: int | None = None, *, channels_first: bool = False,
                 locking: bool | None = None, direct_chunks: bool = True,
                 shared_memory: bool | None = None, mmap: bool = True, recycle: bool = True,
                 view: str | None = None, storage_options: dict[str, Any] | None = None,
                 cache_dir: str | os.PathLike[str] | None = None, cache_dir_bytes: int | None = None):
        self.path = os.fspath(path)
        self._object = node_object(self.path, storage_options, cache_dir, cache_dir_bytes)  # s3:// only
        self.split = split
        self.transform = transform
        self.as_float = bool(as_float)
        self.with_source = bool(with_source)
        self.channels_first = bool(channels_first)
        self.locking = locking
        self.direct_chunks = bool(direct_chunks)
        self.mmap = bool(mmap)
        self.shared_memory = shared_memory
        self.view = view
        self._pool = shared_pool() if recycle else None
        if cache_bytes is not None and int(cache_bytes) < 0:
            raise ValueError(f"cache_bytes must be >= 0, got {cache_bytes}")
        self.cache_bytes = None if cache_bytes is None else int(cache_bytes)
        self._shards: Shards | None = None  # a sharded output's shards (torch/sharded.py)
        with self._open(metadata_only=True) as f:
            self._read_layout(f, fields)
        self._clear_process_state()

    # ------------------------------------------------------------------ layout

    def _read_layout(self, f: h5py.File, fields: Sequence[str] | None) -> None:
        version = f.attrs.get(fmt.ATTR_FORMAT)
        if version == fmt.SHARDED_FORMAT:  # its shards read as datasets of their own (torch/sharded.py)
            self._shards = Shards.open(self, f, fields)
            return
        if version not in fmt.READABLE_FORMATS:
            raise ValueError(f"{self.path}: not an h5batch file of format {fmt.READABLE_FORMATS} "
                             f"(root attribute {fmt.ATTR_FORMAT}={version!r})")
        check_complete(f, self.path)
        splits = json.loads(f.attrs[fmt.ATTR_SPLITS])
        if self.split not in splits or self.split not in f:
            raise KeyError(f"{self.path}: no split {self.split!r} (splits: {', '.join(splits)})")
        g = f[self.split]
        stored = json.loads(f.attrs[fmt.ATTR_FIELDS])
        if isinstance(fields, str):
            raise TypeError("fields must be a sequence of field names, not a str")
        wanted = list(stored if fields is None else fields)
        unknown = [n for n in wanted if n not in stored]
        if unknown or len(set(wanted)) != len(wanted) or not wanted:
            raise KeyError(f"{self.path}: bad fields {list(wanted)!r} (fields: {', '.join(stored)})")
        # Checked once, here; the arrays are kept (forked workers share them; _index_array).
        self._n, self._index = read_index(f, self.path, self.split, wanted)
        # store: encoded fields are read as bytes and decoded per sample (torch/fieldinfo.py).
        self.fields, self._encoded = encoded_fields(g, [field_info(g, n) for n in wanted], self.path)
        self._text = tuple(fi.name for fi in self.fields if fi.modality == "text" and not fi.fixed)
        self.labelled = fmt.LABEL in g
        self.class_names: tuple[str, ...] = (
            tuple(f[fmt.CLASS_NAMES].asstr()[...]) if fmt.CLASS_NAMES in f else ())
        if self.with_source and fmt.SOURCE not in g:
            raise KeyError(f"{self.path}: split {self.split!r} has no {fmt.SOURCE} dataset")
        self._source_tuple = fmt.SOURCE in g and g[fmt.SOURCE].ndim == 2
        self._rows = self._selected_rows(f)
        nbytes = [fi.chunk_nbytes for fi in self.fields] or [1 << 20]
        self._h5_cache = fmt.cache_settings(max(nbytes), min(nbytes))

    def _selected_rows(self, f: h5py.File) -> np.ndarray | None:
        """The file rows read, or None: every row: a view's (checked: sorted, unique, in range),
        less those `h5batch sync` tombstoned (a sharded output's: its joined file's, ``f``)."""
        rows = None if self.view is None else read_view(f, self.path, self.split, self.view, self._n)
        live = live_rows(f, self.path, self.split, self._n)
        if live is not None:
            rows = live if rows is None else np.intersect1d(rows, live, assume_unique=True)
        return rows

    @property
    def field_names(self) -> tuple[str, ...]:
        return tuple(fi.name for fi in self.fields)

    def _rows_per_chunk(self, fi: FieldInfo) -> float:
        """Samples per chunk of a field (the average, for a variable field)."""
        if fi.fixed:
            return float(fi.chunk_len)
        return fi.chunk_len * self._n / fi.num_values if fi.num_values else float(self._n or 1)

    def _grouping_field(self) -> FieldInfo | None:
        # The field with the most samples per chunk: a window of its chunks covers whole
        # chunks of every finer field too (whose caches are sized to match).
        return max(self.fields, key=self._rows_per_chunk, default=None) if self._n else None

    @property
    def chunk_rows(self) -> int:
        """Average samples per chunk of the grouping field (the one with the most)."""
        if self._shards is not None:
            return self._shards.parts[0].chunk_rows
        fi = self._grouping_field()
        return max(1, round(self._rows_per_chunk(fi))) if fi else DEFAULT_SAMPLER_CHUNK

    def chunk_starts(self) -> np.ndarray:
        """First sample of every chunk group, ascending from 0: the unit of
        :class:`ChunkShuffleSampler`.

        Groups follow the chunks of the field with the most samples per chunk: ``k`` rows
        of a fixed field, or for a variable field the samples whose values start in the same
        ``values`` chunk. Loads that field's offsets (8 bytes a sample) when variable. With a
        ``view``: the positions in the view where its rows enter a new file chunk group.
        """
        if self._shards is not None:
            return self._shards.chunk_starts(self._rows)
        fi = self._grouping_field()
        if fi is None:
            return np.zeros(0, dtype=np.int64)
        rows = np.arange(self._n) if self._rows is None else self._rows  # sorted file rows
        chunk = rows // fi.chunk_len if fi.fixed else self._offsets(fi)[rows] // fi.chunk_len
        return np.flatnonzero(np.diff(chunk, prepend=-1)).astype(np.int64)

    def __len__(self) -> int:
        return self._n if self._rows is None else len(self._rows)

    def __repr__(self) -> str:
        view = "" if self.view is None else f", view={self.view!r}"
        return (f"H5Dataset({self.path!r}, split={self.split!r}{view}, fields={list(self.field_names)}, "
                f"{len(self)} samples)")

    def loader(self, batch_size: int = 64, shuffle: bool = True, num_workers: int = 0,
               **kwargs: Any) -> Any:
        """A ``DataLoader`` over this dataset set up for speed: with ``shuffle`` a
        :class:`ChunkShuffleSampler` (``seed=``, ``window=``, ``rank=``, ``world_size=``)
        whose epoch advances at every ``iter()``, h5batch's ``collate``, persistent workers,
        ``pin_memory`` where torch has an accelerator; other keywords go to ``DataLoader``.
        Details: :mod:`h5batch.torch.loader`.

        >>> for batch in H5Dataset("out/demo.h5").loader(batch_size=64, num_workers=2):  # doctest: +SKIP
        ...     audio, lengths = batch["audio"], batch["audio_lengths"]
        """
        from .loader import make_loader

        return make_loader(self, batch_size, shuffle, num_workers, **kwargs)

    # ------------------------------------------------------- per-process state

    def _open(self, metadata_only: bool = False) -> h5py.File:
        kw: dict[str, Any] = {} if metadata_only else dict(self._h5_cache)
        if self.locking is not None:
            kw["locking"] = self.locking
        return open_file(self.path, **kw) if self._object is None else open_h5(self._object, **kw)

    def _clear_process_state(self) -> None:
        self._pid: int | None = None
        self._file: h5py.File | None = None
        self._stores: dict[str, ChunkStore] = {}
        self._sources: h5py.Dataset | None = None
        self._mapping: mmap.mmap | None = None
        self._private = PrivatePool() if self._pool is not None else None  # torch/recycle.py

    def _ensure_open(self) -> None:
        pid = os.getpid()
        if self._pid == pid:
            return
        if self._file is not None:
            # Opened by the parent before a fork: the handle belongs to the parent's HDF5
            # state. Closing our copy only releases this process's descriptor.
            try:
                self._file.close()
            except (OSError, ValueError, RuntimeError):
                pass
        self._clear_process_state()
        self._file = self._open()
        self._pid = pid

    def _store(self, fi: FieldInfo) -> ChunkStore:
        store = self._stores.get(fi.name)
        if store is None:
            g = self._file[self.split]
            ds = g[fi.name] if fi.fixed else g[fi.name][fmt.VALUES]
            if self.cache_bytes is None:
                group = self._grouping_field()
                ratio = self._rows_per_chunk(group) / self._rows_per_chunk(fi) if group else 1.0
                capacity = math.ceil(DEFAULT_WINDOW * max(ratio, 1.0))
                if not fi.fixed:  # a group's last sample usually runs into the next chunk
                    capacity *= 2
                capacity += CACHE_SLACK
            else:
                capacity = max(1, self.cache_bytes // max(fi.chunk_nbytes, 1))
            store = self._stores[fi.name] = ChunkStore(ds, capacity, self.direct_chunks, self._map())
        return store

    def _map(self) -> mmap.mmap | None:
        """This process's read-only mapping of the file (the mapping keeps its own descriptor)."""
        if self._mapping is None and self.direct_chunks and self.mmap:
            try:
                with open(self.path, "rb", buffering=0) as fh:
                    self._mapping = mmap.mmap(fh.fileno(), 0, access=mmap.ACCESS_READ)
            except (OSError, ValueError):
                self.mmap = False  # e.g. a file system without mmap: read chunks instead
        return self._mapping

    def _index_array(self, key: str) -> np.ndarray:
        # Small per-sample arrays (8 bytes a sample) are kept in memory; they are plain numpy,
        # valid in any process, so a forked worker shares the parent's checked copy. Pickling
        # drops them: this process loads and checks them again, once.
        if self._shards is not None:
            return self._shards.index_array(key, key.endswith("/" + fmt.OFFSETS))
        if not self._index:
            self._ensure_open()
            self._index = read_index(self._file, self.path, self.split, self.field_names)[1]
        return self._index[key]

    def _offsets(self, fi: FieldInfo) -> np.ndarray:
        return self._index_array(offsets_key(fi.name))

    def close(self) -> None:
        """Close this process's file handle and drop the caches (reopened on next access)."""
        if self._file is not None and self._pid == os.getpid():
            self._file.close()
        if self._shards is not None:
            self._shards.close()
        self._clear_process_state()

    def __getstate__(self) -> dict[str, Any]:
        state = dict(self.__dict__)
        state.update(_pid=None, _file=None, _stores={}, _sources=None, _index={}, _mapping=None)
        return state

    def __enter__(self) -> H5Dataset:
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()

    # ----------------------------------------------------------------- reading

    def __getitem__(self, i: int) -> Any:
        # fixed fields: straight from the cached chunk (torch/single.py)
        one = read_one(self, i) if self._shards is None else None
        if one is not None:
            return one
        batch = self.__getitems__([operator.index(i)])
        return batch.sample(0) if isinstance(batch, Batch) else batch[0]

    def __getitems__(self, indices: Sequence[int]) -> Any:
        """Read a whole batch; returns a :class:`Batch` (or a list when ``transform``)."""
        idx = self._check(indices)
        self._ensure_open()
        in_worker = get_worker_info() is not None
        shared = in_worker if self.shared_memory is None else self.shared_memory
        order = np.argsort(idx, kind="stable")
        b = len(idx)
        # Every output shape first, so all columns (and the labels) share one allocation.
        shapes = {fi.name: self._variable_shapes(fi, idx) for fi in self.fields if not fi.fixed}
        specs = [(self._out_shape(fi, b, shapes.get(fi.name)), self._convert(fi)[0]) for fi in self.fields]
        if self.labelled:
            specs.append(((b,), np.int64))
        # Not in a worker: the batch it sends is moved into shared memory in place, so a
        # private pool there would reuse (overwrite) a batch the main process still holds.
        outs = empty_columns(specs, shared, self._pool, None if in_worker else self._private)
        columns: dict[str, torch.Tensor | Ragged] = {}
        for fi, out in zip(self.fields, outs):
            columns[fi.name] = (self._read_fixed(fi, idx, order, out) if fi.fixed else
                                self._read_variable(fi, idx, order, out, shapes[fi.name]))
        for name, enc in self._encoded.items():  # stored bytes -> decoded column (torch/fieldinfo.py)
            columns[name] = enc.column(columns[name], idx, self.as_float, self.channels_first, shared, self._pool)
        for name in self._text:
            columns[name] = columns[name].strings()
        label = None
        if self.labelled:
            labels = self._index_array(fmt.LABEL)
            label = outs[-1]
            np.take(labels, idx, out=label.numpy())
        source = (self._shards or self)._read_sources(idx) if self.with_source else None
        batch = Batch(columns, label, source, len(idx))
        if self.transform is not None:
            return [self.transform(batch.sample(j)) for j in range(len(batch))]
        return batch

    def _check(self, indices: Sequence[int]) -> np.ndarray:
        if isinstance(indices, torch.Tensor):
            indices = indices.numpy()
        idx = np.asarray(indices)
        if idx.ndim != 1 or not (idx.size == 0 or np.issubdtype(idx.dtype, np.integer)):
            raise TypeError(f"indices must be a 1-D sequence of integers, got {indices!r:.80}")
        given = idx.astype(np.int64)
        n = len(self)
        idx = np.where(given < 0, given + n, given)
        if idx.size and (idx.min() < 0 or idx.max() >= n):
            bad = given[(idx < 0) | (idx >= n)][0]
            where = f"split {self.split!r}" + ("" if self._rows is None else f", view {self.view!r}")
            raise IndexError(f"index {bad} out of range for {n} samples of {where}")
        return idx if self._rows is None else self._rows[idx]  # file rows

    def _convert(self, fi: FieldInfo) -> tuple[np.dtype, float | None]:
        """Output dtype and ``as_float`` divisor of a field (None: stored values)."""
        if self.as_float and fi.float_scale is not None:
            return np.dtype(np.float32), fi.float_scale
        return fi.dtype, None

    def _variable_shapes(self, fi: FieldInfo, idx: np.ndarray) -> np.ndarray:
        """``(B, ndim)`` stored shapes of a variable field's samples ``idx``."""
        if fi.ndim == 1:
            offsets = self._offsets(fi)
            return (offsets[idx + 1] - offsets[idx])[:, None]
        return self._index_array(shapes_key(fi.name))[idx]

    def _axes(self, fi: FieldInfo) -> list[int]:
        """Output axes in stored order: ``(C, H, W)`` from ``(H, W, C)`` with ``channels_first``."""
        cf = fi.channels_first_axes if self.channels_first else None
        return list(cf) if cf is not None else list(range(fi.ndim))

    def _out_shape(self, fi: FieldInfo, b: int, shapes: np.ndarray | None) -> tuple[int, ...]:
        """The batch tensor's shape: ``(B, *sample)``, variable fields padded to the largest."""
        sample = np.asarray(fi.shape if fi.fixed else
                            (shapes.max(axis=0) if b else np.zeros(fi.ndim, dtype=np.int64)))
        return (b, *(int(n) for n in sample[self._axes(fi)]))

    def _read_fixed(self, fi: FieldInfo, idx: np.ndarray, order: np.ndarray,
                    out: torch.Tensor) -> torch.Tensor:
        how = self._convert(fi)[1]
        view = stored_axes(out.numpy(), self._axes(fi))  # e.g. (B, H, W, C) of a (B, C, H, W) batch
        if len(idx):
            stores, which, rows = located(self, fi, idx)  # gathered and converted in one pass per row
            gather_rows(stores, which[order], rows[order], order, view, float_copy(how) if how else None)
        return out

    def _read_variable(self, fi: FieldInfo, idx: np.ndarray, order: np.ndarray,
                       out: torch.Tensor, shapes: np.ndarray) -> Ragged:
        offsets = self._offsets(fi)  # a sharded output's: rebased, so each shard's are less its base
        lo, hi = offsets[idx], offsets[idx + 1]
        how = self._convert(fi)[1]
        perm = self._axes(fi)
        view = out.numpy()
        stored_view = stored_axes(view, perm)  # (B, *stored axes)
        stores, which = None, None
        if len(idx) and int((hi - lo).sum()):
            stores, which, _ = located(self, fi, idx)
            if self._shards is not None:
                base = offsets[self._shards.base[which]]
                lo, hi = lo - base, hi - base
        if fi.ndim == 1:  # each sample converted straight into its padded row
            gather_padded(stores, which, lo, hi, order, view, float_copy(how) if how else None)
            return Ragged(out, shapes[:, perm])
        view[order] = 0
        for j in order.tolist():
            a, e = int(lo[j]), int(hi[j])
            if e > a:
                tmp = np.empty(e - a, dtype=fi.dtype)
                gather_span(stores[which[j]], a, e, tmp)
                stored_view[(j, *(slice(0, int(n)) for n in shapes[j]))] = tmp.reshape(shapes[j])
        for j in order.tolist() if how else ():
            divide_in_place(view[j], how)
        return Ragged(out, shapes[:, perm])

    def _read_sources(self, idx: np.ndarray) -> list[Any]:
        if self._sources is None:
            self._sources = self._file[self.split][fmt.SOURCE]
        u, inv = np.unique(idx, return_inverse=True)
        cut = np.flatnonzero(np.diff(u) != 1) + 1
        parts = [self._sources[int(r[0]): int(r[-1]) + 1] for r in np.split(u, cut) if len(r)]
        rows = np.concatenate(parts) if parts else np.empty((0,), dtype=object)
        texts = [tuple(x.decode() for x in row) if self._source_tuple else row.decode() for row in rows]
        return [texts[k] for k in inv.tolist()]

