"""Resident memory of a DataLoader's processes over an epoch (does the reader leak?).

A test tool, not part of the reader: ``tests/test_reader.py`` runs it to check that a
worker's memory stays flat over an epoch, and docs/reader.md shows how to run it by hand.
"""

from __future__ import annotations

import os
from collections.abc import Iterable
from dataclasses import dataclass, field

import psutil


@dataclass
class RssReport:
    """RSS in bytes per process: after ``warmup`` batches and at the last batch.

    ``workers`` maps a worker pid to ``(rss_after_warmup, rss_at_end)``; a worker that
    started after the warm-up batches is measured from its first sighting.
    """

    batches: int
    warmup: int
    main: tuple[int, int]
    workers: dict[int, tuple[int, int]] = field(default_factory=dict)

    def growth(self) -> dict[str, float]:
        """End / warm-up RSS per process (``main`` and ``worker <pid>``)."""
        out = {"main": self.main[1] / self.main[0]}
        for pid, (a, b) in self.workers.items():
            out[f"worker {pid}"] = b / a
        return out


def _rss(p: psutil.Process) -> int | None:
    try:
        return p.memory_info().rss
    except (psutil.NoSuchProcess, psutil.AccessDenied):
        return None


def rss_over_epoch(loader: Iterable, warmup: int = 10) -> RssReport:
    """Iterate ``loader`` once, sampling the RSS of this process and of its workers.

    Workers are taken from the DataLoader iterator (``_workers``, a private attribute torch
    has had for years); for other iterables, child processes that did not exist before the
    iteration began. Each worker's RSS is sampled at every batch from ``warmup`` on; its
    last sample is the end value.
    """
    me = psutil.Process(os.getpid())
    before = {c.pid for c in me.children(recursive=False)}
    main_warm = main_end = _rss(me) or 0
    warm: dict[int, int] = {}
    last: dict[int, int] = {}
    procs: dict[int, psutil.Process] = {}
    it = iter(loader)
    n = 0
    for n, _batch in enumerate(it, start=1):
        del _batch
        if n < warmup:
            continue
        rss = _rss(me)
        if n == warmup:
            main_warm = rss or main_warm
        main_end = rss or main_end
        for p in _workers(it, me, before, procs):
            r = _rss(p)
            if r is not None:
                warm.setdefault(p.pid, r)
                last[p.pid] = r
    return RssReport(n, warmup, (main_warm, main_end), {pid: (warm[pid], last[pid]) for pid in warm})


def _workers(it: object, me: psutil.Process, before: set[int],
             procs: dict[int, psutil.Process]) -> list[psutil.Process]:
    pids = [w.pid for w in getattr(it, "_workers", None) or []]
    if not pids:
        pids = [c.pid for c in me.children(recursive=False) if c.pid not in before]
    out = []
    for pid in pids:
        if pid not in procs:
            try:
                procs[pid] = psutil.Process(pid)
            except psutil.NoSuchProcess:
                continue
        out.append(procs[pid])
    return out
