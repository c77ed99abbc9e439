"""Starting the writer process without waiting for it.

Rule: the driver asks for the writer first and collects it only when it sends the job
(:class:`~h5batch.writer.messages.Start`). Two ways, whichever is safe:

* The driver has no other thread yet (the command line, a plain script), on Linux: the
  writer is *forked* from the driver at once, in ~10 ms, with h5py and the writer's modules
  already imported. Reason: a fork server costs a fresh interpreter and its imports,
  ~1 s on this machine, and on a small corpus the driver waited for it: it was most of the
  demo's conversion time. A single-threaded process forks safely (no lock can be held by a
  thread that the child lacks); the writer inherits nothing it uses but the pipes made for
  it and the output's lock. The forked writer then imports the job's codec library on its
  own core (:func:`codec_libraries`). ``codec: auto``'s measurements
  (:mod:`h5batch.codecs.lz4_trial`) run in the driver on Blosc2's C library
  (:mod:`h5batch.codecs.blosc2_lib`, a few ms to load); where that library does not load,
  the writer imports blosc2 and :meth:`PendingWriter.measure` has it take them before the
  job starts. Either way the driver never imports blosc2, 0.3-0.7 s it spent before on a
  small job.
* Otherwise (threads are running: a Dask client, a notebook's kernel, an earlier
  conversion in the process; or no ``fork``): the fork server of
  :func:`~h5batch.writer.process.writer_context`, started on a thread so that its preload
  (h5py and the writer's modules, ~0.5-1 s) overlaps discovery and the codec trial, and
  every later writer in the process forks from it in ~10 ms.
"""

from __future__ import annotations

import multiprocessing as mp
import queue
import threading
from typing import TYPE_CHECKING

from ..forking import can_fork
from ..writer.messages import Measure, Measured
from ..writer.process import WriterHandle, writer_context

if TYPE_CHECKING:
    from ..config import JobConfig


class PendingWriter:
    """A :class:`~h5batch.writer.process.WriterHandle` being started (see the module docstring)."""

    def __init__(self, lock_fd: int | None = None, preload: tuple[str, ...] = (), read_versions: bool = True):
        self._handle: WriterHandle | None = None
        self._error: BaseException | None = None
        self._thread: threading.Thread | None = None
        self.forked = can_fork()
        if self.forked:
            try:
                self._handle = WriterHandle.start(lock_fd, mp.get_context("fork"), preload, read_versions)
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

    def measure(self, fields: dict, level: int | None, shuffle: bool, min_ratio: float) -> dict | None:
        """``codec: auto``'s figures measured by a forked writer (:class:`Measure`), or None
        (a writer from the fork server, or it failed): the caller then measures itself."""
        if not self.forked or self._handle is None:
            return None
        h = self._handle
        try:
            h.inbox.put(Measure(fields, level, shuffle, min_ratio))
            # No time limit: a late answer would be taken for the writer's next message. The
            # writer answers, or dies (then the job's start reports it).
            while True:
                try:
                    reply = h.outbox.get(timeout=1.0)
                    break
                except queue.Empty:
                    if not h.process.is_alive():
                        return None
        except (EOFError, OSError):
            return None
        return reply.figures if isinstance(reply, Measured) else None

    def get(self) -> WriterHandle:
        """The started writer (waits for the start; raises what the start raised)."""
        if self._thread is not None:
            self._thread.join()
        if self._error is not None:
            raise self._error
        assert self._handle is not None
        return self._handle


def codec_libraries(job: JobConfig) -> tuple[str, ...]:
    """What a forked writer imports first for ``job``: the libraries of its codec's decode
    steps (blosc2, zstandard; the encoders use the same), or of ``codec: auto``'s candidate,
    whose trial the writer measures (:meth:`PendingWriter.measure`). Nothing for ``auto``
    with ``output.prefer: speed`` where the driver measures on Blosc2's C library
    (:func:`~h5batch.codecs.lz4_trial.in_process`): that rule stores decoded media
    uncompressed, and a writer that does get Blosc2-LZ4 imports it at the start of the job."""
    from ..codecs import AUTO_CODEC, get, lz4_trial

    if job.output.codec == "auto" and job.output.prefer == "speed" and lz4_trial.in_process():
        return ()
    codec = get(AUTO_CODEC if job.output.codec == "auto" else job.output.codec)
    return tuple(sorted({s.library for s in codec.decode_steps().values() if s.library}))
