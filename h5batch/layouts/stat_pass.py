"""A sync's stat pass: the corpus's files with their sizes and mtimes, walked while the
sync imports, opens the output and reads its inventory.

Rule: :func:`started` yields a :class:`StatPass` (or None where the job cannot sync
incrementally, so nothing is walked for nothing) and ends it when the block ends, however
it ends: no process or thread outlives the discovery. Where this process may fork
(:func:`h5batch.forking.can_fork`) the walk is :mod:`h5batch.walk_ahead`'s whole-root walk
in forked children: the one ``h5batch sync`` started from the job file before loading the
job, when it walked this job's root, else one started here; the layout then derives its own
walk from it (``Layout.from_root_walk``: the same files and rejects as its
:meth:`~.base.Layout.walk`). Else the layout's walk runs on a thread.
Reason: the walk is a sync's largest fixed cost (~0.3 s for 100,000 files, mostly ``stat``
system calls). A thread releases the GIL in each call but must win it back after each one,
and the main thread, busy importing and reading, holds it for its whole switch interval
(5 ms): measured, the thread had done next to nothing when the main thread came to wait for
it (0.5 s of a 1.55 s sync spent waiting). Children have their own interpreters and run on
the other core; their result comes back as columns (the paths' bytes, int64 sizes and
mtimes: ~10 ms to read back for 100,000 files, against ~0.1 s to unpickle a list of
tuples; the paths are decoded only where they are used).

A child that dies or sends nothing usable is not an error: the layout's walk is done again
here. What the walk finds goes into the pass's own :class:`~.base.Builder` (rejects,
symlinks), as the layout's walk puts it. Where the sync then falls back to a full discovery
(the output's inventory predates version 2, an annotation file changed, ...), this walk was
for nothing: it is stopped (its children killed) before that discovery starts.
"""

from __future__ import annotations

import contextlib
import os
import threading
from pathlib import Path
from typing import TYPE_CHECKING

import numpy as np

from .. import walk_ahead
from ..fields import needs_every_value
from ..inventory import name_hashes, names_of
from ..manifest import Reject
from .base import Builder, get

if TYPE_CHECKING:
    from collections.abc import Iterator

    from ..config import JobConfig
    from ..walk_ahead import RootWalk

__all__ = ["StatPass", "Walked", "started", "columns"]

_UTF8 = ("utf-8", "surrogateescape")  # undecodable bytes of a file name come back as they were


class Walked:
    """A walk's files as columns, in the walk's order: ``stat`` (int64 ``(n, 2)``: size,
    mtime_ns) and the relative posix paths, as a list of str (``paths``) or as the numpy
    ``S`` array of their bytes with its :func:`~h5batch.inventory.name_hashes`
    (``names``, ``hashes``: what the child sends; a path is decoded where it is used)."""

    def __init__(self, stat: np.ndarray, paths: list[str] | None = None,
                 names: np.ndarray | None = None, hashes: np.ndarray | None = None):
        self.stat, self._paths, self.names, self.hashes = stat, paths, names, hashes
        self.links: list[str] = []  # (a whole-root walk) the symlinks it met, as relative paths

    def __len__(self) -> int:
        return len(self.stat)

    @property
    def paths(self) -> list[str]:
        if self._paths is None:
            self._paths = [b.decode(*_UTF8) for b in self.names.tolist()]  # type: ignore[union-attr]
        return self._paths

    def path(self, i: int) -> str:
        return self._paths[i] if self._paths is not None else bytes(self.names[i]).decode(*_UTF8)  # type: ignore[index]

    def contains(self, paths: list[str]) -> list[bool]:
        """Whether the walk found each of ``paths`` (by hash and bytes: no path of the
        walk decoded; by a set of the paths where two of the walk's hashes collide)."""
        if not paths or not len(self):
            return [False] * len(paths)
        if self.names is not None:
            by = np.argsort(self.hashes, kind="stable")
            hashes = self.hashes[by]
            if not (hashes[1:] == hashes[:-1]).any():
                want = names_of(paths)
                sought = name_hashes(want)
                at = np.minimum(np.searchsorted(hashes, sought), len(hashes) - 1)
                return ((hashes[at] == sought) & (self.names[by[at]] == want)).tolist()
        found = set(self.paths)
        return [p in found for p in paths]

    def subset(self, keep: np.ndarray) -> Walked:
        """The files where the boolean mask ``keep`` is set, in the same order."""
        paths = None if self._paths is None else [p for p, k in zip(self._paths, keep.tolist()) if k]
        names = None if self.names is None else self.names[keep]
        hashes = None if self.hashes is None else self.hashes[keep]
        return Walked(self.stat[keep], paths, names, hashes)

    def row(self, i: int) -> tuple[str, int, int]:
        """File ``i`` as a layout's walk gives it: ``(path, size, mtime_ns)``."""
        return self.path(i), int(self.stat[i, 0]), int(self.stat[i, 1])


def columns(files: list[tuple[str, int, int]]) -> Walked:
    """A layout's walk (a list of ``(path, size, mtime_ns)``) as :class:`Walked`."""
    stat = np.array([(f[1], f[2]) for f in files], dtype=np.int64).reshape(-1, 2)
    return Walked(stat, [f[0] for f in files])


class StatPass:
    """The walk of ``job``'s corpus in forked children (``ahead``'s, or one started here),
    or the layout's walk on a thread (see the module docstring); unordered: a sync compares
    it in numpy, in any order."""

    def __init__(self, job: JobConfig, ahead: RootWalk | None = None):
        self.job = job
        self.builder = Builder(job)
        self.builder.ordered_walk = False
        self._result: tuple | None = None
        self._error: BaseException | None = None
        self._thread: threading.Thread | None = None
        self.from_child = False  # the result came from the children (else: walked here)
        if ahead is None:
            ahead = walk_ahead.start(job.source.root)
        self._child = ahead.take() if ahead is not None else None
        if self._child is None:
            self._thread = threading.Thread(target=self._run, name="h5batch-stat-pass", daemon=True)
            self._thread.start()

    def _walk(self) -> tuple[Walked, list[str] | None]:
        """The layout's own walk, here."""
        src = self.job.source
        files, folders = get(src.layout).walk(Path(src.root), src, self.builder)
        return columns(files), folders

    def _run(self) -> None:
        try:
            self._result = self._walk()
        except BaseException as e:  # handed to the caller by result()
            self._error = e

    def _collect(self) -> None:
        """Read the children's walk and reap them, and derive the layout's walk from it;
        where the children failed, died or were killed, walk here."""
        got = walk_ahead.unpack(self._child.result())  # type: ignore[union-attr]
        self._child = None
        if got is None:
            self._run()
            return
        blob, stat, rejects, links = got
        n = len(stat) // 2
        names = np.frombuffer(blob, dtype=f"S{len(blob) // n}") if n and blob else np.zeros(n, dtype="S1")
        walked = Walked(np.frombuffer(stat, dtype=np.int64).reshape(2, n).T.copy(), None, names, name_hashes(names))
        walked.links = links
        b = self.builder
        b.rejects = [Reject(path, "discover", reason) for path, reason in rejects]
        b.symlinks = bool(links)
        src = self.job.source
        try:
            self._result = get(src.layout).from_root_walk(Path(src.root), src, b, walked)
        except BaseException as e:  # handed to the caller by result()
            self._error = e
        self.from_child = True

    @property
    def forked(self) -> bool:
        """Whether the walk runs (or ran, unread) in a child process."""
        return self._child is not None

    def running(self) -> bool:
        """Whether the walk is still under way (a child that has begun sending is done)."""
        if self._child is not None:
            return not self._child.done()
        return self._thread is not None and self._thread.is_alive()

    def join(self) -> None:
        if self._child is not None:
            self._collect()
        elif self._thread is not None:
            self._thread.join()

    def stop(self) -> None:
        """End the walk at once (the children are ended), its result unread."""
        if self._child is not None:
            self._child.end()
            self._child = None
        elif self._thread is not None:
            self._thread.join()

    def result(self) -> tuple[Builder, Walked, list[str] | None]:
        """(the walk's builder, files, split folders), as the layout's walk returned them;
        the walk's exception, if it raised one."""
        self.join()
        if self._error is not None:
            raise self._error
        files, folders = self._result  # type: ignore[misc]
        return self.builder, files, folders


@contextlib.contextmanager
def started(job: JobConfig, ahead: RootWalk | None = None) -> Iterator[StatPass | None]:
    """A :class:`StatPass` of ``job`` for the block (None: its discovery cannot be
    incremental), ended when the block ends: joined, or stopped when it ends by an
    exception. ``ahead``: a walk started before the job was loaded
    (:func:`h5batch.walk_ahead.ahead_of`), taken over where it walks the job's root, else
    ended."""
    if get(job.source.layout).cannot_sync_incrementally(job) or needs_every_value(job.fields):
        if ahead is not None:
            ahead.end()
        yield None
        return
    if ahead is not None and ahead.root != os.path.abspath(job.source.root):
        ahead.end()
        ahead = None
    walk = StatPass(job, ahead)
    try:
        yield walk
    except BaseException:
        walk.stop()
        raise
    walk.stop()
