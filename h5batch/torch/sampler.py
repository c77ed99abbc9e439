"""``ChunkShuffleSampler``: a random order that decompresses each chunk about once an epoch.

A full random permutation touches a different compressed chunk for nearly every sample, so
every sample costs a whole chunk's decompression. This sampler emits the epoch window by
window, a window being at most ``window`` chunk groups (:mod:`h5batch.torch.order`). A reader
whose chunk cache holds ``window`` chunks (``H5Dataset``'s default) then decodes each chunk
once per epoch.

The trade-off is shuffle quality: two samples of one chunk are never more than a window
apart, and a batch draws from at most ``window`` chunks instead of the whole split; the
default ``mixing="stratified"`` (:mod:`h5batch.torch.order`) makes up for the class-sorted
order of most corpora (``docs/reader.md`` has the figures). A larger window mixes better and
costs ``window`` decoded chunks of cache per field per worker.
"""

from __future__ import annotations

from collections.abc import Iterator, Sized
from typing import Any

import numpy as np
from torch.utils.data import Sampler

from ..argcheck import integer, rank_of
from .order import check_mixing, chunk_order, epoch_rng
from .state import EpochState

DEFAULT_WINDOW = 12  # chunk groups per window; H5Dataset's default cache holds one window


def chunk_groups(data: Any, chunk_size: int | None) -> tuple[int, np.ndarray, int]:
    """``(n, starts, chunk_size)``: sample count and chunk groups of ``data`` (see the samplers)."""
    n = len(data) if isinstance(data, Sized) else integer("data", data, 0)
    starts = None
    if chunk_size is None and callable(getattr(data, "chunk_starts", None)):
        starts = np.asarray(data.chunk_starts(), dtype=np.int64)
        if n and (starts.ndim != 1 or not len(starts) or starts[0] != 0
                  or np.any(np.diff(starts) <= 0) or starts[-1] >= n):
            raise ValueError(f"bad chunk_starts from {type(data).__name__}: must rise from 0 "
                             f"and stay below its {n} samples")
    if starts is None:
        size = integer("chunk_size", 64 if chunk_size is None else chunk_size, 1)
        return n, np.arange(0, n, size, dtype=np.int64), size
    return n, starts, max(1, round(n / max(len(starts), 1)))  # the average group size


class ChunkShuffleSampler(EpochState, Sampler[int]):
    """Chunk-aware shuffling of ``range(n)``, optionally split across distributed ranks.

    Parameters
    ----------
    data : H5Dataset, Sized or int
        A dataset (its ``len`` and, for an ``H5Dataset``, its chunk groups) or a sample count.
    chunk_size : int, optional
        Samples per chunk. Default: the groups of ``data.chunk_starts()``, else 64.
    window : int
        Chunk groups mixed together (>= 1); ``window >= number of chunks`` is a full permutation.
    seed : int
        Base seed (>= 0). The order is a pure function of ``(seed, epoch)``.
    rank, world_size : int
        This process's share of every epoch, like ``DistributedSampler``.
    drop_last : bool
        With ``world_size > 1`` and ``n`` not divisible: ``False`` pads with the epoch's first
        samples to ``ceil(n / world_size)`` per rank; ``True`` drops to ``n // world_size``.
    mixing : {"stratified", "random"}
        How windows are made and ordered (:mod:`h5batch.torch.order`).

    Notes
    -----
    Each ``iter()`` after a fully drawn epoch yields the next epoch; :meth:`set_epoch` chooses
    one explicitly. ``state_dict()`` / ``load_state_dict()`` hold ``(seed, epoch, position)``
    (:mod:`h5batch.torch.state`; torchdata's ``StatefulDataLoader`` calls them): resumable in O(1).

    Ranks get *contiguous* slices of the order (not round robin), so each touches about
    ``1 / world_size`` of the chunks. A state loads only into the same world size; for one that
    does not depend on it, use :class:`~h5batch.torch.GlobalBatchSampler`.

    Use as ``sampler=`` with ``batch_size``, or inside your own ``BatchSampler``.
    """

    def __init__(self, data: Any, chunk_size: int | None = None, window: int = DEFAULT_WINDOW,
                 seed: int = 0, rank: int = 0, world_size: int = 1, drop_last: bool = False,
                 mixing: str = "stratified"):
        self.n, self.chunk_starts, self.chunk_size = chunk_groups(data, chunk_size)
        self.window = integer("window", window, 1)
        self.seed = integer("seed", seed, 0)
        self.rank, self.world_size = rank_of(rank, world_size)
        self.drop_last = bool(drop_last)
        self.mixing = check_mixing(mixing)
        w = self.world_size
        self.num_samples = self.n // w if self.drop_last else -(-self.n // w)
        self._init_state()

    def epoch_order(self, epoch: int | None = None) -> np.ndarray:
        """The whole order of ``epoch`` (default: the current one), all ranks, int64."""
        e = self.epoch if epoch is None else integer("epoch", epoch, 0)
        return chunk_order(self.chunk_starts, self.n, self.window, epoch_rng(self.seed, e), self.mixing)

    def indices(self, epoch: int | None = None) -> np.ndarray:
        """This rank's indices for ``epoch`` (default: the current one)."""
        # Padded by repeating its start (may wrap for tiny n), or its end dropped.
        order = np.resize(self.epoch_order(epoch), self.num_samples * self.world_size)
        lo = self.rank * self.num_samples
        return order[lo: lo + self.num_samples]

    # EpochState
    def _units(self) -> int:
        return self.num_samples

    def _state_checks(self) -> dict[str, Any]:
        return {"samples": self.n, "chunks": len(self.chunk_starts), "window": self.window,
                "mixing": self.mixing, "world_size": self.world_size, "drop_last": self.drop_last}

    def _units_of(self, epoch: int, start: int) -> Iterator[int]:
        return iter(self.indices(epoch)[start:].tolist())

    def __repr__(self) -> str:
        return (f"ChunkShuffleSampler(n={self.n}, chunks={len(self.chunk_starts)}, window={self.window}, "
                f"mixing={self.mixing!r}, seed={self.seed}, epoch={self.epoch}, position={self.position}, "
                f"rank={self.rank}/{self.world_size})")
