"""The one fault-injection hook, for the failure tests; off unless ``H5BATCH_FAULTS`` is set.

An environment variable rather than a test-only argument in every signature, because it
reaches real worker and writer processes (they inherit the driver's environment). The
product calls :func:`before_decode`, :func:`before_batch` and :func:`pause`; unset, each is
one dictionary lookup.

``H5BATCH_FAULTS`` is a comma-separated list of ``mode=value``:

==========================  ===============================================================
``crash_on=NAME``           the process decoding a file named NAME kills itself with SIGKILL,
                            every time (like a decoder that segfaults)
``hang_on=NAME``            decoding a file named NAME never returns
``freeze_once=NAME:MARKER`` the process decoding a file named NAME stops itself (SIGSTOP: no
                            thread of it runs, like a native call that holds the GIL forever),
                            the first time only (MARKER remembers that it did)
``kill_once=B:MARKER``      the worker that runs batch B kills itself, the first time only
                            (MARKER is a file it creates to remember that it did)
``pause_at=POINT``          the writer stops for good at POINT: ``commit:N`` right after its
                            N-th commit, ``store:N`` right after its N-th stored batch part,
                            ``finalize`` just before the final rename (``compact``:
                            ``h5batch compact`` before its rename); it first
                            writes ``<partial>.paused`` so a test knows it is there
==========================  ===============================================================

An unknown mode is an error (a typo must not silently test nothing).
"""

from __future__ import annotations

import os
import signal
import time
from functools import cache

ENV = "H5BATCH_FAULTS"
MODES = ("crash_on", "hang_on", "freeze_once", "kill_once", "pause_at")


@cache
def parse(text: str) -> dict[str, str]:
    """``mode -> value`` of a ``H5BATCH_FAULTS`` value; ValueError for an unknown mode."""
    out: dict[str, str] = {}
    for part in filter(None, (p.strip() for p in text.split(","))):
        mode, sep, value = part.partition("=")
        if not sep or mode not in MODES:
            raise ValueError(f"{ENV}: {part!r} is not one of {', '.join(m + '=...' for m in MODES)}")
        out[mode] = value
    return out


def active() -> dict[str, str]:
    """The faults this process was asked to inject (usually none)."""
    text = os.environ.get(ENV)
    return parse(text) if text else {}


def _first_time(marker: str) -> bool:
    """Create ``marker``; True for the one process that created it. Rule: exclusive
    creation, not a look then a write: two decoders that start at once would both see no
    marker and both kill themselves, where the fault promises once."""
    try:
        os.close(os.open(marker, os.O_CREAT | os.O_EXCL | os.O_WRONLY, 0o644))
    except FileExistsError:
        return False
    return True


def before_decode(path: str) -> None:
    """Called before a file is decoded (on a worker, or in the driver's codec trial)."""
    faults = active()
    if not faults:
        return
    name = os.path.basename(path)
    if faults.get("crash_on") == name:
        os.kill(os.getpid(), signal.SIGKILL)
    if faults.get("hang_on") == name:
        time.sleep(3600)
    spec = faults.get("freeze_once")
    if spec:
        target, _, marker = spec.partition(":")
        if target == name and _first_time(marker):
            os.kill(os.getpid(), signal.SIGSTOP)


def before_batch(index: int) -> None:
    """Called on a worker before it decodes batch ``index``."""
    spec = active().get("kill_once")
    if spec:
        at, marker = spec.split(":", 1)
        if int(at) == index and _first_time(marker):
            os.kill(os.getpid(), signal.SIGKILL)


def pause(point: str, partial_path: str) -> None:
    """Called by the writer at ``commit:N`` and ``finalize`` (and by ``compact``): stops there when asked."""
    if active().get("pause_at") == point:
        with open(partial_path + ".paused", "w") as fh:
            fh.write(point)
        time.sleep(3600)
