"""``ChunkShuffleSampler``: a random order that decompresses each chunk about once an epoch.

A full random permutation touches a different compressed chunk for nearly every sample, so
every sample costs a whole chunk's decompression. This sampler shuffles the *order of
chunks*, then shuffles samples only within windows of ``window`` consecutive chunks of that
order. A reader whose chunk cache holds ``window`` chunks (``H5Dataset``'s default) then
decodes each chunk once per epoch.

The trade-off is shuffle quality: two samples of one chunk are never more than a window
apart, and a batch draws from at most ``window`` chunks (``window * chunk_size`` samples)
instead of the whole split. Samples are stored in manifest order (by split, then naturally
sorted key: for class-folder corpora, class by class), so with small windows a batch can be
dominated by one class. A larger window mixes better and costs ``window`` decoded chunks of
cache per field per worker.
"""

from __future__ import annotations

from collections.abc import Iterator, Sized
from typing import Any

import numpy as np
from torch.utils.data import Sampler

from ..argcheck import integer

_SEED_TAG = 0x43485546  # mixed into the seed so this stream is not shared with other users


class ChunkShuffleSampler(Sampler[int]):
    """Chunk-aware shuffling of ``range(n)``, optionally split across distributed ranks.

    Parameters
    ----------
    data : H5Dataset, Sized or int
        What to sample: a dataset (its ``len`` and, for an ``H5Dataset``, its chunk groups)
        or a number of samples.
    chunk_size : int, optional
        Samples per chunk. Default: the groups of ``data.chunk_starts()`` (an ``H5Dataset``
        groups samples by the chunks of its field with the most samples per chunk: ``k`` rows
        of a fixed field, or the samples whose values start in one chunk of a variable
        field), else 64.
    window : int
        Chunks whose samples are shuffled together (>= 1). ``window >= number of chunks`` is
        a full random permutation.
    seed : int
        Base seed (>= 0). The order is a pure function of ``(seed, epoch)``.
    rank, world_size : int
        This process's share of every epoch, like ``DistributedSampler``.
    drop_last : bool
        With ``world_size > 1`` and ``n`` not divisible by it: ``False`` pads the epoch by
        repeating its first samples so every rank gets ``ceil(n / world_size)``; ``True``
        drops the epoch's last samples so every rank gets ``n // world_size``.

    Notes
    -----
    BEWARE: like ``DistributedSampler``, the order only changes when you call
    :meth:`set_epoch` before each epoch; without it every epoch repeats epoch 0's order.

    Ranks get *contiguous* slices of the epoch's order (``DistributedSampler`` deals them
    out round robin), so each rank touches about ``1 / world_size`` of the chunks.

    Works as ``sampler=`` of a ``DataLoader`` with ``batch_size`` (torch wraps it in a
    ``BatchSampler``) or inside your own ``BatchSampler``.
    """

    def __init__(self, data: Any, chunk_size: int | None = None, window: int = 8,
                 seed: int = 0, rank: int = 0, world_size: int = 1, drop_last: bool = False):
        if isinstance(data, Sized):
            n = len(data)
        else:
            n = integer("data", data, 0)
        self.n = int(n)
        starts = None
        if chunk_size is None and callable(getattr(data, "chunk_starts", None)):
            starts = np.asarray(data.chunk_starts(), dtype=np.int64)
            if self.n and (starts.ndim != 1 or not len(starts) or starts[0] != 0
                           or np.any(np.diff(starts) <= 0) or starts[-1] >= self.n):
                raise ValueError(f"bad chunk_starts from {type(data).__name__}")
        if starts is None:
            self.chunk_size = integer("chunk_size", 64 if chunk_size is None else chunk_size, 1)
            starts = np.arange(0, self.n, self.chunk_size, dtype=np.int64)
        else:  # informative only: the average group size
            self.chunk_size = max(1, round(self.n / max(len(starts), 1)))
        self.chunk_starts = starts
        self.window = integer("window", window, 1)
        self.seed = integer("seed", seed, 0)
        self.world_size = integer("world_size", world_size, 1)
        self.rank = integer("rank", rank, 0)
        if self.rank >= self.world_size:
            raise ValueError(f"rank must be in [0, world_size={self.world_size}), got {self.rank}")
        self.drop_last = bool(drop_last)
        self.epoch = 0
        if self.drop_last:
            self.num_samples = self.n // self.world_size
        else:
            self.num_samples = -(-self.n // self.world_size)

    def set_epoch(self, epoch: int) -> None:
        """Choose the epoch whose order the next ``iter()`` yields."""
        self.epoch = integer("epoch", epoch, 0)

    def __len__(self) -> int:
        return self.num_samples

    def epoch_order(self) -> np.ndarray:
        """The whole epoch's order (all ranks, before padding or dropping), int64."""
        n = self.n
        if n == 0:
            return np.zeros(0, dtype=np.int64)
        rng = np.random.default_rng([_SEED_TAG, self.epoch, self.seed])
        starts = self.chunk_starts
        sizes = np.diff(np.append(starts, n))
        chunks = rng.permutation(len(starts))
        size = sizes[chunks]
        # Indices of the chunks in shuffled order, back to back.
        first = np.repeat(starts[chunks] - (np.cumsum(size) - size), size)
        order = first + np.arange(n)
        # Shuffle within each window of `window` consecutive chunks: sort by (window, key).
        win = np.repeat(np.arange(len(chunks)) // self.window, size)
        return order[np.lexsort((rng.random(n), win))].astype(np.int64)

    def indices(self) -> np.ndarray:
        """This rank's indices for the current epoch."""
        order = self.epoch_order()
        total = self.num_samples * self.world_size
        if total > len(order):  # pad by repeating the start (may wrap for tiny n)
            reps = -(-total // max(len(order), 1))
            order = np.tile(order, reps)[:total]
        else:
            order = order[:total]
        lo = self.rank * self.num_samples
        return order[lo: lo + self.num_samples]

    def __iter__(self) -> Iterator[int]:
        return iter(self.indices().tolist())

    def __repr__(self) -> str:
        return (f"ChunkShuffleSampler(n={self.n}, chunks={len(self.chunk_starts)}, window={self.window}, "
                f"seed={self.seed}, epoch={self.epoch}, rank={self.rank}/{self.world_size})")


