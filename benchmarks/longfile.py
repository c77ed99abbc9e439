"""``python benchmarks/longfile.py``: the memory a conversion of one long recording
costs, against the size of its decoded sample.

The target (issue 19, item 5): the peak RSS of the conversion's whole process tree is at
most 1.5x the largest decoded sample plus the fixed baseline, the peak of the same job on
a corpus of one 1-second file. Each case generates a long WAV (a tone plus seeded noise,
written block by block), converts it with the whole CLI in a subprocess, does the same on
the 1-second corpus, and prints, side by side in one run:

``tree RSS``   the sum of the RSS of every process of the tree (the driver, the writer, the
               decoder processes), as ``top`` shows it; a page of
               shared memory counts once per process that maps it.
``footprint``  the private RSS of every process (RSS minus mapped shared memory) plus the
               bytes the run's ``/dev/shm`` segments hold, counted once: what the job holds,
               however many processes map its pages.

The ratio is ``(peak - baseline) / decoded sample``. Then the stored sample is compared,
block by block, with ``soundfile.read`` of the file. Cases whose file would not fit in the
free memory (three times the decoded sample) are skipped with a note.

Run it on a machine with ~10 GB free; each 2-hour WAV is written once into ``--workdir``.
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
import tempfile
import threading
import time
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import psutil

SHM_DIR = "/dev/shm"


@dataclass(frozen=True)
class Case:
    """A generated recording and the field that stores it."""

    rate: int
    channels: int
    dtype: str  # the field's dtype
    keep: bool  # channels: keep (else the file is mono)

    def decoded_bytes(self, seconds: float) -> int:
        return int(seconds * self.rate) * self.channels * np.dtype(self.dtype).itemsize


CASES = {
    "16k-mono-int16": Case(16000, 1, "int16", False),
    "48k-stereo-float32": Case(48000, 2, "float32", True),
}


def write_wav(path: Path, seconds: float, rate: int, channels: int) -> None:
    """A 16-bit PCM WAV of a tone per channel plus seeded noise, written block by block."""
    import soundfile as sf

    path.parent.mkdir(parents=True, exist_ok=True)
    rng = np.random.default_rng(19)
    n = int(seconds * rate)
    part = path.with_name(path.name + ".part")  # (renamed when whole: an interrupted one is not kept)
    with sf.SoundFile(str(part), "w", rate, channels, subtype="PCM_16", format="WAV") as f:
        for pos in range(0, n, rate * 10):
            m = min(rate * 10, n - pos)
            t = (np.arange(pos, pos + m) / rate)[:, None]
            x = 0.3 * np.sin(2 * np.pi * 440 * t * np.arange(1, channels + 1)) + 0.05 * rng.standard_normal((m, channels))
            f.write(x.astype(np.float32))
    os.replace(part, path)


def job_text(root: Path, out: Path, case: Case, codec: str) -> str:
    return (f"name: longfile\nsource:\n  root: {root}\n  layout: class_folders\n"
            f"fields:\n  audio:\n    type: audio\n    extensions: [.wav]\n    sample_rate: {case.rate}\n"
            f"    channels: {'keep' if case.keep else 'mono'}\n    dtype: {case.dtype}\n"
            f"output:\n  path: {out}\n  codec: {codec}\n")


def _status(pid: int) -> tuple[int, int]:
    """(RSS, mapped shared memory) of a process, in bytes."""
    rss = shmem = 0
    with open(f"/proc/{pid}/status") as fh:
        for line in fh:
            if line.startswith("VmRSS:"):
                rss = int(line.split()[1]) * 1024
            elif line.startswith("RssShmem:"):
                shmem = int(line.split()[1]) * 1024
    return rss, shmem


def _segments_bytes(driver: int) -> int:
    """Bytes held now by the shared-memory segments of the run whose driver is ``driver``
    (allocated pages, not sizes; the run id starts with the driver's pid)."""
    total = 0
    prefix = f"h5b-{driver:x}x"
    for name in os.listdir(SHM_DIR) if os.path.isdir(SHM_DIR) else []:
        if name.startswith(prefix):
            try:
                total += os.stat(os.path.join(SHM_DIR, name)).st_blocks * 512
            except OSError:
                pass
    return total


@dataclass
class Peaks:
    tree_rss: int = 0
    footprint: int = 0
    at_peak: tuple[tuple[str, int, int], ...] = ()  # (process, rss, shmem) at the tree RSS peak
    seconds: float = 0.0
    code: int = 0


def _role(p: psutil.Process, root: int) -> str:
    if p.pid == root:
        return "driver"
    try:
        cmd = " ".join(p.cmdline())
    except psutil.Error:
        return "?"
    if "resource_tracker" in cmd:
        return "resource tracker"
    if "spawn_main" in cmd:
        return "dask worker"
    if "forkserver" in cmd:  # the writer is forked from the fork server
        try:
            return "fork server" if p.ppid() == root else "writer"
        except psutil.Error:
            return "?"
    return "other"


def run_measured(argv: list[str], interval: float = 0.05) -> Peaks:
    """Run ``argv``; sample its tree every ``interval`` s; keep both peaks."""
    peaks = Peaks()
    t0 = time.perf_counter()
    proc = subprocess.Popen(argv, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    root = psutil.Process(proc.pid)
    err: list[bytes] = []
    reader = threading.Thread(target=lambda: err.append(proc.stderr.read()), daemon=True)  # type: ignore[union-attr]
    reader.start()
    while proc.poll() is None:
        try:
            procs = [root, *root.children(recursive=True)]
        except psutil.Error:
            procs = [root]
        rows = []
        for p in procs:
            try:
                rows.append((p, *_status(p.pid)))
            except OSError:
                continue
        tree = sum(r[1] for r in rows)
        foot = sum(r[1] - r[2] for r in rows) + _segments_bytes(proc.pid)
        if tree > peaks.tree_rss:
            peaks.tree_rss = tree
            peaks.at_peak = tuple((_role(p, proc.pid), rss, sh) for p, rss, sh in rows)
        peaks.footprint = max(peaks.footprint, foot)
        time.sleep(interval)
    reader.join(5)
    peaks.seconds, peaks.code = time.perf_counter() - t0, proc.returncode
    if proc.returncode != 0:
        sys.stderr.write(b"".join(err).decode(errors="replace")[-3000:])
    return peaks


def convert_argv(job: Path) -> list[str]:
    return [sys.executable, "-m", "h5batch.cli", "convert", str(job), "--overwrite", "--progress", "none"]


def check_output(out: Path, wav: Path, case: Case) -> bool:
    """The stored sample equals ``soundfile.read`` of the file (compared block by block)."""
    import h5py
    import hdf5plugin  # noqa: F401
    import soundfile as sf

    with h5py.File(out, "r") as f, sf.SoundFile(str(wav)) as src:
        g = f["train/audio"]
        values, shape = g["values"], tuple(g["shapes"][0])
        if shape[0] != src.frames:
            return False
        width = shape[1] if len(shape) > 1 else 1
        step = 1 << 20
        for pos in range(0, src.frames, step):
            want = src.read(frames=step, dtype=case.dtype, always_2d=True)
            got = values[pos * width: (pos + len(want)) * width].reshape(len(want), width)
            if not np.array_equal(got, want):
                return False
    return True


def run_case(name: str, case: Case, minutes: float, work: Path, codec: str, out_dir: Path | None = None,
             check: bool = True) -> dict:
    """``work``: where the WAVs are (made if missing); ``out_dir``: where the jobs and
    outputs go (``work``); ``check``: compare the stored sample with the file."""
    seconds = minutes * 60
    out_dir = out_dir or work
    sample = case.decoded_bytes(seconds)
    need = 3 * sample
    free = psutil.virtual_memory().available
    if free < need:
        return {"case": name, "skipped": f"needs ~{need / 1e9:.1f} GB free, {free / 1e9:.1f} GB available"}
    long_root, tiny_root = work / f"{name}-{minutes:g}min-long", work / f"{name}-tiny"
    wav = long_root / "train" / "a" / "long.wav"
    if not wav.exists():
        write_wav(wav, seconds, case.rate, case.channels)
    if not (tiny_root / "train" / "a" / "tiny.wav").exists():
        write_wav(tiny_root / "train" / "a" / "tiny.wav", 1.0, case.rate, case.channels)
    results = {}
    for label, root in (("baseline", tiny_root), ("long", long_root)):
        job = out_dir / f"{name}-{label}.yaml"
        out = out_dir / f"{name}-{label}.h5"
        job.write_text(job_text(root, out, case, codec))
        results[label] = run_measured(convert_argv(job))
    base, long = results["baseline"], results["long"]
    return {
        "case": name, "minutes": minutes, "sample_bytes": sample, "codec": codec,
        "baseline": base, "long": long,
        "rss_ratio": (long.tree_rss - base.tree_rss) / sample,
        "footprint_ratio": (long.footprint - base.footprint) / sample,
        "identical": long.code == 0 and (not check or check_output(out_dir / f"{name}-long.h5", wav, case)),
    }


def report(r: dict) -> str:
    if "skipped" in r:
        return f"{r['case']}: skipped ({r['skipped']})"
    mb = 1e6
    b, lg = r["baseline"], r["long"]
    lines = [
        f"{r['case']}, {r['minutes']:g} min, codec {r['codec']}: decoded sample {r['sample_bytes'] / mb:,.0f} MB; "
        f"converted in {lg.seconds:.1f} s (exit {lg.code}), stored sample identical to soundfile: {r['identical']}",
        f"  tree RSS  peak {lg.tree_rss / mb:,.0f} MB, baseline {b.tree_rss / mb:,.0f} MB -> "
        f"{r['rss_ratio']:.2f}x the sample above the baseline (target <= 1.50)",
        f"  footprint peak {lg.footprint / mb:,.0f} MB, baseline {b.footprint / mb:,.0f} MB -> "
        f"{r['footprint_ratio']:.2f}x the sample above the baseline",
        "  at the tree RSS peak: " + ", ".join(f"{role} {rss / mb:,.0f} MB ({sh / mb:,.0f} shared)"
                                             for role, rss, sh in lg.at_peak if rss > 20 * mb),
    ]
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python benchmarks/longfile.py", description=__doc__.split("\n\n")[0])
    parser.add_argument("--minutes", type=float, default=120.0, help="length of the recording (default 120)")
    parser.add_argument("--cases", default="16k-mono-int16,48k-stereo-float32",
                        help=f"comma-separated, of: {', '.join(CASES)}")
    parser.add_argument("--codec", default="none", help="output.codec of the job (default none)")
    parser.add_argument("--workdir", help="where the files go (default: a temporary folder, removed)")
    args = parser.parse_args(argv)
    names = [c for c in args.cases.split(",") if c]
    unknown = [c for c in names if c not in CASES]
    if unknown:
        parser.error(f"unknown case(s) {', '.join(unknown)}; choose from {', '.join(CASES)}")
    with tempfile.TemporaryDirectory(prefix="h5batch-longfile-") as tmp:
        work = Path(args.workdir) if args.workdir else Path(tmp)
        work.mkdir(parents=True, exist_ok=True)
        failed = False
        for name in names:
            r = run_case(name, CASES[name], args.minutes, work, args.codec)
            print(report(r), flush=True)
            failed |= "skipped" not in r and not r["identical"]
    return 1 if failed else 0


if __name__ == "__main__":
    raise SystemExit(main())
