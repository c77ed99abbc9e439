"""``ChunkShuffleSampler``: a random order that decompresses each chunk about once an epoch,
and the chunk-local epoch order that h5batch's samplers share, a pure function of ``(seed, epoch)``.

A full random permutation touches a different compressed chunk for nearly every sample, so
every sample costs a whole chunk's decompression. An epoch is therefore cut into *windows* of
at most ``window`` chunk groups; the samples of a window are emitted together, and a reader
whose chunk cache holds ``window`` chunks (``H5Dataset``'s default) decodes each chunk about
once per epoch.

Which chunks share a window, and how a window's samples are ordered, decide how well batches
mix. Samples are stored in manifest order (for class-folder corpora, class by class), so a
chunk usually holds one class, and a batch drawn from a window holds at most ``window``
chunks' classes. Two mixings:

* ``"stratified"`` (the default): the chunks, rotated by a random offset, are dealt to the
  ``M`` windows in turn (window ``j`` gets chunks ``j, j + M, j + 2M, ...``), so each window
  is spread evenly over the whole file, like the corpus. Within the window every chunk's
  samples are spread evenly (a sample of rank
  ``j`` in its chunk of ``m``, ranks random, gets the key ``(j + u) / m``, ``u`` uniform), so
  any run of ``b`` consecutive samples holds about ``b / window`` from each chunk, whatever
  the batch size: batch label histograms are closer to the corpus' than under a full random
  permutation, whose multinomial noise the even spreading removes.
* ``"random"``: windows of ``window`` consecutive
  chunks of a random chunk permutation, samples uniformly shuffled within a window.

Both put every sample exactly once in an epoch and a chunk's samples in one window. The
trade-off is shuffle quality: two samples of one chunk are never more than a window apart, and
a batch draws from at most ``window`` chunks instead of the whole split (``docs/reader.md`` has
the figures). A larger window mixes better and costs ``window`` decoded chunks of cache per
field per worker.
"""

from __future__ import annotations

from collections.abc import Iterator, Sized
from typing import Any

import numpy as np
from torch.utils.data import Sampler

from ..argcheck import integer, rank_of
from .state import EpochState

DEFAULT_WINDOW = 12  # chunk groups per window; H5Dataset's default cache holds one window
SEED_TAG = 0x43485546  # mixed into the seed so this stream is not shared with other users
MIXINGS = ("stratified", "random")


def check_mixing(mixing: str) -> str:
    if mixing not in MIXINGS:
        raise ValueError(f"mixing must be one of {', '.join(MIXINGS)}, got {mixing!r}")
    return mixing


def epoch_rng(seed: int, epoch: int, tag: int = SEED_TAG) -> np.random.Generator:
    """The generator of one epoch's order: same ``(seed, epoch)``, same stream, any process."""
    return np.random.default_rng([tag, int(epoch), int(seed)])


def chunk_order(starts: np.ndarray, n: int, window: int, rng: np.random.Generator,
                mixing: str = "stratified") -> np.ndarray:
    """One epoch's order of ``range(n)`` (int64) by chunk groups beginning at ``starts``."""
    if n == 0:
        return np.zeros(0, dtype=np.int64)
    sizes = np.diff(np.append(starts, n))
    groups = len(starts)
    if mixing == "random":
        win = np.empty(groups, dtype=np.int64)
        win[rng.permutation(groups)] = np.arange(groups) // window
    else:
        win = _stratified_windows(groups, window, rng)
    windows = int(win.max()) + 1
    place = np.empty(windows, dtype=np.int64)
    place[rng.permutation(windows)] = np.arange(windows)
    # The samples grouped by window (in window order), each window's groups back to back.
    by_window = np.argsort(place[win], kind="stable")
    gs = sizes[by_window]
    samples = np.repeat(starts[by_window] - (np.cumsum(gs) - gs), gs) + np.arange(n)
    if mixing == "random":
        key = rng.random(n)
    else:
        # A random rank within each group, then the key that spreads a group over its window.
        rank = np.empty(n, dtype=np.float64)
        rank[_sort_within(gs, rng.random(n))] = np.arange(n) - np.repeat(np.cumsum(gs) - gs, gs)
        key = (rank + rng.random(n)) / np.repeat(gs, gs)
    window_sizes = np.bincount(place[win], weights=sizes, minlength=windows).astype(np.int64)
    return samples[_sort_within(window_sizes, key)].astype(np.int64)


def _sort_within(sizes: np.ndarray, key: np.ndarray) -> np.ndarray:
    """The permutation that sorts ``key`` (in [0, 1)) within consecutive blocks of ``sizes``.

    Blocks stay in place. Many short sorts (one padded-matrix row per block) are faster than
    one sort of everything; very uneven block sizes fall back to the one sort.
    """
    n, blocks = len(key), len(sizes)
    widest = int(sizes.max())
    first = np.cumsum(sizes) - sizes
    block = np.repeat(np.arange(blocks), sizes)
    if blocks * widest > 4 * n + 4096:
        return np.argsort(block + key)
    mat = np.full((blocks, widest), np.inf)
    mat[block, np.arange(n) - first[block]] = key
    perm = np.argsort(mat, axis=1)
    return (perm + first[:, None])[perm < sizes[:, None]]


def _stratified_windows(groups: int, window: int, rng: np.random.Generator) -> np.ndarray:
    """Window of every chunk group: evenly strided over the (randomly rotated) file.

    With ``M = ceil(groups / window)`` windows, the group at rotated position ``p`` goes to
    window ``p mod M``: each window holds groups ``M`` apart, one from every stretch of ``M``
    consecutive groups (not dealt at random: neighbours across a stretch boundary, usually of
    one class, could then share a window).
    """
    windows = -(-groups // window)
    pos = (np.arange(groups) + rng.integers(groups)) % groups
    return (pos % windows).astype(np.int64)


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
        How windows are made and ordered (see the module docstring).

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
