"""Whether this process may fork (:func:`can_fork`): the one rule every forked helper
process of a run follows (the writer, the in-process decoders, a sync's stat pass)."""

from __future__ import annotations

import multiprocessing as mp
import sys
import threading

__all__ = ["can_fork"]


def can_fork() -> bool:
    """True where forking this process is safe: Linux (elsewhere ``fork`` is missing or,
    on macOS, unsafe with system frameworks) and no Python thread but this one. Native
    threads are not counted: numpy's OpenBLAS starts its pool at import (``/proc/self/task``
    lists 2 threads in a bare ``import numpy``) and re-creates it in a child through its
    ``pthread_atfork`` handlers, as the many programs that fork numpy rely on."""
    return sys.platform.startswith("linux") and "fork" in mp.get_all_start_methods() \
        and threading.active_count() == 1
