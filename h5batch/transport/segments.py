"""Shared-memory segments: the buffers decoded batches travel in, and their clean-up.

A segment is a file in ``/dev/shm`` named ``h5b-<run id>-<random>``, mapped with ``mmap``.
Ownership: the producing process (a worker, or the driver for network payloads) creates
and reuses its segments; the writer only maps them and flips their state byte; the driver
unlinks every segment of its run when the job ends, whatever the outcome.
(``multiprocessing.shared_memory`` is not used: on CPython 3.11 its resource tracker
unlinks segments a process merely attached to, bpo-39959.) The run id embeds the driver's
pid, so segments of dead runs are found and removed by :func:`remove_stale_segments`.
"""

from __future__ import annotations

import contextlib
import mmap
import os
import secrets
import socket

import numpy as np

SHM_DIR = "/dev/shm"
PREFIX = "h5b-"


def new_run_id() -> str:
    """``<driver pid hex>x<random>``: unique per run, and tells which process owns it."""
    return f"{os.getpid():x}x{secrets.token_hex(4)}"


def hostname() -> str:
    return socket.gethostname()


HEADER = 64  # bytes before the data: byte 0 is the slot state (FREE / BUSY)
FREE, BUSY = 0, 1
# A process drops its mapping of a batch at least this big once it is handed on (a long
# recording's batch would otherwise count once in the worker's RSS and once in the writer's).
DROP_PAGES_BYTES = 64 << 20


class Segment:
    """A POSIX shared-memory segment (a file in ``/dev/shm``), mapped into this process;
    the mapping closes when its last numpy view goes away.

    Byte 0 says whether the segment holds a batch the writer has not stored yet (BUSY)
    or may be filled again (FREE): segments are reused, so their pages stay resident and
    a batch costs no page faults, no ``ftruncate`` and no ``mmap``."""

    def __init__(self, name: str, size: int | None = None):
        self.name = name
        path = os.path.join(SHM_DIR, name)
        if size is None:
            fd = os.open(path, os.O_RDWR)
        else:
            fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_EXCL, 0o600)
        try:
            if size is not None:
                os.ftruncate(fd, HEADER + max(size, 1))
            self.size = os.fstat(fd).st_size
            self.map = mmap.mmap(fd, self.size)
        except BaseException:
            os.close(fd)
            if size is not None:
                os.unlink(path)
            raise
        os.close(fd)
        self.flat = np.frombuffer(self.map, dtype=np.uint8)
        self.data = self.flat[HEADER:]

    @property
    def free(self) -> bool:
        return self.flat[0] == FREE

    def mark(self, state: int) -> None:
        self.flat[0] = state

    def drop_pages(self, nbytes: int) -> None:
        """Unmap this process's pages of the first ``nbytes`` of data once they are
        handed on: the bytes stay in the segment (``MADV_DONTNEED`` on a shared mapping
        only drops the page-table entries; the next access maps them again), but they no
        longer count in this process's RSS. Only for at least :data:`DROP_PAGES_BYTES`:
        a small batch keeps its pages mapped for the next one (no page faults)."""
        if nbytes < DROP_PAGES_BYTES:
            return
        end = min(self.size, HEADER + nbytes)
        with contextlib.suppress(AttributeError, OSError, ValueError):  # pragma: no cover - no madvise here
            self.map.madvise(mmap.MADV_DONTNEED, 0, end - end % mmap.PAGESIZE)

    def unlink(self) -> None:
        with contextlib.suppress(FileNotFoundError):
            os.unlink(os.path.join(SHM_DIR, self.name))


def create_segment(run_id: str, nbytes: int) -> Segment:
    """A new segment named after the run; the caller hands it on by name."""
    return Segment(f"{PREFIX}{run_id}-{secrets.token_hex(6)}", nbytes)


_run_id = ""  # the run this process's segments belong to
_segments: list[Segment] = []  # the segments this process filled for it, reused once the writer frees them


def take_segment(run_id: str, nbytes: int) -> Segment:
    """A free segment of this process with room for ``nbytes``, marked BUSY: the caller
    fills ``seg.data`` and hands it to the writer by name (or marks it FREE on failure)."""
    global _run_id, _segments
    if run_id != _run_id:  # a new job on a long-lived worker: let the old run's maps go
        _run_id, _segments = run_id, []
    pid = owner_pid(f"{PREFIX}{run_id}-")
    if pid is not None and not pid_alive(pid):
        # The driver died (kill -9): a worker finishing its queue must not leave new
        # segments behind after the next run has cleaned up the old ones.
        raise RuntimeError(f"driver of run {run_id} is gone; not creating shared memory for it")
    for seg in _segments:
        if seg.free and seg.data.nbytes >= nbytes:
            seg.mark(BUSY)
            return seg
    # Room to grow, so it fits the next batches too (variable-length samples).
    seg = create_segment(run_id, max(nbytes + nbytes // 2, 1 << 20))
    seg.mark(BUSY)
    _segments.append(seg)
    return seg


def grow_segment(seg: Segment, nbytes: int) -> Segment:
    """``seg`` (BUSY, being filled) with room for ``nbytes`` of data: the file is extended
    and mapped again, in place of ``seg`` among this process's segments. Views of the old
    mapping stay valid and show the same pages, so samples already written stay put."""
    if seg.data.nbytes >= nbytes:
        return seg
    fd = os.open(os.path.join(SHM_DIR, seg.name), os.O_RDWR)
    try:
        os.ftruncate(fd, HEADER + max(nbytes, seg.data.nbytes + seg.data.nbytes // 2))
    finally:
        os.close(fd)
    new = Segment(seg.name)
    _segments[:] = [new if s is seg else s for s in _segments]
    return new


def abandon_segment(seg: Segment) -> None:
    """Never hand ``seg`` out again (a stuck decode thread may still write into it); the
    driver unlinks it with the rest of the run's segments."""
    if seg in _segments:
        _segments.remove(seg)


def pid_alive(pid: int) -> bool:
    """Whether a process with this pid exists (on this host)."""
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def remove_segments(run_id: str) -> list[str]:
    """Unlink every segment of one run (end of a job, success or failure)."""
    return unlink_shm(list_segments(run_id))


def owner_pid(segment: str) -> int | None:
    """Pid of the driver whose run made ``segment`` (from the run id in its name)."""
    try:
        return int(segment[len(PREFIX):].split("-", 1)[0].split("x", 1)[0], 16)
    except ValueError:
        return None


def stale_segments() -> list[str]:
    """Segments of runs whose driver process is gone."""
    return [n for n in list_segments() if (pid := owner_pid(n)) is not None and not pid_alive(pid)]


def remove_stale_segments() -> list[str]:
    """Unlink segments left by runs whose driver process is gone (e.g. after ``kill -9``)."""
    return unlink_shm(stale_segments())


def unlink_shm(names: list[str]) -> list[str]:
    """Unlink these files of ``/dev/shm``; the names of those that were there."""
    removed = []
    for name in names:
        with contextlib.suppress(FileNotFoundError):
            os.unlink(os.path.join(SHM_DIR, name))
            removed.append(name)
    return removed


def list_segments(run_id: str | None = None) -> list[str]:
    """Names of h5batch segments present now (of one run, or all)."""
    if not os.path.isdir(SHM_DIR):
        return []
    pre = f"{PREFIX}{run_id}-" if run_id else PREFIX
    return sorted(n for n in os.listdir(SHM_DIR) if n.startswith(pre))
