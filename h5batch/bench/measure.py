"""A row in a process of its own, timed and sampled from outside; statistics of repetitions.

Rule: every row of the bench runs in a new interpreter: the whole ``h5batch convert``
command, the naive recipe's or a peer's script (:func:`call`), a DataLoader's epochs
(:func:`read_row`). Reason: each pays its own start and imports, as a user's command or
training script does, and none inherits the bench's heap, threads or environment (in the
bench's own process a 0-worker read row moved 2x with the heap's history, and a live Dask
client's threads changed how a conversion started its writer). The bench samples the RSS of
the row's process tree from outside and counts its CPU time when the tree is reaped.
"""

from __future__ import annotations

import contextlib
import json
import pickle
import resource
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Iterable
from typing import Any

ROW_TIMEOUT = 1800.0  # seconds; a row that takes longer has hung
RSS_INTERVAL = 0.05  # seconds between two samples of the tree's RSS


def tree_rss(pid: int) -> int:
    """RSS of process ``pid`` and all its descendants, in bytes (pages shared between them
    counted once per process, as ``top`` shows them; 0 once it has exited)."""
    import psutil

    try:
        root = psutil.Process(pid)
        procs = [root, *root.children(recursive=True)]
    except psutil.Error:
        return 0
    total = 0
    for p in procs:
        with contextlib.suppress(psutil.Error):  # exited between listing and reading
            total += p.memory_info().rss
    return total


def run(argv: list[str]) -> dict[str, Any]:
    """Run ``argv`` to its end: ``{"wall", "cpu_seconds", "peak_rss", "result"}``, where
    ``result`` is the JSON of its last line on stdout. Raises with its stderr when it fails."""
    with tempfile.TemporaryFile() as out, tempfile.TemporaryFile() as err:
        ru0 = resource.getrusage(resource.RUSAGE_CHILDREN)
        t0 = time.perf_counter()
        proc = subprocess.Popen(argv, stdout=out, stderr=err)
        peak = 0
        while proc.poll() is None:
            if time.perf_counter() - t0 > ROW_TIMEOUT:
                proc.kill()
            peak = max(peak, tree_rss(proc.pid))
            time.sleep(RSS_INTERVAL)
        wall = time.perf_counter() - t0
        ru1 = resource.getrusage(resource.RUSAGE_CHILDREN)
        out.seek(0)
        err.seek(0)
        stdout, stderr = out.read().decode(errors="replace"), err.read().decode(errors="replace")
    if proc.returncode != 0:
        raise RuntimeError(f"{' '.join(argv[:5])} ... failed ({proc.returncode}):\n{stderr[-3000:]}")
    lines = stdout.strip().splitlines()
    return {"wall": wall, "peak_rss": peak, "result": json.loads(lines[-1]) if lines else None,
            "cpu_seconds": (ru1.ru_utime + ru1.ru_stime) - (ru0.ru_utime + ru0.ru_stime)}


def call(fn: Callable[..., dict[str, Any]], *args: Any, scratch: str | None = None) -> dict[str, Any]:
    """``fn(*args)`` in a new interpreter (:func:`run`); ``fn`` must be a module-level function.
    The arguments travel in a pickle written before the timing starts (a script has them in
    its source)."""
    with tempfile.NamedTemporaryFile(suffix=".pkl", dir=scratch) as f:
        pickle.dump((fn, args), f)
        f.flush()
        return run([sys.executable, "-c", "from h5batch.bench.measure import child; child()", f.name])


def child() -> None:
    """The entry of :func:`call`'s interpreter: run the pickled call, print its JSON result."""
    with open(sys.argv[1], "rb") as f:
        fn, args = pickle.load(f)
    print(json.dumps(fn(*args)), flush=True)


def read_row(build: Callable[..., Any], args: dict[str, Any], epochs: int, seed: int = 0,
             consume: bool = False) -> dict[str, Any]:
    """A read row in its process: the loader ``build(**args)``, one untimed epoch (workers'
    start, file opens, caches), then ``epochs`` timed ones with ``sampler.set_epoch`` before
    each, as a training loop must. ``consume``: sum every tensor of every batch here, as a
    training step reads its input (otherwise a batch from a worker is never touched)."""
    import torch

    torch.manual_seed(seed)  # shuffle=True draws its order from torch's global generator
    loader = build(**args)
    sampler = getattr(loader, "sampler", None)
    drain(loader, consume)
    t0, c0, n = time.perf_counter(), time.process_time(), 0
    for epoch in range(epochs):
        if hasattr(sampler, "set_epoch"):
            sampler.set_epoch(epoch + 1)
        n += drain(loader, consume)
    return {"samples": n, "seconds": time.perf_counter() - t0, "cpu_seconds": time.process_time() - c0}


def drain(loader: Any, consume: bool = False) -> int:
    """Iterate ``loader`` to its end; the samples seen (the first dimension of each batch's
    first tensor)."""
    n = 0
    for batch in loader:
        tensors = [v for v in batch.values() if hasattr(v, "shape")]
        n += int(tensors[0].shape[0])
        if consume:
            sum(float(t.sum()) for t in tensors)
    return n


def summarize(values: Iterable[float]) -> dict[str, float]:
    """Median, min, max and relative spread ``(max - min) / median`` of repeated values."""
    v = sorted(values)
    if not v:
        return {"median": 0.0, "min": 0.0, "max": 0.0, "spread": 0.0, "n": 0}
    med = statistics.median(v)
    return {"median": med, "min": v[0], "max": v[-1], "spread": (v[-1] - v[0]) / med if med else 0.0, "n": len(v)}
