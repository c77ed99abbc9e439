"""Where the writers of a sharded output run: each on a host of the workers that feed it.

Rule: with ``output.writers`` N > 1 on Dask workers (an external scheduler or
dask-jobqueue) that listen on more than one host address, or on one address that is not
this machine's, writer ``k`` runs on host ``hosts[k % H]`` (the H hosts sorted by
address), started there by a Dask task (:mod:`h5batch.writer.remote`), and the batches of
shard ``k`` go only to workers of that host (Dask's ``workers=`` restriction by host, so
workers that join later on that host take them too). Everywhere else (one writer,
``processes``, ``local``, workers on this machine) the writers are local processes.

Reason: decoded bytes then go from a worker to the writer of its own host through shared
memory: N writers on N hosts move N times the bytes one host's link and disk can, and
nothing goes through the driver (the scheduler sends only descriptors). One writer stays
on the driver's host as before: its bytes must meet somewhere, and the driver's host is
where the output is committed.

A host is what Dask calls a worker's host: the address its workers listen on
(``dask worker --host``); the shard records it (:mod:`h5batch.shards`).
"""

from __future__ import annotations

import secrets
import socket
from dataclasses import dataclass

from ..config import JobConfig
from ..errors import ConvertError
from ..writer import remote
from ..writer.process import WriterHandle
from .lock import OutputLock, lock_path

START_SECONDS = 120.0  # to start a writer on its host and connect to it


@dataclass(frozen=True)
class Placement:
    """A writer on its workers' host, as its lane's batches need it."""

    host: str  # the workers' address host: Dask's restriction, and what the shard records
    hostname: str  # its name: a task's writer_host (shared memory where the worker runs there)
    run_id: str  # the run id of the lane's segments, made of the writer's pid (h5batch.writer.remote)


def _here(address: str) -> bool:
    """Whether ``address`` is one of this machine's (it can be bound here)."""
    try:
        with socket.socket(socket.AF_INET6 if ":" in address else socket.AF_INET) as s:
            s.bind((address, 0))
        return True
    except OSError:
        return False


def worker_hosts(client, job: JobConfig) -> list[str]:
    """The hosts the writers go to (sorted addresses), or ``[]``: writers on this machine."""
    if job.output.writers == 1 or job.cluster.kind in ("processes", "local"):
        return []
    hosts = sorted({info["host"] for info in client.scheduler_info(n_workers=-1)["workers"].values()})
    return [] if len(hosts) == 1 and _here(hosts[0]) else hosts


def _started(fut, host: str, shard_final: str, authkey: bytes) -> tuple[WriterHandle, Placement]:
    """The writer the task ``fut`` started on ``host``, connected. Raises
    :class:`ConvertError` (exit code 2) when that host cannot write the output."""
    try:
        got = fut.result(timeout=START_SECONDS)
    except Exception as e:  # noqa: BLE001  (TimeoutError, KilledWorker, CommClosedError...)
        raise ConvertError(f"could not start the writer of {shard_final} on host {host}: {type(e).__name__}: {e}",
                           2) from None
    if "error" in got:
        raise ConvertError(got["error"], 2)
    address = tuple(got["address"])
    try:
        handle = remote.connect(address, authkey)
    except OSError as e:
        raise ConvertError(f"cannot reach the writer of {shard_final} at {address[0]}:{address[1]} from this host: "
                           f"{e.strerror or e}; the driver's host must reach the workers' hosts on any TCP port", 2) from None
    return handle, Placement(got["host"], got["hostname"], f"{got['pid']:x}x{secrets.token_hex(4)}")


def place(client, job: JobConfig, finals: dict[int, str], writers: dict[int, WriterHandle], lock: OutputLock,
          run_id: str, say) -> dict[int, Placement]:
    """Replace the local writers of the shards in ``finals`` (index -> shard file) by writers
    on their workers' hosts where the rule above says so; their placements (``{}``: none)."""
    hosts = worker_hosts(client, job)
    if not hosts:
        return {}
    started = {}  # every writer starting at once: each start is an interpreter and h5py's import
    for k, final in finals.items():
        authkey = secrets.token_bytes(32)  # travels through Dask (TLS with cluster.security)
        host = hosts[k % len(hosts)]
        started[k] = host, authkey, client.submit(
            remote.start_on_worker, authkey.hex(), lock_path(final), lock.path, run_id, workers=[host],
            allow_other_workers=False, pure=False, key=f"h5batch-writer-{run_id}-{k}")
    placed: dict[int, Placement] = {}
    for k, (host, authkey, fut) in started.items():
        writers[k].stop()  # never got a job
        writers[k], placed[k] = _started(fut, host, finals[k], authkey)
    if placed:
        say("writers on their workers' hosts: " + ", ".join(f"shard {k} on {p.host}" for k, p in placed.items()))
    return placed
