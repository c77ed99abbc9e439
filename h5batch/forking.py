"""Forked helper processes: whether this process may fork (:func:`can_fork`), the one rule
every forked helper of a run follows (the writer, the in-process decoders, a sync's stat
pass), and a child that computes one result and sends it back (:class:`Child`).

Rule for a :class:`Child`: it closes every descriptor it inherited but its pipe and the
standard three (an output's lock, another child's pipe: a lock goes with its owner, an EOF
reaches its reader), ignores SIGINT (its parent decides), dies on SIGTERM and SIGHUP, and
leaves by ``os._exit`` (no atexit handler, no buffer of the parent's flushed twice). A
child whose work raises sends nothing: to its parent, a result that does not arrive whole
is no result, and the parent does the work itself.
"""

from __future__ import annotations

import contextlib
import multiprocessing as mp
import os
import signal
import sys
import threading
from collections.abc import Callable

__all__ = ["can_fork", "start_context", "Child", "close_inherited", "write_all", "read_all"]


def can_fork() -> bool:
    """True where forking this process is safe: Linux (elsewhere ``fork`` is missing or,
    on macOS, unsafe with system frameworks) and no Python thread but this one. Native
    threads are not counted: numpy's OpenBLAS starts its pool at import (``/proc/self/task``
    lists 2 threads in a bare ``import numpy``) and re-creates it in a child through its
    ``pthread_atfork`` handlers, as the many programs that fork numpy rely on."""
    return sys.platform.startswith("linux") and "fork" in mp.get_all_start_methods() \
        and threading.active_count() == 1


def start_context() -> mp.context.BaseContext:
    """The context h5batch starts its processes with (the writer, the local decoders):
    ``fork`` where :func:`can_fork` (milliseconds, h5py and the decoders already imported),
    else the fork server, else ``spawn``. A context object: the caller's start method and
    fork-server settings are never changed."""
    if can_fork():
        return mp.get_context("fork")
    methods = mp.get_all_start_methods()
    return mp.get_context("forkserver" if "forkserver" in methods else "spawn")


class Child:
    """``work()`` run in a forked child, its bytes sent back through a pipe (see the module
    docstring). :meth:`start` returns None where the process may not fork or the fork
    fails. Read the result once (:meth:`result`), or :meth:`end` it; either reaps it."""

    def __init__(self, pid: int, fd: int):
        self.pid, self.fd = pid, fd

    @classmethod
    def start(cls, work: Callable[[], bytes]) -> Child | None:
        if not can_fork():
            return None
        r, w = os.pipe()
        try:
            pid = os.fork()
        except OSError:
            os.close(r)
            os.close(w)
            return None
        if pid == 0:
            code = 1
            try:
                os.close(r)
                signal.signal(signal.SIGINT, signal.SIG_IGN)
                for sig in (signal.SIGTERM, signal.SIGHUP):
                    signal.signal(sig, signal.SIG_DFL)
                signal.pthread_sigmask(signal.SIG_UNBLOCK, {signal.SIGTERM, signal.SIGHUP})
                close_inherited(w)
                write_all(w, work())
                code = 0
            finally:
                os._exit(code)
        os.close(w)
        return cls(pid, r)

    @property
    def alive(self) -> bool:
        return self.pid != 0

    def done(self) -> bool:
        """Whether the child has begun sending (its work is done)."""
        import select

        return bool(self.pid) and bool(select.select([self.fd], [], [], 0)[0])

    def result(self) -> bytes:
        """What the child sent (b"" or a truncated result if it failed or was killed)."""
        try:
            return read_all(self.fd)
        finally:
            self._close()

    def end(self) -> None:
        """End the child at once (SIGTERM), its result unread."""
        if self.pid:
            with contextlib.suppress(OSError):
                os.kill(self.pid, signal.SIGTERM)
            self._close()

    def _close(self) -> None:
        if self.pid:
            os.close(self.fd)
            with contextlib.suppress(ChildProcessError):
                os.waitpid(self.pid, 0)
            self.pid, self.fd = 0, -1


def write_all(fd: int, data: bytes) -> None:
    view = memoryview(data)
    while view:
        view = view[os.write(fd, view):]


def read_all(fd: int) -> bytes:
    chunks = []
    while True:
        b = os.read(fd, 1 << 20)
        if not b:
            return b"".join(chunks)
        chunks.append(b)


def close_inherited(*keep: int) -> None:
    """(a forked helper) Close every descriptor but the standard three and ``keep``: the
    rule of every process h5batch forks (the stat pass's children, the in-process decoders).
    Reason: an inherited descriptor outlives its owner, an output's lock among them (the
    lock would not go with a killed sync), and a pipe's write end held elsewhere keeps its
    reader from seeing EOF."""
    low = 3
    for fd in sorted(keep):
        os.closerange(low, fd)
        low = fd + 1
    os.closerange(low, _max_fd())


def _max_fd() -> int:
    try:
        return os.sysconf("SC_OPEN_MAX")
    except (ValueError, OSError):
        return 1 << 16
