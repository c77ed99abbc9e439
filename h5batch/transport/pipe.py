"""The pipe between the driver and the writer process."""

from __future__ import annotations

import queue
import threading
from typing import Any


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
