"""The read phase's rows at ``num_workers=0``, each measured in a process of its own.

Rule: a row without DataLoader workers reads, decodes and batches in the process that times
it, so where that process is the bench's own (its heap shaped by the conversions, checks and
every row before) the row's figure moves with the C library's heap: in one full run the
0-worker chunk-shuffle row of the default codec read 4,189 samples/s (3,589-6,801 over the
repetitions) while ``codec: none`` on the same storage read 8,661, and fresh processes
reading both files in turn gave equal rates; two targets were missed by that noise. So every
0-worker row runs in a process of its own that starts from the same clean state: a
:class:`Zygote` (a new interpreter, started once per read phase, that imports torch, h5py and
the readers and measures nothing; one per bench run, started at its first such row) forks
one child per row and repetition; the child unpickles
the row's :class:`~h5batch.bench.loaders.Recipe`, seeds torch with the bench's seed, builds
the loader, runs :func:`measure_loader` and sends its figures back as JSON. Forking skips
the ~1.5 s interpreter start and imports per row, which would have cost the quick bench
about a minute. The strict-limit rows, which first ran in new interpreters for the same
reason (:mod:`h5batch.bench.strict_ab`), run this way at every worker count. The other rows
with workers stay in the bench's process: their reading runs in the loader's worker
processes, started fresh for each row.

:func:`measure_loader` is the one measurement of every read row, in the bench's process or
in a child: a warm-up epoch (file opens, caches, workers), then ``epochs`` timed epochs,
with ``sampler.set_epoch`` before each as a training loop must. A row in its own process
times at least :data:`~h5batch.bench.strict_ab.MIN_EPOCHS` epochs: its start is not timed,
and one epoch of the quick bench (~0.1 s) is moved by half by one scheduling hiccup.
"""

from __future__ import annotations

import json
import os
import pickle
import resource
import select
import signal
import struct
import subprocess
import sys
import tempfile
import time
import traceback
from typing import Any

from .loaders import Recipe
from .measure import PeakRss, Sample, drain
from .records import close_loader

__all__ = ["FreshRead", "Zygote", "measure_loader", "to_sample"]

_ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
#: seconds a row's child may take (warm-up and timed epochs) before it is killed
ROW_TIMEOUT = 900.0


def measure_loader(loader: Any, epochs: int, consume: bool = False) -> dict[str, Any]:
    """One warm-up epoch, then ``epochs`` timed ones; the loader is closed after.

    Returns ``seconds`` (wall, timed epochs), ``samples``, ``warmup_samples``, ``cpu_seconds``
    and ``minor_faults`` (this process only, not its loader workers), ``peak_rss`` and
    ``baseline_rss`` (this process and its children)."""
    sampler = getattr(loader, "sampler", None)
    try:
        warm = drain(loader)  # warm-up epoch: worker start, file opens, caches
        f0 = resource.getrusage(resource.RUSAGE_SELF).ru_minflt
        with PeakRss() as mem:
            t0, c0, n = time.perf_counter(), time.process_time(), 0
            for epoch in range(epochs):
                if hasattr(sampler, "set_epoch"):  # as a training loop must, for a new order
                    sampler.set_epoch(epoch + 1)
                n += drain(loader, consume=consume)
            seconds, cpu = time.perf_counter() - t0, time.process_time() - c0
        faults = resource.getrusage(resource.RUSAGE_SELF).ru_minflt - f0
    finally:
        close_loader(loader)
    return {"seconds": seconds, "samples": n, "warmup_samples": warm, "cpu_seconds": cpu,
            "minor_faults": faults, "peak_rss": mem.peak, "baseline_rss": mem.baseline}


def to_sample(r: dict[str, Any], nbytes_per_sample: float, batch: int | None = None, **extra: Any) -> Sample:
    """A :func:`measure_loader` result as the bench's :class:`~h5batch.bench.measure.Sample`;
    its extras add ``cpu`` (samples per CPU-second of the measuring process) and, given the
    ``batch`` size, ``faults_per_batch`` (its minor page faults), as the strict rows had them."""
    keep = {k: r[k] for k in ("warmup_samples", "cpu_seconds", "minor_faults") if k in r}
    n = max(int(r["samples"]), 1)
    if r.get("cpu_seconds"):
        keep["cpu"] = r["samples"] / r["cpu_seconds"]
    if batch and "minor_faults" in r:
        keep["faults_per_batch"] = r["minor_faults"] * batch / n
    return Sample(r["seconds"], int(r["samples"]), r["samples"] * nbytes_per_sample, int(r["peak_rss"]),
                  int(r["baseline_rss"]), {**keep, **extra})


class Zygote:
    """A clean interpreter that imports the readers once, then forks one child per row.

    Each child starts from the same state (the imports, nothing measured before it), which
    is what a new interpreter gives, without paying the interpreter start and torch's import
    (~1.5 s here) for every row. The zygote runs no Python thread and touches no tensor:
    forking it is what a DataLoader does to start its workers. Its stderr (and the
    children's) goes to a temporary file, whose tail a failure quotes.
    """

    def __init__(self, code: str | None = None):
        self.code = code or _ROOT
        # The environment as it is now: construct the zygote before any LocalCluster starts.
        # BEWARE: distributed leaves its workers' settings in the client's os.environ
        # (OMP_NUM_THREADS, MKL_NUM_THREADS and OPENBLAS_NUM_THREADS 1, MALLOC_TRIM_THRESHOLD_
        # 65536); a zygote started after the conversions with them ran torch on one thread
        # (memmap-int16-rowwise 3,093 samples/s against ~6,000-10,000 in the bench's process).
        self.env = dict(os.environ)
        self._log: Any = None
        self._proc: subprocess.Popen[bytes] | None = None

    def _start(self) -> subprocess.Popen[bytes]:
        """The server, started on the first row (a read phase without one starts nothing)."""
        if self._proc is None:
            self._log = tempfile.TemporaryFile()
            env = dict(self.env)
            env["PYTHONPATH"] = os.pathsep.join([self.code, *filter(None, [env.get("PYTHONPATH")])])
            self._proc = subprocess.Popen([sys.executable, "-m", "h5batch.bench.fresh_reads", "--serve"], env=env,
                                          stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=self._log)
        return self._proc

    def run(self, job: dict[str, Any]) -> dict[str, Any]:
        """One row's :func:`measure_loader` figures, from a child forked for it."""
        data = pickle.dumps(job)
        proc = self._start()
        try:
            proc.stdin.write(struct.pack("<Q", len(data)) + data)
            proc.stdin.flush()
            reply = _read_frame(proc.stdout)
        except (BrokenPipeError, EOFError) as e:
            raise RuntimeError(f"read row {job['recipe']}: the fork server (pid {proc.pid}) "
                               f"stopped (exit code {proc.poll()}):\n{self._tail()}") from e
        r = json.loads(reply)
        if not r.get("ok"):
            raise RuntimeError(f"read row {job['recipe']} failed in its own process: {r.get('error')}\n"
                               f"{self._tail()}")
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


class FreshRead:
    """One read row measured in a process of its own, forked from a :class:`Zygote`."""

    def __init__(self, recipe: Recipe, seed: int = 0, consume: bool = False):
        self.recipe, self.seed, self.consume = recipe, seed, consume

    def run(self, zygote: Zygote, epochs: int) -> dict[str, Any]:
        return zygote.run({"recipe": self.recipe, "epochs": epochs, "seed": self.seed, "consume": self.consume})

    def sample(self, zygote: Zygote, epochs: int, nbytes_per_sample: float) -> Sample:
        return to_sample(self.run(zygote, epochs), nbytes_per_sample, self.recipe.args.get("batch"),
                         fresh_process=True)


def _read_frame(f: Any) -> bytes:
    head = f.read(8)
    if len(head) < 8:
        raise EOFError
    (n,) = struct.unpack("<Q", head)
    data = f.read(n)
    if len(data) < n:
        raise EOFError
    return data


def _row(data: bytes) -> dict[str, Any]:
    import torch

    job = pickle.loads(data)
    torch.manual_seed(job["seed"])  # shuffle=True draws its order from torch's global generator
    return {**measure_loader(job["recipe"](), job["epochs"], job["consume"]), "pid": os.getpid()}


def _fork_row(data: bytes) -> bytes:
    """Fork; the child measures the row and writes ``{"ok", "result" | "error"}`` to a pipe."""
    r, w = os.pipe()
    pid = os.fork()
    if pid == 0:  # the child: never returns
        os.close(r)
        try:
            reply = {"ok": True, "result": _row(data)}
        except BaseException:  # noqa: B036 - the child must answer whatever happened
            tb = traceback.format_exc()
            reply = {"ok": False, "error": f"{tb.strip().splitlines()[-1]}\n{tb}"}
        with os.fdopen(w, "wb") as out:
            out.write(json.dumps(reply).encode())
        sys.stderr.flush()
        os._exit(0)
    os.close(w)
    with os.fdopen(r, "rb") as f:
        ready, _, _ = select.select([f], [], [], ROW_TIMEOUT)
        if not ready:  # a row that hangs must not hang the bench
            os.kill(pid, signal.SIGKILL)
        reply_bytes = f.read() if ready else b""
    _, status = os.waitpid(pid, 0)
    if not reply_bytes:
        why = f"no answer in {ROW_TIMEOUT:g} s, killed" if not ready else f"the child died (wait status {status})"
        reply_bytes = json.dumps({"ok": False, "error": why}).encode()
    return reply_bytes


def _serve() -> None:
    import h5py  # noqa: F401 - the readers' imports, done once before any fork
    import torch  # noqa: F401
    import torch.utils.data  # noqa: F401

    from .. import torch as _reader  # noqa: F401
    from . import baselines  # noqa: F401

    inp = sys.stdin.buffer
    out = os.fdopen(os.dup(1), "wb")
    os.dup2(2, 1)  # a library printing to stdout must not break the frames
    while True:
        try:
            data = _read_frame(inp)
        except EOFError:
            return
        reply = _fork_row(data)
        out.write(struct.pack("<Q", len(reply)) + reply)
        out.flush()


if __name__ == "__main__":
    _serve()
