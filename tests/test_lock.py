"""One owner per output (h5batch/conversion/lock.py): a second run refuses at once, a lock
left by a dead run is taken over, and the fallback for file systems without locks."""

from __future__ import annotations

import json
import os
import shlex
import socket
import subprocess
import sys
import time

import h5py
import pytest

from h5batch import generate
from h5batch.conversion.lock import OutputLock
from h5batch.errors import EXIT_BUSY, ConvertError
from h5batch.tools.verify import verify_file
from tests.conftest import REPO
from tests.support.run import clean_env, convert_cmd, run

JOB = REPO / "jobs" / "paired_audio.yaml"


def _dead_pid() -> int:
    p = subprocess.Popen([sys.executable, "-c", "pass"])
    p.wait()
    return p.pid


@pytest.fixture(scope="module")
def corpus(tmp_path_factory):
    root = tmp_path_factory.mktemp("lock") / "corpus"
    generate.make_paired_audio(root, n_train=120, n_test=20, seconds=0.5, seed=9)
    return root


def test_two_runs_started_from_the_shell_one_refuses_and_the_output_survives(corpus, tmp_path):
    out = tmp_path / "X.h5"
    # The first run starts a LocalCluster (seconds, the lock held from the start): an
    # in-process run of this corpus could end before the second is up.
    first_cmd = shlex.join(convert_cmd(JOB, workers=1, output=out, root=corpus, settings=("cluster.kind=local",)))
    one = shlex.join(convert_cmd(JOB, workers=1, output=out, root=corpus))
    script = (f"{first_cmd} 2>{tmp_path}/a.err & sleep 0.3; {one} 2>{tmp_path}/b.err; echo b=$?; "
              f"wait $!; echo a=$?")
    res = subprocess.run(["bash", "-c", script], capture_output=True, text=True, timeout=300, env=clean_env())
    codes = dict(line.split("=") for line in res.stdout.split())
    first, second = (tmp_path / "a.err").read_text(), (tmp_path / "b.err").read_text()
    assert codes == {"a": "0", "b": str(EXIT_BUSY)}, (first, second)
    line = second.strip().splitlines()[-1]
    assert "is being written by pid" in line and f"on host {socket.gethostname()} since" in line
    assert "wait for it or stop it" in line and "Traceback" not in second
    assert out.exists() and not verify_file(str(out)).problems
    assert not (tmp_path / "X.h5.lock").exists()


def test_a_lock_left_by_a_dead_run_is_taken_over(corpus, tmp_path):
    out = tmp_path / "X.h5"
    pid = _dead_pid()
    (tmp_path / "X.h5.lock").write_text(json.dumps({"pid": pid, "host": socket.gethostname(), "run_id": "old",
                                                    "since": time.time() - 60}) + "\n")
    res = run(convert_cmd(JOB, workers=1, output=out, root=corpus))
    assert res.returncode == 0, res.stderr
    assert f"taking over the lock of {out} left by pid {pid} on host {socket.gethostname()}" in res.stderr
    assert not (tmp_path / "X.h5.lock").exists()
    with h5py.File(out) as f:
        assert f.attrs["complete"]


def test_second_acquire_names_the_owner(tmp_path):
    final = str(tmp_path / "Y.h5")
    said: list[str] = []
    first = OutputLock.acquire(final, "run1", said.append)
    try:
        with pytest.raises(ConvertError) as e:
            OutputLock.acquire(final, "run2", said.append)
        assert e.value.exit_code == EXIT_BUSY
        assert f"is being written by pid {os.getpid()} on host {socket.gethostname()}" in str(e.value)
    finally:
        first.release()
    again = OutputLock.acquire(final, "run3", said.append)  # released: free again
    again.release()
    assert said == [] and not os.path.exists(final + ".lock")


def test_no_locking_file_system_fallback(tmp_path):
    """Where flock is not there (some Lustre mounts), the lock is an exclusively created file:
    a dead pid on this host is taken over, a live one or another host's is refused."""
    final = str(tmp_path / "Z.h5")
    said: list[str] = []
    first = OutputLock._acquire_exclusive(final, _owner(os.getpid()), said.append)
    with pytest.raises(ConvertError, match="this file system has no locks: if that run is gone, remove"):
        OutputLock._acquire_exclusive(final, _owner(os.getpid(), "run2"), said.append)
    first.release()
    assert not os.path.exists(final + ".lock")

    with open(final + ".lock", "w") as fh:
        fh.write(json.dumps({"pid": _dead_pid(), "host": socket.gethostname(), "run_id": "x", "since": 0}))
    OutputLock._acquire_exclusive(final, _owner(os.getpid()), said.append).release()
    assert said and "no longer running" in said[-1]

    with open(final + ".lock", "w") as fh:
        fh.write(json.dumps({"pid": 1, "host": "another-host", "run_id": "x", "since": 0}))
    with pytest.raises(ConvertError, match="on host another-host"):
        OutputLock._acquire_exclusive(final, _owner(os.getpid()), said.append)


def _owner(pid: int, run_id: str = "run1"):
    from h5batch.conversion.lock import Owner

    return Owner(pid, socket.gethostname(), run_id, time.time())
