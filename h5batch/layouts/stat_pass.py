"""A sync's stat pass (the layout's :meth:`~.base.Layout.walk`), started before the output
is opened, so that listing and stat-ing the corpus overlaps importing h5py, reading the
output's inventory and the rest of the sync's preparation.

Rule: :func:`started` yields a :class:`StatPass` (or None where the job cannot sync
incrementally, so nothing is walked for nothing) and ends it when the block ends, however
it ends: no process or thread outlives the discovery. The walk runs in a *forked child
process* where forking is safe (:func:`h5batch.forking.can_fork`), else on a thread.
Reason: the walk is a sync's largest fixed cost (~0.4 s for 100,000 files, mostly ``stat``
system calls); a thread releases the GIL in each call but must win it back after each
one, and the main thread, busy importing and reading, holds it for its whole switch
interval (5 ms): measured, the thread had done next to nothing when the main thread came
to wait for it (0.5 s of a 1.55 s sync spent waiting). A child has its own interpreter
and runs on the other core; it costs a fork (~5 ms, copy-on-write) and sends its result
as columns (the paths as the bytes of a numpy ``S`` array with their lookup hashes, sizes
and mtimes as int64: ~10 ms to read back for 100,000 files, against ~0.1 s to unpickle the
list of tuples; the paths are decoded only where they are used).
The child lists the corpus with its ``stat`` calls deferred (:class:`~.walker.Walker`'s
``defer``), then stats the first half of the files while a child of its own stats the
second (:func:`_stat_in_two`). Reason: the calls are ~80 % of the walk and they are what
one core cannot make faster; measured over 100,000 files (loaded machine, real-time
priority): walk done 0.37-0.48 s after the start, against 0.58-0.77 s on a thread with
the main thread idle, and 24-55 s on a thread beside a main thread that computes.

Both children are :class:`h5batch.forking.Child`: they keep no inherited descriptor (the
output's lock among them: should the sync be killed, the lock goes with the sync, not a
moment later) and ignore SIGINT (the sync decides). When the block ends early the first is
sent SIGTERM and ends the second before it goes. A child that dies or sends nothing usable
is not an error: its walk (or half of the stats) is done again by its parent.

The walk sees the corpus as it is a few milliseconds earlier than a walk after opening the
output would: the same as the user having started the sync a moment sooner. What the walk
finds goes into its own :class:`~.base.Builder` (rejects, symlinks), as before. Where the
sync then falls back to a full discovery (the output's inventory predates version 2, an
annotation file changed, ...), this walk was for nothing: it is stopped (its child killed)
before that discovery starts.
"""

from __future__ import annotations

import contextlib
import os
import pickle
import signal
import threading
from pathlib import Path
from typing import TYPE_CHECKING

import numpy as np

from ..fields import needs_every_value
from ..forking import Child
from ..inventory import name_hashes, names_of
from ..manifest import Reject
from .base import Builder, get
from .walker import stat_listed

if TYPE_CHECKING:
    from collections.abc import Iterator

    from ..config import JobConfig

__all__ = ["StatPass", "Walked", "started", "columns"]

_UTF8 = ("utf-8", "surrogateescape")  # undecodable bytes of a file name come back as they were
# Files below which the child stats them all itself: a second fork costs ~5-10 ms, ~2,000 stats.
SPLIT_MIN = 4096


class Walked:
    """A walk's files as columns, in the walk's order: ``stat`` (int64 ``(n, 2)``: size,
    mtime_ns) and the relative posix paths, as a list of str (``paths``) or as the numpy
    ``S`` array of their bytes with its :func:`~h5batch.inventory.name_hashes`
    (``names``, ``hashes``: what the child sends; a path is decoded where it is used)."""

    def __init__(self, stat: np.ndarray, paths: list[str] | None = None,
                 names: np.ndarray | None = None, hashes: np.ndarray | None = None):
        self.stat, self._paths, self.names, self.hashes = stat, paths, names, hashes

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

    def row(self, i: int) -> tuple[str, int, int]:
        """File ``i`` as a layout's walk gives it: ``(path, size, mtime_ns)``."""
        return self.path(i), int(self.stat[i, 0]), int(self.stat[i, 1])


def columns(files: list[tuple[str, int, int]]) -> Walked:
    """A layout's walk (a list of ``(path, size, mtime_ns)``) as :class:`Walked`."""
    stat = np.array([(f[1], f[2]) for f in files], dtype=np.int64).reshape(-1, 2)
    return Walked(stat, [f[0] for f in files])


class StatPass:
    """The layout's walk of ``job``'s corpus in a forked child, or on a thread (see the
    module docstring); ``ordered_walk`` off: a sync compares it in numpy, in any order."""

    def __init__(self, job: JobConfig):
        self.job = job
        self.builder = Builder(job)
        self.builder.ordered_walk = False
        self._result: tuple | None = None
        self._error: BaseException | None = None
        self._thread: threading.Thread | None = None
        self.from_child = False  # the result came from the child (else: walked here)
        self._child = Child.start(self._payload)
        if self._child is None:
            self._thread = threading.Thread(target=self._run, name="h5batch-stat-pass", daemon=True)
            self._thread.start()

    def _walk(self, split: bool = False) -> tuple[Walked, list[str] | None]:
        """The layout's walk; ``split`` (in the child): its stats deferred, then done by
        this process and a second child, half each (:func:`_stat_in_two`)."""
        src = self.job.source
        root = Path(src.root)
        b = self.builder
        b.defer_stat = split
        files, folders = get(src.layout).walk(root, src, b)
        if not split:
            return columns(files), folders
        paths = [f[0] for f in files]
        stat, failed = _stat_in_two(root, paths)
        if failed:  # gone or unreadable since the listing: the walk's own reject for it
            bad = {i for i, _ in failed}
            b.rejects += [Reject(paths[i], "discover", reason) for i, reason in failed]
            keep = [i for i in range(len(paths)) if i not in bad]
            paths, stat = [paths[i] for i in keep], stat[keep]
        names = names_of(paths)
        return Walked(stat, paths, names, name_hashes(names)), folders

    def _run(self) -> None:
        try:
            self._result = self._walk()
        except BaseException as e:  # handed to the caller by result()
            self._error = e

    def _payload(self) -> bytes:
        """(the child) The walk's columns and what it put in its builder, as one pickle."""
        signal.signal(signal.SIGTERM, _end_child)  # stop(): the second child goes too
        files, folders = self._walk(split=True)
        b = self.builder
        meta = {"folders": folders, "rejects": b.rejects, "symlinks": b.symlinks,
                "width": files.names.itemsize, "hashes": files.hashes.tobytes()}
        return pickle.dumps((meta, files.names.tobytes(), files.stat.tobytes()), protocol=pickle.HIGHEST_PROTOCOL)

    def _collect(self) -> None:
        """Read the child's result and reap it; where the child failed, died or was killed,
        walk here."""
        data = self._child.result()  # type: ignore[union-attr]
        self._child = None
        try:
            meta, blob, stat = pickle.loads(data)
        except Exception:  # noqa: BLE001 - see the docstring
            self.builder = Builder(self.job)
            self.builder.ordered_walk = False
            self._run()
            return
        b = self.builder
        b.rejects, b.symlinks = meta["rejects"], meta["symlinks"]
        self.from_child = True
        names = np.frombuffer(blob, dtype=f"S{meta['width']}")
        hashes = np.frombuffer(meta["hashes"], dtype=np.uint64)
        self._result = Walked(np.frombuffer(stat, dtype=np.int64).reshape(-1, 2), None, names, hashes), meta["folders"]

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
        """End the walk at once (the child, and the child it started, are ended), its
        result unread."""
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


def _stat_in_two(root: Path, paths: list[str]) -> tuple[np.ndarray, list[tuple[int, str]]]:
    """(the child) :func:`~.walker.stat_listed` of ``paths``, the second half in a child of
    this process (forked here: the walk's process has one thread), where there are enough
    of them to pay for a fork. A second child that fails has its half stat-ed here."""
    half = len(paths) // 2
    if len(paths) < SPLIT_MIN:
        return stat_listed(root, paths)
    global _second

    def second() -> bytes:
        stat, failed = stat_listed(root, paths[half:])
        return pickle.dumps((stat.tobytes(), failed), protocol=pickle.HIGHEST_PROTOCOL)

    signal.pthread_sigmask(signal.SIG_BLOCK, {signal.SIGTERM})  # until _second names the child
    try:
        child = Child.start(second)
        _second = child.pid if child is not None else 0
    finally:
        signal.pthread_sigmask(signal.SIG_UNBLOCK, {signal.SIGTERM})
    first, failed = stat_listed(root, paths[:half if child is not None else len(paths)])
    if child is None:
        return first, failed
    data = child.result()
    _second = 0
    try:
        stat_bytes, rest_failed = pickle.loads(data)
        rest = np.frombuffer(stat_bytes, dtype=np.int64).reshape(-1, 2)
    except Exception:  # noqa: BLE001 - the second child failed: its half here
        rest, rest_failed = stat_listed(root, paths[half:])
    return np.concatenate([first, rest]), failed + [(i + half, why) for i, why in rest_failed]


_second = 0  # (the child) the pid of the child that stats the second half, while it runs


def _end_child(signum, frame) -> None:
    """(the child) SIGTERM from :meth:`StatPass.stop`: end the second child, then this one."""
    if _second:
        with contextlib.suppress(OSError):
            os.kill(_second, signal.SIGKILL)
    os._exit(1)


@contextlib.contextmanager
def started(job: JobConfig) -> Iterator[StatPass | None]:
    """A :class:`StatPass` of ``job`` for the block (None: its discovery cannot be
    incremental), ended when the block ends: joined, or stopped when it ends by an
    exception."""
    if get(job.source.layout).cannot_sync_incrementally(job) or needs_every_value(job.fields):
        yield None
        return
    walk = StatPass(job)
    try:
        yield walk
    except BaseException:
        walk.stop()
        raise
    walk.stop()
