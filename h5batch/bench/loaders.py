"""The read rows' loaders: module-level builders called with picklable arguments.

Rule: a read row is a builder and its arguments, never a closure, so that the process that
times it (:func:`h5batch.bench.measure.read_row`, a new interpreter) builds it. Every loader
shuffles, batches ``batch`` samples and delivers ``{field: float32 tensor (B, ...)}`` with the
values of ``H5Dataset(as_float=True)`` (int16 ``x / 32768``, uint8 ``x / 255``).

* :func:`h5`, by ``order``: ``chunk-shuffle`` (``ChunkShuffleSampler`` + ``collate``, the
  default), ``random`` (``shuffle=True``), ``plain-dataloader`` (``DataLoader(ds, batch_size,
  shuffle=True)``, torch's default collate: the plain path most scripts write),
  ``ds.loader`` (``ds.loader(...)``, the one-call path).
* :func:`naive`: the naive file, opened lazily per process, one h5py read per field and
  sample, a float tensor per sample, torch's default collate (h5batch's ``collate`` pads
  variable lengths, which the default cannot stack).
* :func:`raw`: the source files decoded in ``__getitem__`` as training scripts do
  (``soundfile.read(path, dtype="float32")``; images with h5batch's decoder, then ``/ 255``).
* :func:`memmap`: the read limit: the decoded samples as float32 ``.npy`` memmaps and per
  batch ``torch.from_numpy(mm[np.sort(idx)])`` per field: one fancy-index gather, no
  conversion. In a DataLoader worker torch then copies that tensor into shared memory.
* :func:`webdataset`, :func:`litdata`: the peers read as their docs show (shard shuffle, a
  shuffle buffer of 1,000 and ``split_by_worker``; ``StreamingDataset(shuffle=True)`` +
  ``StreamingDataLoader``), each sample made float tensors in the pipeline, the peer's
  default collation. :func:`verify` checks a peer's output against the decoded source.
"""

from __future__ import annotations

import glob
import os
from collections.abc import Sequence
from functools import partial
from typing import Any

import numpy as np

from ..fields import decode_field
from .corpus import to_float
from .writers import NAIVE_GROUP, Fields, Items

SHUFFLE_BUFFER = 1000  # WebDataset's documented example value


def dataloader(ds: Any, workers: int, batch: int | None, **kw: Any) -> Any:
    from torch.utils.data import DataLoader

    return DataLoader(ds, batch_size=batch, num_workers=workers, persistent_workers=workers > 0, **kw)


def h5(path: str, order: str, workers: int, batch: int, seed: int = 0) -> Any:
    from ..torch import ChunkShuffleSampler, H5Dataset, collate

    ds = H5Dataset(path, "train", as_float=True)
    if order == "ds.loader":
        return ds.loader(batch_size=batch, num_workers=workers, seed=seed)
    if order == "chunk-shuffle":
        return dataloader(ds, workers, batch, sampler=ChunkShuffleSampler(ds, seed=seed), collate_fn=collate)
    return dataloader(ds, workers, batch, shuffle=True, collate_fn=collate if order == "random" else None)


def _collate(fixed: bool) -> Any:
    from ..torch import collate

    return None if fixed else collate  # None: torch's default_collate


class NaiveDataset:
    """Samples of a naive file. Opened on first access in each process, never in
    ``__init__``: an h5py handle inherited through fork is unsafe (pytorch#11929)."""

    def __init__(self, path: str, fields: Sequence[str], n: int):
        self.path, self.fields, self.n = path, tuple(fields), n
        self._pid: int | None = None
        self._group: Any = None

    def __len__(self) -> int:
        return self.n

    def __getstate__(self) -> dict[str, Any]:
        return {**self.__dict__, "_pid": None, "_group": None}

    def __getitem__(self, i: int) -> dict[str, Any]:
        import h5py
        import torch

        if self._pid != os.getpid():
            self._group, self._pid = h5py.File(self.path, "r")[NAIVE_GROUP], os.getpid()
        s = self._group[f"{int(i):08d}"]
        return {name: torch.from_numpy(to_float(s[name][()])) for name in self.fields}


def naive(path: str, names: Sequence[str], n: int, fixed: bool, workers: int, batch: int) -> Any:
    return dataloader(NaiveDataset(path, names, n), workers, batch, shuffle=True, collate_fn=_collate(fixed))


class RawDataset:
    """The source files of each sample, decoded in ``__getitem__``."""

    def __init__(self, items: Items, fields: Fields):
        self.items, self.fields = list(items), tuple(fields)

    def __len__(self) -> int:
        return len(self.items)

    def __getitem__(self, i: int) -> dict[str, Any]:
        import soundfile
        import torch

        out = {}
        for (name, fc), path in zip(self.fields, self.items[int(i)]):
            x = None
            if fc.type == "audio":
                x, rate = soundfile.read(path, dtype="float32", always_2d=fc.channels == "keep")
                if x.ndim == 2 and fc.channels != "keep":
                    x = x.mean(axis=1, dtype=np.float32) if fc.channels == "mono" else x[:, 0]
                if fc.length is not None:
                    x = x[: fc.length]
                    x = np.pad(x, [(0, fc.length - len(x))] + [(0, 0)] * (x.ndim - 1)) if len(x) < fc.length else x
                if rate != fc.sample_rate:  # resampled: h5batch's decoder does it
                    x = None
            out[name] = torch.from_numpy(np.ascontiguousarray(x if x is not None else to_float(decode_field(path, fc))))
        return out


def raw(items: Items, fields: Fields, fixed: bool, workers: int, batch: int) -> Any:
    return dataloader(RawDataset(items, fields), workers, batch, shuffle=True, collate_fn=_collate(fixed))


def write_memmaps(reference: dict[str, list[np.ndarray]], directory: str) -> str:
    """Each field's samples as one float32 ``<field>.npy`` (``to_float``); returns ``directory``."""
    os.makedirs(directory, exist_ok=True)
    for name, arrays in reference.items():
        mm = np.lib.format.open_memmap(os.path.join(directory, f"{name}.npy"), mode="w+", dtype=np.float32,
                                       shape=(len(arrays), *arrays[0].shape))
        for k, a in enumerate(arrays):
            mm[k] = to_float(a)
        mm.flush()
    return directory


class MemmapDataset:
    """Float32 memmaps, a batch per ``__getitems__``; opened on first use in each process."""

    def __init__(self, folder: str):
        self.paths = {f[:-4]: os.path.join(folder, f) for f in sorted(os.listdir(folder)) if f.endswith(".npy")}
        self.n = int(np.load(next(iter(self.paths.values())), mmap_mode="r").shape[0])
        self._maps: dict[str, np.ndarray] | None = None

    def __len__(self) -> int:
        return self.n

    def __getstate__(self) -> dict[str, Any]:
        return {**self.__dict__, "_maps": None}

    def __getitems__(self, indices: Sequence[int]) -> dict[str, Any]:
        import torch

        if self._maps is None:
            self._maps = {k: np.load(p, mmap_mode="r") for k, p in self.paths.items()}
        idx = np.sort(np.asarray(indices, dtype=np.int64))  # numpy gathers sorted rows fastest
        return {k: torch.from_numpy(mm[idx]) for k, mm in self._maps.items()}


def _passthrough(batch: Any) -> Any:
    return batch


def memmap(folder: str, workers: int, batch: int) -> Any:
    return dataloader(MemmapDataset(folder), workers, batch, shuffle=True, collate_fn=_passthrough)


def _sample(fields: Sequence[str], keys: bool, suffix: str, s: dict[str, Any]) -> dict[str, Any]:
    """A peer's sample -> ``{field: float32 tensor}`` (+ ``__key__`` when asked)."""
    import torch

    out: dict[str, Any] = {n: torch.from_numpy(to_float(s[n + suffix])) for n in fields}
    if keys:
        out["__key__"] = s["__key__"] if "__key__" in s else f"{int(s['index']):08d}"
    return out


def webdataset(path: str, names: Sequence[str], workers: int, batch: int, keys: bool = False,
               seed: int = 0) -> Any:
    import webdataset as wds

    shards = sorted(glob.glob(os.path.join(path, "*.tar")))
    ds = (wds.WebDataset(shards, shardshuffle=len(shards), workersplitter=wds.split_by_worker, empty_check=False,
                         seed=seed)
          .shuffle(SHUFFLE_BUFFER).decode().map(partial(_sample, tuple(names), keys, ".npy")).batched(batch, partial=True))
    return dataloader(ds, workers, None)  # batched by the pipeline


def litdata(path: str, names: Sequence[str], workers: int, batch: int, keys: bool = False, seed: int = 0) -> Any:
    import litdata as ld

    ds = ld.StreamingDataset(path, shuffle=True, seed=seed, transform=partial(_sample, tuple(names), keys, ""))
    return ld.StreamingDataLoader(ds, batch_size=batch, num_workers=workers, persistent_workers=workers > 0)


def verify(loader: Any, reference: dict[str, list[np.ndarray]]) -> dict[str, Any]:
    """One epoch of ``loader`` (built with ``keys=True``) against ``reference``: every key
    ``0..n-1`` exactly once, each sample equal to the decoded source as float32."""
    n = len(next(iter(reference.values())))
    seen: dict[int, int] = {}
    mismatched = 0
    for b in loader:
        for j, i in enumerate(int(k) for k in b["__key__"]):
            seen[i] = seen.get(i, 0) + 1
            if not 0 <= i < n or any(not np.array_equal(b[name][j].numpy(), to_float(ref[i]))
                                     for name, ref in reference.items()):
                mismatched += 1
    missing = sum(1 for i in range(n) if i not in seen)
    dups = sum(c - 1 for c in seen.values() if c > 1)
    return {"ok": not (missing or dups or mismatched), "samples": sum(seen.values()), "missing": missing,
            "duplicates": dups, "mismatched": mismatched}
