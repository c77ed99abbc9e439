"""Deciding whether a partial output can be continued.

A commit record (``OUT.partial.commit.json``) is written only after the HDF5 file was
flushed and fsync'ed and the rows of each partial last chunk were saved to a tail file
(``OUT.partial.tail-N.npz``), so every sample it counts is on disk. Before resuming we
still check the partial file opens, holds at least the committed rows, the tail file
matches, and re-verify the checksums of the last committed samples in the file: a
partial file that fails is started over, never continued.
"""

from __future__ import annotations

import zlib

import h5py
import hdf5plugin  # noqa: F401  (the filters that read a partial's samples back)
import numpy as np

from .. import format as fmt
from .commit import CommitRecord, load_tails

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
