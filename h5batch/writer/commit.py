"""The durable-commit protocol: what a commit record says, and how it reaches the disk.

A commit makes everything written so far durable. Order matters for a crash at any
moment: the HDF5 file is flushed and fsync'ed, the rows of each partial last chunk go to a
new tail file ``<partial>.tail-<N>.npz`` (fsync'ed), and only then the commit record
``<partial>.commit.json``, naming that tail file, atomically replaces the previous one
(write a temporary file, fsync, rename, fsync the folder). A crash before the rename leaves
the previous commit in force; after it, the new one. Data covered by a commit is never
rewritten: the writer only appends, and the file is created with a free-space strategy
that never reuses freed space.

A later run with the same job and manifest resumes from the record: it cuts every dataset
back to the committed counts and takes the tail rows back. Before that, :func:`check_partial`
still checks that the partial file opens, holds at least the committed rows, that the tail
file matches, and re-verifies the checksums of the last committed samples in the file: a
partial file that fails is started over, never continued.
"""

from __future__ import annotations

import contextlib
import json
import os
import time
import zlib
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from typing import IO, Any

import h5py
import hdf5plugin  # noqa: F401  (the filters that read a partial's samples back)
import numpy as np

from .. import format as fmt
from ..codecs import CodecSpec
from .journal import fsync_folder


@dataclass(frozen=True)
class SplitProgress:
    """What is durable of one split: ``samples`` stored; per variable-length field the
    ``elements`` of its values; per field the data ``rows_in_file`` (the rest of the last
    chunk's rows live in the tail file)."""

    samples: int
    elements: dict[str, int] = field(default_factory=dict)
    rows_in_file: dict[str, int] = field(default_factory=dict)


@dataclass(frozen=True)
class CommitRecord:
    """The content of ``<partial>.commit.json``; :meth:`to_dict` is its JSON form."""

    job_hash: str
    manifest_hash: str
    next_batch: int  # batches [0, next_batch) are stored
    batch_size: int  # items per batch: a resume must cut the rest the same way
    codecs: dict[str, CodecSpec]  # per field, as the datasets were created
    codec_notes: dict[str, str]  # why auto chose each codec
    rejects: int  # rows of the rejects table that are durable
    bytes: int  # decoded bytes stored
    splits: dict[str, SplitProgress]
    tail_file: str  # name (in the partial's folder) of this commit's tail file
    number: int  # 1 for a run's first commit; a resumed run goes on counting
    time: float = field(default_factory=time.time)

    def to_dict(self) -> dict[str, Any]:
        return {**asdict(self), "codecs": {n: [c.name, c.level, c.shuffle] for n, c in self.codecs.items()}}

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> CommitRecord:
        """The record of a JSON object; ``ValueError`` when a key is missing or mistyped."""
        try:
            return cls(
                job_hash=str(d["job_hash"]), manifest_hash=str(d["manifest_hash"]),
                next_batch=int(d["next_batch"]), batch_size=int(d["batch_size"]),
                codecs={str(n): CodecSpec(str(v[0]), None if v[1] is None else int(v[1]), bool(v[2]))
                        for n, v in d["codecs"].items()},
                codec_notes={str(k): str(v) for k, v in d.get("codec_notes", {}).items()},
                rejects=int(d["rejects"]), bytes=int(d.get("bytes", 0)),
                splits={str(s): SplitProgress(int(p["samples"]), {k: int(v) for k, v in p["elements"].items()},
                                              {k: int(v) for k, v in p["rows_in_file"].items()})
                        for s, p in d["splits"].items()},
                tail_file=str(d["tail_file"]), number=int(d["number"]), time=float(d.get("time", 0.0)),
            )
        except (KeyError, TypeError, ValueError, IndexError, AttributeError) as e:
            raise ValueError(f"not a commit record: {type(e).__name__}: {e}") from None

    def write(self, partial_path: str) -> None:
        """Replace the partial's commit record by this one, atomically and durably."""
        path = commit_path(partial_path)
        _write_durably(path, "w", lambda fh: json.dump(self.to_dict(), fh, sort_keys=True, indent=1))
        fsync_folder(path)

    @classmethod
    def read(cls, partial_path: str) -> CommitRecord | None:
        """The partial's commit record; None when there is none or it cannot be parsed."""
        try:
            with open(commit_path(partial_path)) as fh:
                return cls.from_dict(json.load(fh))
        except (OSError, ValueError):
            return None


def save_tails(partial_path: str, number: int, tails: dict[str, np.ndarray]) -> str:
    """Write commit ``number``'s tail file durably; return its name."""
    name = f"{os.path.basename(partial_path)}.tail-{number}.npz"
    _write_durably(os.path.join(os.path.dirname(partial_path), name), "wb", lambda fh: np.savez(fh, **tails))
    return name


def remove_commit_files(partial_path: str) -> None:
    """The partial's commit record and every tail file (the partial itself is not touched)."""
    with contextlib.suppress(FileNotFoundError):
        os.unlink(commit_path(partial_path))
    remove_tail_files(partial_path)


def commit_path(partial_path: str) -> str:
    return partial_path + ".commit.json"


def _write_durably(path: str, mode: str, write: Callable[[IO[Any]], None]) -> None:
    """``write`` the content of ``path`` into a temporary file, fsync it, rename it over."""
    tmp = path + ".tmp"
    with open(tmp, mode) as fh:
        write(fh)
        fh.flush()
        os.fsync(fh.fileno())
    os.replace(tmp, path)


def load_tails(partial_path: str, record: CommitRecord) -> dict[str, np.ndarray]:
    """The partial-chunk rows saved with a commit (``{"split/field": rows}``)."""
    path = os.path.join(os.path.dirname(partial_path), record.tail_file)
    with np.load(path) as z:
        return {k: z[k] for k in z.files}


def remove_tail_files(partial_path: str, keep: str | None = None) -> None:
    """Delete tail files of older commits (or all of them)."""
    folder, base = os.path.split(partial_path)
    for name in os.listdir(folder or "."):
        if name.startswith(base + ".tail-") and name != keep:
            with contextlib.suppress(FileNotFoundError):
                os.unlink(os.path.join(folder, name))


TAIL_SAMPLES = 256  # samples re-checked at the end of each split


def _sample(node, i: int) -> np.ndarray:
    if isinstance(node, h5py.Group):  # variable-length field
        a, b = node[fmt.OFFSETS][i], node[fmt.OFFSETS][i + 1]
        return node[fmt.VALUES][a:b]
    return node[i]


def _in_file(node, n: int, rows: int) -> int:
    """How many of the first ``n`` samples lie wholly in the file's ``rows`` data rows."""
    if isinstance(node, h5py.Group):
        offsets = node[fmt.OFFSETS][: n + 1]
        return int(np.searchsorted(offsets[1:], rows, side="right"))
    return min(n, rows)


def check_partial(path: str, record: CommitRecord, fields: tuple[str, ...]) -> str | None:
    """None when ``path`` can be resumed from ``record``, else the reason it cannot."""
    try:
        tails = load_tails(path, record)
    except (OSError, KeyError, ValueError) as e:
        return f"its tail file is missing or unreadable: {e}"
    try:
        f = h5py.File(path, "r")
    except Exception as e:
        return f"cannot open it: {e}"
    try:
        for split, info in record.splits.items():
            if split not in f:
                return f"split {split!r} missing"
            g = f[split]
            n = info.samples
            if g[fmt.SOURCE].shape[0] < n or g[fmt.CHECKSUM].shape[0] < n:
                return f"split {split!r} holds fewer samples than committed ({n})"
            for k, name in enumerate(fields):
                if name not in g:
                    return f"field {split}/{name} missing"
                node = g[name]
                rows = info.rows_in_file[name]
                data = node[fmt.VALUES] if isinstance(node, h5py.Group) else node
                if data.id.get_create_plist().get_alloc_time() == h5py.h5d.ALLOC_TIME_EARLY:
                    # Only h5batch before the one-writer rule made these: its decoders
                    # wrote rows into chunks placed ahead, which a resume cannot tell apart.
                    return (f"field {split}/{name} has chunks placed ahead by an older h5batch's "
                            f"decoders, which cannot be resumed")
                if data.shape[0] < rows:
                    return f"field {split}/{name} holds {data.shape[0]} rows, committed {rows}"
                tail = tails.get(f"{split}/{name}")
                expected_tail = (info.elements[name] if isinstance(node, h5py.Group) else n) - rows
                if (0 if tail is None else len(tail)) != expected_tail:
                    return f"tail of {split}/{name} does not match the commit"
                last = _in_file(node, n, rows)
                sums = g[fmt.CHECKSUM][max(0, last - TAIL_SAMPLES):last, k]
                for j, i in enumerate(range(max(0, last - TAIL_SAMPLES), last)):
                    sample = np.ascontiguousarray(_sample(node, i))
                    if zlib.crc32(sample.reshape(-1).view(np.uint8)) != int(sums[j]):
                        return f"checksum mismatch at {split}/{name}[{i}]"
    except Exception as e:
        return f"unreadable: {type(e).__name__}: {e}"
    finally:
        f.close()
    return None
