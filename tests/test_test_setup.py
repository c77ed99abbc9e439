"""The test setup leaves a test's process as a user's would be: no Python thread but the main
one. Reason: a second thread makes ``h5batch.forking.can_fork()`` false, and an in-process
conversion then took a path users never take (a per-test timer thread in conftest did that
to every test). pytest-timeout's own stack dump (SIGALRM, no thread) reports a hang."""

from __future__ import annotations

import threading

import pytest


def _threads() -> list[str]:
    return [t.name for t in threading.enumerate()]


def test_a_test_runs_with_the_main_thread_alone():
    assert threading.active_count() == 1, f"threads beside the test's: {_threads()}"


@pytest.mark.timeout(600)
def test_a_test_with_a_long_timeout_runs_with_the_main_thread_alone():
    assert threading.active_count() == 1, f"threads beside the test's: {_threads()}"


def test_pytest_timeout_reports_without_a_thread(request):
    method = request.config.getini("timeout_method") or request.config.getoption("timeout_method", None)
    assert method in (None, "", "signal"), f"timeout_method {method!r} starts a thread per test"
