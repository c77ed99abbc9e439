"""Warnings from decoders: caught per file on the workers, counted in the summary, and
written to ``OUT.warnings.txt`` beside the output, never onto the console.

Reason: Python warnings (Pillow's ``Tag data larger than file``) and native libraries'
writes to fd 2 (libmpg123, libtiff) are hundreds of raw lines on an odd corpus, drowning the
progress output and naming no file.

Worker side (:func:`batch`, :func:`watch`, :func:`take`): while a batch decodes, fd 2 points
at an unlinked temporary file (one ``dup2`` per batch, reference-counted); :func:`watch`
records each file's Python warnings (``always``, except deprecation kinds, which are about
code) and the fd 2 bytes written during its decode. Dask's and Tornado's log lines, and
anything written between files, go on to the real stderr at batch end. :func:`take` hands
the messages per file to the :class:`~h5batch.batches.BatchResult`.

BEWARE: fd 2 and warning filters are per process (no thread-local ``catch_warnings`` before
Python 3.14). With several worker threads, or an abandoned hung decode still running, a
message can be attributed to another file decoding at the same moment.

The trial decode (``conversion/trial.py``) drops what it gathers: the batches decode those
files again and report them.

Driver side: :class:`WarningLog` appends one line per file (``path<TAB>messages``, joined by
`` | ``) and counts the files.
"""

from __future__ import annotations

import contextlib
import os
import re
import sys
import tempfile
import threading
import warnings
from collections import Counter
from collections.abc import Iterable, Iterator

_QUIET = (DeprecationWarning, PendingDeprecationWarning, ImportWarning)
# Inside a decode: every occurrence of a warning is recorded, except the deprecation kinds.
_FILTERS = [("ignore", None, c, None, 0) for c in _QUIET] + [("always", None, Warning, None, 0)]
# Log records of the worker's own machinery (Dask's default format, or a bare logger name).
_FOREIGN = re.compile(rb"^(\d{4}-\d\d-\d\d \d\d:\d\d:\d\d,\d+ - )?(distributed|dask|tornado|asyncio|bokeh)[.: -]")
_MAX_BYTES = 1 << 16  # of one file's native output kept in the log

_lock = threading.Lock()
_found: dict[str, list[str]] = {}  # relative path -> messages, until its batch takes them


class _Redirect:
    """fd 2 of this process pointed at a temporary file while batches decode."""

    def __init__(self) -> None:
        self.users = 0
        self.generation = 0  # bumped at every redirect, so a late reader sees it is stale
        self.saved: int | None = None  # the real stderr
        self.file = None
        self.claimed: list[tuple[int, int]] = []  # byte ranges attributed to files

    def __enter__(self) -> None:
        with _lock:
            if self.users == 0:
                _flush_stderr()
                _found.clear()  # left over from a decode abandoned in an earlier batch
                self.file = tempfile.TemporaryFile(prefix="h5batch-stderr-")
                self.saved = os.dup(2)
                os.dup2(self.file.fileno(), 2)
                self.generation += 1
                self.claimed = []
            self.users += 1

    def __exit__(self, *exc: object) -> None:
        with _lock:
            self.users -= 1
            if self.users:
                return
            _flush_stderr()
            os.dup2(self.saved, 2)  # type: ignore[arg-type]
            os.close(self.saved)  # type: ignore[arg-type]
            self.saved = None
            self.generation += 1
            try:
                self._forward_unclaimed()
            finally:
                self.file.close()  # type: ignore[union-attr]
                self.file = None

    def _forward_unclaimed(self) -> None:
        """Write what fd 2 received outside any file's decode to the real stderr."""
        size = os.fstat(self.file.fileno()).st_size  # type: ignore[union-attr]
        pos = 0
        for lo, hi in sorted(self.claimed) + [(size, size)]:
            if lo > pos:
                _write_all(2, os.pread(self.file.fileno(), lo - pos, pos))  # type: ignore[union-attr]
            pos = max(pos, hi)

    def mark(self) -> tuple[int, int] | None:
        """``(generation, offset)`` of fd 2 now, or None when it is not redirected."""
        with _lock:
            if self.users == 0:
                return None
            return self.generation, os.lseek(2, 0, os.SEEK_CUR)

    def since(self, mark: tuple[int, int] | None) -> list[str]:
        """The lines fd 2 received since ``mark`` (claimed for the file decoded meanwhile);
        Dask's own log records among them go to the real stderr."""
        if mark is None:
            return []
        _flush_stderr()
        with _lock:
            if self.users == 0 or self.generation != mark[0]:
                return []  # the batch ended meanwhile (an abandoned decode finishing late)
            start, end = mark[1], os.lseek(2, 0, os.SEEK_CUR)
            if end <= start:
                return []
            self.claimed.append((start, end))
            data = os.pread(self.file.fileno(), min(end - start, _MAX_BYTES), start)  # type: ignore[union-attr]
            lines = []
            for line in data.splitlines():
                if _FOREIGN.match(line):
                    _write_all(self.saved, line + b"\n")  # type: ignore[arg-type]
                elif line.strip():
                    lines.append(line.decode("utf-8", "replace").strip())
        return lines


_fd2 = _Redirect()


def _flush_stderr() -> None:
    with contextlib.suppress(Exception):  # a replaced or closed sys.stderr
        sys.stderr.flush()


def _write_all(fd: int, data: bytes) -> None:
    with contextlib.suppress(OSError):
        while data:
            data = data[os.write(fd, data):]


def batch() -> _Redirect:
    """While a batch decodes (``with batch():``): fd 2 of this process goes to a temporary
    file, from which :func:`watch` takes each file's lines."""
    return _fd2


@contextlib.contextmanager
def watch(rel: str) -> Iterator[None]:
    """Around the decode of one file (``rel``, the path a reject or the log names): its
    Python warnings and native stderr lines are kept for :func:`take`, even when the
    decode fails."""
    mark = _fd2.mark()
    caught: list[warnings.WarningMessage] = []
    try:
        with warnings.catch_warnings(record=True) as caught:  # type: ignore[assignment]
            warnings.filters[:] = _FILTERS  # the copy catch_warnings restores (3x cheaper than simplefilter)
            yield
    finally:
        messages = [f"{w.category.__name__}: {w.message}" for w in caught] + _fd2.since(mark)
        if messages:
            with _lock:
                _found.setdefault(rel, []).extend(messages)


def take(paths: Iterable[str]) -> list[tuple[str, str]]:
    """``(path, messages)`` for each of ``paths`` whose decode warned, in their order;
    a message repeated is written once, with its count."""
    out = []
    with _lock:
        for rel in paths:
            got = _found.pop(rel, None)
            if got:
                out.append((rel, _join(got)))
    return out


def _join(messages: list[str]) -> str:
    counts = Counter(messages)
    return " | ".join(m if n == 1 else f"{m} (x{n})" for m, n in counts.items())


class WarningLog:
    """The driver's log of decoder warnings beside the output: ``path<TAB>messages`` per
    file, appended as batches are stored. A fresh run starts it empty; a resumed run keeps
    the earlier run's lines and skips a file already listed (a batch stored but not
    committed before a crash is decoded again)."""

    def __init__(self, path: str, resume: bool):
        self.path = path
        self.listed: set[str] = set()
        if resume and os.path.exists(path):
            with open(path, encoding="utf-8") as fh:
                self.listed = {line.split("\t", 1)[0] for line in fh if line.strip()}
        elif os.path.exists(path):
            os.unlink(path)  # an earlier run's list says nothing about this one

    def add(self, found: Iterable[tuple[str, str]]) -> None:
        """Append the lines of one stored batch (opened per batch: nothing stays open when
        the run stops on an error)."""
        lines = []
        for rel, text in found:
            if rel not in self.listed:
                lines.append(f"{rel}\t{' '.join(text.split())}\n")
                self.listed.add(rel)
        if lines:
            os.makedirs(os.path.dirname(os.path.abspath(self.path)), exist_ok=True)
            with open(self.path, "a", encoding="utf-8") as fh:
                fh.writelines(lines)

    @property
    def files(self) -> int:
        """Files listed (this run's and, when resumed, the earlier run's)."""
        return len(self.listed)
