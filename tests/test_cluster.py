"""Cluster mode against real processes on 127.0.0.1: an external `dask scheduler` with
`dask worker` processes (joined by --scheduler, --scheduler-file, cluster.address and
DASK_SCHEDULER_ADDRESS), forced network transport, a worker joining late, a worker killed
mid-run, TLS, pre-flight failures, LocalCluster binding, and `h5batch cluster-script`.
Every conversion must give the same file as a LocalCluster run of the same job."""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
import yaml

from h5batch import ConvertError, generate
from h5batch.config import ClusterConfig, ConfigError, load_job
from h5batch.conversion.cluster import connect, job_script, security_kwargs
from h5batch.conversion.plan import make_tasks
from h5batch.conversion.preflight import compare_versions, needed_packages
from h5batch.conversion.worker import decode_batch
from h5batch.layouts import discover
from h5batch.transport.segments import hostname, new_run_id, remove_segments
from tests.support.cluster_helpers import (
    DaskProcesses,
    TLSFiles,
    assert_same_h5,
    clean_env,
    convert,
    h5batch_cmd,
    listening_addresses,
    orphaned_segments,
    run_h5batch,
    stored_job,
    summary_seconds,
    write_job,
)

# ---------------------------------------------------------------------------
# Fixtures
# ---------------------------------------------------------------------------


@pytest.fixture(autouse=True)
def no_leaked_segments():
    """Overrides conftest's check, which counts every new segment on the machine: here
    only segments whose driver has exited are leaks (other sessions may be converting)."""
    before = orphaned_segments()
    yield
    leaked = orphaned_segments() - before
    assert not leaked, f"shared-memory segments leaked: {sorted(leaked)}"


@pytest.fixture(scope="module")
def work(tmp_path_factory) -> Path:
    return tmp_path_factory.mktemp("cluster")


@pytest.fixture(scope="module")
def corpus(work) -> Path:
    root = work / "paired"
    generate.make_paired_audio(root, n_train=60, n_test=20)
    return root


@pytest.fixture(scope="module")
def reference(work, corpus) -> Path:
    """The LocalCluster output every other run must reproduce."""
    out = work / "ref" / "local.h5"
    convert(write_job(work, corpus, out, name="ref", workers=2))
    return out


@pytest.fixture(scope="module")
def big_corpus(work) -> Path:
    """Large enough (440 pairs, 110 batches of 4) that a run is still going after a worker
    process has started or been killed."""
    root = work / "big"
    generate.make_paired_audio(root, n_train=400, n_test=40)
    return root


@pytest.fixture(scope="module")
def big_reference(work, big_corpus) -> tuple[Path, float]:
    out = work / "ref" / "big.h5"
    res, wall = convert(write_job(work, big_corpus, out, name="bigref", workers=2, batch_size=4))
    return out, summary_seconds(res.stderr)


@pytest.fixture(scope="module")
def dask_cluster(work):
    """A scheduler and two workers started from another working directory than the tests'
    (so a relative corpus root does not resolve there)."""
    wcwd = work / "worker-cwd"
    wcwd.mkdir()
    d = DaskProcesses(work / "dask")
    d.start_scheduler()
    d.start_worker("w1", cwd=wcwd)
    d.start_worker("w2", cwd=wcwd)
    d.wait_workers(2)
    yield d
    d.close()


# ---------------------------------------------------------------------------
# External scheduler
# ---------------------------------------------------------------------------


@pytest.mark.parametrize("how", ["--scheduler", "--scheduler-file", "cluster.address", "DASK_SCHEDULER_ADDRESS"])
def test_external_scheduler_gives_the_local_file(how, dask_cluster, corpus, reference, tmp_path):
    out = tmp_path / "out.h5"
    extra: list[str] = []
    env = clean_env()
    cluster: dict = {}
    if how == "--scheduler":
        extra = ["--scheduler", dask_cluster.address]
    elif how == "--scheduler-file":
        extra = ["--scheduler-file", str(dask_cluster.scheduler_file)]
    elif how == "cluster.address":
        cluster = {"kind": "address", "address": dask_cluster.address}
    else:
        env["DASK_SCHEDULER_ADDRESS"] = dask_cluster.address
    res, _ = convert(write_job(tmp_path, corpus, out, **cluster), *extra, env=env)
    assert f"decoding on scheduler {dask_cluster.address}, 2 workers" in res.stderr
    assert "preflight: 2 workers on 1 host(s)" in res.stderr and "transport shm on 2" in res.stderr
    assert_same_h5(reference, out)


def test_forced_network_transport_gives_the_same_file(dask_cluster, corpus, reference, tmp_path):
    out = tmp_path / "out.h5"
    res, _ = convert(write_job(tmp_path, corpus, out, transport="network"), "--scheduler", dask_cluster.address)
    assert "transport network on 2" in res.stderr
    assert_same_h5(reference, out)


def test_auto_transport_follows_the_writer_host(dask_cluster, corpus, tmp_path):
    """A worker on the writer's host hands over shared memory; told the writer is on
    another host, the same worker sends the bytes through Dask."""
    job = load_job(write_job(tmp_path, corpus, tmp_path / "x.h5"))
    manifest = discover(job)
    run_id = new_run_id()
    client = dask_cluster.client
    try:
        here = make_tasks(job, manifest, run_id, hostname())[0]
        there = make_tasks(job, manifest, run_id, "some-other-host")[0]
        local = client.submit(decode_batch, here, pure=False).result()
        remote = client.submit(decode_batch, there, pure=False).result()
        assert local.packed.shm_name is not None and local.packed.payload is None
        assert remote.packed.shm_name is None and remote.packed.payload is not None
        assert remote.packed.nbytes == local.packed.nbytes
        assert (remote.checksums == local.checksums).all()
    finally:
        remove_segments(run_id)


def test_throughput_external_scheduler_vs_local_cluster(dask_cluster, big_corpus, big_reference, tmp_path):
    """Same corpus, same 2 single-threaded workers: the external scheduler run skips
    LocalCluster start-up; print both for the record."""
    ref, local_s = big_reference
    out = tmp_path / "big.h5"
    res, _ = convert(write_job(tmp_path, big_corpus, out, batch_size=4), "--scheduler", dask_cluster.address)
    ext_s = summary_seconds(res.stderr)
    assert_same_h5(ref, out)
    print(f"\n[cluster] 440 pairs, batch 4: LocalCluster {local_s:.2f}s ({440 / local_s:.0f} pairs/s), "
          f"external scheduler {ext_s:.2f}s ({440 / ext_s:.0f} pairs/s), ratio ext/local throughput "
          f"{local_s / ext_s:.2f}")


def _wait_for(cond, timeout: float, what: str, proc: subprocess.Popen | None = None) -> None:
    deadline = time.monotonic() + timeout
    while not cond():
        if proc is not None and proc.poll() is not None:
            out, err = proc.communicate()
            raise AssertionError(f"conversion ended before {what}:\n{err}")
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out waiting for {what}")
        time.sleep(0.05)


@contextlib.contextmanager
def _converting(job: Path, address: str) -> Iterator[subprocess.Popen]:
    """A running ``h5batch convert --scheduler address``, killed on the way out if still running."""
    proc = subprocess.Popen(h5batch_cmd("convert", str(job), "--overwrite", "--progress", "none", "-v",
                                        "--scheduler", address),
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=clean_env())
    try:
        yield proc
    finally:
        if proc.poll() is None:
            proc.kill()


def test_worker_joining_late_takes_work_and_file_is_identical(big_corpus, big_reference, tmp_path):
    ref, _ = big_reference
    out = tmp_path / "out.h5"
    with DaskProcesses(tmp_path / "dask") as d:
        d.start_scheduler()
        d.start_worker("early")
        d.wait_workers(1)
        with _converting(write_job(tmp_path, big_corpus, out, batch_size=4), d.address) as proc:
            _wait_for(lambda: d.executed().get("early", 0) >= 2, 60, "the first batches", proc)
            d.start_worker("late")
            _, err = proc.communicate(timeout=300)
        assert proc.returncode == 0, err
        assert "preflight: 1 workers" in err
        done = d.executed()
        assert done.get("late", 0) > 0, f"the late worker did no work: {done}"
    assert_same_h5(ref, out)


def test_worker_killed_mid_run_file_is_identical(big_corpus, big_reference, tmp_path):
    ref, _ = big_reference
    out = tmp_path / "out.h5"
    with DaskProcesses(tmp_path / "dask") as d:
        d.start_scheduler()
        d.start_worker("victim")
        d.start_worker("survivor")
        d.wait_workers(2)
        with _converting(write_job(tmp_path, big_corpus, out, batch_size=4), d.address) as proc:
            _wait_for(lambda: d.executed().get("victim", 0) >= 3, 60, "the victim's first batches", proc)
            before = d.executed()
            assert proc.poll() is None and not out.exists(), "the run finished before the kill"
            d.kill_worker("victim")
            _, err = proc.communicate(timeout=300)
        assert proc.returncode == 0, err
        assert sum(before.values()) < 110, f"killed after all 110 batches: {before}"
        assert d.executed()["survivor"] > before["survivor"]
    assert_same_h5(ref, out)


# ---------------------------------------------------------------------------
# Pre-flight
# ---------------------------------------------------------------------------


def test_preflight_reports_a_corpus_workers_cannot_see(dask_cluster, corpus, tmp_path):
    """A relative source.root resolves on the driver (cwd = corpus parent) but not on the
    workers (started elsewhere): a clear error before any batch runs, exit code 2."""
    out = tmp_path / "out.h5"
    job = write_job(tmp_path, corpus.name, out)
    res = run_h5batch("convert", str(job), "--scheduler", dask_cluster.address, "--progress", "none",
                      cwd=corpus.parent)
    assert res.returncode == 2, res.stderr
    assert "pre-flight checks failed (2 of 2 workers)" in res.stderr
    assert "is not a directory there" in res.stderr and "is relative" in res.stderr
    assert "use an absolute path" in res.stderr
    assert not out.exists()


def test_version_comparison_errors_and_warnings():
    driver = {"python": "3.11.7", "h5batch": "0.1.0 (src a)", "numpy": "2.4.6", "soundfile": "0.14.0",
              "libsndfile": "1.2.2", "pillow": "13.0.0", "dask": "2026.8.0"}
    same = {"host": "n1", "versions": dict(driver), "import_errors": {}}
    other = {"host": "n2", "import_errors": {"pillow": "ModuleNotFoundError: No module named 'PIL'"},
             "versions": dict(driver, numpy="1.26.4", python="3.11.9", dask="2026.9.0", h5batch="0.1.0 (src b)")}
    del other["versions"]["pillow"]
    need = {"python", "h5batch", "numpy", "soundfile", "libsndfile"}  # an audio-only job
    errors, warnings = compare_versions(driver, {"tcp://a:1": same, "tcp://b:1": other}, need)
    assert len(errors) == 2 and all(e.startswith("tcp://b:1 (n2): ") for e in errors)
    assert any("numpy 1.26.4 differs from the driver's 2.4.6" in e for e in errors)
    assert any("h5batch 0.1.0 (src b) differs" in e for e in errors)
    assert sorted(w.split(": ", 1)[1] for w in warnings) == ["dask 2026.9.0 vs driver 2026.8.0",
                                                            "python 3.11.9 vs driver 3.11.7"]
    errors, _ = compare_versions(driver, {"tcp://b:1": other}, need | {"pillow"})
    assert any("cannot import pillow" in e for e in errors)


def test_needed_packages_follow_the_fields(corpus, tmp_path):
    job = load_job(write_job(tmp_path, corpus, tmp_path / "x.h5"))
    assert needed_packages(job) == {"python", "h5batch", "numpy", "soundfile", "libsndfile"}


def test_no_workers_is_a_clear_timeout():
    from distributed import LocalCluster

    with LocalCluster(n_workers=0, host="127.0.0.1", protocol="tcp://", dashboard_address=None,
                      processes=False) as lc:
        cfg = ClusterConfig(kind="address", address=lc.scheduler_address)
        with pytest.raises(ConvertError, match=r"only 0 of 1 Dask workers arrived within 1s"):
            with connect(cfg, wait_timeout=1):
                pass


# ---------------------------------------------------------------------------
# Security
# ---------------------------------------------------------------------------


@pytest.fixture(scope="module")
def tls(work) -> TLSFiles:
    return TLSFiles(work / "tls")


def _assert_no_secrets(text: str, tls: TLSFiles) -> None:
    for p in (tls.ca, tls.cert, tls.key):
        assert str(p) not in text and p.name not in text


def test_tls_external_scheduler(tls, corpus, reference, tmp_path):
    out = tmp_path / "out.h5"
    with DaskProcesses(tmp_path / "dask", tls=tls) as d:
        address = d.start_scheduler()
        assert address.startswith("tls://127.0.0.1:")
        d.start_worker("w1")
        d.start_worker("w2")
        d.wait_workers(2)
        # without cluster.security the scheduler refuses us, with a clear message
        plain = write_job(tmp_path, corpus, tmp_path / "plain.h5", name="plain")
        res = run_h5batch("convert", str(plain), "--scheduler", address,
                          "--progress", "none")
        assert res.returncode == 2 and "cannot reach the Dask scheduler" in res.stderr, res.stderr
        res, _ = convert(write_job(tmp_path, corpus, out, security=tls.security()), "--scheduler", address)
    assert "(TLS)" in res.stderr
    _assert_no_secrets(res.stdout + res.stderr, tls)
    assert_same_h5(reference, out)
    stored = stored_job(out)["cluster"]["security"]
    assert stored == {k: "<redacted>" for k in tls.security()}
    _assert_no_secrets(out.read_bytes().decode("latin-1"), tls)


def test_tls_local_cluster(tls, corpus, reference, tmp_path):
    out = tmp_path / "out.h5"
    res, _ = convert(write_job(tmp_path, corpus, out, kind="local", workers=2, security=tls.security()))
    assert "LocalCluster, 2 worker processes x 1 thread on 127.0.0.1 (TLS)" in res.stderr
    _assert_no_secrets(res.stdout + res.stderr, tls)
    assert_same_h5(reference, out)


def test_security_keys_are_checked_without_showing_values(tmp_path):
    with pytest.raises(ConfigError, match=r"cluster\.security\.tls_cert: unknown key"):
        security_kwargs(ClusterConfig(security={"tls_cert": "x"}))
    secret = str(tmp_path / "no-such-secret.pem")
    with pytest.raises(ConfigError, match=r"cluster\.security\.tls_ca_file: file not found") as e:
        security_kwargs(ClusterConfig(security={"tls_ca_file": secret}))
    assert "no-such-secret" not in str(e.value)
    filled = security_kwargs(ClusterConfig(security={"tls_ca_file": "-\n", "tls_client_cert": "a\n",
                                                     "tls_client_key": "b\n"}), own_cluster=True)
    assert filled["tls_worker_cert"] == filled["tls_scheduler_cert"] == "a\n"


def test_local_cluster_and_dashboard_bind_to_loopback():
    import psutil

    with connect(ClusterConfig(kind="local", workers=2)) as conn:
        assert conn.dashboard and conn.dashboard.startswith("http://127.0.0.1:")
        me = psutil.Process()
        pids = {me.pid} | {p.pid for p in me.children(recursive=True)}
        worker_pids = set(conn.client.run(os.getpid).values())
        assert worker_pids <= pids
        listening = listening_addresses(pids)
    assert {pid for pid, _, _ in listening} >= worker_pids  # workers do listen ...
    assert all(ip == "127.0.0.1" for _, ip, _ in listening), listening  # ... on loopback only


def test_a_nanny_whose_worker_is_slow_to_come_back_is_kept():
    """A worker killed (crash isolation) whose restart outlasts Dask's lost-worker timeout
    comes back: the run's LocalCluster does not close its nanny (cluster.LOST_WORKER_TIMEOUT).
    Dask's default is shortened to 1 s here; the restarted worker is held stopped for 4 s."""
    import dask

    with dask.config.set({"distributed.deploy.lost-worker-timeout": "1s"}):
        with connect(ClusterConfig(kind="local", workers=1)) as conn:
            (nanny,) = conn.cluster.workers.values()
            old = nanny.process.pid
            os.kill(old, signal.SIGKILL)
            deadline = time.monotonic() + 30
            while (nanny.process is None or nanny.process.pid in (None, old)) and time.monotonic() < deadline:
                time.sleep(0.005)
            new = nanny.process.pid
            os.kill(new, signal.SIGSTOP)  # still importing: not registered yet
            try:
                time.sleep(4)
                assert list(conn.cluster.workers.values()) == [nanny] and nanny.status.name == "running"
            finally:
                os.kill(new, signal.SIGCONT)
            conn.client.wait_for_workers(1, timeout=60)
            assert list(conn.client.run(os.getpid).values()) == [new]
        assert dask.config.get("distributed.deploy.lost-worker-timeout") == "1s"  # put back


# ---------------------------------------------------------------------------
# cluster-script
# ---------------------------------------------------------------------------


def _jobqueue_job(tmp_path: Path, kind: str, **extra) -> Path:
    jq = {"cores": 2, "memory": "3GB", "walltime": "01:30:00", "queue": "gpu", "jobs": 4,
          "log_directory": str(tmp_path / "logs"), **extra}
    return write_job(tmp_path, tmp_path / "nowhere", tmp_path / "x.h5", kind=kind, jobqueue=jq)


def test_cluster_script_slurm(tmp_path):
    res = run_h5batch("cluster-script", str(_jobqueue_job(tmp_path, "slurm")))
    assert res.returncode == 0, res.stderr
    script = res.stdout
    lines = script.splitlines()
    assert lines[0] == "#!/usr/bin/env bash"
    for want in ("#SBATCH --cpus-per-task=2", "#SBATCH --mem=3G", "#SBATCH -t 01:30:00", "#SBATCH -p gpu",
                 "#SBATCH -n 1", "#SBATCH -J h5batch-worker", f"#SBATCH -o {tmp_path}/logs/h5batch-worker-%J.out"):
        assert want in lines, f"{want!r} missing from:\n{script}"
    worker = lines[-1]
    # two single-threaded worker processes for two cores
    assert "distributed.cli.dask_worker" in worker and "--nworkers 2" in worker and "--nthreads 1" in worker
    subprocess.run(["bash", "-n"], input=script, text=True, check=True)  # valid shell
    # --set reaches the script
    res = run_h5batch("cluster-script", str(_jobqueue_job(tmp_path, "slurm")), "--set",
                      "cluster.jobqueue.queue=debug", "--set", "cluster.jobqueue.interface=lo")
    assert "#SBATCH -p debug" in res.stdout and "--interface lo" in res.stdout


def test_cluster_script_other_kinds_and_errors(tmp_path, tls):
    res = run_h5batch("cluster-script", str(_jobqueue_job(tmp_path, "pbs")))
    assert res.returncode == 0 and "#PBS -l walltime=01:30:00" in res.stdout and "#PBS -q gpu" in res.stdout
    res = run_h5batch("cluster-script", str(_jobqueue_job(tmp_path, "slurm", bogus=1)))
    assert res.returncode == 2 and "cluster.jobqueue: rejected by dask-jobqueue" in res.stderr
    res = run_h5batch("cluster-script", str(write_job(tmp_path, tmp_path, tmp_path / "x.h5")))
    assert res.returncode == 2 and "a job script exists only for slurm" in res.stderr
    # TLS: the worker command carries the certificate options and the tls:// protocol
    data = yaml.safe_load(_jobqueue_job(tmp_path, "slurm").read_text())
    data["cluster"]["security"] = tls.security()
    cfg = ClusterConfig(**{**data["cluster"]})
    script = job_script(cfg)
    assert "--protocol tls://" in script and "--tls-ca-file" in script and "tls://SCHEDULER-ADDRESS" in script


def test_measure_writer_script_runs_as_documented(corpus, tmp_path):
    """docs/cluster.md's stage table comes from tests/cluster/measure_writer.py: it must run."""
    import json
    import sys

    script = Path(__file__).resolve().parent / "cluster" / "measure_writer.py"
    res = subprocess.run([sys.executable, str(script), "--job", "jobs/paired_audio.yaml", "--set",
                          f"source.root={corpus}", "--json"], capture_output=True, text=True, timeout=300,
                         cwd=Path(__file__).resolve().parents[1])
    assert res.returncode == 0, res.stderr
    out = json.loads(res.stdout)
    assert set(out["stages"]) == {"decode only", "decode + pack to shm", "writer alone",
                                  "full convert (incl. LocalCluster start)"}
    job = load_job(Path(__file__).resolve().parents[1] / "jobs" / "paired_audio.yaml", [f"source.root={corpus}"])
    assert out["samples"] == len(discover(job).items)
    assert all(s["samples_per_s"] > 0 for s in out["stages"].values())
