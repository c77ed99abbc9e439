"""What every layout shares: the :class:`Layout` base class and registry, the manifest
builder and path helpers (the walker is :mod:`h5batch.walker`).

Rule: this module names no layout, and layouts take settings from
:mod:`h5batch.config_types`, never :mod:`h5batch.config`. Reason: config checks
``source.layout`` against this registry, so that import would be a cycle.

Invariants (the builder enforces the last two): hidden files and folders are skipped;
every other file ends in an item or a reject with its reason; manifest order and hash depend
only on the corpus. In a one-field job, ``song.mp3`` beside ``song.flac`` are two samples
(:func:`keys_with_extensions`); with several fields the stem pairs files, so a second file of
one stem and field is a duplicate.
"""

from __future__ import annotations

import dataclasses
import hashlib
import os
from array import array
from collections.abc import Callable, Sequence
from pathlib import Path, PurePosixPath
from typing import TYPE_CHECKING, ClassVar

import numpy as np

from ..fields import file_fields, reads_files
from ..manifest import Item, Items, Manifest, Memo, Reject, byte_order, natural_key
from ..registry import Registry
from ..walker import Files, Walker
from .records import hash_inputs, hash_rejects, input_stats, item_record

if TYPE_CHECKING:
    from ..config_types import JobConfig, SourceConfig


class Layout:
    """One value of ``source.layout``. A subclass sets ``name`` (the job-file name) and
    defines :meth:`collect`; its module registers an instance with :func:`register` and is
    imported by ``h5batch/layouts/__init__.py``."""

    name: ClassVar[str]
    #: True when the layout splits :meth:`collect` into :meth:`walk` and :meth:`build` and a
    #: file's item (or reject) depends on that file's path alone, so that ``h5batch sync``
    #: can build items for new and changed files only (:mod:`.incremental`).
    incremental: ClassVar[bool] = False

    def collect(self, root: Path, src: SourceConfig, b: Builder) -> list[str]:
        """Walk the corpus at ``root``: append each sample to ``b.items`` (with its files' size
        and mtime as its ``stats``) and each unusable file to ``b.rejects``. Returns the split
        order (the builder sorts items by it, then by a natural sort of the key)."""
        if not self.incremental:
            raise NotImplementedError
        files, splits = self.walk(root, src, b)
        return self.build(root, src, b, files, splits)

    def walk(self, root: Path, src: SourceConfig, b: Builder) -> tuple[Files, list[str] | None]:
        """(an incremental layout) Every file :meth:`build` looks at, as ``(relative path,
        size, mtime_ns)`` (:class:`~h5batch.walker.Files`), the walk's rejects put in ``b``; and the split order when the
        folders fix it (None when the items' splits do). Default: every file under ``root``."""
        walker = Walker(root, b.ordered_walk)
        files = walker.walk()
        b.walked(walker)
        return files, None

    def build(self, root: Path, src: SourceConfig, b: Builder, files: Sequence[tuple[str, int, int]],
              splits: list[str] | None) -> list[str]:
        """(an incremental layout) The items and rejects of ``files`` (any subset of a walk),
        appended to ``b``; returns the split order, as :meth:`collect` does."""
        raise NotImplementedError

    def cannot_sync_incrementally(self, job: JobConfig) -> str | None:
        """Why this layout cannot rediscover ``job``'s corpus incrementally (None: it can)."""
        return None if self.incremental else f"layout {self.name!r} has no incremental discovery"

    def __repr__(self) -> str:
        return f"<layout {self.name}>"


LAYOUTS: Registry[Layout] = Registry("layout")  # name -> layout, in registration order
register = LAYOUTS.register
names = LAYOUTS.names
get = LAYOUTS.lookup


# ---------------------------------------------------------------------------
# Paths
# ---------------------------------------------------------------------------


def _suffix_at(name: str) -> int:
    """Where the suffix of a file name starts (``len(name)`` for none), as pathlib says. String
    work, not ``PurePosixPath``: it runs per file.
    """
    i = name.rfind(".")
    return i if 0 < i < len(name) - 1 else len(name)


def stem_ext(path: str) -> tuple[str, str]:
    """``(stem(path), ext(path))`` from one look at the file name (a layout's loop over
    every file of the corpus needs both)."""
    name = path.rpartition("/")[2]
    i = _suffix_at(name)
    return path[: len(path) - len(name) + i], name[i:].lower()


def ext(path: str) -> str:
    """The lower-cased suffix of a relative path's file name (``""`` for none)."""
    return stem_ext(path)[1]


def stem(path: str) -> str:
    """A relative path without its file name's suffix."""
    return stem_ext(path)[0]


def not_accepted(path: str, accepted: str, field_name: str | None = None) -> str:
    """The reject reason for a file whose extension no (or not this) field takes."""
    where = f" for field {field_name!r}" if field_name else ""
    return f"extension {ext(path) or '(none)'!r} is not accepted{where} (accepted: {accepted})"


# ---------------------------------------------------------------------------
# Building the manifest
# ---------------------------------------------------------------------------


class Builder:
    """Collects items and rejects for one job and turns them into a Manifest."""

    def __init__(self, job: JobConfig):
        self.job = job
        self.fields = tuple(file_fields(job.fields))  # the fields of files (one path each)
        self.ext_to_field: dict[str, str] = {}
        for name, fc in job.fields.items():
            for e in fc.extensions:
                self.ext_to_field.setdefault(e.lower(), name)
        # Lower-cased extensions per field, made once: takes() runs for every file met.
        self.exts = {name: frozenset(e.lower() for e in getattr(fc, "extensions", ()))
                      for name, fc in job.fields.items()}
        # Columns, not an Item per sample: each item is packed as it is appended (and made
        # again, one at a time, when a stage reads it). Reason: a list of a million items
        # held ~500 bytes a file at discovery's peak, and left the heap full of holes that the
        # forked writer and decoders then copied.
        self.items = Items()
        self.rejects: list[Reject] = []
        self.annotations: list[str] = []  # annotation files read (root-relative)
        self.resolved: dict = {}  # field configs completed by the annotation stage
        self.symlinks = False  # a walk met a symlink (see Memo.plain)
        self.ordered_walk = True  # Walker(root, b.ordered_walk): False for a sync's stat pass
        src = job.source
        # Whether a later stage reads an item's columns (annotate.py): a table to join, a
        # field of values, the label or the split taken from a column. Where none does, a
        # layout keeps no columns, and the annotation stage has no item to rebuild.
        self.wants_columns = bool(src.tables or src.label_column or src.split.column or src.split.hash_key
                                  or not all(reads_files(fc) for fc in job.fields.values()))

    def walked(self, walker: Walker) -> None:
        """Take a finished walk's rejects and whether it met a symlink (call once per walker)."""
        self.rejects.extend(walker.rejects)
        self.symlinks = self.symlinks or walker.symlinks > 0

    def accepted(self, field_name: str) -> str:
        return ", ".join(self.job.fields[field_name].extensions)

    def takes(self, field_name: str, path: str) -> bool:
        """Whether ``path``'s extension is one of the field's (case-insensitive)."""
        return ext(path) in self.exts[field_name]

    def group_by_stem(self, split: str, files: list[tuple[str, int, int]], label: str | None, cut: int = 0) -> None:
        """Group ``files`` (``(relative path, size, mtime_ns)`` of accepted extensions) by stem,
        each a sample keyed by its stem less the first ``cut`` characters; a file's extension
        says its field. With one field, two files of a stem are two samples (:meth:`finish`
        keys them apart)."""
        field_of = self.ext_to_field
        self.pair(split, [(f[0], field_of[se[1]], se[0][cut:], f[1:]) for f in files for se in (stem_ext(f[0]),)],
                  label, lambda fname: "the same stem and field", lambda key: f"for stem {PurePosixPath(key).name!r}")

    def pair(self, split: str, files: list[tuple[str, str, str, tuple[int, int]]], label: str | None,
             shared: Callable[[str], str], named: Callable[[str], str]) -> None:
        """One item per key of ``files`` (``(path, field, key, (size, mtime_ns))``) with a file
        of every field. A second file of one key and field is a duplicate (``shared(field)``
        says what the two share) and the files of a key that lacks a field are rejects
        (``named(key)`` names it)."""
        groups: dict[str, dict[str, tuple]] = {}
        for path, fname, key, st in files:
            slot = groups.setdefault(key, {})
            if fname in slot and len(self.fields) == 1:
                self.items.append(Item(key, split, (path,), label), (st,))
                continue
            if fname in slot:
                self.rejects.append(Reject(path, "discover", f"duplicate key: {slot[fname][0]} has {shared(fname)}"))
                continue
            slot[fname] = (path, st)
        for key, slot in groups.items():
            missing = [f for f in self.fields if f not in slot]
            if missing:
                for path, _ in slot.values():
                    self.rejects.append(Reject(path, "discover",
                                               f"paired sample incomplete: no {'/'.join(missing)} file {named(key)}"))
                continue
            got = [slot[f] for f in self.fields]
            self.items.append(Item(key, split, tuple(p for p, _ in got), label), tuple(st for _, st in got))

    def _drop_aliases(self, root: str, items: Items) -> Items:
        """One sample per file reached through several symlinks inside the root.

        An item is an alias when each of its files is the same directory entry reached by another
        path. The item kept is the one with no symlink on its paths, else the first in manifest
        order; the others' paths become rejects naming it. Items sharing only some files are
        distinct samples, as are hard links (docs/jobs.md says why).

        Only where a walk met a symlink, and only items sharing ``(st_dev, st_ino)`` have their
        paths resolved (inode numbers can be unreliable). The identities come from a ``stat``
        of each file here, not from the walk. Reason: the walk would keep them for every file
        of every corpus (~200 bytes a file), for the few corpora with symlinks.
        """
        if not self.symlinks:
            return items
        by_inode: dict[tuple, list[int]] = {}
        for i, it in enumerate(items):
            try:
                ids = tuple((st.st_dev, st.st_ino) for st in (os.stat(os.path.join(root, p)) for p in it.paths))
            except OSError:  # gone since the walk: its decode will say so
                continue
            by_inode.setdefault(ids, []).append(i)
        real_root = os.path.realpath(root)
        dropped: set[int] = set()
        for group in by_inode.values():
            if len(group) < 2:
                continue
            by_entry: dict[tuple[str, ...], list[int]] = {}
            for i in group:
                real = tuple(os.path.relpath(os.path.realpath(os.path.join(root, p)), real_root).replace(os.sep, "/")
                             for p in items[i].paths)
                by_entry.setdefault(real, []).append(i)
            for real, same in by_entry.items():
                if len(same) < 2:
                    continue  # hard links: one inode, different entries
                keep = next((i for i in same if items[i].paths == real), same[0])
                for i in same:
                    if i != keep:
                        dropped.add(i)
                        self.rejects.extend(Reject(p, "discover", f"same file as {k}, through a symlink")
                                            for p, k in zip(items[i].paths, items[keep].paths))
        return items.take([i for i in range(len(items)) if i not in dropped]) if dropped else items

    def finish(self, root: str, splits: list[str]) -> Manifest:
        found, self.items = self.items, Items()
        order, ties = self._order(found, splits)
        plain = not self.symlinks  # without symlinks no alias is dropped
        if len(self.fields) == 1 and any(len({found.key(i) for i in order[lo:hi].tolist()}) < hi - lo for lo, hi in ties):
            # Two items of a split share a key: keys change, so the order is made again (rare).
            found = keys_with_extensions(found)
            order, ties = self._order(found, splits)
            plain = False
        items = found.take(order, release=True)
        del found, order
        items, unique = self._drop_duplicates(items, ties)
        plain = unique and plain
        items = self._drop_aliases(root, items)
        present = {s for s, n in items.split_counts().items() if n}
        all_splits = list(splits) + sorted(present - set(splits))
        labels = sorted(items.labels(), key=natural_key)
        h = hashlib.sha256()
        for it in items:
            h.update(item_record(it, it.stats))
        inputs = input_stats(root, self.annotations)
        hash_inputs(h, inputs)
        rejects = self.final_rejects()
        hash_rejects(h, rejects)
        memo = Memo(inputs, list(splits), plain)
        return Manifest(root=root, fields=self.fields, splits=tuple(s for s in all_splits if s in present) or tuple(splits),
                        items=items, rejects=rejects, class_names=tuple(labels), hash=h.hexdigest(),
                        resolved=dict(self.resolved), annotations=tuple(self.annotations), memo=memo)

    def _drop_duplicates(self, items: Items, ties: list[tuple[int, int]]) -> tuple[Items, bool]:
        """Keep the first item (in manifest order) of each split and key; each file of the
        others is a reject naming the kept one. Items of one split and key are in one of the
        ``ties`` of :meth:`_order`. The items kept, and True when none was dropped."""
        dropped: list[int] = []
        for lo, hi in ties:
            taken: dict[str, int] = {}  # key -> its first item
            for i in range(lo, hi):
                key = items.key(i)
                if key in taken:
                    other = items[taken[key]].paths[0]
                    self.rejects.extend(Reject(p, "discover", f"duplicate key {key!r} in split {items.split_of(i)!r} "
                                                              f"(already taken by {other})") for p in items[i].paths)
                    dropped.append(i)
                    continue
                taken[key] = i
        if not dropped:
            return items, True
        gone = set(dropped)
        return items.take([i for i in range(len(items)) if i not in gone]), False

    @staticmethod
    def _order(items: Items, splits: list[str]) -> tuple[np.ndarray, list[tuple[int, int]]]:
        """The manifest order of ``items``: split order (``splits``, then any other split by
        name), then the natural order of the key; a stable sort, so items of one key keep the
        order they were found in. With it, the ties: each run ``order[lo:hi]`` of more than one
        item of one split whose keys sort alike (``a1``, ``a01``, a key twice). Reason: a
        duplicate key is looked for in those runs only, not in a dict of every key (~100 bytes
        a file).

        The sort keys (the split's rank as 2 bytes, then the :func:`natural_key`) go in one
        buffer sorted by :func:`~h5batch.manifest.byte_order`: a bytes object and an int per
        item (~110 bytes a file) were the peak of a 1M-file discovery."""
        given = {s: i for i, s in enumerate(splits)}
        ranked = sorted(items.split_names, key=lambda s: (given.get(s, len(given)), s))
        rank = {s: ranked.index(s).to_bytes(2, "big") for s in items.split_names}
        buf, bounds = bytearray(), array("q", [0])
        for i in range(len(items)):
            buf += rank[items.split_of(i)]
            buf += natural_key(items.key(i))
            bounds.append(len(buf))
        at = np.frombuffer(bounds, dtype=np.int64)
        order, same = byte_order(np.frombuffer(buf, dtype=np.uint8), at[:-1], at[1:])
        del buf, bounds, at
        tied = np.flatnonzero(same)  # items equal to the one before them
        cut = np.flatnonzero(np.diff(tied) > 1)
        ties = list(zip((np.concatenate([tied[:1], tied[cut + 1]]) - 1).tolist(),
                        (np.concatenate([tied[cut], tied[-1:]]) + 1).tolist()))
        return order, ties

    def final_rejects(self) -> list[Reject]:
        """The rejects in manifest order. Annotation files in the corpus (tables, split lists) are
        listed as inputs, not rejects.
        """
        taken = set(self.annotations)
        # The path's parts break ties of natural_key ("a01.wav", "a1.wav"): the order is then
        # total, the same whatever order the rejects were found in (a sync's incremental
        # discovery finds them in another order than a full walk, and hashes them).
        return sorted((r for r in self.rejects if r.path not in taken),
                      key=lambda r: (natural_key(r.path), r.path.split("/")))


def keys_with_extensions(items: Items) -> Items:
    """The keys of a one-field job's items, with the extension kept only where two items of a
    split would share a key (``song.mp3``, ``song.flac``); other keys, and so outputs, stay as
    they were (then ``items`` itself is returned).
    """
    seen: dict[str, dict[str, int]] = {}  # split -> key -> items (no tuple per item)
    for i in range(len(items)):
        n = seen.setdefault(items.split_of(i), {})
        key = items.key(i)
        n[key] = n.get(key, 0) + 1
    if all(n == 1 for by_key in seen.values() for n in by_key.values()):
        return items
    out = Items()
    for it in items:
        name = it.paths[0].rpartition("/")[2]
        suffix = name[_suffix_at(name):]
        if seen[it.split][it.key] > 1 and suffix and not it.key.endswith(suffix):
            it = dataclasses.replace(it, key=it.key + suffix)
        out.append(it)
    return out


def split_dirs(root: Path, src: SourceConfig, b: Builder) -> list[str]:
    """The split folders to walk (layouts whose corpus is ``root/<split>/...``). Top-level
    broken or escaping symlinks and media files outside any split are rejected; other top-level
    files (listed as excluded where ``source.exclude`` names them, :mod:`.exclude`) and
    unlisted folders (with ``source.splits``) are not part of the corpus.
    """
    walker = Walker(root)
    found: list[str] = []
    for e in sorted(os.scandir(root), key=lambda e: e.name):
        if e.name.startswith("."):
            continue
        if src.splits and e.name not in src.splits and (e.is_symlink() or e.is_dir()):
            continue  # not one of the listed splits: not part of this job
        b.symlinks = b.symlinks or e.is_symlink()
        if e.is_symlink() and not os.path.exists(e.path):
            b.rejects.append(Reject(e.name, "discover", "broken symlink"))
        elif e.is_symlink() and not walker.inside(e.path):
            b.rejects.append(Reject(e.name, "discover", "symlink points outside the corpus root"))
        elif e.is_dir():
            found.append(e.name)
        elif ext(e.name) in b.ext_to_field:
            b.rejects.append(Reject(e.name, "discover", "media file is not inside a split folder (<split>/...)"))

    if src.splits:
        for s in src.splits:
            if s not in found and not any(r.path == s for r in b.rejects):
                b.rejects.append(Reject(s, "discover", f"split folder {s!r} listed in source.splits is missing"))
        return [s for s in src.splits if s in found]
    return sorted(found, key=natural_key)


def declared_then_found(src: SourceConfig, b: Builder) -> list[str]:
    """Split order for layouts that read the split from each file or row: the splits listed
    in ``source.splits`` first, then the others met, in natural order."""
    declared = list(src.splits or [])
    return declared + sorted({s for s, n in b.items.split_counts().items() if n} - set(declared), key=natural_key)
