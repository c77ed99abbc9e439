"""A shard's writer on a host of the workers that feed it, reached over TCP.

Where ``output.writers: N`` meets Dask workers on other hosts than the driver's
(:mod:`h5batch.conversion.writer_hosts` decides and places), each writer runs on the host
of its workers, so their decoded bytes reach it through that host's shared memory and never
travel to the driver:

* :func:`start_on_worker`, a Dask task on a worker of that host, checks that the output
  folder there is the driver's (a shared file system) and starts ``python -m
  h5batch.writer.remote``, detached. That process listens on a TCP port of the worker's
  address (``multiprocessing.connection.Listener``; a random authkey that came through
  Dask, read from stdin, never on the command line), prints its address, accepts the
  driver's one connection and runs the writer loop of a local writer
  (:func:`~.process.writer_main`) with the connection as inbox, outbox and lifeline.
* **Lifeline**: the connection. Its EOF (the driver closed it, exited, or was killed: the
  kernel closes a dead process's sockets) makes the writer commit what it stored and exit,
  as a local writer does when its pipe turns readable. TCP keepalive (:data:`KEEPALIVE`)
  ends a connection whose other host went silent (powered off, cut off) within about a
  minute. The driver cannot kill a process on another host: its ``kill`` closes the
  connection, and the writer commits and exits.
* **Lock**: the driver keeps the output's lock (``X.h5.lock``, on its host). The writer
  holds an ``flock`` on its shard's own lock file (``X.shard-K-of-N.h5.lock``) while it
  runs, so the writer of a new run waits for one still committing after its driver died
  (on NFS, Linux turns ``flock`` into a POSIX lock the server keeps, valid between hosts).
* **Shared memory**: the run id of its batches' segments (:mod:`h5batch.transport.segments`)
  is made of this writer's pid, so a worker of the host stops making segments for it once
  it is gone, and the writer unlinks them when it ends (and those of dead writers on its
  host when it starts).

The driver's side is an ordinary :class:`~.process.WriterHandle` whose process, queues and
lifeline are one :class:`Peer`.
"""

from __future__ import annotations

import argparse
import contextlib
import fcntl
import json
import os
import queue
import signal
import socket
import subprocess
import sys
import threading
import time
from multiprocessing import AuthenticationError
from multiprocessing.connection import Client, Listener
from typing import Any

from ..transport.segments import (
    hostname,
    list_segments,
    owner_pid,
    remove_stale_segments,
    unlink_shm,
)
from .process import WriterHandle, writer_main

ACCEPT_SECONDS = 120  # a writer no driver connects to within this ends
LOCK_WAIT_SECONDS = 30.0  # how long a writer waits for the previous writer of its shard
KEEPALIVE = {"TCP_KEEPIDLE": 30, "TCP_KEEPINTVL": 10, "TCP_KEEPCNT": 3}  # silent peer: gone in ~60 s


class Peer:
    """One end of the driver-writer connection, as a queue (``put``/``get``), a process
    (``is_alive``, ``exitcode``, ``join``, ``kill``) and a lifeline (``poll``, ``close``).
    EOF or a failed send marks the other end gone; ``get`` then raises :class:`queue.Empty`.
    ``quiet`` (the writer's side): a send to a driver that is gone is dropped, and the writer
    learns it through its lifeline (it then commits), instead of failing mid-message."""

    @property
    def exitcode(self) -> str | None:
        """(process) None while connected; a process on another host has no exit code here."""
        return "unknown: its connection closed" if self.gone else None

    def __init__(self, conn, quiet: bool = False):
        self.conn, self.quiet, self.gone = conn, quiet, False
        self._lock = threading.Lock()  # readers in several threads are serialised
        with self._socket() as sock:
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_KEEPALIVE, 1)
            for name, value in KEEPALIVE.items():
                if hasattr(socket, name):
                    sock.setsockopt(socket.IPPROTO_TCP, getattr(socket, name), value)

    def _socket(self) -> socket.socket:
        """The connection's socket, through a descriptor of its own (closed after use: the
        options and a shutdown act on the socket, not on the descriptor)."""
        return socket.socket(fileno=os.dup(self.conn.fileno()))

    def put(self, msg: Any) -> None:
        try:
            self.conn.send(msg)
        except OSError:
            self.gone = True
            if not self.quiet:
                raise

    def get(self, timeout: float | None = None) -> Any:
        with self._lock:
            try:
                if self.gone or not self.conn.poll(timeout):
                    raise queue.Empty
                return self.conn.recv()
            except (EOFError, OSError):
                self.gone = True
                raise queue.Empty from None

    def poll(self) -> bool:
        """(lifeline) True once the other end is gone."""
        return self.gone

    def is_alive(self) -> bool:
        return not self.gone

    def join(self, timeout: float | None = None) -> None:
        """Wait for the writer's EOF (its exit), dropping what it still says."""
        deadline = time.monotonic() + (timeout if timeout is not None else 1e9)
        while not self.gone and time.monotonic() < deadline:
            with contextlib.suppress(queue.Empty):
                self.get(min(0.5, max(0.0, deadline - time.monotonic())))

    def close(self) -> None:
        """(lifeline) Tell the writer we are gone: it commits and exits; its last words
        can still be read (a half close)."""
        with contextlib.suppress(OSError), self._socket() as sock:
            sock.shutdown(socket.SHUT_WR)

    def kill(self) -> None:
        self.close()
        self.conn.close()
        self.gone = True


def connect(address: tuple[str, int], authkey: bytes) -> WriterHandle:
    """(driver) The handle of the writer listening at ``address``."""
    peer = Peer(Client(address, authkey=authkey))
    return WriterHandle(peer, peer, peer, peer)  # type: ignore[arg-type]


def start_on_worker(authkey_hex: str, lock: str, output_lock: str, driver_run: str) -> dict[str, Any]:
    """(a Dask task on a worker of the writer's host) Start the writer process there; its
    ``address``, ``pid``, ``host`` (the worker's address host) and ``hostname``, or an
    ``error`` line. ``output_lock``: the driver's lock file of the output, whose content
    names ``driver_run``: seen here, the output folder is the driver's."""
    from distributed import get_worker

    host = get_worker().address.rsplit("://", 1)[-1].rsplit(":", 1)[0].strip("[]")
    folder = os.path.dirname(os.path.abspath(output_lock))
    try:
        with open(output_lock) as fh:
            mine = driver_run in fh.read()
    except OSError as e:
        mine, why = False, e.strerror
    else:
        why = "another file system is mounted there"
    if not mine:
        return {"error": f"the output folder {folder} is not the driver's on host {hostname()} ({host}): {why}. "
                         f"A writer runs on its workers' host: put the output on a file system every host "
                         f"shares, or set output.writers to 1"}
    proc = subprocess.Popen([sys.executable, "-m", __name__, "--host", host, "--lock", lock],
                            stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True, start_new_session=True)
    proc.stdin.write(authkey_hex + "\n")
    proc.stdin.close()
    line = proc.stdout.readline()  # its address, or why it cannot write the shard
    proc.stdout.close()
    if not line:
        return {"error": f"the writer process on host {hostname()} ({host}) exited with code {proc.wait()} "
                         f"before it listened (its message is in the Dask worker's log)"}
    return {"host": host, "hostname": hostname(), **json.loads(line)}


def _take_lock(path: str) -> int | None:
    """Hold ``path`` locked for this process's life (waiting a while for a writer of the
    same shard that is still committing); None when it stays held."""
    fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o644)
    deadline = time.monotonic() + LOCK_WAIT_SECONDS
    while True:
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            if os.fstat(fd).st_ino == os.stat(path).st_ino:
                return fd
            os.close(fd)  # removed by the writer we waited for: lock the new file
            fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o644)
        except FileNotFoundError:
            os.close(fd)
            fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o644)
        except BlockingIOError:
            if time.monotonic() > deadline:
                os.close(fd)
                return None
            time.sleep(0.2)


def _own_segments() -> list[str]:
    return [n for n in list_segments() if owner_pid(n) == os.getpid()]


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(prog="python -m h5batch.writer.remote",
                                description="a shard writer on its workers' host (started by a conversion)")
    p.add_argument("--host", required=True, help="the address to listen on (the workers')")
    p.add_argument("--lock", required=True, help="the shard's lock file")
    args = p.parse_args(argv)
    authkey = bytes.fromhex(sys.stdin.readline().strip())
    lock_fd = _take_lock(args.lock)
    if lock_fd is None:
        print(json.dumps({"error": f"{args.lock} is held by another writer of this shard on host {hostname()} "
                                   f"({args.host}) for over {LOCK_WAIT_SECONDS:.0f} s: wait for it to end, or stop it"}))
        return
    remove_stale_segments()  # of writers on this host that were killed
    listener = Listener((args.host, 0), authkey=authkey)
    print(json.dumps({"address": listener.address, "pid": os.getpid()}), flush=True)
    with open(os.devnull, "w") as null:  # the starter has read its line and gone
        os.dup2(null.fileno(), sys.stdout.fileno())
    signal.alarm(ACCEPT_SECONDS)  # SIGALRM ends a writer nobody connects to
    while True:
        try:
            conn = listener.accept()
            break
        except (AuthenticationError, EOFError, OSError):  # not the driver: wait for it
            continue
    signal.alarm(0)
    listener.close()
    peer = Peer(conn, quiet=True)

    def at_exit() -> None:
        unlink_shm(_own_segments())
        with contextlib.suppress(OSError):
            os.unlink(args.lock)  # while still locked: a waiting writer takes the new file
        os.close(lock_fd)

    writer_main(peer, peer, peer, host=args.host, at_exit=at_exit)


if __name__ == "__main__":
    main()
