"""An output replaced whole by a copy made beside it, all or nothing: how ``h5batch view``
and ``h5batch compact`` change a finished file (:mod:`.views`, :mod:`.compact`).

Rule: the output itself is never written. Under the output's lock
(:mod:`h5batch.conversion.lock`, so no conversion, sync or other such command works on it
meanwhile), and once a sync that was interrupted is undone (a half-synced file is never
copied: the journal left beside it would later be rolled back onto the copy), the caller
writes and checks a copy at ``OUT<suffix>``; only then is the copy
fsync'ed, renamed over ``OUT`` (atomic) and the folder fsync'ed. Reason: appending to a
finished HDF5 file in place rewrites metadata blocks in no particular order, and a crash or a
full disk in the middle can leave the whole file unreadable. A crash before the rename
leaves ``OUT`` as it was (the next run removes the stale copy); readers that have ``OUT`` open
keep reading the file they opened (its old inode).
"""

from __future__ import annotations

import contextlib
import os
import secrets
from collections.abc import Callable, Iterator

__all__ = ["replaced"]


@contextlib.contextmanager
def replaced(path: str, suffix: str, owner: str, say: Callable[[str], None] = lambda _t: None) -> Iterator[str]:
    """The place of ``path``'s copy (``path + suffix``), the output's lock held by
    ``owner`` (a command's name); the block writes and checks the copy there. When the block
    ends normally the copy replaces ``path`` (see the module docstring); however it ends,
    a copy still there is removed and the lock released."""
    from ..conversion.lock import OutputLock
    from ..conversion.sync import recover
    from ..writer.journal import fsync_folder, fsync_path

    lock = OutputLock.acquire(path, f"{owner}-{secrets.token_hex(4)}", say)
    tmp = path + suffix
    try:
        recover(path, say)
        if os.path.exists(tmp):
            os.unlink(tmp)
            say(f"removed {tmp}, left by an interrupted {owner}")
        yield tmp
        fsync_path(tmp)
        os.replace(tmp, path)
        try:
            fsync_folder(path)
        except OSError:
            pass  # some file systems cannot fsync a folder
    finally:
        if os.path.exists(tmp):
            os.unlink(tmp)
        lock.release()

