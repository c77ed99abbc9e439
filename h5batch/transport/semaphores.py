"""The POSIX semaphores multiprocessing leaves in ``/dev/shm`` when a run is killed, and
their clean-up.

Dask's nannies start worker processes with the ``spawn`` method; each start creates
semaphores (``/dev/shm/sem.mp-<random>``, for the process's queues and events) that
CPython unlinks only when they are released or when the creating process's resource
tracker sees it exit. ``kill -9`` of the process group kills the tracker too, and the
semaphores stay forever.

Rule: while a conversion runs, this process names new semaphores
``sem.mp-h5batch.<pid>-<random>`` (CPython takes the prefix from
``current_process()._config["semprefix"]``, an implementation detail stable since 3.4;
the names are the only thing it changes), and each run first unlinks the tagged semaphores
of processes that no longer exist. Reason: nothing in a random name says who owns it, and
unlinking a live process's semaphore would break its queues; the pid makes ownership
checkable, like the run id does for segments (:mod:`.segments`).
"""

from __future__ import annotations

import contextlib
import multiprocessing
import os
from collections.abc import Iterator

from .segments import SHM_DIR, pid_alive, unlink_shm

TAG = "mp-h5batch."  # after "/" in the semaphore name; the file is "sem." + name


@contextlib.contextmanager
def tagged() -> Iterator[None]:
    """Name the semaphores this process creates inside the block after its pid."""
    config = multiprocessing.current_process()._config  # type: ignore[attr-defined]
    before = config.get("semprefix", "/mp")
    config["semprefix"] = f"/{TAG}{os.getpid()}"
    try:
        yield
    finally:
        config["semprefix"] = before


def owner(name: str) -> int | None:
    """The pid in a tagged semaphore's file name (``sem.mp-h5batch.<pid>-...``), else None."""
    head = "sem." + TAG
    if not name.startswith(head):
        return None
    pid = name[len(head):].partition("-")[0]
    return int(pid) if pid.isdecimal() else None


def list_tagged(pid: int | None = None) -> list[str]:
    """Tagged semaphore files present now (of one process, or all)."""
    try:
        names = os.listdir(SHM_DIR)
    except OSError:
        return []
    return sorted(n for n in names if (p := owner(n)) is not None and (pid is None or p == pid))


def remove_stale() -> list[str]:
    """Unlink the tagged semaphores of processes that are gone."""
    return unlink_shm([n for n in list_tagged() if not pid_alive(owner(n))])  # type: ignore[arg-type]
