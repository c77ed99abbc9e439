"""``GlobalBatchSampler``: the same global batches on any number of ranks.

Mosaic Streaming calls it elastic determinism: with a fixed *global* batch size ``G``, global
batch ``b`` of an epoch holds the same samples whether 1, 2, 4 or 8 ranks train, so a run
resumed on another world size continues the same order and optimisation sees the same
batches. The epoch order is :class:`~h5batch.torch.ChunkShuffleSampler`'s (chunk windows,
:mod:`h5batch.torch.sampler`), a function of ``(seed, epoch)`` only; global batch ``b`` is
positions ``[b*G, (b+1)*G)`` of it; rank ``r`` of ``W`` gets ``G / W`` of them.

How a global batch is split between ranks is the locality trade-off (``split=``):

* ``"by_chunk"`` (default): the batch sorted by index, rank ``r`` takes the ``r``-th
  contiguous part. A batch draws from up to ``window`` chunks, so each rank reads about
  ``window / W`` of them per batch and touches few chunks per epoch. BEWARE: within one
  global batch, rank 0 gets the lowest indices, so per-rank batches are less mixed than the
  global one (which is what an all-reduced gradient sees; non-synchronised BatchNorm sees
  the per-rank batch).
* ``"interleaved"``: rank ``r`` takes positions ``r, r+W, ...`` of the batch as shuffled:
  per-rank batches as mixed as the global batch, but every rank reads every chunk of every
  window (``docs/reader.md`` has the measured chunks touched per rank).

The state (:mod:`h5batch.torch.state`) counts *global* batches, so it loads into any world
size; every rank steps through the same global batches in lockstep.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import numpy as np
from torch.utils.data import Sampler

from ..argcheck import integer, rank_of
from .sampler import DEFAULT_WINDOW, ChunkShuffleSampler, check_mixing, chunk_groups
from .state import EpochState

SPLITS = ("by_chunk", "interleaved")


class GlobalBatchSampler(EpochState, Sampler[list[int]]):
    """This rank's part of every global batch of a chunk-local, world-size-invariant order.

    Parameters
    ----------
    data : H5Dataset, Sized or int
        What to sample (as for :class:`~h5batch.torch.ChunkShuffleSampler`).
    global_batch_size : int
        Samples per global batch, over all ranks; a multiple of ``world_size``.
    rank, world_size : int
        This process and the number of processes; each yields batches of
        ``global_batch_size // world_size``.
    window, seed, chunk_size, mixing
        The epoch order, as for :class:`~h5batch.torch.ChunkShuffleSampler` (same values,
        same order).
    drop_last : bool
        ``True`` drops the epoch's last, incomplete global batch; ``False`` completes it
        with the epoch's first samples (so every rank always gets a full batch).
    split : {"by_chunk", "interleaved"}
        How a global batch is divided between ranks (see the module docstring).

    Pass it as ``batch_sampler=`` (no ``batch_size``/``shuffle``/``sampler``).
    """

    def __init__(self, data: Any, global_batch_size: int, rank: int = 0, world_size: int = 1,
                 window: int = DEFAULT_WINDOW, seed: int = 0, chunk_size: int | None = None,
                 drop_last: bool = False, split: str = "by_chunk", mixing: str = "stratified"):
        self.n, self.chunk_starts, self.chunk_size = chunk_groups(data, chunk_size)
        self.global_batch_size = integer("global_batch_size", global_batch_size, 1)
        self.rank, self.world_size = rank_of(rank, world_size)
        if self.global_batch_size % self.world_size:
            raise ValueError(f"global_batch_size={self.global_batch_size} is not a multiple of "
                             f"world_size={self.world_size}")
        self.window = integer("window", window, 1)
        self.seed = integer("seed", seed, 0)
        self.drop_last = bool(drop_last)
        if split not in SPLITS:
            raise ValueError(f"split must be one of {', '.join(SPLITS)}, got {split!r}")
        self.split = split
        self.mixing = check_mixing(mixing)
        self.local_batch_size = self.global_batch_size // self.world_size
        g = self.global_batch_size
        self.num_batches = self.n // g if self.drop_last else -(-self.n // g)
        self._init_state()

    epoch_order = ChunkShuffleSampler.epoch_order  # the same order as ChunkShuffleSampler with these arguments

    def global_batches(self, epoch: int | None = None) -> np.ndarray:
        """``(num_batches, global_batch_size)`` int64: every global batch of the epoch."""
        # The last batch completed from the start (wraps for tiny n), or dropped.
        order = np.resize(self.epoch_order(epoch), self.num_batches * self.global_batch_size)
        return order.reshape(self.num_batches, self.global_batch_size)

    def local_batches(self, epoch: int | None = None) -> np.ndarray:
        """``(num_batches, local_batch_size)`` int64: this rank's part of every global batch."""
        batches = self.global_batches(epoch)
        w, r, b = self.world_size, self.rank, self.local_batch_size
        if self.split == "interleaved":
            return batches[:, r::w]
        return np.sort(batches, axis=1)[:, r * b:(r + 1) * b]

    # EpochState
    def _units(self) -> int:
        return self.num_batches

    def _state_checks(self) -> dict[str, Any]:
        return {"samples": self.n, "chunks": len(self.chunk_starts), "window": self.window,
                "mixing": self.mixing, "global_batch_size": self.global_batch_size,
                "drop_last": self.drop_last}

    def _units_of(self, epoch: int, start: int) -> Iterator[list[int]]:
        return iter(self.local_batches(epoch)[start:].tolist())

    def __repr__(self) -> str:
        return (f"GlobalBatchSampler(n={self.n}, global_batch_size={self.global_batch_size}, "
                f"rank={self.rank}/{self.world_size}, split={self.split!r}, window={self.window}, "
                f"seed={self.seed}, epoch={self.epoch}, position={self.position})")
