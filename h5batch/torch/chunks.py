"""Whole-chunk reads with a bounded cache of decoded chunks.

Rule: the unit of reading is the chunk. Reason: per-sample h5py reads cost one HDF5 call
each, and HDF5 decompresses a whole chunk for every partial read that misses its cache. Each
touched chunk is fetched once with ``read_direct_chunk`` (no filter run under HDF5's global
lock), decoded in Python by its codec's library, and kept in a small LRU whose buffers are
recycled, so memory stays flat. With the file mapped (``H5Dataset(mmap=True)``, the
default), a compressed chunk is decoded straight from the mapping, located by one listing of
the chunk index per process (:meth:`ChunkStore._chunk_info`): no HDF5 call, no copy of the
stored bytes.

A dataset whose filter pipeline we cannot decode (lzf, szip, fletcher32, ...) or whose
chunks do not hold whole rows is read through HDF5 instead, still one call per chunk. The
first directly decoded chunk of every dataset is compared with what HDF5 itself returns; a
mismatch switches that dataset to HDF5 reads with a warning, so a library change can slow
the reader down but never hand back wrong samples.
"""

from __future__ import annotations

import mmap
import warnings
from collections import OrderedDict
from collections.abc import Sequence

import h5py
import numpy as np

from .. import format as fmt
from ..codecs import ChunkDecoder
from ..errors import RemoteError
from .batch import Copy, copy_all


class ChunkStore:
    """Row blocks ``[c*k, (c+1)*k)`` of a dataset, decoded, with an LRU of ``capacity`` blocks.

    ``k`` is the dataset's chunk length along axis 0, so a block is one HDF5 chunk. Blocks are
    read with ``read_direct_chunk`` + :class:`ChunkDecoder` when ``direct`` and possible, else
    with one ``read_direct`` of the block's rows (HDF5 decodes). Buffers of evicted blocks
    are reused: after the cache fills up, reading allocates nothing.

    Parameters
    ----------
    ds : h5py.Dataset
        Open dataset of shape ``(n, *row)``.
    capacity : int
        Decoded blocks kept (at least 1).
    direct : bool
        Try direct chunk reads. ``False`` always lets HDF5 decode.
    mapping : mmap.mmap, optional
        The whole file mapped read-only. An uncompressed chunk is then used in place (a
        view of the mapping: no read, no copy, like a ``numpy.memmap``); evicted blocks'
        pages are dropped from this process in bulk (``MADV_DONTNEED``; they stay in the
        page cache), so resident memory stays under about twice ``capacity`` blocks.
    """

    def __init__(self, ds: h5py.Dataset, capacity: int, direct: bool = True,
                 mapping: mmap.mmap | None = None):
        self.ds = ds
        self.dtype = ds.dtype  # h5py's property costs a few us per access
        self.n = ds.shape[0]
        self.row = ds.shape[1:]
        chunks = ds.chunks
        whole_rows = chunks is not None and tuple(chunks[1:]) == tuple(self.row)
        if chunks is not None:
            self.k = int(chunks[0])
        else:  # contiguous dataset: blocks of ~1 MiB
            row_bytes = max(1, int(np.prod(self.row, dtype=np.int64)) * ds.dtype.itemsize)
            self.k = max(1, (1 << 20) // row_bytes)
        self.capacity = max(1, int(capacity))
        self.decoder = ChunkDecoder.for_dataset(ds) if (direct and whole_rows) else None
        self.verified: set[str] = set()  # encodings already checked against HDF5
        self.cache: OrderedDict[int, np.ndarray] = OrderedDict()
        self.zeros = (0,) * len(self.row)
        self.raw: np.ndarray | None = None
        self.loads = 0  # blocks read from the file (for tests and tuning)
        unfiltered = self.decoder is not None and not self.decoder.filters
        self.mapping = mapping if unfiltered and chunks is not None else None
        # Compressed chunks decoded from the mapping: (offset, size, filter mask) per chunk.
        self.packed = mapping if self.decoder is not None and not unfiltered and chunks is not None else None
        self.table: tuple[np.ndarray, np.ndarray, np.ndarray] | None = None  # see _chunk_info
        self.listed = False  # the table was tried (built, or chunk_iter is missing or failed)
        self.located: dict[int, tuple[int | None, int, int]] = {}  # lookups without a table
        self.row_bytes = int(np.prod(self.row, dtype=np.int64)) * ds.dtype.itemsize
        self.evicted = 0  # bytes of mapped blocks evicted since their pages were last dropped

    @property
    def direct(self) -> bool:
        return self.decoder is not None

    def get(self, c: int) -> np.ndarray:
        """Block ``c``: its valid rows (the last block may be short), read-only by convention."""
        if self.mapping is not None:
            view = self._get_mapped(c)
            if view is not None:
                return view[: min(self.k, self.n - c * self.k)]
        buf = self.cache.pop(c, None)
        if buf is None:
            if len(self.cache) >= self.capacity:
                buf = self.cache.popitem(last=False)[1]
                if not buf.flags.writeable:  # a mapped block: not a buffer to reuse
                    self._drop(buf)
                    buf = np.empty((self.k, *self.row), dtype=self.dtype)
            else:
                buf = np.empty((self.k, *self.row), dtype=self.dtype)
            self._load(c, buf)
            self.loads += 1
        self.cache[c] = buf
        return buf[: min(self.k, self.n - c * self.k)]

    def _get_mapped(self, c: int) -> np.ndarray | None:
        """Block ``c`` as a view of the file mapping (None: read it the other way)."""
        view = self.cache.pop(c, None)
        if view is None:
            offset, size, mask = self._chunk_info(c)
            if offset is None or size != self.k * self.row_bytes or mask:
                return None  # not written, or not a plain chunk: let _load handle it
            if len(self.cache) >= self.capacity:
                self._drop(self.cache.popitem(last=False)[1])
            view = self._view(offset)
            self.loads += 1
            if "mapped" not in self.verified:
                if not np.array_equal(view[: min(self.k, self.n - c * self.k)], self._hdf5_rows(c)):
                    self._give_up_mapping(f"mapped chunk {c} differs from HDF5's read")
                    return None
                self.verified.add("mapped")
        self.cache[c] = view
        return view

    def _chunk_info(self, c: int) -> tuple[int | None, int, int]:
        """Block ``c``'s stored chunk: ``(file offset, stored bytes, filter mask)``, offset
        None when the chunk is not written.

        Rule: the first lookup lists every chunk of the dataset with one ``chunk_iter``
        call into three arrays indexed by block (:attr:`table`), and later ones read them.
        Reason: HDF5 2.0's ``get_chunk_info_by_coord`` walks the chunk index, so one lookup
        per chunk is quadratic (minutes per process on a 100,000-chunk field); the listing
        is linear. Where h5py lacks it (HDF5 before 1.14) or it fails, each chunk is looked
        up on its own, once per process (the file is read-only and never rewritten)."""
        if not self.listed:
            self.listed = True
            self.table = self._list_chunks()
        if self.table is not None:
            offsets, sizes, masks = self.table
            if c < len(offsets):
                return (int(offsets[c]) if offsets[c] >= 0 else None), int(sizes[c]), int(masks[c])
            return None, 0, 0
        if c not in self.located:
            info = self.ds.id.get_chunk_info_by_coord((c * self.k, *self.zeros))
            self.located[c] = info.byte_offset, info.size, info.filter_mask
        return self.located[c]

    def _list_chunks(self) -> tuple[np.ndarray, np.ndarray, np.ndarray] | None:
        """:func:`h5batch.format.chunk_table` of this dataset, or None where ``chunk_iter``
        is missing or HDF5 refuses it (then one lookup per chunk)."""
        try:
            return fmt.chunk_table(self.ds.id, self.k, self.n)
        except (AttributeError, NotImplementedError, OSError, RuntimeError, ValueError, KeyError):
            return None

    def _view(self, offset: int) -> np.ndarray:
        return np.frombuffer(self.mapping, dtype=self.dtype, count=self.k * self.row_bytes // self.dtype.itemsize,
                             offset=offset).reshape(self.k, *self.row)

    def _drop(self, view: np.ndarray) -> None:
        """Forget an evicted block. A mapped one (read-only) counts towards the next bulk
        release of resident pages: once the blocks evicted since the last release add up
        to the cache's size, one ``madvise(MADV_DONTNEED)`` drops every page of the mapping
        from this process (they stay in the page cache). Bulk, because a shuffled batch
        evicts a block per row and a system call each would dominate; resident memory stays
        under about twice the cache."""
        if not view.flags.writeable and self.mapping is not None:
            self._evict(view.nbytes, self.mapping)

    def _evict(self, nbytes: int, mapping: mmap.mmap) -> None:
        """Count ``nbytes`` of ``mapping`` as evicted; release its pages once the count adds up
        to the cache's size (:meth:`_drop`)."""
        self.evicted += nbytes
        if self.evicted >= self.capacity * self.k * self.row_bytes and hasattr(mapping, "madvise"):
            mapping.madvise(mmap.MADV_DONTNEED, 0, len(mapping))
            self.evicted = 0

    def _give_up_mapping(self, why: str) -> None:
        warnings.warn(f"{self.ds.file.filename}:{self.ds.name}: {why}; reading chunks instead",
                      RuntimeWarning, stacklevel=4)
        self.mapping = None
        self.cache.clear()

    def _load(self, c: int, buf: np.ndarray) -> None:
        if self.decoder is not None:
            try:
                kind = self._load_direct(c, buf)
            except RemoteError:  # object storage failed for good: not a codec problem
                raise
            except Exception as e:  # noqa: BLE001 -- any codec library error: let HDF5 decode
                self._give_up_direct(f"direct read of chunk {c} failed ({type(e).__name__}: {e})")
            else:
                if kind not in self.verified:
                    self._verify(c, buf, kind)
                return
        lo = c * self.k
        hi = min(lo + self.k, self.n)
        self.ds.read_direct(buf, np.s_[lo:hi], np.s_[0: hi - lo])

    def _load_direct(self, c: int, buf: np.ndarray) -> str:
        offset = (c * self.k, *self.zeros)
        if not self.decoder.filters:  # uncompressed: the stored bytes are the rows, read in place
            mask, raw = self.ds.id.read_direct_chunk(offset, out=buf.reshape(-1).view(np.uint8))
            if len(raw) != buf.nbytes:
                raise ValueError(f"stored chunk has {len(raw)} bytes, expected {buf.nbytes}")
            return f"mask{mask}-raw"
        if self.packed is not None:
            kind = self._load_packed(c, buf)
            if kind is not None:
                return kind
        if self.raw is None:
            # Stored chunks may be slightly larger than decoded ones (incompressible data).
            self.raw = np.empty(buf.nbytes + buf.nbytes // 16 + 4096, dtype=np.uint8)
        try:
            mask, raw = self.ds.id.read_direct_chunk(offset, out=self.raw)
        except ValueError:  # reusable buffer too small for this chunk
            mask, raw = self.ds.id.read_direct_chunk(offset)
        return self.decoder.decode(raw, mask, buf)

    def _load_packed(self, c: int, buf: np.ndarray) -> str | None:
        """Decode compressed chunk ``c`` from the file mapping into ``buf`` (None: not written,
        read it the other way). Pages read through the mapping count towards the next bulk
        release (:meth:`_drop`), so resident memory stays bounded as for mapped blocks."""
        offset, size, mask = self._chunk_info(c)
        if offset is None or size <= 0:
            return None
        with memoryview(self.packed)[offset: offset + size] as raw:  # no read, no copy
            kind = self.decoder.decode(raw, mask, buf)
        self._evict(size, self.packed)
        return kind

    def _hdf5_rows(self, c: int) -> np.ndarray:
        """Block ``c``'s rows as HDF5 itself reads them: the reference a first block is checked against."""
        lo = c * self.k
        hi = min(lo + self.k, self.n)
        ref = np.empty((hi - lo, *self.row), dtype=self.dtype)
        self.ds.read_direct(ref, np.s_[lo:hi])
        return ref

    def _verify(self, c: int, buf: np.ndarray, kind: str) -> None:
        ref = self._hdf5_rows(c)
        if np.array_equal(ref, buf[: len(ref)]):
            self.verified.add(kind)
        else:
            buf[: len(ref)] = ref
            self._give_up_direct(f"direct decode of chunk {c} differs from HDF5's")

    def _give_up_direct(self, why: str) -> None:
        warnings.warn(f"{self.ds.file.filename}:{self.ds.name}: {why}; reading it through "
                      "HDF5's filter pipeline instead", RuntimeWarning, stacklevel=4)
        self.decoder = None
        self.raw = None
        self.packed = None


def gather_rows(stores: Sequence[ChunkStore], which: np.ndarray, src: np.ndarray, dst_pos: np.ndarray,
                out: np.ndarray, copy: Copy | None = None) -> None:
    """``out[dst_pos[j]] = rows of stores[which[j]][src[j]]``, for ``(which, src)`` sorted
    ascending (duplicates allowed): one store for one file, one per shard of a sharded output
    (``which``: the shard holding each row), so a batch column is filled by one call.

    One block fetch per distinct block; contiguous source and destination ranges are copied as
    slices, scattered rows one by one (big rows) or with one fancy-index assignment per block
    (small rows). ``copy(dst, src)`` moves the values (default ``np.copyto``), so a converting
    copy costs one pass over the batch.
    ``out`` may be a strided view.

    Big-row copies are collected and run together by :func:`copy_all` (on several threads
    in the main process); they are flushed before a block fetch could recycle the cache
    buffer of a block still waiting to be copied (mapped blocks are never recycled).
    """
    copy = copy or np.copyto
    big_rows = out[0].nbytes >= 4096 if len(out) else False
    blocks = src // np.array([s.k for s in stores])[which]
    cut = np.flatnonzero((blocks[1:] != blocks[:-1]) | (which[1:] != which[:-1])) + 1
    starts = [0, *cut.tolist()]
    ends = [*cut.tolist(), len(src)]
    tasks: list[tuple[np.ndarray, np.ndarray]] = []
    pending = 0  # cache buffers (not mapped views) that tasks still read
    for s, e in zip(starts, ends, strict=True):
        store = stores[int(which[s])]
        if pending and pending >= store.capacity - 1:
            copy_all(tasks, copy)
            tasks, pending = [], 0
        c = int(blocks[s])
        r = src[s:e] - c * store.k
        d = dst_pos[s:e]
        n = e - s
        r0, d0 = int(r[0]), int(d[0])
        run = int(r[-1]) - r0 == n - 1 and int(d[-1]) - d0 == n - 1 and _strictly_consecutive(r, d)
        chunk = store.get(c)
        if run:
            tasks.append((out[d0: d0 + n], chunk[r0: r0 + n]))
        elif big_rows:
            tasks.extend((out[di], chunk[ri]) for ri, di in zip(r.tolist(), d.tolist()))
        else:
            tmp = np.empty((n, *out.shape[1:]), dtype=out.dtype)
            copy(tmp, chunk[r])
            out[d] = tmp
            continue
        pending += bool(chunk.flags.writeable)
    copy_all(tasks, copy)


def _strictly_consecutive(r: np.ndarray, d: np.ndarray) -> bool:
    # First/last already match a dense range; a duplicate would make some step 0.
    return len(r) < 3 or (bool(np.all(np.diff(r) == 1)) and bool(np.all(np.diff(d) == 1)))


def gather_padded(stores: Sequence[ChunkStore] | None, which: np.ndarray, lo: np.ndarray, hi: np.ndarray,
                  order: np.ndarray, out: np.ndarray, copy: Copy | None = None) -> None:
    """``out[j] = copy(values[lo[j]:hi[j]])`` of ``stores[which[j]]``, zero-padded, for the
    samples ``j`` of a 1-D variable field, visited in ``order`` (ascending ``(which, lo)``:
    file order, shard by shard).

    Stores, copies, conversion and flushes as in :func:`gather_rows`. ``stores`` may be None
    when every sample is empty.
    """
    copy = copy or np.copyto
    tasks: list[tuple[np.ndarray, np.ndarray]] = []
    width = out.shape[1]
    n = hi - lo
    for j in order[n[order] < width].tolist():  # the padding (none when all lengths agree)
        out[j, int(n[j]):] = 0
    if stores is None:
        return
    pending, last, block, cur = 0, -1, None, -1  # cache buffers (not mapped views) tasks still read
    # Per sample in file order; the block is fetched once per run of samples in it, not per
    # piece: the loop is Python, run for every sample of a batch.
    for j, a, b, w in zip(order.tolist(), lo[order].tolist(), hi[order].tolist(), which[order].tolist()):
        if b <= a:
            continue
        if w != cur:  # the next shard's samples
            cur, store, last = w, stores[w], -1
            k = store.k
        dst = out[j]
        p = 0
        c = a // k
        while a < b:
            s1 = min(b, (c + 1) * k)
            if c != last:
                if pending and pending >= store.capacity - 1:
                    copy_all(tasks, copy)
                    tasks, pending = [], 0
                block = store.get(c)
                pending += bool(block.flags.writeable)
            tasks.append((dst[p: p + s1 - a], block[a - c * k: s1 - c * k]))
            last = c
            p += s1 - a
            a = s1
            c += 1
    copy_all(tasks, copy)


def gather_span(store: ChunkStore, a: int, b: int, out: np.ndarray) -> None:
    """``out[:b-a] = values[a:b]`` of a 1-D dataset, block by block."""
    k = store.k
    p = 0
    for c in range(a // k, (b - 1) // k + 1):
        lo = max(a, c * k)
        hi = min(b, (c + 1) * k)
        out[p: p + hi - lo] = store.get(c)[lo - c * k: hi - c * k]
        p += hi - lo
