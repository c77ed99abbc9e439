"""One owner per output: a lock beside it, taken before anything is created or removed.

Two runs writing one output lose it: the second calls the first's partial untrustworthy
and replaces it, the first renames a file that is no longer its own. So every run that may
create, resume, discard or rename ``X.h5`` first takes ``X.h5.lock``, and a second run on
the same output refuses at once with one line naming the owner.

How:

* ``flock(LOCK_EX | LOCK_NB)`` on ``X.h5.lock``. The lock belongs to the open file, so the
  kernel releases it when every process holding the file is gone: a run killed with
  ``kill -9`` or lost in a power cut leaves no lock, only the file, whose content says who
  had it. The next run takes it over and says so.
* The writer process is handed the same open file (its descriptor travels when the
  process starts), so a writer still committing after its driver was killed keeps the
  output locked until it is done; a new run waits for it a little, then refuses.
* The file holds one JSON line (pid, host, run id, start time, working directory) and is
  removed when the run ends.

Shared file systems: on NFS, Linux turns ``flock`` into a POSIX lock the server keeps, which
works between hosts. Where the file system has no locks at all (``ENOLCK``, ``EOPNOTSUPP``;
some Lustre mounts without ``-o flock``), h5batch falls back to creating the lock file
exclusively (``O_EXCL``): a lock file whose pid is gone *on this host* is taken over; one
from another host is refused until someone removes it (h5batch cannot see that host's
processes). ``docs/faults.md`` has the table.
"""

from __future__ import annotations

import contextlib
import errno
import fcntl
import json
import os
import socket
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass
from datetime import datetime

from ..errors import EXIT_BUSY, ConvertError
from ..transport.segments import pid_alive

WAIT_FOR_ORPHAN_SECONDS = 30.0  # a writer whose driver died commits and exits within this
NO_LOCKS = (errno.ENOLCK, errno.EOPNOTSUPP, errno.ENOSYS, errno.EINVAL)  # a file system without locks


@dataclass(frozen=True)
class Owner:
    """Who holds an output's lock (the lock file's content)."""

    pid: int
    host: str
    run_id: str
    since: float
    cwd: str = ""

    def describe(self) -> str:
        when = datetime.fromtimestamp(self.since).strftime("%H:%M:%S") if self.since else "?"
        return f"pid {self.pid} on host {self.host} since {when}"

    @classmethod
    def parse(cls, text: str) -> Owner | None:
        try:
            d = json.loads(text)
            return cls(int(d["pid"]), str(d["host"]), str(d.get("run_id", "")), float(d.get("since", 0)),
                       str(d.get("cwd", "")))
        except (ValueError, KeyError, TypeError):
            return None


def lock_path(final_path: str) -> str:
    return final_path + ".lock"


class OutputLock:
    """The lock of one output. Use :meth:`acquire`; :meth:`release` removes it."""

    def __init__(self, final_path: str, fd: int, exclusive_file: bool):
        self.path = lock_path(final_path)
        self.final = final_path
        self.fd = fd  # the writer process holds it too (see the module docstring)
        self.exclusive_file = exclusive_file  # the fallback: no kernel lock behind it

    @classmethod
    def acquire(cls, final_path: str, run_id: str, say: Callable[[str], None]) -> OutputLock:
        """Take the lock of ``final_path`` or raise :class:`ConvertError` (exit code
        :data:`~h5batch.errors.EXIT_BUSY`) naming its owner."""
        path = lock_path(final_path)
        os.makedirs(os.path.dirname(path) or ".", exist_ok=True)
        me = Owner(os.getpid(), socket.gethostname(), run_id, time.time(), os.getcwd())
        deadline = time.monotonic() + WAIT_FOR_ORPHAN_SECONDS
        while True:
            fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o644)
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except BlockingIOError:
                owner = _read_owner(fd)
                os.close(fd)
                if owner is not None and owner.host == me.host and not pid_alive(owner.pid) \
                        and time.monotonic() < deadline:
                    # Its driver is dead but the file is still locked: its writer is
                    # committing what it had. It exits within moments.
                    time.sleep(0.2)
                    continue
                raise ConvertError(_busy(final_path, owner), EXIT_BUSY) from None
            except OSError as e:
                os.close(fd)
                if e.errno in NO_LOCKS:
                    return cls._acquire_exclusive(final_path, me, say)
                raise
            if not _same_file(fd, path):
                os.close(fd)  # removed and re-created by its owner meanwhile: try the new one
                continue
            previous = _read_owner(fd)
            if previous is not None and previous.run_id != me.run_id:
                say(f"taking over the lock of {final_path} left by {previous.describe()} (no longer running)")
            _write_owner(fd, me)
            return cls(final_path, fd, exclusive_file=False)

    @classmethod
    def _acquire_exclusive(cls, final_path: str, me: Owner, say: Callable[[str], None]) -> OutputLock:
        """The fallback where the file system has no locks: an exclusively created file."""
        path = lock_path(final_path)
        for _ in range(2):
            try:
                fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_EXCL | os.O_CLOEXEC, 0o644)
            except FileExistsError:
                with open(path) as fh:
                    owner = Owner.parse(fh.read())
                if owner is not None and owner.host == me.host and not pid_alive(owner.pid):
                    say(f"taking over the lock of {final_path} left by {owner.describe()} (no longer running)")
                    os.unlink(path)
                    continue
                raise ConvertError(_busy(final_path, owner) + f" (this file system has no locks: if that "
                                   f"run is gone, remove {path})", EXIT_BUSY) from None
            _write_owner(fd, me)
            return cls(final_path, fd, exclusive_file=True)
        raise ConvertError(f"{path}: could not be taken", EXIT_BUSY)

    def release(self) -> None:
        """Remove the lock file and drop the lock (idempotent)."""
        if self.fd < 0:
            return
        with contextlib.suppress(OSError):
            if _same_file(self.fd, self.path):
                os.unlink(self.path)  # while still locked: a waiting run then sees it vanish
        os.close(self.fd)
        self.fd = -1


def _busy(final_path: str, owner: Owner | None) -> str:
    who = owner.describe() if owner else "another run"
    return f"{final_path} is being written by {who}; wait for it or stop it"


def _read_owner(fd: int) -> Owner | None:
    try:
        os.lseek(fd, 0, os.SEEK_SET)
        return Owner.parse(os.read(fd, 4096).decode(errors="replace"))
    except OSError:
        return None


def _write_owner(fd: int, owner: Owner) -> None:
    data = (json.dumps(asdict(owner), sort_keys=True) + "\n").encode()
    os.ftruncate(fd, 0)
    os.pwrite(fd, data, 0)


def _same_file(fd: int, path: str) -> bool:
    """Whether ``path`` still names the file ``fd`` has open."""
    try:
        a, b = os.fstat(fd), os.stat(path)
    except OSError:
        return False
    return (a.st_dev, a.st_ino) == (b.st_dev, b.st_ino)
