"""The manifest hash: what it takes from each item, annotation file and reject.

Rule: the bytes are those of ``json.dumps`` of each item's split, key, paths and label, its
values, then ``repr`` of its files' (size, mtime_ns); stored hashes and sync records
(:class:`~h5batch.manifest.Memo`) depend on them, so a faster way to put them together must
give the same bytes (``tests/test_discover.py``). The hash comes in three parts:
``h.update(a); h.update(b)`` is ``h.update(a + b)``, so a sync can hash the unchanged items'
stored records again.
"""

from __future__ import annotations

import json
import os

from ..manifest import Item, Reject, plain_items

__all__ = ["item_record", "item_records", "input_stats", "hash_inputs", "hash_rejects"]


# json.dumps(values, default=str), made once: dumps builds a new encoder per call when given
# ``default``, which costs more than encoding a short value. Same bytes.
_VALUES_JSON = json.JSONEncoder(default=str)


def _head(it: Item) -> str:
    """``json.dumps([it.split, it.key, it.paths, it.label])``. Rule: where every string is
    printable ASCII without a quote or a backslash, and the label a string, an int or None, the same
    text is put together directly; anything else goes through json. Reason: json.dumps
    was most of item_record's cost, paid once per item of the corpus before the first batch;
    the bytes must stay those of json.dumps (stored manifest hashes and records)."""
    label = it.label
    text = it.split + it.key + "".join(it.paths)
    if type(label) is str:  # a class name (folder, pattern group): quoted like the other strings
        text += label
        shown = f'"{label}"'
    else:
        shown = "null" if label is None else str(label) if type(label) is int else ""
    if shown and text.isascii() and text.isprintable() and '"' not in text and "\\" not in text:
        paths = '", "'.join(it.paths)
        return (f'["{it.split}", "{it.key}", ["{paths}"], {shown}]' if it.paths else
                f'["{it.split}", "{it.key}", [], {shown}]')
    return json.dumps([it.split, it.key, it.paths, label])


def item_records(items: list[Item], stats: dict) -> list[bytes]:
    """:func:`item_record` of each item. Rule: where :func:`~h5batch.manifest.plain_items`
    holds for the double quote, the records are put together in one comprehension, checked
    once for the lot; anything else goes item by item. Reason: this runs for every item of
    a corpus, and a call per item costs more than twice as much (the bytes are the same:
    ``tests/test_discover.py`` compares them with :func:`item_record`'s)."""
    if not plain_items(items, '"'):
        return [item_record(it, stats) for it in items]
    get, q = stats.get, '"'
    if all(len(it.paths) == 1 for it in items):
        return [(f'["{it.split}", "{it.key}", ["{it.paths[0]}"], '
                 f'{"null" if it.label is None else q + it.label + q}]{get(it.paths[0])!r}').encode()
                for it in items]
    sep = '", "'
    return [(f'["{it.split}", "{it.key}", ["{sep.join(it.paths)}"], '
             f'{"null" if it.label is None else q + it.label + q}]' + "".join([repr(get(p)) for p in it.paths])).encode()
            for it in items]


def item_record(it: Item, stats: dict) -> bytes:
    """What the manifest hash takes from one item."""
    r = _head(it)
    if it.values:  # (absent before value fields: older hashes stay the same)
        r += _VALUES_JSON.encode(it.values)
    get = stats.get
    return (r + "".join([repr(get(p)) for p in it.paths])).encode()


def input_stats(root: str, annotations: list[str] | tuple[str, ...]) -> list:
    """``[path, size, mtime_ns]`` of each annotation file (``[path, None, None]``: missing)."""
    out = []
    for rel in annotations:
        try:
            st = os.stat(os.path.join(root, rel))
            out.append([rel, st.st_size, st.st_mtime_ns])
        except OSError:
            out.append([rel, None, None])
    return out


def hash_inputs(h, inputs: list) -> None:
    for rel, size, mtime in inputs:
        h.update(json.dumps([rel, size, mtime]).encode() if size is not None else rel.encode())


def hash_rejects(h, rejects: list[Reject]) -> None:
    for r in rejects:
        h.update(json.dumps([r.path, r.stage, r.reason]).encode())
