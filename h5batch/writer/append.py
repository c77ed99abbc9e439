"""The append engine: rows in, whole chunks out, each written exactly once
(:class:`ChunkAppender`, for the big per-sample data; :class:`SmallAppender` for metadata)."""

from __future__ import annotations

from collections import deque
from concurrent.futures import Future, ThreadPoolExecutor
from typing import Any

import h5py
import numpy as np

MAX_PENDING = 8  # chunks being encoded on the pool, at most, before the oldest are stored


class ChunkAppender:
    """Appends rows to a chunked dataset one whole chunk at a time.

    ``ds`` has shape ``(n, *row)`` and chunks ``(k, *row)``. Rows are copied into a chunk
    buffer; each full chunk is encoded on the pool (the codecs release the GIL) and written
    with ``write_direct_chunk`` in chunk order, exactly once, so HDF5's single-threaded filter
    pipeline never runs and, the file only ever growing, data covered by a commit is never
    rewritten. The rows of the partial last chunk live in the buffer; a commit saves
    them beside the file (:meth:`checkpoint`), and :meth:`finish` stores them as the
    zero-padded last chunk (HDF5 ignores elements beyond the extent).

    ``tail`` (resume) holds the committed rows that follow the dataset's full chunks.
    """

    def __init__(self, ds: h5py.Dataset, encoder, pool: ThreadPoolExecutor, tail: np.ndarray | None = None,
                 raw: bool = False):
        self.ds = ds
        # Uncompressed: a chunk's stored bytes are its rows, so whole chunks are written
        # straight from the caller's array (shared memory) without a copy or the pool.
        self.raw = raw
        self.k = ds.chunks[0]
        self.row_shape = ds.shape[1:]
        self.encoder = encoder
        self.pool = pool
        self.next_chunk = ds.shape[0] // self.k
        self.buf = np.zeros((self.k, *self.row_shape), dtype=ds.dtype)
        self.fill = 0
        if encoder is not None and ds.shape[0] % self.k:
            # A file written by finish() ends in a padded chunk: take its rows back.
            self.fill = ds.shape[0] - self.next_chunk * self.k
            self.buf[: self.fill] = ds[self.next_chunk * self.k:]
            ds.resize(self.next_chunk * self.k, axis=0)
        if tail is not None and len(tail):
            self.buf[self.fill: self.fill + len(tail)] = tail
            self.fill += len(tail)
        self.n = ds.shape[0] + self.fill
        # The extent, tracked here to save two HDF5 calls per chunk. It grows once per append;
        # a commit drains every append first, so the extent it records is exact.
        self.extent = ds.shape[0]
        self.pending: deque[tuple[int, Future]] = deque()
        self.zero_index = (0,) * len(self.row_shape)

    def append(self, rows: np.ndarray) -> None:
        """Append ``rows`` of shape ``(m, *row)``."""
        m = rows.shape[0]
        if self.encoder is None:  # codec only HDF5 can encode (lzf): let it
            self.ds.resize(self.n + m, axis=0)
            self.ds[self.n: self.n + m] = rows
            self.n += m
            self.extent = self.n
            return
        self._grow((self.next_chunk + (self.fill + m) // self.k) * self.k)
        pos = 0
        while pos < m:
            if self.raw and self.fill == 0 and m - pos >= self.k:
                self._emit(rows[pos: pos + self.k])  # whole chunk: straight from the caller's rows
                self.next_chunk += 1
                pos += self.k
                continue
            take = min(self.k - self.fill, m - pos)
            self.buf[self.fill: self.fill + take] = rows[pos: pos + take]
            self.fill += take
            pos += take
            if self.fill == self.k:
                self._emit(self.buf)
                if not self.raw:  # the pool still reads the old buffer; a raw one is stored
                    self.buf = np.zeros((self.k, *self.row_shape), dtype=self.ds.dtype)
                self.fill = 0
                self.next_chunk += 1
        self.n += m

    @property
    def rows_in_file(self) -> int:
        """Data rows the file holds for the committed samples (the rest of the last chunk's
        rows are in the tail): what a commit records and a resume cuts back to."""
        if self.encoder is None:
            return self.ds.shape[0]
        return self.next_chunk * self.k

    def _emit(self, chunk: np.ndarray) -> None:
        if self.raw:
            self._drain()
            self._store(self.next_chunk, chunk)
            return
        self.pending.append((self.next_chunk, self.pool.submit(self.encoder, chunk)))
        if len(self.pending) > MAX_PENDING:
            self._drain(keep=MAX_PENDING // 2)

    def _drain(self, keep: int = 0) -> None:
        while len(self.pending) > keep:
            idx, fut = self.pending.popleft()
            self._store(idx, fut.result())

    def _grow(self, end: int) -> None:
        if self.extent < end:
            self.ds.resize(end, axis=0)
            self.extent = end

    def _store(self, idx: int, data: bytes) -> None:
        self._grow((idx + 1) * self.k)
        self.ds.id.write_direct_chunk((idx * self.k, *self.zero_index), data)

    def checkpoint(self) -> np.ndarray | None:
        """Store every full chunk; return the rows of the partial last chunk (to be saved
        beside the file), or None when there are none."""
        if self.encoder is None:
            return None
        self._drain()
        written = self.next_chunk * self.k
        if self.extent > written:  # grown for chunks a failed append never stored
            self.ds.resize(written, axis=0)
            self.extent = written
        return self.buf[: self.fill].copy() if self.fill else None

    def finish(self) -> None:
        """Store everything, the partial last chunk zero-padded; extent becomes ``n``."""
        if self.encoder is None:
            return
        self._drain()
        if self.fill:
            # Grow the extent first: shrinking over a written chunk would make HDF5 rewrite
            # it through its own filter.
            self.ds.resize(self.n, axis=0)
            self.extent = self.n
            self.buf[self.fill:] = 0  # a reused buffer holds old rows: keep the padding zero
            self.ds.id.write_direct_chunk((self.next_chunk * self.k, *self.zero_index), self.encoder(self.buf))


class SmallAppender:
    """Appends rows to a small dataset with ordinary h5py writes (goes through the cache)."""

    def __init__(self, ds: h5py.Dataset):
        self.ds = ds
        self.n = ds.shape[0]

    def append(self, rows: Any) -> None:
        m = len(rows)
        if m == 0:
            return
        self.ds.resize(self.n + m, axis=0)
        self.ds[self.n: self.n + m] = rows
        self.n += m


def small_dataset(group: h5py.Group, name: str, shape: tuple[int, ...], dtype, chunk_rows: int) -> h5py.Dataset:
    if name in group:
        return group[name]
    return group.create_dataset(name, shape=(0, *shape), maxshape=(None, *shape), dtype=dtype,
                                chunks=(chunk_rows, *shape))
