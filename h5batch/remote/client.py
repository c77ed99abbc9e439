"""One object's client: HEAD, ranged GETs, uploads, deletes, through obstore.

Why obstore (docs/decisions.md, "Object storage client"): no Python dependencies (boto3 and
s3fs need botocore, whose ``python-dateutil<3`` conflicts with the pinned 4.0), an import of
~0.05 s against ~0.35 s for boto3 and a client, and a Rust HTTP client that releases the GIL.

Where the endpoint and credentials come from: the standard AWS environment
(``AWS_ENDPOINT_URL``, ``AWS_ACCESS_KEY_ID``, ``AWS_SECRET_ACCESS_KEY``, ``AWS_SESSION_TOKEN``,
``AWS_DEFAULT_REGION``/``AWS_REGION``), else the shared files of the AWS CLI
(``~/.aws/credentials`` and ``~/.aws/config``, or ``AWS_SHARED_CREDENTIALS_FILE`` /
``AWS_CONFIG_FILE``; profile ``AWS_PROFILE``, else ``default``: its keys, ``region`` and
``endpoint_url``), else web identity, ECS and instance metadata credentials as obstore
finds them; all of it overridden by ``storage_options`` with the keys fsspec's s3fs uses:
``key``, ``secret``, ``token``, ``endpoint_url``, ``client_kwargs`` (``endpoint_url``,
``region_name``), ``retries`` (attempts per request). Any other key is a ``TypeError`` naming
it. Credentials are never part of an error message, a log line or a stored job.

Retries: obstore retries 5xx, 429, connection errors and timeouts with exponential backoff
and full jitter (up to 0.25 s doubling to at most 4 s, ``retries`` attempts, default 10:
about 12 s in all, enough for a server restart); after the last,
:class:`~h5batch.errors.RemoteError` names the URL and the byte range.
"""

from __future__ import annotations

import configparser
import os
from datetime import timedelta
from pathlib import Path
from typing import Any

from ..errors import ObjectChangedError, RemoteError
from . import split_url

DEFAULT_RETRIES = 10
PART_BYTES = 16 << 20  # multipart part size: 16 MiB (S3 allows 10,000 parts: 160 GB)
UPLOAD_THREADS = 8
# BEWARE: obstore's runtime (tokio) does not survive fork(): a process forked after obstore
# was used here hangs or crashes on its first request. Such a child gets an error saying so.
# The reader's main process therefore makes its requests in a helper process
# (h5batch/remote/helper.py), and its DataLoader workers fork; one that made requests itself
# starts them from the fork server (h5batch/torch/loader.py).
_USED_IN: int | None = None


def runtime_started() -> bool:
    """Whether this process has made a request itself (so it must not fork a child that would)."""
    return _USED_IN == os.getpid()
_S3FS_KEYS = {"key", "secret", "token", "endpoint_url", "client_kwargs", "retries"}


def _obstore() -> Any:
    try:
        import obstore
        import obstore.store
    except ImportError as e:  # pragma: no cover - depends on the install
        raise ImportError("s3:// paths need the s3 extra: pip install 'h5batch[s3]'") from e
    return obstore


def _profile() -> dict[str, str]:
    """The AWS CLI's shared files, for profile ``AWS_PROFILE`` (else ``default``): the
    credentials file's keys, then the config file's ``region`` and ``endpoint_url``."""
    name = os.environ.get("AWS_PROFILE") or "default"
    out: dict[str, str] = {}
    for var, default, section in (("AWS_CONFIG_FILE", "~/.aws/config", name if name == "default" else f"profile {name}"),
                                  ("AWS_SHARED_CREDENTIALS_FILE", "~/.aws/credentials", name)):
        p = configparser.ConfigParser(interpolation=None)
        try:
            p.read(os.path.expanduser(os.environ.get(var) or default))
        except configparser.Error:
            continue  # a file the AWS CLI could not read either: the other sources apply
        if p.has_section(section):
            out.update(p[section])
    return out


class ObjectClient:
    """``s3://bucket/key``: HEAD, ranged GETs and uploads of that one object.

    Parameters
    ----------
    url : str
        ``s3://BUCKET/KEY``.
    storage_options : dict, optional
        s3fs-style keys (module docstring); None: the AWS environment alone.
    helper : bool
        HEADs and GETs made in this process go through :mod:`h5batch.remote.helper` (the
        reader's main process, which forks its DataLoader workers); a copy of this client in
        another process (a worker, the helper itself) makes its own.
    """

    def __init__(self, url: str, storage_options: dict[str, Any] | None = None, helper: bool = False):
        self.url = url
        self._via = os.getpid() if helper else None
        self.bucket, self.key = split_url(url)
        self.storage_options = dict(storage_options or {})
        unknown = sorted(set(self.storage_options) - _S3FS_KEYS)
        if unknown:
            raise TypeError(f"unknown storage_options {unknown} (known: {sorted(_S3FS_KEYS)})")
        self.retries = int(self.storage_options.get("retries", DEFAULT_RETRIES))
        self._resolved = self._settings()  # never printed: it may hold credentials
        self._store: Any = None
        self._pid = -1

    def __getstate__(self) -> dict[str, Any]:
        return {**self.__dict__, "_store": None, "_pid": -1}

    # The store (an HTTP connection pool) is made per process: a forked worker must not
    # share its parent's connections.
    @property
    def store(self) -> Any:
        if self._store is None or self._pid != os.getpid():
            global _USED_IN
            if _USED_IN is not None and _USED_IN != os.getpid():
                raise RuntimeError(f"{self.url}: this process was forked from one that had used object storage, "
                                   "which cannot go on after fork(); start DataLoader workers with "
                                   "multiprocessing_context='forkserver' or 'spawn' (H5Dataset.loader() does)")
            _USED_IN = os.getpid()
            self._store = self._make_store(self.key)
            self._pid = os.getpid()
        return self._store

    def _settings(self) -> dict[str, Any]:
        """Endpoint, region and static credentials, from ``storage_options`` else the AWS
        environment of the process that made this client: resolved once, so a worker started
        from a fork server made before the environment was set still gets them."""
        so = self.storage_options
        env = os.environ
        ck = dict(so.get("client_kwargs") or {})
        files = _profile()
        # Keys come as a set: a key id from one source and a secret from another never mix.
        keys = next((dict(zip(("access_key_id", "secret_access_key", "session_token"), (src.get(n) for n in names)))
                     for src, names in ((so, ("key", "secret", "token")),
                                        (env, ("AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY", "AWS_SESSION_TOKEN")),
                                        (files, ("aws_access_key_id", "aws_secret_access_key", "aws_session_token")))
                     if src.get(names[0])), {})
        kw = {"endpoint": so.get("endpoint_url") or ck.get("endpoint_url") or env.get("AWS_ENDPOINT_URL")
              or files.get("endpoint_url"),
              "region": ck.get("region_name") or env.get("AWS_REGION") or env.get("AWS_DEFAULT_REGION")
              or files.get("region") or "us-east-1", **keys}
        return {k: v for k, v in kw.items() if v}

    def _make_store(self, key: str) -> Any:
        ob = _obstore()
        kw = self._resolved
        endpoint = kw.get("endpoint")
        backoff = {"init_backoff": timedelta(seconds=0.25), "max_backoff": timedelta(seconds=4), "base": 2}
        retry = {"max_retries": max(0, self.retries - 1), "backoff": backoff,
                 "retry_timeout": timedelta(seconds=60)}
        options = {"allow_http": bool(endpoint and endpoint.startswith("http://")),
                   "connect_timeout": timedelta(seconds=5), "timeout": timedelta(seconds=120)}
        return ob.store.S3Store(self.bucket, client_options=options, retry_config=retry, **kw)

    def _fail(self, what: str, e: BaseException) -> RemoteError:
        # obstore's messages hold the request URL and status, never the signing headers.
        reason = str(e).strip().splitlines()[0][:300] if str(e).strip() else type(e).__name__
        return RemoteError(self.url, f"{what} failed after {self.retries} tries: {reason}")

    def head(self) -> tuple[str, int] | None:
        """``(etag, size)`` of the object, None when it does not exist."""
        if self._via == os.getpid():
            return self._helper("head")
        ob = _obstore()
        try:
            meta = ob.head(self.store, self.key)
        except FileNotFoundError:
            return None
        except Exception as e:  # noqa: BLE001 -- obstore raises its own hierarchy
            if type(e).__name__ == "NotFoundError":
                return None
            raise self._fail("HEAD", e) from e
        return str(meta.get("e_tag") or ""), int(meta["size"])

    def get(self, start: int, end: int, etag: str | None = None) -> bytes:
        """Bytes ``[start, end)``; with ``etag``, only of that version of the object
        (:class:`ObjectChangedError` when it was replaced)."""
        if self._via == os.getpid():
            return self._helper("get", start, end, etag)
        ob = _obstore()
        opts: dict[str, Any] = {"range": (start, end)}
        if etag:
            opts["if_match"] = etag
        try:
            data = ob.get(self.store, self.key, options=opts).bytes()
        except Exception as e:  # noqa: BLE001
            if type(e).__name__ == "PreconditionError":
                raise ObjectChangedError(self.url, f"the object was replaced (ETag {etag} no longer matches at GET "
                                                     f"bytes {start}-{end - 1}); never mixed: open it again") from e
            raise self._fail(f"GET bytes {start}-{end - 1}", e) from e
        if len(data) != end - start:
            raise RemoteError(self.url, f"GET bytes {start}-{end - 1} returned {len(data)} bytes")
        return bytes(data) if not isinstance(data, bytes) else data

    def _helper(self, method: str, *args: Any) -> Any:
        from .helper import helper

        return helper().call(self, method, *args)

    def upload(self, path: str | os.PathLike[str]) -> tuple[str, int]:
        """Upload the local file ``path`` as this object: one multipart upload of
        :data:`PART_BYTES` parts on :data:`UPLOAD_THREADS` connections (a single PUT below
        one part). The key appears only when the upload completes; a failed upload is
        aborted by obstore (its parts deleted), and the error names the URL. Returns the
        new object's ``(etag, size)``."""
        ob = _obstore()
        size = os.path.getsize(path)
        try:
            ob.put(self.store, self.key, Path(path), chunk_size=PART_BYTES,
                   max_concurrency=UPLOAD_THREADS, use_multipart=size > PART_BYTES)
        except Exception as e:  # noqa: BLE001
            raise self._fail(f"upload of {size} bytes", e) from e
        got = self.head()
        if got is None or got[1] != size:
            raise RemoteError(self.url, f"upload of {size} bytes left {got and got[1]} bytes")
        return got

    def put_bytes(self, data: bytes) -> None:
        try:
            _obstore().put(self.store, self.key, data, use_multipart=False)
        except Exception as e:  # noqa: BLE001
            raise self._fail(f"PUT of {len(data)} bytes", e) from e

    def delete(self) -> None:
        try:
            _obstore().delete(self.store, self.key)
        except Exception as e:  # noqa: BLE001
            if type(e).__name__ != "NotFoundError":
                raise self._fail("DELETE", e) from e

    def beside(self, url: str) -> ObjectClient:
        """A client for another object of the same bucket, with the same options."""
        return ObjectClient(url, self.storage_options)


__all__ = ["DEFAULT_RETRIES", "PART_BYTES", "ObjectClient", "runtime_started"]
