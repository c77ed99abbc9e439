"""Peers: WebDataset and LitData, converting the same files and read back as their docs say.

Both peers are optional (``requirements-peers.txt``); :func:`available` says why one cannot
run. Every peer decodes each sample's files with :func:`h5batch.fields.decode_field`, the
decoder h5batch uses, so all layouts hold identical arrays and :func:`verify` can check that
a peer's output holds every sample exactly once and equal to the decoded source.

* WebDataset: ``ShardWriter`` (``.npy`` members), in one process or in N processes each
  writing its own shards (``fork``, the Linux default start method of Python 3.11). Read with
  shard shuffle + a shuffle buffer + ``split_by_worker``, batched in the pipeline, through a
  ``DataLoader(batch_size=None)``.
* LitData: ``optimize(fn, inputs, num_workers=N)`` (its default ``spawn`` start method, and
  ``fork``). Read with ``StreamingDataset(shuffle=True)`` + ``StreamingDataLoader``, with the
  default ``batch_decode`` and with ``batch_decode=0`` (per item).

Batch assembly (``assembly=``): ``"docs"`` (the default) is what each peer's documentation
shows: every sample becomes float32 tensors in the dataset pipeline (WebDataset ``.map``, a
``StreamingDataset`` subclass), and the peer's default collation stacks them
(``webdataset``'s ``batched``, torch's ``default_collate`` in ``StreamingDataLoader``).
``"h5batch"`` hands the int16/uint8 samples to :class:`~h5batch.bench.baselines.FloatCollate`
instead, h5batch's own batch assembly (recycled shared memory, threaded filling), so a
comparison isolates the storage layout; the suite reports it beside the documented way.
"""

from __future__ import annotations

import glob
import importlib
import multiprocessing as mp
import os
import shutil
from collections.abc import Sequence
from typing import Any

import numpy as np

from ..fields import FieldConfig, decode_field
from .baselines import FloatCollate, float_sample

PEERS = ("webdataset", "litdata")
ASSEMBLIES = ("docs", "h5batch")
SHUFFLE_BUFFER = 1000  # WebDataset's documented example value


def available(name: str) -> tuple[bool, str]:
    """``(True, version)`` when peer ``name`` imports, else ``(False, why)``."""
    try:
        mod = importlib.import_module(name)
    except Exception as e:  # an optional dependency can fail in many ways; say how
        return False, f"{type(e).__name__}: {e}"
    return True, str(getattr(mod, "__version__", "?"))


def dir_bytes(path: str) -> int:
    """Bytes of all files under ``path``."""
    total = 0
    for dirpath, _, files in os.walk(path):
        for f in files:
            total += os.path.getsize(os.path.join(dirpath, f))
    return total


def _decode(fields: Sequence[tuple[str, FieldConfig]], paths: Sequence[str]) -> dict[str, np.ndarray]:
    return {name: decode_field(p, fc) for (name, fc), p in zip(fields, paths)}


# ---------------------------------------------------------------------------
# WebDataset
# ---------------------------------------------------------------------------


def _wds_write(pattern: str, items: Sequence[tuple[str, ...]], start: int,
               fields: Sequence[tuple[str, FieldConfig]], maxcount: int) -> int:
    import webdataset as wds

    nbytes = 0
    with wds.ShardWriter(pattern, maxcount=maxcount, verbose=0) as sink:
        for k, paths in enumerate(items):
            arrays = _decode(fields, paths)
            nbytes += sum(a.nbytes for a in arrays.values())
            sink.write({"__key__": f"{start + k:08d}", **{f"{n}.npy": a for n, a in arrays.items()}})
    return nbytes


def _wds_proc(args: tuple) -> int:
    return _wds_write(*args)


def wds_convert(items: Sequence[tuple[str, ...]], fields: Sequence[tuple[str, FieldConfig]],
                out_dir: str, processes: int = 1, maxcount: int = 256) -> dict[str, Any]:
    """Write ``items`` as WebDataset shards; ``processes > 1`` gives each process its own shards.

    Returns ``{"samples", "bytes_decoded", "output_bytes", "shards"}``.
    """
    if os.path.exists(out_dir):
        shutil.rmtree(out_dir)
    os.makedirs(out_dir)
    n = len(items)
    if processes <= 1:
        nbytes = _wds_write(os.path.join(out_dir, "shard-p00-%06d.tar"), items, 0, fields, maxcount)
    else:
        bounds = [n * r // processes for r in range(processes + 1)]
        jobs = [(os.path.join(out_dir, f"shard-p{r:02d}-%06d.tar"), items[bounds[r]:bounds[r + 1]],
                 bounds[r], tuple(fields), maxcount) for r in range(processes)]
        with mp.get_context("fork").Pool(processes) as pool:
            nbytes = sum(pool.map(_wds_proc, jobs, chunksize=1))
    shards = sorted(glob.glob(os.path.join(out_dir, "*.tar")))
    return {"samples": n, "bytes_decoded": nbytes, "output_bytes": dir_bytes(out_dir), "shards": len(shards)}


class _WdsSample:
    """``{"__key__", "<f>.npy"}`` -> ``{"<f>": array}`` (+ ``__key__`` when asked), as float32
    tensors when ``to_float`` (the documented way: transform per sample). Picklable."""

    def __init__(self, fields: Sequence[str], keys: bool, to_float: bool = False):
        self.fields = tuple(fields)
        self.keys = keys
        self.to_float = to_float

    def __call__(self, s: dict[str, Any]) -> dict[str, Any]:
        out = {n: float_sample(s[f"{n}.npy"]) if self.to_float else s[f"{n}.npy"] for n in self.fields}
        if self.keys:
            out["__key__"] = s["__key__"]
        return out


def wds_loader(out_dir: str, fields: Sequence[str], num_workers: int, batch_size: int = 64,
               keys: bool = False, seed: int = 0, assembly: str = "docs") -> Any:
    """A DataLoader over the shards of ``out_dir``: shard shuffle, shuffle buffer, split by
    worker; ``assembly`` as in the module docstring."""
    import torch
    import webdataset as wds

    docs = _check_assembly(assembly)
    shards = sorted(glob.glob(os.path.join(out_dir, "*.tar")))
    ds = (wds.WebDataset(shards, shardshuffle=len(shards), workersplitter=wds.split_by_worker,
                         empty_check=False, seed=seed)
          .shuffle(SHUFFLE_BUFFER)
          .decode()
          .map(_WdsSample(fields, keys, to_float=docs)))
    # webdataset's default collation stacks the tensors (and lists the keys)
    ds = ds.batched(batch_size, partial=True) if docs else \
        ds.batched(batch_size, collation_fn=FloatCollate(), partial=True)
    return torch.utils.data.DataLoader(ds, batch_size=None, num_workers=num_workers,
                                       persistent_workers=num_workers > 0)


# ---------------------------------------------------------------------------
# LitData
# ---------------------------------------------------------------------------


class _LitFn:
    """``optimize``'s ``fn``: one input ``(index, paths)`` -> one sample dict. Picklable."""

    def __init__(self, fields: Sequence[tuple[str, FieldConfig]]):
        self.fields = tuple(fields)

    def __call__(self, item: tuple[int, Sequence[str]]) -> dict[str, Any]:
        index, paths = item
        return {"index": int(index), **_decode(self.fields, paths)}


def litdata_convert(items: Sequence[tuple[str, ...]], fields: Sequence[tuple[str, FieldConfig]],
                    out_dir: str, num_workers: int = 2, start_method: str | None = None,
                    chunk_bytes: str = "64MB") -> dict[str, Any]:
    """``litdata.optimize`` over ``(index, paths)`` inputs; ``start_method`` None = LitData's default."""
    import litdata

    if os.path.exists(out_dir):
        shutil.rmtree(out_dir)
    inputs = [(i, tuple(p)) for i, p in enumerate(items)]
    litdata.optimize(fn=_LitFn(fields), inputs=inputs, output_dir=out_dir, num_workers=num_workers,
                     chunk_bytes=chunk_bytes, start_method=start_method, verbose=False,
                     reorder_files=False, mode="overwrite")
    return {"samples": len(items), "output_bytes": dir_bytes(out_dir)}


class _LitSample:
    def __init__(self, fields: Sequence[str], keys: bool, to_float: bool = False):
        self.fields = tuple(fields)
        self.keys = keys
        self.to_float = to_float

    def __call__(self, s: dict[str, Any]) -> dict[str, Any]:
        out = {n: float_sample(s[n]) if self.to_float else s[n] for n in self.fields}
        if self.keys:
            out["__key__"] = f"{int(s['index']):08d}"
        return out


class _LitCollate(FloatCollate):
    def __init__(self, fields: Sequence[str], keys: bool):
        super().__init__()
        self.pick = _LitSample(fields, keys)

    def __call__(self, samples: Sequence[dict[str, Any]]) -> dict[str, Any]:
        return super().__call__([self.pick(s) for s in samples])


def litdata_loader(out_dir: str, fields: Sequence[str], num_workers: int, batch_size: int = 64,
                   keys: bool = False, batch_decode: Any = "auto", cache_dir: str | None = None,
                   seed: int = 0, assembly: str = "docs") -> Any:
    """``StreamingDataset(shuffle=True)`` + ``StreamingDataLoader`` over ``out_dir``;
    ``assembly`` as in the module docstring."""
    import litdata

    kw = dict(shuffle=True, seed=seed, batch_decode=batch_decode, cache_dir=cache_dir)
    if _check_assembly(assembly):
        # Its ``transform`` makes each item float tensors; torch's default_collate stacks them.
        ds = litdata.StreamingDataset(out_dir, transform=_LitSample(fields, keys, to_float=True), **kw)
        return litdata.StreamingDataLoader(ds, batch_size=batch_size, num_workers=num_workers,
                                           persistent_workers=num_workers > 0)
    return litdata.StreamingDataLoader(litdata.StreamingDataset(out_dir, **kw), batch_size=batch_size,
                                       num_workers=num_workers, collate_fn=_LitCollate(fields, keys),
                                       persistent_workers=num_workers > 0)


def _check_assembly(assembly: str) -> bool:
    """True for the documented assembly; raises on an unknown name."""
    if assembly not in ASSEMBLIES:
        raise ValueError(f"assembly must be one of {ASSEMBLIES}, not {assembly!r}")
    return assembly == "docs"


# ---------------------------------------------------------------------------
# Correctness
# ---------------------------------------------------------------------------


def verify(loader: Any, reference: dict[str, np.ndarray], n: int) -> dict[str, Any]:
    """Read one epoch of ``loader`` (built with ``keys=True``) and compare with ``reference``.

    Checks that every key ``0..n-1`` appears exactly once and that each sample equals the
    decoded source (``reference[field][i]``, int16 / uint8, compared after the same float
    scaling the loaders apply). Returns ``{"ok", "samples", "missing", "duplicates",
    "mismatched"}``.
    """
    seen: dict[int, int] = {}
    mismatched = 0
    scale = {k: (1 / 32768.0 if v.dtype == np.int16 else 1 / 255.0) for k, v in reference.items()}
    for batch in loader:
        keys = [int(k) for k in batch["__key__"]]
        for j, i in enumerate(keys):
            seen[i] = seen.get(i, 0) + 1
            for name, ref in reference.items():
                got = batch[name][j].numpy()
                want = ref[i].astype(np.float32) * np.float32(scale[name]) if ref.dtype == np.int16 \
                    else ref[i].astype(np.float32) / np.float32(255.0)
                if got.shape != want.shape or not np.array_equal(got, want):
                    mismatched += 1
                    break
    missing = sum(1 for i in range(n) if i not in seen)
    dups = sum(c - 1 for c in seen.values() if c > 1)
    extra = sum(1 for i in seen if not 0 <= i < n)
    return {"ok": not (missing or dups or mismatched or extra), "samples": sum(seen.values()),
            "missing": missing, "duplicates": dups, "mismatched": mismatched}
