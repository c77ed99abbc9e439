"""The commit protocol, tested the way a crash comes: ``kill -9`` of the writer at random
moments of a conversion that commits after every batch (many of them inside an HDF5 flush
or a commit), each followed by the same command again, which resumes; after a chain of
such kills the finished output holds exactly what an uninterrupted run's does (every
dataset's values, labels and rejects, every attribute) and the rejects list is the same.

The writer is found from outside, whatever the engine: the one process of the run that has
``OUT.partial`` open for writing (docs/FORMAT.md). The moments come from a seeded generator,
so a failing chain can be run again as it was.
"""

from __future__ import annotations

import json
import os
import random
import signal
import subprocess
import time
from pathlib import Path

import psutil
import pytest

from tests.conftest import REPO
from tests.support.h5compare import assert_same_h5
from tests.support.processes import group_members
from tests.support.run import convert_cmd, run, start
from tests.support.torture import paired_with_rejects

JOB = REPO / "jobs" / "paired_audio.yaml"
CHAINS = 3  # chains of kills, each ending in a run that finishes
KILLS = 8  # kills per chain (a chain whose run finishes before its kill has fewer)
WRITE_MODES = {"w", "a", "r+", "a+"}
BAD = ("train/data/17.wav", "test/label/3.wav")  # rejects the resumed runs must keep


def cmd(root: Path, out: Path) -> list[str]:
    # Commits after every batch of 4 pairs, small chunks: many flushes for a kill to land in.
    return convert_cmd(JOB, output=out, root=root,
                       settings=("policy.commit_every=0", "cluster.batch_size=4", "output.chunk_bytes=16384"))


@pytest.fixture(scope="module")
def corpus(tmp_path_factory) -> Path:
    root = tmp_path_factory.mktemp("kill-writer") / "corpus"
    return paired_with_rejects(root, BAD, n_train=240, n_test=60, seconds=0.5, seed=7)


@pytest.fixture(scope="module")
def reference(corpus, tmp_path_factory) -> Path:
    out = tmp_path_factory.mktemp("ref") / "ref.h5"
    res = run(cmd(corpus, out))
    assert res.returncode == 0, res.stderr
    assert {r["path"] for r in rejects_list(out)} >= set(BAD)
    return out


def rejects_list(out: Path) -> list[dict]:
    lines = Path(str(out).replace(".h5", ".rejects.jsonl")).read_text().splitlines()
    return sorted((json.loads(line) for line in lines), key=lambda r: r["path"])


def writer_of(proc: subprocess.Popen, partial: Path) -> int | None:
    """The process of the run ``proc`` started that has ``partial`` open for writing."""
    target = str(partial.resolve())
    try:
        family = [psutil.Process(proc.pid), *psutil.Process(proc.pid).children(recursive=True)]
    except psutil.NoSuchProcess:
        return None
    for p in family:
        try:
            if any(f.path == target and f.mode in WRITE_MODES for f in p.open_files()):
                return p.pid
        except (psutil.NoSuchProcess, psutil.AccessDenied, FileNotFoundError):
            continue
    return None


def _read(path: Path) -> bytes | None:
    try:
        return path.read_bytes()
    except FileNotFoundError:
        return None


def _stored(record: bytes | None) -> int:
    """The batches a commit record says are stored (0: none yet, or caught mid-write)."""
    try:
        return int(json.loads(record)["next_batch"]) if record else 0
    except (ValueError, KeyError):
        return 0


def run_and_kill_writer(corpus: Path, out: Path, rng: random.Random) -> tuple[bool, int, str]:
    """One run of the command whose writer gets ``kill -9`` at a moment drawn from ``rng``;
    ``(killed, exit code, stderr)``. Not killed: the run ended first.

    One kill in four lands in the writer's first moments (creating, or resuming, the
    partial); the others once this run's commit record (``OUT.partial.commit.json``) counts
    1 to 12 more stored batches, a little later: while batches are stored, flushed and
    committed, or the file finished."""
    partial = Path(str(out) + ".partial")
    record = Path(str(partial) + ".commit.json")
    before = _read(record)
    early = rng.random() < 0.25
    commits = 0 if early else rng.randint(1, 12)
    # Up to 50 ms: a whole run of this corpus takes under a second on an idle machine.
    delay = rng.uniform(0.0, 0.05)
    proc = start(cmd(corpus, out), new_session=True)
    killed = False
    try:
        writer = None
        while writer is None and proc.poll() is None:
            writer = writer_of(proc, partial)
            time.sleep(0.002)
        # Counted in batches the record says are stored, not in changes seen: a fast writer
        # commits several times between two looks.
        target = _stored(before) + commits
        while _stored(_read(record)) < target and proc.poll() is None:
            time.sleep(0.002)
        if writer is not None and proc.poll() is None:
            time.sleep(delay)
            try:
                p = psutil.Process(writer)
                if p.status() != psutil.STATUS_ZOMBIE:  # else it had finished
                    p.send_signal(signal.SIGKILL)
                    killed = True
            except psutil.NoSuchProcess:
                pass  # it had finished
        _, err = proc.communicate(timeout=120)
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.communicate()
    deadline = time.monotonic() + 30
    while (left := group_members(proc.pid)) and time.monotonic() < deadline:
        time.sleep(0.05)
    assert not left, f"processes of the killed run still alive: {left}"
    return killed, proc.returncode, err


@pytest.mark.slow
@pytest.mark.parametrize("chain", range(CHAINS))
def test_kill_9_of_the_writer_at_random_moments_then_rerun_gives_the_uninterrupted_file(
        chain, corpus, reference, tmp_path):
    rng = random.Random(4400 + chain)
    out = tmp_path / "out.h5"
    kills, codes = 0, []
    for _ in range(KILLS):
        killed, code, err = run_and_kill_writer(corpus, out, rng)
        assert "Traceback" not in err, err
        codes.append(code)
        if not killed and code == 1 and "cannot extend the resumed partial output" in err:
            continue  # a kill inside a flush damaged HDF5's metadata: the next run converts afresh
        if not killed:
            assert code == 0, f"the run ended by itself with {code}:\n{err}"
            break
        kills += 1
        if code == 0:
            break  # the writer was killed after the file was finished
    if not out.exists() or Path(str(out) + ".partial").exists():
        res = run(cmd(corpus, out))
        assert res.returncode == 0, f"the rerun after {kills} kills (exit codes {codes}) failed:\n{res.stderr}"
    print(f"chain {chain}: {kills} kills, exit codes {codes}")
    assert kills >= KILLS // 2, f"only {kills} kills landed before the run finished (exit codes {codes})"
    assert_same_h5(reference, out)
    assert rejects_list(out) == rejects_list(reference)
    assert not Path(str(out) + ".lock").exists()
