"""Starting the writer process without waiting for it.

Rule: the driver asks for the writer first and collects it only when it sends the job
(:class:`~h5batch.writer.messages.Start`). Two ways, whichever is safe:

* The driver has no other thread yet (the command line, a plain script), on Linux: the
  writer is *forked* from the driver at once, in ~10 ms, with h5py and the writer's modules
  already imported. Reason: a fork server costs a fresh interpreter and its imports,
  ~1 s on this machine, and on a small corpus the driver waited for it: it was most of the
  demo's conversion time. A single-threaded process forks safely (no lock can be held by a
  thread that the child lacks); the writer inherits nothing it uses but the pipes made for
  it and the output's lock.
* Otherwise (threads are running: a Dask client, a notebook's kernel, an earlier
  conversion in the process; or no ``fork``): the fork server of
  :func:`~h5batch.writer.process.writer_context`, started on a thread so that its preload
  (h5py and the writer's modules, ~0.5-1 s) overlaps discovery and the codec trial, and
  every later writer in the process forks from it in ~10 ms.
"""

from __future__ import annotations

import multiprocessing as mp
import sys
import threading

from ..writer.process import WriterHandle, writer_context


def can_fork() -> bool:
    """True where forking this process is safe: Linux (elsewhere ``fork`` is missing or,
    on macOS, unsafe with system frameworks) and no thread but this one."""
    return sys.platform.startswith("linux") and "fork" in mp.get_all_start_methods() \
        and threading.active_count() == 1


class PendingWriter:
    """A :class:`~h5batch.writer.process.WriterHandle` being started (see the module docstring)."""

    def __init__(self, lock_fd: int | None = None):
        self._handle: WriterHandle | None = None
        self._error: BaseException | None = None
        self._thread: threading.Thread | None = None
        if can_fork():
            try:
                self._handle = WriterHandle.start(lock_fd, mp.get_context("fork"))
            except BaseException as e:  # noqa: BLE001 - raised again by get(), like the thread's
                self._error = e
            return
        # The fork server itself is launched here, in the caller's thread and at once: it
        # (and every writer forked from it) keeps the file descriptors of this moment, and
        # the codec trial soon points fd 2 at its warning capture (decoder_warnings).
        # Launched from the thread during that window, it hung the crash-isolation runs.
        if writer_context().get_start_method() == "forkserver":
            from multiprocessing import forkserver

            forkserver.ensure_running()
        self._thread = threading.Thread(target=self._start, args=(lock_fd,), name="h5batch-writer-start",
                                        daemon=True)
        self._thread.start()

    def _start(self, lock_fd: int | None) -> None:
        try:
            self._handle = WriterHandle.start(lock_fd)
        except BaseException as e:  # noqa: BLE001 - raised again by get(), in the caller's thread
            self._error = e

    def get(self) -> WriterHandle:
        """The started writer (waits for the start; raises what the start raised)."""
        if self._thread is not None:
            self._thread.join()
        if self._error is not None:
            raise self._error
        assert self._handle is not None
        return self._handle
