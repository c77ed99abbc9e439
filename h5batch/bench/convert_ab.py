"""Conversion against the peers' writers, side by side, alternating: the bench's convert rows alone.

``python -m h5batch.bench.convert_ab [--pairs N] [--reps R] [--page-cache warm|cold]
[--methods a,b,...]`` converts the generated paired-audio corpus (``bench.corpus.paired_audio``,
made once under ``--cache``) with each method in turn, ``R`` rounds, the order rotated each
round, ``os.sync()`` before every run (as :mod:`.suite` does), and prints per method the
median pairs/s with its min-max, then each method's ratio to the best peer writer taken
round by round (pairing keeps a ratio meaningful while the shared machine's speed drifts).

Methods (the same functions the full bench times):

``h5batch``        ``convert`` on a LocalCluster started once here (start-up excluded), the
                   bench's ``h5batch`` row;
``h5batch-cold``   ``convert`` with ``cluster.kind: local``: it starts and stops its own
                   cluster, the bench's ``h5batch-cold`` row;
``h5batch-auto``   ``convert`` with ``cluster.kind: auto`` and no worker count, what
                   ``h5batch convert`` does on a fresh job (it may decode in-process);
``floor``          the decode-only floor (``bench.decode_only`` on the same batches and
                   cluster as ``h5batch``): with ``bench.physics``' bound, what the
                   conversion could reach;
``webdataset-2p``  ``peers.wds_convert`` in 2 processes; ``litdata-fork``
                   ``peers.litdata_convert(start_method="fork")``.

``--page-cache cold`` evicts the corpus's files from the page cache before every run
(``posix_fadvise(POSIX_FADV_DONTNEED)``: no root needed; the files are read from the disk
again), so a run pays its reads as a first conversion after a reboot would.
Reason for a module of its own: the full bench takes ~an hour; this answers "how far ahead
of the peers is conversion" in a minute, with the same code paths.
"""

from __future__ import annotations

import argparse
import glob
import io
import logging
import os
import shutil
import statistics
import sys
import tempfile
import time
from collections.abc import Callable

from ..conversion.options import ConvertOptions
from ..conversion.pipeline import convert
from . import corpus, peers
from .convert_child import remove_output

METHODS = ("h5batch", "h5batch-cold", "h5batch-auto", "floor", "webdataset-2p", "litdata-fork")
PEER_WRITERS = ("webdataset-2p", "litdata-fork")


def evict(paths: list[str]) -> None:
    """Drop the clean page-cache pages of ``paths`` (the next read comes from the disk)."""
    for p in paths:
        fd = os.open(p, os.O_RDONLY)
        try:
            os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
        finally:
            os.close(fd)


def tree_cpu() -> float:
    """User + system CPU-seconds of this process, its live descendants and every
    descendant reaped so far (a parent's ``children_*`` times). Reason: on a shared machine
    wall time depends on the neighbours; CPU time much less."""
    import psutil

    me = psutil.Process()
    total = 0.0
    for p in [me, *me.children(recursive=True)]:
        try:
            t = p.cpu_times()
        except psutil.Error:
            continue
        total += t.user + t.system + t.children_user + t.children_system
    return total


class Runner:
    """The methods over one corpus; :meth:`run` times one of them once (seconds)."""

    def __init__(self, cp: corpus.Corpus, work: str, workers: int = 2):
        self.cp, self.work, self.workers = cp, work, workers
        m = cp.manifest()
        self.items = corpus.item_paths(m)
        self.files = [p for it in self.items for p in it]
        self.fields = tuple(cp.job(os.path.join(work, "x.h5")).fields.items())
        self.cluster = self.client = None
        self.outputs: dict[str, str] = {}  # method -> its output, removed before each timed run

    def start_cluster(self) -> None:
        from distributed import Client, LocalCluster

        self.cluster = LocalCluster(n_workers=self.workers, threads_per_worker=1, processes=True,
                                    host="127.0.0.1", dashboard_address=None, silence_logs=logging.ERROR)
        self.client = Client(self.cluster)

    def close(self) -> None:
        if self.client is not None:
            self.client.close()
            self.cluster.close()

    def _h5(self, name: str, cluster: dict) -> Callable[[], int]:
        out = self.outputs[name] = os.path.join(self.work, "h5batch.h5")

        def run() -> int:
            s = convert(self.cp.job(out, "auto", cluster),
                        ConvertOptions(overwrite=True, restart=True, progress="none", log=io.StringIO()))
            return s.samples
        return run

    def method(self, name: str) -> Callable[[], int]:
        if name == "h5batch":
            if self.client is None:
                self.start_cluster()
            return self._h5(name, {"kind": "address", "address": self.cluster.scheduler_address,
                             "workers": self.workers})
        if name == "h5batch-cold":
            return self._h5(name, {"kind": "local", "workers": self.workers})
        if name == "h5batch-auto":
            return self._h5(name, {"kind": "auto"})
        if name == "floor":
            from ..conversion.plan import make_tasks
            from .decode_only import decode_only

            if self.client is None:
                self.start_cluster()
            tasks = make_tasks(self.cp.job(os.path.join(self.work, "x.h5")), self.cp.manifest(), "floor", "")
            return lambda: sum(n for n, _ in self.client.gather(self.client.map(decode_only, tasks, pure=False)))
        if name == "webdataset-2p":
            out = self.outputs[name] = os.path.join(self.work, "wds")
            n = len(self.items)
            return lambda: peers.wds_convert(self.items, self.fields, out, self.workers, max(16, n // 16))["samples"]
        if name == "litdata-fork":
            out = self.outputs[name] = os.path.join(self.work, "litdata")
            return lambda: peers.litdata_convert(self.items, self.fields, out, self.workers, "fork")["samples"]
        raise ValueError(f"unknown method {name!r}; choose from {', '.join(METHODS)}")

    def run(self, name: str, fn: Callable[[], int], cold: bool) -> tuple[float, float]:
        """(wall seconds, CPU-seconds of the process tree) of one run. The previous run's
        output is removed first, outside the timing, as the full bench does (suite.remove_output:
        dropping ~500 MB of cached pages took 0.05-0.1 s here, no conversion work)."""
        if name in self.outputs:
            remove_output(self.outputs[name])
        os.sync()
        if cold:
            evict(self.files)
        c0, t0 = tree_cpu(), time.perf_counter()
        n = fn()
        seconds, cpu = time.perf_counter() - t0, tree_cpu() - c0
        if n != len(self.items):
            raise RuntimeError(f"{name} wrote {n} samples, expected {len(self.items)}")
        return seconds, cpu


def rounds(runner: Runner, methods: list[str], reps: int, cold: bool,
           say=print) -> dict[str, list[tuple[float, float]]]:
    """``reps`` rounds of every method (order rotated per round); (wall, CPU) seconds per run."""
    fns = {m: runner.method(m) for m in methods}
    for m in methods:  # one untimed warm-up each: imports, fork servers, the corpus's pages
        runner.run(m, fns[m], False)
    times: dict[str, list[tuple[float, float]]] = {m: [] for m in methods}
    for rep in range(reps):
        k = rep % len(methods)
        for m in methods[k:] + methods[:k]:
            times[m].append(runner.run(m, fns[m], cold))
        say(f"round {rep + 1}/{reps}: " + ", ".join(f"{m} {times[m][-1][0]:.2f} s ({times[m][-1][1]:.2f} CPU-s)"
                                                      for m in methods))
    return times


def _spread(values: list[float], fmt: str) -> str:
    v = sorted(values)
    return f"{statistics.median(v):{fmt}} ({v[0]:{fmt}}-{v[-1]:{fmt}})"


def report(times: dict[str, list[tuple[float, float]]], n: int) -> list[str]:
    """Lines: pairs/s and CPU-s per method (median, min-max), and per h5batch method its
    ratio to the best peer writer of the same round, by wall time and by CPU time."""
    lines = []
    for m, ts in times.items():
        lines.append(f"{m:14s} {_spread([n / w for w, _ in ts], ',.0f')} pairs/s, "
                     f"{_spread([c for _, c in ts], '.2f')} CPU-s, {len(ts)} runs")
    peer = [m for m in PEER_WRITERS if m in times]
    if peer:
        rounds_ = range(len(times[peer[0]]))
        best = [min(times[m][r][0] for m in peer) for r in rounds_]
        best_cpu = [min(times[m][r][1] for m in peer) for r in rounds_]
        for m in times:
            if m.startswith("h5batch"):
                wall = [b / w for b, (w, _) in zip(best, times[m])]
                cpu = [b / c for b, (_, c) in zip(best_cpu, times[m])]
                lines.append(f"{m} / best peer writer: wall {_spread(wall, '.2f')}x, CPU {_spread(cpu, '.2f')}x")
    if "floor" in times:
        for m in times:
            if m.startswith("h5batch"):
                floor = [f / w for (f, _), (w, _) in zip(times["floor"], times[m])]
                lines.append(f"{m} / decode-only floor: wall {_spread(floor, '.2f')}x")
    return lines


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m h5batch.bench.convert_ab", description=__doc__.split("\n\n")[0])
    ap.add_argument("--pairs", type=int, default=4096)
    ap.add_argument("--reps", type=int, default=5)
    ap.add_argument("--page-cache", choices=("warm", "cold"), default="warm")
    ap.add_argument("--methods", default="h5batch,h5batch-cold,webdataset-2p,litdata-fork")
    ap.add_argument("--cache", default=os.path.join("data", "bench"), help="generated corpora (made once)")
    ap.add_argument("--work", default=None, help="scratch folder for the outputs (default: a temporary one)")
    args = ap.parse_args(argv)
    methods = [m.strip() for m in args.methods.split(",") if m.strip()]
    for m in methods:
        if m not in METHODS:
            ap.error(f"unknown method {m!r}; choose from {', '.join(METHODS)}")
        if m in PEER_WRITERS and not peers.available(m.split("-")[0])[0]:
            ap.error(f"{m}: {peers.available(m.split('-')[0])[1]} (install requirements-peers.txt)")
    cp = corpus.paired_audio(args.cache, args.pairs)
    work = args.work or tempfile.mkdtemp(prefix="h5batch-convert-ab-", dir=os.path.join("bench", "results")
                                         if os.path.isdir(os.path.join("bench", "results")) else None)
    os.makedirs(work, exist_ok=True)
    runner = Runner(cp, work)
    print(f"{cp.name}: {len(runner.items)} pairs, page cache {args.page_cache}, load {os.getloadavg()[0]:.1f}",
          flush=True)
    try:
        times = rounds(runner, methods, args.reps, args.page_cache == "cold", lambda s: print(s, flush=True))
    finally:
        runner.close()
        for p in glob.glob(os.path.join(work, "*")):
            remove_output(p)
        if args.work is None:  # the temporary folder made above
            shutil.rmtree(work, ignore_errors=True)
    print("\n".join(report(times, len(runner.items))))
    print(f"load average at the end {os.getloadavg()[0]:.1f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
