"""A remote h5batch file as the file object h5py reads (``h5py.File(RemoteFile(...))``).

Every read HDF5 makes lands here. A read inside one chunk of a chunked dataset is served
from that whole chunk in the node cache (:class:`~h5batch.remote.cache.ObjectCache`: one
ranged GET per chunk per node, neighbours coalesced by the prefetcher); any other read
(superblock, object headers, B-trees, heaps, contiguous datasets) from aligned metadata
blocks of :data:`~h5batch.remote.cache.META_BLOCK` bytes, also cached for the node. So the
reader's code is the same as for a local file (``read_direct_chunk`` and the index checks);
only the bytes come from elsewhere.

The chunk map (every chunk's offset and size) is listed once per node with ``chunk_iter``
and kept as ``chunks.npy`` in the cache folder; until it exists, reads go through metadata
blocks (the listing itself touches only metadata).
"""

from __future__ import annotations

import os
from typing import Any

import h5py
import numpy as np

from . import cache_root, is_s3
from .cache import META_BLOCK, ObjectCache
from .client import ObjectClient


def open_object(url: str, storage_options: dict[str, Any] | None = None, cache_dir: str | None = None,
                cache_dir_bytes: int | None = None, helper: bool = False) -> ObjectCache:
    """The node cache of the object at ``url`` as it is now (one HEAD); ``helper``: this
    process's requests made by :mod:`h5batch.remote.helper`."""
    client = ObjectClient(url, storage_options, helper)
    head = client.head()
    if head is None:
        raise FileNotFoundError(f"{url}: no such object")
    return ObjectCache(client, head[0], head[1], cache_dir or cache_root(), cache_dir_bytes)


def node_object(path: str, storage_options: dict[str, Any] | None, cache_dir: Any,
                cache_dir_bytes: int | None) -> ObjectCache | None:
    """:func:`open_object` for an ``s3://`` path, None for a local one (H5Dataset's hook: its
    process starts DataLoader workers, so its own requests go through the helper)."""
    if not is_s3(path):
        return None
    return open_object(path, storage_options, cache_dir and os.fspath(cache_dir), cache_dir_bytes, helper=True)


class RemoteFile:
    """Read-only, seekable file object over an :class:`ObjectCache`."""

    def __init__(self, cache: ObjectCache):
        self.cache = cache
        self.pos = 0

    def list_chunks(self, f: h5py.File) -> None:
        """List every chunk of ``f`` (this object opened through this file object) into the
        node's ``chunks.npy``, once per node."""
        if self.cache.chunk_map() is not None:
            return
        offs, sizes = [], []

        def one(info: Any) -> None:  # returns None: a value would stop the iteration
            offs.append(info.byte_offset)
            sizes.append(info.size)

        def visit(_name: str, obj: Any) -> None:
            if isinstance(obj, h5py.Dataset) and obj.chunks is not None and obj.id.get_num_chunks():
                obj.id.chunk_iter(one)

        f.visititems(visit)
        order = np.argsort(offs)
        table = np.array([np.asarray(offs, dtype=np.int64)[order], np.asarray(sizes, dtype=np.int64)[order]])
        tmp = os.path.join(self.cache.dir, f"chunks.tmp.{os.getpid()}.npy")
        np.save(tmp, table)
        os.replace(tmp, os.path.join(self.cache.dir, "chunks.npy"))

    def chunk_of(self, offset: int) -> tuple[int, int] | None:
        """The chunk ``(offset, size)`` holding byte ``offset``, if any."""
        m = self.cache.chunk_map()
        if m is None:
            return None
        starts, ends = m
        i = int(np.searchsorted(starts, offset, side="right")) - 1
        if i >= 0 and offset < ends[i]:
            return int(starts[i]), int(ends[i] - starts[i])
        return None

    # ------------------------------------------------------------ file object

    def seek(self, offset: int, whence: int = 0) -> int:
        self.pos = offset if whence == 0 else (self.pos + offset if whence == 1 else self.cache.size + offset)
        return self.pos

    def tell(self) -> int:
        return self.pos

    def readable(self) -> bool:
        return True

    def seekable(self) -> bool:
        return True

    def readinto(self, buf: Any) -> int:
        mv = memoryview(buf).cast("B")
        n = min(len(mv), max(0, self.cache.size - self.pos))
        done = 0
        while done < n:
            at = self.pos + done
            chunk = self.chunk_of(at)
            if chunk is not None and at + (n - done) <= chunk[0] + chunk[1]:
                data = self.cache.read(*chunk)
                mv[done:n] = data[at - chunk[0]: at - chunk[0] + n - done]
                done = n
                break
            b = at // META_BLOCK * META_BLOCK
            size = min(META_BLOCK, self.cache.size - b)
            data = self.cache.read(b, size)
            take = min(n - done, b + size - at)
            mv[done: done + take] = data[at - b: at - b + take]
            done += take
        self.pos += done
        return done

    def read(self, n: int = -1) -> bytes:
        n = self.cache.size - self.pos if n is None or n < 0 else n
        buf = bytearray(max(0, min(n, self.cache.size - self.pos)))
        self.readinto(buf)
        return bytes(buf)

    def close(self) -> None:
        pass


def open_h5(cache: ObjectCache, **kw: Any) -> h5py.File:
    """``h5py.File`` over the cached object, read-only; lists its chunks for the node."""
    rf = RemoteFile(cache)
    f = h5py.File(rf, "r", **kw)
    rf.list_chunks(f)
    return f


__all__ = ["RemoteFile", "node_object", "open_h5", "open_object"]
