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

    def _uploaded(self) -> dict[str, Any] | None:
        try:
            with open(self.local + MARKER) as f:
                return json.load(f)
        except (OSError, ValueError):
            return None

    def _matches(self, head: tuple[str, int] | None) -> bool:
        """The object is the one this staging file was uploaded as."""
        rec = self._uploaded()
        return (head is not None and rec is not None and rec.get("url") == self.url
                and [rec.get("etag"), rec.get("size")] == list(head) and os.path.exists(self.local)
                and os.path.getsize(self.local) == head[1])

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
        size = os.path.getsize(self.local)
        self.say(f"uploading {self.local} ({size / 1e6:.1f} MB) to {self.url}")
        etag, size = self.client.upload(self.local)
        tmp = self.local + MARKER + ".tmp"
        with open(tmp, "w") as f:
            json.dump({"url": self.url, "etag": etag, "size": size}, f)
        os.replace(tmp, self.local + MARKER)
        return summary


__all__ = ["ObjectOutput"]
