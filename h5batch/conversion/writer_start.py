"""Starting the writer process without waiting for it.

Rule: the driver asks for the writer first and collects it only when it sends the job
(:class:`~h5batch.writer.messages.Start`). Reason: the first start in a process launches the
fork server, whose preload (h5py and the writer's modules) takes ~0.5 s, and
``Process.start`` returns only once the fork server has forked the writer. Started on a
thread, that time overlaps discovery and the codec trial instead of preceding them; on a
small corpus it was a sixth of the whole run.
"""

from __future__ import annotations

import threading

from ..writer.process import WriterHandle, writer_context


class PendingWriter:
    """A :class:`~h5batch.writer.process.WriterHandle` being started on a thread."""

    def __init__(self, lock_fd: int | None = None):
        self._handle: WriterHandle | None = None
        self._error: BaseException | None = None
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
        self._thread.join()
        if self._error is not None:
            raise self._error
        assert self._handle is not None
        return self._handle
