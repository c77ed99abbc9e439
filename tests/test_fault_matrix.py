"""Every fault this project knows, on the same small job, with real processes and signals.

After each fault: the exit code and the message are the ones docs/faults.md lists; the same
command run again gives a file equal to an uninterrupted run; no process of the run is left;
no shared-memory segment of the run is left in /dev/shm. (Disk full needs a tmpfs mount:
tests/test_write_errors.py.)
"""

from __future__ import annotations

import os
import signal
import subprocess
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import h5py
import pytest

from h5batch import generate
from h5batch.transport import semaphores
from h5batch.transport.segments import list_segments, owner_pid
from tests.conftest import REPO
from tests.support.h5compare import assert_same_h5
from tests.support.processes import group_members, holder_of, wait_for
from tests.support.run import convert_cmd, run, start

JOB = REPO / "jobs" / "paired_audio.yaml"
DOC = (REPO / "docs" / "faults.md").read_text()


def cmd(root: Path, out: Path, *settings: str, workers: int | None = 2) -> list[str]:
    """``workers=None``: one decoder process per core."""
    return convert_cmd(JOB, workers=workers, output=out, root=root,
                       settings=("cluster.batch_size=4", "policy.commit_every=0", "output.chunk_bytes=16384",
                                 *settings))


@pytest.fixture(scope="module")
def corpus(tmp_path_factory) -> Path:
    root = tmp_path_factory.mktemp("matrix") / "corpus"
    generate.make_paired_audio(root, n_train=160, n_test=40, seconds=0.5, seed=5)
    return root


@pytest.fixture(scope="module")
def reference(corpus, tmp_path_factory) -> Path:
    """The uninterrupted run (the engine is no part of the output); every faulted run and
    its rerun must give this file."""
    out = tmp_path_factory.mktemp("ref") / "ref.h5"
    res = run(cmd(corpus, out, workers=None))
    assert res.returncode == 0, res.stderr
    return out


@dataclass
class Run:
    """One faulted run: its process, its output and what the fault left to check."""

    proc: subprocess.Popen
    out: Path
    stderr: str = ""

    @property
    def partial(self) -> Path:
        return Path(str(self.out) + ".partial")

    def wait(self, timeout: float = 120) -> int:
        _, err = self.proc.communicate(timeout=timeout)
        self.stderr += err
        return self.proc.returncode


# Each fault: what to do to a running conversion (paused, or slowed, where it must be).
# Returns the exit code the faulted run ended with.

def _paused(corpus, out, point="commit:3") -> Run:
    r = Run(start(cmd(corpus, out), {"H5BATCH_FAULTS": f"pause_at={point}"}, new_session=True), out)
    wait_for(Path(str(out) + ".partial.paused"), r.proc)
    return r


def _running(corpus, out, *settings: str) -> Run:
    # One file hangs its worker for a while: the run is surely still going when hit.
    r = Run(start(cmd(corpus, out, "policy.decode_timeout=3", *settings), {"H5BATCH_FAULTS": "hang_on=30.wav"},
                  new_session=True), out)
    wait_for(Path(str(out) + ".partial.commit.json"), r.proc)
    time.sleep(0.3)
    return r


def kill_group(corpus, out) -> tuple[Run, int]:
    r = _paused(corpus, out)
    os.killpg(r.proc.pid, signal.SIGKILL)
    return r, r.wait()


def kill_driver(corpus, out) -> tuple[Run, int]:
    r = _running(corpus, out)
    os.kill(r.proc.pid, signal.SIGKILL)
    code = r.wait()
    deadline = time.monotonic() + 20  # the orphaned writer commits and exits by itself
    while holder_of(r.partial) and time.monotonic() < deadline:
        time.sleep(0.2)
    return r, code


def kill_writer(corpus, out) -> tuple[Run, int]:
    r = _paused(corpus, out)
    writer = holder_of(r.partial)
    assert writer and writer != r.proc.pid
    os.kill(writer, signal.SIGKILL)
    return r, r.wait()


def kill_worker(corpus, out) -> tuple[Run, int]:
    marker = out.parent / "killed-once"
    r = Run(start(cmd(corpus, out, "cluster.kind=local"), {"H5BATCH_FAULTS": f"kill_once=3:{marker}"},
                  new_session=True), out)
    code = r.wait()
    assert marker.exists(), "the worker was not killed"
    return r, code


def freeze_worker(corpus, out) -> tuple[Run, int]:
    marker = out.parent / "frozen-once"
    # An injected freeze is no news for the session's event log (tests/conftest.py).
    env = {"H5BATCH_FAULTS": f"freeze_once=30.wav:{marker}", "H5BATCH_EVENT_LOG": ""}
    r = Run(start(cmd(corpus, out, "cluster.kind=local", "policy.frozen_worker_timeout=3"), env, new_session=True), out)
    code = r.wait()
    assert marker.exists(), "no worker froze"
    return r, code


def signal_to(target: str, sig: int) -> Callable:
    def fault(corpus, out) -> tuple[Run, int]:
        r = _running(corpus, out)
        if target == "group":
            os.killpg(r.proc.pid, sig)
        else:
            os.kill(r.proc.pid, sig)
        return r, r.wait()
    fault.__name__ = f"{signal.Signals(sig).name}_{target}"
    return fault


def second_signal(corpus, out) -> tuple[Run, int]:
    r = _running(corpus, out)
    os.kill(r.proc.pid, signal.SIGTERM)
    time.sleep(0.05)  # the shutdown has begun: the driver is asking the writer to commit
    try:
        os.kill(r.proc.pid, signal.SIGTERM)
    except ProcessLookupError:
        pass  # already done with its shutdown
    code = r.wait()
    deadline = time.monotonic() + 20
    while holder_of(r.partial) and time.monotonic() < deadline:
        time.sleep(0.2)
    return r, code


def concurrent_run(corpus, out) -> tuple[Run, int]:
    first = _paused(corpus, out)
    second = run(cmd(corpus, out))  # as a user would start it from a shell: same command
    first.stderr = second.stderr  # what the second run said is what this case checks
    os.killpg(first.proc.pid, signal.SIGKILL)  # the first run is then stopped, resumed below
    first.proc.communicate(timeout=60)
    assert first.out.with_name(first.out.name + ".partial").exists(), "the second run touched the partial"
    return first, second.returncode


def _members_after(pgid: int, seconds: float) -> list[int]:
    """The processes of group ``pgid`` still alive ``seconds`` from now (sooner once none is)."""
    deadline = time.monotonic() + seconds
    while (left := group_members(pgid)) and time.monotonic() < deadline:
        time.sleep(0.05)
    return left


# fault -> (exit codes accepted, a line docs/faults.md and stderr both hold, or None)
MATRIX = {
    "kill -9 of the whole process group": (kill_group, (-9,), None),
    "kill -9 of the driver": (kill_driver, (-9,), None),
    "kill -9 of the writer": (kill_writer, (1,), "writer process died (exit code -9)"),
    "kill -9 of a Dask worker": (kill_worker, (0,), None),
    "a Dask worker frozen": (freeze_worker, (0,), "has sent no heartbeat for"),
    "Ctrl-C (SIGINT to the process group)": (signal_to("group", signal.SIGINT), (130,),
                                             "interrupted; progress is committed in"),
    "SIGTERM to the driver": (signal_to("driver", signal.SIGTERM), (143,), "stopped by SIGTERM; progress is committed in"),
    "SIGTERM to the process group": (signal_to("group", signal.SIGTERM), (143,),
                                     "stopped by SIGTERM; progress is committed in"),
    "SIGHUP": (signal_to("driver", signal.SIGHUP), (129,), "stopped by SIGHUP; progress is committed in"),
    "a second signal during that shutdown": (second_signal, (143, -15), None),
    "a second run on the same output": (concurrent_run, (75,), "is being written by pid"),
}


def test_every_fault_is_in_the_table_of_docs():
    lines = [line.replace("`", "") for line in DOC.splitlines() if line.startswith("| ") and "---" not in line]
    for fault, (_, codes, message) in MATRIX.items():
        line = next((line for line in lines if line.split("|")[1].strip().startswith(fault)), None)
        assert line is not None, f"docs/faults.md has no row for {fault!r}"
        assert str(codes[0]) in line, f"docs/faults.md: {fault}: exit code {codes[0]} not in {line!r}"
        if message:
            assert message.split(" (")[0] in line, f"docs/faults.md: {fault}: {message!r} not in {line!r}"


@pytest.mark.parametrize("fault", list(MATRIX))
def test_fault_then_rerun_gives_the_uninterrupted_file(fault, corpus, reference, tmp_path):
    action, codes, message = MATRIX[fault]
    out = tmp_path / "out.h5"
    r, code = action(corpus, out)
    assert code in codes, f"{fault}: exit code {code}, expected {codes}:\n{r.stderr}"
    if message:
        assert message in r.stderr, r.stderr
    assert "Traceback" not in r.stderr, r.stderr
    if code == 0:
        assert not r.partial.exists()
    else:
        res = run(cmd(corpus, out))
        assert res.returncode == 0, f"{fault}: the rerun failed:\n{res.stderr}"
    assert_same_h5(reference, out)
    left = _members_after(r.proc.pid, 0.5)
    if left:
        os.killpg(r.proc.pid, signal.SIGKILL)
    assert not left, f"{fault}: processes of the run still alive: {left}"
    mine = [s for s in list_segments() if owner_pid(s) == r.proc.pid]
    assert not mine, f"{fault}: shared-memory segments of the run left: {mine}"
    # The multiprocessing semaphores of the faulted run: released by a run that ends, and
    # unlinked by the rerun when the fault killed their owner (issue 19: they piled up).
    sems = semaphores.list_tagged(r.proc.pid)
    assert not sems, f"{fault}: semaphores of the run left in /dev/shm: {sems}"
    assert not Path(str(out) + ".lock").exists(), "the lock file outlived the rerun"
    with h5py.File(out, "r") as f:
        assert f.attrs["complete"]


def test_removed_input_file_mid_run_becomes_a_reject(corpus, reference, tmp_path):
    """The file is in the manifest, then gone before its batch is decoded: a reject with its
    reason, the rest of the output as it would have been."""
    import shutil

    root = tmp_path / "corpus"
    shutil.copytree(corpus, root)
    out = tmp_path / "out.h5"
    victim = root / "train" / "data" / "150.wav"
    r = Run(start(cmd(root, out, "policy.decode_timeout=3"), {"H5BATCH_FAULTS": "hang_on=30.wav"},
                  new_session=True), out)
    deadline = time.monotonic() + 60
    while "decoding on " not in r.stderr:  # discovery is done, decoding starts
        line = r.proc.stderr.readline()
        assert line or r.proc.poll() is None, r.stderr
        r.stderr += line
        assert time.monotonic() < deadline
    victim.unlink()  # batch 37 is far behind the hung batch 7: not decoded yet
    code = r.wait()
    assert code == 0, r.stderr
    with h5py.File(out, "r") as f, h5py.File(reference, "r") as ref:
        paths = list(f["rejects/path"].asstr()[...])
        reasons = dict(zip(paths, f["rejects/reason"].asstr()[...]))
        assert reasons.get("train/data/150.wav") == "file disappeared since discovery"
        assert "train/label/150.wav" in paths  # its pair goes with it
        got = set(f["train/source"].asstr()[:, 0]) | set(f["test/source"].asstr()[:, 0])
        want = set(ref["train/source"].asstr()[:, 0]) | set(ref["test/source"].asstr()[:, 0])
        # both 30.wav (train and test) hung past policy.decode_timeout: rejects of this run too
        assert want - got == {"train/data/150.wav", "train/data/30.wav", "test/data/30.wav"} and got <= want
    assert "an input file removed during the run" in DOC
