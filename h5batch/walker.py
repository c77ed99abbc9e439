"""The file walker every layout lists its corpus with (:class:`Walker`).

Rule: every file under the root is either returned with its size and mtime or becomes a
reject with its reason; hidden files and folders (``.name``) are skipped; symlinks are
followed only while they stay inside the root (and not into a folder that contains them).

Two modes. Ordered (discovery): each folder's entries sorted by name, and each file's
identity (``st_dev``, ``st_ino``) kept for finding one file reached through several
symlinks. Unordered (a sync's stat pass, :mod:`h5batch.walk_ahead`): entries in listing order, no
identities, and each folder is listed through an open descriptor of it, so that each
``stat`` resolves the file's name in that folder instead of its whole path from the root
(``fstatat``; ~10 % of the pass over 100,000 files of one folder, which is the largest fixed
cost of a sync). Both give the same files, sizes, mtimes and rejects.

An unordered walk may also *defer* the regular files' ``stat`` (``defer=True``): their
paths are listed in :attr:`Walker.deferred` instead of the walk's result (a folder's
entries sorted out in one C-level pass, by their ``d_type``), and :func:`stat_lists` stats
any share of them afterwards, or :func:`stat_blob` from their encoded bytes. Reason: the
``stat`` calls are ~80 % of a walk (100,000 files: listing ~0.06 s, ``os.stat`` ~0.45 CPU-s
here, half of it building ``stat_result`` objects), and split over two cores they take half
the time (:mod:`h5batch.walk_ahead`). A file that cannot be stat-ed then is the same reject
as in a walk that stats at once.

:func:`stat_blob` runs the loop in C where setup.py's optional extension
``h5batch._stat_many`` was built (~0.25 CPU-s for those 100,000 files, with the GIL released,
so two threads of one process stat on two cores), else in Python through
:func:`stat_lists`; both give the same answers. The same extension lists a tree of plain
files and folders (:func:`scan_files`: ~0.04 s for those 100,000 files, against ~0.1 s for
the deferred walk's listing and ~0.04 s more to encode its paths for :func:`stat_blob`).

Rule: this module imports nothing at its top but the standard library (numpy and the
manifest's ``Reject`` on first use). Reason: a sync's walk starts before the job's
imports (:mod:`h5batch.walk_ahead`).
"""

from __future__ import annotations

import operator
import os
import threading
from array import array
from itertools import compress
from pathlib import Path
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from .manifest import Reject

__all__ = ["Walker", "stat_lists", "stat_blob", "stat_in_two", "scan_files", "decoded_paths", "FAST_STAT", "THREAD_MIN"]

try:  # setup.py's optional C loops (module docstring); None where the install built without them
    from ._stat_many import scan_tree as _c_scan_tree
    from ._stat_many import stat_blob as _c_stat_blob
except ImportError:
    _c_stat_blob = _c_scan_tree = None
FAST_STAT = _c_stat_blob is not None  # stat_blob releases the GIL: threads stat in parallel

_name = operator.attrgetter("name")
_is_plain = operator.methodcaller("is_file", follow_symlinks=False)  # a regular file, not through a symlink
_hidden = operator.methodcaller("startswith", ".")


def _plain_or_false(entry) -> bool:
    try:
        return entry.is_file(follow_symlinks=False)
    except OSError:
        return False
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
        self.defer = defer and not ordered  # regular files listed in deferred, stat-ed by stat_lists()
        self.deferred: list[str] = []  # (defer) the regular files' relative paths, not in walk()'s result
        # False: a sync's stat pass (h5batch.layouts.incremental), entries in listing order and
        # no file identities (it runs only where the corpus has no symlinks).
        self.ordered = ordered
        self.real_root = os.path.realpath(root)
        self.rejects: list[Reject] = []
        self.ids: dict[str, tuple[int, int]] = {}
        # The identities of the files walked in C, kept as (paths, devices, inodes) and made
        # a dict only where needed (all_ids): a tree walked in C holds no symlink, and only a
        # symlink met makes the builder look identities up (~40-55 ms for 100,000 files).
        # Read them through all_ids(), which merges both.
        self.id_blocks: list[tuple[list[str], list[int], list[int]]] = []
        self.links: list[str] = []  # the symlinks met (a sync rediscovers incrementally only without them)

    def all_ids(self) -> dict[str, tuple[int, int]]:
        """``(st_dev, st_ino)`` of every file walked, by path (:attr:`ids` and :attr:`id_blocks`)."""
        out = dict(self.ids)
        for paths, devs, inos in self.id_blocks:
            out.update(zip(paths, zip(devs, inos)))
        return out

    @property
    def symlinks(self) -> int:
        return len(self.links)

    def _reject(self, path: str, reason: str) -> None:
        # Imported on first use: a walk ahead of the job's imports has none (h5batch.walk_ahead).
        from .manifest import Reject

        self.rejects.append(Reject(path, "discover", reason))

    def inside(self, path: str) -> bool:
        real = os.path.realpath(path)
        return real == self.real_root or real.startswith(self.real_root + os.sep)

    def walk(self, rel: str = "", _stack: frozenset[str] = frozenset()) -> list[tuple[str, int, int]]:
        if self.ordered and not _stack and _c_scan_tree is not None:  # a walk's first call
            fast = self._listed_in_c(rel)
            if fast is not None:
                return fast
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
            self._reject(rel or ".", f"cannot list folder: {e.strerror}")
            return out
        try:  # the entries' stat() goes through fd: it stays open until they are done with
            self._scan(entries, str(base), rel, _stack, out)
        finally:
            if fd is not None:
                os.close(fd)
        return out

    def _listed_in_c(self, rel: str) -> list[tuple[str, int, int]] | None:
        """(ordered) The walk of ``rel`` through the C extension, where the tree below it is
        plain files and folders (:func:`scan_files`; None where it is not): the same files
        in the same order (a folder's entries by name, depth first: the paths sorted with
        ``/`` below every other character), sizes, mtimes, identities and rejects. Reason:
        100,000 files of one folder took 0.75 s through ``os.scandir`` and ``stat``, and
        ~0.25 s of a conversion's discovery this way."""
        base = os.path.join(self.root, rel) if rel else str(self.root)
        got = _c_scan_tree(base)
        if got is None:
            return None
        blob, width, n = got
        sizes, mtimes, failed, devs, inos = stat_in_two(base, blob, width, n, ids=True)
        names = decoded_paths(blob, width)
        prefix = f"{rel}/" if rel else ""
        bad = set()
        for i, why in failed:  # gone since the listing: the reject the walk gives it
            bad.add(i)
            self._reject(prefix + names[i], why)
        sep = b"/" in blob  # a nested tree: sorted by path components
        order = sorted(range(n), key=(lambda i: names[i].replace("/", "\0")) if sep else names.__getitem__)
        if bad:
            order = [i for i in order if i not in bad]
        # Reordered and zipped in C (itemgetter, map, zip), not in a loop over the files:
        # ~105 -> ~25 ms for 100,000 files.
        paths = _pick(order, names)
        if prefix:
            paths = list(map(prefix.__add__, paths))
        self.id_blocks.append((paths, _pick(order, devs), _pick(order, inos)))
        return list(zip(paths, _pick(order, sizes), _pick(order, mtimes)))

    def _scan(self, entries: list, base: str, rel: str, _stack: frozenset[str], out: list) -> None:
        prefix = f"{rel}/" if rel else ""
        if self.defer:  # regular files listed in self.deferred; the others take the path below
            try:  # one C-level pass (d_type: no system call): ~2x a loop over the entries
                plain = list(map(_is_plain, entries))
            except OSError:  # d_type unknown and lstat failed: the path below says what is wrong
                plain = [_plain_or_false(e) for e in entries]
            names = list(map(_name, compress(entries, plain)))
            if any(map(_hidden, names)):
                names = [n for n in names if n[0] != "."]
            self.deferred.extend(map(prefix.__add__, names) if prefix else names)
            entries = list(compress(entries, map(operator.not_, plain)))
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
                self._reject(relpath, f"cannot stat: {e.strerror}")
                continue
            if st is not None:
                if ids is not None:
                    ids[relpath] = (st.st_dev, st.st_ino)
                out.append((relpath, st.st_size, st.st_mtime_ns))
                continue
            path = os.path.join(base, name)  # entry.path is the bare name when listed through fd
            if entry.is_symlink():
                self.links.append(relpath)
                if not os.path.exists(path):
                    self._reject(relpath, "broken symlink")
                    continue
                if not self.inside(path):
                    self._reject(relpath, "symlink points outside the corpus root")
                    continue
            try:
                if entry.is_dir():
                    if entry.is_symlink() and os.path.realpath(path) in _stack:
                        self._reject(relpath, "symlink loop: points to a folder that contains it")
                        continue
                    out.extend(self.walk(relpath, _stack))
                    continue
                st = entry.stat()
            except OSError as e:
                self._reject(relpath, f"cannot stat: {e.strerror}")
                continue
            if not entry.is_file():
                self._reject(relpath, "not a regular file")
                continue
            self.ids[relpath] = (st.st_dev, st.st_ino)
            out.append((relpath, st.st_size, st.st_mtime_ns))


def stat_lists(root: Path, paths: list[str]) -> tuple[list[int], list[int], list[tuple[int, str]]]:
    """(sizes, mtimes_ns, failed) of ``paths``, as lists (no numpy: a walk ahead of the
    job's imports runs before numpy is imported). Each run of one folder's files is stat-ed
    through one descriptor of the folder, as the unordered walk does."""
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
    return sizes, mtimes, failed


def stat_blob(root: str, blob: bytes, width: int, start: int, stop: int, ids: bool = False) -> tuple:
    """(sizes, mtimes_ns, failed) of the entries ``start:stop`` of ``blob``: paths relative
    to ``root``, UTF-8 (``surrogateescape``) and each padded with NULs to ``width`` bytes
    (the bytes of a numpy ``S`` array of them). Sizes and mtimes as int64 arrays (-1
    where the stat failed); ``failed`` as :func:`stat_lists` gives it, its indexes counted
    from the blob's start. ``ids``: also each file's ``st_dev`` and ``st_ino`` (uint64
    arrays, 0 where it failed; the C loop only). In C where the extension was built (module
    docstring), else through :func:`stat_lists`. Raises ValueError where the slice is not
    in the blob."""
    if start < 0 or stop < start or (stop > start and (width <= 0 or stop > len(blob) // width)):
        raise ValueError(f"stat_blob: entries {start}:{stop} of width {width} are not in a blob of {len(blob)} bytes")
    if _c_stat_blob is not None:
        raw = _c_stat_blob(root, blob, width, start, stop, ids)
        out = [array("q"), array("q"), [(i, f"cannot stat: {os.strerror(err)}") for i, err in raw[2]]]
        out[0].frombytes(raw[0])
        out[1].frombytes(raw[1])
        for more in raw[3:]:  # ids: the devices, the inodes
            out.append(array("Q"))
            out[-1].frombytes(more)
        return tuple(out)
    if ids:
        raise ValueError("stat_blob: ids need the C extension (h5batch._stat_many)")
    paths = [blob[i * width:(i + 1) * width].rstrip(b"\0").decode("utf-8", "surrogateescape")
             for i in range(start, stop)]
    s, m, failed = stat_lists(Path(root), paths)
    return array("q", s), array("q", m), [(i + start, why) for i, why in failed]


THREAD_MIN = 1024  # files below which one thread stats them all (a second costs ~0.1 ms, ~50 stats)


def stat_in_two(root: str, blob: bytes, width: int, n: int, ids: bool = False) -> tuple:
    """:func:`stat_blob` of all ``n`` paths of ``blob``, the second half on a second thread
    (the C loop releases the GIL: two cores stat), joined before it returns (a process with
    a thread may not fork: :mod:`h5batch.forking`); a thread that failed has its half
    stat-ed here."""
    half = n // 2 if n >= THREAD_MIN else n
    second: list = []
    t = threading.Thread(target=lambda: second.append(stat_blob(root, blob, width, half, n, ids)), daemon=True)
    if half < n:
        t.start()
    out = stat_blob(root, blob, width, 0, half, ids)
    if half < n:
        t.join()
        for column, more in zip(out, second[0] if second else stat_blob(root, blob, width, half, n, ids)):
            column.extend(more)  # failures' indexes are counted from the blob's start
    return out


def _pick(order: list[int], values) -> list:
    """``[values[i] for i in order]``, in C."""
    if len(order) < 2:
        return [values[i] for i in order]
    return list(operator.itemgetter(*order)(values))


def decoded_paths(blob: bytes, width: int) -> list[str]:
    """The paths of a blob as :func:`stat_blob` takes them (NUL-padded UTF-8)."""
    return [blob[i:i + width].rstrip(b"\0").decode("utf-8", "surrogateescape") for i in range(0, len(blob), width)]


def scan_files(root: str) -> tuple[bytes, int, int] | None:
    """The regular files under ``root`` as :func:`stat_blob` takes them: ``(blob, width,
    count)``, the relative paths in listing order, hidden names skipped as :class:`Walker`
    skips them. None where the C extension was not built, or where the tree holds anything
    but regular files and folders (a symlink, a special file, a folder that cannot be
    listed): :class:`Walker` then walks it, and says what each such entry is."""
    return _c_scan_tree(root) if _c_scan_tree is not None else None
