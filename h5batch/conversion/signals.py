"""SIGTERM and SIGHUP end a conversion the way Ctrl-C does: commit, stop, say how to resume.

``timeout``, systemd, Kubernetes and SLURM (pre-emption, time limits) stop a program with
SIGTERM; a closed terminal sends SIGHUP. Each is turned into :class:`Interrupted` (a
``KeyboardInterrupt``, so one code path serves all three) in the driver's main thread: the
driver asks the writer to commit what it stored, stops the cluster, removes this run's
shared-memory segments and exits with ``128 + signal number`` (130, 143, 129) and the resume
hint. A second signal while that shutdown runs ends the driver at once, with the signal's
default action: the writer then sees the driver gone and commits by itself, and a commit
record is replaced atomically, so it is never half written.

A raise from a signal handler is lost where Python ignores exceptions: inside a ``__del__``
or a weakref callback (Dask's ``Future.__del__``, say: the conversion would go on to exit 0). So the handler also keeps the exception, and the driver's loop
raises it again at its safe points (:func:`raise_pending`) if it never got there.

The writer process ignores all three (a signal sent to the process group reaches it too):
what to do is the driver's decision, and a writer whose driver is gone commits and exits.
"""

from __future__ import annotations

import signal
import threading
from collections.abc import Iterator
from contextlib import contextmanager

HANDLED = (signal.SIGINT, signal.SIGTERM, signal.SIGHUP)


class Interrupted(KeyboardInterrupt):
    """The run was stopped by ``signum`` (SIGINT, SIGTERM or SIGHUP)."""

    def __init__(self, signum: int):
        self.signum = signum
        super().__init__(f"signal {signal.Signals(signum).name}")

    @property
    def exit_code(self) -> int:
        return 128 + self.signum


def signal_name(exc: BaseException) -> str:
    """The signal that stopped the run (a plain KeyboardInterrupt is a SIGINT)."""
    return signal.Signals(getattr(exc, "signum", signal.SIGINT)).name


def exit_code(exc: BaseException) -> int:
    return 128 + getattr(exc, "signum", signal.SIGINT)


_depth = 0  # graceful() blocks entered (the cluster of a batch system nests one)
_pending: Interrupted | None = None  # the first signal's exception, until a safe point took it


def _raise_once(signum, frame) -> None:
    global _pending
    # From now on a second signal of any of the three ends the process at once.
    for s in HANDLED:
        signal.signal(s, _die)
    _pending = Interrupted(signum)
    raise _pending


def raise_pending() -> None:
    """Raise the first signal's :class:`Interrupted` again, once, where the handler's own
    raise was swallowed (see the module docstring). Called at the driver loop's safe points:
    a raise that propagated left that loop, so no later point of the run sees it twice."""
    global _pending
    if _pending is not None:
        e, _pending = _pending, None
        raise e


def _die(signum, frame) -> None:
    signal.signal(signum, signal.SIG_DFL)
    signal.raise_signal(signum)


@contextmanager
def graceful() -> Iterator[None]:
    """Within this block, the first SIGINT/SIGTERM/SIGHUP raises :class:`Interrupted` in
    the main thread; a second one ends the process. Blocks may nest (a library may have
    replaced the handlers meanwhile: dask_jobqueue does for SIGINT); an inner block leaves
    a shutdown under way as it is, the outermost restores the handlers it found. Outside
    the main thread (a conversion started from another thread cannot own signals) it does
    nothing."""
    global _depth
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    global _pending
    shutting_down = signal.getsignal(signal.SIGTERM) is _die
    if _depth == 0 and not shutting_down:
        _pending = None  # a new run: an earlier run's signal is no business of this one
    old = {s: signal.signal(s, _die if shutting_down else _raise_once) for s in HANDLED}
    _depth += 1
    try:
        yield
    finally:
        _depth -= 1
        if _depth == 0 or signal.getsignal(signal.SIGTERM) is not _die:
            for s, h in old.items():
                signal.signal(s, h)
