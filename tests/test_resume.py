"""Crash safety: kill -9 at several points, then resume to an identical file (the other
faults, Ctrl-C and SIGTERM among them, are cases of tests/test_fault_matrix.py).

Every run is a real ``h5batch convert`` subprocess in its own process group, killed with
real signals. ``H5BATCH_FAULTS=pause_at=...`` makes the writer stop at a named point (after the
N-th commit, in the middle of finalize) so the kill lands exactly there.
"""

from __future__ import annotations

import os
import signal
import subprocess
import time
from pathlib import Path

import h5py
import pytest

from h5batch import generate
from tests.conftest import REPO
from tests.support.h5compare import assert_same_h5
from tests.support.processes import group_members, holder_of, wait_for
from tests.support.run import convert_cmd, own_stale_segments, run
from tests.support.run import start as start_process

JOB = REPO / "jobs" / "paired_audio.yaml"


@pytest.fixture(scope="module")
def corpus(tmp_path_factory) -> Path:
    root = tmp_path_factory.mktemp("resume") / "corpus"
    generate.make_paired_audio(root, n_train=160, n_test=40, seconds=0.5, seed=3)
    return root


def cmd(root: Path, out: Path, *extra: str, workers: int | None = 2) -> list[str]:
    """``workers=None``: ``cluster.kind: auto`` decides (this corpus: in the driver, no
    LocalCluster to start); the cluster is no part of the output nor of the job's hash."""
    return convert_cmd(JOB, *extra, workers=workers, output=out, root=root,
                       settings=("cluster.batch_size=4", "policy.commit_every=0", "output.chunk_bytes=16384"))


def start(args: list[str], env_extra: dict[str, str] | None = None) -> subprocess.Popen:
    """In a process group of its own, so that a signal reaches the whole run."""
    return start_process(args, env_extra, new_session=True)


def kill_group(proc: subprocess.Popen, sig: int = signal.SIGKILL) -> None:
    try:
        os.killpg(proc.pid, sig)
    except ProcessLookupError:
        pass
    proc.wait(timeout=60)


def reap_group(pgid: int) -> None:
    """Kill what is left of a process group (e.g. orphaned Dask workers of a killed driver)."""
    try:
        os.killpg(pgid, signal.SIGKILL)
    except ProcessLookupError:
        pass


@pytest.fixture(scope="module")
def reference(corpus, tmp_path_factory) -> Path:
    """The uninterrupted run, decoded in the driver: every resumed run on its LocalCluster
    below must give this file."""
    out = tmp_path_factory.mktemp("ref") / "ref.h5"
    res = run(cmd(corpus, out, workers=None))
    assert res.returncode == 0, res.stderr
    return out


def committed_batches(out: Path) -> int:
    import json

    return json.loads(Path(str(out) + ".partial.commit.json").read_text())["next_batch"]


@pytest.mark.parametrize("point", ["commit:2", "commit:25", "finalize"])
def test_kill_9_process_group_then_resume_is_identical(corpus, reference, tmp_path, point):
    out = tmp_path / "out.h5"
    marker = Path(str(out) + ".partial.paused")
    proc = start(cmd(corpus, out), {"H5BATCH_FAULTS": f"pause_at={point}"})
    wait_for(marker, proc)
    kill_group(proc)
    marker.unlink()
    assert not out.exists() and Path(str(out) + ".partial").exists()
    done_before = committed_batches(out)
    assert done_before >= (2 if point == "commit:2" else 25)

    # --overwrite is about a finished output: the interrupted run is resumed all the same, and says so
    res = run(cmd(corpus, out, *(["--overwrite"] if point == "commit:25" else [])))
    assert res.returncode == 0, res.stderr
    assert f"{done_before} of 50 batches already committed" in res.stderr
    assert ("is resumed first, not redone (--restart redoes it)" in res.stderr) == (point == "commit:25"), res.stderr
    assert_same_h5(reference, out)
    assert not Path(str(out) + ".partial").exists()
    assert not own_stale_segments(), "stale shared-memory segments survived the resumed run"


def test_resume_with_another_batch_size_cuts_the_same_batches(corpus, reference, tmp_path):
    """Progress is recorded in batches, so the rest of the run keeps the interrupted run's
    batch size whatever the job says now (cluster settings are not part of the job hash)."""
    out = tmp_path / "out.h5"
    marker = Path(str(out) + ".partial.paused")
    proc = start(cmd(corpus, out), {"H5BATCH_FAULTS": "pause_at=commit:5"})
    wait_for(marker, proc)
    kill_group(proc)
    marker.unlink()
    done_before = committed_batches(out)
    res = run(cmd(corpus, out, "--set", "cluster.batch_size=7"))
    assert res.returncode == 0, res.stderr
    assert "resuming with the interrupted run's batch size (4 items, not 7)" in res.stderr
    assert f"{done_before} of 50 batches already committed" in res.stderr
    assert_same_h5(reference, out)


def test_kill_9_driver_only_writer_commits_and_exits(corpus, reference, tmp_path):
    out = tmp_path / "out.h5"
    # One file hangs its worker, so the run is surely still going when the driver dies.
    proc = start(cmd(corpus, out), {"H5BATCH_FAULTS": "hang_on=150.wav"})
    wait_for(Path(str(out) + ".partial.commit.json"), proc)
    time.sleep(0.5)
    assert holder_of(Path(str(out) + ".partial")), "the writer should still be writing"
    os.kill(proc.pid, signal.SIGKILL)
    proc.wait(timeout=30)
    # The orphaned writer notices, commits and exits on its own within a few seconds, and
    # so does the fork server it came from (each kept the other alive once).
    deadline = time.monotonic() + 20
    while (holder_of(Path(str(out) + ".partial")) or _fork_servers(proc.pid)) and time.monotonic() < deadline:
        time.sleep(0.2)
    assert not holder_of(Path(str(out) + ".partial")), "orphaned writer did not exit"
    assert not _fork_servers(proc.pid), "the killed driver's fork server did not exit"
    reap_group(proc.pid)
    res = run(cmd(corpus, out))
    assert res.returncode == 0, res.stderr
    assert_same_h5(reference, out)


def test_changed_job_is_refused_unless_restart(corpus, reference, tmp_path):
    out = tmp_path / "out.h5"
    proc = start(cmd(corpus, out), {"H5BATCH_FAULTS": "pause_at=commit:3"})
    wait_for(Path(str(out) + ".partial.paused"), proc)
    kill_group(proc)
    Path(str(out) + ".partial.paused").unlink()
    res = run(cmd(corpus, out, "--set", "output.codec=gzip"))
    assert res.returncode == 2
    assert "different job file" in res.stderr and "--restart" in res.stderr
    res = run(cmd(corpus, out, "--set", "output.codec=gzip", "--restart"))
    assert res.returncode == 0, res.stderr
    with h5py.File(out, "r") as f:
        assert "gzip" in f["train/data"].attrs["codec"]


def test_untrustworthy_partial_is_restarted(corpus, reference, tmp_path):
    out = tmp_path / "out.h5"
    Path(str(out) + ".partial").write_bytes(b"not an hdf5 file at all")
    res = run(cmd(corpus, out))
    assert res.returncode == 0, res.stderr
    assert "cannot be trusted" in res.stderr
    assert_same_h5(reference, out)


def test_finished_output_rerun_is_a_no_op(corpus, reference, tmp_path):
    import shutil

    out = tmp_path / "out.h5"
    shutil.copy(reference, out)  # a finished output of this job and corpus (the path is no part of its hash)
    mtime = out.stat().st_mtime_ns
    res = run(cmd(corpus, out))
    assert res.returncode == 0 and "already complete" in res.stderr
    # The summary line counts the samples; no rate (nothing was converted), no empty rejects path.
    assert f"{out}: " in res.stderr and " samples (" in res.stderr
    assert "samples/s" not in res.stderr and "listed in )" not in res.stderr
    assert out.stat().st_mtime_ns == mtime


# -- process helpers (psutil) -----------------------------------------------------


def test_resume_keeps_the_recorded_codecs_when_a_new_trial_disagrees(tmp_path):
    """codec auto decides from a trial of the corpus; if a resumed run's trial comes out
    differently (here: the long, silent file 0.wav hangs during the new trial and is left
    out, so the rest, noise, no longer compresses), the resume still writes what the partial
    file's datasets were created with, and the result equals an uninterrupted run."""
    import numpy as np
    import soundfile as sf

    root = tmp_path / "corpus"
    rng = np.random.default_rng(9)
    for i in range(24):
        frames = 40000 if i == 0 else 4000
        x = np.zeros(frames, np.int16) if i == 0 else rng.integers(-20000, 20000, frames, dtype=np.int16)
        for folder in ("data", "label"):
            (root / "train" / folder).mkdir(parents=True, exist_ok=True)
            sf.write(root / "train" / folder / f"{i}.wav", x, 16000, subtype="PCM_16")

    def args(out: Path, *extra: str, workers: int | None = 2) -> list[str]:
        return cmd(root, out, "-v", "--set", "policy.decode_timeout=1", "--set", "output.prefer=size", *extra,
                   workers=workers)

    ref = tmp_path / "ref.h5"
    res = run(args(ref, workers=None))  # uninterrupted, in the driver
    assert res.returncode == 0, res.stderr
    assert "data: blosc2-lz4" in res.stderr, res.stderr  # the silent file tips the trial
    out = tmp_path / "out.h5"
    marker = Path(str(out) + ".partial.paused")
    proc = start(args(out), {"H5BATCH_FAULTS": "pause_at=commit:2"})
    wait_for(marker, proc)
    kill_group(proc)
    marker.unlink()
    res = run(args(out), {"H5BATCH_FAULTS": "hang_on=0.wav"})  # 0.wav is committed already
    assert res.returncode == 0, res.stderr
    assert "data: none" in res.stderr  # the new trial, without 0.wav
    assert "resuming with the interrupted run's codecs: data blosc2-lz4" in res.stderr
    assert_same_h5(ref, out)


def _fork_servers(pgid: int) -> list[int]:
    """multiprocessing fork servers in process group ``pgid``."""
    import psutil

    out = []
    for pid in group_members(pgid):
        try:
            if "multiprocessing.forkserver" in " ".join(psutil.Process(pid).cmdline()):
                out.append(pid)
        except psutil.NoSuchProcess:
            continue
    return out
