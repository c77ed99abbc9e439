"""Read-ahead for a batch whose files are not in the page cache.

Rule: before a batch decodes, its first and last files are checked with a read that may not
wait (``RWF_NOWAIT``); when either is not in the page cache, the kernel is asked to start
reading every file of the batch (``POSIX_FADV_WILLNEED``), so reads from the disk overlap
the decoding instead of waiting one file at a time. Reason: with the page cache cold, a
decoder otherwise waits for the disk once per file, and a cold conversion is then bound by
those waits, not by the decoding; a warm batch costs two opens.
Nothing here reads sample data or can fail a batch: what cannot be hinted is left to the decode.
"""

from __future__ import annotations

import os
import stat

from ..batches import BatchTask

# How much of each file of a batch the kernel is asked to read ahead (:func:`prefetch`): all of a
# clip or photo, the start of a long recording (which is then read block by block).
PREFETCH_BYTES = 8 << 20


def in_page_cache(path: str) -> bool | None:
    """Whether the last byte of ``path`` is in the page cache (a read with ``RWF_NOWAIT``
    succeeds), False when it is not, None when this cannot tell (no such flag, not a
    regular file, an error: the decode reports those)."""
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK)
    except OSError:
        return None
    try:
        st = os.fstat(fd)
        if not stat.S_ISREG(st.st_mode) or st.st_size == 0:
            return None
        return os.preadv(fd, [bytearray(1)], st.st_size - 1, os.RWF_NOWAIT) == 1
    except BlockingIOError:
        return False
    except (OSError, AttributeError):  # no RWF_NOWAIT here, or the file system refuses it
        return None
    finally:
        os.close(fd)


def prefetch(root: str, items: list) -> None:
    """Ask the kernel to start reading every file of a batch (``POSIX_FADV_WILLNEED``; see
    the module). BEWARE: inline, before the decoding, not on a thread of its own: a thread
    that goes in and out of the GIL per file makes the decode thread hand the GIL over each
    time. Non-blocking open and regular files only: a FIFO or a device named like a sample
    must not hang the batch (the decode rejects it)."""
    for item in items:
        for rel in item[0]:
            try:
                fd = os.open(os.path.join(root, rel), os.O_RDONLY | os.O_NONBLOCK)
            except OSError:
                continue  # the decode names what is wrong with it
            try:
                if stat.S_ISREG(os.fstat(fd).st_mode):
                    os.posix_fadvise(fd, 0, PREFETCH_BYTES, os.POSIX_FADV_WILLNEED)
            except OSError:
                pass
            finally:
                os.close(fd)


def hint(task: BatchTask) -> None:
    """:func:`prefetch` the batch's files unless its first and last files are both in the
    page cache: a warm corpus skips the open per file."""
    if not hasattr(os, "posix_fadvise") or not task.items:
        return
    first, last = task.items[0][0], task.items[-1][0]
    if not first or not last:
        return  # annotation values only: nothing to read
    if not all(in_page_cache(os.path.join(task.root, rel)) for rel in (first[0], last[-1])):
        prefetch(task.root, task.items)
