"""An undo journal that lets ``h5batch sync`` change a finished output in place, crash-safe.

HDF5 appends past the end of the file but rewrites metadata in place, so a killed process
can leave a file HDF5 cannot open. Rule: before any old byte of ``X.h5`` is overwritten, its
content goes to ``X.h5.sync-journal`` and the journal is fsync'ed; h5py writes through
:class:`JournalFile` (``fileobj`` driver), which does this. A sync commits by fsyncing the
file and removing the journal; until then :func:`rollback` restores the old file byte for
byte (a record cut short was never followed by its write). Old bytes are journaled once:
a later overwrite of the same range costs no ``fsync``. Writes past the old end go straight
to the file.

Journal layout: a header line ``h5batch-journal 1 <old size>``, then records of
``offset (8 bytes LE) | length (8) | crc32 of the bytes (4) | the old bytes``.

The file is flock'ed exclusively while open here, so a reader (shared lock) cannot open it
mid-sync, and a sync works on a copy when a reader has it open (:func:`readers_present`).
"""

from __future__ import annotations

import contextlib
import fcntl
import os
import struct
import zlib

SUFFIX = ".sync-journal"
_MAGIC = b"h5batch-journal 1 "
_REC = struct.Struct("<QQI")


def journal_path(path: str) -> str:
    return path + SUFFIX


def has_journal(path: str) -> bool:
    return os.path.exists(journal_path(path))


def readers_present(path: str) -> bool:
    """Whether another process has ``path`` open through HDF5 (it holds a shared flock;
    HDF5's own file locking, on by default). Local file systems only."""
    try:
        fd = os.open(path, os.O_RDONLY)
    except FileNotFoundError:
        return False
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except OSError:
        return True
    finally:
        os.close(fd)  # closing drops the probe's lock
    return False


def fsync_path(path: str) -> None:
    """``fsync`` the file or folder at ``path``."""
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def fsync_folder(path: str) -> None:
    """``fsync`` the folder holding ``path``: what makes a rename or a new name in it durable."""
    fsync_path(os.path.dirname(os.path.abspath(path)))


class JournalFile:
    """The output opened read-write for h5py, with every overwrite of its old bytes
    journaled first (see the module docstring). Pass it to ``h5py.File(obj, "r+")``."""

    def __init__(self, path: str):
        self.path = path
        self.fd = os.open(path, os.O_RDWR)
        try:
            fcntl.flock(self.fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except OSError:
            os.close(self.fd)
            raise BlockingIOError(f"{path} is open in another process; a sync cannot change it in place") from None
        self.old_size = os.fstat(self.fd).st_size
        self.pos = 0
        self.saved: list[tuple[int, int]] = []  # sorted, disjoint [start, end) ranges already journaled
        jp = journal_path(path)
        self.jfd = os.open(jp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
        os.write(self.jfd, _MAGIC + str(self.old_size).encode() + b"\n")
        os.fsync(self.jfd)
        fsync_folder(jp)
        self.closed = False

    # -- the file-object protocol h5py's fileobj driver uses --------------------------------

    def seek(self, pos: int, whence: int = 0) -> int:
        if whence == 0:
            self.pos = pos
        elif whence == 1:
            self.pos += pos
        else:
            self.pos = os.fstat(self.fd).st_size + pos
        return self.pos

    def tell(self) -> int:
        return self.pos

    def readinto(self, buf) -> int:
        mv = memoryview(buf).cast("B")
        n = os.preadv(self.fd, [mv], self.pos)
        self.pos += n
        return n

    def read(self, size: int = -1) -> bytes:
        if size is None or size < 0:
            size = max(0, os.fstat(self.fd).st_size - self.pos)
        buf = bytearray(size)
        n = self.readinto(buf)
        return bytes(buf[:n])

    def write(self, data) -> int:
        mv = memoryview(data).cast("B")
        n = len(mv)
        start = self.pos
        if start < self.old_size and self._save(start, min(start + n, self.old_size)):
            os.fsync(self.jfd)  # the old bytes' record is durable before they are overwritten
        done = 0
        while done < n:
            done += os.pwrite(self.fd, mv[done:], start + done)
        self.pos += n
        return n

    def truncate(self, size: int | None = None) -> int:
        size = self.pos if size is None else size
        if size < self.old_size and self._save(size, self.old_size):
            os.fsync(self.jfd)
        os.ftruncate(self.fd, size)
        return size

    def flush(self) -> None:
        """Nothing is buffered here: every write is made as it comes."""

    # -- journal -----------------------------------------------------------------------------

    def _save(self, start: int, end: int) -> bool:
        """Journal the old bytes of ``[start, end)`` not journaled yet; whether any were (the
        caller then fsyncs the journal before overwriting them)."""
        todo, pos = [], start
        for a, b in self.saved:
            if b <= pos:
                continue
            if a >= end:
                break
            if a > pos:
                todo.append((pos, a))
            pos = max(pos, b)
        if pos < end:
            todo.append((pos, end))
        if not todo:
            return False
        for a, b in todo:
            old = os.pread(self.fd, b - a, a)
            os.write(self.jfd, _REC.pack(a, len(old), zlib.crc32(old)) + old)
        self.saved = _merge(self.saved + todo)
        return True

    def commit(self) -> None:
        """Make the new file durable, then drop the journal: from here on it is the file."""
        os.fsync(self.fd)
        os.close(self.jfd)
        os.unlink(journal_path(self.path))
        fsync_folder(self.path)
        self.close()

    def close(self) -> None:
        if not self.closed:
            self.closed = True
            with contextlib.suppress(OSError):
                os.close(self.jfd)
            os.close(self.fd)  # drops the flock


def _merge(ranges: list[tuple[int, int]]) -> list[tuple[int, int]]:
    out: list[tuple[int, int]] = []
    for a, b in sorted(ranges):
        if out and a <= out[-1][1]:
            out[-1] = (out[-1][0], max(out[-1][1], b))
        else:
            out.append((a, b))
    return out


def rollback(path: str) -> bool:
    """Undo an interrupted in-place sync of ``path`` from its journal (True when there was
    one). Idempotent: a crash during the rollback is repaired by the next one."""
    jp = journal_path(path)
    try:
        with open(jp, "rb") as fh:
            data = fh.read()
    except FileNotFoundError:
        return False
    head, _, body = data.partition(b"\n")
    if not head.startswith(_MAGIC):  # cut short before its header was durable: nothing was written
        os.unlink(jp)
        return True
    old_size = int(head[len(_MAGIC):])
    fd = os.open(path, os.O_RDWR)
    try:
        pos = 0
        while pos + _REC.size <= len(body):
            off, n, crc = _REC.unpack_from(body, pos)
            old = body[pos + _REC.size: pos + _REC.size + n]
            if len(old) != n or zlib.crc32(old) != crc:
                break  # the record the crash cut short: its write never happened
            os.pwrite(fd, old, off)
            pos += _REC.size + n
        os.ftruncate(fd, old_size)
        os.fsync(fd)
    finally:
        os.close(fd)
    os.unlink(jp)
    fsync_folder(path)
    return True
