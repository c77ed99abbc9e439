"""Forked helper processes: whether this process may fork (:func:`can_fork`), the one
rule the forked decoder processes follow (:func:`close_inherited`), and what they inherit
(:func:`share_inherited_objects`, :func:`return_free_memory`).
"""

from __future__ import annotations

import ctypes
import gc
import multiprocessing as mp
import os
import sys
import threading

__all__ = ["can_fork", "start_context", "close_inherited", "share_inherited_objects", "return_free_memory"]


def can_fork() -> bool:
    """True where forking this process is safe: Linux (elsewhere ``fork`` is missing or,
    on macOS, unsafe with system frameworks) and no Python thread but this one. Native
    threads are not counted: numpy's OpenBLAS starts its pool at import (``/proc/self/task``
    lists 2 threads in a bare ``import numpy``) and re-creates it in a child through its
    ``pthread_atfork`` handlers, as the many programs that fork numpy rely on."""
    return sys.platform.startswith("linux") and "fork" in mp.get_all_start_methods() \
        and threading.active_count() == 1


def start_context() -> mp.context.BaseContext:
    """The context h5batch starts its processes with (the writer, the local decoders):
    ``fork`` where :func:`can_fork` (milliseconds, h5py and the decoders already imported),
    else the fork server, else ``spawn``. A context object: the caller's start method and
    fork-server settings are never changed."""
    if can_fork():
        return mp.get_context("fork")
    methods = mp.get_all_start_methods()
    return mp.get_context("forkserver" if "forkserver" in methods else "spawn")


def close_inherited(*keep: int) -> None:
    """(a forked helper) Close every descriptor but the standard three and ``keep``: the
    rule of the local decoder processes (the writer keeps the output's lock it inherits).
    Reason: an inherited descriptor outlives its owner, an output's lock among them (the
    lock would not go with a killed sync), and a pipe's write end held elsewhere keeps its
    reader from seeing EOF."""
    low = 3
    for fd in sorted(keep):
        os.closerange(low, fd)
        low = fd + 1
    os.closerange(low, os.sysconf("SC_OPEN_MAX"))  # a forked helper runs on Linux (can_fork)


def share_inherited_objects() -> None:
    """(a forked helper) Keep the objects inherited from the parent out of this process's
    garbage collector (``gc.freeze``): the rule of the local decoder processes. Reason: a
    collection writes into every object it looks at, and so copies each page of them (the
    parent's manifest: hundreds of bytes a file) into the child; measured at 300,000 files,
    ~30 MiB more per decoder without it. The objects stay shared with the parent, read-only,
    for the child's life; what the child makes is collected as usual."""
    gc.freeze()


def return_free_memory() -> None:
    """Give the free pages of the C heap back to the system (glibc's ``malloc_trim``; nothing
    elsewhere). Reason: the big buffers that discovery grew and let go
    (lists of a million pointers, its sort) stay mapped in the heap, and the writer and
    decoders forked next inherit them as if used, then copy the pages the driver writes
    again: measured at 300,000 files, 37 MiB of a driver's 124."""
    if sys.platform.startswith("linux"):
        trim = getattr(ctypes.CDLL(None), "malloc_trim", None)  # glibc's; musl has none
        if trim is not None:
            trim(0)
