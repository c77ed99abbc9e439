"""The writer process: its entry point and the handler of each driver message.

The driver starts this process once it knows there is work, before its decoders (so the
writer can be forked while the driver has no other thread), sends
:class:`~.messages.Start` once the plan is made, then the decoded batches in manifest order. Every message type has one handler in :data:`HANDLERS`; a handler returns
True when the process is to end.

Signals and the driver's death: Ctrl-C reaches the whole process group, so the writer
ignores SIGINT (and SIGTERM, SIGHUP) and lets the driver decide (it sends :class:`~.messages.Abort`). When the
driver dies (``kill -9``), the writer commits what it has and exits, so the next run
resumes from there. It learns of the death through ``lifeline``, the read end of a pipe
whose only write end the driver holds and never writes to: it turns readable (EOF) exactly
when the driver is gone. The parent pid does not tell where the writer's parent is the fork
server. A writer on another host than the driver's (:mod:`.remote`) runs the same loop with
one TCP connection as its inbox, outbox and lifeline (its EOF: the driver is gone).
"""

from __future__ import annotations

import contextlib
import errno
import os
import queue
import re
import signal
import sys
import threading
import time
import traceback
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from .. import faults
from ..forking import share_inherited_objects, start_context
from .commit import remove_commit_files
from .messages import (
    Abort,
    Aborted,
    Failed,
    Finish,
    Start,
    Store,
    Stored,
    WriterSpec,
)
from .output import OutputWriter
from .sync import SyncWriter

POLL_SECONDS = 1.0  # how often an idle writer checks that the driver is still there

# Storage errors that get one clear line (the cause is outside h5batch), not a traceback.
_STORAGE_ERRNOS = (errno.ENOSPC, errno.EDQUOT, errno.EROFS, errno.EIO, errno.EACCES, errno.EFBIG)


def _error_text(e: BaseException, spec: WriterSpec) -> str:
    """One clear line for storage errors (disk full, read-only, I/O error) and for a resumed
    partial that HDF5 cannot extend, else the traceback. HDF5 buries the OS error in its
    message ("errno = 28").

    Rule: a resumed partial whose HDF5 structures fail a write loses its commit record, so
    the next run of the same command converts afresh instead of failing the same way.
    Reason: a kill during a flush can leave HDF5's own metadata (its global heap of strings)
    damaged where the resume check (:mod:`.resume`) does not look; the inputs are all still
    there, so redoing the work loses nothing."""
    if isinstance(e, OSError):
        m = re.search(r"errno = (\d+)", str(e))
        code = e.errno or (int(m.group(1)) if m else None)
        if code in _STORAGE_ERRNOS:
            return (f"cannot write {spec.partial_path}: {os.strerror(code)}. The last commit is kept; "
                    f"fix the cause and run the same command again to resume.")
        if spec.resume is not None and spec.sync is None:
            remove_commit_files(spec.partial_path)
            return (f"cannot extend the resumed partial output {spec.partial_path} (HDF5: {e}); it was "
                    f"likely damaged by a kill during a flush. Its commit record is removed: run the same "
                    f"command again to convert afresh.")
    return traceback.format_exc()


class _Session:
    """One job in the writer process: the open output and when it last committed."""

    def __init__(self, spec: WriterSpec, outbox, at_exit: Callable[[], None] | None = None):
        self.spec, self.outbox, self.at_exit = spec, outbox, at_exit
        self.out = (SyncWriter if spec.sync is not None else OutputWriter)(spec)
        self.last_commit = time.monotonic()
        self.commits = 0  # made by this process (the pause points count these)
        self.stored = 0  # batch parts stored by this process (likewise)

    def commit(self) -> None:
        self.out.commit()
        self.commits += 1
        self.last_commit = time.monotonic()

    # -- handlers: one per driver message; True ends the process -------------------------

    def on_store(self, msg: Store) -> bool:
        r = msg.result
        n, _ = self.out.write_batch(r)
        self.outbox.put(Stored(r.index, n))
        self.stored += 1
        faults.pause(f"store:{self.stored}", self.spec.partial_path)
        # Commit between whole batches only: a commit inside a split batch would record a
        # next_batch that the parts still to come belong to.
        if r.final_part and time.monotonic() - self.last_commit >= self.spec.commit_every:
            self.commit()
            faults.pause(f"commit:{self.commits}", self.spec.partial_path)
        return False

    def on_finish(self, msg: Finish) -> bool:
        self.outbox.put(self.out.finalize(max_reject_fraction=msg.max_reject_fraction))
        # Everything is closed and renamed: skip the interpreter's teardown, which the
        # driver would otherwise wait for in join().
        if self.at_exit is not None:
            self.at_exit()
        sys.stdout.flush()
        sys.stderr.flush()
        os._exit(0)

    def on_abort(self, msg: Abort) -> bool:
        self.out.abort()
        self.outbox.put(Aborted())
        return True


HANDLERS: dict[type, Callable[[_Session, Any], bool]] = {
    Store: _Session.on_store,
    Finish: _Session.on_finish,
    Abort: _Session.on_abort,
}


def _next(inbox, lifeline) -> Any:
    """The driver's next message; None once the driver is gone (its lifeline turned readable)."""
    while True:
        try:
            return inbox.get(timeout=POLL_SECONDS)
        except queue.Empty:
            if lifeline.poll():
                return None


def _wait_for_start(inbox, lifeline) -> WriterSpec | None:
    """The job, sent once the driver has made its plan (None: not needed after all)."""
    while True:
        try:
            msg = _next(inbox, lifeline)
        except (EOFError, OSError):
            return None
        if msg is None or isinstance(msg, Abort):
            return None
        if isinstance(msg, Start):
            return msg.spec


def writer_main(inbox, outbox, lifeline, lock: SharedFd | None = None, driver_end: int | None = None,
                host: str = "", at_exit: Callable[[], None] | None = None) -> None:
    """Writer process loop (see the module docstring and :mod:`.messages`). ``lock`` is the
    output's lock file, held open (and so locked) until this process exits. ``driver_end``:
    in a writer forked from the driver, its inherited copy of the lifeline's write end,
    closed first, or the pipe would never turn readable when the driver dies. ``host``: the
    host a shard records (default: this machine's name); ``at_exit``: called when the
    process ends (a writer on another host, :mod:`.remote`: its lock and segments)."""
    try:
        _writer_loop(inbox, outbox, lifeline, driver_end, host, at_exit)
    finally:
        if at_exit is not None:
            at_exit()


def _writer_loop(inbox, outbox, lifeline, driver_end: int | None, host: str,
                 at_exit: Callable[[], None] | None) -> None:
    for s in (signal.SIGINT, signal.SIGTERM, signal.SIGHUP):
        signal.signal(s, signal.SIG_IGN)
    if driver_end is not None:
        os.close(driver_end)
        share_inherited_objects()  # forked: the driver's objects stay shared, as in a decoder
    spec = _wait_for_start(inbox, lifeline)
    if spec is None:
        return
    if host and spec.shard is not None:
        spec.shard = {**spec.shard, "host": host}
    if spec.cwd:
        os.chdir(spec.cwd)
    if spec.umask is not None:
        os.umask(spec.umask)
    session = None
    try:
        session = _Session(spec, outbox, at_exit)
        while True:
            msg = _next(inbox, lifeline)
            if msg is None:  # the driver is gone: commit what is stored, and end
                session.out.abort()
                return
            if HANDLERS[type(msg)](session, msg):
                return
    except BaseException as e:
        outbox.put(Failed(_error_text(e, spec)))
        if session is not None:
            with contextlib.suppress(Exception):  # the error above is the one to report
                session.out.close()


# -- starting the process (driver side) ----------------------------------------------------


class PipeQueue:
    """One direction of a ``multiprocessing.Pipe`` with a queue's ``put``/``get``.

    Used between driver and writer instead of ``multiprocessing.Queue``: a Queue keeps
    POSIX semaphores in /dev/shm, which a ``kill -9`` leaves behind; a pipe leaves nothing.
    Messages are small descriptors, so a blocking ``put`` only waits while the writer is
    busy (backpressure). Readers in several threads of one process are serialised."""

    def __init__(self, reader, writer_end):
        self._r, self._w = reader, writer_end
        self._lock = threading.Lock()

    @classmethod
    def create(cls, ctx) -> PipeQueue:
        r, w = ctx.Pipe(duplex=False)
        return cls(r, w)

    def put(self, msg: Any) -> None:
        self._w.send(msg)

    def close_reader(self) -> None:
        """Close this process's copy of the read end (the sender's side, once the reader
        process has its own). Reason: while any copy of the read end is open, a ``put`` to
        a reader that died blocks for good as soon as the pipe is full (a message bigger
        than its 64 KiB does at once); without one it raises :class:`BrokenPipeError`."""
        self._r.close()

    def get(self, timeout: float | None = None) -> Any:
        with self._lock:
            if not self._r.poll(timeout):
                raise queue.Empty
            return self._r.recv()

    def __getstate__(self):
        return {"_r": self._r, "_w": self._w}

    def __setstate__(self, state):
        self._r, self._w = state["_r"], state["_w"]
        self._lock = threading.Lock()


class SharedFd:
    """A file descriptor the writer process receives a duplicate of when it starts (the
    same open file, so an ``flock`` on it is held by both processes)."""

    def __init__(self, fd: int):
        self.fd = fd

    def __reduce__(self):
        from multiprocessing import reduction

        return (_rebuild_fd, (reduction.DupFd(self.fd),))


def _rebuild_fd(dup) -> SharedFd:
    return SharedFd(dup.detach())


def current_umask() -> int | None:
    """This process's umask, read without changing it (Linux), else None."""
    with contextlib.suppress(OSError):
        with open("/proc/self/status") as fh:
            for line in fh:
                if line.startswith("Umask:"):
                    return int(line.split()[1], 8)
    return None


class WriterGone(Exception):
    """The writer process is gone (a message to it could not be sent)."""

    def __init__(self, exit_code: int | None):
        super().__init__(f"writer process died (exit code {exit_code})")
        self.exit_code = exit_code


@dataclass
class WriterHandle:
    """The driver's side of a running writer process."""

    process: Any
    inbox: PipeQueue  # driver -> writer
    outbox: PipeQueue  # writer -> driver
    lifeline: Any  # write end the driver holds open; closing it tells the writer we are gone

    @classmethod
    def start(cls, lock_fd: int | None = None) -> WriterHandle:
        """Start the writer process (:func:`h5batch.forking.start_context`); it waits for
        :class:`~.messages.Start`. ``lock_fd``: the output's lock, which the writer then
        holds too."""
        ctx = start_context()
        inbox, outbox = PipeQueue.create(ctx), PipeQueue.create(ctx)
        theirs, ours = ctx.Pipe(duplex=False)
        lock = SharedFd(lock_fd) if lock_fd is not None else None
        driver_end = ours.fileno() if ctx.get_start_method() == "fork" else None
        process = ctx.Process(target=writer_main, args=(inbox, outbox, theirs, lock, driver_end),
                              name="h5batch-writer", daemon=True)
        process.start()
        theirs.close()
        inbox.close_reader()  # a send to a writer that died fails instead of blocking
        return cls(process, inbox, outbox, ours)

    def send(self, msg: Any) -> None:
        """Send ``msg`` to the writer; :class:`WriterGone` when it has died."""
        try:
            self.inbox.put(msg)
        except OSError:
            self.process.join(1.0)
            raise WriterGone(self.process.exitcode) from None

    def stop(self, timeout: float = 10.0) -> None:
        """Ask a writer that never got a job to go, and make sure it does."""
        with contextlib.suppress(OSError):  # gone already
            self.inbox.put(Abort())
        self.process.join(timeout=timeout)
        if self.process.is_alive():
            self.process.kill()
