"""The engine a job's ``cluster`` section names: decoder processes, or a Dask client.

``processes``       :class:`~.pool.DecoderPool`: ``cluster.workers`` decoder processes on
                    this machine, no Dask (the default).

The rest is Dask's own deployment machinery; h5batch only picks it:

``local``           a LocalCluster of single-threaded worker processes; scheduler, workers
                    and dashboard bind to 127.0.0.1.
``address``         join a running scheduler (``cluster.address``, ``--scheduler``,
                    ``DASK_SCHEDULER_ADDRESS``); wait for at least one (or ``cluster.workers``)
                    worker.
``scheduler_file``  the same, from a scheduler file (``dask scheduler --scheduler-file``).
``slurm`` ...       dask-jobqueue starts a scheduler in this process and submits
                    ``cluster.jobqueue.jobs`` worker jobs; a job that dies (``scancel``,
                    walltime) is replaced; every job is cancelled when the conversion
                    ends, fails or is interrupted (Ctrl-C, SIGTERM, SIGHUP).

``cluster.security`` holds Dask TLS options (:class:`distributed.security.Security`
keywords). They are handed to Dask and never printed: errors name the key, not the value.

BEWARE: after a SIGKILL of the driver no clean-up can run; its worker jobs end by themselves
once they lose the scheduler (at most dask-jobqueue's ``death_timeout``, 60 s).
Importing dask_jobqueue replaces the SIGINT handler with ``sys.exit()``; we put it back.
"""

from __future__ import annotations

import logging
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
from collections.abc import Iterator
from contextlib import closing, contextmanager, nullcontext
from dataclasses import dataclass
from typing import Any

from ..config import ClusterConfig, JobConfig
from ..errors import ConfigError, ConvertError
from ..transport.segments import hostname
from .signals import graceful

JOBQUEUE_KINDS = {"slurm": "SLURMCluster", "pbs": "PBSCluster", "sge": "SGECluster", "lsf": "LSFCluster"}
SUBMIT_COMMANDS = {"slurm": "sbatch", "pbs": "qsub", "sge": "qsub", "lsf": "bsub"}

# Keys of cluster.security: distributed.security.Security keywords h5batch passes through.
SECURITY_KEYS = ("require_encryption", "tls_ca_file", "tls_ciphers", "tls_min_version", "tls_max_version",
                 "tls_client_cert", "tls_client_key", "tls_scheduler_cert", "tls_scheduler_key",
                 "tls_worker_cert", "tls_worker_key")

# cluster.jobqueue keys that configure the cluster object rather than each job.
_CLUSTER_ONLY = ("scheduler_options", "shared_temp_directory", "silence_logs", "name")

# cluster.jobqueue keys h5batch sets itself, and where to say it instead.
_NOT_JOBQUEUE = {"security": "put TLS options in cluster.security", "n_workers": "use cluster.jobqueue.jobs",
                 "loop": "not configurable", "asynchronous": "not configurable",
                 "job_cls": "pick the batch system with cluster.kind", "scheduler_cls": "not configurable"}

# Placeholder in job scripts printed without a running scheduler (h5batch cluster-script).
PLACEHOLDER_SCHEDULER = "tcp://SCHEDULER-ADDRESS:8786"


@dataclass
class Connection:
    """An open client plus what to tell the user about it."""

    client: Any
    description: str
    dashboard: str | None
    cluster: Any = None


def security_kwargs(cfg: ClusterConfig, file: str = "<job>", own_cluster: bool = False) -> dict[str, Any]:
    """Checked ``Security`` keywords of ``cfg.security``.

    With ``own_cluster`` (a LocalCluster or dask-jobqueue cluster that h5batch starts), a
    scheduler or worker certificate left out is taken from the client one: Dask does not
    check host names, so one certificate signed by the CA serves every role.
    """
    sec = dict(cfg.security)
    for key, value in sec.items():
        if key not in SECURITY_KEYS:
            raise ConfigError(file, f"cluster.security.{key}",
                              f"unknown key (expected one of: {', '.join(SECURITY_KEYS)})")
        if key == "require_encryption":
            if not isinstance(value, bool):
                raise ConfigError(file, f"cluster.security.{key}", "must be true or false")
            continue
        if not isinstance(value, str) or not value:
            raise ConfigError(file, f"cluster.security.{key}", "must be a non-empty string")
        is_pem = "\n" in value  # Dask also takes PEM text in place of a file name
        if key.endswith(("_file", "_cert", "_key")) and not is_pem and not os.path.isfile(value):
            # name the key, never the value: a job file's secrets stay out of logs
            raise ConfigError(file, f"cluster.security.{key}", "file not found (path not shown)")
    if own_cluster and ("tls_client_cert" in sec):
        for role in ("scheduler", "worker"):
            sec.setdefault(f"tls_{role}_cert", sec["tls_client_cert"])
            if "tls_client_key" in sec:
                sec.setdefault(f"tls_{role}_key", sec["tls_client_key"])
    return sec


def make_security(cfg: ClusterConfig, file: str = "<job>", own_cluster: bool = False):
    """A :class:`distributed.security.Security` from ``cfg.security``, or None when empty."""
    if not cfg.security:
        return None
    from distributed.security import Security

    return Security(**security_kwargs(cfg, file, own_cluster))


def default_workers() -> int:
    """One single-threaded worker process per core."""
    try:
        return max(1, len(os.sched_getaffinity(0)))
    except AttributeError:
        return max(1, os.cpu_count() or 1)


def _jobqueue_module():
    main = threading.current_thread() is threading.main_thread()
    before = signal.getsignal(signal.SIGINT) if main else None
    try:
        import dask_jobqueue
    except ImportError as e:
        raise ConvertError("cluster.kind slurm/pbs/sge/lsf needs dask-jobqueue: pip install 'h5batch[cluster]'", 2) from e
    finally:
        # BEWARE: importing dask_jobqueue (its runner module) replaces the SIGINT handler
        # with sys.exit(): Ctrl-C would end the run with exit code 0, no commit and no
        # message. Put the previous handler back.
        if main and before is not None and signal.getsignal(signal.SIGINT) is not before:
            signal.signal(signal.SIGINT, before)
    return dask_jobqueue


def jobqueue_kwargs(cfg: ClusterConfig, security=None, file: str = "<job>") -> dict[str, Any]:
    """Keyword arguments for the dask-jobqueue cluster class of ``cfg.kind``.

    Defaults differ from dask-jobqueue's where h5batch knows better: one single-threaded
    worker process per core (``processes = cores``: a worker decodes one file at a time),
    jobs named ``h5batch-worker`` in the queue, and the scheduler's dashboard bound to
    127.0.0.1 (reach it with ``ssh -L``) instead of every interface.
    """
    kwargs = dict(cfg.jobqueue)
    kwargs.pop("jobs", None)
    for key, instead in _NOT_JOBQUEUE.items():
        if key in kwargs:
            raise ConfigError(file, f"cluster.jobqueue.{key}", f"is set by h5batch: {instead}")
    kwargs.setdefault("cores", 1)
    kwargs.setdefault("processes", kwargs["cores"])
    kwargs.setdefault("memory", "2GB")
    kwargs.setdefault("job_name", "h5batch-worker")
    sched = dict(kwargs.get("scheduler_options") or {})
    sched.setdefault("dashboard_address", "127.0.0.1:0")  # port 0 even without one (see _local)
    sched.setdefault("dashboard", bool(cfg.dashboard))
    kwargs["scheduler_options"] = sched
    if security is not None:
        kwargs["security"] = security
    return kwargs


def _unknown_kwarg(exc: Exception, file: str = "<job>") -> ConfigError:
    return ConfigError(file, "cluster.jobqueue", f"rejected by dask-jobqueue: {exc}".splitlines()[0])


def job_script(cfg: ClusterConfig, file: str = "<job>") -> str:
    """The batch script dask-jobqueue would submit for one worker job of ``cfg``.

    Built from dask-jobqueue's ``Job`` class without starting a scheduler or touching the
    batch system; the scheduler address is a placeholder. Creates ``log_directory`` if set.
    """
    if cfg.kind not in JOBQUEUE_KINDS:
        raise ConfigError(file, "cluster.kind",
                          f"a job script exists only for {', '.join(JOBQUEUE_KINDS)}, got {cfg.kind!r}")
    mod = _jobqueue_module()
    security = make_security(cfg, file, own_cluster=True)
    kwargs = jobqueue_kwargs(cfg, security, file)
    for key in _CLUSTER_ONLY:
        kwargs.pop(key, None)
    if security is not None:
        kwargs.setdefault("protocol", "tls://")
    job_cls = getattr(mod, JOBQUEUE_KINDS[cfg.kind]).job_cls  # e.g. SLURMJob
    try:
        job = job_cls(PLACEHOLDER_SCHEDULER.replace("tcp://", kwargs.get("protocol") or "tcp://"),
                      name="h5batch-worker", **kwargs)
    except (TypeError, ValueError) as e:
        raise _unknown_kwarg(e, file) from e
    return job.job_script()


def _check_submission(cfg: ClusterConfig, script: str) -> None:
    """Fail early and clearly when the batch system is missing or refuses the job."""
    command = SUBMIT_COMMANDS[cfg.kind]
    if shutil.which(command) is None:
        raise ConvertError(f"cluster.kind {cfg.kind!r} submits worker jobs with {command!r}, which is not on PATH: "
                    f"run h5batch on a login node of the cluster, or start workers yourself and "
                    f"use --scheduler", 2)
    if cfg.kind != "slurm":
        return
    # sbatch --test-only validates partition, time and resources without queueing anything.
    with tempfile.NamedTemporaryFile("w", suffix=".sh", prefix="h5batch-test-") as fh:
        fh.write(script)
        fh.flush()
        proc = subprocess.run(["sbatch", "--test-only", fh.name], capture_output=True, text=True, timeout=60)
    if proc.returncode != 0:
        detail = " ".join(proc.stderr.split())
        raise ConvertError(f"SLURM refuses the worker job (sbatch --test-only): {detail}; check "
                    f"cluster.jobqueue (queue, walltime, memory, cores); "
                    f"`h5batch cluster-script JOB` prints the script", 2)


@contextmanager
def _quiet(logger: str, level: int = logging.ERROR) -> Iterator[None]:
    log = logging.getLogger(logger)
    old = log.level
    log.setLevel(max(level, old))
    try:
        yield
    finally:
        log.setLevel(old)


@contextmanager
def _jobqueue(cfg: ClusterConfig, wait_timeout: float) -> Iterator[Connection]:
    from distributed import Client

    mod = _jobqueue_module()
    jobs = cfg.jobqueue.get("jobs", cfg.workers or 1)  # batch jobs to keep running
    if isinstance(jobs, bool) or not isinstance(jobs, int) or jobs < 1:
        raise ConfigError("<job>", "cluster.jobqueue.jobs", f"must be an integer >= 1, got {jobs!r}")
    _check_submission(cfg, job_script(cfg))
    security = make_security(cfg, own_cluster=True)
    cls = getattr(mod, JOBQUEUE_KINDS[cfg.kind])
    # The driver's signal handling again: importing dask_jobqueue replaced the SIGINT
    # handler (_jobqueue_module), and the clean-up a signal gets (commit, cancel every
    # job) must also happen when the login shell goes away or SLURM stops the driver.
    with graceful():
        try:
            kwargs = jobqueue_kwargs(cfg, security)
            cluster = cls(**kwargs)  # starts the scheduler in this process
        except (TypeError, ValueError) as e:
            raise _unknown_kwarg(e) from e
        client = None
        try:
            # adapt with min = max keeps `jobs` jobs alive: one that dies is resubmitted.
            cluster.adapt(minimum_jobs=jobs, maximum_jobs=jobs)
            client = Client(cluster, security=security, direct_to_workers=True)
            # start with the first worker (a busy queue should not hold the run) unless
            # cluster.workers asks for more
            want = min(cfg.workers or 1, jobs * int(kwargs["processes"]))
            _wait_workers(client, want, wait_timeout,
                          f"{cfg.kind} worker jobs (is the queue busy? logs: "
                          f"{cfg.jobqueue.get('log_directory') or 'slurm-*.out in the working directory'})")
            yield Connection(client, f"{JOBQUEUE_KINDS[cfg.kind]} with {jobs} worker jobs "
                                     f"({cfg.jobqueue.get('cores', 1)} cores each), scheduler {cluster.scheduler_address}",
                             _dashboard(client, cfg), cluster)
        finally:
            with _quiet("distributed"):  # workers going away mid-message log tracebacks at INFO
                if client is not None:
                    client.close()
                cluster.close()  # cancels every job it submitted (scancel / qdel / bkill)


def _dashboard(client, cfg: ClusterConfig) -> str | None:
    """The dashboard's address as it really listens (Dask's link names the scheduler's
    host even when the dashboard is bound to 127.0.0.1)."""
    if not cfg.dashboard:
        return None
    wanted = str((cfg.jobqueue.get("scheduler_options") or {}).get("dashboard_address", "127.0.0.1:0"))
    port = client.scheduler_info().get("services", {}).get("dashboard")
    if wanted.startswith("127.0.0.1:") and port:
        return f"http://127.0.0.1:{port}/status (on {hostname()}; ssh -L {port}:127.0.0.1:{port} to view it)"
    return client.dashboard_link


def _wait_workers(client, n: int, timeout: float, what: str) -> None:
    try:
        client.wait_for_workers(n, timeout=timeout)
    except TimeoutError as e:
        have = len(client.scheduler_info(n_workers=-1)["workers"])
        raise ConvertError(f"only {have} of {n} Dask workers arrived within {timeout:.0f}s: {what}") from e


def _open_client(cfg: ClusterConfig, security) -> tuple[Any, str]:
    from distributed import Client

    where = cfg.address if cfg.kind == "address" else f"the scheduler file {cfg.scheduler_file}"
    if cfg.kind == "scheduler_file" and not os.path.isfile(cfg.scheduler_file or ""):
        raise ConvertError(f"scheduler file {cfg.scheduler_file} does not exist (start the scheduler with "
                    f"`dask scheduler --scheduler-file {cfg.scheduler_file}` first)", 2)
    try:
        by_address = cfg.kind == "address"
        client = Client(cfg.address if by_address else None, security=security, timeout="30s",
                        scheduler_file=None if by_address else cfg.scheduler_file)
    except (OSError, TimeoutError, TypeError) as e:
        # TypeError: Dask's answer to a tls:// address without TLS settings
        hint = "; the scheduler speaks TLS: set cluster.security" if isinstance(e, TypeError) or (
            str(cfg.address or "").startswith("tls://") and security is None) else ""
        first = str(e).strip().splitlines()[0] if str(e).strip() else ""
        raise ConvertError(f"cannot reach the Dask scheduler at {where}: {type(e).__name__}: {first}{hint}", 2) from e
    return client, where


@contextmanager
def open_engine(job: JobConfig) -> Iterator[Connection]:
    """The engine of ``job`` (:func:`connect`), with Dask's settings for a run where it is Dask."""
    settings = nullcontext() if job.cluster.kind == "processes" else _dask_settings(job)
    with settings, connect(job.cluster, frozen_seconds=job.policy.frozen_worker_timeout) as conn:
        yield conn


def _dask_settings(job: JobConfig):
    """Dask's configuration for a run on Dask workers."""
    import dask
    import distributed  # noqa: F401  (its config defaults must exist before dask.config.set)

    # A task whose worker dies is re-run up to policy.retries more times before Dask
    # gives up (KilledWorker); then the batch is split to isolate the culprit.
    # worker-saturation 1.0 keeps queued tasks on the scheduler, so a worker that dies
    # takes only its running task down with it, not innocent tasks queued behind it.
    # Dask's health tick and stack sampler, many times a second, take CPU the decoders need;
    # the sampler feeds only the dashboard's profile page, so it is kept when there is one.
    settings: dict[str, Any] = {"distributed.scheduler.allowed-failures": job.policy.retries,
                                "distributed.scheduler.worker-saturation": 1.0,
                                "distributed.admin.tick.interval": "500ms"}
    if not job.cluster.dashboard:
        settings["distributed.worker.profile.enabled"] = False
    return dask.config.set(settings)


@contextmanager
def connect(cfg: ClusterConfig, wait_timeout: float = 300.0, frozen_seconds: float = 60.0) -> Iterator[Connection]:
    """Open a client as ``cfg`` says; close what we started on exit (also on errors).

    Parameters
    ----------
    cfg
        The job's ``cluster`` section.
    wait_timeout
        Seconds to wait for the first worker (``cluster.workers`` workers for an existing
        scheduler when set) before giving up with a :class:`~h5batch.errors.ConvertError`.
    """

    if cfg.kind == "processes":
        from .pool import DecoderPool

        n = cfg.workers or default_workers()
        with closing(DecoderPool(n, frozen_seconds)) as pool:
            yield Connection(pool, f"{n} decoder processes on this machine", None)
        return
    if cfg.kind in JOBQUEUE_KINDS:
        with _jobqueue(cfg, wait_timeout) as conn:
            yield conn
        return
    if cfg.kind == "local":
        # Errors only from Dask's logging, through the cluster's close too: stopping workers
        # log tracebacks at INFO just as LocalCluster restores the level.
        with _quiet("distributed"):
            yield from _local(cfg)
        return
    security = make_security(cfg)
    client, where = _open_client(cfg, security)
    try:
        want = cfg.workers or 1
        if len(client.scheduler_info(n_workers=-1)["workers"]) < want:
            print(f"waiting up to {wait_timeout:.0f}s for {want} Dask worker(s) on {where} ...",
                  file=sys.stderr, flush=True)
        _wait_workers(client, want, wait_timeout, f"start workers with `dask worker {client.scheduler.address}`")
        n = len(client.scheduler_info(n_workers=-1)["workers"])
        yield Connection(client, f"scheduler {client.scheduler.address}, {n} workers"
                                 + (" (TLS)" if security is not None else ""),
                         client.dashboard_link if cfg.dashboard else None)
    finally:
        client.close()


#: Rule: a LocalCluster of a run never retires a nanny whose worker died; the nanny restarts
#: it. Reason: Dask's SpecCluster closes a nanny for good when no worker of its name is back
#: ``distributed.deploy.lost-worker-timeout`` (15 s) after the scheduler lost it, and a worker
#: killed by crash isolation can take longer to come back on a loaded machine, leaving the
#: run with no worker.
LOST_WORKER_TIMEOUT = "7 days"


def _local(cfg: ClusterConfig) -> Iterator[Connection]:
    """A LocalCluster of ``cfg.workers`` single-threaded processes on 127.0.0.1."""
    import dask
    from distributed import Client, LocalCluster

    security = make_security(cfg, own_cluster=True)
    n = cfg.workers or default_workers()
    with dask.config.set({"distributed.deploy.lost-worker-timeout": LOST_WORKER_TIMEOUT}):
        cluster = LocalCluster(
            n_workers=n, threads_per_worker=1, processes=True, host="127.0.0.1",
            # Port 0 even without a dashboard: the scheduler's HTTP server starts anyway, and
            # on 8787 a second run beside the first would warn that the port is in use.
            dashboard_address="127.0.0.1:0", scheduler_kwargs={"dashboard": bool(cfg.dashboard)},
            silence_logs=logging.ERROR, security=security,
            protocol="tls://" if security is not None else None,
            preload=["h5batch.conversion.worker"],
        )
        client = None
        try:
            client = Client(cluster, security=security)
            yield Connection(client, f"LocalCluster, {n} worker processes x 1 thread on 127.0.0.1"
                                     + (" (TLS)" if security is not None else ""),
                             client.dashboard_link if cfg.dashboard else None, cluster)
        finally:
            if client is not None:
                client.close()
            cluster.close()
