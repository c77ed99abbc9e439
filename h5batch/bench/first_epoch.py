"""A file of many chunks: its first epoch against its second, each in a fresh reader.

``python -m h5batch.bench.first_epoch [--pairs N] [--cache DIR] [--work DIR]`` converts the
bench's paired-audio corpus (``bench.corpus.paired_audio``) with one row per chunk
(``output.chunk_bytes`` of one row: N chunks per field), then reads it twice over in a new
interpreter with ``ds.loader(batch_size=64)`` (shuffled, ``num_workers=0``) and prints the
two epochs' seconds and their ratio.

Reason: a reader's first epoch does what later ones need not: it opens the file and finds
every chunk. Finding them cost a call per chunk into HDF5 whose cost grows with the number of
chunks (HDF5 2.0's ``get_chunk_info_by_coord``), so first epochs were quadratic in a file's
size: 7.4 s against 1.0 s for the second on 16,384 chunks per field, ~12 minutes per process
at 100,000 (docs/benchmarks.md, nineteenth round; ``torch/chunks.py`` now lists the index
once). The bench's other files have 256 chunks per field and cannot show it; this probe
keeps the first epoch of a file with thousands of chunks in every full run (about 1x the
second: a ratio of 2x or more is flagged in the report).
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import os
import subprocess
import sys
from typing import Any

_READ = """
import json, sys, time
from h5batch.torch import H5Dataset
ds = H5Dataset(sys.argv[1], split="train")
times = []
for _ in range(2):
    t = time.perf_counter()
    n = sum(len(b["data"]) for b in ds.loader(batch_size=64, num_workers=0))
    times.append(time.perf_counter() - t)
print(json.dumps({"samples": n, "first_s": times[0], "second_s": times[1]}))
"""


def probe(cache: str, work: str, pairs: int = 4096, rate: int | None = None) -> dict[str, Any]:
    """Convert ``pairs`` pairs (of ``rate`` Hz: the bench's corpus of that size) into one-row
    chunks under ``work``, read two epochs in a new interpreter; ``{chunks, samples,
    first_s, second_s, ratio}`` (the file is removed)."""
    from .. import format as fmt
    from . import corpus
    from .convert_child import h5batch_convert, remove_output

    if pairs < 1:
        raise ValueError("pairs must be >= 1")
    cp = corpus.paired_audio(cache, pairs, rate or corpus.AUDIO_RATE)
    os.makedirs(work, exist_ok=True)
    out = os.path.join(work, "first-epoch.h5")
    job = cp.job(out, "none", {"kind": "auto"})
    row_bytes = cp.extra["length"] * 2  # int16 samples: one row per chunk
    job = dataclasses.replace(job, output=dataclasses.replace(job.output, chunk_bytes=row_bytes))
    try:
        h5batch_convert(job)
        p = subprocess.run([sys.executable, "-c", _READ, out], capture_output=True, text=True)
        if p.returncode:
            raise RuntimeError(f"reading {out} failed ({p.returncode}):\n{p.stderr[-2000:]}")
        r = json.loads(p.stdout.strip().splitlines()[-1])
    finally:
        remove_output(out)
        remove_output(fmt.rejects_file(out))
    return {"chunks": pairs, **r, "ratio": r["first_s"] / max(r["second_s"], 1e-9)}


def describe(p: dict[str, Any]) -> str:
    return (f"first epoch of a file of {p['chunks']:,} one-row chunks per field: {p['first_s']:.2f} s, "
            f"second {p['second_s']:.2f} s ({p['ratio']:.2f}x)")


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m h5batch.bench.first_epoch", description=__doc__.split("\n\n")[0])
    ap.add_argument("--pairs", type=int, default=4096, help="samples, and so chunks per field")
    ap.add_argument("--cache", default=os.path.join("data", "bench"), help="generated corpora (made once)")
    ap.add_argument("--work", default=os.path.join("bench", "results"), help="scratch folder for the file")
    a = ap.parse_args(argv)
    if a.pairs < 1:
        ap.error("--pairs must be >= 1")
    print(describe(probe(a.cache, a.work, a.pairs)))
    return 0


if __name__ == "__main__":
    sys.exit(main())
