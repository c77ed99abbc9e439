"""Uncompressed chunks read with ``preadv`` straight into the batch: no mapped page, no cache.

Why: an uncompressed chunk of a mapped file can be used in place (a view of the mapping,
like a ``numpy.memmap``), but every page the view touches is then mapped into this process
and counts in its resident memory. The reader keeps that bounded by dropping the mapping's
pages in bulk (``MADV_DONTNEED``, :class:`~h5batch.torch.chunks.ChunkStore`), so once a
split is larger than the cache every page faults in again each epoch, and the faults and
the unmapping are a sizeable share of each batch's time. A ``preadv`` of the same bytes
copies them from the page cache into the batch tensor in the kernel: the same one copy a
warm memmap makes, with no page table work, nothing mapped, and nothing cached (the
kernel's page cache is the cache).

The rule: a copy task of :func:`~h5batch.torch.batch.copy_all` whose source is a
:class:`FileSpan` (rows of a plain chunk at a file offset, checked against HDF5 once per
dataset by :meth:`ChunkStore.plain_offset <h5batch.torch.chunks.ChunkStore.plain_offset>`)
is read into its destination when no conversion is needed (and the destination is one
dense buffer), else into a temporary of the stored dtype that the converting copy then
reads while it is still in cache. Only copies of at least :data:`SPAN_MIN_BYTES` take this
path: below that a system call costs more than the page faults it saves, and small rows
are gathered from the mapping with one fancy index per block as before. ``preadv``
releases the GIL, so the copy threads run it in parallel like numpy's copies. A short read
(the file shrank under the reader) raises an ``OSError`` naming the file and offset.
"""

from __future__ import annotations

import mmap
import os
from collections.abc import Callable
from typing import Any

import numpy as np

#: a copy of fewer bytes reads from the mapping (a system call per copy would cost more)
SPAN_MIN_BYTES = 4096


class FileSpan:
    """Values stored as they are at ``offset`` of the file open as ``fd`` (``path`` for
    errors); the destination's shape says how many."""

    __slots__ = ("fd", "offset", "dtype", "path")

    def __init__(self, fd: int, offset: int, dtype: np.dtype, path: str):
        self.fd = fd
        self.offset = offset
        self.dtype = dtype
        self.path = path

    def read_into(self, dst: np.ndarray, copy: Callable[[np.ndarray, np.ndarray], None] | None) -> None:
        """``dst[...] = copy(values)``: one ``preadv``, into ``dst`` itself when ``copy`` is
        None (values as stored) and ``dst`` is one dense buffer of the stored dtype."""
        direct = copy is None and dst.dtype == self.dtype and dst.flags.c_contiguous
        buf = dst if direct else np.empty(dst.shape, dtype=self.dtype)
        got = os.preadv(self.fd, [buf], self.offset)
        if got != buf.nbytes:
            raise OSError(f"{self.path}: read {got} of {buf.nbytes} bytes at offset {self.offset} "
                          "(the file is shorter than its chunk index says)")
        if not direct:
            (copy or np.copyto)(dst, buf)


def mover(copy: Callable[[np.ndarray, np.ndarray], None] | None) -> Callable[[np.ndarray, object], None]:
    """The task function for :func:`~h5batch.torch.batch.copy_all` over sources that are
    arrays or :class:`FileSpan`\\ s: ``copy`` (default ``np.copyto``) for arrays, a read for spans."""
    if copy is np.copyto:
        copy = None
    plain = copy or np.copyto

    def move(dst: np.ndarray, src: object) -> None:
        if type(src) is FileSpan:
            src.read_into(dst, copy)
        else:
            plain(dst, src)

    return move


def map_file(path: str) -> mmap.mmap:
    """``path`` mapped read-only (raises ``OSError`` or ``ValueError`` where it cannot be
    mapped). The mapping keeps its own descriptor; the one opened for it is closed here."""
    with open(path, "rb", buffering=0) as fh:
        return mmap.mmap(fh.fileno(), 0, access=mmap.ACCESS_READ)


def read_fd(f: Any) -> int | None:
    """The descriptor HDF5 reads the open file ``f`` (an ``h5py.File``) through, for
    ``preadv``; None for a driver that has none (``core``, ``fileobj``). Reason: a
    descriptor of our own would be one more per dataset and process, closed only by
    :meth:`~h5batch.torch.dataset.H5Dataset.close` (a dataset dropped without it leaked one;
    a ``ConcatDataset`` of thousands of files runs into the open-file limit); HDF5's lives
    and dies with the file, and ``preadv`` does not move its offset."""
    if getattr(f, "driver", None) != "sec2":
        return None
    try:
        fd = f.id.get_vfd_handle()
    except (OSError, ValueError, RuntimeError):
        return None
    return fd if isinstance(fd, int) and fd >= 0 else None


__all__ = ["SPAN_MIN_BYTES", "FileSpan", "map_file", "mover", "read_fd"]
