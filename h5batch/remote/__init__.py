"""Object storage: ``s3://bucket/key`` outputs and inputs (the ``s3`` extra: obstore).

* :mod:`.client`: one object's client (ranged GETs, HEAD, upload), retries, errors naming
  the URL and byte range, credentials never in a message.
* :mod:`.helper`: the helper process that makes the requests of a reader's main process
  (its DataLoader workers then fork).
* :mod:`.upload`: a finished local output uploaded as one multipart upload.
* :mod:`.cache`: the node-local chunk cache shared by every process of a node.
* :mod:`.rfile`: the file object h5py reads a remote file through.

Only ``s3://`` is understood; any other scheme is refused by the callers (exit 2).
"""

from __future__ import annotations

import os
import re

_URL = re.compile(r"([A-Za-z][A-Za-z0-9+.-]+)://")


def scheme(path: str | os.PathLike[str] | None) -> str | None:
    """The scheme of ``path`` when it is a URL (``s3``, ``gs``, ``https``), else None."""
    m = _URL.match(os.fspath(path) if path is not None else "")
    return m.group(1).lower() if m else None


def is_s3(path: str | os.PathLike[str] | None) -> bool:
    return scheme(path) == "s3"


def split_url(url: str) -> tuple[str, str]:
    """``s3://bucket/a/b.h5`` -> ``("bucket", "a/b.h5")``; ValueError for anything else."""
    m = re.fullmatch(r"s3://([^/]{3,})/(.+)", url)
    if not m:
        raise ValueError(f"{url!r}: expected s3://BUCKET/KEY (bucket names have 3+ characters)")
    return m.group(1), m.group(2)


def cache_root() -> str:
    """``$H5BATCH_CACHE_DIR``, else ``~/.cache/h5batch``: the node cache and the staging
    folders of ``s3://`` outputs."""
    return os.path.expanduser(os.environ.get("H5BATCH_CACHE_DIR") or "~/.cache/h5batch")


def sibling(url: str, suffix: str) -> str:
    """The URL of ``OUT.<suffix>`` beside ``OUT.h5`` (rejects, warnings)."""
    base = url[:-3] if url.endswith(".h5") else url
    return base + suffix


__all__ = ["cache_root", "is_s3", "scheme", "sibling", "split_url"]
