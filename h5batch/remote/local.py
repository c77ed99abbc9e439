"""The command-line tools on an ``s3://`` output: a whole local copy in the node cache.

``inspect``, ``verify``, ``preview``, ``export`` and :func:`h5batch.hf.to_dataset` read
every sample or most of the file's structure, so the simplest correct way is the file itself:
:func:`local_copy` downloads it once per node and version (``<cache>/objects/<id>/whole.h5``,
keyed by URL, ETag and size; under a lock, published with ``os.replace``) and the tool runs
on that path. ``sync``, ``compact`` and ``view add``/``remove`` change a file: on an
``s3://`` path they exit 2 saying to work on a local copy (:data:`CHANGING`).

A sharded output's shards are the objects beside it: each gets a whole copy of its own (keyed
by its own ETag, so a replaced shard is copied again and the tool sees the change) and a
symbolic link under its recorded name beside the output's copy, where HDF5 and the tools look
for it. A missing shard object is a :class:`~h5batch.errors.RemoteError` naming its URL.
"""

from __future__ import annotations

import fcntl
import os
from typing import Any

from ..errors import RemoteError
from . import cache_root, is_s3
from .cache import ObjectCache
from .rfile import open_object

READING = {"inspect", "verify", "preview", "export"}
CHANGING = {"compact", "view"}
STEP = 64 << 20  # bytes per ranged GET of the copy


def local_copy(url: str, storage_options: dict[str, Any] | None = None, cache_dir: str | None = None) -> str:
    """The path of a complete local copy of ``url`` (downloaded if this node has none), its
    shards' copies linked beside it for a sharded output (module docstring)."""
    obj: ObjectCache = open_object(url, storage_options, cache_dir or cache_root())
    path = _whole(obj)
    for name in _shard_names(path):
        shard_url = f"{url.rsplit('/', 1)[0]}/{name}"
        try:
            shard = open_object(shard_url, storage_options, cache_dir or cache_root())
        except FileNotFoundError:
            raise RemoteError(shard_url, f"no such object: a shard of {url} (its shard objects must stay "
                                         f"beside it)") from None
        tmp = f"{os.path.join(obj.dir, name)}.tmp.{os.getpid()}"
        os.symlink(_whole(shard), tmp)
        os.replace(tmp, os.path.join(obj.dir, name))
    return path


def _shard_names(path: str) -> list[str]:
    """The recorded shard file names of the output at ``path`` (none for one file)."""
    import h5py

    from .. import shards

    with h5py.File(path, "r") as f:
        return [r.path for r in shards.records(f)] if shards.is_sharded(f) else []


def _whole(obj: ObjectCache) -> str:
    """``obj``'s whole copy in its cache folder, downloaded under a lock if not there yet."""
    path = os.path.join(obj.dir, "whole.h5")
    if os.path.exists(path):
        return path
    fd = os.open(path + ".lock", os.O_CREAT | os.O_RDWR, 0o644)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX)
        if not os.path.exists(path):
            tmp = f"{path}.tmp.{os.getpid()}"
            with open(tmp, "wb") as f:
                for lo in range(0, obj.size, STEP):
                    f.write(obj.client.get(lo, min(obj.size, lo + STEP), obj.etag))
            os.replace(tmp, path)
    finally:
        os.close(fd)
    return path


def for_command(command: str, args: Any) -> str | None:
    """The CLI's hook: a reading command's ``s3://`` path becomes its local copy; a changing
    one's is refused (the message, for exit 2). None: nothing to say."""
    path = getattr(args, "path", None)
    if not is_s3(path):
        return None
    if command in CHANGING:
        return (f"h5batch {command}: {path}: cannot change an object in place; download it, "
                f"run `h5batch {command}` on the local copy and upload the result")
    if command in READING:
        args.path = local_copy(path)
    return None


__all__ = ["for_command", "local_copy"]
