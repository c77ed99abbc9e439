"""The read phase's loaders as recipes: a module-level builder and its arguments.

Rule: every read row of the bench is a :class:`Recipe`, never a closure, so the row can be
built in the bench's process or pickled and built in a new interpreter
(:mod:`h5batch.bench.fresh_reads`) with the same code and the same arguments. Each builder
returns the loader exactly as the row's name says (batch ``batch_size``, shuffle on); what
each row means is in :mod:`h5batch.bench.reads`.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

__all__ = ["Recipe", "h5_chunk_shuffle", "h5_loader", "h5_plain", "h5_random", "litdata", "memmap_rowwise",
           "memmap_strict", "naive", "raw_strict", "raw_typical", "webdataset"]


@dataclass(frozen=True)
class Recipe:
    """``build(**args)`` makes the row's loader. ``build`` must be a module-level function
    (pickled by name) and ``args`` picklable (paths, numbers, field configs)."""

    build: Callable[..., Any]
    args: dict[str, Any] = field(default_factory=dict)

    def __call__(self) -> Any:
        return self.build(**self.args)

    def __str__(self) -> str:
        return f"{self.build.__name__}({', '.join(f'{k}={v!r}' for k, v in self.args.items() if k != 'items')})"


def dataloader(ds: Any, workers: int, batch: int, **kw: Any) -> Any:
    from torch.utils.data import DataLoader

    return DataLoader(ds, batch_size=batch, num_workers=workers, persistent_workers=workers > 0, **kw)


def h5_chunk_shuffle(path: str, workers: int, batch: int, seed: int) -> Any:
    """h5batch's sampler and collate, ``as_float``."""
    from ..torch import ChunkShuffleSampler, H5Dataset, collate

    ds = H5Dataset(path, "train", as_float=True)
    return dataloader(ds, workers, batch, sampler=ChunkShuffleSampler(ds, seed=seed), collate_fn=collate)


def h5_random(path: str, workers: int, batch: int) -> Any:
    """Full random order (``shuffle=True``) with h5batch's collate, ``as_float``."""
    from ..torch import H5Dataset, collate

    return dataloader(H5Dataset(path, "train", as_float=True), workers, batch, shuffle=True, collate_fn=collate)


def h5_plain(path: str, workers: int, batch: int) -> Any:
    """The plain path: ``DataLoader(ds, batch_size, shuffle=True)``, torch's default collate."""
    from ..torch import H5Dataset

    return dataloader(H5Dataset(path, "train"), workers, batch, shuffle=True)


def h5_loader(path: str, workers: int, batch: int, seed: int) -> Any:
    """The one-call fast path, ``ds.loader()``."""
    from ..torch import H5Dataset

    return H5Dataset(path, "train").loader(batch_size=batch, num_workers=workers, seed=seed)


def naive(path: str, names: Sequence[str], n: int, workers: int, batch: int) -> Any:
    from . import baselines

    return dataloader(baselines.NaiveDataset(path, list(names), n), workers, batch, shuffle=True,
                      collate_fn=baselines.float_collate)


def raw_typical(items: Sequence[tuple[str, ...]], fields: Sequence[tuple[str, Any]], workers: int,
                batch: int) -> Any:
    """Raw files as a training script reads them (soundfile / Pillow, torch's default collate)."""
    from . import baselines

    return dataloader(baselines.TypicalRawDataset(items, fields), workers, batch, shuffle=True)


def raw_strict(items: Sequence[tuple[str, ...]], fields: Sequence[tuple[str, Any]], workers: int,
               batch: int) -> Any:
    """Raw files with h5batch's decoder and batch assembly."""
    from . import baselines

    return dataloader(baselines.RawFileDataset(items, fields), workers, batch, shuffle=True,
                      collate_fn=baselines.float_collate)


def memmap_rowwise(paths: dict[str, str], workers: int, batch: int) -> Any:
    from . import baselines

    return dataloader(baselines.MemmapDataset(paths), workers, batch, shuffle=True,
                      collate_fn=baselines.passthrough)


def memmap_strict(folder: str, workers: int, batch: int) -> Any:
    """The strict read limit over the ``<field>.npy`` float32 memmaps of ``folder``
    (:mod:`h5batch.bench.strict`)."""
    from .baselines import passthrough
    from .strict import StrictMemmapDataset

    return dataloader(StrictMemmapDataset(memmap_paths(folder)), workers, batch, shuffle=True,
                      collate_fn=passthrough)


def memmap_paths(folder: str) -> dict[str, str]:
    """``{field: path}`` of the ``<field>.npy`` files in ``folder``."""
    import os

    return {f[:-4]: os.path.join(folder, f) for f in sorted(os.listdir(folder)) if f.endswith(".npy")}


def webdataset(path: str, names: Sequence[str], workers: int, batch: int) -> Any:
    from . import peers

    return peers.wds_loader(path, list(names), workers, batch)


def litdata(path: str, names: Sequence[str], workers: int, batch: int, **kw: Any) -> Any:
    from . import peers

    return peers.litdata_loader(path, list(names), workers, batch, **kw)
