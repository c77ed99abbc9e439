"""Layout ``pattern``: a regex (``source.pattern``) matched against each file's path
relative to ``root``, for flat corpora such as FSDD (``0_george_12.wav``).

One field only. The ``label`` group (``source.label_group``) is the class label; the split
is the text of ``source.split.group``, or, with ``source.split.ranges``, the first
``[lo, hi]`` range holding that group's integer value, else ``source.split.default``. A
file that does not match, or whose split group is not an integer when ranges are used, is
rejected.
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING

from ..manifest import Item, Reject
from .base import Builder, Layout, declared_then_found, not_accepted, register, stem_ext

if TYPE_CHECKING:
    from ..config_types import SourceConfig


class Pattern(Layout):
    name = "pattern"
    incremental = True  # a file's item depends on its own path: h5batch sync rediscovers incrementally

    def build(self, root: Path, src: SourceConfig, b: Builder, files: Sequence[tuple[str, int, int]],
              splits: list[str] | None) -> list[str]:
        # Names looked up once, not per file: this loop runs for every file of the corpus.
        rx = re.compile(src.pattern or "")
        match, names = rx.fullmatch, rx.groupindex
        fname = b.fields[0]
        exts, items, rejects = b.exts[fname], b.items, b.rejects
        label_group = src.label_group if src.label_group in names else None
        rule = src.split
        split_group = rule.group if rule.group in names else None
        by_value: dict[str, str | None] = {}  # split of each text of the split group met (ranges)
        for rel, size, mtime in files:
            key, e = stem_ext(rel)
            if e not in exts:
                rejects.append(Reject(rel, "discover", not_accepted(rel, b.accepted(fname))))
                continue
            m = match(rel)
            if m is None:
                rejects.append(Reject(rel, "discover", "path does not match source.pattern"))
                continue
            label = m.group(label_group) if label_group else None
            raw = m.group(split_group) if split_group else None
            if rule.ranges:
                split = by_value.get(raw) if raw is not None else None
                if split is None:
                    try:
                        value = int(raw)  # type: ignore[arg-type]
                    except (TypeError, ValueError):
                        rejects.append(Reject(rel, "discover", f"split group {rule.group!r} is not an integer: {raw!r}"))
                        continue
                    split = by_value[raw] = next((s for s, (lo, hi) in rule.ranges.items() if lo <= value <= hi),
                                                 rule.default)
            else:
                split = raw or rule.default
            # The groups, for fields of values and split rules (annotate.py); kept only where read.
            columns = tuple((k, v) for k, v in m.groupdict().items() if v is not None) if b.wants_columns else ()
            items.append(Item(key, split, (rel,), label, (), columns), ((size, mtime),))
        return declared_then_found(src, b)


register(Pattern())
