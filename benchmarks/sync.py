"""``python benchmarks/sync.py``: what ``h5batch sync`` costs against a full conversion
of the same corpus (issue 18: adding 1 % of files to a 100,000-file corpus takes <= 5 % of
a full conversion).

Each corpus shape is generated once (cached under ``--dir``) with ``files * 1.01`` files;
every 101st file is held back in a folder beside it. Then, side by side in one run, each a
whole CLI command in a subprocess, timed from its start to its exit (what a user waits
for), the page cache hot, ``sync(2)`` before each so the previous command's writeback does
not land in it:

1. ``h5batch convert`` of the corpus without the held files (the full conversion); its
   output is kept as the copy each sync starts from;
2. ``h5batch sync`` with nothing changed;
3. then, alternating, a +1 % sync (the held files put back, the converted output restored
   from its copy, ``h5batch sync``, its ``--json`` split: discovery, change; the held files
   moved out again) and another full conversion, until ``--syncs`` syncs and ``--fulls``
   conversions are done: the median of the conversions is what the syncs are judged
   against (a conversion of 100,000 files moves by 1.5-2x between runs on this shared
   2-core machine, and alternating keeps the two measured at the same speed);
4. ``h5batch verify`` of the last synced output;
5. the floor of any one-shot sync, three times (the median counts): a process that starts
   Python, imports numpy and h5py (to read the output's inventory) and lists and stats
   every file of the corpus (``os.walk`` and ``os.stat``), nothing
   else. Reason: when a full conversion is fast, 5 % of it can be less than that floor, and
   then no sync that checks every file's size and mtime can meet the target.

Shapes:

``fsdd``             one folder of ``<digit>_<speaker>_<index>.wav`` clips (0.25-0.5 s, 16 kHz:
                     :func:`audio_corpus.make_audio_corpus`),
                     ``jobs/fsdd.yaml`` (the pattern layout, index ranges as splits);
``speech_commands``  Speech Commands v0.02's layout: 35 word folders of
                     ``<speaker>_nohash_<n>.wav`` one-second 16 kHz clips from ~2,600 speakers,
                     ``validation_list.txt`` and ``testing_list.txt`` (~10 % each, written for
                     the whole corpus, held files included, as a grown download's lists are),
                     ``_background_noise_``; the shipped ``jobs/speech_commands.yaml`` (its
                     speaker category too).

The printed ratio is each sync's wall time over the full conversion's.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path

import numpy as np
from audio_corpus import make_audio_corpus, pcm16_header

REPO = Path(__file__).resolve().parents[1]
HOLD_EVERY = 101  # every 101st generated file is held back: the +1 %
WORDS = ("backward bed bird cat dog down eight five follow forward four go happy house learn left "
         "marvin nine no off on one right seven sheila six stop three tree two up visual wow yes zero").split()


@dataclass(frozen=True)
class Shape:
    name: str
    job: str  # the job file, relative to the repository
    overrides: tuple[str, ...]  # --set KEY=VALUE beside source.root

    def generate(self, root: Path, n: int) -> list[str]:
        """Write ``n`` files under ``root``; return the relative paths of the sample files
        (the ones the +1 % is drawn from), in generation order."""
        return (_fsdd if self.name == "fsdd" else _speech_commands)(root, n)


SHAPES = {
    "fsdd": Shape("fsdd", "jobs/fsdd.yaml", ("fields.audio.sample_rate=16000",)),
    "speech_commands": Shape("speech_commands", "jobs/speech_commands.yaml", ()),
}


def _clips(rate: int, lengths: list[int], seed: int) -> list[bytes]:
    """WAV files (mono int16) of seeded noise-and-tone, one per length."""
    rng = np.random.default_rng(seed)
    out = []
    for k, n in enumerate(lengths):
        t = np.arange(n) / rate
        x = 0.3 * np.sin(2 * np.pi * (150 + 37 * k) * t) + 0.05 * rng.standard_normal(n)
        out.append(pcm16_header(n, rate) + (x * 32767).astype("<i2").tobytes())
    return out


def _write_all(root: Path, rels: list[str], clips: list[bytes]) -> None:
    folders = {os.path.dirname(r) for r in rels}
    for f in folders:
        (root / f).mkdir(parents=True, exist_ok=True)
    for i, rel in enumerate(rels):
        with open(root / rel, "wb", buffering=0) as f:
            f.write(clips[i % len(clips)])


def _fsdd(root: Path, n: int) -> list[str]:
    make_audio_corpus(root, n, seconds=0.5)
    return sorted(name for name in os.listdir(root) if name.endswith(".wav"))


def _speech_commands(root: Path, n: int) -> list[str]:
    rng = np.random.default_rng(2)
    speakers = [f"{x:08x}" for x in rng.choice(2**32, 2600, replace=False)]
    rels, seen = [], set()
    for k in range(n):
        word, spk = WORDS[k % len(WORDS)], speakers[int(rng.integers(len(speakers)))]
        u = 0
        while (rel := f"{word}/{spk}_nohash_{u}.wav") in seen:
            u += 1
        seen.add(rel)
        rels.append(rel)
    # Most clips are 1 s; some are cut short (the job zero-pads them to 16,000 samples).
    lengths = [16000] * 80 + [int(x) for x in rng.integers(8000, 16000, 17)]
    _write_all(root, rels, _clips(16000, lengths, 2))
    order = rng.permutation(n)
    tenth = n // 10
    (root / "validation_list.txt").write_text("".join(rels[i] + "\n" for i in sorted(order[:tenth])))
    (root / "testing_list.txt").write_text("".join(rels[i] + "\n" for i in sorted(order[tenth:2 * tenth])))
    noise = root / "_background_noise_"
    noise.mkdir(exist_ok=True)
    for name, clip in zip(("white_noise.wav", "running_tap.wav"), _clips(16000, [16000 * 60] * 2, 3)):
        (noise / name).write_bytes(clip)
    (noise / "README.md").write_text("background noise recordings\n")
    (root / "README.md").write_text("Speech Commands-shaped corpus, generated by benchmarks/sync.py\n")
    (root / "LICENSE").write_text("generated\n")
    return rels


def prepared(shape: Shape, base: Path, files: int) -> tuple[Path, Path, list[str]]:
    """(corpus root, held-back folder, held paths) of ``shape``, generated where missing:
    ``files`` samples in the corpus, ``files // 100`` held back beside it."""
    root, held = base / "corpus", base / "held"
    marker = base / "generated.json"
    total = files + files // (HOLD_EVERY - 1)
    want = {"shape": shape.name, "files": files, "total": total}
    if marker.exists() and json.loads(marker.read_text()).get("spec") == want:
        hold = json.loads(marker.read_text())["held"]
        for rel in hold:  # a run that stopped half-way left some back in the corpus
            if (root / rel).exists():
                (held / rel).parent.mkdir(parents=True, exist_ok=True)
                os.replace(root / rel, held / rel)
        return root, held, hold
    shutil.rmtree(base, ignore_errors=True)
    root.mkdir(parents=True)
    t = time.perf_counter()
    rels = shape.generate(root, total)
    hold = rels[HOLD_EVERY - 1::HOLD_EVERY]
    for rel in hold:
        (held / rel).parent.mkdir(parents=True, exist_ok=True)
        os.replace(root / rel, held / rel)
    marker.write_text(json.dumps({"spec": want, "held": hold}))
    print(f"[{shape.name}] generated {total:,} files in {time.perf_counter() - t:.1f} s "
          f"({len(hold):,} held back)", file=sys.stderr)
    return root, held, hold


def _move(src: Path, dst: Path, rels: list[str]) -> None:
    for rel in rels:
        (dst / rel).parent.mkdir(parents=True, exist_ok=True)
        os.replace(src / rel, dst / rel)


def _h5batch(*args: str) -> tuple[float, str]:
    """Run ``h5batch ARGS`` (this interpreter's), its wall time and standard output."""
    os.sync()
    cmd = [sys.executable, "-m", "h5batch.cli", *args]
    t = time.perf_counter()
    p = subprocess.run(cmd, cwd=REPO, capture_output=True, text=True)
    wall = time.perf_counter() - t
    if p.returncode:
        raise SystemExit(f"{' '.join(cmd)} failed ({p.returncode}):\n{p.stderr[-3000:]}")
    return wall, p.stdout


def run_shape(shape: Shape, base: Path, files: int, syncs: int, fulls: int = 3) -> dict:
    """Full conversions and +1 % syncs, alternating (full, sync, full, sync, ..., then the
    remaining syncs or fulls). Reason: this machine's speed drifts by 1.5-2x within minutes
    (the disk's above all: a full conversion writes and fsyncs ~1-3 GB), and all fulls first,
    then all syncs, measured the two at different speeds."""
    root, held, hold = prepared(shape, base, files)
    out, copy = base / "out.h5", base / "converted.h5"
    common = [shape.job, "--set", f"source.root={root}", *[a for kv in shape.overrides for a in ("--set", kv)],
              "--output", str(out)]
    fulls_s: list[float] = []
    rows: list[dict] = []

    def full() -> None:
        fulls_s.append(_h5batch("convert", *common, "--overwrite")[0])

    full()
    shutil.copyfile(out, copy)
    same, _ = _h5batch("sync", *common)
    for k in range(max(syncs, fulls - 1)):
        if k < syncs:
            _move(held, root, hold)
            try:
                shutil.copyfile(copy, out)
                wall, text = _h5batch("sync", *common, "--json")
                info = json.loads(text.strip().splitlines()[-1])
                if info["new"] != len(hold):
                    raise SystemExit(f"[{shape.name}] sync found {info['new']} new files, not {len(hold)}")
                rows.append({"wall": wall, "discover": info["discover_seconds"], "change": info["convert_seconds"],
                             "after_full": len(fulls_s)})
                if k == syncs - 1:
                    _h5batch("verify", str(out))
            finally:
                _move(root, held, hold)
        if k < fulls - 1:
            full()
    full_s = statistics.median(fulls_s)
    floor = statistics.median(_floor(root) for _ in range(3))
    return {"shape": shape.name, "files": files, "added": len(hold), "full": full_s, "fulls": fulls_s,
            "no_change": same, "syncs": rows, "floor": floor}


FLOOR = """
import os, sys, numpy, h5py
for d, _, files in os.walk(sys.argv[1]):
    for f in files:
        os.stat(os.path.join(d, f))
"""


def _floor(root: Path) -> float:
    """Wall time of the floor process (see the module docstring, step 5)."""
    os.sync()
    t = time.perf_counter()
    subprocess.run([sys.executable, "-c", FLOOR, str(root)], cwd=REPO, check=True)
    return time.perf_counter() - t


def report(r: dict) -> str:
    full = r["full"]
    each = " / ".join(f"{s:.2f}" for s in r["fulls"])
    lines = [f"[{r['shape']}] {r['files']:,} files: full conversion {full:.2f} s, median of {each} "
             f"({r['files'] / full:,.0f} files/s); no change {r['no_change']:.2f} s ({r['no_change'] / full:.3f})"]
    walls = [s["wall"] for s in r["syncs"]]
    lines.append(f"[{r['shape']}]   +{r['added']:,} files, median of {len(walls)} syncs: {statistics.median(walls):.2f} s "
                 f"({statistics.median(walls) / full:.3f} of full)")
    if "floor" in r:
        lines.append(f"[{r['shape']}]   floor of a one-shot sync (start Python, import numpy and h5py, list and stat "
                     f"every file): {r['floor']:.2f} s ({r['floor'] / full:.3f} of full)")
    for s in r["syncs"]:
        lines.append(f"[{r['shape']}]   +{r['added']:,} files: sync {s['wall']:.2f} s ({s['wall'] / full:.3f} of full; "
                     f"discovery {s['discover']:.2f} s, change {s['change']:.2f} s)")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python benchmarks/sync.py", description=__doc__.split("\n\n")[0])
    p.add_argument("--shape", choices=[*SHAPES, "all"], default="all")
    p.add_argument("--files", type=int, default=100_000, help="files in the corpus before the +1 %% (default 100,000)")
    p.add_argument("--syncs", type=int, default=5, help="+1 %% syncs, each on a fresh copy of the output")
    p.add_argument("--fulls", type=int, default=3, help="full conversions (their median is the yardstick)")
    p.add_argument("--dir", default="data/bench/sync", help="where the corpora and outputs live (cached)")
    p.add_argument("--json", help="also write the results to this file")
    a = p.parse_args(argv)
    results = []
    for name in (SHAPES if a.shape == "all" else [a.shape]):
        r = run_shape(SHAPES[name], Path(a.dir).resolve() / f"{name}-{a.files}", a.files, a.syncs, a.fulls)
        print(report(r), flush=True)
        results.append(r)
    if a.json:
        Path(a.json).write_text(json.dumps(results, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
