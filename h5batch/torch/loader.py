"""``H5Dataset.loader(...)``: a ``DataLoader`` set up the way the h5batch reader is fastest.

Why: the fast configuration has parts a new user would not guess (the chunk-aware
sampler instead of ``shuffle=True``, h5batch's collate, persistent workers so that the
recycled shared memory of :mod:`h5batch.torch.recycle` and each worker's decoded-chunk cache
survive between epochs). One call sets all of them; what it
returns is a plain ``torch.utils.data.DataLoader`` (a subclass adding :meth:`set_epoch`), so
anything written for a DataLoader works with it.

The rules:

* ``shuffle=True`` -> :class:`~h5batch.torch.ChunkShuffleSampler` (``seed``, ``window``,
  ``rank``, ``world_size``, ``drop_last``), else file order; ``sampler=`` / ``batch_sampler=``
  replace it.
* Every ``iter(loader)`` after a full epoch starts the next one (0, 1, 2, ...), like
  ``shuffle=True`` of a plain DataLoader (the sampler rolls on by itself, and its
  ``state_dict()`` resumes it: :mod:`h5batch.torch.state`); ``loader.set_epoch(e)`` makes the
  next one epoch ``e``. The order of epoch ``e`` is a pure function of ``(seed, e)``.
* An ``s3://`` dataset's workers fork as a local one's: the main process's own requests run in
  a helper process (:mod:`h5batch.remote.helper`). Only where this process made requests
  itself do they start from the fork server (``multiprocessing_context``): the object-storage
  client cannot run in a forked copy of a process that used it.
* ``collate_fn`` defaults to :data:`h5batch.torch.collate`; ``persistent_workers`` to
  ``num_workers > 0``.
* ``pin_memory=None`` pins where torch has an accelerator. Where it has none (CPU builds),
  pinning is a no-op: ``DataLoader`` itself then turns it off with a warning; here it is
  off without one. With recycled batches, pinning copies each batch once into pinned memory
  (torch's caching host allocator) in the main process's pin thread, which then drops the
  shared batch, so its storage goes back to its worker as without pinning.
"""

from __future__ import annotations

from typing import Any

import torch
from torch.utils.data import DataLoader

from .collate import collate
from .sampler import ChunkShuffleSampler


def accelerator_available() -> bool:
    """Whether ``pin_memory=True`` would pin (torch >= 2.6 ``torch.accelerator``; else CUDA)."""
    acc = getattr(torch, "accelerator", None)
    if acc is not None and hasattr(acc, "is_available"):
        return bool(acc.is_available())
    return torch.cuda.is_available()


class H5DataLoader(DataLoader):
    """A ``DataLoader`` with :meth:`set_epoch` (forwarded to its sampler and batch sampler);
    build it with :meth:`H5Dataset.loader <h5batch.torch.H5Dataset.loader>` (see the module docstring)."""

    def __iter__(self) -> Any:
        prefetch = self._remote_prefetch()
        if prefetch is None:
            return super().__iter__()
        return self._counted(super().__iter__(), prefetch)

    def _remote_prefetch(self) -> Any:
        """An ``s3://`` dataset read in a known order: its chunks fetched ahead of the
        workers (:mod:`h5batch.remote.prefetch`)."""
        cache = getattr(self.dataset, "_object", None)
        if cache is None:
            return None
        from ..remote.prefetch import Prefetcher, epoch_indices, upcoming_epoch
        from .sharded import ShardPrefetch

        sampler = self.batch_sampler if hasattr(self.batch_sampler, "local_batches") else (
            self.sampler if self.batch_sampler is None else getattr(self.batch_sampler, "sampler", None))
        plan = upcoming_epoch(sampler)
        if plan is None:
            return None
        if getattr(self, "_prefetcher", None) is None:
            shards = getattr(self.dataset, "_shards", None)  # a sharded output: a prefetcher per shard
            self._prefetcher = Prefetcher(cache) if shards is None else ShardPrefetch(shards)
        epoch, start = plan
        self._prefetcher.start_epoch(self.dataset, epoch_indices(sampler, epoch, start), epoch_indices(sampler, epoch + 1))
        return self._prefetcher

    @staticmethod
    def _counted(it: Any, prefetch: Any) -> Any:
        for batch in it:
            prefetch.delivered(len(batch[next(iter(batch))]) if isinstance(batch, dict) else len(batch))
            yield batch

    def set_epoch(self, epoch: int) -> None:
        """Make the next ``iter()`` yield epoch ``epoch`` from its start (as
        ``DistributedSampler.set_epoch``)."""
        seen = [s for s in (self.sampler, getattr(self.batch_sampler, "sampler", None), self.batch_sampler)
                if callable(getattr(s, "set_epoch", None))]
        for s in dict.fromkeys(seen):  # a sampler reached twice is set once
            s.set_epoch(epoch)


def make_loader(dataset: Any, batch_size: int = 64, shuffle: bool = True, num_workers: int = 0, *,
                seed: int = 0, window: int = 8, drop_last: bool = False, rank: int = 0,
                world_size: int = 1, pin_memory: bool | None = None,
                persistent_workers: bool | None = None, collate_fn: Any = None,
                sampler: Any = None, batch_sampler: Any = None, **kwargs: Any) -> H5DataLoader:
    """The loader of :meth:`H5Dataset.loader <h5batch.torch.H5Dataset.loader>` (see there)."""
    if sampler is not None and batch_sampler is not None:
        raise ValueError("pass sampler= or batch_sampler=, not both")
    if (sampler is not None or batch_sampler is not None) and shuffle:
        shuffle = False  # the given sampler decides the order
    if shuffle:
        sampler = ChunkShuffleSampler(dataset, window=window, seed=seed, rank=rank,
                                      world_size=world_size, drop_last=drop_last)
    elif world_size != 1 or rank != 0:
        raise ValueError("rank/world_size split the shuffled order: pass shuffle=True, or your own sampler")
    if getattr(dataset, "_object", None) is not None and num_workers > 0:
        from ..remote.client import runtime_started

        if runtime_started():  # s3://: obstore does not survive fork() (h5batch/remote/client.py)
            kwargs.setdefault("multiprocessing_context", "forkserver")
    loader_kw: dict[str, Any] = dict(  # None: pinned with an accelerator, workers kept if any
        num_workers=num_workers, collate_fn=collate if collate_fn is None else collate_fn,
        pin_memory=(pin_memory is None or bool(pin_memory)) and accelerator_available(),
        persistent_workers=(persistent_workers is None or bool(persistent_workers)) and num_workers > 0,
        **kwargs)
    if batch_sampler is not None:
        return H5DataLoader(dataset, batch_sampler=batch_sampler, **loader_kw)
    return H5DataLoader(dataset, batch_size=batch_size, sampler=sampler, drop_last=drop_last, **loader_kw)
