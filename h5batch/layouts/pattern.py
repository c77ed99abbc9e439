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
from pathlib import Path
from typing import TYPE_CHECKING

from ..manifest import Item, Reject
from .base import Builder, Layout, Walker, declared_then_found, not_accepted, register, stem

if TYPE_CHECKING:
    from ..config import SourceConfig
    from .stat_pass import Walked


class Pattern(Layout):
    name = "pattern"
    incremental = True  # a file's item depends on its own path: h5batch sync rediscovers incrementally

    def walk(self, root: Path, src: SourceConfig, b: Builder) -> tuple[list[tuple[str, int, int]], None]:
        walker = Walker(root, b.ordered_walk)
        files = walker.walk()
        b.walked(walker)
        return files, None

    def from_root_walk(self, root: Path, src: SourceConfig, b: Builder, walked: Walked) -> tuple[Walked, None]:
        return walked, None  # the pattern is matched against every file under the root

    def build(self, root: Path, src: SourceConfig, b: Builder, files: list[tuple[str, int, int]],
              splits: list[str] | None) -> list[str]:
        rx = re.compile(src.pattern or "")
        fname = b.fields[0]
        for rel, size, mtime in files:
            if not b.takes(fname, rel):
                b.rejects.append(Reject(rel, "discover", not_accepted(rel, b.accepted(fname))))
                continue
            m = rx.fullmatch(rel)
            if m is None:
                b.rejects.append(Reject(rel, "discover", "path does not match source.pattern"))
                continue
            groups = m.groupdict()
            label = groups.get(src.label_group)
            rule = src.split
            if rule.ranges:
                raw = groups.get(rule.group)
                try:
                    value = int(raw)  # type: ignore[arg-type]
                except (TypeError, ValueError):
                    b.rejects.append(Reject(rel, "discover", f"split group {rule.group!r} is not an integer: {raw!r}"))
                    continue
                split = next((s for s, (lo, hi) in rule.ranges.items() if lo <= value <= hi), rule.default)
            else:
                split = groups.get(rule.group) or rule.default
            b.stats[rel] = (size, mtime)
            columns = tuple((k, v) for k, v in groups.items() if v is not None)  # for value fields
            b.items.append(Item(stem(rel), split, (rel,), label, columns=columns))
        return declared_then_found(src, b)


register(Pattern())
