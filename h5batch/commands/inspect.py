"""``h5batch inspect OUT.h5``: describe an output (h5batch.tools.inspect does the reading)."""

from __future__ import annotations

import json
import os

NAME = "inspect"
HELP = "show splits, fields, shapes, codec, counts and rejects of an output, or one sample"
DESCRIPTION = ("Describe an h5batch HDF5 file: splits, fields, shapes, dtypes, chunk "
               "shape, codec, sample counts, rejects, bytes on disk, compression ratio "
               "and the job that made it.")


def add_arguments(p) -> None:
    p.add_argument("path", help="an h5batch output file")
    p.add_argument("--json", action="store_true", help="machine-readable output")
    p.add_argument("--rejects", type=int, default=20, help="how many rejects to list (default 20)")
    p.add_argument("--sample", type=int, metavar="I",
                   help="show sample I as the reader yields it (fields, label name, source, checksum)")
    p.add_argument("--split", metavar="S", help="split of --sample (default train, else the first split)")


def run(args) -> int:
    from ..tools.inspect import describe, render, sample
    from ..tools.samples import SampleError, render_record

    if not os.path.exists(args.path):
        raise SampleError(f"{args.path}: no such file")
    if args.sample is not None:
        rec = sample(args.path, args.sample, args.split)
        print(json.dumps(rec, indent=1) if args.json else render_record(rec))
        return 0
    d = describe(args.path)
    print(json.dumps(d, indent=1) if args.json else render(d, args.rejects))
    return 0
