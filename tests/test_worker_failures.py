"""Worker failures in real conversions, through the command line: a killed worker, a file
that crashes its worker every time, a file whose decode hangs, a frozen worker, a cluster
whose workers all die for good (on ``cluster.kind: local``, a Dask LocalCluster), and a
user transform that kills its decoder with a real SIGSEGV or hangs it (on the default
engine and on a LocalCluster). Faults are injected into the real processes through
``H5BATCH_FAULTS`` (the worker really dies by SIGKILL, or really hangs), a transform module
or a ``sitecustomize`` on ``PYTHONPATH``; what is checked is what a user sees: the exit code,
the message, the rejects list and the output's content."""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
from pathlib import Path

import h5py
import numpy as np
import psutil
import pytest
import soundfile as sf

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


SETTINGS = ("cluster.batch_size=8", "policy.retries=1", "policy.max_reject_fraction=0.2")


def convert(root: Path, out: Path, faults: str = "", *extra: str, workers: int | None = 2,
            env: dict[str, str] | None = None) -> subprocess.CompletedProcess:
    """``workers=2``: a LocalCluster of 2 workers; ``workers=None``: the job's own engine."""
    local = ("cluster.kind=local",) if workers else ()
    return run.convert(JOB, *extra, workers=workers, output=out, root=root, env_extra={"H5BATCH_FAULTS": faults, **(env or {})},
                       settings=(*SETTINGS, *local), timeout=400)


@pytest.fixture(scope="module")
def reference(corpus, tmp_path_factory) -> Path:
    out = tmp_path_factory.mktemp("ref") / "ref.h5"
    res = convert(corpus, out, workers=None)  # no fault, the default engine: the engine is no part of the output
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


@pytest.mark.parametrize("batch", [8, 2])
def test_file_that_crashes_its_worker_is_isolated_and_rejected(batch, corpus, reference, tmp_path):
    """Only the crashing file's pairs are rejected, never a file decoded beside it. Batches
    of 2: a worker often dies holding the finished result of the batch before (not fetched
    yet); that batch is decoded again whole, not split towards blaming one of its files
    (before, such a file, decoded twice, was rejected in the culprit's place 1 run in 3)."""
    out = tmp_path / "out.h5"
    # No retry of a dead batch before it is split (the killed-worker test above covers the
    # retry): each file takes 4 worker deaths (batches of 8, 4, 2, 1), not 8, each a restart.
    res = convert(corpus, out, "crash_on=5.wav", "--set", "policy.retries=0", "--set", f"cluster.batch_size={batch}")
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


def _pythonpath(*dirs: Path) -> str:
    return os.pathsep.join([*map(str, dirs), *filter(None, [os.environ.get("PYTHONPATH")])])


# Started by multiprocessing's spawn (a Dask nanny's worker process) while the file named by
# H5BATCH_TEST_NO_WORKER exists: exit at once, so no worker ever comes back.
SITECUSTOMIZE = """
import os, sys
_marker = os.environ.get("H5BATCH_TEST_NO_WORKER")
if _marker and os.path.exists(_marker) and "spawn_main" in " ".join(getattr(sys, "orig_argv", ())):
    os._exit(3)
"""


def test_a_local_cluster_left_without_workers_stops_the_run_instead_of_hanging(corpus, reference, tmp_path):
    """Every worker of the run's LocalCluster dies (kill -9) and none can start again: the run
    stops after policy.no_worker_timeout with the message, its progress committed, instead
    of waiting for ever; the same command then resumes to the uninterrupted file."""
    hook = tmp_path / "hook"
    hook.mkdir()
    (hook / "sitecustomize.py").write_text(SITECUSTOMIZE)
    marker, out = tmp_path / "no-more-workers", tmp_path / "out.h5"
    # 7.wav hangs its worker: the run is surely still decoding when its workers are killed.
    cmd = run.convert_cmd(JOB, "-v", workers=2, output=out, root=corpus,
                          settings=(*SETTINGS, "cluster.kind=local", "policy.decode_timeout=60",
                                    "policy.no_worker_timeout=2"))
    proc = run.start(cmd, {"PYTHONPATH": _pythonpath(hook), "H5BATCH_TEST_NO_WORKER": str(marker),
                           "H5BATCH_FAULTS": "hang_on=7.wav"}, new_session=True)
    try:
        err = ""
        while "codec auto:" not in err:  # (-v) the cluster is up, the plan made, decoding has begun
            line = proc.stderr.readline()
            assert line, f"the run ended before decoding:\n{err}"
            err += line
        marker.touch()
        workers = [c for c in psutil.Process(proc.pid).children(recursive=True)
                   if "spawn_main" in " ".join(c.cmdline())]
        assert len(workers) == 2, [c.cmdline() for c in workers]
        for w in workers:
            w.kill()
        _, rest = proc.communicate(timeout=120)
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.communicate()
    err += rest
    assert proc.returncode == 1, f"exit code {proc.returncode}:\n{err}"
    assert re.search(r"every worker of the local Dask cluster is gone and none came back in 2 s "
                     r"\(policy.no_worker_timeout", err), err
    assert f"progress is committed in {out}.partial; run the same command again to resume" in err, err
    res = convert(corpus, out)  # workers start again: the rerun resumes
    assert res.returncode == 0, res.stderr
    assert_same_h5(reference, out)
    assert not orphaned_segments()


# User transforms (docs/jobs.md, "Transforms and features"): one kills its process with a
# real SIGSEGV on the one file of SEGV_FRAMES frames, the other hangs on the one of HANG_FRAMES.
SEGV_FRAMES, HANG_FRAMES = 4321, 4322
TRANSFORM = f"""
import os, signal, time

def segfault(x):
    if x.shape[0] == {SEGV_FRAMES}:
        os.kill(os.getpid(), signal.SIGSEGV)
    return x

def hang(x):
    if x.shape[0] == {HANG_FRAMES}:
        time.sleep(3600)
    return x
"""
SEGV_FILE, HANG_FILE = "train/data/0.wav", "train/data/3.wav"  # 0: item 0, always in codec auto's trial


@pytest.fixture(scope="module")
def marked(tmp_path_factory) -> tuple[Path, Path]:
    """A corpus whose SEGV_FILE and HANG_FILE have the lengths the transform acts on, and
    the folder of the transform's module."""
    base = tmp_path_factory.mktemp("marked")
    root = base / "corpus"
    generate.make_paired_audio(root, n_train=24, n_test=8, seconds=0.25, seed=5)
    rng = np.random.default_rng(0)
    for rel, frames in ((SEGV_FILE, SEGV_FRAMES), (HANG_FILE, HANG_FRAMES)):
        sf.write(root / rel, (rng.standard_normal(frames) * 3000).astype(np.int16), 16000, subtype="PCM_16")
    hooks = base / "hooks"
    hooks.mkdir()
    (hooks / "h5batch_test_transform.py").write_text(TRANSFORM)
    return root, hooks


# engine -> settings; codec -> settings (auto: the job as shipped, a trial decodes files in
# the driver first; none with a numeric batch size: no trial, the engine alone decodes)
ENGINES = {"default engine": (), "LocalCluster": ("cluster.kind=local", "cluster.workers=2")}
CODECS = {"codec auto": (), "codec none": ("output.codec=none", "cluster.batch_size=8")}


def _convert_marked(marked, out: Path, transform: str, *settings: str) -> subprocess.CompletedProcess:
    root, hooks = marked
    return run.convert(JOB, output=out, root=root, timeout=400, env_extra={"PYTHONPATH": _pythonpath(hooks)},
                       settings=(f"fields.data.transform=h5batch_test_transform:{transform}",
                                 "policy.decode_timeout=2", "policy.retries=0", "policy.max_reject_fraction=0.2",
                                 *settings))


def _assert_only_rejected(out: Path, root: Path, victim: str) -> list[dict]:
    """The victim's pair is rejected, with a reason; every other pair is in the output."""
    rej = rejects(out)
    pair = {victim, victim.replace("/data/", "/label/")}
    assert {r["path"] for r in rej} == pair, rej
    assert all(r["reason"] for r in rej), rej
    want = {str(p.relative_to(root)) for p in root.glob("*/data/*.wav")} - {victim}
    assert sorted(sources(out)) == sorted(want)
    return rej


@pytest.mark.parametrize("codec", list(CODECS))
@pytest.mark.parametrize("engine", list(ENGINES))
def test_a_transform_that_segfaults_its_decoder_rejects_that_file_only(engine, codec, marked, tmp_path):
    out = tmp_path / "out.h5"
    res = _convert_marked(marked, out, "segfault", *ENGINES[engine], *CODECS[codec])
    assert res.returncode == 0, f"{engine}, {codec}: exit code {res.returncode}:\n{res.stderr}"
    _assert_only_rejected(out, marked[0], SEGV_FILE)
    assert not orphaned_segments()


@pytest.mark.parametrize("engine", list(ENGINES))
def test_a_transform_that_hangs_its_decoder_rejects_that_file_after_the_timeout(engine, marked, tmp_path):
    out = tmp_path / "out.h5"
    res = _convert_marked(marked, out, "hang", *ENGINES[engine])
    assert res.returncode == 0, f"{engine}: exit code {res.returncode}:\n{res.stderr}"
    rej = _assert_only_rejected(out, marked[0], HANG_FILE)
    assert all(r["stage"] == "timeout" for r in rej), rej
    assert not orphaned_segments()
