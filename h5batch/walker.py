"""The file walker every layout lists its corpus with (:class:`Walker`).

Rule: every file under the root is either returned with its size and mtime or becomes a
reject with its reason; hidden files and folders (``.name``) are skipped; symlinks are
followed only while they stay inside the root (and not into a folder that contains them).

Two orders, the same files, sizes, mtimes and rejects. Ordered (discovery, the default):
each folder's entries by name, depth first. Unordered (a sync's stat pass, which compares
the walk with the output's inventory in numpy, in any order): each folder's entries in the
order the file system lists them. Reason: ``stat`` in listing order is what the file system
answers fastest, and the stat pass runs on every ``sync`` and on every ``convert`` that
finds its output already there.

Each folder is listed through an open descriptor of it, so that each ``stat`` resolves the
file's name in that folder (``fstatat``) rather than its whole path from the root.

A walk's files are :class:`Files`: columns (one buffer of paths, arrays of sizes and mtimes),
each ``(path, size, mtime_ns)`` made when read. Reason: a list of those tuples held ~200
bytes a file, the largest thing alive while a layout builds a million items.
"""

from __future__ import annotations

import operator
import os
from array import array
from pathlib import Path

from .manifest import _UTF8, Reject, Rows

__all__ = ["Files", "Walker"]

_name = operator.attrgetter("name")


class Files(Rows):
    """Files found by a walk, in the order found: ``files[i]`` is ``(relative posix path,
    size, mtime_ns)``."""

    def __init__(self):
        self._buf, self._ends, self._size, self._mtime = bytearray(), array("q"), array("q"), array("q")

    def add(self, path: str, size: int, mtime_ns: int) -> None:
        self._buf += path.encode(*_UTF8)
        self._ends.append(len(self._buf))
        self._size.append(size)
        self._mtime.append(mtime_ns)

    def _row(self, i: int) -> tuple[str, int, int]:
        return self._buf[self._ends[i - 1] if i else 0:self._ends[i]].decode(*_UTF8), self._size[i], self._mtime[i]


class Walker:
    """Lists regular files under a root, following symlinks only when they stay inside it.

    :meth:`walk` returns :class:`Files` (``(relative posix path, size, mtime_ns)`` per file); problems go to
    ``rejects`` and ``symlinks`` counts the symlinks met. A layout hands them to the builder
    with :meth:`.layouts.base.Builder.walked`.
    """

    def __init__(self, root: Path, ordered: bool = True):
        self.root = root
        self.ordered = ordered
        self.real_root = os.path.realpath(root)
        self.rejects: list[Reject] = []
        self.symlinks = 0  # the symlinks met (a sync rediscovers incrementally only without them)

    def _reject(self, path: str, reason: str) -> None:
        self.rejects.append(Reject(path, "discover", reason))

    def inside(self, path: str) -> bool:
        real = os.path.realpath(path)
        return real == self.real_root or real.startswith(self.real_root + os.sep)

    def walk(self, rel: str = "", out: Files | None = None, _stack: frozenset[str] = frozenset()) -> Files:
        """The files under ``rel`` (a folder relative to the root; the root itself by default),
        added to ``out`` where given."""
        out = Files() if out is None else out
        base = os.path.join(self.root, rel) if rel else str(self.root)
        _stack = _stack | {os.path.realpath(base)}  # real paths of the folders being walked
        try:
            fd = os.open(base, os.O_RDONLY | os.O_DIRECTORY)
        except OSError as e:
            self._reject(rel or ".", f"cannot list folder: {e.strerror}")
            return out
        try:  # the entries' stat() goes through fd: it stays open until they are done with
            with os.scandir(fd) as listing:
                # Unordered, each entry is let go once looked at (it holds its stat result).
                self._scan(sorted(listing, key=_name) if self.ordered else listing, base, rel, _stack, out)
        except OSError as e:  # the folder could not be read, or stopped being readable midway
            self._reject(rel or ".", f"cannot list folder: {e.strerror}")
        finally:
            os.close(fd)
        return out

    def _scan(self, entries, base: str, rel: str, _stack: frozenset[str], out: Files) -> None:
        prefix = f"{rel}/" if rel else ""
        for entry in entries:
            name = entry.name
            if name.startswith("."):
                continue
            relpath = prefix + name
            if entry.is_symlink():
                self.symlinks += 1
                path = os.path.join(base, name)  # entry.path is the bare name: listed through fd
                if not os.path.exists(path):
                    self._reject(relpath, "broken symlink")
                    continue
                if not self.inside(path):
                    self._reject(relpath, "symlink points outside the corpus root")
                    continue
            try:
                if entry.is_dir():
                    if entry.is_symlink() and os.path.realpath(os.path.join(base, name)) in _stack:
                        self._reject(relpath, "symlink loop: points to a folder that contains it")
                        continue
                    self.walk(relpath, out, _stack)
                    continue
                st = entry.stat()
            except OSError as e:
                self._reject(relpath, f"cannot stat: {e.strerror}")
                continue
            if not entry.is_file():
                self._reject(relpath, "not a regular file")
                continue
            out.add(relpath, st.st_size, st.st_mtime_ns)
