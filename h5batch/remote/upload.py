"""An ``s3://`` output: built in a local staging folder, then uploaded (the last stage of
:func:`h5batch.conversion.pipeline.convert`).

The rule: the object's key is the commit. The file is converted locally exactly as a local
output (the lock, resume, "already complete" and ``--overwrite`` are the staging file's),
then the rejects and warnings files are uploaded beside the key, and the ``.h5`` last, as one
multipart upload: the key appears only when it is complete, and a failed upload is aborted
(no parts left). ``<staging>/<name>.h5.uploaded`` records the ETag and size uploaded, so a
rerun whose object is there and matches does nothing, and one killed during the upload
uploads again (a ``kill -9`` during an upload can leave its parts behind: S3's
``AbortIncompleteMultipartUpload`` lifecycle rule removes them).

A sharded output (``output.writers`` > 1, :mod:`h5batch.shards`): its shard files are
checked against what ``NAME.h5`` records (size, sha256), each uploaded beside the key as
its own object (its own ``.uploaded`` record, which also holds the sha256, so a rerun skips
the shards already there and a rebuilt shard goes up again), and ``NAME.h5`` last: the key
still appears only once every shard object it names is there.

Staging folder: ``output.staging``, default ``$H5BATCH_CACHE_DIR/staging/<bucket>/<key's
folder>`` (``~/.cache/h5batch`` without the variable). BEWARE: the lock is the staging
folder's, so two hosts writing one key are not detected.
"""

from __future__ import annotations

import dataclasses
import json
import os
from collections.abc import Callable
from typing import Any

from ..errors import EXIT_BAD_INPUT, ConvertError
from . import cache_root, is_s3, sibling, split_url
from .client import ObjectClient

MARKER = ".uploaded"


class ObjectOutput:
    """The object an ``s3://`` job writes, and its local staging file."""

    def __init__(self, job: Any, overwrite: bool, say: Callable[[str], None]):
        self.url = job.output.path
        bucket, key = split_url(self.url)
        folder = job.output.staging or os.path.join(cache_root(), "staging", bucket, os.path.dirname(key))
        self.local = os.path.abspath(os.path.join(os.path.expanduser(folder), os.path.basename(key)))
        self.local_job = dataclasses.replace(job, output=dataclasses.replace(job.output, path=self.local))
        self.overwrite = overwrite or job.output.overwrite
        self.say = say
        self.client = ObjectClient(self.url)

    @classmethod
    def of(cls, job: Any, overwrite: bool, say: Callable[[str], None]) -> ObjectOutput | None:
        return cls(job, overwrite, say) if is_s3(job.output.path) else None

    def _matches(self, head: tuple[str, int] | None, local: str | None = None, url: str | None = None,
                 sha256: str | None = None) -> bool:
        """The object (default: the output's) is the one its staging file (of this sha256,
        for a shard) was uploaded as."""
        local, url = local or self.local, url or self.url
        try:
            with open(local + MARKER) as f:
                rec = json.load(f)
        except (OSError, ValueError):
            return False
        return (head is not None and rec.get("url") == url and rec.get("sha256") == sha256
                and [rec.get("etag"), rec.get("size")] == list(head) and os.path.exists(local)
                and os.path.getsize(local) == head[1])

    def check_not_there(self) -> None:
        """Before anything is built: an object that this staging folder did not upload is
        replaced only with ``--overwrite`` (exit 2 otherwise, as for a local file)."""
        head = self.client.head()
        if head is not None and not self.overwrite and not self._matches(head):
            raise ConvertError(f"{self.url} already exists; pass --overwrite (or output.overwrite: true) "
                               "to replace it", EXIT_BAD_INPUT)
        if self.overwrite and os.path.exists(self.local + MARKER):
            os.remove(self.local + MARKER)

    def publish(self, summary: Any) -> Any:
        """Upload the finished staging file (and its rejects and warnings files) unless the
        object already is it; ``summary`` then names the URLs."""
        local_rejects, local_warnings = summary.rejects_file, summary.warnings_file
        summary.path = self.url
        summary.rejects_file = sibling(self.url, ".rejects.jsonl") if local_rejects else ""
        summary.warnings_file = sibling(self.url, ".warnings.jsonl") if local_warnings else ""
        if self._matches(self.client.head()):
            self.say(f"{self.url} is already uploaded; nothing to do")
            return summary
        for path, url in ((local_rejects, summary.rejects_file), (local_warnings, summary.warnings_file)):
            if path and os.path.exists(path):
                with open(path, "rb") as f:
                    self.client.beside(url).put_bytes(f.read())
        for local, url, sha256 in self._shards():  # first: NAME.h5, the commit, goes last
            client = self.client.beside(url)
            if not self._matches(client.head(), local, url, sha256):
                self._upload(client, local, sha256)
        self._upload(self.client, self.local)
        return summary

    def _shards(self) -> list[tuple[str, str, str]]:
        """``(staging file, URL, sha256)`` of each shard of a sharded output (none for one
        file), once each file is checked against the size and sha256 the output records."""
        import h5py

        from .. import shards

        with h5py.File(self.local, "r") as f:
            if not shards.is_sharded(f):
                return []
            paths = shards.check(self.local, f, digest=True)
            records = shards.records(f)
        folder = self.url.rsplit("/", 1)[0]
        return [(p, f"{folder}/{r.path}", r.sha256) for p, r in zip(paths, records, strict=True)]

    def _upload(self, client: ObjectClient, local: str, sha256: str | None = None) -> None:
        """Upload ``local`` as ``client``'s object, then record what was uploaded beside it."""
        self.say(f"uploading {local} ({os.path.getsize(local) / 1e6:.1f} MB) to {client.url}")
        etag, size = client.upload(local)
        tmp = local + MARKER + ".tmp"
        with open(tmp, "w") as f:
            json.dump({"url": client.url, "etag": etag, "size": size, "sha256": sha256}, f)
        os.replace(tmp, local + MARKER)


__all__ = ["ObjectOutput"]
