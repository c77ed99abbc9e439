"""A file of many chunks: its first epoch against its second, in a fresh reader.

``python benchmarks/first_epoch.py [--pairs N] [--cache DIR] [--work DIR]`` converts the
bench's paired-audio corpus (``h5batch.bench.corpus.paired_audio``) with ``h5batch convert``
and one row per chunk (``output.chunk_bytes`` of one row: N chunks per field), then reads it
twice in a new interpreter with ``ds.loader(batch_size=64)`` (shuffled, ``num_workers=0``)
and prints the two epochs' seconds and their ratio.

Reason: a reader's first epoch opens the file and finds every chunk. Finding them once cost
a call per chunk into HDF5 whose cost grows with the number of chunks, so first epochs were
quadratic in a file's size (7.4 s against 1.0 s for the second on 16,384 chunks per field);
``h5batch/torch/chunks.py`` now lists the index once. The suite's files have a few hundred
chunks per field and cannot show it. A ratio of 2x or more is a regression.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile

from h5batch.bench import corpus

READ = """
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


def probe(cache: str, work: str, pairs: int = 4096) -> dict:
    """``{chunks, samples, first_s, second_s, ratio}`` of a ``pairs``-pair file of one-row chunks."""
    cp = corpus.paired_audio(cache, pairs)
    out = os.path.join(work, "first-epoch.h5")
    job = cp.job_dict(out, "none")
    job["output"]["chunk_bytes"] = cp.extra["length"] * 2  # int16 samples: one row per chunk
    job_file = os.path.join(work, "first-epoch.yaml")
    with open(job_file, "w") as f:
        json.dump(job, f)  # JSON is YAML
    subprocess.run([sys.executable, "-m", "h5batch.cli", "convert", job_file, "--overwrite", "--progress", "none"],
                   check=True)
    p = subprocess.run([sys.executable, "-c", READ, out], capture_output=True, text=True, check=True)
    r = json.loads(p.stdout.strip().splitlines()[-1])
    return {"chunks": pairs, **r, "ratio": r["first_s"] / max(r["second_s"], 1e-9)}


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python benchmarks/first_epoch.py", description=__doc__.split("\n\n")[0])
    ap.add_argument("--pairs", type=int, default=4096, help="samples, and so chunks per field")
    ap.add_argument("--cache", default=os.path.join("data", "bench"), help="generated corpora (made once)")
    ap.add_argument("--work", help="scratch folder for the file (default: a temporary one, removed)")
    a = ap.parse_args(argv)
    if a.pairs < 1:
        ap.error("--pairs must be >= 1")
    with tempfile.TemporaryDirectory(prefix="h5batch-first-epoch-") as tmp:
        os.makedirs(a.work or tmp, exist_ok=True)
        p = probe(a.cache, a.work or tmp, a.pairs)
    print(f"first epoch of a file of {p['chunks']:,} one-row chunks per field: {p['first_s']:.2f} s, "
          f"second {p['second_s']:.2f} s ({p['ratio']:.2f}x)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
