"""A real S3-API server on loopback for tests: moto's server in a subprocess, and a small
fault proxy in front of it.

``S3Server`` starts ``python -m moto.server`` on a free port, waits until it answers,
creates a bucket, and stops it (``stop``/``start`` again keep the port: moto restarts
empty, so a restart test uploads the same bytes again). ``FaultProxy`` forwards every
request to the server unless told to answer 500 to every request (``mode="500"``), to
PUTs only (``mode="500-put"``), or to count requests by method.
No S3 call is mocked: requests go through real sockets to a real server.
"""

from __future__ import annotations

import http.client
import json
import os
import re
import socket
import subprocess
import sys
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from urllib.parse import urlsplit

BUCKET = "bench"
CREDS = {"AWS_ACCESS_KEY_ID": "testing-key", "AWS_SECRET_ACCESS_KEY": "testing-secret-XYZ",
         "AWS_DEFAULT_REGION": "us-east-1"}


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class S3Server:
    def __init__(self, port: int | None = None):
        self.port = port or free_port()
        self.endpoint = f"http://127.0.0.1:{self.port}"
        self.proc: subprocess.Popen | None = None

    def start(self, bucket: str | None = BUCKET) -> S3Server:
        self.proc = subprocess.Popen([sys.executable, "-m", "moto.server", "-H", "127.0.0.1", "-p", str(self.port)],
                                     stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline:
            try:
                c = http.client.HTTPConnection("127.0.0.1", self.port, timeout=2)
                c.request("GET", "/moto-api/")
                c.getresponse().read()
                break
            except OSError:
                time.sleep(0.1)
        else:
            raise RuntimeError("moto server did not start")
        if bucket:
            self.client().create_bucket(Bucket=bucket)
        return self

    def stop(self) -> None:
        if self.proc is not None:
            self.proc.terminate()
            self.proc.wait(10)
            self.proc = None

    def client(self):  # boto3, for test set-up and checks only (the product uses obstore)
        import boto3

        return boto3.client("s3", endpoint_url=self.endpoint, region_name="us-east-1",
                            aws_access_key_id=CREDS["AWS_ACCESS_KEY_ID"],
                            aws_secret_access_key=CREDS["AWS_SECRET_ACCESS_KEY"])

    def env(self, endpoint: str | None = None) -> dict[str, str]:
        return {**os.environ, **CREDS, "AWS_ENDPOINT_URL": endpoint or self.endpoint}

    def keys(self, bucket: str = BUCKET) -> list[str]:
        return sorted(o["Key"] for o in self.client().list_objects_v2(Bucket=bucket).get("Contents", []))

    def uploads(self, bucket: str = BUCKET) -> list[str]:
        """Keys with a multipart upload in progress (orphaned parts)."""
        return [u["Key"] for u in self.client().list_multipart_uploads(Bucket=bucket).get("Uploads", [])]


class FaultProxy:
    """A loopback HTTP proxy in front of ``target`` (``http://host:port``), in a subprocess
    (a thread in the test process would change how an in-process conversion forks).

    ``mode``: ``pass`` forwards everything, ``500`` answers 500 to every request,
    ``500-put`` to PUTs only (uploads, parts), ``slow`` answers GETs after 3 s. ``counts()`` is the requests it saw by
    method (``GET`` counts the ranged reads of an epoch), ``GET_bytes`` the bytes they returned and
    ``key <id>`` the requests signed with that access key id."""

    def __init__(self, target: str, mode: str = "pass", port: int | None = None):
        port = port or free_port()
        self.target, self.mode, self.port = target, mode, port
        self.endpoint = f"http://127.0.0.1:{port}"
        self.proc = subprocess.Popen([sys.executable, "-m", "tests.support.s3server", target, mode, str(port)],
                                     cwd=os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))))
        deadline = time.monotonic() + 20
        while time.monotonic() < deadline:
            try:
                self.counts()
                return
            except OSError:
                time.sleep(0.05)
        raise RuntimeError("fault proxy did not start")

    def counts(self) -> dict[str, int]:
        c = http.client.HTTPConnection(*urlsplit(self.endpoint).netloc.split(":"), timeout=5)
        c.request("GET", "/__counts__")
        return json.loads(c.getresponse().read())

    def close(self) -> None:
        if self.proc is not None:
            self.proc.terminate()
            self.proc.wait(10)
            self.proc = None


def _serve(target: str, mode: str, port: int) -> None:
    tgt = urlsplit(target)
    counts: dict[str, int] = {}

    class Handler(BaseHTTPRequestHandler):
        protocol_version = "HTTP/1.1"

        def log_message(self, *a):  # quiet
            pass

        def _reply(self, status: int, data: bytes = b"", headers=()) -> None:
            self.send_response(status)
            for k, v in headers:
                if k.lower() not in ("content-length", "transfer-encoding", "connection"):
                    self.send_header(k, v)
            self.send_header("Content-Length", str(len(data)))
            self.end_headers()
            self.wfile.write(data)

        def _any(self):
            body = self.rfile.read(int(self.headers.get("Content-Length") or 0))
            if self.path == "/__counts__":
                return self._reply(200, json.dumps(counts).encode())
            counts[self.command] = counts.get(self.command, 0) + 1
            akid = re.search(r"Credential=([^/]+)/", self.headers.get("Authorization") or "")
            if akid:  # the key id a request was signed with
                counts[f"key {akid.group(1)}"] = counts.get(f"key {akid.group(1)}", 0) + 1
            if mode == "slow" and self.command == "GET":
                time.sleep(3)
            if mode == "500" or (mode == "500-put" and self.command == "PUT"):
                return self._reply(500)
            c = http.client.HTTPConnection(tgt.hostname, tgt.port, timeout=60)
            headers = {k: v for k, v in self.headers.items() if k.lower() != "host"}
            headers["Host"] = tgt.netloc
            c.request(self.command, self.path, body=body, headers=headers)
            r = c.getresponse()
            data = r.read()
            if self.command == "HEAD":  # the object's length, no body
                self.send_response(r.status)
                for k, v in r.getheaders():
                    if k.lower() not in ("transfer-encoding", "connection"):
                        self.send_header(k, v)
                self.end_headers()
            else:
                if self.command == "GET":
                    counts["GET_bytes"] = counts.get("GET_bytes", 0) + len(data)
                self._reply(r.status, data, r.getheaders())
            c.close()

        do_GET = do_PUT = do_POST = do_DELETE = _any

        def do_HEAD(self):
            self._any()

    server = ThreadingHTTPServer(("127.0.0.1", port), Handler)
    server.daemon_threads = True
    server.serve_forever()


if __name__ == "__main__":
    _serve(sys.argv[1], sys.argv[2], int(sys.argv[3]))


def server_fixture():
    """A module-scoped pytest fixture body: a started server, stopped afterwards."""
    srv = S3Server().start()
    try:
        yield srv
    finally:
        srv.stop()
