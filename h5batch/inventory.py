"""What an output remembers of its inputs, so that ``h5batch sync`` can tell what changed.

Rule: every finished output holds ``/inventory``: per manifest item (a sample, or an item
that a worker rejected) its *key*, the item's first path (one file belongs to one item
only), and its *stamp*, 64 bits of a hash over everything discovery knows that decides the
sample's content: each file's path, size and mtime, the label name and the annotation
values. Reason: a later discovery finds a changed file, a relabelled one or an edited
annotation cell by comparing stamps, without reading one file's content; the split is left
out on purpose, as a file keeps the split it was given when it was first converted.

Since version 2 it also remembers what discovery saw, so that a sync can rediscover
incrementally (:mod:`h5batch.layouts.incremental`): ``stat`` (size, mtime_ns of each key's
file, aligned with ``key``), ``order`` (the manifest's item order, as indexes into ``key``),
``record`` + ``record_end`` (the bytes the manifest hash took from each item, in manifest
order: :class:`~h5batch.manifest.Memo`) and the attribute ``memo`` (JSON: the annotation
files' stats, the split order, whether items depended on each other). A file without them
is synced by a full discovery, which writes them.

The driver writes the stamps of its manifest to a sidecar ``<partial>.inventory.npz``
before the writer starts; the writer folds it into the file when it finishes (the driver
never opens the HDF5 file).
"""

from __future__ import annotations

import hashlib
import json
import os
from dataclasses import dataclass

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


VERSION = 2
EXTRA = ("stat", "order", "record", "record_end")  # version 2's datasets, beside key and stamp


@dataclass
class Memory:
    """An output's inventory as arrays (version 2): what a sync's incremental discovery
    compares the corpus with. ``keys`` are sorted; ``order[i]`` is the index into them of
    manifest item ``i``; ``record[record_end[i-1]:record_end[i]]`` its hash record."""

    keys: np.ndarray  # str
    stamps: np.ndarray  # int64
    stat: np.ndarray  # int64 (n, 2): size, mtime_ns
    order: np.ndarray  # int64
    record: np.ndarray  # uint8
    record_end: np.ndarray  # int64
    inputs: list
    splits: list[str]
    plain: bool

    def record_of(self, i: int) -> bytes:
        """The hash record of manifest item ``i``."""
        return self.record[(self.record_end[i - 1] if i else 0):self.record_end[i]].tobytes()


def of_manifest(m: Manifest) -> tuple[np.ndarray, np.ndarray, dict]:
    """(keys, stamps, extra) of every item of ``m``: keys sorted (a str array), their int64
    stamps, and version 2's arrays (:data:`EXTRA`, ``memo``) when the manifest has a memo."""
    keys = np.array([it.paths[0] for it in m.items], dtype=object).astype(str) if m.items else np.zeros(0, dtype=str)
    stamps_ = np.asarray(stamps(m), dtype=np.int64)
    stat = np.array([m.stats.get(it.paths[0]) or (-1, -1) for it in m.items], dtype=np.int64).reshape(-1, 2)
    order = np.argsort(keys, kind="stable") if len(keys) else np.zeros(0, dtype=np.int64)
    memo = m.memo
    if memo is None or len(memo.records) != len(m.items):
        return keys[order], stamps_[order], {}
    position = np.empty_like(order)
    position[order] = np.arange(len(order))
    record = np.frombuffer(b"".join(memo.records), dtype=np.uint8)
    ends = np.cumsum([len(r) for r in memo.records], dtype=np.int64)
    extra = {"stat": stat[order], "order": position, "record": record, "record_end": ends,
             "memo": memo_json(memo.inputs, memo.splits, memo.plain)}
    return keys[order], stamps_[order], extra


def memo_json(inputs: list, splits: list[str], plain: bool) -> str:
    return json.dumps({"version": VERSION, "inputs": inputs, "splits": list(splits), "plain": bool(plain)})


def sidecar(partial: str) -> str:
    return partial + SIDECAR_SUFFIX


def write_sidecar(partial: str, m: Manifest) -> str:
    """Write the manifest's inventory beside the partial output (replaced atomically)."""
    return write_arrays(partial, *of_manifest(m))


def write_arrays(partial: str, keys: np.ndarray, stamps_: np.ndarray, extra: dict) -> str:
    """Write an inventory (sorted keys, their stamps, version 2's arrays) as the sidecar."""
    path = sidecar(partial)
    tmp = path + ".tmp"
    with open(tmp, "wb") as fh:
        np.savez(fh, keys=np.asarray(keys).astype(str), stamps=stamps_, **extra)
    os.replace(tmp, path)
    return path


def read_sidecar(path: str) -> tuple[np.ndarray, np.ndarray, dict]:
    with np.load(path, allow_pickle=False) as z:
        extra = {k: (str(z[k]) if k == "memo" else z[k]) for k in (*EXTRA, "memo") if k in z.files}
        return z["keys"], z["stamps"], extra


def remove_sidecar(partial: str) -> None:
    try:
        os.unlink(sidecar(partial))
    except FileNotFoundError:
        pass


def store(f, keys: np.ndarray, stamps: np.ndarray, extra: dict | None = None) -> None:
    """Write (replace) ``/inventory`` of an open writable h5py file."""
    import h5py

    if GROUP in f:
        del f[GROUP]
    g = f.create_group(GROUP)
    g.create_dataset(KEY, data=np.asarray(keys, dtype=object), dtype=h5py.string_dtype("utf-8"))
    g.create_dataset(STAMP, data=np.asarray(stamps, dtype=np.int64))
    extra = extra or {}
    if all(k in extra for k in (*EXTRA, "memo")):
        for k in EXTRA:
            g.create_dataset(k, data=extra[k])
        g.attrs["memo"] = extra["memo"]


def load(f) -> dict[str, int] | None:
    """key -> stamp of an open file; None for a file written before inventories existed."""
    if GROUP not in f:
        return None
    g = f[GROUP]
    keys = g[KEY].asstr()[...] if g[KEY].shape[0] else []
    return dict(zip((str(k) for k in keys), (int(s) for s in g[STAMP][...])))


def memory(f) -> Memory | str:
    """The inventory of an open file as a :class:`Memory`, or why there is none to use."""
    if GROUP not in f:
        return "the output has no inventory"
    g = f[GROUP]
    if "memo" not in g.attrs or any(k not in g for k in EXTRA):
        return "the output's inventory predates incremental discovery (version 1)"
    memo = json.loads(g.attrs["memo"])
    if memo.get("version") != VERSION:
        return f"the output's inventory is version {memo.get('version')}, this h5batch reads {VERSION}"
    n = g[KEY].shape[0]
    keys = g[KEY].asstr()[...].astype(str) if n else np.zeros(0, dtype=str)
    return Memory(keys, g[STAMP][...], g["stat"][...].reshape(-1, 2), g["order"][...], g["record"][...],
                  g["record_end"][...], memo["inputs"], list(memo["splits"]), bool(memo["plain"]))
