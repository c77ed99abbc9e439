"""The strict read limit against h5batch, each read row in a fresh process (issue 19 item 3).

Why fresh processes: the limit (:class:`~h5batch.bench.strict.StrictMemmapDataset`)
allocates two 8 MB arrays per batch, and whether the C library serves them from pages its
heap kept or maps fresh ones (each faulted in and zeroed) depends on what ran before in the
process: in the bench's read phase, where every configuration runs in one process, the
limit measured 4,028-15,312 samples/s on the same machine, and h5batch's ratio to it moved
with it. Here every row (the limit, h5batch on each storage, optionally under several code
trees) runs alone in a new interpreter: one warm-up epoch, then ``epochs`` timed epochs
(wall and process CPU time). The bench's read phase measures its strict rows in processes of
their own too, forked from one clean interpreter (:func:`read_plan`,
:mod:`h5batch.bench.fresh_reads`). Rows are rotated each repetition and the ratio is taken per
repetition against the limit of the same repetition, so a drift of the machine's speed
cancels; the report gives the median and the range of those ratios.

``python -m h5batch.bench.strict_ab --memmap DIR --file NAME=PATH ... [--code TAG=DIR ...]``
(``DIR`` holds the limit's ``<field>.npy``; ``--code`` runs h5batch's rows with ``DIR``
first on ``PYTHONPATH``, for a before / after of the reader; the limit runs under the first
tree). ``--one`` is the child's entry point.
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import subprocess
import sys
import time
from typing import Any

import numpy as np

LIMIT = "memmap-strict"
#: the limit with its output preallocated (a reference, not the target's yardstick)
PREALLOC = "memmap-strict-prealloc"
#: timed epochs a bench row runs at least in its process: the quick bench asks for one epoch of
#: 1,024 samples, ~0.1 s, which one scheduling hiccup on a shared machine moves by half
MIN_EPOCHS = 4
_ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


class PreallocMemmapDataset:
    """The strict limit's gather into preallocated output, ``np.take(mm, idx, out=buf, mode="clip")``,
    with ``buf`` one of :data:`SLOTS` arrays per field used in turn, so no batch faults in a
    page. BEWARE: a caller holding more than ``SLOTS - 1`` batches sees them overwritten; it
    shows what the limit costs without its allocation, for ``num_workers=0`` only."""

    SLOTS = 3

    def __init__(self, paths: dict[str, str]):
        from .strict import StrictMemmapDataset

        self.inner = StrictMemmapDataset(paths)
        self.turn = 0
        self.bufs: dict[tuple[str, int, int], np.ndarray] = {}

    def __len__(self) -> int:
        return len(self.inner)

    def __getitems__(self, indices: Any) -> dict[str, Any]:
        import torch

        if self.inner._maps is None:
            self.inner._maps = {k: np.load(p, mmap_mode="r") for k, p in self.inner.paths.items()}
        idx = np.sort(np.asarray(indices, dtype=np.int64))
        self.turn = (self.turn + 1) % self.SLOTS
        out = {}
        for k, mm in self.inner._maps.items():
            buf = self.bufs.get((k, self.turn, len(idx)))
            if buf is None:
                buf = self.bufs[(k, self.turn, len(idx))] = np.empty((len(idx), *mm.shape[1:]), mm.dtype)
            out[k] = torch.from_numpy(np.take(mm, idx, axis=0, out=buf, mode="clip"))  # "raise" buffers: 2.5x slower
        return out


def _child(args: argparse.Namespace) -> None:
    """One row in this process: print ``{"wall": samples/s, "cpu": samples/s,
    "faults_per_batch": minor page faults of this process}`` (CPU and faults: this process
    only, not its DataLoader workers)."""
    import torch

    from . import loaders
    from .baselines import passthrough
    from .measure import PeakRss, drain
    from .records import close_loader

    if args.row == LIMIT:
        loader: Any = loaders.memmap_strict(args.memmap, args.workers, args.batch)
    elif args.row == PREALLOC:
        loader = loaders.dataloader(PreallocMemmapDataset(loaders.memmap_paths(args.memmap)), args.workers,
                                    args.batch, shuffle=True, collate_fn=passthrough)
    else:
        loader = loaders.h5_loader(args.row, args.workers, args.batch, args.seed)
    torch.manual_seed(args.seed)
    sampler = getattr(loader, "sampler", None)
    try:
        warm = drain(loader)  # warm-up epoch: workers, file opens, the batch pools
        f0 = resource.getrusage(resource.RUSAGE_SELF).ru_minflt
        with PeakRss() as mem:
            w0, c0, n = time.perf_counter(), time.process_time(), 0
            for epoch in range(args.epochs):
                if hasattr(sampler, "set_epoch"):
                    sampler.set_epoch(epoch + 1)
                n += drain(loader, consume=args.consume)
            wall, cpu = time.perf_counter() - w0, time.process_time() - c0
        faults = (resource.getrusage(resource.RUSAGE_SELF).ru_minflt - f0) * args.batch / max(n, 1)
    finally:
        close_loader(loader)
    print(json.dumps({"wall": n / wall, "cpu": n / cpu, "faults_per_batch": faults, "seconds": wall,
                      "samples": n, "warmup_samples": warm, "peak_rss": mem.peak, "baseline_rss": mem.baseline}))


class FreshRow:
    """One read row measured in a new interpreter: ``row`` is :data:`LIMIT`, :data:`PREALLOC`
    or the path of an h5batch file (read with ``H5Dataset(path, "train").loader(...)``);
    ``code`` a tree put first on ``PYTHONPATH`` (default: the one this module is in)."""

    def __init__(self, row: str, memmap: str, workers: int, batch: int = 64, seed: int = 0,
                 consume: bool = False, code: str | None = None):
        self.row, self.memmap, self.workers = row, memmap, workers
        self.batch, self.seed, self.consume, self.code = batch, seed, consume, code or _ROOT

    def run(self, epochs: int, timeout: float = 600) -> dict[str, float]:
        """The child's figures (see :func:`_child`); raises ``RuntimeError`` with its stderr."""
        env = dict(os.environ)
        env["PYTHONPATH"] = os.pathsep.join([self.code, *filter(None, [env.get("PYTHONPATH")])])
        cmd = [sys.executable, "-m", "h5batch.bench.strict_ab", "--one", "--row", self.row,
               "--memmap", self.memmap, "--workers", str(self.workers), "--epochs", str(epochs),
               "--batch", str(self.batch), "--seed", str(self.seed), *(["--consume"] if self.consume else [])]
        done = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=timeout)
        if done.returncode != 0:
            raise RuntimeError(f"strict read row {self.row!r} (code {self.code}) failed in its own process:\n"
                               f"{done.stderr[-2000:]}")
        return json.loads(done.stdout.strip().splitlines()[-1])


def read_plan(bench: Any, spec: dict[str, Any], nw: int) -> list[tuple[Any, Any]]:
    """The bench's read rows of the strict limit and of h5batch on every storage at
    ``num_workers=nw`` (:mod:`h5batch.bench.strict`), each a
    :class:`~h5batch.bench.fresh_reads.FreshRead`: the read phase measures it in a process of
    its own (forked from a clean interpreter), so the limit's figure does not depend on what
    the bench's process ran before it (its two fresh 8 MB arrays a batch fault in or not as
    the C library's heap history decides: 4,000-15,000 samples/s in one process)."""
    if "strict_memmap" not in spec:
        return []
    from . import loaders
    from .fresh_reads import FreshRead
    from .loaders import Recipe
    from .records import MEMMAP_STRICT, strict_variant

    cp = spec["corpus"]
    kw: dict[str, Any] = dict(workers=nw, batch=bench.cfg.batch_size)
    fresh = dict(seed=bench.cfg.seed, consume=bench.cfg.consume)
    folder = os.path.dirname(next(iter(spec["strict_memmap"].values())))
    plan = [(bench.record("read", cp.name, MEMMAP_STRICT, "", "random", nw),
             FreshRead(Recipe(loaders.memmap_strict, {"folder": folder, **kw}), **fresh))]
    for dtype, fixed, codec, path, chosen in spec["strict_files"]:
        rec = bench.record("read", cp.name, "h5batch", codec, strict_variant(dtype, fixed), nw)
        rec.info["field_codecs"] = chosen
        plan.append((rec, FreshRead(Recipe(loaders.h5_loader, {"path": path, "seed": bench.cfg.seed, **kw}),
                                    **fresh)))
    return plan


def _run_one(row: str, code: str | None, args: argparse.Namespace, workers: int) -> dict[str, float]:
    return FreshRow(row, args.memmap, workers, args.batch, code=code or None).run(args.epochs)


def run(args: argparse.Namespace) -> dict[str, Any]:
    """Every row of every code tree ``args.reps`` times per worker count, rotated."""
    files = dict(f.split("=", 1) for f in args.file)
    codes = dict(c.split("=", 1) for c in args.code) or {"cwd": ""}
    first = next(iter(codes.values()))
    out: dict[str, Any] = {}
    for nw in args.workers:
        rows = [(LIMIT, "", first)] + [(name, tag, d) for tag, d in codes.items() for name in files]
        if args.prealloc and nw == 0:
            rows.insert(1, (PREALLOC, "", first))
        got: dict[tuple[str, str], list[dict[str, float]]] = {(r, t): [] for r, t, _ in rows}
        for rep in range(args.reps):
            k = rep % len(rows)
            for name, tag, code in rows[k:] + rows[:k]:
                got[(name, tag)].append(_run_one(files.get(name, name), code or None, args, nw))
        out[str(nw)] = summarize(got)
        print(f"num_workers={nw}", file=sys.stderr)
        for key, s in out[str(nw)].items():
            print(f"  {key:40s} {s['rate']:9,.0f} samples/s  x limit wall {s['wall']:.2f} "
                  f"({s['wall_lo']:.2f}-{s['wall_hi']:.2f})  cpu {s['cpu']:.2f} ({s['cpu_lo']:.2f}-{s['cpu_hi']:.2f})",
                  file=sys.stderr)
    return out


def summarize(got: dict[tuple[str, str], list[dict[str, float]]]) -> dict[str, dict[str, float]]:
    """Per row: median samples/s, and the median and range of its per-repetition ratio to the limit."""
    limit = got[(LIMIT, "")]
    res = {}
    for (name, tag), runs in got.items():
        s: dict[str, float] = {"rate": float(np.median([r["wall"] for r in runs]))}
        for key in ("wall", "cpu"):
            ratios = [r[key] / lim[key] for r, lim in zip(runs, limit, strict=True)]
            s[key], s[key + "_lo"], s[key + "_hi"] = (float(np.median(ratios)), float(min(ratios)),
                                                     float(max(ratios)))
        res[f"{name} {tag}".strip()] = s
    return res


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(prog="python -m h5batch.bench.strict_ab", description=__doc__.split("\n")[0])
    p.add_argument("--memmap", required=True, help="folder of the limit's <field>.npy float32 memmaps")
    p.add_argument("--file", action="append", default=[], help="NAME=PATH of an h5batch file to read")
    p.add_argument("--code", action="append", default=[], help="TAG=DIR: a code tree put first on PYTHONPATH")
    p.add_argument("--workers", type=lambda s: [int(x) for x in s.split(",")], default=[0, 2])
    p.add_argument("--reps", type=int, default=5)
    p.add_argument("--epochs", type=int, default=3, help="timed epochs per process (after one warm-up)")
    p.add_argument("--batch", type=int, default=64)
    p.add_argument("--prealloc", action="store_true", help=f"add the row {PREALLOC} (0 workers)")
    p.add_argument("--seed", type=int, default=0, help=argparse.SUPPRESS)
    p.add_argument("--consume", action="store_true", help=argparse.SUPPRESS)
    p.add_argument("--out", help="write the summary here as JSON")
    p.add_argument("--one", action="store_true", help=argparse.SUPPRESS)
    p.add_argument("--row", help=argparse.SUPPRESS)
    args = p.parse_args(argv)
    if args.one:
        args.workers = args.workers[0]
        return _child(args)
    if not args.file:
        p.error("give at least one --file NAME=PATH")
    res = run(args)
    if args.out:
        with open(args.out, "w") as f:
            json.dump(res, f, indent=1)


if __name__ == "__main__":
    main()
