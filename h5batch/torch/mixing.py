"""Mixing: several h5batch files (or splits) read as one dataset, sampled with weights or in turn.

:class:`MixedDataset` puts datasets side by side (index ``i`` of source ``k`` is
``offsets[k] + i``) and checks that their fields match: names and order, kind, per-sample
shape (fixed) or rank (variable), output dtype, labels and sources in all or none (choose
common fields with ``fields=``). Every batch gets a ``dataset`` column (int64, index in
``names``).

:class:`MixingSampler` orders, as a pure function of ``(seed, epoch)``:

* ``weights=None``: every sample once per epoch, sources interleaved at random;
* ``weights=[w0, ...]``: each unit's source drawn with probability ``w_k / sum(w)``,
  ``num_samples`` per epoch (default all); a source that runs out starts a new pass;
* ``in_turn=True``: source 0 to its end, then source 1, ...

Within a source the order is :class:`~h5batch.torch.ChunkShuffleSampler`'s (seeded from
``(seed, epoch, source)``), so reads stay chunk-local. With ``batch_size`` it is a batch
sampler (``batch_sampler=``) whose batches each come from one source, with no copy; without,
it yields indices and a batch mixes sources, read source by source and assembled with one
more copy.

State: ``state_dict()`` holds ``(seed, epoch, position)`` per :mod:`h5batch.torch.state`; an
epoch's order is recomputed from the seed, no data replayed.
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from typing import Any

import numpy as np
import torch
from torch.utils.data import Dataset, Sampler, get_worker_info

from ..argcheck import integer
from .batch import Batch, Ragged, empty_columns, numpy_dtype
from .recycle import shared_pool
from .sampler import ChunkShuffleSampler
from .state import EpochState

DATASET = "dataset"  # the column naming each sample's source
_SEED_TAG = 0x4D495845  # "MIXE": this sampler's stream is not shared with other users of the seed


class MixedDataset(Dataset):
    """Datasets (:class:`~h5batch.torch.H5Dataset`, same fields) indexed one after another.

    Parameters
    ----------
    datasets : sequence of H5Dataset
        The sources, in the order of the ``dataset`` column.
    names : sequence of str, optional
        A name per source (default ``<file name>:<split>``), ``ds.names``.
    """

    def __init__(self, datasets: Sequence[Any], names: Sequence[str] | None = None):
        self.datasets = list(datasets)
        if not self.datasets:
            raise ValueError("MixedDataset needs at least one dataset")
        self.names = [str(n) for n in names] if names is not None else [
            f"{getattr(d, 'path', type(d).__name__).rsplit('/', 1)[-1]}:{getattr(d, 'split', '')}"
            for d in self.datasets]
        if len(self.names) != len(self.datasets):
            raise ValueError(f"{len(self.names)} names for {len(self.datasets)} datasets")
        _check_compatible(self.datasets)
        self.lengths = np.array([len(d) for d in self.datasets], dtype=np.int64)
        self.offsets = np.concatenate([[0], np.cumsum(self.lengths)]).astype(np.int64)
        self._pool = shared_pool()

    def __len__(self) -> int:
        return int(self.offsets[-1])

    def __repr__(self) -> str:
        parts = ", ".join(f"{n} ({k})" for n, k in zip(self.names, self.lengths.tolist(), strict=True))
        return f"MixedDataset({parts})"

    def locate(self, indices: Any) -> tuple[np.ndarray, np.ndarray]:
        """``(source, local index)`` arrays of global indices (negative ones count from the end)."""
        idx = np.asarray(indices, dtype=np.int64).reshape(-1)
        n = len(self)
        idx = np.where(idx < 0, idx + n, idx)
        if idx.size and (idx.min() < 0 or idx.max() >= n):
            raise IndexError(f"index {int(idx[(idx < 0) | (idx >= n)][0])} out of range for {n} samples")
        k = np.searchsorted(self.offsets, idx, side="right") - 1
        return k, idx - self.offsets[k]

    def __getitem__(self, i: int) -> dict[str, Any]:
        k, local = self.locate([i])
        sample = self.datasets[int(k[0])][int(local[0])]
        sample[DATASET] = torch.tensor(int(k[0]), dtype=torch.int64)
        return sample

    def __getitems__(self, indices: Sequence[int]) -> Batch:
        """A :class:`Batch` in the requested order, with a ``dataset`` column."""
        k, local = self.locate(indices)
        if not k.size or np.all(k == k[0]):
            src = int(k[0]) if k.size else 0
            batch = self.datasets[src].__getitems__(local.tolist())
            return self._with_dataset(batch, np.full(len(local), src, dtype=np.int64))
        parts = []
        for src in np.unique(k).tolist():
            pos = np.flatnonzero(k == src)
            parts.append((pos, self.datasets[src].__getitems__(local[pos].tolist())))
        return self._with_dataset(self._assemble(parts, len(k)), k)

    def _with_dataset(self, batch: Any, k: np.ndarray) -> Any:
        """Add the ``dataset`` column (in a worker: in recycled shared memory, like the batch)."""
        if not isinstance(batch, Batch):  # a transform: per-sample dicts
            for j, s in enumerate(batch):
                if isinstance(s, dict):
                    s[DATASET] = torch.tensor(int(k[j]), dtype=torch.int64)
            return batch
        col = empty_columns([((len(k),), np.int64)], get_worker_info() is not None, self._pool)[0]
        col.numpy()[:] = k
        batch.columns[DATASET] = col
        return batch

    def _assemble(self, parts: list[tuple[np.ndarray, Any]], b: int) -> Any:
        """One batch out of per-source batches (``pos``: where each one's samples go)."""
        if not all(isinstance(p, Batch) for _, p in parts):  # transforms: per-sample items
            return _scatter(parts, b, lambda p: p)
        first = parts[0][1]
        # A list column (text, stored bytes) is scattered as a list; the others are
        # gathered into one new tensor each.
        tensors = [(name, col) for name, col in first.columns.items() if not isinstance(col, list)]
        specs: list[tuple[tuple[int, ...], Any]] = []
        for name, col in tensors:
            if isinstance(col, Ragged):
                top = np.max(np.stack([p.columns[name].shapes.max(axis=0) for _, p in parts]), axis=0)
                specs.append(((b, *top.tolist()), numpy_dtype(col.padded.dtype)))
            else:
                specs.append(((b, *col.shape[1:]), numpy_dtype(col.dtype)))
        if first.label is not None:
            specs.append(((b,), np.int64))
        outs = empty_columns(specs, get_worker_info() is not None, self._pool)
        columns: dict[str, Any] = {name: _scatter(parts, b, lambda p, name=name: p.columns[name])
                                   for name, col in first.columns.items() if isinstance(col, list)}
        for (name, col), out in zip(tensors, outs, strict=False):
            if isinstance(col, Ragged):
                out.zero_()
                shapes = np.zeros((b, col.shapes.shape[1]), dtype=np.int64)
                for pos, p in parts:
                    src = p.columns[name]
                    out[(torch.from_numpy(pos), *(slice(0, int(s)) for s in src.padded.shape[1:]))] = src.padded
                    shapes[pos] = src.shapes
                columns[name] = Ragged(out, shapes)
            else:
                for pos, p in parts:
                    out[torch.from_numpy(pos)] = p.columns[name]
                columns[name] = out
        label = None
        if first.label is not None:
            label = outs[-1]
            for pos, p in parts:
                label[torch.from_numpy(pos)] = p.label
        source = None if first.source is None else _scatter(parts, b, lambda p: p.source)
        return Batch({name: columns[name] for name in first.columns}, label, source, b)


def _scatter(parts: list[tuple[np.ndarray, Any]], b: int, items: Any) -> list[Any]:
    """A list of ``b``: each part's ``items(part)`` at its positions ``pos``."""
    out: list[Any] = [None] * b
    for pos, p in parts:
        for j, item in zip(pos.tolist(), items(p), strict=True):
            out[j] = item
    return out


def _check_compatible(datasets: Sequence[Any]) -> None:
    """The requested fields of every source match the first's (else ``ValueError`` naming both)."""
    ref = datasets[0]

    def desc(d: Any) -> str:
        return f"{getattr(d, 'path', d)!s}:{getattr(d, 'split', '')}"

    def signature(d: Any, fi: Any) -> tuple[Any, ...]:
        dtype = d._convert(fi)[0]
        return (fi.kind, tuple(fi.shape) if fi.fixed else fi.ndim, np.dtype(dtype).str)

    for d in datasets:
        if not hasattr(d, "fields") or not hasattr(d, "_convert"):
            raise TypeError(f"MixedDataset mixes H5Datasets, got {type(d).__name__}")
        if DATASET in d.field_names:
            raise ValueError(f"{desc(d)}: a field named {DATASET!r} would clash with the source column")
    for d in datasets[1:]:
        if d.field_names != ref.field_names:
            raise ValueError(f"fields differ: {desc(ref)} returns {list(ref.field_names)}, {desc(d)} "
                             f"{list(d.field_names)}; choose common ones with fields=[...]")
        for a, b in zip(ref.fields, d.fields, strict=True):
            sa, sb = signature(ref, a), signature(d, b)
            if sa != sb:
                raise ValueError(f"field {a.name!r} differs: {desc(ref)} has {_says(sa)}, {desc(d)} has {_says(sb)}")
        for attr, what in (("labelled", "labels"), ("with_source", "sources")):
            if bool(getattr(ref, attr)) != bool(getattr(d, attr)):
                raise ValueError(f"{what}: {desc(ref)} {'has' if getattr(ref, attr) else 'has no'} {what}, "
                                 f"{desc(d)} {'has' if getattr(d, attr) else 'has no'}")


def _says(sig: tuple[Any, ...]) -> str:
    kind, shape, dtype = sig
    return f"{kind} {'shape ' + str(shape) if kind == 'fixed' else f'rank {shape}'} {np.dtype(dtype)}"


class MixingSampler(EpochState, Sampler):
    """The order of a :class:`MixedDataset` (see the module docstring).

    Parameters
    ----------
    data : MixedDataset
    weights : sequence of float, optional
        Probability of each source per unit (normalised). ``None``: every sample once.
    num_samples : int, optional
        Samples per epoch with ``weights`` (default: the sources' total).
    in_turn : bool
        Sources one after another, each to its end.
    batch_size : int, optional
        Yield batches (lists of indices), each from one source; else single indices.
    drop_last : bool
        With ``batch_size``: drop each source's last, short batch (in turn / no weights).
    seed : int
    window : int, optional
        ``ChunkShuffleSampler`` window within each source (default: its default).
    """

    def __init__(self, data: MixedDataset, weights: Sequence[float] | None = None, *,
                 num_samples: int | None = None, in_turn: bool = False, batch_size: int | None = None,
                 drop_last: bool = False, seed: int = 0, window: int | None = None):
        self.data = data
        self.lengths = data.lengths.copy()
        k = len(self.lengths)
        self.weights = None
        if weights is not None and in_turn:
            raise ValueError("weights and in_turn=True exclude each other: in turn, each source is read to its end")
        if weights is not None:
            w = np.asarray(weights, dtype=np.float64)
            if w.shape != (k,) or not np.all(np.isfinite(w)) or w.min() < 0 or w.sum() <= 0:
                raise ValueError(f"weights must be {k} finite numbers >= 0 with a positive sum, got {list(weights)}")
            if np.any((w > 0) & (self.lengths == 0)):
                raise ValueError("a source with weight > 0 has no samples")
            self.weights = w / w.sum()
        self.in_turn = bool(in_turn)
        self.batch_size = None if batch_size is None else integer("batch_size", batch_size, 1)
        self.drop_last = bool(drop_last)
        self.num_samples = integer("num_samples", int(self.lengths.sum()) if num_samples is None else num_samples, 0)
        self.window = None if window is None else integer("window", window, 1)
        self.seed = integer("seed", seed, 0)
        self._init_state()

    # -- the order
    def _units(self) -> int:
        bs = self.batch_size or 1
        if self.weights is not None:
            return self.num_samples // bs if self.drop_last else -(-self.num_samples // bs)
        return int((self.lengths // bs if self.drop_last else -(-self.lengths // bs)).sum())

    def _state_checks(self) -> dict[str, Any]:
        return {"lengths": self.lengths.tolist(), "weights": None if self.weights is None else self.weights.round(12).tolist(),
                "in_turn": self.in_turn, "batch_size": self.batch_size, "num_samples": self.num_samples,
                "window": self.window}

    def _sources(self, epoch: int) -> np.ndarray:
        """The source of every unit (sample or batch) of the epoch."""
        bs = self.batch_size or 1
        if self.weights is not None:
            rng = np.random.default_rng([_SEED_TAG, self.seed, epoch])
            return rng.choice(len(self.lengths), size=self._units(), p=self.weights).astype(np.int64)
        per = self.lengths // bs if self.drop_last else -(-self.lengths // bs)
        src = np.repeat(np.arange(len(self.lengths)), per)
        if not self.in_turn:
            src = np.random.default_rng([_SEED_TAG, self.seed, epoch]).permutation(src)
        return src.astype(np.int64)

    def _stream(self, epoch: int, k: int, count: int) -> np.ndarray:
        """The first ``count`` local indices of source ``k`` in epoch ``epoch`` (passes in new orders)."""
        n = int(self.lengths[k])
        seed = int(np.random.SeedSequence([_SEED_TAG, self.seed, epoch, k]).generate_state(1)[0])
        kw = {} if self.window is None else {"window": self.window}
        order = ChunkShuffleSampler(self.data.datasets[k], seed=seed, **kw)
        passes = [order.epoch_order(p) for p in range(-(-count // n))] if n else []
        return np.concatenate(passes)[:count] if passes else np.zeros(0, dtype=np.int64)

    def epoch_units(self, epoch: int) -> list[Any]:
        """Every unit of ``epoch``: global indices (ints), or lists of them with ``batch_size``."""
        src = self._sources(epoch)
        bs = self.batch_size or 1
        out: list[Any] = [None] * len(src)
        for k in range(len(self.lengths)):
            where = np.flatnonzero(src == k)
            if not where.size:
                continue
            n = int(self.lengths[k])
            want = where.size * bs if self.weights is not None else n
            stream = self._stream(epoch, k, want) + self.data.offsets[k]
            if self.batch_size is None:
                for j, i in zip(where.tolist(), stream.tolist(), strict=True):
                    out[j] = i
            else:
                for b, j in enumerate(where.tolist()):
                    out[j] = stream[b * bs:(b + 1) * bs].tolist()
        return out

    def _units_of(self, epoch: int, start: int) -> Iterator[Any]:
        return iter(self.epoch_units(epoch)[start:])

    def __repr__(self) -> str:
        how = "in turn" if self.in_turn else ("every sample once" if self.weights is None
                                             else f"weights {self.weights.round(3).tolist()}")
        return (f"MixingSampler({len(self.lengths)} sources, {how}, {self._units()} "
                f"{'batches' if self.batch_size else 'samples'}/epoch, seed={self.seed}, epoch={self.epoch})")
