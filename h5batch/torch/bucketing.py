"""``BucketingBatchSampler``: batches of similar lengths, bounded by padded frames.

Variable-length fields are read zero-padded, so a batch costs ``B * T_max`` frames. This
sampler groups samples of similar length so the *padded* cost ``B * cost(T_max)`` stays
within ``max_frames`` (``cost(T) = T + T**2 / quadratic`` when ``quadratic`` is given, as
Lhotse's ``quadratic_duration``).

Rules:

* Lengths come from the file's index (:func:`field_lengths`), never sample data; any
  sequence of ints works too.
* ``num_buckets`` length ranges of equal sample counts (quantiles, fixed for the run).
* Chunk-aware: the epoch walks :mod:`h5batch.torch.sampler`'s order in pools of ``window``
  chunk groups; in a pool (plus earlier left-overs) each bucket's samples, sorted by length,
  are packed greedily; a bucket's incomplete batch waits for the next pool. A pool's batches
  come in random order, so a cache holding a window decodes almost every chunk once.
* Deterministic from ``(seed, epoch)``; each sample once per epoch. Rank ``r`` of ``W``
  gets batches ``r, r + W, ...``; the count is made a multiple of ``W`` by repeating the
  first batches (``drop_last=False``) or dropping the last.
* A sample whose own cost exceeds ``max_frames`` is a batch alone (:attr:`oversized`).
* Resumable: :mod:`h5batch.torch.state`, ``position`` in this rank's batches.

The batch count varies slightly between epochs; ``len()`` is the current epoch's.
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from typing import Any

import numpy as np
from torch.utils.data import Sampler

from ..argcheck import integer, rank_of
from .sampler import DEFAULT_WINDOW, chunk_groups, chunk_order, epoch_rng
from .state import EpochState

_BUCKET_TAG = 0x42554B54  # the bucketing sampler's own random stream


class BucketingBatchSampler(EpochState, Sampler[list[int]]):
    """Length-bucketed batches within a padded-frame budget, chunk-local and resumable.

    Parameters
    ----------
    data : H5Dataset or sequence of int
        An ``H5Dataset`` (lengths from its index, :func:`field_lengths`, and its chunk groups)
        or every sample's length.
    max_frames : int
        Budget of a batch: ``len(batch) * cost(longest length)`` never exceeds it (except a
        single sample that alone exceeds it).
    field : str, optional
        The dataset's variable field whose lengths count; default its first variable field.
    num_buckets : int
        Length ranges (equal sample counts).
    quadratic : float, optional
        ``cost(T) = T + T**2 / quadratic``; default ``cost(T) = T``.
    max_batch_size : int, optional
        At most this many samples per batch.
    window : int
        Chunk groups per pool (the chunk cache of a reader should hold this many).
    seed, rank, world_size, drop_last
        As for :class:`~h5batch.torch.ChunkShuffleSampler`; ``drop_last`` here concerns the
        batches that do not divide evenly between ranks.
    chunk_size : int, optional
        Samples per chunk group when ``data`` has no ``chunk_starts()`` (default 64).

    Pass it as ``batch_sampler=`` of a ``DataLoader`` or ``StatefulDataLoader``.
    """

    def __init__(self, data: Any, max_frames: int, field: str | None = None, num_buckets: int = 10,
                 quadratic: float | None = None, max_batch_size: int | None = None,
                 window: int = DEFAULT_WINDOW, seed: int = 0, rank: int = 0, world_size: int = 1,
                 drop_last: bool = False, chunk_size: int | None = None):
        self.lengths = _lengths(data, field)
        groups_of = data if callable(getattr(data, "chunk_starts", None)) else len(self.lengths)
        self.n, self.chunk_starts, self.chunk_size = chunk_groups(groups_of, chunk_size)
        if self.n != len(self.lengths):
            raise ValueError(f"{len(self.lengths)} lengths for {self.n} samples")
        self.max_frames = integer("max_frames", max_frames, 1)
        self.num_buckets = integer("num_buckets", num_buckets, 1)
        if quadratic is not None and not float(quadratic) > 0:
            raise ValueError(f"quadratic must be > 0, got {quadratic!r}")
        self.quadratic = None if quadratic is None else float(quadratic)
        self.max_batch_size = None if max_batch_size is None else integer("max_batch_size", max_batch_size, 1)
        self.window = integer("window", window, 1)
        self.seed = integer("seed", seed, 0)
        self.rank, self.world_size = rank_of(rank, world_size)
        self.drop_last = bool(drop_last)
        self.costs = self.cost(self.lengths)
        cuts = np.quantile(self.costs, np.linspace(0, 1, self.num_buckets + 1)[1:-1]) if self.n else []
        self.buckets = np.searchsorted(np.asarray(cuts), self.costs, side="right").astype(np.int64)
        self.oversized = int(np.count_nonzero(self.costs > self.max_frames))
        self._plan: tuple[tuple[int, int], list[list[int]]] | None = None  # ((seed, epoch), batches)
        self._init_state()

    def cost(self, lengths: Any) -> np.ndarray:
        """Cost of one sample of each length (float64): ``T`` or ``T + T**2 / quadratic``."""
        t = np.asarray(lengths, dtype=np.float64)
        return t + t * t / self.quadratic if self.quadratic else t

    def epoch_batches(self, epoch: int | None = None) -> list[list[int]]:
        """Every batch of ``epoch`` (default: the current one), all ranks, before dealing."""
        e = self.epoch if epoch is None else integer("epoch", epoch, 0)
        if self._plan is None or self._plan[0] != (self.seed, e):
            self._plan = ((self.seed, e), self._make_batches(e))
        return self._plan[1]

    def local_batches(self, epoch: int | None = None) -> list[list[int]]:
        """This rank's batches of ``epoch``."""
        batches = self.epoch_batches(epoch)
        w = self.world_size
        if w > 1 and len(batches) % w:
            if self.drop_last:
                batches = batches[: len(batches) - len(batches) % w]
            else:
                extra = w - len(batches) % w
                batches = batches + [batches[i % len(batches)] for i in range(extra)]
        return batches[self.rank::w]

    # ------------------------------------------------------------ planning

    def _make_batches(self, epoch: int) -> list[list[int]]:
        rng = epoch_rng(self.seed, epoch, _BUCKET_TAG)
        order = chunk_order(self.chunk_starts, self.n, self.window, rng)
        pool = max(1, self.window * self.chunk_size)
        waiting: list[np.ndarray] = [np.zeros(0, dtype=np.int64)] * self.num_buckets
        out: list[list[int]] = []
        for lo in range(0, self.n, pool):
            last = lo + pool >= self.n
            part = order[lo: lo + pool]
            formed: list[list[int]] = []
            for b in range(self.num_buckets):
                members = np.concatenate([waiting[b], part[self.buckets[part] == b]])
                full, rest = self._pack(members)
                formed += full
                if last and len(rest):
                    formed.append(rest.tolist())
                    rest = rest[:0]
                waiting[b] = rest
            out += [formed[i] for i in rng.permutation(len(formed))]
        return out

    def _pack(self, members: np.ndarray) -> tuple[list[list[int]], np.ndarray]:
        """Greedy batches of ``members`` sorted by cost; returns the full ones and the rest."""
        if not len(members):
            return [], members
        members = members[np.argsort(self.costs[members], kind="stable")]
        costs = self.costs[members].tolist()
        cap = self.max_batch_size or len(members)
        batches: list[list[int]] = []
        start = 0
        for i in range(1, len(members)):
            size = i - start + 1  # with member i; sorted, so member i is the longest
            if size > cap or size * costs[i] > self.max_frames:
                batches.append(members[start:i].tolist())
                start = i
        return batches, members[start:]

    # ------------------------------------------------------------ EpochState

    def _units(self) -> int:
        return len(self.local_batches())

    def _state_checks(self) -> dict[str, Any]:
        return {"samples": self.n, "max_frames": self.max_frames, "num_buckets": self.num_buckets,
                "quadratic": self.quadratic, "window": self.window, "world_size": self.world_size,
                "drop_last": self.drop_last}

    def _units_of(self, epoch: int, start: int) -> Iterator[list[int]]:
        return iter(self.local_batches(epoch)[start:])

    def __repr__(self) -> str:
        return (f"BucketingBatchSampler(n={self.n}, max_frames={self.max_frames}, buckets={self.num_buckets}, "
                f"rank={self.rank}/{self.world_size}, seed={self.seed}, epoch={self.epoch}, "
                f"position={self.position})")


def field_lengths(ds: Any, field: str | None = None) -> np.ndarray:
    """Every sample's size along its first axis (frames of audio, rows of an image), int64.

    Read from an ``H5Dataset``'s index (a variable field's offsets or shapes, loaded by its
    constructor; a fixed field's shape), never from sample data. ``field`` defaults to the
    first variable field the dataset reads, else its first field.
    """
    by_name = {fi.name: fi for fi in ds.fields}
    if field is not None and field not in by_name:
        raise KeyError(f"{ds.path}: no field {field!r} read (fields: {', '.join(by_name)})")
    fi = by_name[field] if field else next((f for f in ds.fields if not f.fixed), ds.fields[0])
    idx = ds._check(np.arange(len(ds)))  # the dataset's own index mapping
    if fi.fixed:
        return np.full(len(idx), fi.shape[0] if fi.shape else 1, dtype=np.int64)
    return np.asarray(ds._variable_shapes(fi, idx))[:, 0].astype(np.int64)


def _lengths(data: Any, field: str | None) -> np.ndarray:
    if callable(getattr(data, "chunk_starts", None)) and hasattr(data, "fields"):
        lengths = field_lengths(data, field)
    elif field is not None:
        raise TypeError(f"field={field!r} needs a dataset with lengths(), got {type(data).__name__}")
    elif isinstance(data, Sequence | np.ndarray):
        lengths = data
    else:
        raise TypeError(f"data must be an H5Dataset or a sequence of lengths, got {type(data).__name__}")
    arr = np.asarray(lengths)
    if arr.ndim != 1 or not (arr.size == 0 or np.issubdtype(arr.dtype, np.integer)):
        raise TypeError("lengths must be a 1-D sequence of integers")
    if arr.size and arr.min() < 0:
        raise ValueError(f"lengths must be >= 0, got {int(arr.min())} at sample {int(arr.argmin())}")
    return arr.astype(np.int64)
