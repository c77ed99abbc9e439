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

from ..manifest import Item, Reject

__all__ = ["item_record", "input_stats", "hash_inputs", "hash_rejects"]


# json.dumps(values, default=str), made once: dumps builds a new encoder per call when given
# ``default``, which costs more than encoding a short value. Same bytes.
_VALUES_JSON = json.JSONEncoder(default=str)


def item_record(it: Item, stats: tuple) -> bytes:
    """What the manifest hash takes from one item; ``stats``: (size, mtime_ns) or None per
    path (``it.stats`` once the item is in a manifest)."""
    r = json.dumps([it.split, it.key, it.paths, it.label])
    if it.values:  # (absent before value fields: older hashes stay the same)
        r += _VALUES_JSON.encode(it.values)
    return (r + "".join([repr(st) for st in stats])).encode()


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
