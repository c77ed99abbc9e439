"""The strict read limit (issue 19): one numpy fancy-index read of a float32 memmap per batch.

Rule: the limit is what a training script gets with no storage format at all, the decoded
float32 array in a ``numpy.memmap`` (page cache hot) and per batch
``torch.from_numpy(mm[np.sort(idx)])`` for each field: one fancy-index gather, no
conversion, no thread, no recycled memory (:class:`StrictMemmapDataset`). In a DataLoader
worker that tensor is not in shared memory, so torch copies it into a fresh shared storage
before it crosses to the main process; that copy is part of the limit at ``num_workers > 0``,
which is why the targets ask h5batch for >= 0.7x it in process and >= 1.5x it with workers.
(The suite's other memmap row, ``memmap-int16-rowwise``, converts int16 row by row on
h5batch's threads into recycled shared memory: a baseline built like the reader, not a limit.)

Why a phase of its own: h5batch is judged against the limit on four storages of the same
samples, each field stored ``int16`` (read ``as_float``) or ``float32``, ``fixed`` (``length``
set: ``(N, 32000)`` chunks) or ``variable`` (no ``length``: values + offsets, although every
clip happens to be 2 s), so all four deliver exactly the limit's arrays; the phase checks that
they do. The files are converted once, untimed, on the bench's cluster (the main corpus's
default-codec output is the int16 fixed one); ``codec: none`` is added where ``auto`` chose
anything else. Each is read with ``H5Dataset(path, "train").loader(batch_size, num_workers)``
in the read phase, interleaved with every other configuration, each row in a fresh
process (:func:`h5batch.bench.strict_ab.read_plan`).
"""

from __future__ import annotations

import dataclasses
import io
import os
from collections.abc import Sequence
from typing import Any

import numpy as np

from .converts import field_codecs
from .records import DEFAULT_CODEC, STRICT_STORAGES

__all__ = ["StrictMemmapDataset", "convert_storages", "prepare", "storage_corpus"]


class StrictMemmapDataset:
    """Float32 ``.npy`` memmaps, a batch per ``__getitems__``: ``torch.from_numpy(mm[np.sort(idx)])``.

    A map-style dataset (use with ``collate_fn=baselines.passthrough``); the maps are opened
    on first use in each process and dropped when pickled. Rows come back in ascending index
    order (the sort is part of the recipe: numpy gathers sorted rows fastest).
    """

    def __init__(self, paths: dict[str, str]):
        self.paths = dict(paths)
        self.n = int(np.load(next(iter(self.paths.values())), mmap_mode="r").shape[0])
        self._maps: dict[str, np.ndarray] | None = None

    def __len__(self) -> int:
        return self.n

    def __getstate__(self) -> dict[str, Any]:
        return {**self.__dict__, "_maps": None}

    def __getitem__(self, i: int) -> dict[str, Any]:
        return {k: v[0] for k, v in self.__getitems__([i]).items()}

    def __getitems__(self, indices: Sequence[int]) -> dict[str, Any]:
        import torch

        if self._maps is None:
            self._maps = {k: np.load(p, mmap_mode="r") for k, p in self.paths.items()}
        idx = np.sort(np.asarray(indices, dtype=np.int64))
        return {k: torch.from_numpy(mm[idx]) for k, mm in self._maps.items()}


def write_float_memmaps(reference: dict[str, np.ndarray], directory: str) -> dict[str, str]:
    """Each int16 field of ``reference`` as float32 ``x / 32768`` in ``<field>.npy`` (the
    values ``H5Dataset(as_float=True)`` delivers; the scale is exact)."""
    os.makedirs(directory, exist_ok=True)
    paths = {}
    for name, arr in reference.items():
        if arr.dtype != np.int16:
            raise ValueError(f"strict memmap: field {name!r} is {arr.dtype}, expected int16 audio")
        paths[name] = os.path.join(directory, f"{name}.npy")
        mm = np.lib.format.open_memmap(paths[name], mode="w+", dtype=np.float32, shape=arr.shape)
        np.multiply(arr, np.float32(1.0 / 32768.0), out=mm, casting="unsafe")
        mm.flush()
        del mm
    return paths


def storage_corpus(cp: Any, dtype: str, fixed: bool) -> Any:
    """The audio corpus ``cp`` with every field stored as ``dtype``, ``fixed`` or variable."""
    fields = {}
    for name, f in cp.fields.items():
        f = {**f, "dtype": dtype}
        if not fixed:
            f.pop("length", None)
        fields[name] = f
    return dataclasses.replace(cp, fields=fields, fixed=fixed)


def _storage_label(dtype: str, fixed: bool) -> str:
    return f"{dtype}-{'fixed' if fixed else 'variable'}"


def convert_storages(bench: Any, spec: dict[str, Any]) -> None:
    """Convert the main corpus once per storage (untimed) on the bench's running cluster;
    ``spec["strict_files"]`` becomes ``[(dtype, fixed, codec, path, field_codecs)]``."""
    from ..conversion.options import ConvertOptions
    from ..conversion.pipeline import convert

    cp = spec["corpus"]
    if cp.kind != "audio" or not cp.fixed:
        return
    addr = {"kind": "address", "address": bench.cluster.scheduler_address, "workers": bench.cfg.dask_workers}
    files: list[tuple[str, bool, str, str, dict[str, str]]] = []
    for dtype, fixed in STRICT_STORAGES:
        codecs = [DEFAULT_CODEC]
        while codecs:
            codec = codecs.pop(0)
            main = bench.records.get(f"convert/{cp.name}/h5batch/{codec}")
            if dtype == "int16" and fixed and main is not None and os.path.exists(main.info.get("path", "")):
                path = main.info["path"]  # the main corpus's own output is this storage
            else:
                path = bench.path("strict", f"{cp.name}-{_storage_label(dtype, fixed)}-{codec}.h5")
                if os.path.exists(path):
                    os.unlink(path)
                job = storage_corpus(cp, dtype, fixed).job(path, codec, addr)
                convert(job, ConvertOptions(overwrite=True, restart=True, progress="none", log=io.StringIO()))
            chosen = field_codecs(path)
            files.append((dtype, fixed, codec, path, chosen))
            if codec == DEFAULT_CODEC and any(c.split("-")[0] != "none" for c in chosen.values()):
                codecs.append("none")  # auto compressed: the uncompressed file is measured too
    spec["strict_files"] = files
    bench.say(f"strict limit: {len(files)} storages of {cp.name} converted")


def prepare(bench: Any, spec: dict[str, Any], reference: dict[str, np.ndarray], train: int) -> None:
    """Write the float32 memmap of the train rows and check that every storage's file reads
    back (``H5Dataset``, float32) exactly as it (the check phase calls it)."""
    if not spec.get("strict_files"):
        return
    from ..torch import H5Dataset

    cp = spec["corpus"]
    paths = write_float_memmaps({k: v[:train] for k, v in reference.items()}, bench.folder("strict-memmap", cp.name))
    spec["strict_memmap"] = paths
    maps = {k: np.load(p, mmap_mode="r") for k, p in paths.items()}
    for dtype, fixed, codec, path, _ in spec["strict_files"]:
        ok = True
        with H5Dataset(path, "train") as ds:
            ok = len(ds) == train
            for lo in range(0, train if ok else 0, 256):
                got = ds.__getitems__(range(lo, min(lo + 256, train)))
                for name, mm in maps.items():
                    col = got.columns[name]
                    t = col if fixed else col.padded
                    ok = ok and t.dtype.is_floating_point and np.array_equal(t.numpy(), mm[lo: lo + len(t)])
        bench._check(f"{cp.name}: h5batch {_storage_label(dtype, fixed)} {codec} reads back equal to the "
                     "strict limit's float32 memmap", ok)
