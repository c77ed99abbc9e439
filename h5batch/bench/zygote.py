"""A fork server for the bench's rows that each run in a clean process of their own.

Rule: a row whose work runs in the process that times it is measured in a child forked from a
:class:`Zygote`, a new interpreter that imports the row's libraries once and measures nothing.
Reason: the bench's own process is no clean place to time anything. Its heap is shaped by
every row before (a 0-worker read row moved 2x with it, see :mod:`.fresh_reads`), and it runs
threads (a Dask client, the memory sampler of :class:`~h5batch.bench.measure.PeakRss`), so a
conversion there takes the writer's fork-server path, not the direct fork that
``h5batch convert`` takes (:mod:`h5batch.conversion.writer_start`). Forking the zygote costs
~10 ms where a new interpreter and torch's import cost ~1.5 s per row.

A job is a module-level function (the *handler*, pickled by name) and its arguments; the child
runs ``handler(job)`` and sends back its JSON-able result. A handler that calls
:func:`timing_starts` has its process tree's peak RSS sampled *by the zygote* from then on
(``peak_rss`` and ``baseline_rss`` in its result): a sampling thread inside the child would
change what is measured, as said above.
"""

from __future__ import annotations

import importlib
import json
import os
import pickle
import select
import signal
import struct
import subprocess
import sys
import tempfile
import time
import traceback
from collections.abc import Callable, Sequence
from typing import Any

import psutil

from .measure import tree_rss

__all__ = ["Zygote", "timing_starts", "READ_PRELOAD", "CONVERT_PRELOAD", "PEER_CONVERT_PRELOAD"]

_ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
#: seconds a row's child may take before it is killed
ROW_TIMEOUT = 900.0
#: seconds between two samples of a timed child's tree RSS (as PeakRss samples)
RSS_INTERVAL = 0.05
#: what a read row's child needs imported (torch, h5py and the readers)
READ_PRELOAD = ("h5py", "torch", "torch.utils.data", "h5batch.torch", "h5batch.bench.baselines")
#: what an h5batch conversion row's child needs imported: what ``h5batch convert`` imports,
#: and no torch (bench.convert_child). Dask's client and the peers' own packages are left to
#: each child's untimed warm-up: an import that starts a thread would make forking unsafe.
CONVERT_PRELOAD = ("h5py", "soundfile", "distributed", "h5batch.conversion.pipeline",
                   "h5batch.conversion.cluster", "h5batch.bench.convert_child")
#: the same for the peers' and the naive recipe's rows, whose modules import torch
PEER_CONVERT_PRELOAD = (*CONVERT_PRELOAD, "h5batch.bench.peers", "h5batch.bench.baselines")

_MARK = b"\x00"  # the child's "timing starts now" (a JSON reply never starts with it)
_reply_fd: int | None = None  # in a child: the pipe its reply goes to


def timing_starts() -> None:
    """In a row's child: the timed part begins; the zygote samples the tree's RSS from now on."""
    if _reply_fd is not None:
        os.write(_reply_fd, _MARK)


class Zygote:
    """A clean interpreter that imports ``preload`` once, then forks one child per job.

    Each child starts from the same state (the imports, nothing measured before it), which is
    what a new interpreter gives, without its start. The zygote runs no Python thread: forking
    it is what a DataLoader does to start its workers. Its stderr (and the children's) goes to
    a temporary file, whose tail a failure quotes. Construct it before any LocalCluster starts:
    distributed leaves its workers' settings in the client's ``os.environ``
    (``OMP_NUM_THREADS=1`` and others; a zygote started after them ran torch on one thread).
    """

    def __init__(self, code: str | None = None, preload: Sequence[str] = READ_PRELOAD):
        self.code = code or _ROOT
        self.preload = tuple(preload)
        self.env = dict(os.environ)
        self._log: Any = None
        self._proc: subprocess.Popen[bytes] | None = None

    def _start(self) -> subprocess.Popen[bytes]:
        """The server, started on the first job (a phase without one starts nothing)."""
        if self._proc is None:
            self._log = tempfile.TemporaryFile()
            env = dict(self.env)
            env["PYTHONPATH"] = os.pathsep.join([self.code, *filter(None, [env.get("PYTHONPATH")])])
            self._proc = subprocess.Popen(
                [sys.executable, "-m", "h5batch.bench.zygote", "--serve", ",".join(self.preload)], env=env,
                stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=self._log)
        return self._proc

    def call(self, handler: Callable[[dict[str, Any]], dict[str, Any]], job: dict[str, Any],
             what: str) -> dict[str, Any]:
        """``handler(job)`` in a child forked for it; ``what`` names the row in errors."""
        data = pickle.dumps((handler, job))
        proc = self._start()
        try:
            proc.stdin.write(struct.pack("<Q", len(data)) + data)
            proc.stdin.flush()
            reply = _read_frame(proc.stdout)
        except (BrokenPipeError, EOFError) as e:
            raise RuntimeError(f"{what}: the fork server (pid {proc.pid}) "
                               f"stopped (exit code {proc.poll()}):\n{self._tail()}") from e
        r = json.loads(reply)
        if not r.get("ok"):
            raise RuntimeError(f"{what} failed in its own process: {r.get('error')}\n{self._tail()}")
        return r["result"]

    def _tail(self) -> str:
        self._log.seek(0)
        return self._log.read().decode(errors="replace")[-2000:]

    def close(self) -> None:
        proc, self._proc = self._proc, None
        if proc is not None and proc.poll() is None:
            proc.stdin.close()
            try:
                proc.wait(timeout=30)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()
        if self._log is not None:
            self._log.close()
            self._log = None

    def __enter__(self) -> Zygote:
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()


def _read_frame(f: Any) -> bytes:
    head = f.read(8)
    if len(head) < 8:
        raise EOFError
    (n,) = struct.unpack("<Q", head)
    data = f.read(n)
    if len(data) < n:
        raise EOFError
    return data


def _child(data: bytes, w: int) -> None:
    """The forked child: run the job, write ``{"ok", "result" | "error"}``; never returns."""
    global _reply_fd
    _reply_fd = w
    try:
        handler, job = pickle.loads(data)
        reply = {"ok": True, "result": {**handler(job), "pid": os.getpid()}}
    except BaseException:  # noqa: B036 - the child must answer whatever happened
        tb = traceback.format_exc()
        reply = {"ok": False, "error": f"{tb.strip().splitlines()[-1]}\n{tb}"}
    with os.fdopen(w, "wb") as out:
        out.write(json.dumps(reply).encode())
    sys.stderr.flush()
    os._exit(0)


def _fork_job(data: bytes) -> bytes:
    """Fork a child for one job and wait for its reply, sampling its tree's RSS once it has
    said that timing starts (:func:`timing_starts`)."""
    r, w = os.pipe()
    pid = os.fork()
    if pid == 0:
        os.close(r)
        _child(data, w)
    os.close(w)
    child = psutil.Process(pid)
    deadline = time.monotonic() + ROW_TIMEOUT
    buf, sampling, base, peak, timed_out = b"", False, 0, 0, False
    while True:
        left = deadline - time.monotonic()
        if left <= 0:  # a row that hangs must not hang the bench
            os.kill(pid, signal.SIGKILL)
            timed_out = True
            break
        if select.select([r], [], [], min(left, RSS_INTERVAL) if sampling else left)[0]:
            chunk = os.read(r, 1 << 16)
            if not chunk:
                break
            buf += chunk
            if not sampling and buf.startswith(_MARK):
                buf, sampling = buf[len(_MARK):], True
                base = peak = tree_rss(child)[0]
        if sampling:
            peak = max(peak, tree_rss(child)[0])
    os.close(r)
    _, status = os.waitpid(pid, 0)
    if not buf:
        why = f"no answer in {ROW_TIMEOUT:g} s, killed" if timed_out else f"the child died (wait status {status})"
        return json.dumps({"ok": False, "error": why}).encode()
    if sampling:
        reply = json.loads(buf)
        if reply.get("ok"):
            reply["result"].update(peak_rss=peak, baseline_rss=base)
        buf = json.dumps(reply).encode()
    return buf


def _serve(preload: Sequence[str]) -> None:
    for name in preload:
        importlib.import_module(name)
    inp = sys.stdin.buffer
    out = os.fdopen(os.dup(1), "wb")
    os.dup2(2, 1)  # a library printing to stdout must not break the frames
    while True:
        try:
            data = _read_frame(inp)
        except EOFError:
            return
        reply = _fork_job(data)
        out.write(struct.pack("<Q", len(reply)) + reply)
        out.flush()


if __name__ == "__main__" and sys.argv[1:2] == ["--serve"]:
    # Served by the package's module, not this ``__main__`` copy of it: a handler's
    # :func:`timing_starts` must see the reply pipe set in the module it imported.
    from h5batch.bench import zygote

    zygote._serve([m for m in (sys.argv[2] if len(sys.argv) > 2 else "").split(",") if m])
