"""Worker failures on a real LocalCluster: a killed worker, a file that crashes its worker
every time, and a file whose decode hangs. Faults are injected into the real worker task
through ``H5BATCH_FAULTS`` (the worker really dies by SIGKILL, or really hangs)."""

from __future__ import annotations

import json
import re
import subprocess
from pathlib import Path

import h5py
import pytest

from h5batch import generate
from tests.conftest import REPO
from tests.support import run
from tests.support.cluster_helpers import orphaned_segments
from tests.support.h5compare import assert_same_h5

JOB = REPO / "jobs" / "paired_audio.yaml"


@pytest.fixture(scope="module")
def corpus(tmp_path_factory) -> Path:
    root = tmp_path_factory.mktemp("failures") / "corpus"
    generate.make_paired_audio(root, n_train=48, n_test=16, seconds=0.25, seed=5)
    return root


def convert(root: Path, out: Path, faults: str = "", *extra: str, workers: int | None = 2,
            env: dict[str, str] | None = None) -> subprocess.CompletedProcess:
    """``workers=None``: ``cluster.kind: auto`` decides (this corpus: in the driver)."""
    return run.convert(JOB, *extra, workers=workers, output=out, root=root, env_extra={"H5BATCH_FAULTS": faults, **(env or {})},
                       settings=("cluster.batch_size=8", "policy.retries=1", "policy.max_reject_fraction=0.2"),
                       timeout=400)


@pytest.fixture(scope="module")
def reference(corpus, tmp_path_factory) -> Path:
    out = tmp_path_factory.mktemp("ref") / "ref.h5"
    res = convert(corpus, out, workers=None)  # no fault, in the driver: the cluster is no part of the output
    assert res.returncode == 0, res.stderr
    return out


def sources(path: Path) -> list[str]:
    with h5py.File(path, "r") as f:
        return [p for s in ("train", "test") for p in f[s]["source"].asstr()[:, 0]]


def rejects(path: Path) -> list[dict]:
    return [json.loads(line) for line in Path(str(path).replace(".h5", ".rejects.jsonl")).read_text().splitlines()]


def test_killed_worker_batch_is_retried_and_output_is_complete(corpus, reference, tmp_path):
    out = tmp_path / "out.h5"
    marker = tmp_path / "killed-once"
    res = convert(corpus, out, f"kill_once=2:{marker}")
    assert res.returncode == 0, res.stderr
    assert marker.exists(), "the fault did not fire: no worker was killed"
    assert_same_h5(reference, out)  # every sample exactly once, same order, same bytes
    assert not orphaned_segments()


def test_file_that_crashes_its_worker_is_isolated_and_rejected(corpus, reference, tmp_path):
    out = tmp_path / "out.h5"
    # No retry of a dead batch before it is split (the killed-worker test above covers the
    # retry): each file takes 4 worker deaths (batches of 8, 4, 2, 1), not 8, each a restart.
    res = convert(corpus, out, "crash_on=5.wav", "--set", "policy.retries=0")
    assert res.returncode == 0, res.stderr
    got = sources(out)
    want = [p for p in sources(reference) if not p.endswith("/5.wav")]
    assert got == want  # only the two samples named 5.wav (train and test) are missing
    rej = [r for r in rejects(out) if r["path"].endswith("/5.wav")]
    # data/5.wav crashes; its paired label/5.wav goes with it, in both splits
    assert sorted(r["path"] for r in rej) == ["test/data/5.wav", "test/label/5.wav", "train/data/5.wav", "train/label/5.wav"]
    assert all(r["stage"] == "worker" and "worker failed while decoding" in r["reason"] for r in rej)
    assert not orphaned_segments()


def test_hanging_decode_is_bounded_by_timeout(corpus, reference, tmp_path):
    out = tmp_path / "out.h5"
    res = convert(corpus, out, "hang_on=7.wav", "--set", "policy.decode_timeout=2")
    assert res.returncode == 0, res.stderr
    got = sources(out)
    assert got == [p for p in sources(reference) if not p.endswith("/7.wav")]
    rej = {r["path"]: r for r in rejects(out)}
    assert rej["train/data/7.wav"]["stage"] == "timeout"
    assert "longer than 4 s" in rej["train/data/7.wav"]["reason"]  # 2 s per file x 2 files
    assert "restarting worker" in res.stderr


def test_a_frozen_worker_is_killed_and_its_batch_decoded_again(corpus, reference, tmp_path):
    """A worker process that stops running altogether (SIGSTOP: no heartbeat, and its own
    decode watch cannot run either) is killed by the driver after policy.frozen_worker_timeout
    (its nanny starts a new one), not left to Dask's 5-minute worker-ttl; its batch is
    decoded again and the output is the reference's."""
    out = tmp_path / "out.h5"
    marker = tmp_path / "frozen-once"
    events = tmp_path / "events.log"  # this run's kill, not the session's (tests/conftest.py)
    res = convert(corpus, out, f"freeze_once=3.wav:{marker}", "--set", "policy.frozen_worker_timeout=3",
                  env={"H5BATCH_EVENT_LOG": str(events)})
    assert res.returncode == 0, res.stderr
    assert marker.exists(), "the fault did not fire: no worker froze"
    assert re.search(r"worker tcp://\S+ has sent no heartbeat for \d+ s \(policy.frozen_worker_timeout 3 s\): "
                     r"killed it", res.stderr), res.stderr
    assert res.stderr.count("has sent no heartbeat") == 1, res.stderr  # the other worker was left alone
    logged = events.read_text().splitlines()
    assert len(logged) == 1 and logged[0].startswith(f"{out}: worker tcp://") and "killed it" in logged[0], logged
    assert_same_h5(reference, out)  # every sample exactly once, same order, same bytes
    assert not orphaned_segments()


def test_a_local_cluster_left_without_workers_stops_the_wait_instead_of_hanging(corpus):
    """A LocalCluster of the run that has no worker left (its nannies gone: here scaled to
    zero) would keep the tasks waiting forever; the driver's wait gives up after
    policy.no_worker_timeout with the error the CLI prints, and an event that arrives in time
    is returned as usual. Real cluster, real client; the driver object holds only what its
    wait reads."""
    import queue
    import time
    from types import SimpleNamespace

    from distributed import Client, LocalCluster

    from h5batch.config import load_job
    from h5batch.conversion.cluster import Connection
    from h5batch.conversion.driver import Driver
    from h5batch.errors import ConvertError

    job = load_job(JOB, [f"source.root={corpus}", "cluster.kind=local", "policy.no_worker_timeout=1"])
    with LocalCluster(n_workers=1, processes=False, threads_per_worker=1, dashboard_address=None) as cluster, \
            Client(cluster) as client:
        d = Driver.__new__(Driver)
        d.job, d.client, d.events, d.watch, d.say = job, client, queue.Queue(), None, print
        d.plan = SimpleNamespace(spec=SimpleNamespace(partial_path="out.h5.partial", final_path="out.h5", sync=None))
        conn = Connection(client, "LocalCluster", None, cluster)
        d.events.put(("future", 1))
        assert d._next_event(conn) == ("future", 1)  # with workers: the event, at once
        cluster.scale(0)
        deadline = time.monotonic() + 60
        while client.scheduler_info(n_workers=-1)["workers"]:
            assert time.monotonic() < deadline
            time.sleep(0.1)
        t0 = time.monotonic()
        with pytest.raises(ConvertError, match="every worker of the local Dask cluster is gone and none came back "
                                               "in 1 s .policy.no_worker_timeout") as e:
            d._next_event(conn)
        assert 1.0 <= time.monotonic() - t0 < 30
        assert "progress is committed in out.h5.partial; run the same command again to resume" in str(e.value)
        d.events.put(("writer", 2))  # an event within the limit still comes through
        assert d._next_event(conn) == ("writer", 2)


def test_a_part_whose_worker_died_after_it_finished_is_decoded_again_not_split(corpus):
    """A batch that ran to the end on a worker which then died (of the next task in its
    queue) before the result was fetched: none of its files took the worker down, so it is
    submitted again whole, never split towards blaming one of its files. Real LocalCluster
    worker process, real finished task, the worker killed by SIGKILL, the driver's own
    handler. (Before, such a file decoded just before the culprit, twice, was rejected in
    the culprit's place: test_file_that_crashes_its_worker_is_isolated_and_rejected failed
    1 run in 3.)"""
    import os
    import queue
    import signal
    import time

    from distributed import Client, LocalCluster

    from h5batch.config import load_job
    from h5batch.conversion.driver import Driver
    from h5batch.conversion.isolation import Slot
    from h5batch.conversion.plan import make_tasks
    from h5batch.layouts import discover
    from h5batch.transport.segments import new_run_id, remove_segments

    job = load_job(JOB, [f"source.root={corpus}", "cluster.kind=local", "cluster.batch_size=2"])
    run_id = new_run_id()
    task = make_tasks(job, discover(job), run_id, "")[0]
    assert len(task.items) == 2
    with LocalCluster(n_workers=1, processes=True, threads_per_worker=1, dashboard_address=None) as cluster, \
            Client(cluster) as client:
        try:
            d = Driver.__new__(Driver)
            d.client, d.events, d.run_id, d.submissions, d.futures = client, queue.Queue(), run_id, 0, {}
            d.slots = {0: Slot(task)}
            d._submit(0, 0, 2)
            kind, event = d.events.get(timeout=120)
            fut, fired_as = event
            assert (kind, fired_as) == ("future", "finished")
            (pid,) = client.run(os.getpid).values()
            os.kill(pid, signal.SIGKILL)  # the worker dies after the task finished, its result with it
            deadline = time.monotonic() + 60
            while fut.status == "finished":
                assert time.monotonic() < deadline, "the scheduler never noticed the worker's death"
                time.sleep(0.05)
            d._on_future(event)
            parts = d.slots[0].parts
            assert [(p.lo, p.hi, p.lost, p.confirming) for p in parts] == [(0, 2, 1, False)], parts
            assert list(d.futures.values()) == [(0, 0)]  # submitted again, whole
            kind, (again, fired_as) = d.events.get(timeout=120)  # the nanny's new worker decodes it
            assert fired_as == "finished" and again.result(timeout=60).n_samples == 2
        finally:
            remove_segments(run_id)
