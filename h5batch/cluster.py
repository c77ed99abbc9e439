"""Getting a Dask client for a job: LocalCluster, an existing scheduler, or dask-jobqueue.

Everything is Dask's own deployment machinery; h5batch only picks it from the job's
``cluster`` section. A LocalCluster and its dashboard bind to 127.0.0.1.
"""

from __future__ import annotations

import logging
import os
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any

from .config import ClusterConfig

JOBQUEUE_KINDS = {"slurm": "SLURMCluster", "pbs": "PBSCluster", "sge": "SGECluster", "lsf": "LSFCluster"}


@dataclass
class Connection:
    """An open client plus what to tell the user about it."""

    client: Any
    description: str
    dashboard: str | None
    cluster: Any = None


def _security(cfg: ClusterConfig):
    if not cfg.security:
        return None
    from distributed.security import Security

    return Security(**cfg.security)


def default_workers() -> int:
    """One single-threaded worker process per core."""
    try:
        return max(1, len(os.sched_getaffinity(0)))
    except AttributeError:
        return max(1, os.cpu_count() or 1)


def jobqueue_cluster(cfg: ClusterConfig):
    """Build (not scale) the dask-jobqueue cluster object for ``cfg.kind``."""
    try:
        import dask_jobqueue
    except ImportError as e:
        raise RuntimeError(f"cluster.kind {cfg.kind!r} needs dask-jobqueue: pip install 'h5batch[cluster]'") from e
    kwargs = dict(cfg.jobqueue)
    kwargs.pop("jobs", None)
    kwargs.setdefault("processes", 1)
    kwargs.setdefault("cores", 1)
    kwargs.setdefault("memory", "2GB")
    cls = getattr(dask_jobqueue, JOBQUEUE_KINDS[cfg.kind])
    security = _security(cfg)
    if security is not None:
        kwargs["security"] = security
    return cls(**kwargs)


@contextmanager
def connect(cfg: ClusterConfig, wait_timeout: float = 300.0) -> Iterator[Connection]:
    """Open a client as ``cfg`` says; close what we started on exit (also on errors)."""
    from distributed import Client, LocalCluster

    security = _security(cfg)
    if cfg.kind == "local":
        n = cfg.workers or default_workers()
        cluster = LocalCluster(
            n_workers=n, threads_per_worker=1, processes=True, host="127.0.0.1",
            dashboard_address="127.0.0.1:0" if cfg.dashboard else None,
            silence_logs=logging.ERROR,
        )
        client = Client(cluster)
        try:
            yield Connection(client, f"LocalCluster, {n} worker processes x 1 thread on 127.0.0.1",
                             client.dashboard_link if cfg.dashboard else None, cluster)
        finally:
            client.close()
            cluster.close()
        return
    if cfg.kind in ("address", "scheduler_file"):
        if cfg.kind == "address":
            client = Client(cfg.address, security=security, timeout="30s")
            what = f"scheduler {cfg.address}"
        else:
            client = Client(scheduler_file=cfg.scheduler_file, security=security, timeout="30s")
            what = f"scheduler from {cfg.scheduler_file}"
        try:
            if cfg.workers:
                client.wait_for_workers(cfg.workers, timeout=wait_timeout)
            n = len(client.scheduler_info(n_workers=-1)["workers"])
            yield Connection(client, f"{what}, {n} workers", client.dashboard_link)
        finally:
            client.close()
        return
    cluster = jobqueue_cluster(cfg)
    jobs = int(cfg.jobqueue.get("jobs", cfg.workers or 1))
    client = None
    try:
        cluster.scale(jobs=jobs)
        client = Client(cluster)
        client.wait_for_workers(1, timeout=wait_timeout)
        yield Connection(client, f"{JOBQUEUE_KINDS[cfg.kind]} with {jobs} worker jobs", client.dashboard_link, cluster)
    finally:
        if client is not None:
            client.close()
        cluster.close()
