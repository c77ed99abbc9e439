"""Helpers for the cluster tests: real `dask scheduler` / `dask worker` processes on
127.0.0.1, job files, running the CLI, comparing outputs, throw-away TLS certificates."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import h5py
import hdf5plugin  # noqa: F401  (plugin filters for reading)
import yaml

from tests.support.h5compare import assert_same_h5, h5_contents  # noqa: F401  (re-exported)
from tests.support.run import clean_env, convert_cmd, h5batch_cmd, run_h5batch, start  # noqa: F401  (re-exported)
from tests.support.run import convert as _convert

BIN = Path(sys.executable).parent


# ---------------------------------------------------------------------------
# Comparing outputs
# ---------------------------------------------------------------------------



def stored_job(path) -> dict[str, Any]:
    with h5py.File(path, "r") as f:
        return json.loads(f.attrs["job"])


# ---------------------------------------------------------------------------
# Jobs and the CLI
# ---------------------------------------------------------------------------


def write_job(directory: Path, root: Path | str, out: Path, name: str = "job", **cluster: Any) -> Path:
    """A paired-audio job file (``generate.make_paired_audio`` layout) in ``directory``."""
    job = {
        "name": "cluster-test",
        "source": {"root": str(root), "layout": "paired_folders"},
        "fields": {
            "data": {"type": "audio", "folder": "data", "extensions": [".wav"], "sample_rate": 16000},
            "target": {"type": "audio", "folder": "label", "extensions": [".wav"], "sample_rate": 16000},
        },
        "output": {"path": str(out), "codec": "blosc2-lz4"},
        "cluster": {"batch_size": 8, **cluster},
    }
    path = directory / f"{name}.yaml"
    path.write_text(yaml.safe_dump(job, sort_keys=False))
    return path


def convert(job: Path, *extra: str, env: dict[str, str] | None = None, cwd: Path | None = None,
            check: bool = True) -> tuple[subprocess.CompletedProcess, float]:
    """``h5batch convert JOB --overwrite --progress none -v ...``; (process, seconds)."""
    res = _convert(job, "-v", *extra, overwrite=True, env=env, cwd=cwd, check=check)
    return res, res.seconds


def summary_seconds(stderr: str) -> float:
    """The conversion time the summary line reports ("... in 1.2s = ...")."""
    for line in stderr.splitlines():
        if line.startswith("wrote ") and " in " in line:
            return float(line.rsplit(" in ", 1)[1].split("s", 1)[0])
    raise AssertionError(f"no summary line in:\n{stderr}")


# ---------------------------------------------------------------------------
# Real Dask processes
# ---------------------------------------------------------------------------


def _stop(proc: subprocess.Popen, grace: float = 10.0) -> None:
    if proc.poll() is None:
        proc.send_signal(signal.SIGTERM)
        try:
            proc.wait(timeout=grace)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait(timeout=10)


class DaskProcesses:
    """A `dask scheduler` and `dask worker` processes on 127.0.0.1, each its own process
    (workers without a nanny, so a SIGKILL of the process kills the worker for good).

    ``tls`` is a :class:`TLSFiles` to run everything over TLS.
    """

    def __init__(self, tmp: Path, tls: TLSFiles | None = None):
        self.tmp = tmp
        self.tmp.mkdir(parents=True, exist_ok=True)
        self.tls = tls
        self.scheduler_file = tmp / "scheduler.json"
        self.scheduler: subprocess.Popen | None = None
        self.workers: dict[str, subprocess.Popen] = {}
        self.address = ""
        self._client = None

    def _tls_args(self) -> list[str]:
        if not self.tls:
            return []
        return ["--tls-ca-file", str(self.tls.ca), "--tls-cert", str(self.tls.cert), "--tls-key", str(self.tls.key)]

    def _log(self, name: str):
        return open(self.tmp / f"{name}.log", "w")

    def start_scheduler(self, timeout: float = 30) -> str:
        args = [str(BIN / "dask"), "scheduler", "--host", "127.0.0.1", "--port", "0",
                "--dashboard-address", "127.0.0.1:0", "--scheduler-file", str(self.scheduler_file)]
        if self.tls:
            args += ["--protocol", "tls", *self._tls_args()]
        with self._log("scheduler") as log:
            self.scheduler = subprocess.Popen(args, stdout=log, stderr=subprocess.STDOUT, env=clean_env(),
                                              cwd=self.tmp)
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.scheduler_file.exists():
                try:
                    self.address = json.loads(self.scheduler_file.read_text())["address"]
                    return self.address
                except (ValueError, KeyError):
                    pass
            if self.scheduler.poll() is not None:
                break
            time.sleep(0.05)
        raise RuntimeError(f"dask scheduler did not start:\n{(self.tmp / 'scheduler.log').read_text()}")

    def start_worker(self, name: str, cwd: Path | None = None, host: str = "127.0.0.1") -> subprocess.Popen:
        """A worker listening on ``host`` (another loopback address, 127.0.0.2 ..., is a
        host of its own for Dask)."""
        args = [str(BIN / "dask"), "worker", "--scheduler-file", str(self.scheduler_file), "--name", name,
                "--nthreads", "1", "--no-nanny", "--host", host, "--dashboard-address", f"{host}:0",
                "--local-directory", str(self.tmp / f"{name}-scratch"), *self._tls_args()]
        with self._log(name) as log:
            proc = subprocess.Popen(args, stdout=log, stderr=subprocess.STDOUT, env=clean_env(),
                                    cwd=cwd or self.tmp)
        self.workers[name] = proc
        return proc

    @property
    def client(self):
        """A client of this cluster for watching it (not the one the conversion uses)."""
        if self._client is None:
            from distributed import Client
            from distributed.security import Security

            sec = None
            if self.tls:
                sec = Security(tls_ca_file=str(self.tls.ca), tls_client_cert=str(self.tls.cert),
                               tls_client_key=str(self.tls.key), require_encryption=True)
            self._client = Client(self.address, security=sec, timeout="30s")
        return self._client

    def wait_workers(self, n: int, timeout: float = 60) -> None:
        self.client.wait_for_workers(n, timeout=timeout)

    def worker_address(self, name: str) -> str:
        for addr, info in self.client.scheduler_info(n_workers=-1)["workers"].items():
            if info.get("name") == name:
                return addr
        raise KeyError(name)

    def executed(self) -> dict[str, int]:
        """Tasks executed so far, by worker name."""
        def count(dask_worker):
            return dask_worker.state.executed_count

        info = self.client.scheduler_info(n_workers=-1)["workers"]
        counts = self.client.run(count, on_error="ignore")
        return {info[a]["name"]: n for a, n in counts.items() if a in info}

    def kill_worker(self, name: str) -> None:
        proc = self.workers[name]
        proc.send_signal(signal.SIGKILL)
        proc.wait(timeout=10)

    def close(self) -> None:
        if self._client is not None:
            self._client.close()
            self._client = None
        for proc in self.workers.values():
            _stop(proc)
        if self.scheduler is not None:
            _stop(self.scheduler)

    def __enter__(self) -> DaskProcesses:
        return self

    def __exit__(self, *exc) -> None:
        self.close()


# ---------------------------------------------------------------------------
# TLS
# ---------------------------------------------------------------------------


class TLSFiles:
    """A throw-away CA and one certificate it signed (used for every role: Dask does not
    check host names), made with the openssl command line."""

    def __init__(self, directory: Path):
        directory.mkdir(parents=True, exist_ok=True)
        self.ca = directory / "ca.pem"
        self.cert = directory / "cert.pem"
        self.key = directory / "key.pem"
        ca_key = directory / "ca-key.pem"
        csr = directory / "cert.csr"

        def ssl(*args: str) -> None:
            subprocess.run(["openssl", *args], check=True, capture_output=True, timeout=60)

        ssl("req", "-x509", "-newkey", "rsa:2048", "-nodes", "-keyout", str(ca_key), "-out", str(self.ca),
            "-days", "2", "-subj", "/CN=h5batch-test-ca")
        ssl("req", "-newkey", "rsa:2048", "-nodes", "-keyout", str(self.key), "-out", str(csr),
            "-subj", "/CN=127.0.0.1")
        ssl("x509", "-req", "-in", str(csr), "-CA", str(self.ca), "-CAkey", str(ca_key), "-CAcreateserial",
            "-out", str(self.cert), "-days", "2")

    def security(self) -> dict[str, Any]:
        """The ``cluster.security`` section of a job using these files."""
        return {"tls_ca_file": str(self.ca), "tls_client_cert": str(self.cert),
                "tls_client_key": str(self.key), "require_encryption": True}


# ---------------------------------------------------------------------------
# Processes listening
# ---------------------------------------------------------------------------


def listening_addresses(pids: set[int]) -> list[tuple[int, str, int]]:
    """``(pid, ip, port)`` of every TCP socket the processes listen on."""
    import psutil

    out = []
    for conn in psutil.net_connections(kind="tcp"):
        if conn.status == psutil.CONN_LISTEN and conn.pid in pids:
            out.append((conn.pid, conn.laddr.ip, conn.laddr.port))
    return out


# ---------------------------------------------------------------------------
# Shared-memory leak check that tolerates other runs on the same machine
# ---------------------------------------------------------------------------


def orphaned_segments() -> set[str]:
    """h5batch segments whose run's driver, started by this test process (or this process
    itself), is gone: leaks. Segments of drivers still running, and of runs another test
    process started (an xdist worker killing runs on purpose), are not ours."""
    from h5batch.transport.segments import owner_pid, stale_segments

    from .run import SPAWNED

    mine = SPAWNED | {os.getpid()}
    return {s for s in stale_segments() if owner_pid(s) in mine}


# ---------------------------------------------------------------------------
# A conversion running in the background
# ---------------------------------------------------------------------------


class Running:
    """``h5batch convert`` in a child process whose stderr lines are collected as they come."""

    def __init__(self, job: Path, *extra: str, env: dict[str, str] | None = None):
        import threading

        self.proc = start(convert_cmd(job, "-v", *extra, overwrite=True), env=env)
        self.lines: list[str] = []
        self.stdout = ""
        self._reader = threading.Thread(target=self._read, daemon=True)
        self._reader.start()

    def _read(self) -> None:
        assert self.proc.stderr is not None
        for line in self.proc.stderr:
            self.lines.append(line.rstrip("\n"))

    @property
    def stderr(self) -> str:
        return "\n".join(self.lines)

    def wait_line(self, text: str, timeout: float = 120) -> str:
        """The first stderr line containing ``text`` (fails if the run ends first)."""
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            for line in list(self.lines):
                if text in line:
                    return line
            if self.proc.poll() is not None:
                self._reader.join(timeout=5)
                if not any(text in line for line in self.lines):
                    raise AssertionError(f"run ended ({self.proc.returncode}) without {text!r}:\n{self.stderr}")
            time.sleep(0.05)
        raise AssertionError(f"no {text!r} within {timeout}s:\n{self.stderr}")

    def wait(self, timeout: float = 300) -> int:
        try:
            self.proc.wait(timeout=timeout)  # stdout stays small: no --json
            assert self.proc.stdout is not None
            self.stdout = self.proc.stdout.read()
        finally:
            if self.proc.poll() is None:
                self.proc.kill()
                self.proc.wait(timeout=10)
        self._reader.join(timeout=5)
        return self.proc.returncode

    def kill(self) -> None:
        if self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait(timeout=10)
