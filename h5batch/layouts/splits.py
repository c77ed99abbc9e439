"""Split rules that replace a layout's own (``source.split``: ``lists``, ``column``,
``hash``); the layout's rules (a split folder, the ``pattern`` layout's group and ranges)
stay in the layouts.

* ``lists``: split -> a list file of root-relative paths, one per line (Speech Commands'
  ``validation_list.txt``); a sample whose first file is listed gets that split, any other
  ``default``; a sample listed twice is a reject naming both lists;
* ``column``: an annotation column; ``values`` maps a value to a split name (CelebA's
  ``0/1/2``, Common Voice's table names), a value it does not map is the split name itself,
  an empty one is ``default``;
* ``hash``: split -> fraction. ``sha256`` of the sample key (or of ``hash_key``, an
  annotation column such as the speaker, so a speaker's samples stay together) gives a
  number in ``[0, 1)``; the fractions are laid end to end in the order written, the rest is
  ``default``. A file's split depends on its own key only: it keeps it when the corpus grows.
"""

from __future__ import annotations

import hashlib
from pathlib import Path
from typing import TYPE_CHECKING, Any

from ..errors import ConfigError
from ..manifest import Item, Items, Reject, natural_key

if TYPE_CHECKING:
    from ..config_types import JobConfig, SplitRule
    from .base import Builder


def fraction(text: str) -> float:
    """A stable number in ``[0, 1)`` for ``text`` (first 52 bits of its sha256)."""
    return (int.from_bytes(hashlib.sha256(text.encode()).digest()[:8], "big") >> 12) / float(1 << 52)


def by_hash(value: str, rule: SplitRule) -> str:
    x, acc = fraction(value), 0.0
    for split, frac in rule.hash.items():
        acc += frac
        if x < acc:
            return split
    return rule.default


def _read_lists(root: Path, job: JobConfig, b: Builder) -> dict[str, str]:
    listed: dict[str, str] = {}  # path -> split
    twice: dict[str, list[str]] = {}
    for split, rel in job.source.split.lists.items():
        path = root / rel
        try:
            lines = path.read_text(encoding="utf-8").splitlines()
        except OSError as e:
            raise ConfigError(job.file, f"source.split.lists.{split}", f"cannot read list file {str(path)!r}: {e.strerror}") from None
        b.annotations.append(rel)
        for line in lines:
            p = line.strip().replace("\\", "/")
            if not p:
                continue
            if p in listed and listed[p] != split:
                twice.setdefault(p, [listed[p]]).append(split)
            listed[p] = split
    for p, splits in twice.items():
        listed[p] = "\0" + ", ".join(job.source.split.lists[s] for s in splits)  # marks a conflict
    return listed


def apply(root: Path, job: JobConfig, b: Builder, cols: list[dict[str, Any]]) -> list[str] | None:
    """Give each item its split by the job's split rule; the split order (declared
    ``source.splits`` first), or None when the job has no such rule."""
    rule = job.source.split
    if not (rule.lists or rule.column or rule.hash):
        return None
    listed = _read_lists(root, job, b) if rule.lists else {}
    kept = Items()
    for it, c in zip(b.items, cols):
        if rule.lists:
            split = listed.get(it.paths[0], rule.default)
            if split.startswith("\0"):
                b.rejects.extend(Reject(p, "discover", f"listed in several split lists: {split[1:]}") for p in it.paths)
                continue
        elif rule.column:
            value = str(c.get(rule.column) or "").strip()
            split = rule.values.get(value, value) if value else rule.default
        else:
            key = str(c.get(rule.hash_key) or "") if rule.hash_key else it.key
            split = by_hash(key, rule)
        # The constructor, not dataclasses.replace (~3x its cost): this runs once per file.
        kept.append(it if it.split == split else Item(it.key, split, it.paths, it.label, it.values, it.columns,
                                                      it.stats))
    b.items = kept
    order = list(job.source.splits or [])
    if rule.lists:
        order += [rule.default, *rule.lists]
    elif rule.column:
        order += list(rule.values.values())
    else:
        order += [rule.default, *rule.hash]
    order += sorted({s for s, n in b.items.split_counts().items() if n}, key=natural_key)
    return list(dict.fromkeys(order))
