"""Shared fixtures: small real corpora made at test time, and a shared-memory leak check."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from h5batch import generate
from h5batch.transport.segments import list_segments, owner_pid

REPO = Path(__file__).resolve().parents[1]
SHARED = REPO.parent / "shared" / "corpora"
PARALLEL = bool(os.environ.get("PYTEST_XDIST_WORKER"))  # make test runs the files on 2 xdist workers


def _owner_alive(segment: str) -> bool:
    pid = owner_pid(segment)
    if pid is None or pid == os.getpid():
        return False  # our own runs are over when the test is
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    return True


@pytest.fixture(autouse=True)
def no_leaked_segments():
    """No test may leave an h5batch shared-memory segment behind. Segments of runs that are
    still going (another process on this machine) are not ours to judge."""
    before = set(list_segments())
    yield
    leaked = {s for s in set(list_segments()) - before if not _owner_alive(s)}
    if PARALLEL:
        # Beside this test, another xdist worker may have just killed a run whose segments
        # its rerun is about to remove: judge only the runs of this process and of the
        # processes it started (tests/support/run.py records their pids).
        from tests.support.run import SPAWNED

        leaked = {s for s in leaked if owner_pid(s) in SPAWNED | {os.getpid()}}
    assert not leaked, f"shared-memory segments leaked: {sorted(leaked)}"


# One name per pytest session, shared by its xdist workers (they inherit the environment).
_SESSION = os.environ.setdefault("H5BATCH_TEST_SESSION", f"{os.getpid()}")
_EVENTS = Path(os.environ.get("TMPDIR", "/tmp")) / "h5batch-test-events" / f"{_SESSION}.log"
os.environ.setdefault("H5BATCH_EVENT_LOG", str(_EVENTS))
_EVENTS.parent.mkdir(exist_ok=True)

# No fixture here starts a thread: a second Python thread makes h5batch.forking.can_fork()
# false, and an in-process conversion would then take a path users never take. A test that
# reaches its limit gets pytest-timeout's own dump of every thread's stack (method: signal,
# a SIGALRM handler, no thread); test_conftest_threads.py keeps it so.


def pytest_terminal_summary(terminalreporter):
    """The Dask workers that the driver's cluster watch killed for a missing heartbeat during
    the session (``H5BATCH_EVENT_LOG``, h5batch/conversion/cluster_watch.py): such a kill
    ends a freeze and the test passes, so its message would otherwise go unseen."""
    if os.environ.get("PYTEST_XDIST_WORKER") or not _EVENTS.exists():
        return
    lines = _EVENTS.read_text().splitlines()
    terminalreporter.write(f"\n== {len(lines)} frozen Dask worker(s) killed by the cluster watch this session ==\n")
    terminalreporter.write("".join(line + "\n" for line in lines))
    _EVENTS.unlink()


@pytest.fixture(scope="session")
def demo_root(tmp_path_factory) -> Path:
    root = tmp_path_factory.mktemp("demo") / "corpus"
    generate.make_demo_corpus(root, per_class=12)
    return root


@pytest.fixture(scope="session")
def paired_root(tmp_path_factory) -> Path:
    root = tmp_path_factory.mktemp("paired") / "corpus"
    generate.make_paired_audio(root, n_train=24, n_test=8, seconds=0.5)
    return root


def shared_corpus(name: str) -> Path:
    """A corpus in ../shared/corpora, or skip the test with the reason."""
    path = SHARED / name
    if not path.is_dir():
        pytest.skip(f"{path} is not present (the shared corpora exist on the team's machines and CI only)")
    return path


@pytest.fixture
def chdir_tmp(tmp_path, monkeypatch) -> Path:
    monkeypatch.chdir(tmp_path)
    return tmp_path


def env_without_scheduler() -> dict[str, str]:
    env = dict(os.environ)
    env.pop("DASK_SCHEDULER_ADDRESS", None)
    return env
