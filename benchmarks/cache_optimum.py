"""The fewest bytes a node cache of a given bound can fetch per epoch, for the reads of
``h5batch bench --s3``'s bounded-cache rows (issue 46: "epochs 2 and later each fetch <= 0.85x").

Each chunk is read once an epoch, in the sampler's order of first use (the readers' decoded
chunk caches serve the rest), and the cache evicts the chunk read furthest in the future
(Belady's rule, optimal). Compare its figures with the rows' ``fetched / stored``.

    .venv/bin/python benchmarks/cache_optimum.py OUT.h5 [--epochs 3] [--fraction 0.25]
"""

from __future__ import annotations

import argparse
import os
import sys

import numpy as np

from h5batch.remote.prefetch import chunk_sequence, epoch_indices
from h5batch.torch import H5Dataset


def optimum(path: str, epochs: int, bound: int) -> list[float]:
    """Bytes over stored, per epoch, at best (module docstring) for a bound of ``bound`` bytes.
    An epoch's reads that fill the bound by themselves leave little to carry into the next,
    so the optimum depends on the order, not only on the bound."""
    ds = H5Dataset(path, split="train", as_float=False)
    sampler = ds.loader(batch_size=64, shuffle=True, num_workers=0).sampler
    seq = []  # (epoch, offset, size), each chunk once an epoch
    for e in range(epochs):
        offs, sizes = chunk_sequence(ds, epoch_indices(sampler, e))
        first = np.sort(np.unique(offs, return_index=True)[1])
        seq += [(e, int(offs[i]), int(sizes[i])) for i in first]
    later: dict[int, int] = {}
    following = [0] * len(seq)  # the position of each read's chunk's next read
    for i in range(len(seq) - 1, -1, -1):
        following[i] = later.get(seq[i][1], len(seq))
        later[seq[i][1]] = i
    held: dict[int, tuple[int, int]] = {}  # offset -> (next read, size)
    used, fetched = 0, [0] * epochs
    for i, (e, off, n) in enumerate(seq):
        if off not in held:
            fetched[e] += n
            used += n
        held[off] = (following[i], n)
        while used > bound and len(held) > 1:  # the chunk just read stays
            used -= held.pop(max((k for k in held if k != off), key=lambda k: held[k][0]))[1]
    return [f / os.path.getsize(path) for f in fetched]


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python benchmarks/cache_optimum.py", description=__doc__.split("\n\n")[0])
    p.add_argument("path", help="a local h5batch output (the one the bench uploads)")
    p.add_argument("--epochs", type=int, default=3)
    p.add_argument("--fraction", type=float, default=0.25, help="the cache bound as a fraction of the file")
    a = p.parse_args(argv)
    best = optimum(a.path, a.epochs, int(os.path.getsize(a.path) * a.fraction))
    print(", ".join(f"epoch {e + 1}: {x:.3f}" for e, x in enumerate(best)))
    return 0


if __name__ == "__main__":
    sys.exit(main())
