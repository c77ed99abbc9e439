"""``h5batch bench``: the benchmark suite (:mod:`h5batch.bench`; docs/benchmarks.md).

Its arguments and their parsers; the suite, its reports and their dependencies (numpy for
the codec registry, torch, matplotlib) are imported only when used.
"""

from __future__ import annotations

import argparse
import os
import sys
from typing import Any

NAME = "bench"
HELP = "benchmark conversion and reading against baselines and peers"
DESCRIPTION = ("Convert generated (and, in full mode, real) corpora with `h5batch convert`, the naive "
               "HDF5 recipe and (with --peers) WebDataset and LitData, each a whole command, check every "
               "output against the source, read every layout through a torch DataLoader beside raw files "
               "and a memmap, and write bench/results/<timestamp>/ (results.json, results.md with the "
               "targets, PNG plots). See docs/benchmarks.md.")


def _codecs(text: str) -> tuple[str, ...]:
    # The codec registry, imported only when --codecs is given (it brings numpy).
    from ..codecs import choices

    known = choices()
    out = tuple(c.strip() for c in text.split(",") if c.strip())
    bad = [c for c in out if c not in known]
    if bad or not out:
        raise argparse.ArgumentTypeError(f"unknown codec(s) {', '.join(bad) or '(none)'}; choose from {', '.join(known)}")
    return out


def _ints(text: str) -> tuple[int, ...]:
    try:
        out = tuple(int(x) for x in text.split(",") if x.strip())
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected comma-separated integers, got {text!r}") from None
    if not out or min(out) < 0:
        raise argparse.ArgumentTypeError(f"expected non-negative integers, got {text!r}")
    return out


def _at_least(low: int):
    def parse(text: str) -> int:
        try:
            v = int(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"expected an integer, got {text!r}") from None
        if v < low:
            raise argparse.ArgumentTypeError(f"expected >= {low}, got {v}")
        return v
    return parse


_positive = _at_least(1)


def add_arguments(p: argparse.ArgumentParser) -> None:
    mode = p.add_mutually_exclusive_group()
    mode.add_argument("--quick", action="store_true",
                      help="1024 pairs, 64 images, 2 repetitions, codecs auto, blosc2-lz4 and gzip, no peers")
    mode.add_argument("--full", action="store_true",
                      help="the default: 4096 pairs (x4: 16384 for scaling), 400 images, 3 repetitions, every codec, "
                           "peers, real corpora")
    p.add_argument("--peers", action="store_true", help="also WebDataset and LitData (always on in full mode)")
    p.add_argument("--s3", action="store_true",
                   help="also read from object storage: h5batch's s3:// reader beside LitData's, one S3 server on "
                        "loopback (moto; the s3 extra)")
    p.add_argument("--no-peers", action="store_true", help="skip the peers even in full mode")
    p.add_argument("--no-real", action="store_true", help="skip ../shared/corpora even in full mode")
    p.add_argument("--pairs", type=_positive, help="paired-audio samples of the x1 corpus")
    p.add_argument("--images", type=_at_least(0), help="generated images (0: no image corpus)")
    p.add_argument("--rate", type=_positive,
                   help="sample rate (Hz) of the generated 2 s paired-audio clips (default 16000)")
    p.add_argument("--scale", type=_positive, help="the scaling corpus is SCALE x pairs (default 4; 1: none)")
    p.add_argument("--reps", type=_positive, help="timed repetitions per configuration")
    p.add_argument("--codecs", type=_codecs, help="comma-separated codecs for the audio corpus")
    p.add_argument("--workers", type=_ints, help="DataLoader num_workers values (default 0,2)")
    p.add_argument("--out", help="results root (default bench/results)")
    p.add_argument("--cache", help="where generated corpora are kept (default data/bench)")
    p.add_argument("--keep", action="store_true", help="keep the converted outputs under <results>/work")
    p.add_argument("--render", metavar="RESULTS_DIR",
                   help="measure nothing: judge the targets again and rewrite RESULTS_DIR/results.md, its plots "
                        "and results.json from the measurements in results.json (after a change to the report)")
    p.add_argument("--consume", action="store_true",
                   help="reads: sum every tensor of every batch in the main process, as a training step "
                        "reads its input (default: batches are only counted)")


def run(args) -> int:
    from ..bench import report
    from ..bench.suite import Bench, BenchConfig, full_config

    if args.render:
        return _render(args.render)

    over: dict[str, Any] = {name: getattr(args, name) for name in ("pairs", "rate", "images", "scale", "reps",
                                                                   "codecs", "workers") if getattr(args, name) is not None}
    over.update((k, v) for k, v in (("out_root", args.out), ("cache", args.cache), ("keep", args.keep),
                                    ("consume", args.consume)) if v)
    cfg = BenchConfig(**over) if args.quick else full_config(**over)
    cfg.peers = (cfg.peers or args.peers) and not args.no_peers
    cfg.real = cfg.real and not args.no_real
    cfg.s3 = args.s3
    results = Bench(cfg).run()
    paths = report.write(results)
    print(report.markdown(results))
    print(f"results in {results['out_dir']} ({', '.join(sorted(paths))})", file=sys.stderr)
    return 0


def _render(out_dir: str) -> int:
    """Targets, markdown and plots again from a finished run's ``results.json``."""
    import json

    from ..bench import report

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
