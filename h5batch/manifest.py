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
from dataclasses import dataclass, field


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
    items: list[Item]
    rejects: list[Reject] = field(default_factory=list)
    class_names: tuple[str, ...] = ()
    hash: str = ""
    # Field configs that discovery completed (category and target names), by field name;
    # h5batch.layouts.resolved_job puts them into the job.
    resolved: dict = field(default_factory=dict)
    # Root-relative annotation files read (tables, split lists): inputs, not samples.
    annotations: tuple[str, ...] = ()
    # (size, mtime_ns) of every file of an item, by path (h5batch.inventory stamps items with it).
    stats: dict = field(default_factory=dict, repr=False)
    # What the builder saw, kept in the output's inventory so a later sync can rediscover
    # incrementally (h5batch.layouts.incremental); None for a manifest made another way.
    memo: Memo | None = field(default=None, repr=False, compare=False)

    def label_index(self, label: str | None) -> int:
        """Integer label of a class name (-1 when the corpus has no labels)."""
        if label is None:
            return -1
        return self._index[label]

    def __post_init__(self) -> None:
        self._index = {name: i for i, name in enumerate(self.class_names)}

    def found(self) -> str:
        """What discovery found, in words: the first line of a run."""
        from .format import STAGE_EXCLUDED, rejects_words

        excluded = sum(r.stage == STAGE_EXCLUDED for r in self.rejects)
        files = sum(len(it.paths) for it in self.items) + len(self.rejects)
        splits = ", ".join(f"{s} {n}" for s, n in self.counts().items())
        n = len(self.class_names)
        classes = f" in {n} class{'es' if n != 1 else ''}" if n else ""
        return (f"found {files} files in {self.root}: {len(self.items)} samples{classes} ({splits}); "
                f"{rejects_words(len(self.rejects) - excluded, excluded)} so far")

    def counts(self) -> dict[str, int]:
        """Number of items per split."""
        out = {s: 0 for s in self.splits}
        for it in self.items:
            out[it.split] += 1
        return out


@dataclass
class Memo:
    """What :meth:`h5batch.layouts.base.Builder.finish` hashed, item by item.

    ``record[record_end[i-1]:record_end[i]]`` is the bytes the manifest hash took from item
    ``i`` (its split, key, paths, label, values and file stats), so a sync that keeps an item
    unchanged can hash it again without rebuilding it (one buffer, not a bytes object per
    item: ~40 bytes less a file); ``inputs`` the ``[path, size, mtime_ns]`` of each annotation
    file (``None`` stats: missing); ``splits`` the split order the items were sorted by;
    ``plain`` is False when something joined items to each other (a key given its extension
    because two files shared a stem, a duplicate key, a symlink): then a file's item no
    longer depends on that file alone, and a sync rediscovers everything."""

    record: bytearray
    record_end: array  # of "q": where each item's record ends in ``record``
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
