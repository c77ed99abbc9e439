"""``h5batch export OUT.h5 --to TARGET DIR``: an output written back out as WebDataset shards
or as plain files, for tools that read those.

The work is :mod:`h5batch.export` (imported when the command runs: it needs the reader, so
torch); this module parses and prints one line per split. Layouts, what round-trips and
what does not: docs/interop.md.
"""

from __future__ import annotations

import sys
import time

NAME = "export"
HELP = "write an output as WebDataset tar shards or as wav/png files with labels.csv"
DESCRIPTION = ("Writes the live samples of an output (what H5Dataset yields) into DIR. "
               "--to webdataset: tar shards DIR/<split>-000000.tar ... with members <key>.wav|png "
               "(audio as 16-bit PCM or float WAV, images as PNG), <key>.cls (integer label) and "
               "<key>.json (class name, split, source, text/value fields). --to files: "
               "DIR/<split>/<class>/<stem>.wav|png plus DIR/labels.csv, a corpus h5batch converts "
               "again (class_folders layout). See docs/interop.md.")


def add_arguments(p) -> None:
    p.add_argument("path", help="a complete h5batch output file")
    p.add_argument("--to", required=True, metavar="TARGET", dest="target",
                   help="webdataset or files")
    p.add_argument("dir", metavar="DIR", help="folder to write into (created when missing)")
    p.add_argument("--split", action="append", dest="splits", metavar="S",
                   help="export only this split (repeatable; default every split)")
    p.add_argument("--fields", metavar="A,B", help="comma-separated fields to export (default all)")
    p.add_argument("--shard-size", type=int, default=None, metavar="N",
                   help="webdataset: samples per shard (default 1000)")
    p.add_argument("--overwrite", action="store_true",
                   help="replace what an earlier export of these splits left in DIR")


def run(args) -> int:
    from ..export import TARGETS, ExportError, export

    if args.target not in TARGETS:
        raise ExportError(f"--to {args.target!r}: unknown target (targets: {', '.join(TARGETS)})")
    options = {}
    if args.shard_size is not None:
        if args.target != "webdataset":
            raise ExportError("--shard-size applies to --to webdataset only")
        options["shard_size"] = args.shard_size
    fields = [f.strip() for f in args.fields.split(",") if f.strip()] if args.fields else None
    t0 = time.perf_counter()
    summary = export(args.path, args.target, args.dir, args.splits, fields, overwrite=args.overwrite, **options)
    seconds = time.perf_counter() - t0
    total = sum(s["samples"] for s in summary["splits"].values())
    for split, s in summary["splits"].items():
        extra = f", {len(s['shards'])} shards" if "shards" in s else ""
        print(f"h5batch export: {split}: {s['samples']} samples{extra}", file=sys.stderr)
    print(f"h5batch export: {total} samples to {args.dir} ({args.target}) in {seconds:.1f} s "
          f"({total / seconds if seconds > 0 else 0:.0f} samples/s)", file=sys.stderr)
    return 0
