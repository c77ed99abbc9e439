"""``source.exclude``: root-relative glob patterns naming files and folders that are not
part of the corpus (Speech Commands' ``_background_noise_`` folder, a ``README``).

Rule: an excluded file is still listed, as a reject of stage ``excluded`` with the pattern
that matched, so every file met is accounted for; ``policy.max_reject_fraction`` does not
count these. A pattern matches a path or any folder above it (``_background_noise_``
excludes everything inside it), with :mod:`fnmatch` rules (``*`` also crosses ``/``).
"""

from __future__ import annotations

from fnmatch import fnmatchcase
from typing import TYPE_CHECKING

from ..format import STAGE_EXCLUDED as STAGE
from ..manifest import Reject

if TYPE_CHECKING:
    from ..config import SourceConfig
    from .base import Builder


def matching(path: str, patterns: list[str]) -> str | None:
    """The first pattern that excludes ``path`` (root-relative, POSIX), else None."""
    parts = path.split("/")
    prefixes = ["/".join(parts[:i]) for i in range(1, len(parts) + 1)]
    for pat in patterns:
        pat = pat.rstrip("/")
        if any(fnmatchcase(p, pat) for p in prefixes):
            return pat
    return None


def apply(src: SourceConfig, b: Builder) -> None:
    """Move the items and rejects of excluded paths to excluded rejects."""
    if not src.exclude:
        return
    kept = []
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
    for i, r in enumerate(b.rejects):
        if r.stage != STAGE:
            pat = matching(r.path, src.exclude)
            if pat:
                b.rejects[i] = Reject(r.path, STAGE, f"excluded by source.exclude {pat!r}")
