"""A corpus's whole-root walk in forked child processes (:func:`start`), which ``h5batch
sync`` starts from the job file alone, before the job is loaded (:func:`ahead_of`); the
stat pass (:mod:`h5batch.layouts.stat_pass`) takes it over and each incremental layout
derives its own walk from it (``Layout.from_root_walk``).

Rule: this module imports nothing of the job's (no numpy, no h5batch.config): only the
walker's rules (:mod:`h5batch.walker`) and the forked-child abstraction
(:mod:`h5batch.forking`). Reason: a sync's walk is its largest fixed cost (100,000 files:
~0.3 s of ``stat`` system calls over two processes), and the imports that loading the job
needs (numpy, the config classes: ~0.1 s) need not come first: started ahead of them, the
walk overlaps them.

Where the walker's C extension was built and the corpus is plain files and folders, the
child lists it in C (:func:`~h5batch.walker.scan_files`: the paths come out encoded, as the
stat loop reads them) and two threads stat a half each with the GIL released; 100,000 files
of one folder: ~0.13 s, against ~0.25 s listed through ``os.scandir``. Else the child lists
the corpus with its ``stat`` calls deferred (:class:`~h5batch.walker.Walker`'s
``defer``), then stats the files on two cores (:func:`_stat_in_two`): where the walker's C
loop was built (:data:`h5batch.walker.FAST_STAT`), it encodes the paths and two threads stat
a half each with the GIL released; else it stats the first half while a child of its own
stats the second, and encodes the paths while it waits for that half. Reason: the calls
are ~80 % of the walk and what one core cannot make faster; threads spare the second fork
and the second half's trip back through a pipe. The result is
sent as columns, without numpy: the paths as the bytes of a numpy ``S`` array (each padded
with NULs to the longest: a path holds no NUL), sizes and mtimes as int64 (``array``), the
rejects as ``(path, reason)``: :func:`unpack` hands them to the stat pass, which reads
them without a copy.

Both children are :class:`h5batch.forking.Child`: they keep no inherited descriptor and
ignore SIGINT; :meth:`RootWalk.end` sends the first SIGTERM, and it ends the second before
it goes. A child that dies or sends nothing usable is not an error: the stat pass walks
again. The walk ahead sees the corpus as it is a fraction of a second before a walk after
loading the job would: the same as the user having started the sync a moment sooner.
"""

from __future__ import annotations

import contextlib
import os
import pickle
import signal
from array import array
from pathlib import Path

from .forking import Child
from .walker import FAST_STAT, Walker, decoded_paths, scan_files, stat_in_two, stat_lists

__all__ = ["RootWalk", "start", "ahead_of", "unpack", "SPLIT_MIN"]

_UTF8 = ("utf-8", "surrogateescape")  # undecodable bytes of a file name come back as they were
# Files below which the child stats them all itself: a second fork costs ~5-10 ms, ~2,000 stats.
SPLIT_MIN = 4096


class RootWalk:
    """The walk of ``root`` (absolute) under way in a forked child. :meth:`take` hands the
    child over (once) to whoever reads its result; :meth:`end` ends a child not taken."""

    def __init__(self, root: str, child: Child):
        self.root, self._child = root, child

    def take(self) -> Child | None:
        child, self._child = self._child, None
        return child

    def end(self) -> None:
        if self._child is not None:
            self.take().end()  # type: ignore[union-attr]


def start(root: str | os.PathLike[str]) -> RootWalk | None:
    """The walk of the folder ``root`` in a forked child; None where ``root`` is no folder
    (a corpus that ``source.generate`` makes, a typo the job's checks report) or the
    process may not fork (:func:`h5batch.forking.can_fork`)."""
    where = os.path.abspath(root)
    if not os.path.isdir(where):
        return None
    child = Child.start(lambda: _walk(where))
    return RootWalk(where, child) if child is not None else None


def ahead_of(job_file: str, overrides: list[str]) -> RootWalk | None:
    """:func:`start` of the ``source.root`` that ``job_file`` names, ``--set
    source.root=...`` among ``overrides`` applied as the job's loading applies it (a YAML
    scalar; relative to the working folder). None where the file does not say (it is
    unreadable, not YAML, the root is not a string): loading the job reports what is wrong,
    and the stat pass then starts its own walk."""
    try:
        import yaml

        data = yaml.safe_load(Path(job_file).read_text())
        root = data["source"]["root"]
        for pair in overrides:
            key, sep, raw = pair.partition("=")
            if sep and key.strip() == "source.root":
                root = yaml.safe_load(raw)
    except Exception:  # noqa: BLE001 - see the docstring
        return None
    return start(root) if isinstance(root, str) and root else None


def unpack(data: bytes) -> tuple[bytes, array, list[tuple[str, str]], list[str]] | None:
    """What a walk's child sent: (the paths' UTF-8 bytes, each padded with NULs to the
    longest, int64 sizes then mtimes, rejects as ``(path, reason)``, the symlinks met); None
    where it sent nothing usable (it failed, died or was killed)."""
    try:
        blob, stat_bytes, rejects, links = pickle.loads(data)
    except Exception:  # noqa: BLE001 - see the docstring
        return None
    stat = array("q")
    stat.frombytes(stat_bytes)
    return blob, stat, rejects, links


def _walk(root: str) -> bytes:
    """(the child) The walk of ``root``, packed for :func:`unpack`: listed in C where the
    tree is plain files and folders (:func:`~h5batch.walker.scan_files`), else by the
    deferred :class:`~h5batch.walker.Walker`."""
    signal.signal(signal.SIGTERM, _end_child)  # RootWalk.end(): the second child goes too
    scanned = scan_files(root)
    if scanned is not None:
        blob, width, n = scanned
        stat, failed = _stat_blob_in_two(root, blob, width, n)
        paths = decoded_paths(blob, width) if failed else []
        rejects: list[tuple[str, str]] = []
        links: list[str] = []
    else:
        walker = Walker(Path(root), ordered=False, defer=True)
        rest = walker.walk()  # what is not a plain regular file (symlinks): stat-ed again below, as the others
        paths = walker.deferred + [f[0] for f in rest] if rest else walker.deferred
        stat, failed, blob = _stat_in_two(root, paths)
        rejects = [(r.path, r.reason) for r in walker.rejects]
        links = walker.links
    if failed:  # gone or unreadable since the listing: the walk's own reject for it
        bad = {i for i, _ in failed}
        rejects += [(paths[i], reason) for i, reason in failed]
        keep = [i for i in range(len(paths)) if i not in bad]
        n = len(paths)
        stat = array("q", [stat[i] for i in keep] + [stat[n + i] for i in keep])
        blob = _encoded([paths[i] for i in keep])
    return pickle.dumps((blob, stat.tobytes(), rejects, links), protocol=pickle.HIGHEST_PROTOCOL)


def _encoded(paths: list[str]) -> bytes:
    """The paths' UTF-8 bytes, each padded with NULs to the longest: the bytes of a numpy
    ``S`` array of them (a path holds no NUL), which the stat pass reads without a copy."""
    enc = [p.encode(*_UTF8) for p in paths]
    width = max(map(len, enc), default=0)
    return b"".join([e.ljust(width, b"\0") for e in enc])


def _stats(root: str, paths: list[str]) -> tuple[array, list[tuple[int, str]]]:
    """:func:`~h5batch.walker.stat_lists` of ``paths`` as one int64 ``array``: the sizes,
    then the mtimes."""
    sizes, mtimes, failed = stat_lists(Path(root), paths)
    stat = array("q", sizes)
    stat.extend(array("q", mtimes))
    return stat, failed


def _stat_in_two(root: str, paths: list[str]) -> tuple[array, list[tuple[int, str]], bytes]:
    """(the child) :func:`_stats` of ``paths``, the second half in a child of this process
    (forked here: the walk's process has one thread) where there are enough of them to pay
    for a fork, and the paths encoded (:func:`_encoded`) while that child works. A second
    child that fails has its half stat-ed here."""
    if FAST_STAT:
        return _stat_in_threads(root, paths)
    if len(paths) < SPLIT_MIN:
        return (*_stats(root, paths), _encoded(paths))
    half = len(paths) // 2
    global _second

    def second() -> bytes:
        stat, failed = _stats(root, paths[half:])
        return pickle.dumps((stat.tobytes(), failed), protocol=pickle.HIGHEST_PROTOCOL)

    signal.pthread_sigmask(signal.SIG_BLOCK, {signal.SIGTERM})  # until _second names the child
    try:
        child = Child.start(second)
        _second = child.pid if child is not None else 0
    finally:
        signal.pthread_sigmask(signal.SIG_UNBLOCK, {signal.SIGTERM})
    if child is None:
        return (*_stats(root, paths), _encoded(paths))
    first, failed = _stats(root, paths[:half])
    blob = _encoded(paths)
    data = child.result()
    _second = 0
    try:
        stat_bytes, rest_failed = pickle.loads(data)
        rest = array("q")
        rest.frombytes(stat_bytes)
    except Exception:  # noqa: BLE001 - the second child failed: its half here
        rest, rest_failed = _stats(root, paths[half:])
    a, b = len(first) // 2, len(rest) // 2
    stat = first[:a]
    stat.extend(rest[:b])
    stat.extend(first[a:])
    stat.extend(rest[b:])
    return stat, failed + [(i + half, why) for i, why in rest_failed], blob


def _stat_in_threads(root: str, paths: list[str]) -> tuple[array, list[tuple[int, str]], bytes]:
    """(the child) :func:`_stat_in_two` with the C loop: the paths encoded first (the loop
    reads them), then :func:`_stat_blob_in_two`."""
    blob = _encoded(paths)
    n = len(paths)
    return (*_stat_blob_in_two(root, blob, len(blob) // n if n else 1, n), blob)


def _stat_blob_in_two(root: str, blob: bytes, width: int, n: int) -> tuple[array, list[tuple[int, str]]]:
    """(the child) :func:`~h5batch.walker.stat_in_two` of the ``n`` paths of ``blob`` as one
    int64 ``array``: the sizes, then the mtimes."""
    sizes, mtimes, failed = stat_in_two(root, blob, width, n)
    sizes.extend(mtimes)
    return sizes, failed


_second = 0  # (the child) the pid of the child that stats the second half, while it runs


def _end_child(signum, frame) -> None:
    """(the child) SIGTERM from :meth:`RootWalk.end`: end the second child, then this one."""
    if _second:
        with contextlib.suppress(OSError):
            os.kill(_second, signal.SIGKILL)
    os._exit(1)
