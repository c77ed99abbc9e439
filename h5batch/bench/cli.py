"""``h5batch bench``: argument parsing only (registered in ``h5batch.cli._EXTRA_COMMANDS``)."""

from __future__ import annotations

import argparse
import os
import sys
from typing import Any

CODECS = ("auto", "none", "gzip", "lzf", "zstd", "blosc2-lz4", "blosc2-zstd")


def _codecs(text: str) -> tuple[str, ...]:
    out = tuple(c.strip() for c in text.split(",") if c.strip())
    bad = [c for c in out if c not in CODECS]
    if bad or not out:
        raise argparse.ArgumentTypeError(f"unknown codec(s) {', '.join(bad) or '(none)'}; choose from {', '.join(CODECS)}")
    return out


def _ints(text: str) -> tuple[int, ...]:
    try:
        out = tuple(int(x) for x in text.split(",") if x.strip())
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected comma-separated integers, got {text!r}") from None
    if not out or min(out) < 0:
        raise argparse.ArgumentTypeError(f"expected non-negative integers, got {text!r}")
    return out


def _positive(text: str) -> int:
    try:
        v = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected an integer, got {text!r}") from None
    if v < 1:
        raise argparse.ArgumentTypeError(f"expected >= 1, got {v}")
    return v


def add_bench(sub: Any) -> None:
    p = sub.add_parser(
        "bench", help="benchmark conversion and reading against baselines and peers",
        description="Convert generated (and, in full mode, real) corpora with h5batch and with the naive "
                    "HDF5 recipe, measure the decode-only floor, read every layout through a torch "
                    "DataLoader, and write bench/results/<timestamp>/ (results.json, results.md, PNG "
                    "plots). See docs/benchmarks.md.")
    mode = p.add_mutually_exclusive_group()
    mode.add_argument("--quick", action="store_true", help="1024 pairs, 2 repetitions, codecs auto, blosc2-lz4 and gzip, no peers (< 2 min)")
    mode.add_argument("--full", action="store_true", help="4096 pairs (x4: 16384 for scaling), every codec, peers, real corpora")
    p.add_argument("--peers", action="store_true", help="also WebDataset and LitData (always on in full mode)")
    p.add_argument("--no-peers", action="store_true", help="skip the peers even in full mode")
    p.add_argument("--no-real", action="store_true", help="skip ../shared/corpora even in full mode")
    p.add_argument("--pairs", type=_positive, help="paired-audio samples of the x1 corpus")
    p.add_argument("--images", type=_positive, help="generated images")
    p.add_argument("--rate", type=_positive,
                   help="sample rate (Hz) of the generated 2 s paired-audio clips (default 16000)")
    p.add_argument("--scale", type=_positive, help="the scaling corpus is SCALE x pairs (default 4)")
    p.add_argument("--reps", type=_positive, help="timed repetitions per configuration")
    p.add_argument("--codecs", type=_codecs, help="comma-separated codecs for the audio corpus")
    p.add_argument("--workers", type=_ints, help="DataLoader num_workers values (default 0,2)")
    p.add_argument("--random-all", action="store_true",
                   help="read every codec in full random order too (default: only the default codec)")
    p.add_argument("--out", help="results root (default bench/results)")
    p.add_argument("--cache", help="where generated corpora are kept (default data/bench)")
    p.add_argument("--keep", action="store_true", help="keep the converted outputs under <results>/work")
    p.add_argument("--render", metavar="RESULTS_DIR",
                   help="measure nothing: judge the targets again and rewrite RESULTS_DIR/results.md, its plots "
                        "and the targets in results.json from the measurements in results.json "
                        "(after a change to the report)")
    p.add_argument("--consume", action="store_true",
                   help="reads: sum every tensor of every batch in the main process, as a training step "
                        "reads its input (default: batches are only counted)")
    p.set_defaults(handler=cmd_bench)


def cmd_bench(args: argparse.Namespace) -> int:
    from . import report
    from .suite import Bench, full_config, quick_config

    if args.render:
        return _render(args.render)

    over: dict[str, Any] = {}
    for name in ("pairs", "rate", "images", "scale", "reps", "codecs", "workers"):
        if getattr(args, name) is not None:
            over[name] = getattr(args, name)
    if args.out:
        over["out_root"] = args.out
    if args.cache:
        over["cache"] = args.cache
    if args.keep:
        over["keep"] = True
    if args.random_all:
        over["random_all_codecs"] = True
    if args.consume:
        over["consume"] = True
    cfg = quick_config(**over) if args.quick else full_config(**over)
    if args.peers:
        cfg.peers = True
    if args.no_peers:
        cfg.peers = False
    if args.no_real:
        cfg.real = False
    results = Bench(cfg).run()
    paths = report.write(results)
    print(report.markdown(results))
    print(f"results in {results['out_dir']} ({', '.join(sorted(paths))})", file=sys.stderr)
    return 0


def _render(out_dir: str) -> int:
    """Targets, markdown and plots again from a finished run's ``results.json``."""
    import json

    from . import report

    path = os.path.join(out_dir, "results.json")
    try:
        with open(path) as f:
            results = json.load(f)
    except (OSError, ValueError) as e:
        print(f"h5batch bench --render: cannot read {path}: {e}", file=sys.stderr)
        return 2
    paths = report.write(results, out_dir)
    print(f"rewrote {', '.join(sorted(os.path.basename(p) for p in paths.values()))} in {out_dir}", file=sys.stderr)
    return 0
