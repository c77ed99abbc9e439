"""The local engine (``cluster.kind: processes``, the default): decoder processes on this
machine, fed by the driver without Dask.

Rule: :class:`DecoderPool` keeps ``cluster.workers`` decoder processes (default one per
core). Each runs :func:`~.worker.decode_batch` calls sent over its own pipe, one at a time,
and is fed from one queue by a thread of the driver. Its interface is the part of
:class:`distributed.Client` the driver uses (:meth:`~DecoderPool.submit`,
:meth:`~DecoderPool.scheduler_info`), so the driver runs the same loop on both engines.

Faults: a call whose decoder dies (a decoder library that segfaults, the OOM killer) fails
with :class:`DecoderDied`, and the driver isolates the file that did it as on Dask
(:func:`.driver.after_failure`); the pool starts a new decoder in its place. A decode that hangs past
``policy.decode_timeout`` is abandoned inside the decoder (``decode_batch`` makes it a
``timeout`` reject); that decoder, whose abandoned thread may still run, is replaced after
the call. A decoder that cannot even do that (frozen: a native call that holds the GIL, a
stopped process) sends no heartbeat for ``policy.frozen_worker_timeout`` seconds: it is
killed, and its call fails as a death does. Each decoder's heartbeat is a thread of it that
writes a byte to a pipe of its own every :data:`HEARTBEAT_SECONDS`.

Processes: forked where that is safe (:func:`h5batch.forking.start_context`), else started
from the fork server or by spawn, through a context object: the caller's start method is
never changed. A decoder closes every descriptor it inherited but its pipe (the output's
lock, the writer's pipes), ignores SIGINT (the driver decides) and ends when its pipe
closes, so it never outlives the driver.

Reason for this engine rather than a LocalCluster on one machine: ``docs/decisions.md``.
"""

from __future__ import annotations

import queue
import signal
import threading
import time
from collections.abc import Callable
from concurrent.futures import Future
from multiprocessing.connection import Connection
from typing import Any

from ..forking import close_inherited, share_inherited_objects, start_context

CLOSE_SECONDS = 5.0  # how long closing waits for a decoder to finish its batch and exit
HEARTBEAT_SECONDS = 1.0


class DecoderDied(RuntimeError):
    """The decoder process running a call died (its exit code says how)."""


class PoolFuture(Future):
    """A :class:`concurrent.futures.Future` with the ``status`` a Dask future has."""

    @property
    def status(self) -> str:
        if self.cancelled():
            return "cancelled"
        if not self.done():
            return "pending"
        return "error" if self.exception() is not None else "finished"


class _Decoder:
    """One decoder process and the driver's end of its pipe."""

    def __init__(self, ctx: Any, frozen_seconds: float):
        self.conn, theirs = ctx.Pipe(duplex=True)
        self.beats, beat = ctx.Pipe(duplex=False)
        self.frozen_seconds = frozen_seconds
        forked = ctx.get_start_method() == "fork"
        self.process = ctx.Process(target=_serve, args=(theirs, beat, forked), name="h5batch-decoder", daemon=True)
        self.process.start()
        theirs.close()
        beat.close()

    def call(self, fn: Callable[..., Any], args: tuple) -> tuple[bool, Any]:
        """``(False, fn(*args))`` or ``(True, the exception it raised)`` from the decoder;
        :class:`DecoderDied` when it is gone, or frozen, before it answered."""
        try:
            self.conn.send((fn, args))
            last = time.monotonic()
            while not self.conn.poll(HEARTBEAT_SECONDS):
                while self.beats.poll():
                    self.beats.recv_bytes()
                    last = time.monotonic()
                if time.monotonic() - last > self.frozen_seconds:
                    self.process.kill()
                    self.process.join(1.0)
                    raise DecoderDied(f"decoder process {self.process.pid} sent no heartbeat for "
                                      f"{self.frozen_seconds:g} s (policy.frozen_worker_timeout) and was killed")
            return self.conn.recv()
        except (EOFError, OSError):
            self.process.join(1.0)
            code = self.process.exitcode
            how = f"killed by {signal.Signals(-code).name}" if code and code < 0 else f"exit code {code}"
            raise DecoderDied(f"decoder process {self.process.pid} died ({how})") from None

    def close(self, timeout: float = CLOSE_SECONDS) -> None:
        """Ask the decoder to end (EOF on its pipe); killed when it has not within ``timeout``."""
        self.conn.close()
        self.beats.close()
        self.process.join(timeout)
        if self.process.is_alive():
            self.process.kill()
            self.process.join(1.0)


class DecoderPool:
    """``n`` decoder processes (see the module); :meth:`close` ends them."""

    def __init__(self, n: int, frozen_seconds: float = 60.0):
        self.queue: queue.SimpleQueue = queue.SimpleQueue()
        self.closing = False
        self.lock = threading.Lock()
        self.frozen_seconds = frozen_seconds
        self.decoders = [_Decoder(start_context(), frozen_seconds) for _ in range(n)]  # forked before any thread
        self.threads = [threading.Thread(target=self._feed, args=(k,), name="h5batch-decoder-feed", daemon=True)
                        for k in range(n)]
        for t in self.threads:
            t.start()

    def submit(self, fn: Callable[..., Any], *args: Any, key: str = "", pure: bool = False,
               retries: int = 0) -> PoolFuture:
        """Run ``fn(*args)`` on a decoder (``key``, ``pure``, ``retries``: as Dask's, unused)."""
        fut = PoolFuture()
        self.queue.put((fut, fn, args))
        return fut

    def scheduler_info(self, n_workers: int = -1) -> dict[str, Any]:
        return {"workers": {f"pool://decoder-{k}": {"nthreads": 1} for k in range(len(self.decoders))}}

    def _feed(self, k: int) -> None:
        while True:
            got = self.queue.get()
            if got is None:
                return
            fut, fn, args = got
            if self.closing:
                fut.cancel()
                continue
            if not fut.set_running_or_notify_cancel():
                continue
            try:
                raised, value = self.decoders[k].call(fn, args)
            except DecoderDied as e:
                fut.set_exception(e)
                self._replace(k)
                continue
            if raised:
                fut.set_exception(value)
            else:
                fut.set_result(value)
                if getattr(value, "stuck", False):  # an abandoned decode thread may still run there
                    self._replace(k)

    def _replace(self, k: int) -> None:
        with self.lock:
            if self.closing:
                return
            old = self.decoders[k]
            self.decoders[k] = _Decoder(start_context(), self.frozen_seconds)
        old.close(timeout=0)

    def close(self) -> None:
        """Drop the queued calls, wait for the running ones (so no batch makes shared memory
        after the driver removed the run's segments), then end the decoders."""
        with self.lock:
            self.closing = True
        for _ in self.threads:
            self.queue.put(None)
        for t in self.threads:
            t.join(CLOSE_SECONDS)
        for d in self.decoders:
            d.close()


def _serve(conn: Connection, beat: Connection, forked: bool) -> None:
    """The decoder's loop: ``(fn, args)`` in, ``(raised, value)`` out, until EOF."""
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    for sig in (signal.SIGTERM, signal.SIGHUP):
        signal.signal(sig, signal.SIG_DFL)
    if forked:  # a started interpreter inherits only what it was given
        close_inherited(conn.fileno(), beat.fileno())
        share_inherited_objects()
    threading.Thread(target=_heartbeat, args=(beat,), name="h5batch-heartbeat", daemon=True).start()
    try:
        while True:
            try:
                fn, args = conn.recv()
            except (EOFError, OSError):
                return
            try:
                reply: tuple[bool, Any] = (False, fn(*args))
            except BaseException as e:  # noqa: BLE001 - handed to the driver like a worker's error
                reply = (True, e)
            try:
                conn.send(reply)
            except (OSError, ValueError):
                return
    finally:
        conn.close()


def _heartbeat(beat: Connection) -> None:
    """(in the decoder) A byte every :data:`HEARTBEAT_SECONDS` while this process runs Python."""
    while True:
        try:
            beat.send_bytes(b".")
        except OSError:
            return
        time.sleep(HEARTBEAT_SECONDS)
