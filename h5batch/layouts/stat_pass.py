"""A sync's stat pass (the layout's :meth:`~.base.Layout.walk`), started on a thread before
the output is opened, so that listing and stat-ing the corpus overlaps importing h5py and
reading the output's inventory.

Rule: :func:`started` yields a :class:`StatPass` (or None where the job cannot sync
incrementally, so nothing is walked for nothing) and joins its thread when the block ends,
however it ends: no thread outlives the discovery. Reason: the walk is a sync's largest
fixed cost (~0.3 s for 100,000 files, mostly ``stat`` system calls, which release the GIL),
and the output's side (h5py's import, the inventory's datasets) costs ~0.1-0.2 s more on the
same path; run one after the other they add up.

The walk sees the corpus as it is a few milliseconds earlier than a walk after opening the
output would: the same as the user having started the sync a moment sooner. What the walk
finds goes into its own :class:`~.base.Builder` (rejects, symlinks), as before. Where the
sync then falls back to a full discovery (the output's inventory predates version 2, an
annotation file changed, ...), this walk was for nothing: it runs beside that discovery's
own walk and is joined after it.
"""

from __future__ import annotations

import contextlib
import threading
from pathlib import Path
from typing import TYPE_CHECKING

from ..fields import value_fields
from .base import Builder, get

if TYPE_CHECKING:
    from collections.abc import Iterator

    from ..config import JobConfig

__all__ = ["StatPass", "started"]


class StatPass:
    """The layout's walk of ``job``'s corpus, on a thread (``ordered_walk`` off: a sync
    compares it in numpy, in any order)."""

    def __init__(self, job: JobConfig):
        self.job = job
        self.builder = Builder(job)
        self.builder.ordered_walk = False
        self._result: tuple | None = None
        self._error: BaseException | None = None
        self._thread = threading.Thread(target=self._run, name="h5batch-stat-pass", daemon=True)
        self._thread.start()

    def _run(self) -> None:
        try:
            src = self.job.source
            self._result = get(src.layout).walk(Path(src.root), src, self.builder)
        except BaseException as e:  # handed to the caller by result()
            self._error = e

    def join(self) -> None:
        self._thread.join()

    def result(self) -> tuple[Builder, list[tuple[str, int, int]], list[str] | None]:
        """(the walk's builder, files, split folders), as the layout's walk returned them;
        the walk's exception, if it raised one."""
        self.join()
        if self._error is not None:
            raise self._error
        files, folders = self._result  # type: ignore[misc]
        return self.builder, files, folders


@contextlib.contextmanager
def started(job: JobConfig) -> Iterator[StatPass | None]:
    """A :class:`StatPass` of ``job`` for the block (None: its discovery cannot be
    incremental), joined when the block ends."""
    layout = get(job.source.layout)
    if layout.cannot_sync_incrementally(job) or value_fields(job.fields):
        yield None
        return
    walk = StatPass(job)
    try:
        yield walk
    finally:
        walk.join()
