"""``python -m h5batch.generate KIND ROOT ...``: make one generated corpus from the shell.

Prints the :class:`~h5batch.generate.SynthSummary` as JSON, plus the elapsed time and the
files written per second (reported only, never written into the corpus). Exit code 2 on bad
arguments.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from collections.abc import Callable, Sequence

from . import make_audio_corpus, make_demo_corpus, make_image_corpus, make_paired_audio
from .common import SynthSummary


def _parse_splits(text: str) -> dict[str, float]:
    """``"train=0.8,val=0.2"`` -> ``{"train": 0.8, "val": 0.2}``."""
    out: dict[str, float] = {}
    for part in text.split(","):
        name, sep, value = part.partition("=")
        if not sep:
            raise argparse.ArgumentTypeError(f"expected NAME=WEIGHT, got {part!r}")
        out[name.strip()] = float(value)
    return out


def _build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="python -m h5batch.generate", description="Generate deterministic synthetic corpora."
    )
    sub = p.add_subparsers(dest="command", required=True)

    d = sub.add_parser("demo", help="WAV+PNG shapes corpus (make_demo_corpus)")
    d.add_argument("root")
    d.add_argument("--per-class", type=int, default=100)
    d.add_argument("--test-fraction", type=float, default=0.2)
    d.add_argument("--seed", type=int, default=0)

    pa = sub.add_parser("paired", help="noisy/clean WAV pairs (make_paired_audio)")
    pa.add_argument("root")
    pa.add_argument("--n-train", type=int, default=64)
    pa.add_argument("--n-test", type=int, default=16)
    pa.add_argument("--seconds", type=float, default=2.0)
    pa.add_argument("--sample-rate", type=int, default=16000)
    pa.add_argument("--subtype", default="PCM_16")
    pa.add_argument("--seed", type=int, default=0)

    im = sub.add_parser("images", help="ImageFolder JPEG/PNG corpus (make_image_corpus)")
    im.add_argument("root")
    im.add_argument("--n-per-class", type=int, default=50)
    im.add_argument("--classes", default="ants_like,bees_like", help="comma-separated class names")
    im.add_argument(
        "--splits",
        type=_parse_splits,
        default={"train": 0.8, "val": 0.2},
        help="e.g. train=0.8,val=0.2",
    )
    im.add_argument("--min-side", type=int, default=160)
    im.add_argument("--max-side", type=int, default=640)
    im.add_argument("--fmt", default="JPEG", choices=["JPEG", "PNG", "jpeg", "png"])
    im.add_argument("--quality", type=int, default=90)
    im.add_argument("--seed", type=int, default=0)

    au = sub.add_parser("audio", help="flat FSDD-style WAV folder (make_audio_corpus)")
    au.add_argument("root")
    au.add_argument("--n-files", type=int, required=True)
    au.add_argument("--seconds", type=float, default=2.0)
    au.add_argument("--sample-rate", type=int, default=16000)
    au.add_argument("--classes", type=int, default=10)
    au.add_argument("--seed", type=int, default=0)
    return p


def main(argv: Sequence[str] | None = None) -> int:
    """CLI entry point; prints the summary as JSON (plus elapsed time and rate)."""
    ns = _build_parser().parse_args(argv)
    calls: dict[str, Callable[[], SynthSummary]] = {
        "demo": lambda: make_demo_corpus(ns.root, ns.per_class, ns.test_fraction, ns.seed),
        "paired": lambda: make_paired_audio(
            ns.root, ns.n_train, ns.n_test, ns.seconds, ns.sample_rate, ns.seed, ns.subtype
        ),
        "images": lambda: make_image_corpus(
            ns.root,
            ns.n_per_class,
            tuple(c.strip() for c in ns.classes.split(",") if c.strip()),
            ns.splits,
            ns.min_side,
            ns.max_side,
            ns.fmt,
            ns.quality,
            ns.seed,
        ),
        "audio": lambda: make_audio_corpus(
            ns.root, ns.n_files, ns.seconds, ns.sample_rate, ns.classes, ns.seed
        ),
    }
    try:
        t0 = time.perf_counter()  # timing is reported only, never written to the corpus
        summary = calls[ns.command]()
        elapsed = time.perf_counter() - t0
    except (ValueError, TypeError) as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    out = summary.to_dict()
    out["elapsed_s"] = round(elapsed, 3)
    if not summary.skipped and elapsed > 0:
        out["files_per_s"] = round(summary.n_files / elapsed, 1)
    print(json.dumps(out, indent=2))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
