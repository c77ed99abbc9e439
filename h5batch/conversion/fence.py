"""The fence between decoders that write the output's chunks and the writer's own writes there.

Rule: a decoder writes a group of a placed batch's chunks (:mod:`.direct_chunks`) only
while it holds a shared lock on the batch's byte of ``<partial>.fence`` and that byte is
still 0. Before the driver hands a placed batch's result to the writer, it closes the batch:
it takes the byte's exclusive lock (waiting for a write in progress to end) and sets it to
1. From then on the writer alone writes the batch's chunks, and it writes a batch's chunks
only while storing that batch or a later one of its split (rows only move down: a batch
lands at or before its placed row), so every batch whose chunks the writer touches is
closed first. At the run's end, whatever the outcome, the driver closes every batch and
unlinks the file; a run that finds one left by a killed run does the same before it starts.
A decoder that cannot open the file, or finds its byte locked or set, writes nothing more
of the batch: the rest travels through shared memory.

Reason: a copy of a batch may still run when its result is in. Dask may run a task twice
(a worker it gave up for lost can still finish it), and the workers of a cluster the driver
does not own outlive a killed driver. Where no row moved, such a late copy writes the bytes
already there; after a reject, the writer moves later rows down into chunks placed for
others, and a late copy would write over them, in a finished file as well. The driver knows
the end of every in-process decoder, but the same fence costs little there (a lock, a
1-byte read and an unlock per ~1 MiB group), so one rule serves both.

How: POSIX record locks (``fcntl.lockf``) on a file of one byte per batch; they hold between
processes on one host and on NFS, and need no cleanup (the kernel drops them with the
process). A process holds one descriptor per fence file for as long as the file exists,
because closing any descriptor of a file drops every lock the process holds on it, the
locks other threads hold included. POSIX locks do not exclude each other within one
process, so where decoders are threads of the driver's own process (a threaded Dask cluster
started in it, or a test) a lock of that process's own stands beside them (``_own``). A file
system without record locks (``ENOLCK``) gets no fence, and then no placed chunks: every
batch goes through shared memory.
"""

from __future__ import annotations

import errno
import fcntl
import os
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager, nullcontext

from ..errors import ConvertError
from .lock import NO_LOCKS

__all__ = ["path_for", "Fence", "retire_stale", "hold"]

WAIT_SECONDS = 60.0  # how long closing a batch waits for a decoder's write in progress
_BUSY = (errno.EAGAIN, errno.EACCES)
_CLOSED = b"\1"


def path_for(partial: str) -> str:
    """The fence file of the output being written at ``partial``."""
    return partial + ".fence"


class Fence:
    """The driver's side: the fence file of one run (see the module)."""

    def __init__(self, path: str, fd: int, batches: int):
        self.path, self.fd, self.batches = path, fd, batches

    @classmethod
    def create(cls, partial: str, batches: int) -> Fence | None:
        """A fence of ``batches`` open batches beside ``partial``; None where the file
        system has no record locks (then no batch may be placed)."""
        retire_stale(partial)  # (a new file, never the old one's bytes set back to 0)
        path = path_for(partial)
        fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_EXCL | getattr(os, "O_CLOEXEC", 0), 0o644)
        try:
            os.ftruncate(fd, batches)  # every byte 0: open
            fcntl.lockf(fd, fcntl.LOCK_EX | fcntl.LOCK_NB, 1, 0, os.SEEK_SET)
            fcntl.lockf(fd, fcntl.LOCK_UN, 1, 0, os.SEEK_SET)
        except OSError as e:
            os.close(fd)
            _unlink(path)
            if e.errno in NO_LOCKS:
                return None
            raise
        _own[path] = threading.Lock()
        return cls(path, fd, batches)

    def close(self, index: int) -> None:
        """From now on no decoder writes batch ``index``'s chunks (see the module)."""
        with _own[self.path]:
            _close_range(self.fd, index, 1, f"batch {index}")

    def retire(self) -> None:
        """Every batch closed and the file unlinked (the run is over, whatever the outcome)."""
        if self.fd < 0:
            return
        try:
            with _own[self.path]:
                _close_range(self.fd, 0, self.batches, "the run's last batches")
        finally:
            _unlink(self.path)
            os.close(self.fd)
            self.fd = -1
            _own.pop(self.path, None)


def retire_stale(partial: str) -> None:
    """Close every batch of a fence a killed run left beside ``partial``, then unlink it:
    a decoder of that run may still be writing (a cluster's worker outlives its driver)."""
    path = path_for(partial)
    try:
        fd = os.open(path, os.O_RDWR | getattr(os, "O_CLOEXEC", 0))
    except FileNotFoundError:
        return
    try:
        _close_range(fd, 0, os.fstat(fd).st_size, f"the earlier run's batches in {path}")
    finally:
        _unlink(path)
        os.close(fd)


def _close_range(fd: int, first: int, n: int, what: str) -> None:
    if n <= 0:
        return
    deadline = time.monotonic() + WAIT_SECONDS
    while True:
        try:
            fcntl.lockf(fd, fcntl.LOCK_EX | fcntl.LOCK_NB, n, first, os.SEEK_SET)
            break
        except OSError as e:
            if e.errno not in _BUSY:
                raise
            if time.monotonic() > deadline:
                raise ConvertError(f"a decoder has been writing {what} into the output for over "
                                   f"{WAIT_SECONDS:g} s (is a worker stopped?)") from None
            time.sleep(0.001)
    try:
        os.pwrite(fd, _CLOSED * n, first)
    finally:
        fcntl.lockf(fd, fcntl.LOCK_UN, n, first, os.SEEK_SET)


def _unlink(path: str) -> None:
    try:
        os.unlink(path)
    except FileNotFoundError:
        pass


# -- the decoders' side -------------------------------------------------------------------

_fds: dict[str, int] = {}  # fence path -> this process's descriptor (see the module's How)
_fds_lock = threading.Lock()
# Fences this process made (it is a run's driver) -> the lock its decoder threads, if any,
# share with its closes: POSIX locks do not exclude within a process (see the module).
_own: dict[str, threading.Lock] = {}


@contextmanager
def hold(path: str, index: int) -> Iterator[bool]:
    """In a decoder: True while batch ``index`` of the fence at ``path`` is open and this
    process holds its shared lock, so the batch's chunks may be written in the block;
    False where it is closed, its lock is taken, or the fence is gone."""
    fd = _descriptor(path)
    if fd < 0:
        yield False
        return
    with _own.get(path) or nullcontext():  # (a decoder thread of the driver's process)
        try:
            fcntl.lockf(fd, fcntl.LOCK_SH | fcntl.LOCK_NB, 1, index, os.SEEK_SET)
        except OSError:
            yield False  # being closed (or no locks here): never wait on the driver
            return
        try:
            yield os.pread(fd, 1, index) == b"\0"
        finally:
            fcntl.lockf(fd, fcntl.LOCK_UN, 1, index, os.SEEK_SET)


def _descriptor(path: str) -> int:
    with _fds_lock:
        fd = _fds.get(path, -1)
        if fd >= 0 and os.fstat(fd).st_nlink:
            return fd
        # Fences of finished runs (unlinked; a next run on the same output makes a new
        # file) are let go here: every byte of one is set, so no lock on it matters any more.
        for p, old in list(_fds.items()):
            if os.fstat(old).st_nlink == 0:
                os.close(old)
                del _fds[p]
        try:
            fd = os.open(path, os.O_RDWR | getattr(os, "O_CLOEXEC", 0))
        except OSError:
            return -1
        _fds[path] = fd
        return fd
