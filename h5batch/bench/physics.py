"""CPU cost per GB of the steps no converter can skip, in one process, warm page cache.

``python -m h5batch.bench.physics [CORPUS_DIR] [SCRATCH_DIR]`` reads every ``.wav`` under
CORPUS_DIR (default: the largest ``data/bench/paired_audio_<pairs>``) with one ``readinto`` each (what decoding a 16-bit PCM WAV is), writes 1 GiB
to a file in SCRATCH_DIR with 1 MiB writes (what storing uncompressed chunks is), and
copies 1 GiB in memory. It prints CPU-seconds (user + system) per GiB, best of 3: the
ratio of reading to reading + writing bounds what a converter can reach against the
decode-only floor (docs/benchmarks.md).
"""

from __future__ import annotations

import glob
import os
import re
import sys
import time

import numpy as np


def _cpu() -> float:
    t = os.times()
    return t.user + t.system


def _best(fn, reps: int = 3) -> float:
    best = float("inf")
    for _ in range(reps):
        c = _cpu()
        fn()
        best = min(best, _cpu() - c)
    return best


def read_files(paths: list[str]) -> int:
    """Read every file into one reused buffer; returns the bytes read."""
    buf = np.empty(max(os.path.getsize(p) for p in paths), np.uint8)
    n = 0
    for p in paths:
        with open(p, "rb") as fh:
            n += fh.readinto(memoryview(buf)[: os.path.getsize(p)])
    return n


def write_blocks(path: str, nbytes: int) -> None:
    """Write ``nbytes`` (whole MiB) into a new file at ``path`` with 1 MiB writes, no flush."""
    block = np.ones(1 << 20, np.uint8)
    with open(path, "wb") as fh:
        for _ in range(nbytes >> 20):
            fh.write(block)


def write_file(path: str, nbytes: int) -> None:
    write_blocks(path, nbytes)
    os.unlink(path)


def memcpy(nbytes: int) -> None:
    a = np.ones(1 << 24, np.uint8)
    b = np.empty_like(a)
    for _ in range(nbytes >> 24):
        np.copyto(b, a)


def bound_ratio(paths: list[str], scratch: str, nbytes: int = 1 << 30, reps: int = 3) -> dict[str, float]:
    """Measure the read+write bound on ``paths`` (16-bit PCM WAV files, page cache warm)
    with writes of ``nbytes`` into ``scratch``: CPU-seconds per GiB of each step (best of
    ``reps``) and ``ratio`` = read / (read + write), the most a converter can reach against
    the decode-only floor on CPU-bound cores."""
    total = read_files(paths)  # warm the page cache
    gib = 1 << 30
    # A small corpus is read several times over: os.times() counts in 10 ms ticks.
    rounds = -(-(256 << 20) // max(total, 1))
    r = _best(lambda: [read_files(paths) for _ in range(rounds)], reps) * gib / (total * rounds)
    w = _best(lambda: write_file(os.path.join(scratch, "physics.bin"), nbytes), reps) * gib / nbytes
    return {"read": r, "write": w, "ratio": r / (r + w)}


def default_corpus(cache: str) -> str:
    """The largest generated 16 kHz bench corpus under ``cache`` (``paired_audio_<pairs>``;
    ``make bench`` makes them), or ``cache`` itself when there is none. Corpora made with
    ``--rate`` (``paired_audio_<pairs>_<k>k``) are left out."""
    sizes = {}
    for d in glob.glob(os.path.join(cache, "paired_audio_*")):
        m = re.fullmatch(r"paired_audio_(\d+)", os.path.basename(d))
        if m:
            sizes[d] = int(m.group(1))
    return max(sizes, key=sizes.__getitem__, default=cache)


def main(argv: list[str]) -> None:
    if argv:
        corpus = argv[0]
    else:
        corpus = default_corpus(os.path.join("data", "bench"))
    scratch = argv[1] if len(argv) > 1 else os.path.join("bench", "results")
    paths = sorted(glob.glob(os.path.join(corpus, "**", "*.wav"), recursive=True))
    if not paths:
        sys.exit(f"no .wav files under {corpus}")
    os.makedirs(scratch, exist_ok=True)
    t0 = time.perf_counter()
    b = bound_ratio(paths, scratch)
    rows = [
        (f"read {len(paths)} wav files (readinto)", b["read"]),
        ("write 1 GiB, 1 MiB writes", b["write"]),
        ("memcpy 1 GiB", _best(lambda: memcpy(1 << 30))),
    ]
    for name, sec in rows:
        print(f"{name:40s} {sec:.3f} CPU-s per GiB")
    print(f"bound on conversion / decode-only floor (read / (read + write)): {b['ratio']:.2f}x "
          f"({time.perf_counter() - t0:.0f} s)")


if __name__ == "__main__":
    main(sys.argv[1:])
