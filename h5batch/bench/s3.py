"""``h5batch bench --s3``: reading from object storage, h5batch's ``s3://`` reader beside
LitData's ``StreamingDataset``, both served by one S3-API server on loopback.

The server is moto's (``python -m moto.server``, installed by ``make``); its request
recorder counts the GETs and the bytes they ask for. The rows, each epoch in a
process of its own (:func:`.measure.call`), batch 64, 2 workers, shuffled:

* ``first epoch``: a cold node cache, h5batch and LitData alternating, ``reps`` times;
* ``second epoch, fresh process``: h5batch again on the cache the first epoch filled;
* ``bounded cache, epoch N``: ``cache_dir_bytes`` a quarter of the file, a fresh process per
  epoch (only the node cache carries over): bytes fetched over bytes stored (the best a
  cache of that bound can do: ``benchmarks/cache_optimum.py``).

BEWARE: moto copies the whole object for every ranged GET, so its cost per GET grows with
the object (one h5batch file against LitData's 64 MB chunk files); a real store does not.
"""

from __future__ import annotations

import http.client
import json
import os
import socket
import subprocess
import sys
import tempfile
import time
from typing import Any
from urllib.parse import urlsplit

BUCKET = "bench"
CREDS = {"AWS_ACCESS_KEY_ID": "bench-key", "AWS_SECRET_ACCESS_KEY": "bench-secret", "AWS_DEFAULT_REGION": "us-east-1"}


class Served:
    """moto's server on a free port, recording requests (its recorder) once :meth:`counting`."""

    def __init__(self, work: str) -> None:
        self.port = _free_port()
        self.log = os.path.join(work, "s3-requests.jsonl")
        self.env = {**CREDS, "AWS_ENDPOINT_URL": f"http://127.0.0.1:{self.port}", "AWS_ALLOW_HTTP": "true"}
        self.sizes: dict[str, int] = {}  # /bucket/key -> bytes
        self.proc = subprocess.Popen([sys.executable, "-m", "moto.server", "-H", "127.0.0.1", "-p", str(self.port)],
                                     env={**os.environ, "MOTO_RECORDER_FILEPATH": self.log},
                                     stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        for _ in range(300):
            try:
                self._request("PUT", f"/{BUCKET}")  # moto takes an unsigned request
                break
            except OSError:
                time.sleep(0.1)

    def _request(self, method: str, path: str) -> None:
        c = http.client.HTTPConnection("127.0.0.1", self.port, timeout=30)
        c.request(method, path)
        c.getresponse().read()

    def upload(self, path: str, key: str) -> int:
        """Upload through h5batch's client (the endpoint and keys in the environment)."""
        from ..remote.client import ObjectClient

        self.sizes[f"/{BUCKET}/{key}"] = ObjectClient(f"s3://{BUCKET}/{key}").upload(path)[1]
        return self.sizes[f"/{BUCKET}/{key}"]

    def counting(self) -> None:
        self._request("POST", "/moto-api/recorder/start-recording")

    def counts(self) -> tuple[int, int]:
        """GETs of an uploaded object recorded so far, and the bytes they asked for."""
        gets = got = 0
        with open(self.log, "a+") as f:
            f.seek(0)
            for line in f:
                e = json.loads(line)
                key = urlsplit(e["url"]).path
                if e["method"] == "GET" and key in self.sizes:
                    lo, _, hi = (e["headers"].get("Range") or "bytes=0-").removeprefix("bytes=").partition("-")
                    gets += 1
                    got += (int(hi) + 1 if hi else self.sizes[key]) - int(lo)
        return gets, got

    def close(self) -> None:
        self.proc.terminate()
        self.proc.wait(10)


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def h5batch_epoch(url: str, cache: str, epoch: int, cache_bytes: int | None = None) -> dict[str, Any]:
    """One epoch of ``H5Dataset(url).loader(...)`` (run by :func:`.measure.call`)."""
    from ..torch import H5Dataset

    ds = H5Dataset(url, split="train", as_float=False, cache_dir=cache, cache_dir_bytes=cache_bytes)
    loader = ds.loader(batch_size=64, shuffle=True, num_workers=2)
    loader.set_epoch(epoch)
    return _timed(loader)


def _timed(loader: Any) -> dict[str, Any]:
    t = time.perf_counter()
    n = sum(len(b["data"]) for b in loader)
    return {"samples": n, "seconds": time.perf_counter() - t}


def litdata_epoch(url: str, cache: str, endpoint: str) -> dict[str, Any]:
    """One epoch of LitData's ``StreamingDataset`` + ``StreamingDataLoader``, through boto3
    (its obstore path fails on an ``http://`` endpoint)."""
    import litdata as ld
    import litdata.streaming.downloader as dl

    dl._OBSTORE_AVAILABLE = False
    ds = ld.StreamingDataset(url, shuffle=True, seed=0, cache_dir=cache, storage_options={"endpoint_url": endpoint})
    return _timed(ld.StreamingDataLoader(ds, batch_size=64, num_workers=2))


def measure_rows(bench: Any, corpus: str, h5_path: str, lit_dir: str | None, reps: int) -> None:
    """The rows of the module docstring, recorded in ``bench`` (phase ``s3``)."""
    from . import measure

    srv = Served(bench.work)
    saved = dict(os.environ)
    os.environ.update(srv.env)  # the rows' processes inherit the endpoint and the keys
    try:
        stored = {"h5batch": srv.upload(h5_path, "h5batch.h5"),
                  "litdata": sum(srv.upload(os.path.join(lit_dir, n), f"litdata/{n}") for n in os.listdir(lit_dir or "."))
                  if lit_dir else 0}
        url = f"s3://{BUCKET}/h5batch.h5"
        srv.counting()

        def row(method: str, variant: str, fn: Any, *args: Any) -> None:
            before = srv.counts()
            r = measure.call(fn, *args)
            gets, got = (now - was for now, was in zip(srv.counts(), before))
            bench.record("s3", corpus, method, variant=variant).runs.append(
                {"items": r["result"]["samples"], "seconds": r["result"]["seconds"], "peak_rss": r["peak_rss"],
                 "gets": gets, "fetched_over_stored": got / stored[method]})

        cache = ""
        for _ in range(reps):
            cache = tempfile.mkdtemp(dir=bench.work)
            row("h5batch", "first epoch", h5batch_epoch, url, cache, 0)
            if lit_dir:
                row("litdata", "first epoch", litdata_epoch, f"s3://{BUCKET}/litdata", tempfile.mkdtemp(dir=bench.work),
                    srv.env["AWS_ENDPOINT_URL"])
        row("h5batch", "second epoch, fresh process", h5batch_epoch, url, cache, 1)
        bounded = tempfile.mkdtemp(dir=bench.work)
        for epoch in range(3):
            row("h5batch", f"bounded cache, epoch {epoch + 1}", h5batch_epoch, url, bounded, epoch,
                stored["h5batch"] // 4)
    finally:
        srv.close()
        os.environ.clear()
        os.environ.update(saved)


__all__ = ["measure_rows"]
