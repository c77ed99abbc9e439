"""What h5batch is measured against: the naive HDF5 recipe, raw files, and a memmap.

* :func:`naive_convert` is the recipe found in most tutorials: one process decodes the files
  one by one and stores every sample as its own HDF5 dataset, ``compression="gzip"``,
  ``chunks=True``.
* :class:`NaiveDataset` reads that file back sample by sample (opened lazily per process).
* :class:`TypicalRawDataset` decodes the original wav/jpg files in ``__getitem__`` the way
  training scripts do (soundfile / Pillow, torch's default collate): the raw-file baseline.
  :class:`RawFileDataset` + :class:`FloatCollate` decodes them with h5batch's decoder and
  batches them with h5batch's batch assembly, so that h5batch against it measures the
  storage layout alone (reported for information, see ``report.layout_only``).
* :class:`MemmapDataset` gathers rows of one ``numpy.memmap`` holding the decoded array: no
  decoding, no HDF5, one fancy-index read per batch; the practical upper limit.

All of them hold the same arrays as an h5batch file made from the same job and deliver the
same batches as ``H5Dataset(as_float=True)`` + ``h5batch.torch.collate`` (they decode with
:func:`h5batch.fields.decode_field`, except that the typical raw-file reader lets soundfile
scale 16-bit PCM to float32, which gives the same x / 32768).
"""

from __future__ import annotations

import os
from collections.abc import Sequence
from typing import Any

import h5py
import numpy as np
import torch
from torch.utils.data import Dataset, get_worker_info

from ..fields import FieldConfig, decode_field, fixed_sample_shape
from ..torch.batch import copy_all, empty_columns, scale_in_place, to_float_into
from ..torch.recycle import shared_pool

NAIVE_GROUP = "samples"


def naive_convert(items: Sequence[tuple[str, ...]], fields: Sequence[tuple[str, FieldConfig]],
                  out_path: str, limit: int | None = None) -> dict[str, Any]:
    """Convert with the common recipe: one process, one gzip dataset per sample and field.

    ``items`` are the absolute paths of each sample's files (one per field); sample ``i`` is
    stored as ``/samples/<i>/<field>`` (``i`` zero-padded to 8 digits so names sort).
    Returns ``{"samples", "bytes_decoded", "output_bytes"}``.
    """
    n = len(items) if limit is None else min(limit, len(items))
    nbytes = 0
    with h5py.File(out_path, "w") as f:
        g = f.create_group(NAIVE_GROUP)
        for i in range(n):
            s = g.create_group(f"{i:08d}")
            for (name, fc), path in zip(fields, items[i]):
                a = decode_field(path, fc)
                nbytes += a.nbytes
                s.create_dataset(name, data=a, compression="gzip", chunks=True)
    return {"samples": n, "bytes_decoded": nbytes, "output_bytes": os.path.getsize(out_path)}


def naive_read_all(path: str, field: str) -> list[np.ndarray]:
    """Every sample of one field of a naive file, in order (for correctness checks)."""
    with h5py.File(path, "r") as f:
        g = f[NAIVE_GROUP]
        return [g[k][field][()] for k in sorted(g)]


# ---------------------------------------------------------------------------
# Datasets. Each returns per-sample dicts of numpy arrays as stored (int16 / uint8);
# FloatCollate turns a list of them into the batch H5Dataset(as_float=True) gives.
# ---------------------------------------------------------------------------


class NaiveDataset(Dataset):
    """Samples of a :func:`naive_convert` file, one ``h5py`` read per field and sample.

    The file is opened on first access in each process (never in ``__init__``: an h5py handle
    inherited through fork is unsafe, pytorch#11929).
    """

    def __init__(self, path: str, fields: Sequence[str], n: int):
        self.path = path
        self.fields = tuple(fields)
        self.n = n
        self._pid: int | None = None
        self._group: Any = None

    def __len__(self) -> int:
        return self.n

    def __getstate__(self) -> dict[str, Any]:
        return {**self.__dict__, "_pid": None, "_group": None}

    def __getitem__(self, i: int) -> dict[str, np.ndarray]:
        if self._pid != os.getpid():
            self._group = h5py.File(self.path, "r")[NAIVE_GROUP]
            self._pid = os.getpid()
        s = self._group[f"{int(i):08d}"]
        return {name: s[name][()] for name in self.fields}


class RawFileDataset(Dataset):
    """Decode the original files of each sample in ``__getitem__`` (the no-conversion path)."""

    def __init__(self, items: Sequence[tuple[str, ...]], fields: Sequence[tuple[str, FieldConfig]]):
        self.items = list(items)
        self.fields = tuple(fields)

    def __len__(self) -> int:
        return len(self.items)

    def __getitem__(self, i: int) -> dict[str, np.ndarray]:
        return {name: decode_field(path, fc) for (name, fc), path in zip(self.fields, self.items[int(i)])}


class TypicalRawDataset(Dataset):
    """The raw files read the way most training scripts do it: per file
    ``soundfile.read(path, dtype="float32")`` (images: Pillow, as h5batch decodes them, then
    ``/ 255``), one float32 tensor per field, stacked by torch's ``default_collate``.

    The raw-file baseline of the suite: what a user's existing pipeline gets. (Raw files with
    h5batch's own decoder and batch assembly are :class:`RawFileDataset` +
    :class:`FloatCollate`.) Fixed-shape fields at their native sample rate only (audio is
    cropped or zero-padded to ``length``): see :func:`TypicalRawDataset.supports`.
    """

    def __init__(self, items: Sequence[tuple[str, ...]], fields: Sequence[tuple[str, FieldConfig]]):
        self.items = list(items)
        self.fields = tuple(fields)

    @staticmethod
    def supports(fields: Sequence[tuple[str, FieldConfig]]) -> bool:
        return all(fixed_sample_shape(fc) is not None and not getattr(fc, "resample", False)
                   for _, fc in fields)

    def __len__(self) -> int:
        return len(self.items)

    def __getitem__(self, i: int) -> dict[str, torch.Tensor]:
        import soundfile

        out = {}
        for (name, fc), path in zip(self.fields, self.items[int(i)]):
            if fc.type == "audio":
                x, _ = soundfile.read(path, dtype="float32", always_2d=fc.channels == "keep")
                if x.ndim == 2 and fc.channels != "keep":
                    x = x.mean(axis=1, dtype=np.float32) if fc.channels == "mono" else x[:, 0]
                if fc.length is not None:
                    x = x[: fc.length]
                    if len(x) < fc.length:
                        x = np.pad(x, [(0, fc.length - len(x))] + [(0, 0)] * (x.ndim - 1))
                out[name] = torch.from_numpy(np.ascontiguousarray(x))
            else:
                out[name] = float_sample(decode_field(path, fc))
        return out


def float_sample(a: np.ndarray) -> torch.Tensor:
    """One stored sample (int16 / uint8 array) as a new float32 tensor, scaled exactly like
    ``H5Dataset(as_float=True)``: what a per-sample transform in a training script does."""
    out = a.astype(np.float32)
    scale_in_place(out, a.dtype)
    return torch.from_numpy(out)


def write_memmaps(reference: dict[str, np.ndarray], directory: str) -> dict[str, str]:
    """Store each field's decoded ``(N, *shape)`` array as ``<field>.npy``; returns the paths."""
    os.makedirs(directory, exist_ok=True)
    paths = {}
    for name, arr in reference.items():
        paths[name] = os.path.join(directory, f"{name}.npy")
        mm = np.lib.format.open_memmap(paths[name], mode="w+", dtype=arr.dtype, shape=arr.shape)
        mm[...] = arr
        mm.flush()
        del mm
    return paths


class MemmapDataset(Dataset):
    """Rows of ``.npy`` memmaps, a whole batch per ``__getitems__`` call (already collated).

    Use with ``collate_fn=passthrough``. Output: ``{field: float32 (B, *shape)}`` scaled like
    ``H5Dataset(as_float=True)``, allocated in shared memory inside DataLoader workers.
    """

    def __init__(self, paths: dict[str, str]):
        self.paths = dict(paths)
        self._maps: dict[str, np.ndarray] | None = None
        self.n = int(np.load(next(iter(self.paths.values())), mmap_mode="r").shape[0])
        self._pool = shared_pool()

    def __len__(self) -> int:
        return self.n

    def __getstate__(self) -> dict[str, Any]:
        return {**self.__dict__, "_maps": None}

    def _open(self) -> dict[str, np.ndarray]:
        if self._maps is None:
            self._maps = {k: np.load(p, mmap_mode="r") for k, p in self.paths.items()}
        return self._maps

    def __getitem__(self, i: int) -> dict[str, torch.Tensor]:
        return {k: v[0] for k, v in self.__getitems__([i]).items()}

    def __getitems__(self, indices: Sequence[int]) -> dict[str, torch.Tensor]:
        idx = np.asarray(indices, dtype=np.int64)
        shared = get_worker_info() is not None
        maps = self._open()
        # Allocated like the h5batch reader's batches (one recycled shared storage inside a
        # worker), so the limit is not handicapped by an extra copy or fresh pages.
        tensors = empty_columns([((len(idx), *mm.shape[1:]), np.float32) for mm in maps.values()],
                                shared, self._pool)
        out = {}
        for (name, mm), t in zip(maps.items(), tensors):
            view = t.numpy()
            # Row by row, converting as it copies, on the same threads as the h5batch reader.
            copy_all([(view[j], mm[i]) for j, i in enumerate(idx.tolist())], to_float_into)
            out[name] = t
        return out


def passthrough(batch: Any) -> Any:
    """``collate_fn`` for datasets whose ``__getitems__`` already returns the batch."""
    return batch


class FloatCollate:
    """Stack per-sample dicts of int16/uint8 arrays into float32 batch tensors.

    Same scaling as ``H5Dataset(as_float=True)``; variable-length 1-D fields are zero-padded
    to the longest sample with ``<field>_lengths`` (like ``h5batch.torch.collate``). Keys
    other than arrays (``__key__``, ``index``) are collected into lists.
    """

    def __init__(self) -> None:
        self._pool = shared_pool()  # the h5batch reader's recycled shared memory

    def __call__(self, samples: Sequence[dict[str, Any]]) -> dict[str, Any]:
        shared = get_worker_info() is not None
        out: dict[str, Any] = {}
        arrays: dict[str, tuple[list[np.ndarray], tuple[int, ...]]] = {}
        for key in samples[0]:
            vals = [s[key] for s in samples]
            first = vals[0]
            if not isinstance(first, np.ndarray) or first.ndim == 0:
                out[key] = vals
                continue
            top = tuple(max(v.shape[d] for v in vals) for d in range(first.ndim))
            arrays[key] = (vals, top)
        # One (recycled) shared storage for all columns, as the h5batch reader allocates.
        tensors = empty_columns([((len(vals), *top), np.float32) for vals, top in arrays.values()],
                                shared, self._pool)
        for (key, (vals, top)), t in zip(arrays.items(), tensors):
            view = t.numpy()
            padded = any(v.shape != top for v in vals)
            if padded:
                view.fill(0)
            copy_all([(view[(j, *(slice(0, n) for n in v.shape))], v) for j, v in enumerate(vals)],
                     to_float_into)  # on the same threads as the h5batch reader
            out[key] = t
            if padded:
                out[key + "_lengths"] = torch.tensor([v.shape[0] for v in vals], dtype=torch.int64)
        return out


float_collate = FloatCollate()
