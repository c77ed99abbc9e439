"""What ``h5batch sync`` has to do: the difference between a finished output and the corpus
as discovery sees it now. Pure bookkeeping over small arrays; no sample is read.

An item of the corpus is matched to the output by its *key*, its first path (one file
belongs to one item), and compared by its *stamp* (:mod:`h5batch.inventory`: sizes, mtimes,
label name, annotation values):

==============================================  ====================================================
the item now                                    what the sync does
==============================================  ====================================================
not in the inventory                            new: decoded and appended
in it with another stamp                        changed: decoded and appended, its old row tombstoned
in it with the same stamp, a live row           nothing
in it with the same stamp, no row (a reject)    nothing: its rejects are carried over
a live row whose key discovery no longer has    removed: the row is tombstoned
==============================================  ====================================================

:func:`compute` works from a full discovery's manifest; :func:`from_rediscovery` from an
incremental one, which built only the new and changed items and listed the removed keys.

A file keeps the split it was first converted into (a changed file goes back into it); new
class names are appended after the old ones, which keep their numbers; discovery's own
rejects are redone from this discovery.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field
from functools import cached_property

import numpy as np

from .. import format as fmt
from ..inventory import stamps
from ..manifest import Item, Manifest, Reject, natural_key

#: Reject stages found by workers or the writer (carried over when the file is unchanged);
#: the others (discover, excluded) are found again by every discovery.
DECODE_STAGES = ("decode", "worker", "timeout", "write")


@dataclass
class OldOutput:
    """What a sync needs to know of the finished output (read by :func:`read_output`; the
    rows' keys and the inventory are read when first asked for: a sync that only adds files
    never needs the keys of the rows)."""

    path: str
    job_hash: str
    manifest_hash: str
    splits: list[str]
    class_names: tuple[str, ...]
    n_rows: dict[str, int]  # split -> rows stored
    dead: dict[str, np.ndarray]  # split -> tombstoned rows
    rejects: list[Reject]
    has_inventory: bool  # False: written before inventories existed
    fields: dict[str, dict]  # field name -> its attributes (codec, categories, ...)

    @cached_property
    def rows(self) -> dict[str, list[str]]:
        """split -> key (first source path) of each row."""
        from ..tools.index import open_file

        rows = {}
        with open_file(self.path) as f:
            for s in self.n_rows:
                src = f[s][fmt.SOURCE]
                keys = src.asstr()[...] if src.shape[0] else np.zeros((0,), dtype=object)
                if keys.ndim == 2:
                    keys = keys[:, 0]
                rows[s] = [str(k) for k in keys]
        return rows

    @cached_property
    def inventory(self) -> dict[str, int] | None:
        """key -> stamp (None: written before inventories existed)."""
        if not self.has_inventory:
            return None
        from ..inventory import load
        from ..tools.index import open_file

        with open_file(self.path) as f:
            return load(f)

    def memory(self):
        """The inventory as a :class:`~h5batch.inventory.Memory`, or why there is none."""
        from ..inventory import memory
        from ..tools.index import open_file

        with open_file(self.path) as f:
            return memory(f)


@dataclass
class Delta:
    items: list[Item]  # to decode and append, in manifest order, splits fixed
    tombstones: dict[str, list[int]]  # split -> rows that stop being samples
    kept_rejects: list[Reject]
    class_names: tuple[str, ...]
    new: int = 0
    changed: int = 0
    removed: int = 0
    unchanged: int = 0
    notes: list[str] = field(default_factory=list)
    # The files behind the counts (each item's first path; a removed item's key), in manifest
    # order: what `h5batch sync --dry-run --json` lists.
    new_paths: list[str] = field(default_factory=list)
    changed_paths: list[str] = field(default_factory=list)
    removed_paths: list[str] = field(default_factory=list)

    @property
    def empty(self) -> bool:
        return not self.items and not any(self.tombstones.values())


def read_output(path: str) -> OldOutput:
    """The finished output's inventory, rows and rejects (one pass over small datasets)."""
    import json

    from ..inventory import GROUP
    from ..tools.index import check_complete, open_file, tombstones
    from ..writer.output import read_rejects

    with open_file(path) as f:
        check_complete(f, path)
        splits = json.loads(f.attrs[fmt.ATTR_SPLITS])
        n_rows, dead = {}, {}
        for s in splits:
            if s not in f or fmt.SOURCE not in f[s]:
                continue
            n_rows[s] = int(f[s][fmt.SOURCE].shape[0])
            dead[s] = tombstones(f, path, s, n_rows[s])
        names = tuple(f[fmt.CLASS_NAMES].asstr()[...]) if fmt.CLASS_NAMES in f else ()
        fields = {}
        for name in json.loads(f.attrs[fmt.ATTR_FIELDS]):
            for s in splits:
                if s in f and name in f[s]:
                    fields[name] = {k: (v.decode() if isinstance(v, bytes) else v) for k, v in f[s][name].attrs.items()}
                    break
        return OldOutput(path, str(f.attrs[fmt.ATTR_JOB_HASH]), str(f.attrs[fmt.ATTR_MANIFEST_HASH]), splits, names,
                         n_rows, dead, read_rejects(f), GROUP in f, fields)


def _live(old: OldOutput) -> dict[str, tuple[str, int]]:
    """key -> (split, row) of each live row."""
    live: dict[str, tuple[str, int]] = {}
    for split, keys in old.rows.items():
        dead = set(old.dead.get(split, np.zeros(0)).tolist())
        for row, key in enumerate(keys):
            if row not in dead:
                live[key] = (split, row)
    return live


def _class_names(old: OldOutput, items: list[Item]) -> tuple[str, ...]:
    labels = {it.label for it in items if it.label is not None}
    return tuple(old.class_names) + tuple(sorted(labels - set(old.class_names), key=natural_key))


def compute(old: OldOutput, m: Manifest) -> Delta:
    """The sync of ``old`` to the corpus of ``m`` (see the module docstring)."""
    if old.inventory is None:
        raise ValueError(f"{old.path} has no inventory")
    live = _live(old)
    rejected_paths: dict[str, list[Reject]] = {}
    for r in old.rejects:
        if r.stage in DECODE_STAGES:
            rejected_paths.setdefault(r.path, []).append(r)
    d = Delta([], {s: [] for s in old.n_rows}, [], _class_names(old, m.items))
    seen: set[str] = set()
    for it, now in zip(m.items, stamps(m)):
        key = it.paths[0]
        seen.add(key)
        was = old.inventory.get(key)
        at = live.get(key)
        if was == now:
            if at is not None:
                d.unchanged += 1
                continue
            carried = [r for p in it.paths for r in rejected_paths.get(p, [])]
            if carried:
                d.kept_rejects.extend(carried)
                d.unchanged += 1
                continue
        _add(d, it, at)
    for key, (split, row) in live.items():
        if key not in seen:
            d.tombstones.setdefault(split, []).append(row)
            d.removed += 1
            d.removed_paths.append(key)
    return _ordered(d, old, m)


def _add(d: Delta, it: Item, at: tuple[str, int] | None) -> None:
    """``it`` to be decoded: new, or changed when ``at`` (its old split and row) is given; a
    changed item goes back into the split it had, and its old row is tombstoned."""
    if at is not None:
        d.tombstones.setdefault(at[0], []).append(at[1])
        if it.split != at[0]:
            it = dataclasses.replace(it, split=at[0])
        d.changed += 1
        d.changed_paths.append(it.paths[0])
    else:
        d.new += 1
        d.new_paths.append(it.paths[0])
    d.items.append(it)


def _ordered(d: Delta, old: OldOutput, m: Manifest) -> Delta:
    order = {s: i for i, s in enumerate(list(old.splits) + [s for s in m.splits if s not in old.splits])}
    d.items.sort(key=lambda it: order.get(it.split, len(order)))  # stable: manifest order within a split
    for rows in d.tombstones.values():
        rows.sort()
    return d


def from_rediscovery(old: OldOutput, r) -> Delta:
    """The sync of ``old`` to an incremental discovery's result
    (:class:`h5batch.layouts.incremental.Rediscovery`): the same table as :func:`compute`,
    where only the new and changed items were built. The rows' keys are read only when a
    file changed or went."""
    m = r.manifest
    gone = set(r.changed) | set(r.removed)
    live = _live(old) if gone else {}
    d = Delta([], {s: [] for s in old.n_rows}, [], _class_names(old, m.items))
    d.kept_rejects = [x for x in old.rejects if x.stage in DECODE_STAGES and x.path not in gone]
    for it in m.items:
        at = live.get(it.paths[0])
        _add(d, it, at)
    for key in r.removed:
        at = live.get(key)
        if at is not None:
            d.tombstones.setdefault(at[0], []).append(at[1])
            d.removed += 1
            d.removed_paths.append(key)
    d.unchanged = r.items - d.new - d.changed
    return _ordered(d, old, m)

