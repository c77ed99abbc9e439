"""Shard writers on their workers' hosts (h5batch/conversion/writer_hosts.py,
h5batch/writer/remote.py): a real ``dask scheduler`` and one ``dask worker`` on each of two
loopback addresses (two hosts for Dask), ``output.writers: 2``."""

from __future__ import annotations

import fcntl
import os
import signal
import time
from pathlib import Path

import h5py
import psutil
import pytest

from h5batch import format as fmt
from h5batch.shards import ranges, records, shard_path
from tests.support.cluster_helpers import DaskProcesses
from tests.support.run import run, start
from tests.support.torture import paired_with_rejects
from tests.test_shards import BAD, cmd, digest

HOSTS = ("127.0.0.2", "127.0.0.3")


@pytest.fixture(scope="module")
def corpus(tmp_path_factory) -> Path:
    root = tmp_path_factory.mktemp("hosts") / "corpus"
    return paired_with_rejects(root, BAD, n_train=120, n_test=24, seconds=0.25, seed=5)


@pytest.fixture(scope="module")
def reference(corpus, tmp_path_factory) -> Path:
    out = tmp_path_factory.mktemp("ref") / "out.h5"
    res = run(cmd(corpus, out, 1))
    assert res.returncode == 0, res.stderr
    return out


@pytest.fixture(scope="module")
def two_hosts(tmp_path_factory):
    d = DaskProcesses(tmp_path_factory.mktemp("dask"))
    d.start_scheduler()
    for i, host in enumerate(HOSTS):
        d.start_worker(f"w{i}", host=host)
    d.wait_workers(2)
    yield d
    d.close()


def _writers() -> list[psutil.Process]:
    out = []
    for p in psutil.process_iter(["cmdline"]):
        if "h5batch.writer.remote" in (p.info["cmdline"] or []):
            out.append(p)
    return out


def _decoded(d: DaskProcesses) -> dict[str, set[int]]:
    """The batches each worker decoded, by worker name (from its recent task transitions)."""

    def batches(dask_worker):
        keys = {e[0] for e in dask_worker.state.log if isinstance(e[0], str)}
        return {int(k.split("-")[3]) for k in keys if k.startswith("h5batch-decode-")}

    info = d.client.scheduler_info(n_workers=-1)["workers"]
    return {info[a]["name"]: got for a, got in d.client.run(batches).items()}


def test_each_writer_runs_on_its_workers_host_and_the_output_is_identical(corpus, reference, two_hosts, tmp_path):
    out = tmp_path / "out.h5"
    res = run(cmd(corpus, out, 2, "--scheduler", two_hosts.address))
    assert res.returncode == 0, res.stderr
    assert "writers on their workers' hosts: shard 0 on 127.0.0.2, shard 1 on 127.0.0.3" in res.stderr
    assert digest(out) == digest(reference)
    with h5py.File(out, "r") as f:
        recs = records(f)
    assert [r.host for r in recs] == list(HOSTS)
    for r in recs:
        assert os.path.getsize(out.parent / r.path) == r.bytes
    # Each host's worker decoded exactly its own shard's batches (15 + 3 batches in all).
    assert _decoded(two_hosts) == {f"w{k}": set(range(lo, hi)) for k, (lo, hi) in enumerate(ranges(18, 2))}
    deadline = time.monotonic() + 10
    while _writers() and time.monotonic() < deadline:
        time.sleep(0.1)
    assert not _writers()
    assert not list(tmp_path.glob("*.lock"))


def test_kill_9_of_a_remote_writer_stops_the_run_and_a_rerun_gives_the_same_output(corpus, reference, two_hosts,
                                                                                    tmp_path):
    out = tmp_path / "out.h5"
    proc = start(cmd(corpus, out, 2, "--scheduler", two_hosts.address, "--set", "policy.commit_every=0"))
    record = Path(shard_path(str(out), 1, 2) + fmt.PARTIAL_SUFFIX + ".commit.json")
    deadline = time.monotonic() + 60
    while not record.exists() and proc.poll() is None and time.monotonic() < deadline:
        time.sleep(0.002)
    victim = [p for p in _writers() if HOSTS[1] in p.info["cmdline"]]
    assert proc.poll() is None and len(victim) == 1, "the run ended before its writer could be killed"
    victim[0].send_signal(signal.SIGKILL)
    _, err = proc.communicate(timeout=120)
    assert proc.returncode == 1 and f"on host {HOSTS[1]} process died" in err, err
    assert not out.exists()
    res = run(cmd(corpus, out, 2, "--scheduler", two_hosts.address))
    assert res.returncode == 0, res.stderr
    assert "resuming" in res.stderr
    assert digest(out) == digest(reference)


def test_kill_9_of_the_driver_makes_each_remote_writer_commit_and_exit(corpus, reference, two_hosts, tmp_path):
    out = tmp_path / "out.h5"
    proc = start(cmd(corpus, out, 2, "--scheduler", two_hosts.address, "--set", "policy.commit_every=0"))
    records = [Path(shard_path(str(out), k, 2) + fmt.PARTIAL_SUFFIX + ".commit.json") for k in range(2)]
    deadline = time.monotonic() + 60
    while not all(r.exists() for r in records) and proc.poll() is None and time.monotonic() < deadline:
        time.sleep(0.002)
    assert proc.poll() is None, "the run ended before its driver could be killed"
    proc.send_signal(signal.SIGKILL)
    proc.communicate(timeout=30)
    deadline = time.monotonic() + 30  # the lifeline: each writer sees its connection close
    while _writers() and time.monotonic() < deadline:
        time.sleep(0.1)
    assert not _writers()
    res = run(cmd(corpus, out, 2, "--scheduler", two_hosts.address))
    assert res.returncode == 0, res.stderr
    assert "resuming" in res.stderr
    assert digest(out) == digest(reference)


def test_a_shard_whose_lock_another_writer_holds_is_refused_naming_it(corpus, two_hosts, tmp_path):
    out = tmp_path / "out.h5"
    lock = Path(shard_path(str(out), 1, 2) + ".lock")
    fd = os.open(lock, os.O_RDWR | os.O_CREAT)
    fcntl.flock(fd, fcntl.LOCK_EX)  # as a writer of an earlier run that is still committing
    try:
        res = run(cmd(corpus, out, 2, "--scheduler", two_hosts.address))
    finally:
        os.close(fd)
    assert res.returncode == 2 and f"{lock} is held by another writer of this shard" in res.stderr, res.stderr
    assert "(127.0.0.3)" in res.stderr
    deadline = time.monotonic() + 10
    while _writers() and time.monotonic() < deadline:
        time.sleep(0.1)
    assert not _writers()
