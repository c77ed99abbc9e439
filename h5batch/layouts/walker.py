"""The file walker every layout lists its corpus with (:class:`Walker`).

Rule: every file under the root is either returned with its size and mtime or becomes a
reject with its reason; hidden files and folders (``.name``) are skipped; symlinks are
followed only while they stay inside the root (and not into a folder that contains them).

Two modes. Ordered (discovery): each folder's entries sorted by name, and each file's
identity (``st_dev``, ``st_ino``) kept for finding one file reached through several
symlinks. Unordered (a sync's stat pass, :mod:`.stat_pass`): entries in listing order, no
identities, and each folder is listed through an open descriptor of it, so that each
``stat`` resolves the file's name in that folder instead of its whole path from the root
(``fstatat``; ~10 % of the pass over 100,000 files of one folder, which is the largest fixed
cost of a sync). Both give the same files, sizes, mtimes and rejects.

An unordered walk may also *defer* the regular files' ``stat`` (``defer=True``): they are
listed with size and mtime -1, and :func:`stat_listed` stats any share of them afterwards.
Reason: the ``stat`` calls are ~80 % of a walk (100,000 files: listing ~0.1 s, stat-ing
~0.4 s, in C as in Python: the system call is the cost), and split over two processes
they take half the time (:mod:`.stat_pass`). A file that cannot be stat-ed then is the
same reject as in a walk that stats at once.
"""

from __future__ import annotations

import operator
import os
from pathlib import Path

import numpy as np

from ..manifest import Reject

__all__ = ["Walker", "stat_listed"]

_name = operator.attrgetter("name")
# Listing a folder through its descriptor needs scandir(fd) (fdopendir): POSIX systems.
_BY_FD = os.scandir in os.supports_fd and hasattr(os, "O_DIRECTORY")


class Walker:
    """Lists regular files under a root, following symlinks only when they stay inside it.

    :meth:`walk` returns ``(relative posix path, size, mtime_ns)`` per file; problems go to
    ``rejects``, and ``ids`` maps each file's path to the ``(st_dev, st_ino)`` of the file it
    resolves to (from the same ``stat`` that gave its size: no extra system call), which
    :meth:`.base.Builder.finish` uses to find one file reached through several symlinks. A
    layout hands both to the builder with :meth:`.base.Builder.walked`.
    """

    def __init__(self, root: Path, ordered: bool = True, defer: bool = False):
        self.root = root
        self.defer = defer and not ordered  # regular files listed now, stat-ed by stat_listed()
        # False: a sync's stat pass (h5batch.layouts.incremental), entries in listing order and
        # no file identities (it runs only where the corpus has no symlinks).
        self.ordered = ordered
        self.real_root = os.path.realpath(root)
        self.rejects: list[Reject] = []
        self.ids: dict[str, tuple[int, int]] = {}
        self.symlinks = 0  # symlinks met (a sync rediscovers incrementally only without them)

    def inside(self, path: str) -> bool:
        real = os.path.realpath(path)
        return real == self.real_root or real.startswith(self.real_root + os.sep)

    def walk(self, rel: str = "", _stack: frozenset[str] = frozenset()) -> list[tuple[str, int, int]]:
        out: list[tuple[str, int, int]] = []
        base = self.root / rel if rel else self.root
        _stack = _stack | {os.path.realpath(base)}  # real paths of the folders being walked
        fd = None
        try:
            if self.ordered or not _BY_FD:
                entries = sorted(os.scandir(base), key=_name) if self.ordered else list(os.scandir(base))
            else:  # listed through the folder's descriptor: each stat resolves one name (module docstring)
                fd = os.open(base, os.O_RDONLY | os.O_DIRECTORY)
                entries = list(os.scandir(fd))
        except OSError as e:
            if fd is not None:
                os.close(fd)
            self.rejects.append(Reject(rel or ".", "discover", f"cannot list folder: {e.strerror}"))
            return out
        try:  # the entries' stat() goes through fd: it stays open until they are done with
            self._scan(entries, str(base), rel, _stack, out)
        finally:
            if fd is not None:
                os.close(fd)
        return out

    def _scan(self, entries: list, base: str, rel: str, _stack: frozenset[str], out: list) -> None:
        prefix = f"{rel}/" if rel else ""
        if self.defer:  # regular files listed (-1: stat later); the others take the path below
            rest = []
            for entry in entries:
                name = entry.name
                if name[0] == ".":
                    continue
                try:
                    if entry.is_file(follow_symlinks=False):  # no system call where d_type says
                        out.append((prefix + name, -1, -1))
                        continue
                except OSError:
                    pass  # the path below says what is wrong with it
                rest.append(entry)
            entries = rest
        ids = self.ids if self.ordered else None
        for entry in entries:
            name = entry.name
            if name.startswith("."):
                continue
            relpath = prefix + name
            try:  # the common case first: a regular file (is_symlink/is_file: no system call)
                plain = not entry.is_symlink() and entry.is_file()
                st = entry.stat() if plain else None
            except OSError as e:
                self.rejects.append(Reject(relpath, "discover", f"cannot stat: {e.strerror}"))
                continue
            if st is not None:
                if ids is not None:
                    ids[relpath] = (st.st_dev, st.st_ino)
                out.append((relpath, st.st_size, st.st_mtime_ns))
                continue
            path = os.path.join(base, name)  # entry.path is the bare name when listed through fd
            if entry.is_symlink():
                self.symlinks += 1
                if not os.path.exists(path):
                    self.rejects.append(Reject(relpath, "discover", "broken symlink"))
                    continue
                if not self.inside(path):
                    self.rejects.append(Reject(relpath, "discover", "symlink points outside the corpus root"))
                    continue
            try:
                if entry.is_dir():
                    if entry.is_symlink() and os.path.realpath(path) in _stack:
                        self.rejects.append(Reject(relpath, "discover", "symlink loop: points to a folder that contains it"))
                        continue
                    out.extend(self.walk(relpath, _stack))
                    continue
                st = entry.stat()
            except OSError as e:
                self.rejects.append(Reject(relpath, "discover", f"cannot stat: {e.strerror}"))
                continue
            if not entry.is_file():
                self.rejects.append(Reject(relpath, "discover", "not a regular file"))
                continue
            self.ids[relpath] = (st.st_dev, st.st_ino)
            out.append((relpath, st.st_size, st.st_mtime_ns))


def stat_listed(root: Path, paths: list[str]) -> tuple[np.ndarray, list[tuple[int, str]]]:
    """Size and mtime_ns (int64 ``(n, 2)``) of each of ``paths`` (files of a deferred walk
    under ``root``), and ``(index, reason)`` of those that could not be stat-ed (their rows
    -1). Each run of one folder's files is stat-ed through one descriptor of the folder, as
    the unordered walk does."""
    sizes: list[int] = []
    mtimes: list[int] = []
    failed: list[tuple[int, str]] = []
    base = str(root)
    folder, fd, folder_error = None, -1, ""
    stat = os.stat
    try:
        for i, rel in enumerate(paths):
            d, _, name = rel.rpartition("/")
            if d != folder:
                if fd >= 0:
                    os.close(fd)
                folder, fd, folder_error = d, -1, ""
                try:
                    fd = os.open(os.path.join(base, d) if d else base, os.O_RDONLY | os.O_DIRECTORY)
                except OSError as e:
                    folder_error = f"cannot stat: {e.strerror}"
            try:
                if fd < 0:
                    raise OSError(folder_error)
                st = stat(name, dir_fd=fd)
            except OSError as e:
                failed.append((i, e.strerror and f"cannot stat: {e.strerror}" or str(e)))
                sizes.append(-1)
                mtimes.append(-1)
                continue
            sizes.append(st.st_size)
            mtimes.append(st.st_mtime_ns)
    finally:
        if fd >= 0:
            os.close(fd)
    return np.ascontiguousarray(np.array([sizes, mtimes], dtype=np.int64).T), failed
