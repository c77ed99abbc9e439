"""``h5batch bench``: the benchmark suite (:mod:`h5batch.bench`; docs/benchmarks.md).

Its arguments are defined in :mod:`h5batch.bench.cli` beside the suite they configure; the
suite, its reports and their dependencies (torch, matplotlib) are imported only in ``run``.
"""

from __future__ import annotations

import os
import sys
from typing import Any

from ..bench.cli import add_arguments

__all__ = ["DESCRIPTION", "HELP", "NAME", "add_arguments", "run"]

NAME = "bench"
HELP = "benchmark conversion and reading against baselines and peers"
DESCRIPTION = ("Convert generated (and, in full mode, real) corpora with `h5batch convert`, the naive "
               "HDF5 recipe and (with --peers) WebDataset and LitData, each a whole command, check every "
               "output against the source, read every layout through a torch DataLoader beside raw files "
               "and a memmap, and write bench/results/<timestamp>/ (results.json, results.md with the "
               "targets, PNG plots). See docs/benchmarks.md.")


def run(args) -> int:
    from ..bench import report
    from ..bench.suite import Bench, full_config, quick_config

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
    if args.consume:
        over["consume"] = True
    cfg = quick_config(**over) if args.quick else full_config(**over)
    if args.peers:
        cfg.peers = True
    cfg.s3 = args.s3
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
