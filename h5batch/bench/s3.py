"""``h5batch bench --s3``: reading from object storage, h5batch's ``s3://`` reader beside
LitData's ``StreamingDataset``, both served by one S3-API server on loopback.

The server is moto's (``python -m moto.server``, installed by ``make``), behind a proxy in
this process that counts the GETs and the bytes they return. The rows, each epoch in a
process of its own (:func:`.measure.call`), batch 64, 2 workers, shuffled:

* ``first epoch``: a cold node cache, h5batch and LitData alternating, ``reps`` times;
* ``second epoch, fresh process``: h5batch again on the cache the first epoch filled;
* ``bounded cache, epoch N``: ``cache_dir_bytes`` a quarter of the file, a fresh process per
  epoch (only the node cache carries over): bytes fetched over bytes stored.

BEWARE: moto copies the whole object for every ranged GET, so its cost per GET grows with
the object (one h5batch file against LitData's 64 MB chunk files); a real store does not.
"""

from __future__ import annotations

import http.client
import os
import subprocess
import sys
import tempfile
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

BUCKET = "bench"
CREDS = {"AWS_ACCESS_KEY_ID": "bench-key", "AWS_SECRET_ACCESS_KEY": "bench-secret", "AWS_DEFAULT_REGION": "us-east-1"}


def available() -> tuple[bool, str]:
    try:
        import moto  # noqa: F401
        import obstore  # noqa: F401
    except ImportError as e:
        return False, str(e)
    return True, ""


class Served:
    """moto's server on a free port, and a counting proxy in front of it (a thread)."""

    def __init__(self) -> None:
        self.counts = {"GET": 0, "GET_bytes": 0}
        port = _free_port()
        self.proc = subprocess.Popen([sys.executable, "-m", "moto.server", "-H", "127.0.0.1", "-p", str(port)],
                                     stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        for _ in range(300):
            try:
                _request(port, "PUT", f"/{BUCKET}")  # moto takes an unsigned request
                break
            except OSError:
                time.sleep(0.1)
        self.proxy = ThreadingHTTPServer(("127.0.0.1", 0), _handler(port, self.counts))
        self.proxy.daemon_threads = True
        threading.Thread(target=self.proxy.serve_forever, daemon=True).start()
        self.env = {**CREDS, "AWS_ENDPOINT_URL": f"http://127.0.0.1:{self.proxy.server_address[1]}",
                    "AWS_ALLOW_HTTP": "true"}

    def upload(self, path: str, key: str) -> None:
        from ..remote.client import ObjectClient

        ObjectClient(f"s3://{BUCKET}/{key}", {"endpoint_url": self.env["AWS_ENDPOINT_URL"], "key": CREDS[
            "AWS_ACCESS_KEY_ID"], "secret": CREDS["AWS_SECRET_ACCESS_KEY"]}).upload(path)

    def close(self) -> None:
        self.proxy.shutdown()
        self.proc.terminate()
        self.proc.wait(10)


def _free_port() -> int:
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _request(port: int, method: str, path: str, body: bytes = b"", headers: Any = None) -> http.client.HTTPResponse:
    c = http.client.HTTPConnection("127.0.0.1", port, timeout=120)
    c.request(method, path, body=body, headers=headers or {})
    return c.getresponse()


def _handler(port: int, counts: dict[str, int]) -> type:
    class Handler(BaseHTTPRequestHandler):
        protocol_version = "HTTP/1.1"

        def log_message(self, *a: Any) -> None:
            pass

        def _any(self) -> None:
            body = self.rfile.read(int(self.headers.get("Content-Length") or 0))
            headers = {k: v for k, v in self.headers.items() if k.lower() != "host"}
            headers["Host"] = f"127.0.0.1:{port}"
            r = _request(port, self.command, self.path, body, headers)
            data = r.read()
            if self.command == "GET":
                counts["GET"] += 1
                counts["GET_bytes"] += len(data)
            self.send_response(r.status)
            for k, v in r.getheaders():
                if k.lower() not in ("content-length", "transfer-encoding", "connection"):
                    self.send_header(k, v)
            self.send_header("Content-Length", r.getheader("Content-Length") if self.command == "HEAD" else str(len(data)))
            self.end_headers()
            if self.command != "HEAD":
                self.wfile.write(data)

        do_GET = do_PUT = do_POST = do_DELETE = do_HEAD = _any

    return Handler


def h5batch_epoch(url: str, cache: str, epoch: int, cache_bytes: int | None = None) -> dict[str, Any]:
    """One epoch of ``H5Dataset(url).loader(...)`` (run by :func:`.measure.call`)."""
    from ..torch import H5Dataset

    ds = H5Dataset(url, split="train", as_float=False, cache_dir=cache, cache_dir_bytes=cache_bytes)
    loader = ds.loader(batch_size=64, shuffle=True, num_workers=2)
    loader.set_epoch(epoch)
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
    t = time.perf_counter()
    n = sum(len(b["data"]) for b in ld.StreamingDataLoader(ds, batch_size=64, num_workers=2))
    return {"samples": n, "seconds": time.perf_counter() - t}


def measure_rows(bench: Any, corpus: str, h5_path: str, lit_dir: str | None, reps: int) -> None:
    """The rows of the module docstring, recorded in ``bench`` (phase ``s3``)."""
    from . import measure

    srv = Served()
    saved = {k: os.environ.get(k) for k in srv.env}
    os.environ.update(srv.env)  # the rows' processes inherit the endpoint and the keys
    try:
        srv.upload(h5_path, "h5batch.h5")
        stored = {"h5batch": os.path.getsize(h5_path)}
        if lit_dir:
            for name in os.listdir(lit_dir):
                srv.upload(os.path.join(lit_dir, name), f"litdata/{name}")
            stored["litdata"] = sum(os.path.getsize(os.path.join(lit_dir, n)) for n in os.listdir(lit_dir))
        url = f"s3://{BUCKET}/h5batch.h5"

        def row(method: str, variant: str, fn: Any, *args: Any) -> None:
            before = dict(srv.counts)
            r = measure.call(fn, *args)
            gets, got = (srv.counts[k] - before[k] for k in ("GET", "GET_bytes"))
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
        for k, v in saved.items():
            if v is None:
                os.environ.pop(k, None)
            else:
                os.environ[k] = v


def table(results: dict[str, Any]) -> list[str]:
    """The ``s3`` rows as a markdown table (empty without them)."""
    rows = [r for r in results["records"] if r["phase"] == "s3"]
    if not rows:
        return []
    out = ["| reader | epoch | samples/s (median) | GETs | fetched / stored |", "|---|---|---:|---:|---:|"]
    for r in rows:
        gets = sorted(x["gets"] for x in r["runs"])
        ratio = sorted(x["fetched_over_stored"] for x in r["runs"])
        out.append(f"| {r['method']} | {r['variant']} | {r['rate']['median']:,.0f} | {gets[len(gets) // 2]} | "
                   f"{ratio[len(ratio) // 2]:.3f} |")
    return out


__all__ = ["available", "measure_rows", "table"]
