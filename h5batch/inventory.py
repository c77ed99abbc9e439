"""What an output remembers of its inputs, so that ``h5batch sync`` can tell what changed.

Rule: every finished output holds ``/inventory``: per manifest item (a sample, or an item
that a worker rejected) its *key*, the item's first path (one file belongs to one item
only), and its *stamp*, 64 bits of a hash over everything discovery knows that decides the
sample's content: each file's path, size and mtime, the label name and the annotation
values. Reason: a later discovery finds a changed file, a relabelled one or an edited
annotation cell by comparing stamps, without reading one file's content; the split is left
out on purpose, as a file keeps the split it was given when it was first converted.

The driver writes the stamps of its manifest to a sidecar ``<partial>.inventory.npz``
before the writer starts; the writer folds it into the file when it finishes (the driver
never opens the HDF5 file).
"""

from __future__ import annotations

import hashlib
import os

import numpy as np

from .manifest import Item, Manifest

GROUP = "inventory"
KEY = "key"
STAMP = "stamp"
SIDECAR_SUFFIX = ".inventory.npz"


def stamp(item: Item, stats: dict) -> int:
    """The 63-bit stamp of ``item`` (see the module docstring). ``repr`` of plain tuples of
    str, int and None is stable across runs and Python versions, and several times cheaper
    than JSON: this runs once per sample of the corpus."""
    text = repr((item.paths, tuple(stats.get(p) for p in item.paths), item.label, item.values))
    return int.from_bytes(hashlib.blake2b(text.encode(), digest_size=8).digest(), "little") >> 1


def stamps(m: Manifest) -> list[int]:
    """The stamp of every item of ``m``, in item order (worked out once per manifest)."""
    cached = getattr(m, "_stamps", None)
    if cached is None or len(cached) != len(m.items):
        cached = [stamp(it, m.stats) for it in m.items]
        m._stamps = cached  # type: ignore[attr-defined]
    return cached


def of_manifest(m: Manifest) -> tuple[np.ndarray, np.ndarray]:
    """(keys, stamps) of every item of ``m``, sorted by key (a str array and an int64 one)."""
    keys = np.array([it.paths[0] for it in m.items], dtype=object)
    stamps_ = np.asarray(stamps(m), dtype=np.int64)
    order = np.argsort(keys.astype(str), kind="stable") if len(keys) else np.zeros(0, dtype=np.int64)
    return keys[order], stamps_[order]


def sidecar(partial: str) -> str:
    return partial + SIDECAR_SUFFIX


def write_sidecar(partial: str, m: Manifest) -> str:
    """Write the manifest's inventory beside the partial output (replaced atomically)."""
    keys, stamps = of_manifest(m)
    path = sidecar(partial)
    tmp = path + ".tmp"
    with open(tmp, "wb") as fh:
        np.savez(fh, keys=keys.astype(str), stamps=stamps)
    os.replace(tmp, path)
    return path


def read_sidecar(path: str) -> tuple[np.ndarray, np.ndarray]:
    with np.load(path, allow_pickle=False) as z:
        return z["keys"], z["stamps"]


def remove_sidecar(partial: str) -> None:
    try:
        os.unlink(sidecar(partial))
    except FileNotFoundError:
        pass


def store(f, keys: np.ndarray, stamps: np.ndarray) -> None:
    """Write (replace) ``/inventory`` of an open writable h5py file."""
    import h5py

    if GROUP in f:
        del f[GROUP]
    g = f.create_group(GROUP)
    g.create_dataset(KEY, data=np.asarray(keys, dtype=object), dtype=h5py.string_dtype("utf-8"))
    g.create_dataset(STAMP, data=np.asarray(stamps, dtype=np.int64))


def load(f) -> dict[str, int] | None:
    """key -> stamp of an open file; None for a file written before inventories existed."""
    if GROUP not in f:
        return None
    g = f[GROUP]
    keys = g[KEY].asstr()[...] if g[KEY].shape[0] else []
    return dict(zip((str(k) for k in keys), (int(s) for s in g[STAMP][...])))
