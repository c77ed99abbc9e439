"""Cluster mode through a real batch system: a throw-away single-node SLURM on 127.0.0.1
(tests/cluster/slurm_local.sh), dask-jobqueue's SLURMCluster started by `h5batch convert`.

Skipped with the reason when SLURM cannot be started here (not root, no apt). Each test
names its worker jobs uniquely and checks none is left in squeue afterwards.
"""

from __future__ import annotations

import os
import secrets
import signal
import subprocess
import time
from pathlib import Path

import pytest

from h5batch import generate
from tests.support.cluster_helpers import (
    Running,
    assert_same_h5,
    clean_env,
    convert,
    orphaned_segments,
    summary_seconds,
    write_job,
)

pytestmark = pytest.mark.slurm

SCRIPT = Path(__file__).resolve().parent / "cluster" / "slurm_local.sh"
N_PAIRS = 440  # big corpus: 400 train + 40 test pairs, batches of 4


@pytest.fixture(autouse=True)
def no_leaked_segments():
    """Overrides conftest's machine-wide check (see tests/test_cluster.py). Segments of a
    driver killed on purpose are removed by the test that killed it."""
    before = orphaned_segments()
    yield
    leaked = orphaned_segments() - before
    assert not leaked, f"shared-memory segments leaked: {sorted(leaked)}"


@pytest.fixture(scope="module")
def slurm() -> dict[str, str]:
    """A running local SLURM; the environment for its clients. Stopped at the end of the
    module if this module started it."""
    was_up = subprocess.run(["bash", str(SCRIPT), "status"], capture_output=True, timeout=60).returncode == 0
    res = subprocess.run(["bash", str(SCRIPT), "start"], capture_output=True, text=True, timeout=600)
    if res.returncode == 3:
        last = (res.stderr.strip().splitlines() or ["exit code 3"])[-1]
        pytest.skip(f"no local SLURM on this machine: {last}")
    assert res.returncode == 0, f"slurm_local.sh start failed:\n{res.stderr}"
    out = subprocess.run(["bash", str(SCRIPT), "env"], capture_output=True, text=True, check=True).stdout
    env = clean_env()
    for line in out.splitlines():
        key, _, value = line.removeprefix("export ").partition("=")
        env[key] = value.strip("'\"")
    yield env
    if not was_up:
        subprocess.run(["bash", str(SCRIPT), "stop"], capture_output=True, timeout=300)


def squeue(env: dict[str, str], name: str) -> list[tuple[str, str]]:
    """``(job id, state)`` of the queued or running jobs called ``name``."""
    out = subprocess.run(["squeue", "-h", "-n", name, "-o", "%A %T"], capture_output=True, text=True,
                         env=env, timeout=30, check=True).stdout
    return [tuple(line.split()) for line in out.splitlines() if line.strip()]


def wait_queue_empty(env: dict[str, str], name: str, timeout: float = 60) -> float:
    """Seconds until no job called ``name`` is left (fails after ``timeout``)."""
    t0 = time.monotonic()
    while squeue(env, name):
        if time.monotonic() - t0 > timeout:
            raise AssertionError(f"jobs left in squeue: {squeue(env, name)}")
        time.sleep(0.5)
    return time.monotonic() - t0


@pytest.fixture(scope="module")
def work(tmp_path_factory) -> Path:
    return tmp_path_factory.mktemp("slurm")


@pytest.fixture(scope="module")
def corpus(work) -> Path:
    root = work / "big"
    generate.make_paired_audio(root, n_train=400, n_test=40)
    return root


@pytest.fixture(scope="module")
def reference(work, corpus) -> tuple[Path, float]:
    out = work / "ref.h5"
    res, _ = convert(write_job(work, corpus, out, name="ref", workers=2, batch_size=4))
    return out, summary_seconds(res.stderr)


def slurm_job(tmp_path: Path, corpus: Path, out: Path, **jobqueue) -> tuple[Path, str]:
    """A job converting ``corpus`` with 2 single-core SLURM worker jobs; (job file, job name)."""
    name = f"h5b-{secrets.token_hex(3)}"
    jq = {"cores": 1, "memory": "2GB", "processes": 1, "queue": "debug", "walltime": "00:10:00",
          "interface": "lo", "jobs": 2, "job_name": name, "log_directory": str(tmp_path / "logs"),
          "local_directory": str(tmp_path / "scratch"), **jobqueue}
    return write_job(tmp_path, corpus, out, kind="slurm", workers=2, batch_size=4, jobqueue=jq), name


def test_slurm_gives_the_local_file(slurm, corpus, reference, tmp_path):
    ref, local_s = reference
    out = tmp_path / "out.h5"
    job, name = slurm_job(tmp_path, corpus, out)
    res, wall = convert(job, env=slurm)
    assert "decoding on SLURMCluster with 2 worker jobs" in res.stderr
    assert "preflight: 2 workers on 1 host(s)" in res.stderr
    assert_same_h5(ref, out)
    gone = wait_queue_empty(slurm, name)
    slurm_s = summary_seconds(res.stderr)
    print(f"\n[slurm] {N_PAIRS} pairs, batch 4, 2 workers: LocalCluster {local_s:.2f}s, "
          f"SLURM {slurm_s:.2f}s (process wall {wall:.2f}s, incl. job start); queue empty {gone:.1f}s after")


def _job_of_each_worker(scheduler: str) -> dict[str, str]:
    """SLURM job id of every worker of the scheduler, and the tasks it has run."""
    from distributed import Client

    def info(dask_worker):
        return os.environ.get("SLURM_JOB_ID", ""), dask_worker.state.executed_count

    with Client(scheduler, timeout="30s") as client:
        return client.run(info)


def test_scancel_a_worker_job_mid_run(slurm, corpus, reference, tmp_path):
    ref, _ = reference
    out = tmp_path / "out.h5"
    job, name = slurm_job(tmp_path, corpus, out)
    run = Running(job, env=slurm)
    try:
        line = run.wait_line("decoding on SLURMCluster")
        scheduler = line.split("scheduler ", 1)[1].split(";", 1)[0]
        run.wait_line("preflight: 2 workers")
        deadline = time.monotonic() + 60
        while True:  # until a worker has decoded a few batches
            jobs = _job_of_each_worker(scheduler)
            victim = next((jid for jid, n in jobs.values() if n >= 3), None)
            if victim or time.monotonic() > deadline:
                break
            time.sleep(0.1)
        assert victim, f"no worker ran 3 batches: {jobs}"
        assert run.proc.poll() is None and not out.exists(), "the run finished before the kill"
        subprocess.run(["scancel", victim], env=slurm, check=True, timeout=30)
        assert run.wait() == 0, run.stderr
    finally:
        run.kill()
    assert sum(n for _, n in jobs.values()) < 110, f"killed after every batch ran: {jobs}"
    assert_same_h5(ref, out)
    wait_queue_empty(slurm, name)


@pytest.mark.parametrize("sig", [signal.SIGINT, signal.SIGTERM, signal.SIGHUP], ids=["INT", "TERM", "HUP"])
def test_interrupted_driver_cancels_its_jobs(slurm, corpus, tmp_path, sig):
    out = tmp_path / "out.h5"
    job, name = slurm_job(tmp_path, corpus, out)
    run = Running(job, env=slurm)
    try:
        run.wait_line("preflight: 2 workers")
        assert len(squeue(slurm, name)) == 2
        run.wait_line("plan: ")  # (-v) the trial is done: the next step is the writer's Start
        run.proc.send_signal(sig)
        assert run.wait(timeout=120) == 128 + sig, run.stderr  # 130, 143, 129 (docs/faults.md)
    finally:
        run.kill()
    said = "interrupted" if sig == signal.SIGINT else f"stopped by {signal.Signals(sig).name}"
    assert f"{said}; progress is committed" in run.stderr
    wait_queue_empty(slurm, name, timeout=30)
    if sig == signal.SIGINT:  # the same command again resumes from the commit and finishes
        res, _ = convert(job, env=slurm)
        assert "wrote" in res.stderr
        wait_queue_empty(slurm, name, timeout=30)


def test_killed_driver_leaves_no_jobs(slurm, corpus, tmp_path):
    """SIGKILL: no clean-up can run, but the workers lose their scheduler and end their
    jobs by themselves."""
    from h5batch.transport.segments import remove_stale_segments

    job, name = slurm_job(tmp_path, corpus, tmp_path / "out.h5")
    run = Running(job, env=slurm)
    try:
        run.wait_line("preflight: 2 workers")
        run.proc.send_signal(signal.SIGKILL)
        run.wait(timeout=30)
    finally:
        run.kill()
    gone = wait_queue_empty(slurm, name, timeout=90)
    print(f"\n[slurm] driver SIGKILLed: worker jobs gone after {gone:.1f}s")
    remove_stale_segments()  # what the next run does first


def test_refused_job_is_a_clear_error_and_nothing_is_queued(slurm, corpus, tmp_path):
    job, name = slurm_job(tmp_path, corpus, tmp_path / "out.h5", queue="no-such-partition")
    res, _ = convert(job, env=slurm, check=False)
    assert res.returncode == 2, res.stderr
    assert "SLURM refuses the worker job (sbatch --test-only)" in res.stderr
    assert "invalid partition" in res.stderr.lower()
    assert not squeue(slurm, name)
