"""``h5batch`` in a child process, the way a user runs it: the one helper of every test
that runs a conversion (or another command) as a subprocess.

A subprocess, not :func:`h5batch.cli.main` in the test's own process, wherever the test
needs what only a real process has: signals (kill -9, Ctrl-C), a fresh interpreter (the
writer's fork server, imports), its exit code and its exact stderr. The child inherits the
test's environment less ``DASK_SCHEDULER_ADDRESS``, which would send a local conversion to
whatever scheduler the developer's shell names.
"""

from __future__ import annotations

import os
import subprocess
import sys
import time
from collections.abc import Iterable, Mapping
from pathlib import Path

CLI = (sys.executable, "-m", "h5batch.cli")


def h5batch_cmd(*args: str) -> list[str]:
    """The command line of ``h5batch ARGS...`` run by this interpreter."""
    return [*CLI, *args]


def convert_cmd(job: str | Path, *extra: str, output: str | Path | None = None, root: str | Path | None = None,
                workers: int | None = None, settings: Iterable[str] = (), overwrite: bool = False,
                progress: str | None = "none") -> list[str]:
    """``h5batch convert JOB [--workers N] [--output OUT] [--set source.root=ROOT]
    [--set KEY=VALUE ...] [--overwrite] [--progress P] EXTRA...`` (``progress=None`` leaves
    the flag out: the default, ``auto``)."""
    args = ["convert", str(job)]
    if workers is not None:
        args += ["--workers", str(workers)]
    if output is not None:
        args += ["--output", str(output)]
    if root is not None:
        args += ["--set", f"source.root={root}"]
    for kv in settings:
        args += ["--set", kv]
    if overwrite:
        args.append("--overwrite")
    if progress is not None:
        args += ["--progress", progress]
    return h5batch_cmd(*args, *extra)


def clean_env(**extra: str) -> dict[str, str]:
    """This process's environment without ``DASK_SCHEDULER_ADDRESS``, plus ``extra``."""
    env = {k: v for k, v in os.environ.items() if k != "DASK_SCHEDULER_ADDRESS"}
    env.update(extra)
    return env


def _env(env: Mapping[str, str] | None, env_extra: Mapping[str, str] | None) -> dict[str, str]:
    out = clean_env() if env is None else dict(env)
    out.update(env_extra or {})
    return out


#: Pids of every process this test process started through this module: the drivers whose
#: shared-memory segments are this session's to answer for (tests run side by side on xdist
#: workers, and another worker's killed runs leave segments of their own until their rerun).
SPAWNED: set[int] = set()


def run(cmd: list[str], env_extra: Mapping[str, str] | None = None, *, env: Mapping[str, str] | None = None,
        cwd: str | Path | None = None, timeout: float = 300) -> subprocess.CompletedProcess:
    """Run ``cmd`` to the end; the completed process with its text output.

    ``env`` is the whole environment (default :func:`clean_env`), ``env_extra`` variables
    set on top of it (``H5BATCH_FAULTS``, ...)."""
    with subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                          env=_env(env, env_extra), cwd=cwd) as proc:
        SPAWNED.add(proc.pid)
        try:
            out, err = proc.communicate(timeout=timeout)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.communicate()
            raise
    return subprocess.CompletedProcess(cmd, proc.returncode, out, err)


def run_h5batch(*args: str, env: Mapping[str, str] | None = None, env_extra: Mapping[str, str] | None = None,
                cwd: str | Path | None = None, timeout: float = 300) -> subprocess.CompletedProcess:
    """``h5batch ARGS...`` to the end (see :func:`run`)."""
    return run(h5batch_cmd(*args), env=env, env_extra=env_extra, cwd=cwd, timeout=timeout)


def start(cmd: list[str], env_extra: Mapping[str, str] | None = None, *, env: Mapping[str, str] | None = None,
          cwd: str | Path | None = None, new_session: bool = False) -> subprocess.Popen:
    """Start ``cmd`` with its stdout and stderr piped (text). ``new_session`` puts it in a
    process group of its own, so a test can signal the driver and every process it started
    at once, as a terminal does."""
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            env=_env(env, env_extra), cwd=cwd, start_new_session=new_session)
    SPAWNED.add(proc.pid)
    return proc


def convert(job: str | Path, *extra: str, env: Mapping[str, str] | None = None,
            env_extra: Mapping[str, str] | None = None, cwd: str | Path | None = None, timeout: float = 300,
            check: bool = False, **cmd_options) -> subprocess.CompletedProcess:
    """Run ``h5batch convert`` (arguments as for :func:`convert_cmd`) to the end; with
    ``check``, fail the test unless it exits 0. The completed process has one more
    attribute, ``seconds``: the wall time of the run, start-up included."""
    t0 = time.perf_counter()
    res = run(convert_cmd(job, *extra, **cmd_options), env=env, env_extra=env_extra, cwd=cwd, timeout=timeout)
    res.seconds = time.perf_counter() - t0  # type: ignore[attr-defined]
    if check:
        assert res.returncode == 0, f"convert failed ({res.returncode}):\n{res.stderr}"
    return res


def own_stale_segments() -> list[str]:
    """Stale h5batch segments (their run's driver is gone) of the runs this test process
    started (:data:`SPAWNED`) or ran itself. Reason: under xdist another worker may have just
    killed a run whose segments its rerun is about to remove; a global check would judge
    that run's leftovers as this test's."""
    from h5batch.transport.segments import owner_pid, stale_segments

    mine = SPAWNED | {os.getpid()}
    return [s for s in stale_segments() if owner_pid(s) in mine]
