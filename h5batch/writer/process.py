"""The writer process: its entry point and the handler of each driver message.

The driver starts this process first (importing h5py and the codecs overlaps discovery),
sends :class:`~.messages.Start` once it knows the job, then the decoded batches in
manifest order. Every message type has one handler in :data:`HANDLERS`; a handler returns
True when the process is to end.

Signals and the driver's death: Ctrl-C reaches the whole process group, so the writer
ignores SIGINT (and SIGTERM, SIGHUP) and lets the driver decide (it sends :class:`~.messages.Abort`). When the
driver dies (``kill -9``), the writer commits what it has and exits, so the next run
resumes from there. It learns of the death through ``lifeline``, the read end of a pipe
whose only write end the driver holds and never writes to: it turns readable (EOF) exactly
when the driver is gone. The parent pid does not tell, as the writer's parent is the fork
server, which lives as long as anyone (this writer too) holds its own liveness pipe.
"""

from __future__ import annotations

import errno
import multiprocessing as mp
import os
import queue
import re
import signal
import sys
import threading
import time
import traceback
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from multiprocessing import spawn
from typing import Any

from .. import faults, gcpause
from ..transport.pipe import PipeQueue
from .messages import (
    Abort,
    Aborted,
    Committed,
    Done,
    Failed,
    Finish,
    Measure,
    Measured,
    Quit,
    Ready,
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
    """One clear line for storage errors (disk full, read-only, I/O error), else the
    traceback. HDF5 buries the OS error in its message ("errno = 28")."""
    if isinstance(e, OSError):
        m = re.search(r"errno = (\d+)", str(e))
        code = e.errno or (int(m.group(1)) if m else None)
        if code in _STORAGE_ERRNOS:
            return (f"cannot write {spec.partial_path}: {os.strerror(code)}. The last commit is kept; "
                    f"fix the cause and run the same command again to resume.")
    return traceback.format_exc()


class _Session:
    """One job in the writer process: the open output and when it last committed."""

    def __init__(self, spec: WriterSpec, outbox):
        self.spec, self.outbox = spec, outbox
        self.out = (SyncWriter if spec.sync is not None else OutputWriter)(spec)
        self.last_commit = time.monotonic()
        self.commits = 0  # made by this process (the pause points count these)
        self.stored = 0  # batch parts stored by this process (likewise)

    def commit(self) -> None:
        self.outbox.put(Committed(self.out.commit()))
        self.commits += 1
        self.last_commit = time.monotonic()

    # -- handlers: one per driver message; True ends the process -------------------------

    def on_store(self, msg: Store) -> bool:
        r = msg.result
        n, _ = self.out.write_batch(r)
        self.outbox.put(Stored(r.index, n, r.packed.nbytes))
        self.out.after_store()
        self.stored += 1
        faults.pause(f"store:{self.stored}", self.spec.partial_path)
        # Commit between whole batches only: a commit inside a split batch would record a
        # next_batch that the parts still to come belong to.
        if r.final_part and time.monotonic() - self.last_commit >= self.spec.commit_every:
            self.commit()
            faults.pause(f"commit:{self.commits}", self.spec.partial_path)
        return False

    def on_finish(self, msg: Finish) -> bool:
        self.outbox.put(Done(self.out.finalize(max_reject_fraction=msg.max_reject_fraction)))
        # Everything is closed and renamed: skip the interpreter's teardown, which the
        # driver would otherwise wait for in join().
        sys.stdout.flush()
        sys.stderr.flush()
        os._exit(0)

    def on_abort(self, msg: Abort) -> bool:
        record = self.out.abort()
        if record is not None:
            self.outbox.put(Committed(record))
        self.outbox.put(Aborted())
        return True

    def on_driver_gone(self) -> None:
        self.out.abort()


HANDLERS: dict[type, Callable[[_Session, Any], bool]] = {
    Store: _Session.on_store,
    Finish: _Session.on_finish,
    Abort: _Session.on_abort,
}


def _wait_for_start(inbox, driver_gone: Callable[[], bool], outbox=None) -> WriterSpec | None:
    """The job, sent once the driver has discovered the corpus (None: not needed after all).
    A :class:`Measure` before it is answered on ``outbox``."""
    while True:
        try:
            msg = inbox.get(timeout=POLL_SECONDS)
        except queue.Empty:
            if driver_gone():
                return None
            continue
        except (EOFError, OSError):
            return None
        if isinstance(msg, Start):
            return msg.spec
        if isinstance(msg, Measure) and outbox is not None:
            outbox.put(_measure(msg))
        if isinstance(msg, (Quit, Abort)):
            return None


def _measure(msg: Measure) -> Measured:
    from ..codecs import lz4_trial

    try:
        return Measured(lz4_trial.measure(msg.fields, msg.level, msg.shuffle, msg.min_ratio))
    except Exception as e:  # noqa: BLE001 - the driver measures itself and reports its own error
        return Measured(None, f"{type(e).__name__}: {e}")


def writer_main(inbox, outbox, lifeline, lock: SharedFd | None = None) -> None:
    """Writer process loop (see the module docstring and :mod:`.messages`). ``lock`` is the
    output's lock file, held open (and so locked) until this process exits."""
    for s in (signal.SIGINT, signal.SIGTERM, signal.SIGHUP):
        signal.signal(s, signal.SIG_IGN)
    gcpause.resume()  # forked from a driver still setting up: collection on for the writer's run

    def driver_gone() -> bool:
        return lifeline.poll()

    spec = _wait_for_start(inbox, driver_gone, outbox)
    if spec is None:
        return
    if spec.cwd:
        os.chdir(spec.cwd)
    if spec.umask is not None:
        os.umask(spec.umask)
    session = None
    try:
        session = _Session(spec, outbox)
        outbox.put(Ready(session.out.next_batch, {name: st.n for name, st in session.out.splits.items()}))
        layout = session.out.layout_message()
        if layout is not None:
            outbox.put(layout)
        while True:
            try:
                msg = inbox.get(timeout=POLL_SECONDS)
            except queue.Empty:
                if driver_gone():
                    session.on_driver_gone()
                    return
                continue
            if HANDLERS[type(msg)](session, msg):
                return
    except BaseException as e:
        outbox.put(Failed(_error_text(e, spec)))
        if session is not None:
            try:
                session.out.close()
            except Exception:  # noqa: BLE001 - the error above is the one to report
                pass


def _forked_writer_main(lifeline_write_fd: int, preload: tuple[str, ...], read_versions: bool, *args: Any) -> None:
    """:func:`writer_main` in a writer forked from the driver itself, which inherits every
    file descriptor and the driver's signal handlers: the signals are ignored first (as
    :func:`writer_main` does; a Ctrl-C during the preload raised the driver's
    ``Interrupted`` here), and the driver's end of the lifeline is closed, or the pipe would
    never turn readable when the driver dies (the writer would hold it open itself). Then
    ``preload`` is imported (the codecs' libraries, on this process's core while the driver
    discovers), as the fork server would have, and the output's versions are read
    (:mod:`.versions`) where ``read_versions`` says the job will need them (a new file: a
    sync keeps the file's own, and the reads cost its 2 cores ~30 ms of CPU)."""
    for s in (signal.SIGINT, signal.SIGTERM, signal.SIGHUP):
        signal.signal(s, signal.SIG_IGN)
    os.close(lifeline_write_fd)
    from ..codecs.libraries import load

    # A codec library comes with its HDF5 filter: hdf5plugin registers the plugin filters the
    # dataset creation needs (the driver no longer imports it: ~13 ms of a small job).
    for name in (*preload, "hdf5plugin") if preload else ():
        try:
            load(name)
        except ImportError:  # the store that needs it reports it, with the codec's name
            pass
    if read_versions:
        from .versions import versions

        try:
            versions()  # read now, while the driver discovers: the job's Start needs them
        except Exception:  # noqa: BLE001, S110 - the file's creation reads them again and reports it
            pass
    writer_main(*args)


# -- starting the process (driver side) ----------------------------------------------------


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


def writer_context() -> Any:
    """The multiprocessing context the writer process is started with.

    ``forkserver`` with this module preloaded where the platform has it: the first
    conversion in a process starts the fork server (as slow as a spawn), and every later one
    forks the writer from it with h5py already imported. Forking the driver itself is not
    safe: it runs Dask's threads. The fork server is single-threaded; it fixes its working
    directory, umask and environment when it starts, so the writer is sent the driver's
    current ones (:attr:`WriterSpec.cwd`, :attr:`WriterSpec.umask`). Elsewhere: ``spawn``.
    """
    if "forkserver" not in mp.get_all_start_methods():
        return mp.get_context("spawn")
    ctx = mp.get_context("forkserver")
    # Only effective before the (process-wide) fork server starts; '__main__' is the default.
    ctx.set_forkserver_preload(["__main__", __name__, "hdf5plugin", "blosc2"])
    return ctx


_LAUNCH = threading.local()  # .writer: this thread is starting a writer process
_LAUNCH_LOCK = threading.Lock()


def _preparation_data(name: str, _real=spawn.get_preparation_data) -> dict[str, Any]:
    data = _real(name)
    if getattr(_LAUNCH, "writer", False):
        data.pop("init_main_from_name", None)
        data.pop("init_main_from_path", None)
    return data


def start_without_main(process: Any, ctx: Any) -> None:
    """``process.start()`` without the caller's ``__main__`` (:func:`_without_main`) where
    ``ctx`` would run it again; a fork needs no preparation data (and must not inherit
    :data:`_LAUNCH_LOCK` held). For the writer and the forked decoders (conversion/spares.py)."""
    if ctx.get_start_method() == "fork":
        process.start()
        return
    with _without_main():
        process.start()


@contextmanager
def _without_main() -> Iterator[None]:
    """Start the writer without the driver's ``__main__``.

    Rule: a process started by ``spawn`` or the fork server runs the parent's main module
    again (as ``__mp_main__``) before it unpickles its target; the writer's target and
    arguments live in h5batch, so the writer is started without it. Reason: the main module
    is the caller's: a training script that imports torch made every writer import torch
    again, ~0.7 CPU-s (3 s on a busy machine) per conversion before it stored a batch.
    Only the starting thread is affected (multiprocessing reads the main module in
    ``spawn.get_preparation_data``, which is wrapped for the length of the start).
    """
    with _LAUNCH_LOCK:
        saved = spawn.get_preparation_data
        spawn.get_preparation_data = _preparation_data
        _LAUNCH.writer = True
        try:
            yield
        finally:
            _LAUNCH.writer = False
            spawn.get_preparation_data = saved


def current_umask() -> int | None:
    """This process's umask, read without changing it (Linux), else None."""
    try:
        with open("/proc/self/status") as fh:
            for line in fh:
                if line.startswith("Umask:"):
                    return int(line.split()[1], 8)
    except OSError:
        pass
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
    forked: bool = False  # forked from the driver itself (else from the fork server, or spawned)

    @classmethod
    def start(cls, lock_fd: int | None = None, ctx: Any = None, preload: tuple[str, ...] = (),
              read_versions: bool = True) -> WriterHandle:
        """Start the writer process; it waits for :class:`~.messages.Start`. ``lock_fd``:
        the output's lock, which the writer then holds too. ``ctx``: the multiprocessing
        context (default :func:`writer_context`); ``preload``: modules a *forked* writer
        imports first; ``read_versions``: whether it reads the versions of a new file
        while it waits (:func:`_forked_writer_main`)."""
        ctx = ctx or writer_context()
        inbox, outbox = PipeQueue.create(ctx), PipeQueue.create(ctx)
        theirs, ours = ctx.Pipe(duplex=False)
        lock = SharedFd(lock_fd) if lock_fd is not None else None
        target, args = writer_main, (inbox, outbox, theirs, lock)
        if ctx.get_start_method() == "fork":
            target, args = _forked_writer_main, (ours.fileno(), tuple(preload), read_versions, *args)
        process = ctx.Process(target=target, args=args, name="h5batch-writer", daemon=True)
        start_without_main(process, ctx)
        theirs.close()
        inbox.close_reader()  # a send to a writer that died fails instead of blocking
        return cls(process, inbox, outbox, ours, ctx.get_start_method() == "fork")

    def send(self, msg: Any) -> None:
        """Send ``msg`` to the writer; :class:`WriterGone` when it has died."""
        try:
            self.inbox.put(msg)
        except OSError:
            self.process.join(1.0)
            raise WriterGone(self.process.exitcode) from None

    def stop(self, timeout: float = 10.0) -> None:
        """Ask a writer that never got a job to go, and make sure it does."""
        try:
            self.inbox.put(Quit())
        except OSError:  # gone already
            pass
        self.process.join(timeout=timeout)
        if self.process.is_alive():
            self.process.kill()
