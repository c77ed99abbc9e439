"""Signals in the driver (h5batch/conversion/signals.py): a real SIGINT sent to this process."""

from __future__ import annotations

import os
import signal

import pytest

from h5batch.conversion import signals


class _SignalledInDestructor:
    """Sends SIGINT to this process from ``__del__`` and keeps running Python code there, so
    the handler runs inside the destructor, where Python ignores what it raises (as when
    Dask's ``Future.__del__`` ran at the moment a SIGINT came, seen in CI)."""

    def __del__(self):
        os.kill(os.getpid(), signal.SIGINT)
        for _ in range(100_000):
            pass


# pytest reports the destructor's ignored exception as a warning: that is the case tested.
@pytest.mark.filterwarnings("ignore::pytest.PytestUnraisableExceptionWarning")
def test_a_signal_whose_raise_a_destructor_swallowed_is_raised_at_the_next_safe_point():
    # What was there before: Python's own, or what an earlier test's library left in this
    # process (LitData's data processor installs a SIGINT handler and keeps it).
    before = signal.getsignal(signal.SIGINT)
    with signals.graceful():
        _SignalledInDestructor()  # dropped at once: its __del__ runs here, and the raise is lost...
        with pytest.raises(signals.Interrupted) as e:
            signals.raise_pending()  # ...and comes back where the driver's loop asks
        assert e.value.exit_code == 128 + signal.SIGINT
        signals.raise_pending()  # once only
    with signals.graceful():
        signals.raise_pending()  # a new run starts clean
    assert signal.getsignal(signal.SIGINT) is before  # the handlers were restored


def test_a_signal_that_propagated_is_not_raised_again_by_the_next_run():
    with pytest.raises(signals.Interrupted), signals.graceful():
        os.kill(os.getpid(), signal.SIGTERM)
        for _ in range(1_000_000):
            pass
    with signals.graceful():
        signals.raise_pending()
