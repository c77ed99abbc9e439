"""The conversion rows' programs: what each writer runs, in a process of its own.

* h5batch: :func:`convert_argv`, the whole ``h5batch convert JOB --json`` command on a job
  file that gives only the corpus, its fields and the output (``cluster`` at its defaults).
* :func:`naive_convert`: the recipe of most tutorials, one process that decodes the files
  one by one and stores every sample as its own HDF5 dataset, ``compression="gzip"``,
  ``chunks=True``.
* :func:`wds_convert`: WebDataset's ``ShardWriter`` (``.npy`` members), in ``processes``
  forked processes each writing its own shards.
* :func:`litdata_convert`: ``litdata.optimize(fn, inputs, num_workers)``, its default start method.

The naive recipe and the peers run as scripts (:func:`h5batch.bench.measure.call`): a new
interpreter that imports what the writer's own module imports, as a user's script does.
Every writer decodes with :func:`h5batch.fields.decode_field`, so all outputs hold the same
arrays. Each script returns ``samples``, ``bytes_decoded`` and ``seconds`` (its own work,
after its imports).
"""

from __future__ import annotations

import importlib
import os
import shutil
import sys
import time
from collections.abc import Sequence
from functools import partial
from typing import Any

from ..fields import FieldConfig, decode_field

PEERS = ("webdataset", "litdata")
NAIVE_GROUP = "samples"

Items = Sequence[tuple[str, ...]]  # each sample's files, one absolute path per field
Fields = Sequence[tuple[str, FieldConfig]]


def available(name: str) -> tuple[bool, str]:
    """``(True, version)`` when peer ``name`` imports, else ``(False, why)``."""
    try:
        mod = importlib.import_module(name)
    except Exception as e:  # an optional dependency can fail in many ways; say how
        return False, f"{type(e).__name__}: {e}"
    return True, str(getattr(mod, "__version__", "?"))


def dir_bytes(path: str) -> int:
    """Bytes of all files under ``path`` (or of the file ``path``)."""
    if os.path.isfile(path):
        return os.path.getsize(path)
    return sum(os.path.getsize(os.path.join(d, f)) for d, _, files in os.walk(path) for f in files)


def remove_output(path: str) -> None:
    """Remove the previous round's output before a timed conversion: every writer would
    otherwise spend part of its time dropping the old file's cached pages, which a first
    conversion does not pay."""
    if os.path.isdir(path):
        shutil.rmtree(path)
    elif os.path.exists(path):
        os.unlink(path)


def convert_argv(job_file: str) -> list[str]:
    """``h5batch convert`` of ``job_file`` as a user runs it, with a JSON summary on stdout."""
    return [sys.executable, "-m", "h5batch.cli", "convert", job_file, "--overwrite", "--progress", "none", "--json"]


def _decode(fields: Fields, paths: Sequence[str]) -> dict[str, Any]:
    return {name: decode_field(p, fc) for (name, fc), p in zip(fields, paths)}


def naive_convert(items: Items, fields: Fields, out_path: str) -> dict[str, Any]:
    """The naive recipe: sample ``i`` stored as ``/samples/<i>/<field>`` (``i`` zero-padded
    to 8 digits so the names sort), one gzip dataset per sample and field."""
    import h5py

    t0 = time.perf_counter()
    nbytes = 0
    with h5py.File(out_path, "w") as f:
        g = f.create_group(NAIVE_GROUP)
        for i, paths in enumerate(items):
            s = g.create_group(f"{i:08d}")
            for name, a in _decode(fields, paths).items():
                nbytes += a.nbytes
                s.create_dataset(name, data=a, compression="gzip", chunks=True)
    return {"samples": len(items), "bytes_decoded": nbytes, "seconds": time.perf_counter() - t0}


def naive_read_all(path: str, field: str) -> list[Any]:
    """Every sample of one field of a naive file, in order (for the correctness check)."""
    import h5py

    with h5py.File(path, "r") as f:
        g = f[NAIVE_GROUP]
        return [g[k][field][()] for k in sorted(g)]


def _wds_write(pattern: str, items: Items, start: int, fields: Fields, maxcount: int) -> int:
    import webdataset as wds

    nbytes = 0
    with wds.ShardWriter(pattern, maxcount=maxcount, verbose=0) as sink:
        for k, paths in enumerate(items):
            arrays = _decode(fields, paths)
            nbytes += sum(a.nbytes for a in arrays.values())
            sink.write({"__key__": f"{start + k:08d}", **{f"{n}.npy": a for n, a in arrays.items()}})
    return nbytes


def wds_convert(items: Items, fields: Fields, out_dir: str, processes: int = 2,
                maxcount: int = 256) -> dict[str, Any]:
    """``items`` as WebDataset shards, each of ``processes`` forked processes writing its own."""
    import multiprocessing as mp

    import webdataset  # noqa: F401 - the script's import, before its work is timed

    t0 = time.perf_counter()
    remove_output(out_dir)
    os.makedirs(out_dir)
    n = len(items)
    bounds = [n * r // processes for r in range(processes + 1)]
    parts = [(os.path.join(out_dir, f"shard-p{r:02d}-%06d.tar"), items[bounds[r]:bounds[r + 1]], bounds[r],
              tuple(fields), maxcount) for r in range(processes)]
    with mp.get_context("fork").Pool(processes) as pool:
        nbytes = sum(pool.starmap(_wds_write, parts, chunksize=1))
    return {"samples": n, "bytes_decoded": nbytes, "seconds": time.perf_counter() - t0}


def _lit_item(fields: Fields, item: tuple[int, Sequence[str]]) -> dict[str, Any]:
    """``optimize``'s ``fn``: one input ``(index, paths)`` -> one sample dict."""
    return {"index": int(item[0]), **_decode(fields, item[1])}


def litdata_convert(items: Items, fields: Fields, out_dir: str, num_workers: int = 2) -> dict[str, Any]:
    """``litdata.optimize`` over ``(index, paths)`` inputs, chunks of 64 MB."""
    import litdata

    t0 = time.perf_counter()
    remove_output(out_dir)
    litdata.optimize(fn=partial(_lit_item, tuple(fields)), inputs=[(i, tuple(p)) for i, p in enumerate(items)], output_dir=out_dir,
                     num_workers=num_workers, chunk_bytes="64MB", verbose=False, reorder_files=False,
                     mode="overwrite")
    return {"samples": len(items), "bytes_decoded": None, "seconds": time.perf_counter() - t0}
