"""Deciding whether a partial output can be continued.

A commit record (``OUT.partial.commit.json``) is written only after the HDF5 file was
flushed and fsync'ed, so every sample it counts is on disk. Before resuming we still
check the partial file opens and holds at least the committed counts, and re-verify the
checksums of the last committed samples: a partial file that fails is started over,
never continued.
"""

from __future__ import annotations

import zlib
from typing import Any

import numpy as np

from . import format as fmt

TAIL_SAMPLES = 256  # samples re-checked at the end of each split


def _sample(g, name: str, i: int) -> np.ndarray:
    node = g[name]
    if isinstance(node, type(g)):  # variable-length field group
        a, b = node[fmt.OFFSETS][i], node[fmt.OFFSETS][i + 1]
        return node[fmt.VALUES][a:b]
    return node[i]


def check_partial(path: str, record: dict[str, Any], fields: tuple[str, ...]) -> str | None:
    """None when ``path`` can be resumed from ``record``, else the reason it cannot."""
    import h5py
    import hdf5plugin  # noqa: F401  (plugin codecs)

    try:
        f = h5py.File(path, "r")
    except Exception as e:
        return f"cannot open it: {e}"
    try:
        for split, info in record["splits"].items():
            if split not in f:
                return f"split {split!r} missing"
            g = f[split]
            n = info["samples"]
            if g[fmt.SOURCE].shape[0] < n or g[fmt.CHECKSUM].shape[0] < n:
                return f"split {split!r} holds fewer samples than committed ({n})"
            sums = g[fmt.CHECKSUM][max(0, n - TAIL_SAMPLES):n]
            for j, i in enumerate(range(max(0, n - TAIL_SAMPLES), n)):
                for k, name in enumerate(fields):
                    if name not in g:
                        return f"field {split}/{name} missing"
                    data = np.ascontiguousarray(_sample(g, name, i))
                    if zlib.crc32(data.reshape(-1).view(np.uint8)) != int(sums[j, k]):
                        return f"checksum mismatch at {split}/{name}[{i}]"
    except Exception as e:
        return f"unreadable: {type(e).__name__}: {e}"
    finally:
        f.close()
    return None
