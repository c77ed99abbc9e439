"""The test setup leaves a test's process as a user's would be: no Python thread but the main
one. Reason: a second thread makes ``h5batch.forking.can_fork()`` false, and an in-process
conversion then took a path users never take (a per-test timer thread in conftest did that
to every test). pytest-timeout's own stack dump (SIGALRM, no thread) reports a hang.

Checked in a fresh pytest process, where only the setup (conftest, plugins, fixtures) can
have started a thread: in this one, threads an earlier test left would be counted too.
"""

from __future__ import annotations

import os
import subprocess
import sys
import threading

import pytest

from tests.conftest import REPO

INNER = "H5BATCH_TEST_SETUP_INNER"
inner_only = pytest.mark.skipif(not os.environ.get(INNER), reason="run in a fresh process by the test below")


def _threads() -> list[str]:
    return [t.name for t in threading.enumerate()]


@inner_only
def test_inner_main_thread_alone():
    assert threading.active_count() == 1, f"threads beside the test's: {_threads()}"


@inner_only
@pytest.mark.timeout(600)  # the removed timer thread started only for limits of 60 s and more
def test_inner_main_thread_alone_with_a_long_timeout():
    assert threading.active_count() == 1, f"threads beside the test's: {_threads()}"


def test_a_test_runs_with_the_main_thread_alone():
    inner = [f"{__file__}::test_inner_main_thread_alone", f"{__file__}::test_inner_main_thread_alone_with_a_long_timeout"]
    res = subprocess.run([sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", *inner],
                         capture_output=True, text=True, cwd=REPO, timeout=120, env={**os.environ, INNER: "1"})
    assert res.returncode == 0 and "2 passed" in res.stdout, res.stdout + res.stderr


def test_pytest_timeout_reports_without_a_thread(request):
    method = request.config.getini("timeout_method") or request.config.getoption("timeout_method", None)
    assert method in (None, "", "signal"), f"timeout_method {method!r} starts a thread per test"
