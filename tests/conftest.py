"""Shared fixtures: small real corpora made at test time, and a shared-memory leak check."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from h5batch import generate
from h5batch.transport.segments import list_segments, owner_pid
from tests.support import hang_report

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
os.environ.setdefault("H5BATCH_EVENT_LOG", str(hang_report.event_log(_SESSION)))


@pytest.fixture(autouse=True)
def stacks_before_timeout(request):
    """A test about to reach its pytest-timeout limit leaves the stacks of the processes it
    started in a report printed at the end of the session (tests/support/hang_report.py)."""
    marker = request.node.get_closest_marker("timeout")
    limit = float(marker.args[0]) if marker and marker.args else float(request.config.getini("timeout") or 0)
    timer = hang_report.Timer(request.node.nodeid, limit, _SESSION) if limit >= 60 else None
    yield
    if timer is not None:
        timer.cancel()


def pytest_terminal_summary(terminalreporter):
    if not os.environ.get("PYTEST_XDIST_WORKER"):
        hang_report.print_reports(_SESSION, terminalreporter.write)


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
