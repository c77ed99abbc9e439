"""Sharded outputs: the shard files of several writers, joined into one output file.

A job with ``output.writers: N`` (N > 1) has N writer processes, each writing one **shard**:
``NAME.shard-K-of-N.h5`` beside ``NAME.h5``, an ordinary complete h5batch output of a
contiguous range of the manifest's batches (root attribute ``shard``: its index, N and the
host that wrote it). :func:`join` then writes ``NAME.h5`` (format
:data:`~h5batch.format.SHARDED_FORMAT`), the last file of the run and so its commit:

* per split, every per-sample and value dataset a **virtual dataset** over the shards'
  (relative source paths: HDF5 finds them beside ``NAME.h5``), except each variable field's
  ``offsets``, which is real and rebased (a virtual dataset cannot add a shard's base);
* ``class_names``, the rejects (the shards' in shard order) and ``/inventory`` real copies;
* the root attributes of the shards' job, ``num_inputs`` of the whole corpus, and
  ``shards``: a JSON list of :class:`ShardRecord` (file name, bytes, sha256, host, rows).

``h5batch sync`` adds a shard (:func:`sync_shard_path`: ``NAME.shard-K.h5``, K the number
of shards so far) holding the new and changed samples and the corpus's rejects, class names,
inventory and attributes as they are now, then joins again, taking those from it and keeping
the old ``NAME.h5``'s views and tombstones, the removed rows added (rows of the joined
split). The old shards are never written, so the join's rename is a sync's commit too; a
shard left by an interrupted sync is removed by the next command that takes the lock
(:func:`strays`).

Sample ``i`` of a split is the same for any N: the shards hold consecutive manifest ranges
in order. BEWARE: HDF5 reads a missing virtual source as fill values without an error
(hdf5#5088): h5batch checks the shards itself (:func:`check`) before it reads anything, and
its reader then reads them directly, never through the virtual datasets (``verify`` reads
through them once every shard's sha256 matched).
"""

from __future__ import annotations

import hashlib
import json
import os
import re
from dataclasses import asdict, dataclass

import h5py
import numpy as np

from . import format as fmt
from .errors import EXIT_BAD_INPUT, CorruptFileError, MissingShardError

JOIN_SUFFIX = ".joining"  # NAME.h5 is written as NAME.h5.joining, renamed when whole


@dataclass(frozen=True)
class ShardRecord:
    """One shard as the joined file records it."""

    path: str  # file name, relative to the joined file's folder
    bytes: int
    sha256: str
    host: str  # the host whose writer wrote it
    rows: dict[str, int]  # samples per split
    created: str  # its root attribute: a shard written again since differs (the reader checks it)


def shard_path(final: str, k: int | str, n: int) -> str:
    """``out/x.h5`` -> ``out/x.shard-K-of-N.h5``."""
    stem, ext = os.path.splitext(final)
    return f"{stem}.shard-{k}-of-{n}{ext}"


def sync_shard_path(final: str, k: int) -> str:
    """``out/x.h5`` -> ``out/x.shard-K.h5``: the shard a sync adds as the output's ``K``-th
    (``K`` >= N: the conversion's N stays in its shards' names; the joined file's list of
    shards, not their names, says which belong to it)."""
    stem, ext = os.path.splitext(final)
    return f"{stem}.shard-{k}{ext}"


def strays(final: str) -> list[str]:
    """What an interrupted join or sync left: ``final + JOIN_SUFFIX``, and the files of
    shards a sync added (``x.shard-K.h5`` and its partial files) that the output ``final``
    does not record. Call with the output's lock held (no join can be under way)."""
    folder, name = os.path.split(os.path.abspath(final))
    stem, ext = os.path.splitext(name)
    ours = re.compile(re.escape(stem) + r"\.shard-\d+" + re.escape(ext))
    try:
        found = [n for n in os.listdir(folder) if ours.match(n)]
    except FileNotFoundError:
        return []
    recorded = set()
    if found and os.path.exists(final):
        with h5py.File(final, "r") as f:
            recorded = {r.path for r in records(f)} if is_sharded(f) else set()
    joining = [final + JOIN_SUFFIX] if os.path.exists(final + JOIN_SUFFIX) else []
    return joining + [os.path.join(folder, n) for n in found if n not in recorded]


def ranges(n_batches: int, n: int) -> list[tuple[int, int]]:
    """The batches ``[lo, hi)`` of each of ``n`` writers: contiguous, in order, sizes within one."""
    cuts = [k * n_batches // n for k in range(n + 1)]
    return list(zip(cuts[:-1], cuts[1:], strict=True))


def check_items(path: str, lo: int, hi: int, batch_size: int) -> None:
    """The complete shard ``path`` holds manifest items ``[lo, hi)``, as this run would cut
    them; else :class:`~h5batch.errors.ConvertError` (exit 2): another batch size cut it."""
    from .errors import ConvertError

    with h5py.File(path, "r") as f:
        a, b = json.loads(f.attrs[fmt.ATTR_SHARD])["items"]
    if (a, b) != (lo, hi):
        raise ConvertError(f"{path} holds manifest items {a}..{b - 1}, but this run's batches of {batch_size} items give "
                           f"it {lo}..{hi - 1} (another cluster.batch_size, or engine for batch_size auto): run with "
                           f"the interrupted run's settings to finish it, or --restart", EXIT_BAD_INPUT)


def is_sharded(f: h5py.File) -> bool:
    return f.attrs.get(fmt.ATTR_FORMAT) == fmt.SHARDED_FORMAT


def records(f: h5py.File) -> list[ShardRecord]:
    """The shards a joined file records."""
    return [ShardRecord(**d) for d in json.loads(f.attrs[fmt.ATTR_SHARDS])]


def check(path: str, f: h5py.File, digest: bool = False) -> list[str]:
    """The shard files of the joined output ``f`` (at ``path``; ``[]`` for one ordinary
    file), after checking that each is there with its recorded size (and sha256 when
    ``digest``: reads every byte). Raises :class:`~h5batch.errors.MissingShardError` /
    :class:`~h5batch.errors.CorruptFileError` naming the shard."""
    if not is_sharded(f):
        return []
    folder = os.path.dirname(os.path.abspath(path))
    out = []
    for r in records(f):
        p = os.path.join(folder, r.path)
        try:
            size = os.path.getsize(p)
        except FileNotFoundError:
            raise MissingShardError(f"{path}: its shard {p} is missing (a sharded output's shard files "
                                    f"must stay beside it)") from None
        if size != r.bytes:
            raise CorruptFileError(path, f"shard {p}", f"{size} bytes, the output recorded {r.bytes}: "
                                                       f"the shard changed since the output was joined")
        with h5py.File(p, "r") as sf:
            created = str(sf.attrs.get(fmt.ATTR_CREATED, ""))
        if created != r.created:
            raise CorruptFileError(path, f"shard {p}", f"created {created}, the output recorded {r.created}: "
                                                       f"the shard was written again since the output was joined")
        if digest and sha256(p) != r.sha256:
            raise CorruptFileError(path, f"shard {p}", "its sha256 differs from the one the output recorded: "
                                                       "the shard changed since the output was joined")
        out.append(p)
    return out


def sha256(path: str) -> str:
    with open(path, "rb") as fh:
        return hashlib.file_digest(fh, "sha256").hexdigest()


def join(final: str, shard_files: list[str], num_inputs: int, synced: dict[str, np.ndarray] | None = None) -> None:
    """Write the output ``final`` joining complete ``shard_files`` (in manifest order) as the
    module docstring says: through ``final + JOIN_SUFFIX``, fsynced and renamed, so a kill
    at any moment leaves either no output or the whole one.

    ``synced`` (a sync, h5batch/conversion/sync.py): the last shard is a sync's, ``final`` the output
    it syncs, and ``synced`` the rows it removes per split. The last shard holds the corpus's
    whole rejects, names, inventory and attributes (as a synced file would); ``final``'s
    views are kept and its tombstones joined with ``synced``."""
    tmp = final + JOIN_SUFFIX
    folder = os.path.dirname(os.path.abspath(final))
    shards = [h5py.File(p, "r") for p in shard_files]
    old = h5py.File(final, "r") if synced is not None else None
    try:
        last = shards[-1]  # the newest attributes, names, inventory (a sync's shard)
        with h5py.File(tmp, "w", libver=("earliest", "v110")) as out:
            for k, v in last.attrs.items():
                if k != fmt.ATTR_SHARD:
                    out.attrs[k] = v
            out.attrs[fmt.ATTR_FORMAT] = fmt.SHARDED_FORMAT
            out.attrs[fmt.ATTR_INPUTS] = num_inputs
            splits = json.loads(last.attrs[fmt.ATTR_SPLITS])
            for name in (fmt.CLASS_NAMES, "inventory"):
                src = next((s for s in reversed(shards) if name in s), None)
                if src is not None:
                    src.copy(src[name], out, name)
            rej = out.create_group(fmt.REJECTS)
            listed = shards if old is None else [last]  # a sync's shard lists the corpus's rejects
            for k in ("path", "stage", "reason"):
                rej.create_dataset(k, data=np.concatenate([s[fmt.REJECTS][k][...] for s in listed]),
                                   dtype=h5py.string_dtype(), maxshape=(None,))
            for split in splits:
                have = [(s[split], p) for s, p in zip(shards, shard_files, strict=True) if split in s]
                g = out.create_group(split)
                _join_group(g, [h for h, _ in have], [p for _, p in have], folder)
                if old is not None and split in old:
                    _carry(old[split], g, synced.get(split, ()))
            records = [ShardRecord(os.path.relpath(os.path.abspath(p), folder), os.path.getsize(p), sha256(p),
                                   json.loads(s.attrs[fmt.ATTR_SHARD])["host"],
                                   {sp: int(s[sp].attrs[fmt.ATTR_NUM_SAMPLES]) if sp in s else 0 for sp in splits},
                                   str(s.attrs[fmt.ATTR_CREATED]))
                       for p, s in zip(shard_files, shards, strict=True)]
            out.attrs[fmt.ATTR_SHARDS] = fmt.dumps([asdict(r) for r in records])
    finally:
        for s in [*shards, *([old] if old else [])]:
            s.close()
    with open(tmp, "rb") as fh:
        os.fsync(fh.fileno())
    os.replace(tmp, final)
    fd = os.open(folder, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def _carry(old: h5py.Group, out: h5py.Group, removed) -> None:
    """A synced split: the old joined file's views, and its tombstones with ``removed``."""
    if fmt.VIEWS in old:
        old.copy(old[fmt.VIEWS], out, fmt.VIEWS)
    had = old[fmt.TOMBSTONES][...] if fmt.TOMBSTONES in old else np.zeros(0, np.int64)
    dead = np.union1d(had.astype(np.int64), np.asarray(removed, dtype=np.int64))
    if len(dead):
        out.create_dataset(fmt.TOMBSTONES, data=dead)


def _join_group(out: h5py.Group, parts: list[h5py.Group], files: list[str], folder: str) -> None:
    """One split (or a variable field's group): virtual datasets over ``parts``; ``offsets``
    rebased into a real dataset. A shard without rows of a split may lack its datasets."""
    for k, v in [*parts[0].attrs.items(), *parts[-1].attrs.items()]:  # the newest win (a sync's
        out.attrs[k] = v  # shard: its extended categories); what it lacks (the codec choice) kept
    if fmt.ATTR_NUM_SAMPLES in parts[0].attrs:
        out.attrs[fmt.ATTR_NUM_SAMPLES] = sum(int(p.attrs[fmt.ATTR_NUM_SAMPLES]) for p in parts)
    names = list(dict.fromkeys(name for p in parts for name in p))
    for name in names:
        have = [(p[name], f) for p, f in zip(parts, files, strict=True) if name in p]
        members, where = [m for m, _ in have], [f for _, f in have]
        if isinstance(members[0], h5py.Group):
            _join_group(out.create_group(name), members, where, folder)
        elif name == fmt.OFFSETS:
            _rebased_offsets(out, members)
        else:
            _virtual(out, name, members, where, folder)


def _rebased_offsets(out: h5py.Group, members: list[h5py.Dataset]) -> None:
    """``offsets`` (N+1,) of the joined rows: each shard's own, shifted by the values before it."""
    pieces, base = [np.zeros(1, np.int64)], 0
    for d in members:
        o = d[...].astype(np.int64)
        pieces.append(o[1:] + base)
        base += int(o[-1])
    ds = out.create_dataset(fmt.OFFSETS, data=np.concatenate(pieces))
    for k, v in members[-1].attrs.items():
        ds.attrs[k] = v


def _virtual(out: h5py.Group, name: str, members: list[h5py.Dataset], files: list[str], folder: str) -> None:
    """``out[name]``: the members one after another along the first axis, as a virtual dataset."""
    first = members[0]
    n = sum(d.shape[0] for d in members)
    shape = (n, *first.shape[1:])
    if n == 0:  # HDF5 has no empty virtual dataset: an empty real one
        ds = out.create_dataset(name, shape=shape, dtype=first.dtype)
    else:
        layout = h5py.VirtualLayout(shape, dtype=first.dtype)
        at = 0
        for d, p in zip(members, files, strict=True):
            m = d.shape[0]
            if m:
                rel = os.path.relpath(os.path.abspath(p), folder)
                layout[at:at + m] = h5py.VirtualSource(rel, d.name, shape=d.shape)[:m]
            at += m
        ds = out.create_virtual_dataset(name, layout)
    for k, v in members[-1].attrs.items():
        ds.attrs[k] = v
