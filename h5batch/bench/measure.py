"""Timing, peak memory of a process tree, and the statistics of repeated measurements."""

from __future__ import annotations

import os
import statistics
import threading
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from typing import Any

import psutil


def tree_rss(root: psutil.Process) -> tuple[int, int]:
    """``(RSS of root and all its descendants, number of processes)`` in bytes.

    RSS counts pages shared between processes (forked workers, mapped files) once per
    process, so the sum over-states what the tree costs; it is the figure ``top`` shows.
    """
    procs = [root]
    try:
        procs += root.children(recursive=True)
    except psutil.Error:
        pass
    total = 0
    alive = 0
    for p in procs:
        try:
            total += p.memory_info().rss
            alive += 1
        except psutil.Error:  # exited between listing and reading
            pass
    return total, alive


class PeakRss:
    """Sample the RSS of this process and its descendants in a thread; keep the peak.

    >>> with PeakRss() as mem:        # doctest: +SKIP
    ...     work()
    >>> mem.peak, mem.baseline        # doctest: +SKIP
    """

    def __init__(self, interval: float = 0.05, pid: int | None = None):
        self.interval = interval
        self.root = psutil.Process(pid or os.getpid())
        self.baseline = 0
        self.peak = 0
        self.peak_procs = 0
        self.samples = 0
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    def _poll(self) -> None:
        total, n = tree_rss(self.root)
        self.samples += 1
        if total > self.peak:
            self.peak, self.peak_procs = total, n

    def _run(self) -> None:
        while not self._stop.wait(self.interval):
            self._poll()

    def __enter__(self) -> PeakRss:
        self.baseline, _ = tree_rss(self.root)
        self.peak = self.baseline
        self._thread = threading.Thread(target=self._run, name="h5batch-bench-rss", daemon=True)
        self._thread.start()
        return self

    def __exit__(self, *exc: Any) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join()
        self._poll()


@dataclass
class Sample:
    """One timed run: seconds, work done and peak tree RSS."""

    seconds: float
    items: int
    nbytes: float
    peak_rss: int
    baseline_rss: int
    extra: dict[str, Any] = field(default_factory=dict)

    @property
    def rate(self) -> float:
        return self.items / self.seconds if self.seconds > 0 else 0.0

    @property
    def mbps(self) -> float:
        return self.nbytes / 1e6 / self.seconds if self.seconds > 0 else 0.0

    def to_dict(self) -> dict[str, Any]:
        return {"seconds": self.seconds, "items": self.items, "bytes": self.nbytes, "rate": self.rate,
                "mb_per_s": self.mbps, "peak_rss": self.peak_rss, "baseline_rss": self.baseline_rss,
                **self.extra}


def timed(fn: Callable[[], Any], items: Callable[[Any], int] | int,
          nbytes: Callable[[Any], float] | float) -> tuple[Sample, Any]:
    """Run ``fn`` under :class:`PeakRss`; ``items``/``nbytes`` are numbers or functions of its result."""
    with PeakRss() as mem:
        t0 = time.perf_counter()
        result = fn()
        seconds = time.perf_counter() - t0
    n = items(result) if callable(items) else items
    b = nbytes(result) if callable(nbytes) else nbytes
    return Sample(seconds, int(n), float(b), mem.peak, mem.baseline), result


def summarize(values: Iterable[float]) -> dict[str, float]:
    """Median, min, max and relative spread ``(max - min) / median`` of repeated values."""
    v = sorted(values)
    if not v:
        return {"median": 0.0, "min": 0.0, "max": 0.0, "spread": 0.0, "n": 0}
    med = statistics.median(v)
    return {"median": med, "min": v[0], "max": v[-1],
            "spread": (v[-1] - v[0]) / med if med else 0.0, "n": len(v)}


def drain(loader: Any, limit: int | None = None, count: Callable[[Any], int] | None = None,
          consume: bool = False) -> int:
    """Iterate ``loader`` to the end (or ``limit`` samples); return the samples seen.

    ``consume``: read every batch as a training step would, summing each of its tensors in
    this process (otherwise the pages of a batch from a DataLoader worker are never touched
    here, and what touching them costs is not measured).
    """
    n = 0
    for batch in loader:
        n += count(batch) if count else batch_len(batch)
        if consume:
            touch(batch)
        if limit is not None and n >= limit:
            break
    return n


def touch(batch: Any) -> float:
    """Sum every tensor / array of a batch (a dict, list or tuple of them, or one)."""
    items = batch.values() if isinstance(batch, dict) else batch if isinstance(batch, (list, tuple)) else [batch]
    total = 0.0
    for x in items:
        if hasattr(x, "sum") and getattr(x, "ndim", 0) > 0:
            total += float(x.sum())
    return total


def batch_len(batch: Any) -> int:
    """Samples in a batch: the first dimension of its first tensor/array (or list length)."""
    if isinstance(batch, dict):
        batch = next(iter(batch.values()))
    elif isinstance(batch, (tuple, list)) and batch and not isinstance(batch[0], (int, float, str)):
        batch = batch[0]
    shape = getattr(batch, "shape", None)
    if shape is not None:
        return int(shape[0])
    return len(batch)


def run_command(argv: list[str], interval: float = 0.1) -> tuple[int, float, PeakRss]:
    """Run ``argv`` and sample its process tree's RSS every ``interval`` seconds.

    Returns ``(exit code, wall seconds, the PeakRss)``; ``peak`` is in bytes.
    """
    import subprocess

    t0 = time.perf_counter()
    proc = subprocess.Popen(argv)
    with PeakRss(interval=interval, pid=proc.pid) as mem:
        code = proc.wait()
    return code, time.perf_counter() - t0, mem


def main(argv: list[str] | None = None) -> int:
    """``python -m h5batch.bench.measure [--interval S] -- COMMAND ...``: wall time and peak
    RSS of a command's whole process tree (driver, Dask workers, writer), as the README's
    large-run figures were measured. Exits with the command's exit code."""
    import argparse

    parser = argparse.ArgumentParser(prog="python -m h5batch.bench.measure", description=main.__doc__)
    parser.add_argument("--interval", type=float, default=0.1, help="seconds between RSS samples (default 0.1)")
    parser.add_argument("command", nargs=argparse.REMAINDER, help="the command to run, after --")
    args = parser.parse_args(argv)
    command = args.command[1:] if args.command[:1] == ["--"] else args.command
    if not command:
        parser.error("no command given (put it after --)")
    code, wall, mem = run_command(command, args.interval)
    print(f"wall {wall:.2f} s, peak RSS of the process tree {mem.peak / 1e6:,.0f} MB "
          f"({mem.peak_procs} processes), exit code {code}", flush=True)
    return code


if __name__ == "__main__":
    raise SystemExit(main())
