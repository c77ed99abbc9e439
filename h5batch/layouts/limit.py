"""``source.limit`` (``convert --limit N``): a trial conversion of N input samples, chosen
deterministically and spread over the splits and classes.

Rule: the samples are shared out among the (split, class) groups in turn, as evenly as
their sizes allow, and each group gives samples evenly spaced in its natural key order, so
a class's first files (often one speaker, one session) are not all it shows. The samples
left out are listed as excluded (``left out by --limit N``), so the accounting stays whole;
the limit is part of the job, so a later run without it is another job and refuses the
output without ``--overwrite``.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from ..format import STAGE_EXCLUDED
from ..manifest import Reject, natural_key

if TYPE_CHECKING:
    from ..config_types import SourceConfig
    from .base import Builder


def apply(src: SourceConfig, b: Builder) -> None:
    """Keep ``src.limit`` of ``b.items``; the others become excluded rejects."""
    if src.limit is None or len(b.items) <= src.limit:
        return
    groups: dict[tuple, list[int]] = {}
    for i, it in enumerate(b.items):
        groups.setdefault((natural_key(it.split), natural_key(it.label or "")), []).append(i)
    members = [sorted(g, key=lambda i: natural_key(b.items[i].key)) for _, g in sorted(groups.items())]
    quota = [0] * len(members)
    left = src.limit
    while left:
        for k, g in enumerate(members):
            if left and quota[k] < len(g):
                quota[k] += 1
                left -= 1
    kept: set[int] = set()
    for g, q in zip(members, quota):
        kept.update(g[int((j + 0.5) * len(g) / q)] for j in range(q))
    why = f"left out by --limit {src.limit} (source.limit)"
    b.rejects.extend(Reject(p, STAGE_EXCLUDED, why) for i, it in enumerate(b.items) if i not in kept for p in it.paths)
    b.items = [it for i, it in enumerate(b.items) if i in kept]
