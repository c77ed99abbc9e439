"""The object-storage requests of the reader's main process, made in a helper process.

The rule: a process that starts DataLoader workers never makes a request itself. Reason:
obstore's runtime (tokio) does not survive ``fork()``, so a main process that had made one
could only start its workers from the fork server, which re-imports torch in each: ~3 s of a
2-worker loader's start on the 2-core VM, against ~0.1 s forked (docs/benchmarks.md). So an
:class:`~h5batch.remote.client.ObjectClient` made with ``helper=True`` (the one
:class:`~h5batch.torch.H5Dataset` makes) sends its HEADs and GETs here: one helper process per
reader process (``python -m h5batch.remote.helper``), started at the first request, over a
socket pair, any number of requests in flight. Forked workers make their own requests (their
runtime starts after the fork). The helper exits when its end of the socket closes (its
parent gone); a helper that died fails the requests in flight with a
:class:`~h5batch.errors.RemoteError` naming the URL.
"""

from __future__ import annotations

import itertools
import os
import socket
import subprocess
import sys
import threading
from concurrent.futures import Future, ThreadPoolExecutor
from multiprocessing.connection import Connection
from typing import Any

from ..errors import RemoteError

THREADS = 8  # requests served at once (the prefetcher's GETs, a worker-less reader's misses)


class Helper:
    """The parent's end: :meth:`call` runs ``client.method(*args)`` in the helper process."""

    def __init__(self) -> None:
        mine, theirs = socket.socketpair()
        self.proc = subprocess.Popen([sys.executable, "-m", __name__, str(theirs.fileno())],
                                     pass_fds=(theirs.fileno(),), stdin=subprocess.DEVNULL)
        theirs.close()
        self.conn = Connection(mine.detach())
        self.lock = threading.Lock()
        self.pending: dict[int, tuple[Future[Any], str]] = {}
        self.ids = itertools.count()
        self.pid = os.getpid()
        threading.Thread(target=self._replies, daemon=True, name="h5batch-s3-helper").start()

    def call(self, client: Any, method: str, *args: Any) -> Any:
        fut: Future[Any] = Future()
        with self.lock:
            i = next(self.ids)
            self.pending[i] = fut, client.url
            try:
                self.conn.send((i, client, method, args))  # the client pickles without its store
            except OSError as e:
                self.pending.pop(i)
                raise RemoteError(client.url, f"{method}: the helper process is gone ({e})") from e
        return fut.result()

    def _replies(self) -> None:
        while True:
            try:
                i, ok, value = self.conn.recv()
            except (EOFError, OSError):
                break
            with self.lock:
                fut, _ = self.pending.pop(i)
            fut.set_result(value) if ok else fut.set_exception(value)
        with self.lock:  # the helper died: nothing in flight waits forever
            for fut, url in self.pending.values():
                fut.set_exception(RemoteError(url, f"the helper process exited (code {self.proc.wait()})"))
            self.pending.clear()


_HELPER: Helper | None = None
_HELPER_LOCK = threading.Lock()


def helper() -> Helper:
    """This process's helper, started on first use (a forked child never uses its parent's)."""
    global _HELPER
    with _HELPER_LOCK:
        if _HELPER is None or _HELPER.pid != os.getpid() or _HELPER.proc.poll() is not None:
            _HELPER = Helper()
        return _HELPER


def _serve(fd: int) -> None:
    conn = Connection(fd)
    send = threading.Lock()
    clients: dict[Any, Any] = {}

    def run(i: int, client: Any, method: str, args: tuple[Any, ...]) -> None:
        key = (client.url, client.retries, repr(sorted(client._resolved.items())))
        client = clients.setdefault(key, client)  # one store (connection pool) per object and endpoint
        try:
            reply = (i, True, getattr(client, method)(*args))
        except BaseException as e:  # noqa: BLE001 -- sent back to the caller, which raises it
            reply = (i, False, e if isinstance(e, RemoteError) else RemoteError(client.url, f"{method}: {e}"))
        with send:
            conn.send(reply)

    with ThreadPoolExecutor(THREADS) as pool:
        while True:
            try:
                i, client, method, args = conn.recv()
            except (EOFError, OSError):
                break
            pool.submit(run, i, client, method, args)


if __name__ == "__main__":
    _serve(int(sys.argv[1]))
