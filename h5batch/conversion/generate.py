"""The optional first stage: make a named generated corpus where ``source.generate`` asks.

The default job of ``make convert`` converts a corpus it generates (``generate: demo``), so
that a fresh clone needs no data; the makers themselves live in :mod:`h5batch.generate`.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

from ..config import JobConfig
from ..errors import EXIT_BAD_INPUT, ConvertError


def needs_generating(job: JobConfig) -> bool:
    """Whether ``source.generate`` names a corpus whose root is missing or empty. A root
    holding anything is a corpus already (say, the user's own, given with
    ``--set source.root=...`` to a job that generates by default): it is used as it is."""
    root = Path(job.source.root)
    return bool(job.source.generate) and not (root.is_dir() and any(root.iterdir()))


def generate_corpus(job: JobConfig, say: Callable[[str], None]) -> None:
    """Create a generated corpus (``source.generate``) where :func:`needs_generating`."""
    if not needs_generating(job):
        return
    root = Path(job.source.root)
    from ..generate import CORPORA

    if job.source.generate not in CORPORA:
        raise ConvertError(f"{job.file}: source.generate: unknown corpus {job.source.generate!r} "
                           f"(known: {', '.join(CORPORA)})", EXIT_BAD_INPUT)
    say(f"generating the {job.source.generate} corpus into {root} ...")
    CORPORA[job.source.generate](root)
