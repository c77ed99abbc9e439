"""Prefetch of a remote dataset's chunks in the sampler's order, in the loader's main process.

Who fetches what: at each epoch :class:`~h5batch.torch.loader.H5DataLoader` asks the
sampler for the epoch's order (:class:`~h5batch.torch.ChunkShuffleSampler`,
:class:`~h5batch.torch.GlobalBatchSampler`, :class:`~h5batch.torch.BucketingBatchSampler`:
pure functions of ``(seed, epoch)``; any other sampler leaves the cache to LRU and the
workers to fetch on a miss), turns it into the chunks it reads, in order of first use, and a
thread here fetches them into the node cache ahead of the workers: at most :data:`AHEAD_BYTES`
of chunks past the batches delivered so far (a quarter of a cache bound at most), runs of
file neighbours in one GET, :data:`THREADS` GETs at a time. A worker that needs a chunk not
yet there fetches it itself (waiting on the prefetcher's lock if that is fetching it). The
chunks still to read this epoch and all of the next are written as the cache's order file,
which its eviction follows (:mod:`h5batch.remote.cache`). Each epoch starts with a HEAD: a
replaced object stops the loader with :class:`~h5batch.errors.ObjectChangedError`.
"""

from __future__ import annotations

import threading
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import numpy as np

from ..errors import ObjectChangedError
from .cache import ObjectCache

AHEAD_BYTES = 256 << 20  # fetched ahead of the batches delivered (a quarter of a bounded cache at most)
THREADS = 4  # GETs in flight


def chunk_sequence(ds: Any, indices: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """``(offsets, sizes)`` of the chunks that reading ``indices`` of the H5Dataset ``ds``
    touches, by sample, every field (a variable sample's first and last chunk)."""
    ds._ensure_open()
    rows = indices if ds._rows is None else ds._rows[indices]
    offs, sizes = [], []
    for fi in ds.fields:
        store = ds._store(fi)
        if not store.listed:
            store.listed, store.table = True, store._list_chunks()
        if store.table is None:
            continue
        if fi.fixed:
            ends = [rows]
        else:  # a variable sample's first and last chunk
            o = ds._offsets(fi)
            ends = [o[rows], np.maximum(o[rows + 1] - 1, o[rows])]
        for first in ends:
            blocks = np.minimum(first // store.k, len(store.table[0]) - 1)
            offs.append(store.table[0][blocks])
            sizes.append(store.table[1][blocks])
    if not offs:
        return np.zeros(0, np.int64), np.zeros(0, np.int64)
    return np.stack(offs, axis=1).ravel(), np.stack(sizes, axis=1).ravel()


class Prefetcher:
    """Fetches one epoch's chunks ahead of :meth:`delivered` (module docstring)."""

    def __init__(self, cache: ObjectCache):
        self.cache = cache
        self.pool = ThreadPoolExecutor(THREADS, thread_name_prefix="h5batch-prefetch")
        self.cond = threading.Condition()
        self.thread: threading.Thread | None = None
        self.generation = 0
        self.samples = 0
        self.error: BaseException | None = None

    def start_epoch(self, ds: Any, this: np.ndarray, following: np.ndarray | None) -> None:
        head = self.cache.client.head()
        if head != (self.cache.etag, self.cache.size):
            raise ObjectChangedError(self.cache.client.url, "the object was replaced since it was opened "
                                     f"(ETag {self.cache.etag}, {self.cache.size} bytes); never mixed: open it again")
        offs, sizes = chunk_sequence(ds, this)
        per = max(1, len(offs) // max(len(this), 1))
        _, first = np.unique(offs, return_index=True)
        first.sort()
        chunks = list(zip(offs[first].tolist(), sizes[first].tolist()))
        first_sample = (first // per).tolist()
        nxt = chunk_sequence(ds, following)[0] if following is not None and len(following) else np.zeros(0, np.int64)
        with self.cond:
            self.generation += 1
            self.samples = 0
            self.error = None
        # Many chunks ahead, so that file neighbours meet in one GET: a server's cost is per
        # request as much as per byte (moto's: ~0.1 s a GET of a 130 MB object, any range).
        mean = sum(n for _, n in chunks) / len(chunks) if chunks else 1
        budget = AHEAD_BYTES if self.cache.max_bytes is None else min(AHEAD_BYTES, self.cache.max_bytes // 4)
        ahead = max(2, int(budget / mean))
        self.cache.write_order(np.concatenate([offs, nxt]))
        self.thread = threading.Thread(target=self._run, args=(self.generation, chunks, first_sample, offs, per, nxt, ahead),
                                       daemon=True, name="h5batch-prefetch-plan")
        self.thread.start()

    def delivered(self, n: int) -> None:
        with self.cond:
            self.samples += n
            self.cond.notify_all()

    def _run(self, gen: int, chunks: list[tuple[int, int]], first_sample: list[int], offs: np.ndarray,
             per: int, nxt: np.ndarray, ahead: int) -> None:
        # The first group at once, the next when the batches delivered have moved past it:
        # fewer, wider GETs (a worker that needs a chunk being fetched waits on its lock).
        i, pending = 0, []
        while i < len(chunks):
            with self.cond:
                while gen == self.generation and i > 0 and _consumed(first_sample, self.samples) + ahead <= i:
                    self.cond.wait(0.5)
                if gen != self.generation:
                    return
                done = _consumed(first_sample, self.samples)
            j = min(len(chunks), done + ahead)
            group = [c for c in chunks[i:j] if not self.cache.has(*c)]
            self.cache.write_order(np.concatenate([offs[min(len(offs), self.samples * per):], nxt]))
            pending = [f for f in pending if not f.done()]
            try:
                pending += [self.pool.submit(self._fetch, run) for run in self.cache.runs(sorted(group))]
            except RuntimeError:  # the pool was shut down (closed, or the interpreter exits)
                return
            i = j
            for f in pending:  # one group at a time: the next waits for the batches to move on
                f.result()

    def _fetch(self, run: list[tuple[int, int]]) -> None:
        try:
            self.cache.fetch(run)
        except BaseException as e:  # noqa: BLE001 -- the workers' own reads will report it
            self.error = e

    def close(self) -> None:
        with self.cond:
            self.generation += 1
            self.cond.notify_all()
        self.pool.shutdown(wait=False, cancel_futures=True)


def _consumed(first_sample: list[int], samples: int) -> int:
    """Chunks whose first use is at or before sample ``samples``."""
    return int(np.searchsorted(first_sample, samples, side="right"))


def upcoming_epoch(sampler: Any) -> tuple[int, int] | None:
    """``(epoch, start)`` the next ``iter(sampler)`` will yield (h5batch.torch.state rules),
    None for a sampler whose order is not known here."""
    if not (hasattr(sampler, "indices") or hasattr(sampler, "local_batches")) or not hasattr(sampler, "_units"):
        return None
    pos = getattr(sampler, "_position", 0)
    if getattr(sampler, "_resume", False):
        return sampler.epoch, pos
    if pos and pos >= sampler._units():
        return sampler.epoch + 1, 0
    return sampler.epoch, 0


def epoch_indices(sampler: Any, epoch: int, start: int = 0) -> np.ndarray:
    """The samples this rank reads in ``epoch`` from unit ``start`` on: a per-sample
    sampler's indices, or a batch sampler's (GlobalBatchSampler, BucketingBatchSampler)
    batches flattened."""
    if hasattr(sampler, "local_batches"):
        batches = list(sampler.local_batches(epoch))[start:]
        return np.concatenate([np.asarray(b, dtype=np.int64) for b in batches]) if batches else np.zeros(0, np.int64)
    return np.asarray(sampler.indices(epoch))[start:]


__all__ = ["Prefetcher", "chunk_sequence", "epoch_indices", "upcoming_epoch"]
