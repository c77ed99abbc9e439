"""Files set aside, listed as excluded: ``source.exclude`` and ``source.limit``.

``source.exclude``: root-relative glob patterns naming files and folders that are not part
of the corpus (Speech Commands' ``_background_noise_`` folder, a ``README``).

Rule: an excluded file is still listed, as a reject of stage ``excluded`` with the pattern
that matched, so every file met is accounted for; ``policy.max_reject_fraction`` does not
count these. A pattern matches a path or any folder above it (``_background_noise_``
excludes everything inside it), with :mod:`fnmatch` rules (``*`` also crosses ``/``).

``source.limit`` (``convert --limit N``): a trial conversion of N input samples, chosen
deterministically and spread over the splits and classes.

Rule: the samples are shared out among the (split, class) groups in turn, as evenly as
their sizes allow, and each group gives samples evenly spaced in its natural key order, so
a class's first files (often one speaker, one session) are not all it shows. The samples
left out are listed as excluded (``left out by --limit N``), so the accounting stays whole;
the limit is part of the job, so a later run without it is another job and refuses the
output without ``--overwrite``.
"""

from __future__ import annotations

import fnmatch
import functools
import os
import re
from typing import TYPE_CHECKING

from ..format import STAGE_EXCLUDED as STAGE
from ..manifest import Items, Reject, natural_key

if TYPE_CHECKING:
    from ..config_types import SourceConfig
    from .base import Builder


def matching(path: str, patterns: list[str]) -> str | None:
    """The first pattern that excludes ``path`` (root-relative, POSIX), else None."""
    return next((pat for pat, rx in _compiled(tuple(patterns)) if rx.match(path)), None)


@functools.lru_cache(maxsize=16)
def _compiled(patterns: tuple[str, ...]) -> list[tuple[str, re.Pattern]]:
    """One regex per pattern, matching a path that the pattern matches or that lies in a
    folder it matches: ``fnmatch``'s translation of the pattern followed by ``(/.*)?``.
    Reason: this runs for every file of the corpus, and trying the path's folder prefixes
    one by one costs many matches. The same paths match: a prefix that matches ends where
    a ``/`` follows, which is what ``(/.*)?`` asks."""
    out = []
    for pat in patterns:
        t = fnmatch.translate(pat.rstrip("/"))  # '(?s:BODY)\\Z'
        if not (t.startswith("(?s:") and t.endswith(")\\Z")):  # pragma: no cover - another Python's format
            raise RuntimeError(f"unexpected fnmatch translation {t!r}")
        out.append((pat.rstrip("/"), re.compile(f"(?s:(?:{t[4:-3]})(?:/.*)?)\\Z")))
    return out


def apply(src: SourceConfig, b: Builder, root: str | None = None) -> None:
    """Move the items and rejects of excluded paths to excluded rejects; with ``root`` (a
    whole discovery), also list the files at its top that the patterns name and the layout
    did not look at (a ``README`` beside the split folders)."""
    if not src.exclude:
        return
    seen = {p for it in b.items for p in it.paths} | {r.path for r in b.rejects}
    for e in sorted(os.scandir(root), key=lambda e: e.name) if root else ():
        if e.is_file() and not e.name.startswith(".") and e.name not in seen:
            b.rejects.append(Reject(e.name, "discover", "top-level file"))  # excluded below if a pattern names it
    kept = Items()
    for it in b.items:
        hits = [(p, matching(p, src.exclude)) for p in it.paths]
        if not any(pat for _, pat in hits):
            kept.append(it)
            continue
        first = next(p for p, pat in hits if pat)
        for p, pat in hits:
            why = f"excluded by source.exclude {pat!r}" if pat else f"another file of its sample ({first}) is excluded"
            b.rejects.append(Reject(p, STAGE, why))
    b.items = kept
    rejects = []
    for r in b.rejects:
        pat = matching(r.path, src.exclude) if r.stage != STAGE else None
        if pat:
            r = Reject(r.path, STAGE, f"excluded by source.exclude {pat!r}")
        if r.reason != "top-level file":  # one no pattern names: not part of the corpus
            rejects.append(r)
    b.rejects = rejects


def limit(src: SourceConfig, b: Builder) -> None:
    """Keep ``src.limit`` of ``b.items``; the others become excluded rejects."""
    if src.limit is None or len(b.items) <= src.limit:
        return
    groups: dict[tuple, list[int]] = {}
    for i, it in enumerate(b.items):
        groups.setdefault((natural_key(it.split), natural_key(it.label or "")), []).append(i)
    members = [sorted(g, key=lambda i: natural_key(b.items.key(i))) for _, g in sorted(groups.items())]
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
    b.rejects.extend(Reject(p, STAGE, why) for i, it in enumerate(b.items) if i not in kept for p in it.paths)
    b.items = b.items.take(sorted(kept))
