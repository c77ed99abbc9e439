"""The manifest: what discovery hands to every later stage (the auto trial, pre-flight, the
Dask tasks, the writer, ``verify``).

Rule: plain data, its sort key and checks of its text only; no file-system walking, no
job-file knowledge, no imports from the rest of the package. Reason: the writer and the Dask
workers import these classes (a :class:`Reject` travels in every batch), so they must stay
cheap to import and free of cycles; discovery itself lives in :mod:`h5batch.layouts`.
"""

from __future__ import annotations

import re
from array import array
from collections.abc import Iterable, Iterator, Sequence
from dataclasses import dataclass, field

import numpy as np


@dataclass(frozen=True, slots=True)
class Item:
    """One sample to decode: ``paths`` holds one path per field (relative to the corpus
    root, POSIX separators), in the job's field order."""

    key: str
    split: str
    paths: tuple[str, ...]
    label: str | None = None
    # One annotation value per field that reads no files (h5batch.fields.value_fields),
    # in field order: a table cell, or a tuple of cells for a vector field.
    values: tuple = ()
    # The layout's own columns for this sample (a manifest row, a pattern's named groups),
    # read by the annotation stage of discovery and then dropped.
    columns: tuple[tuple[str, str], ...] = ()
    # (size, mtime_ns) of each of ``paths`` (None: not known), set when a manifest is made.
    stats: tuple = ()


_UTF8 = ("utf-8", "surrogatepass")  # any str, undecodable file names' escapes too, round-trips
_NO_STAT = -1  # a size in Items: the path's stats are not known


class Rows(Sequence):
    """A sequence whose rows are made when read (by index, slice or iteration) from columns:
    a subclass holds ``_ends`` (an array, one end per row) and makes row ``i`` in ``_row``."""

    _ends: array

    def __len__(self) -> int:
        return len(self._ends)

    def __getitem__(self, i):
        if isinstance(i, slice):
            return [self._row(k) for k in range(*i.indices(len(self)))]
        if i < 0:
            i += len(self)
        if not 0 <= i < len(self):
            raise IndexError(i)
        return self._row(i)

    def __iter__(self) -> Iterator:
        return map(self._row, range(len(self)))

    def _row(self, i: int):
        raise NotImplementedError


class Items(Rows):
    """A manifest's items held as columns, not a Python object per item: an :class:`Item` is
    made when read (by index, slice or iteration), equal to the one stored.

    Columns: the key and paths of each item as one UTF-8 buffer (``key NUL path NUL path``;
    neither holds a NUL) with an array of ends; split and label as small integer codes into
    tables of names; each path's size and mtime_ns in two int64 arrays, ``pstart[i]`` the
    first path of item ``i``; values and columns only where an item has some. Reason: about
    70 bytes a file where the objects took ~500, for corpora of millions of files."""

    def __init__(self, items: Iterable[Item] = ()):
        self._buf, self._ends, self._pstart = bytearray(), array("q"), array("q", [0])
        self._size, self._mtime = array("q"), array("q")
        self._split, self._label = array("H"), array("i")
        self.split_names: list[str] = []
        self._label_names: list[str] = []
        self._codes: dict = {}  # split or label name -> its code
        self._extra: list[tuple] | None = None  # (values, columns) per item, where any has some
        for it in items:
            self.append(it)

    def append(self, it: Item, stats: tuple | None = None) -> None:
        """Add ``it``, with ``stats`` ((size, mtime_ns) or None per path; () for none known;
        default ``it.stats``)."""
        if stats is None:
            stats = it.stats
        self._buf += "\0".join((it.key, *it.paths)).encode(*_UTF8)
        self._ends.append(len(self._buf))
        self._pstart.append(self._pstart[-1] + len(it.paths))
        for st in stats if len(stats) == len(it.paths) else [None] * len(it.paths):
            self._size.append(_NO_STAT if st is None else st[0])
            self._mtime.append(0 if st is None else st[1])
        self._split.append(self._code(("s", it.split), self.split_names))
        self._label.append(-1 if it.label is None else self._code(("l", it.label), self._label_names))
        if (it.values or it.columns) and self._extra is None:
            self._extra = [((), ())] * (len(self) - 1)
        if self._extra is not None:
            self._extra.append((it.values, it.columns))

    def _code(self, name: tuple[str, str], names: list[str]) -> int:
        code = self._codes.get(name)
        if code is None:
            code = self._codes[name] = len(names)
            names.append(name[1])
        return code

    def _row(self, i: int) -> Item:
        key, *paths = self._buf[self._ends[i - 1] if i else 0:self._ends[i]].decode(*_UTF8).split("\0")
        lo, size, mtime = self._pstart[i], self._size, self._mtime
        stats = tuple([None if size[k] == _NO_STAT else (size[k], mtime[k]) for k in range(lo, lo + len(paths))])
        label = self._label[i]
        values, columns = self._extra[i] if self._extra is not None else ((), ())
        return Item(key, self.split_names[self._split[i]], tuple(paths),
                    None if label < 0 else self._label_names[label], values, columns, stats)

    def key(self, i: int) -> str:
        """The key of item ``i`` (without making the item)."""
        lo, hi = self._ends[i - 1] if i else 0, self._ends[i]
        end = self._buf.find(0, lo, hi)
        return self._buf[lo:hi if end < 0 else end].decode(*_UTF8)

    def first_paths(self) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """``(buf, lo, hi)``: the UTF-8 buffer (``surrogatepass``: its bytes sort as the str
        sort) and each item's first path ``buf[lo[i]:hi[i]]`` (empty: none); no item made."""
        buf = np.frombuffer(self._buf, dtype=np.uint8)
        ends = np.frombuffer(self._ends, dtype=np.int64)
        lo, hi = np.empty(len(ends), dtype=np.int64), np.empty(len(ends), dtype=np.int64)
        for b in range(0, len(ends), SORT_BLOCK):  # a block of items at a time: no array per byte
            e = ends[b:b + SORT_BLOCK]
            start = np.concatenate([[ends[b - 1] if b else 0], e[:-1]])
            nul = np.append(np.flatnonzero(buf[start[0]:e[-1]] == 0) + start[0], [e[-1], e[-1]])
            key_end = np.searchsorted(nul, start)  # the NUL after each key
            lo[b:b + SORT_BLOCK] = np.minimum(nul[key_end] + 1, e)
            hi[b:b + SORT_BLOCK] = np.minimum(nul[key_end + 1], e)
        return buf, lo, hi

    def first_stats(self, order: np.ndarray | None = None) -> np.ndarray:
        """Each item's first path's (size, mtime_ns), (-1, -1) where not known; for the items
        at the indices of ``order`` (default: all), in that order."""
        first = np.frombuffer(self._pstart, dtype=np.int64)[:-1]
        if order is not None:
            first = first[order]
        out = np.empty((len(first), 2), dtype=np.int64)
        out[:, 0] = np.frombuffer(self._size, dtype=np.int64)[first]
        out[:, 1] = np.frombuffer(self._mtime, dtype=np.int64)[first]
        out[out[:, 0] == _NO_STAT, 1] = -1
        return out

    def take(self, order: Sequence[int], release: bool = False) -> Items:
        """The items at the indices of ``order``, in that order: the columns gathered, no
        item made. ``release``: this one's columns are let go one by one as their copies
        are made (it is left empty), so that a sort of all the items costs their largest
        column beside them, not a second copy of them."""
        idx = np.asarray(order, dtype=np.int64).reshape(-1)
        out = Items()
        out.split_names, out._label_names, out._codes = list(self.split_names), list(self._label_names), dict(self._codes)
        # The key-and-paths buffer, gathered into one of its exact size a block at a time:
        # no index array per item beyond the new ends.
        ends, src = np.frombuffer(self._ends, dtype=np.int64), np.frombuffer(self._buf, dtype=np.uint8)
        blocks = [idx[b:b + SORT_BLOCK] for b in range(0, len(idx), SORT_BLOCK)]
        out._buf = bytearray(sum(int(_runs(ends, at)[1].sum()) for at in blocks))
        dst, pos = np.frombuffer(out._buf, dtype=np.uint8), 0
        for at in blocks:
            lo, n = _runs(ends, at)
            e = pos + np.cumsum(n)
            dst[pos:e[-1]] = src[np.repeat(lo - (e - n), n) + np.arange(pos, e[-1])]
            out._ends.frombytes(e.view(np.uint8))
            pos = int(e[-1])
        del ends, src, dst, blocks
        if release:
            self._buf, self._ends = bytearray(), array("q")
        pstart = np.frombuffer(self._pstart, dtype=np.int64)
        count = (pstart[1:] - pstart[:-1])[idx]
        first = np.concatenate([[0], np.cumsum(count)])
        if (count == 1).all():  # one path per item (one file field): each taken path's index
            paths = pstart[idx]
        else:
            paths = np.repeat(pstart[idx] - first[:-1], count) + np.arange(first[-1])
        out._pstart = _column("q", first)
        del pstart, count, first
        if release:
            self._pstart = array("q", [0])
        for name, at in (("_size", paths), ("_mtime", paths), ("_split", idx), ("_label", idx)):
            col = getattr(self, name)
            setattr(out, name, _column(col.typecode, np.frombuffer(col, dtype=col.typecode)[at]))
            if release:
                setattr(self, name, array(col.typecode))
            del col
        if self._extra is not None:
            out._extra = [self._extra[i] for i in idx.tolist()]
            if release:
                self._extra = None
        return out

    def labels(self, lo: int = 0) -> set[str]:
        """The labels of items ``lo`` to the last."""
        return {self._label_names[c] for c in set(self._label[lo:]) if c >= 0}

    def has_extras(self) -> bool:
        """Whether an item has values or columns."""
        return self._extra is not None

    def split_of(self, i: int) -> str:
        """The split of item ``i`` (without making the item)."""
        return self.split_names[self._split[i]]

    def split_counts(self) -> dict[str, int]:
        """Items per split, in order of first appearance (0 for none)."""
        n = [0] * len(self.split_names)
        for code in self._split:
            n[code] += 1
        return dict(zip(self.split_names, n))

    def num_paths(self, lo: int = 0, hi: int | None = None) -> int:
        """The paths of items ``lo`` to ``hi`` (default: all) together."""
        return self._pstart[len(self) if hi is None else hi] - self._pstart[lo]

    def __eq__(self, other) -> bool:
        return isinstance(other, (Items, list, tuple)) and list(self) == list(other)

    def __repr__(self) -> str:
        return f"<Items: {len(self)}>"


def _runs(ends: np.ndarray, at: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """The starts and lengths of the rows ``at`` of a buffer whose rows end at ``ends``."""
    lo = np.where(at > 0, ends[at - 1], 0)
    return lo, ends[at] - lo


def _column(typecode: str, values: np.ndarray) -> array:
    """An :class:`array.array` holding ``values`` (copied once)."""
    out = array(typecode)
    out.frombytes(np.ascontiguousarray(values).view(np.uint8))
    return out


@dataclass(frozen=True, slots=True)
class Reject:
    """An input that did not become a sample. ``stage`` is where it failed
    (``discover``, ``decode``, ``worker``, ``timeout``)."""

    path: str
    stage: str
    reason: str


@dataclass
class Manifest:
    """The items of a job in output order, the rejects of discovery, the class names
    (index = integer label) and a hash identifying this exact corpus state."""

    root: str
    fields: tuple[str, ...]
    splits: tuple[str, ...]
    items: Items  # a list of items with their stats is made Items
    rejects: list[Reject] = field(default_factory=list)
    class_names: tuple[str, ...] = ()
    hash: str = ""
    # Field configs that discovery completed (category and target names), by field name;
    # h5batch.layouts.resolved_job puts them into the job.
    resolved: dict = field(default_factory=dict)
    # Root-relative annotation files read (tables, split lists): inputs, not samples.
    annotations: tuple[str, ...] = ()
    # What the builder saw, kept in the output's inventory so a later sync can rediscover
    # incrementally (h5batch.layouts.incremental); None for a manifest made another way.
    memo: Memo | None = field(default=None, repr=False, compare=False)

    def label_index(self, label: str | None) -> int:
        """Integer label of a class name (-1 when the corpus has no labels)."""
        if label is None:
            return -1
        return self._index[label]

    def __post_init__(self) -> None:
        if not isinstance(self.items, Items):
            self.items = Items(self.items)
        self._index = {name: i for i, name in enumerate(self.class_names)}

    def found(self) -> str:
        """What discovery found, in words: the first line of a run."""
        from .format import STAGE_EXCLUDED, rejects_words

        excluded = sum(r.stage == STAGE_EXCLUDED for r in self.rejects)
        files = self.items.num_paths() + len(self.rejects)
        splits = ", ".join(f"{s} {n}" for s, n in self.counts().items())
        n = len(self.class_names)
        classes = f" in {n} class{'es' if n != 1 else ''}" if n else ""
        return (f"found {files} files in {self.root}: {len(self.items)} samples{classes} ({splits}); "
                f"{rejects_words(len(self.rejects) - excluded, excluded)} so far")

    def counts(self) -> dict[str, int]:
        """Number of items per split."""
        out = {s: 0 for s in self.splits}
        for s, n in self.items.split_counts().items():
            out[s] += n
        return out


@dataclass
class Memo:
    """What :meth:`h5batch.layouts.base.Builder.finish` hashed besides the items, for the
    output's inventory (:func:`h5batch.inventory.of_manifest` makes each item's hash record
    again from the item, so that a sync that keeps an item unchanged can hash it again
    without rebuilding it; the records are not kept here: ~110 bytes a file).

    ``inputs`` the ``[path, size, mtime_ns]`` of each annotation file (``None`` stats:
    missing); ``splits`` the split order the items were sorted by; ``plain`` is False when
    something joined items to each other (a key given its extension because two files shared
    a stem, a duplicate key, a symlink): then a file's item no longer depends on that file
    alone, and a sync rediscovers everything."""

    inputs: list
    splits: list[str]
    plain: bool


_DIGITS = re.compile(r"(\d+)")


def natural_key(text: str) -> bytes:
    """Sort key that orders ``2`` before ``10`` (digit runs compared as numbers, before text).

    The order is that of the tuple ``((0, int(run), "") or (1, 0, text), ...)`` of ``text``'s
    digit runs and text between them, as bytes: a digit run is ``00 01``, its digit count
    (4 bytes) and its ASCII digits without leading zeros; text is its UTF-8 (surrogates kept),
    U+0000 written ``00 02`` so that it still sorts below every other character. Reason: one
    bytes object per key, not a tuple of tuples (~400 bytes a key), while sorting a million
    files."""
    # isdecimal, not isdigit: '²' is a digit to str.isdigit but neither \d nor int() takes it.
    out = []
    for t in _DIGITS.split(text):
        if t.isdecimal():
            n = (t.lstrip("0") or "0") if t.isascii() else str(int(t))
            out.append(b"\0\1%b%b" % (len(n).to_bytes(4, "big"), n.encode()))
        elif t:
            out.append(t.encode("utf-8", "surrogatepass").replace(b"\0", b"\0\2"))
    return b"".join(out)


SORT_PREFIX = 64  # bytes of each string compared as one fixed-width array; longer ties are sorted whole
SORT_BLOCK = 1 << 14  # strings handled at a time: bounds the temporary index arrays


def byte_order(buf: np.ndarray, lo: np.ndarray, hi: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """``(order, same)`` for the byte strings ``buf[lo[i]:hi[i]]`` (``buf`` uint8): their
    indices in bytes order (stable: equal strings keep their order), and ``same[j]``, whether
    string ``order[j]`` equals string ``order[j - 1]``.

    The first :data:`SORT_PREFIX` bytes of every string sort as one fixed-width array,
    zero-padded; runs equal there that hold a longer string, or strings of unequal lengths, are
    sorted, and told apart, by their whole bytes. Reason: no bytes object and list slot per
    string (~70 bytes a string) while sorting millions; the array takes the prefix's width,
    and the order 8 bytes."""
    n = len(lo)
    if not n:
        return np.zeros(0, dtype=np.int64), np.zeros(0, dtype=bool)
    longest = max(int((hi[b:b + SORT_BLOCK] - lo[b:b + SORT_BLOCK]).max()) for b in range(0, n, SORT_BLOCK))
    w = min(SORT_PREFIX, max(1, longest))
    col, last = np.arange(w), max(len(buf) - 1, 0)
    prefix = np.zeros((n, w), dtype=np.uint8)
    for b in range(0, n, SORT_BLOCK):
        a, s = lo[b:b + SORT_BLOCK, None], hi[b:b + SORT_BLOCK, None] - lo[b:b + SORT_BLOCK, None]
        prefix[b:b + SORT_BLOCK] = np.where(col < s, buf[np.minimum(a + col, last)], 0)
    keys = prefix.view(f"S{w}").ravel()
    order = np.argsort(keys, kind="stable").astype(np.int64, copy=False)
    # same[j]: equal to the one before in the zero-padded prefix. Equal there, unequal maybe:
    # strings of different lengths (a trailing NUL pads alike) or longer than the prefix;
    # the runs that hold one ("odd") are sorted, and told apart, by their whole bytes.
    same, odd = np.zeros(n, dtype=bool), []
    for b in range(1, n, SORT_BLOCK):
        at = order[b - 1:b + SORT_BLOCK]
        eq = keys[at[1:]] == keys[at[:-1]]
        same[b:b + SORT_BLOCK] = eq
        size = hi[at] - lo[at]
        odd.append(np.flatnonzero(eq & ((size[1:] > w) | (size[1:] != size[:-1]))) + b)
    del prefix, keys
    odd = np.concatenate(odd) if odd else np.zeros(0, dtype=np.int64)
    if len(odd):
        starts = np.flatnonzero(~same)
        ends = np.append(starts[1:], n)
        for r in np.unique(np.searchsorted(starts, odd, "right") - 1).tolist():
            a, e = int(starts[r]), int(ends[r])
            run = order[a:e].tolist()
            whole = {i: buf[lo[i]:hi[i]].tobytes() for i in run}
            run.sort(key=whole.__getitem__)
            order[a:e] = run
            same[a + 1:e] = [whole[x] == whole[y] for x, y in zip(run[1:], run)]
    return order, same
