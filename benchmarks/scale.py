"""Memory and time against corpus size: N tiny WAVs in 1,000 class folders, converted by the
CLI, with the peak PSS of its whole process tree, the bytes per input file, the time per file,
the "already complete" rerun and the reader's open of the output (issue 47, item 5).

The corpus is ``ROOT/train/cNNN/NNNNNNN.wav``: 844-byte 16 kHz mono clips (400 frames), so
that what grows with N is the per-file bookkeeping (manifest, inventory, records), not the
samples. Each size's corpus is written once and kept under ``--dir``. PSS counts a page
shared by several processes (shared memory, the forked decoders' inherited pages) once, in
proportion; RSS counts it in every process.

    .venv/bin/python benchmarks/scale.py --files 100000,1000000
"""

from __future__ import annotations

import argparse
import struct
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import psutil

REPO = Path(__file__).resolve().parent.parent
CLASSES = 1000
FRAMES = 400
RATE = 16000


def corpus(base: Path, n: int) -> Path:
    """The corpus of ``n`` files under ``base`` (written once; a marker says it is whole)."""
    root = base / f"c{n}"
    done = root / ".complete"
    if done.exists():
        return root
    rng = np.random.default_rng(0)
    header = _header(FRAMES)
    for c in range(CLASSES):
        (root / "train" / f"c{c:03d}").mkdir(parents=True, exist_ok=True)
    for i in range(n):
        pcm = rng.integers(-3000, 3000, FRAMES, dtype=np.int16).tobytes()
        (root / "train" / f"c{i % CLASSES:03d}" / f"{i:07d}.wav").write_bytes(header + pcm)
    done.write_text(str(n))
    return root


def _header(frames: int) -> bytes:
    data = 2 * frames
    return struct.pack("<4sI4s4sIHHIIHH4sI", b"RIFF", 36 + data, b"WAVE", b"fmt ", 16, 1, 1, RATE, 2 * RATE, 2, 16,
                       b"data", data)


def sampled(cmd: list[str]) -> dict:
    """Run ``cmd``; its wall time and the peak PSS/RSS of its process tree (sampled every 50 ms)."""
    t = time.perf_counter()
    p = subprocess.Popen(cmd, cwd=REPO, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    root = psutil.Process(p.pid)
    pss = rss = 0
    while p.poll() is None:
        now_pss = now_rss = 0
        for q in [root, *root.children(recursive=True)]:
            try:
                m = q.memory_full_info()
            except (psutil.NoSuchProcess, psutil.AccessDenied):
                continue
            now_pss += m.pss
            now_rss += m.rss
        pss, rss = max(pss, now_pss), max(rss, now_rss)
        time.sleep(0.05)
    err = p.stderr.read().decode()
    if p.returncode:
        raise SystemExit(f"{' '.join(cmd)} failed ({p.returncode}):\n{err[-3000:]}")
    return {"wall": time.perf_counter() - t, "pss": pss, "rss": rss}


OPEN = """
import sys, time
t = time.perf_counter()
from h5batch.torch import H5Dataset
t1 = time.perf_counter()
ds = H5Dataset(sys.argv[1], split="train")
print(len(ds), time.perf_counter() - t1)
"""


def run(base: Path, n: int) -> dict:
    root = corpus(base, n)
    out = base / f"c{n}.h5"
    convert = [sys.executable, "-m", "h5batch.cli", "convert", str(root), "--output", str(out)]
    full = sampled([*convert, "--overwrite"])
    again = sampled(convert)
    p = subprocess.run([sys.executable, "-c", OPEN, str(out)], cwd=REPO, capture_output=True, text=True, check=True)
    samples, opened = p.stdout.split()
    if int(samples) != n:
        raise SystemExit(f"{out} holds {samples} samples, not {n}")
    return {"files": n, **full, "again": again["wall"], "open": float(opened)}


def report(rows: list[dict]) -> str:
    base = rows[0]
    lines = ["| files | convert s | us/file | per file vs first row | peak PSS MiB | PSS bytes/file over first row "
             "| RSS MiB | already complete s | reader open s |", "|---:|---:|---:|---:|---:|---:|---:|---:|---:|"]
    for r in rows:
        per = r["wall"] / r["files"]
        grown = (r["pss"] - base["pss"]) / (r["files"] - base["files"]) if r is not base else float("nan")
        lines.append(f"| {r['files']:,} | {r['wall']:.1f} | {per * 1e6:.0f} | {per / (base['wall'] / base['files']):.2f}x "
                     f"| {r['pss'] / 2**20:,.0f} | {grown:,.0f} | {r['rss'] / 2**20:,.0f} "
                     f"| {r['again']:.2f} | {r['open']:.2f} |")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python benchmarks/scale.py", description=__doc__.split("\n\n")[0])
    p.add_argument("--files", default="100000,1000000", help="comma-separated corpus sizes (default 100000,1000000)")
    p.add_argument("--dir", default="data/bench/scale", help="where the corpora and outputs live (cached)")
    a = p.parse_args(argv)
    base = (REPO / a.dir).resolve()
    base.mkdir(parents=True, exist_ok=True)
    rows = []
    for n in (int(x) for x in a.files.split(",")):
        rows.append(run(base, n))
        print(f"{n:,} files done", file=sys.stderr, flush=True)
    print(report(rows))
    return 0


if __name__ == "__main__":
    sys.exit(main())
