"""The node-local cache of one remote object's byte ranges, shared by every process.

Layout: ``<cache_dir>/objects/<digest of URL, ETag and size>/``, one file per cached range
(``<offset>-<size>``: a whole HDF5 chunk, or a block of the file's metadata). Keyed by the
object's identity: a replaced object has another ETag, hence another folder, so its bytes are
never mixed with the old one's; every GET also sends ``If-Match`` (a replacement made while a
reader runs is an :class:`~h5batch.errors.ObjectChangedError` naming the URL).

Rules:

* Fetched once per node: a range is fetched under an exclusive ``flock`` of its own lock
  file, written to ``<name>.tmp.<pid>`` and published with ``os.replace``. A reader sees a
  whole range or none; a process killed mid-download leaves only its ``.tmp`` file, which
  nothing serves and the next bound check removes.
* Neighbours coalesced: :meth:`ObjectCache.fetch` takes many ranges, and ranges near each
  other in the file (gaps up to :data:`GAP`) go in one GET of up to :data:`MAX_GET` bytes.
  Every chunk of the file's chunk map (``chunks.npy``, :mod:`h5batch.remote.rfile`) that lies
  whole in a gap is published too: an epoch reads every chunk, so no fetched byte is wasted.
  Why a gap this wide: a GET costs a round trip and the server's per-request work (tens of
  milliseconds on S3, about the time to stream a few MB), and a store bills per request.
  A bounded cache takes gaps up to :data:`BOUNDED_GAP` only: a chunk fetched because it lay in
  a gap could push out one read sooner, and be evicted itself before its turn.
* A forked child never holds its parent's locks: a flock belongs to the open file, which a
  fork shares, so a DataLoader worker forked while the prefetcher held one would keep it
  (and wait on it forever). The lock descriptors held are closed in the child at fork
  (:func:`_forget_held`, the fork hook of this module), leaving the lock to the parent.
* Bounded by ``max_bytes`` (None: unbounded). Past it, entries are evicted by the order file
  ``order.npy`` (the offsets the sampler will read next, written by the prefetcher of
  :mod:`h5batch.remote.prefetch`): first those not read again, least recently used first,
  then those read furthest in the future (Belady's rule); chunks under :data:`SMALL` bytes
  only when no other is left. Without an order file: least recently used (by modification
  time, refreshed on each hit). Metadata blocks are kept.
"""

from __future__ import annotations

import fcntl
import hashlib
import json
import os
import threading
from collections.abc import Iterable

import numpy as np

from ..transport.segments import pid_alive
from .client import ObjectClient

GAP = 4 << 20  # ranges this close are fetched in one GET (the chunks in the gap published too)
BOUNDED_GAP = 64 << 10  # the same, in a cache bounded by max_bytes
MAX_GET = 32 << 20  # bytes per coalesced GET
META_BLOCK = 256 << 10  # the file's metadata is read in aligned blocks of this size
SMALL = 64 << 10  # chunks below this are evicted last (a GET's cost is per request as much as per byte)


_HELD: set[int] = set()  # the lock descriptors this process holds
_HELD_LOCK = threading.Lock()  # held while one is opened or closed, and across a fork


def _forget_held() -> None:
    for fd in _HELD:
        os.close(fd)  # not LOCK_UN: that would release the parent's lock
    _HELD.clear()
    _HELD_LOCK.release()


os.register_at_fork(before=_HELD_LOCK.acquire, after_in_parent=_HELD_LOCK.release, after_in_child=_forget_held)


def _close_lock(fd: int) -> None:
    with _HELD_LOCK:
        _HELD.discard(fd)
        os.close(fd)  # releases the flock


class ObjectCache:
    """Byte ranges of ``client``'s object (version ``etag``, ``size`` bytes) under ``root``."""

    def __init__(self, client: ObjectClient, etag: str, size: int, root: str, max_bytes: int | None = None):
        self.client, self.etag, self.size, self.root = client, etag, size, root
        ident = json.dumps([client.url, etag, size])
        self.dir = os.path.join(root, "objects", hashlib.sha256(ident.encode()).hexdigest()[:24])
        os.makedirs(os.path.join(self.dir, "meta"), exist_ok=True)
        with open(os.path.join(self.dir, "object.json"), "w") as f:  # for people looking in the folder
            f.write(ident)
        self.max_bytes = max_bytes
        self.gap = GAP if max_bytes is None else BOUNDED_GAP
        self._map: tuple[np.ndarray, np.ndarray] | None = None  # chunk starts and ends, once listed
        self.gets = 0  # GETs made by this process (tests, the bench)
        self.fetched = 0  # bytes they returned
        if max_bytes is not None:
            self.bound()  # a folder filled under a larger bound (or none) shrinks now

    def path(self, offset: int, size: int) -> str:
        # Metadata blocks (META_BLOCK-aligned) live in meta/, outside the bound.
        meta = offset % META_BLOCK == 0 and (size == META_BLOCK or offset + size == self.size) and size <= META_BLOCK
        return os.path.join(self.dir, "meta" if meta else "", f"{offset}-{size}")

    def read(self, offset: int, size: int) -> bytes:
        """Range ``[offset, offset+size)``: from the cache, else fetched (once per node)."""
        p = self.path(offset, size)
        while True:
            try:
                with open(p, "rb") as f:
                    data = f.read()
                os.utime(p)  # recency, for the LRU fallback
                return data
            except FileNotFoundError:
                pass
            got = self.fetch([(offset, size)], wait=True)
            if (offset, size) in got:
                return got[(offset, size)]
            # else another process published it while we waited: read it (again, if it
            # was evicted in between)

    def has(self, offset: int, size: int) -> bool:
        return os.path.exists(self.path(offset, size))

    def fetch(self, ranges: Iterable[tuple[int, int]], wait: bool = False) -> dict[tuple[int, int], bytes]:
        """Fetch the missing ``ranges`` (coalesced), publishing each whole; returns the
        bytes of those this call fetched. ``wait``: block on a range another process is
        fetching (else skip it)."""
        todo = sorted({r for r in ranges if not self.has(*r)})
        locks = []
        try:
            got = []
            for off, n in todo:
                with _HELD_LOCK:
                    fd = os.open(self.path(off, n) + ".lock", os.O_CREAT | os.O_RDWR | os.O_CLOEXEC, 0o644)
                    _HELD.add(fd)
                try:
                    fcntl.flock(fd, fcntl.LOCK_EX | (0 if wait else fcntl.LOCK_NB))
                except BlockingIOError:
                    _close_lock(fd)  # another process fetches it now
                    continue
                locks.append(fd)
                if not self.has(off, n):  # published while we waited
                    got.append((off, n))
            out = {}
            for run in self._uncached_runs(got):
                lo, hi = run[0][0], run[-1][0] + run[-1][1]
                data = self.client.get(lo, hi, self.etag)
                self.gets += 1
                self.fetched += len(data)
                for off, n in run:
                    out[(off, n)] = data[off - lo: off - lo + n]
                    self._publish(off, n, out[(off, n)])
                for off, n in self._within(lo, hi):  # the gaps' chunks, unless there already
                    if (off, n) not in out and not self.has(off, n):
                        self._publish(off, n, data[off - lo: off - lo + n])
        finally:
            for fd in locks:
                _close_lock(fd)
        if out and self.max_bytes is not None:
            self.bound(keep={self.path(*r) for r in out})
        return out

    def runs(self, ranges: list[tuple[int, int]]) -> list[list[tuple[int, int]]]:
        """Sorted ``ranges`` grouped into GETs: neighbours within :attr:`gap`, up to :data:`MAX_GET`."""
        runs: list[list[tuple[int, int]]] = []
        for off, n in ranges:
            if runs:
                lo = runs[-1][0][0]
                end = runs[-1][-1][0] + runs[-1][-1][1]
                if off - end <= self.gap and off + n - lo <= MAX_GET:
                    runs[-1].append((off, n))
                    continue
            runs.append([(off, n)])
        return runs

    def _uncached_runs(self, ranges: list[tuple[int, int]]) -> list[list[tuple[int, int]]]:
        """:meth:`runs` of ``ranges``, cut where a gap holds a chunk already cached (not
        fetched twice)."""
        out = []
        for run in self.runs(ranges):
            part = [run[0]]
            for prev, cur in zip(run, run[1:]):
                if any(self.has(*c) for c in self._within(prev[0] + prev[1], cur[0])):
                    out.append(part)
                    part = []
                part.append(cur)
            out.append(part)
        return out

    def chunk_map(self) -> tuple[np.ndarray, np.ndarray] | None:
        """Every chunk's start and end offset, sorted (``chunks.npy``, written once per node by
        :meth:`RemoteFile.list_chunks <h5batch.remote.rfile.RemoteFile.list_chunks>`); None
        until it is listed."""
        if self._map is None:
            try:
                offs, sizes = np.load(os.path.join(self.dir, "chunks.npy"))
            except (OSError, ValueError):
                return None
            self._map = (offs, offs + sizes)
        return self._map

    def _within(self, lo: int, hi: int) -> list[tuple[int, int]]:
        """The chunks of the map that lie whole in ``[lo, hi)``."""
        m = self.chunk_map()
        if m is None:
            return []
        starts, ends = m
        i, j = np.searchsorted(starts, lo), np.searchsorted(ends, hi, side="right")
        return list(zip(starts[i:j].tolist(), (ends[i:j] - starts[i:j]).tolist()))

    def _publish(self, offset: int, size: int, data: bytes) -> None:
        p = self.path(offset, size)
        tmp = f"{p}.tmp.{os.getpid()}"
        with open(tmp, "wb") as f:
            f.write(data)
        os.replace(tmp, p)

    def bound(self, keep: set[str] = frozenset()) -> None:
        """Evict entries until the folder holds at most ``max_bytes`` (module docstring);
        ``keep``: paths just published, about to be read."""
        entries, total = [], 0
        for e in os.scandir(self.dir):
            name = e.name
            if ".tmp." in name:
                pid = name.rsplit(".", 1)[-1]
                if pid.isdigit() and not pid_alive(int(pid)):
                    _unlink(e.path)  # a download killed midway: never served
                continue
            if "-" not in name or name.endswith(".lock"):
                continue
            off, n = (int(x) for x in name.split("-"))
            try:
                st = e.stat()
            except FileNotFoundError:  # evicted by another process meanwhile
                continue
            total += st.st_size
            if e.path not in keep:
                entries.append((off, n, st.st_mtime, e.path))
        if total <= self.max_bytes:
            return
        nxt = self._next_use()
        # Not read again (least recently used first), then read furthest away; no order: LRU.
        # Small chunks (labels, lengths) last: each costs a GET for next to nothing freed.
        entries.sort(key=lambda t: (t[1] < SMALL, t[0] in nxt, -nxt.get(t[0], 0), t[2]))
        for _, n, _, p in entries:
            if total <= self.max_bytes:
                break
            _unlink(p)
            _unlink(p + ".lock")
            total -= n

    def _next_use(self) -> dict[int, int]:
        """offset -> position of its next read in ``order.npy`` (empty: no order known)."""
        try:
            order = np.load(os.path.join(self.dir, "order.npy"))
        except (OSError, ValueError):
            return {}
        first: dict[int, int] = {}
        for i, off in enumerate(order.tolist()):
            first.setdefault(off, i)
        return first

    def write_order(self, offsets: np.ndarray) -> None:
        tmp = os.path.join(self.dir, f"order.tmp.{os.getpid()}.npy")
        np.save(tmp, np.asarray(offsets, dtype=np.int64))
        os.replace(tmp, os.path.join(self.dir, "order.npy"))


def _unlink(path: str) -> None:
    try:
        os.remove(path)
    except FileNotFoundError:
        pass


__all__ = ["ObjectCache"]
