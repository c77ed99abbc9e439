"""``python benchmarks/sharded_read.py OUT1.h5 OUT2.h5 ... [--workers 0] [--rounds 25]``: the
read speed of sharded outputs against the first (one-writer) file of the same corpus (issue 47:
``ds.loader`` >= 0.9x the one-writer file's speed).

Every file's ``ds.loader(batch_size=64)`` over the ``train`` split is opened in one process
and warmed (two epochs), then epochs are alternated file by file, the order reversed every
round, so that adjacent epochs see the same load on a shared machine; each round's speed is
divided by the first file's in that round. Printed per file: samples/s (median and range), the
per-round ratio to the first file (median and range) and the main process's CPU time per
sample (all its threads: with ``--workers 0``, the reader's whole cost, the steadiest figure
on a loaded machine).

Make the files (docs/cluster.md, "When to use several writers")::

    h5batch convert jobs/paired_audio.yaml --set source.root=PAIRS --workers 2 \\
        --set output.writers=N --set output.path=wN.h5
"""

from __future__ import annotations

import argparse
import statistics
import time

from h5batch.torch import H5Dataset


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("files", nargs="+", help="outputs of one corpus; the first is the reference")
    p.add_argument("--workers", type=int, default=0, help="DataLoader num_workers (default 0)")
    p.add_argument("--rounds", type=int, default=25, help="epochs timed per file (default 25)")
    p.add_argument("--split", default="train")
    args = p.parse_args()
    loaders = [H5Dataset(f, args.split).loader(batch_size=64, num_workers=args.workers) for f in args.files]
    for ld in loaders:
        for _ in range(2):
            for _b in ld:
                pass
    rate: list[list[float]] = [[] for _ in loaders]
    cpu: list[list[float]] = [[] for _ in loaders]
    for r in range(args.rounds):
        for k in range(len(loaders)) if r % 2 == 0 else reversed(range(len(loaders))):
            t, c, n = time.perf_counter(), time.process_time(), 0
            for b in loaders[k]:
                n += len(next(iter(b.values())))  # the first column of the collated dict
            rate[k].append(n / (time.perf_counter() - t))
            cpu[k].append((time.process_time() - c) / n * 1e6)
    for f, rs, cs in zip(args.files, rate, cpu, strict=True):
        ratios = [a / b for a, b in zip(rs, rate[0], strict=True)]
        print(f"{f}: {statistics.median(rs):,.0f} samples/s ({min(rs):,.0f}-{max(rs):,.0f}), "
              f"{statistics.median(ratios):.2f}x the first ({min(ratios):.2f}-{max(ratios):.2f}), "
              f"main process {statistics.median(cs):.1f} us CPU a sample")


if __name__ == "__main__":
    main()
