"""What an output remembers of its inputs, so that ``h5batch sync`` can tell what changed.

Rule: every finished output holds ``/inventory``: per manifest item its *key* (the item's
first path) and *stamp*, 64 bits of a hash over each file's path, size and mtime, the label
name and annotation values. Reason: a changed, relabelled or re-annotated file is found by
comparing stamps, without reading content; the split is left out, as a file keeps the split
it was first converted with.

Version 2 adds what discovery saw, for :mod:`h5batch.layouts.incremental`: ``stat`` (size,
mtime_ns per key), ``order`` (manifest order as indexes into ``key``), ``record`` +
``record_end`` (the bytes hashed per item: :class:`~h5batch.manifest.Memo`) and the ``memo``
attribute (JSON). A file without them is synced by full discovery, which writes them.

Version 3 stores ``key`` as one ``uint8`` dataset of NUL-ended UTF-8 keys. Reason: h5py
handles variable-length strings one object at a time. Version 2 files are still read.
Undecodable name bytes (surrogate escapes) are stored as on disk.

The driver writes the stamps to a sidecar ``<partial>.inventory.npy`` before the first
batch; the writer folds it in at finish (the driver never opens the HDF5 file). The sidecar
is concatenated ``.npy`` arrays, not a zip, whose CRCs would cost every sync for nothing.
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import tempfile
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from .forking import return_free_memory
from .manifest import SORT_BLOCK, Item, Manifest, byte_order

GROUP = "inventory"
KEY = "key"
STAMP = "stamp"
SIDECAR_SUFFIX = ".inventory.npy"
BLOCK = 1 << 20  # bytes of a sidecar array read and stored at once


def stamp(item: Item) -> int:
    """The 63-bit stamp of ``item`` (see the module docstring). ``repr`` of plain tuples of
    str, int and None is stable across runs and Python versions, and several times cheaper
    than JSON: this runs once per sample of the corpus."""
    text = repr((item.paths, item.stats, item.label, item.values))
    return int.from_bytes(hashlib.blake2b(text.encode(), digest_size=8).digest(), "little") >> 1


def stamps(m: Manifest) -> np.ndarray:
    """The stamp of every item of ``m``, in item order, as int64 (worked out once per manifest)."""
    cached = getattr(m, "_stamps", None)
    if cached is None or len(cached) != len(m.items):
        cached = m._stamps = np.fromiter((stamp(it) for it in m.items), dtype=np.int64,  # type: ignore[attr-defined]
                                         count=len(m.items))
    return cached


VERSION = 3
READS = (2, 3)  # the versions memory() reads (2: keys as variable-length strings)
EXTRA = ("stat", "order", "record", "record_end")  # version 2's datasets, beside key and stamp
_UTF8 = ("utf-8", "surrogateescape")


def keys_blob(keys: list[str]) -> np.ndarray:
    """Sorted keys as version 3 stores them: UTF-8, each ended by a NUL byte."""
    if not keys:
        return np.zeros(0, dtype=np.uint8)
    return np.frombuffer(("\0".join(keys) + "\0").encode(*_UTF8), dtype=np.uint8)


def keys_of_blob(blob: np.ndarray) -> list[str]:
    """The keys of a :func:`keys_blob` (a list of str)."""
    return blob.tobytes().decode(*_UTF8).split("\0")[:-1] if len(blob) else []


def read_keys(ds) -> list[str]:
    """The keys of an open ``/inventory/key`` dataset, either version's."""
    if not ds.shape[0]:
        return []
    if ds.dtype.kind == "O":  # version 1 and 2: one variable-length string per key
        return [str(k) for k in ds.asstr()[...]]
    return keys_of_blob(ds[...])


@dataclass
class Memory:
    """An output's inventory as arrays (version 2 or 3): what a sync's incremental discovery
    compares the corpus with. ``keys`` (a list of str) are sorted; ``order[i]`` is the index
    into them of manifest item ``i``; ``record[record_end[i-1]:record_end[i]]`` its hash
    record."""

    keys: list[str]
    stamps: np.ndarray  # int64
    stat: np.ndarray  # int64 (n, 2): size, mtime_ns
    order: np.ndarray  # int64
    record: np.ndarray  # uint8
    record_end: np.ndarray  # int64
    inputs: list
    splits: list[str]
    plain: bool

    def find(self, paths: list[str]) -> np.ndarray:
        """The index into ``keys`` of each of ``paths`` (-1: not a key)."""
        index = dict(zip(self.keys, range(len(self.keys))))
        return np.fromiter((index.get(p, -1) for p in paths), dtype=np.int64, count=len(paths))


def of_manifest(m: Manifest, stream: bool = False) -> tuple:
    """(keys, stamps, extra) of every item of ``m``: keys sorted, as their :func:`keys_blob`,
    their int64 stamps, and version 2's arrays (:data:`EXTRA`, ``memo``) when the manifest has
    a memo.

    ``stream``: what :func:`write_arrays` writes one at a time, each made at its turn and let
    go once written: a function that returns an array, ``record`` as parts (``record_end``
    whole once they are read). Reason: made together, the arrays were the peak of a 1M-file
    run (~120 bytes a file beside the manifest); only the keys' order is kept throughout.
    The keys are sorted from the manifest's buffer (:func:`~h5batch.manifest.byte_order`), with
    no str per key."""
    from .layouts.records import item_record

    buf, lo, hi = m.items.first_paths()
    order = byte_order(buf, lo, hi)[0]
    del buf, lo, hi
    later = (lambda make: make) if stream else (lambda make: make())
    keys = later(lambda: _keys_blob(m.items, order))
    stamps_ = later(lambda: stamps(m)[order])
    if m.memo is None:
        return keys, stamps_, {}
    record_end = np.empty(len(order), dtype=np.int64)

    def record():
        """The bytes the manifest hash took from each item (see Memo), in parts of about
        :data:`BLOCK` bytes, filling ``record_end`` as they go (it is stored after them)."""
        part, done = bytearray(), 0
        for i, it in enumerate(m.items):
            part += item_record(it, it.stats)
            record_end[i] = done + len(part)
            if len(part) >= BLOCK:
                done += len(part)
                yield bytes(part)
                part.clear()
        yield bytes(part)

    def position():
        out = np.empty_like(order)
        out[order] = np.arange(len(order))
        return out

    extra = {"stat": later(lambda: m.items.first_stats(order)), "order": later(position), "record_end": record_end,
             "record": record() if stream else np.frombuffer(b"".join(record()), dtype=np.uint8),
             "memo": memo_json(m.memo.inputs, m.memo.splits, m.memo.plain)}
    return keys, stamps_, extra


def _keys_blob(items, order: np.ndarray) -> np.ndarray:
    """The :func:`keys_blob` of the items' first paths in ``order``, joined from the
    manifest's buffer."""
    buf, lo, hi = items.first_paths()
    out = bytearray()
    for b in range(0, len(order), SORT_BLOCK):  # stored with surrogateescape, as keys_blob encodes
        at = order[b:b + SORT_BLOCK]
        part = b"\0".join(buf[x:y].tobytes() for x, y in zip(lo[at].tolist(), hi[at].tolist()))
        out += (part + b"\0").decode("utf-8", "surrogatepass").encode(*_UTF8)
    return np.frombuffer(out, dtype=np.uint8)


def memo_json(inputs: list, splits: list[str], plain: bool) -> str:
    return json.dumps({"version": VERSION, "inputs": inputs, "splits": list(splits), "plain": bool(plain)})


def sidecar(partial: str) -> str:
    return partial + SIDECAR_SUFFIX


def write_sidecar(partial: str, m: Manifest) -> str:
    """Write the manifest's inventory beside the partial output (replaced atomically), one
    array at a time (:func:`of_manifest` ``stream``), and give the heap's free pages back
    (:func:`h5batch.forking.return_free_memory`): the driver writes it beside its writer and
    decoders, for the rest of the run."""
    path = write_arrays(partial, *of_manifest(m, stream=True))
    return_free_memory()
    return path


def write_arrays(partial: str, keys, stamps_, extra: dict) -> str:
    """Write an inventory as the sidecar: the sorted keys (a list of str, or their
    :func:`keys_blob`), their stamps, and version 2's arrays; any of them may be a function
    that makes it, called at its turn (:func:`of_manifest` ``stream``), ``record`` an
    iterable of parts."""
    path = sidecar(partial)
    tmp = path + ".tmp"
    arrays: list = [keys, stamps_]
    if extra:
        arrays += [extra[k] for k in EXTRA] + [np.frombuffer(extra["memo"].encode(), dtype=np.uint8)]
    del keys, stamps_, extra
    with open(tmp, "wb") as fh:
        for i in range(len(arrays)):
            a, arrays[i] = arrays[i], None  # let go once written
            a = a() if callable(a) else a
            if i == 0 and isinstance(a, list):  # the keys as str
                a = keys_blob(a)
            if i == 1:  # the stamps
                a = np.asarray(a, dtype=np.int64)
            if isinstance(a, np.ndarray):
                np.save(fh, a, allow_pickle=False)
            else:  # parts of a uint8 array, spooled: the .npy header holds its length
                with tempfile.TemporaryFile(dir=os.path.dirname(os.path.abspath(path))) as spool:
                    for part in a:
                        spool.write(part)
                    np.lib.format.write_array_header_1_0(fh, {"descr": "|u1", "fortran_order": False,
                                                              "shape": (spool.tell(),)})
                    spool.seek(0)
                    shutil.copyfileobj(spool, fh, BLOCK)
            del a
    os.replace(tmp, path)
    return path


def store_sidecar(f, path: str) -> None:
    """Write (replace) ``/inventory`` of an open writable h5py file from a sidecar, read and
    written in blocks of :data:`BLOCK` bytes. Reason: the writer folds it in at finish, beside
    everything else it holds; the records alone are ~100 bytes a file."""
    size = os.path.getsize(path)
    names = (KEY, STAMP, *EXTRA, "memo")
    g = _new_group(f)
    count = 0
    with open(path, "rb") as fh:
        while fh.tell() < size and count < len(names):
            shape, _, dtype = np.lib.format.read_array_header_1_0(fh) \
                if np.lib.format.read_magic(fh) == (1, 0) else np.lib.format.read_array_header_2_0(fh)
            if names[count] == "memo":
                g.attrs["memo"] = fh.read(shape[0]).decode()
            else:
                ds = g.create_dataset(names[count], shape=shape, dtype=dtype)
                step = max(1, BLOCK // (dtype.itemsize * int(np.prod(shape[1:]))))
                for lo in range(0, shape[0], step):
                    rows = min(step, shape[0] - lo)
                    ds[lo:lo + rows] = np.fromfile(fh, dtype=dtype, count=rows * int(np.prod(shape[1:]))).reshape(
                        (rows, *shape[1:]))
            count += 1
        if count not in (2, len(names)) or fh.tell() < size:
            more = " and more" if fh.tell() < size else ""
            raise ValueError(f"{path}: {count} arrays{more}, not an inventory sidecar")


def remove_sidecar(partial: str) -> None:
    Path(sidecar(partial)).unlink(missing_ok=True)


def _new_group(f):
    if GROUP in f:
        del f[GROUP]
    return f.create_group(GROUP)


def load(f) -> dict[str, int] | None:
    """key -> stamp of an open file; None for a file written before inventories existed."""
    if GROUP not in f:
        return None
    g = f[GROUP]
    return dict(zip(read_keys(g[KEY]), g[STAMP][...].tolist()))


def memory(f) -> Memory | str:
    """The inventory of an open file as a :class:`Memory`, or why there is none to use."""
    if GROUP not in f:
        return "the output has no inventory"
    g = f[GROUP]
    if "memo" not in g.attrs or any(k not in g for k in EXTRA):
        return "the output's inventory predates incremental discovery (version 1)"
    # Rule: an inventory that does not parse or whose arrays disagree is a reason for a full
    # discovery (which rewrites it), never a traceback: it is a cache of what the file holds.
    try:
        memo = json.loads(g.attrs["memo"])
        if not isinstance(memo, dict):
            raise ValueError("the memo is not a JSON object")
        if memo.get("version") not in READS:
            return f"the output's inventory is version {memo.get('version')}, this h5batch reads {READS}"
        mem = Memory(read_keys(g[KEY]), g[STAMP][...],
                     g["stat"][...].reshape(-1, 2), g["order"][...], g["record"][...], g["record_end"][...],
                     memo["inputs"], list(memo["splits"]), bool(memo["plain"]))
        n = len(mem.keys)
        sizes = {"stamp": len(mem.stamps), "stat": len(mem.stat), "order": len(mem.order),
                 "record_end": len(mem.record_end)}
        bad = [k for k, v in sizes.items() if v != n]
        if bad:
            raise ValueError(f"{n} keys but {', '.join(f'{sizes[k]} {k} rows' for k in bad)}")
        if n and int(mem.record_end[-1]) != len(mem.record):
            raise ValueError(f"record ends at {int(mem.record_end[-1])} of {len(mem.record)} bytes")
    except (ValueError, KeyError, TypeError, OSError, UnicodeDecodeError) as e:
        return f"the output's inventory is unreadable ({e})"
    return mem
