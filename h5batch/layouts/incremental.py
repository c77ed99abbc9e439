"""Incremental discovery for ``h5batch sync``: builds items only for files new or changed
since the output's inventory (:class:`~h5batch.inventory.Memory`) was written.

Rule: the result is what :func:`h5batch.layouts.discover` would give, or none at all. A
layout opts in (``Layout.incremental``: walk separate from item building, and a file's item
or reject depends on its path alone); one stat pass (:meth:`~.base.Layout.walk`) is compared
with the inventory's sorted keys and stats, in numpy:

* same size and mtime: unchanged, stored stamp and :class:`~h5batch.manifest.Memo` kept;
* a discovery reject for its path (extension, pattern, folder) stays one; a reject of the
  walk itself (cannot stat, not regular) is not carried, the stat pass decides again;
* any other file goes through :meth:`~.base.Layout.build`, exclusions, annotation join and
  split rules as in a full discovery, and is put into manifest order by bisection;
* an inventory key the walk does not find is removed.

The manifest hash is streamed over the records in order, so it equals a full discovery's.

Where the fast path cannot vouch, :func:`rediscover` returns the reason and sync runs (and
logs) a full discovery: layout not incremental or several paired fields, a value field that
names from every value (:func:`~h5batch.fields.needs_every_value`; category names are
appended), items that depended on each other (:attr:`Memo.plain`), a changed annotation file
or a table glob matching other files, changed split folders, a new split, a key clash, or a
changed file's item moved.
"""

from __future__ import annotations

import bisect
import dataclasses
import functools
import glob
import hashlib
import json
from collections.abc import Callable
from itertools import chain
from pathlib import Path
from typing import TYPE_CHECKING

import numpy as np

from .. import format as fmt
from ..errors import ConfigError
from ..fields import needs_every_value
from ..inventory import Memory, memo_json, stamp
from ..manifest import Item, Manifest, Reject, natural_key
from . import annotate, exclude
from . import splits as split_rules
from .base import Builder, get
from .records import hash_inputs, hash_rejects, input_stats, item_record

if TYPE_CHECKING:
    from ..config_types import JobConfig

__all__ = ["Rediscovery", "rediscover", "why_not_incremental"]

_DISCOVERY_STAGES = ("discover", fmt.STAGE_EXCLUDED)
# What the walker (h5batch.walker) rejects (the file could not be stat-ed, is no regular file,
# ...): the walk finds each of them again, and a file that became readable since must become
# an item.
_WALK_REASONS = ("cannot list folder:", "cannot stat:", "not a regular file", "broken symlink", "symlink ")
_JSON = json.JSONDecoder()


@dataclasses.dataclass
class Rediscovery:
    """What changed, and the corpus's state after it.

    ``manifest`` has the whole corpus's hash, rejects and annotations but only the new and
    changed items (manifest order) and their ``splits``; ``inventory`` is the whole corpus's
    ``(keys, stamps, extra)`` (:func:`h5batch.inventory.write_arrays`).
    """

    manifest: Manifest
    changed: list[str]  # first paths of items whose file has another size or mtime
    removed: list[str]  # inventory keys the corpus no longer has
    items: int  # items of the whole corpus
    inventory: tuple

    @property
    def num_inputs(self) -> int:
        return self.items + len(self.manifest.rejects)


def _stored_items(mem: Memory, order: dict[str, int]) -> tuple[Callable[[int], tuple], Callable[[int], tuple]]:
    """Two functions of a stored item's position: its ``(split, key)``, decoded from its record,
    and its sort key, cached (a bisection reads a few of them)."""
    record, ends = mem.record.data, mem.record_end.tolist()

    def item(i: int) -> tuple:
        rec = bytes(record[(ends[i - 1] if i else 0):ends[i]])
        return tuple(_JSON.raw_decode(rec.decode())[0][:2])

    @functools.cache
    def sort_key(i: int) -> tuple:
        split, key = item(i)
        return order.get(split, len(order)), split, natural_key(key)

    return item, sort_key


def why_not_incremental(job: JobConfig) -> str | None:
    """Why ``job``'s corpus cannot be rediscovered incrementally whatever the output holds
    (None: it can): its layout has no incremental discovery, or a value field takes its
    names from every sample's value."""
    why = get(job.source.layout).cannot_sync_incrementally(job)
    if why:
        return why
    if job.source.limit is not None:
        return "source.limit spreads its samples over the whole corpus"
    blocker = needs_every_value(job.fields)
    return f"field {blocker!r} takes its names from every sample's value" if blocker else None


def rediscover(job: JobConfig, mem: Memory, old_rejects: list[Reject]) -> Rediscovery | str:
    """The corpus of ``job`` compared with ``mem`` (see the module docstring), or the reason
    a full discovery is needed."""
    why = why_not_incremental(job)
    if why:
        return why
    if not mem.plain:
        return "items of the last discovery depended on each other (a key with its extension, a duplicate, a symlink)"
    root = Path(job.source.root)
    why = _inputs_changed(root, job, mem)
    if why:
        return why
    layout = get(job.source.layout)
    walk = Builder(job)
    walk.ordered_walk = False  # the stat pass is compared in numpy, in any order
    files, folders = layout.walk(root, job.source, walk)
    if walk.symlinks:
        return "the corpus has symlinks"
    rule = job.source.split
    if folders is not None and not (rule.lists or rule.column or rule.hash) and folders != mem.splits:
        return "the split folders changed"
    try:
        return _rediscover(job, layout, mem, old_rejects, root, walk, files, folders)
    except ConfigError as e:
        return f"discovery of the new files failed ({e}); a full discovery says whether it holds"


def _found_by_walk(r: Reject) -> bool:
    """Whether ``r`` came from the walk (redone by every stat pass), not from a file's path."""
    return r.stage == "discover" and r.reason.startswith(_WALK_REASONS)


def _inputs_changed(root: Path, job: JobConfig, mem: Memory) -> str | None:
    for rel, size, mtime in mem.inputs:
        if input_stats(str(root), [rel])[0] != [rel, size, mtime]:
            return f"annotation file {rel} changed"
    known = {rel for rel, _, _ in mem.inputs}
    for spec in job.source.tables:
        for pat in [spec.path] if isinstance(spec.path, str) else list(spec.path):
            if glob.has_magic(pat) and not set(glob.glob(pat, root_dir=root, recursive=True)) <= known:
                return f"the table pattern {pat!r} matches other files"
    return None


def _rediscover(job, layout, mem: Memory, old_rejects, root: Path, walk: Builder, files: list[tuple[str, int, int]],
                folders) -> Rediscovery | str:
    n = len(mem.keys)
    paths = [f[0] for f in files]
    stat = np.fromiter(chain.from_iterable(f[1:] for f in files), dtype=np.int64, count=2 * len(files)).reshape(-1, 2)
    found = mem.find(paths)
    hit = found >= 0
    at = np.maximum(found, 0)
    same = hit & (mem.stat[at] == stat).all(axis=1) if n else hit
    present = np.zeros(n, dtype=bool)
    present[at[hit]] = True
    removed = [mem.keys[i] for i in np.flatnonzero(~present).tolist()]
    carried = [r for r in old_rejects if r.stage in _DISCOVERY_STAGES and not _found_by_walk(r)]
    rejected = {r.path for r in carried}
    changed_at = np.flatnonzero(hit & ~same)
    todo = [row for row in map(files.__getitem__, np.flatnonzero(~hit).tolist()) if row[0] not in rejected]
    changed = [paths[i] for i in changed_at.tolist()]
    todo += [files[i] for i in changed_at.tolist()]

    b = Builder(job)
    b.rejects = list(walk.rejects)
    layout.build(root, job.source, b, todo, folders)
    exclude.apply(job.source, b)
    split_rules.apply(root, job, b, annotate.join(root, job, b))
    if carried:  # a path-based reject is carried while its file is still there
        there = set(paths)
        b.rejects += [r for r in carried if r.path in there]
    order = {s: i for i, s in enumerate(mem.splits)}
    if any(it.split not in order for it in b.items):
        return "a new split appeared"
    old_item, old_key = _stored_items(mem, order)
    position = np.empty(n, dtype=np.int64)
    position[mem.order] = np.arange(n)
    by_path = {it.paths[0]: it for it in b.items}
    replaced: dict[int, Item] = {}
    for key_at, path in zip(at[changed_at].tolist(), changed):
        it, p = by_path.pop(path, None), int(position[key_at])
        if it is None or old_item(p) != (it.split, it.key):
            return f"the item of the changed file {path} is not the one it was"
        replaced[p] = it
    found_new = list(by_path.values())
    sort_keys = [(order[it.split], it.split, natural_key(it.key)) for it in found_new]
    rank = sorted(range(len(found_new)), key=sort_keys.__getitem__)
    new = [found_new[i] for i in rank]
    gone = position[~present]
    wanted = [sort_keys[i] for i in rank]
    # Each bisection reads a few stored records (decoded once, then cached by ``old_key``).
    where = [bisect.bisect_left(range(n), k, key=old_key) for k in wanted]
    for i, (it, k, p) in enumerate(zip(new, wanted, where)):
        if (p < n and old_key(p) == k and present[mem.order[p]]) or (i and k == wanted[i - 1]):
            return f"the key {it.key!r} of {it.paths[0]} clashes with another item's"
    return _merge(mem, b, new, where, replaced, gone, changed, removed, root)


def _merge(mem: Memory, b: Builder, new: list[Item], at: list[int], replaced: dict[int, Item],
           gone: np.ndarray, changed: list[str], removed: list[str], root: Path) -> Rediscovery:
    """The corpus after the change: the merged inventory arrays and the manifest hash.

    ``src`` lists the merged items in manifest order: a stored or changed (``replaced``) item
    by its old position, a new one as ``-(its index in new) - 1``."""
    n = len(mem.record_end)
    keep = np.ones(n, dtype=bool)
    keep[gone] = False
    kept = np.flatnonzero(keep)
    src = np.insert(kept, np.searchsorted(kept, np.asarray(at, dtype=np.int64)), -(np.arange(len(new)) + 1))
    # Per merged item: stamp, stat, record (the unchanged ones' from the memory, in runs).
    special = (src < 0) | np.isin(src, np.fromiter(replaced, dtype=np.int64, count=len(replaced)))
    starts = np.concatenate([[0], mem.record_end[:-1]]) if n else np.zeros(0, dtype=np.int64)
    pieces: list[bytes] = []
    lengths = np.empty(len(src), dtype=np.int64)
    stamps_ = np.empty(len(src), dtype=np.int64)
    stat = np.empty((len(src), 2), dtype=np.int64)
    keys, key_of_old, key_of_new = _merged_keys(mem, gone, [it.paths[0] for it in new])
    kidx = np.empty(len(src), dtype=np.int64)  # per merged item: its index into keys
    plain = np.flatnonzero(~special)
    if len(plain):
        olds = src[plain]
        key_index = mem.order[olds]
        kidx[plain] = key_of_old[key_index]
        stamps_[plain] = mem.stamps[key_index]
        stat[plain] = mem.stat[key_index]
        lengths[plain] = mem.record_end[olds] - starts[olds]
    # Runs of consecutive stored items (a record slice each), broken by a new or changed item.
    starts_at = np.flatnonzero(~special & np.concatenate([[True], (src[1:] != src[:-1] + 1) | special[:-1]]))
    ends_at = np.flatnonzero(~special & np.concatenate([(src[1:] != src[:-1] + 1) | special[1:], [True]]))
    # Only the runs' ends and the new or changed items are looked at one by one: lists of
    # those, not of every item (a +1 % sync changes few items of many).
    runs = dict(zip(starts_at.tolist(), zip(ends_at.tolist(), starts[src[starts_at]].tolist(),
                                             mem.record_end[src[ends_at]].tolist())))
    specials = dict(zip(np.flatnonzero(special).tolist(), src[special].tolist()))
    items: list[Item] = []
    record = mem.record.data  # runs are sliced as views of it: hashed and joined without a copy each
    j = 0
    while j < len(src):
        if j in runs:
            e, lo, hi = runs[j]
            pieces.append(record[lo:hi])
            j = e + 1
            continue
        s = specials[j]
        it = replaced[s] if s >= 0 else new[-s - 1]
        rec = item_record(it, it.stats)
        pieces.append(rec)
        items.append(it)
        kidx[j] = key_of_old[mem.order[s]] if s >= 0 else key_of_new[-s - 1]
        stamps_[j] = stamp(it)
        stat[j] = it.stats[0]
        lengths[j] = len(rec)
        j += 1
    h = hashlib.sha256()
    for p in pieces:
        h.update(p)
    inputs = input_stats(str(root), b.annotations)
    hash_inputs(h, inputs)
    rejects = b.final_rejects()
    hash_rejects(h, rejects)
    by_key = np.empty_like(kidx)
    by_key[kidx] = np.arange(len(kidx))
    extra = {"stat": stat[by_key], "order": kidx, "record": np.frombuffer(b"".join(pieces), dtype=np.uint8),
             "record_end": np.cumsum(lengths), "memo": memo_json(inputs, mem.splits, True)}
    names = tuple(mem.splits)
    manifest = Manifest(root=str(root), fields=b.fields, splits=tuple(s for s in names if any(it.split == s for it in items)),
                        items=items, rejects=rejects, class_names=tuple(sorted({it.label for it in items if it.label is not None}, key=natural_key)),
                        hash=h.hexdigest(), annotations=tuple(b.annotations), resolved=dict(b.resolved))
    return Rediscovery(manifest, changed, removed, len(src), (keys, stamps_[by_key], extra))


def _merged_keys(mem: Memory, gone: np.ndarray, added: list[str]) -> tuple[list[str], np.ndarray, np.ndarray]:
    """The sorted keys after the change, and where each old key (-1: removed) and each of
    ``added`` went; ``added`` is merged in by bisection, no sort of the whole list.
    """
    old = mem.keys
    n = len(old)
    alive = np.ones(n, dtype=bool)
    alive[mem.order[gone]] = False
    removed_before = np.concatenate([[0], np.cumsum(~alive)])  # removed among old[:i]
    rank = sorted(range(len(added)), key=added.__getitem__)
    ins = np.array([bisect.bisect_left(old, added[r]) for r in rank], dtype=np.int64)  # sorted
    key_of_old = np.arange(n) - removed_before[:n] + np.searchsorted(ins, np.arange(n), side="right")
    key_of_old[~alive] = -1
    key_of_new = np.empty(len(added), dtype=np.int64)
    key_of_new[np.asarray(rank, dtype=np.int64)] = np.arange(len(added)) + ins - removed_before[ins]
    merged = np.empty(n - int((~alive).sum()) + len(added), dtype=object)
    merged[key_of_old[alive]] = np.array(old, dtype=object)[alive] if n else []
    merged[key_of_new] = np.array(added, dtype=object)
    return merged.tolist(), key_of_old, key_of_new
