"""Disk space for the output's sample data, reserved before the writes that fill it.

Rule: when the writer creates (or resumes) an output, it reserves the bytes the plan
expects the samples to take (``WriterSpec.reserve_bytes``) past the file's end with
``fallocate(FALLOC_FL_KEEP_SIZE)``: the file's size, and so everything HDF5 sees, stays
as it is; the filesystem allocates the blocks at once, in a few large extents. When the
file is closed (finished or stopped), :func:`trim` gives back what the samples did not
fill (``ftruncate`` to the file's own size frees the blocks past it). A run killed before
that leaves the reservation past the end of the partial file; the run that resumes it
trims at its end.

Reason: with delayed allocation (ext4, XFS) every page written past the end of a file is
accounted and reserved one by one. Writing the 512 chunks of 1 MiB of the bench's
4,096-pair output into a fresh HDF5 file took 132 ms of CPU, against 93 ms with the
space reserved first (12 alternating pairs, pairwise 0.71x; `docs/benchmarks.md`,
fifteenth round), and the writer process is on a conversion's critical path.

Best effort: where ``fallocate`` is missing (not Linux), not supported by the
filesystem (``EOPNOTSUPP``: NFS, ZFS), or fails (``ENOSPC``: the disk cannot hold the
estimate), nothing is reserved and the writes allocate as they go; a disk that is
really full fails at the write, with the error that names it.
"""

from __future__ import annotations

import ctypes
import os

_KEEP_SIZE = 0x01  # FALLOC_FL_KEEP_SIZE (linux/falloc.h)
# Blocks beyond the size that are not worth a system call: a file's last block and the
# filesystem's own (an extent tree) count in st_blocks too.
_SLACK = 1 << 16


def _libc_fallocate():
    """glibc's ``fallocate64`` (64-bit offsets everywhere), or None where there is none."""
    try:
        libc = ctypes.CDLL(None, use_errno=True)
        f = getattr(libc, "fallocate64", None) or libc.fallocate
    except (OSError, AttributeError):
        return None
    f.argtypes = (ctypes.c_int, ctypes.c_int, ctypes.c_int64, ctypes.c_int64)
    f.restype = ctypes.c_int
    return f


def reserve(path: str, nbytes: int) -> bool:
    """Reserve ``nbytes`` past the end of the file at ``path``, its size unchanged; True
    when the filesystem did (see the module: False is not an error)."""
    if nbytes <= 0 or not hasattr(os, "O_CLOEXEC"):
        return False
    fallocate = _libc_fallocate()
    if fallocate is None:
        return False
    fd = os.open(path, os.O_RDWR | os.O_CLOEXEC)
    try:
        return fallocate(fd, _KEEP_SIZE, os.fstat(fd).st_size, nbytes) == 0
    finally:
        os.close(fd)


def trim(path: str) -> None:
    """Free the blocks past the end of the file at ``path`` (what :func:`reserve` set
    aside and the writes did not use); the file's bytes and size are unchanged."""
    try:
        fd = os.open(path, os.O_RDWR | os.O_CLOEXEC)
    except FileNotFoundError:
        return
    try:
        st = os.fstat(fd)
        if st.st_blocks * 512 >= st.st_size + _SLACK:
            os.ftruncate(fd, st.st_size)
    finally:
        os.close(fd)
