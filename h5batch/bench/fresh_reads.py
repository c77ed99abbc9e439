"""The read phase's rows at ``num_workers=0``, each measured in a process of its own.

Rule: a row without DataLoader workers reads, decodes and batches in the process that times
it, so where that process is the bench's own (its heap shaped by the conversions, checks and
every row before) the row's figure moves with the C library's heap: in one full run the
0-worker chunk-shuffle row of the default codec read 4,189 samples/s (3,589-6,801 over the
repetitions) while ``codec: none`` on the same storage read 8,661, and fresh processes
reading both files in turn gave equal rates; two targets were missed by that noise. So every
0-worker row runs in a process of its own that starts from the same clean state: a
:class:`~h5batch.bench.zygote.Zygote` (a new interpreter that imports torch, h5py and the
readers and measures nothing; one per bench run, started at its first such row) forks one
child per row and repetition; the child (:func:`read_row`) unpickles
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

import resource
import time
from typing import Any

from .loaders import Recipe
from .measure import PeakRss, Sample, drain
from .records import close_loader
from .zygote import Zygote

__all__ = ["FreshRead", "Zygote", "measure_loader", "read_row", "to_sample"]


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


class FreshRead:
    """One read row measured in a process of its own, forked from a :class:`Zygote`."""

    def __init__(self, recipe: Recipe, seed: int = 0, consume: bool = False):
        self.recipe, self.seed, self.consume = recipe, seed, consume

    def run(self, zygote: Zygote, epochs: int) -> dict[str, Any]:
        return zygote.call(read_row, {"recipe": self.recipe, "epochs": epochs, "seed": self.seed,
                                      "consume": self.consume}, f"read row {self.recipe}")

    def sample(self, zygote: Zygote, epochs: int, nbytes_per_sample: float) -> Sample:
        return to_sample(self.run(zygote, epochs), nbytes_per_sample, self.recipe.args.get("batch"),
                         fresh_process=True)


def read_row(job: dict[str, Any]) -> dict[str, Any]:
    """The zygote child's handler of a read row: build its loader and measure it."""
    import torch

    torch.manual_seed(job["seed"])  # shuffle=True draws its order from torch's global generator
    return measure_loader(job["recipe"](), job["epochs"], job["consume"])
