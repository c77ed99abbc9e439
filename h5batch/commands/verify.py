"""``h5batch verify OUT.h5``: re-read every sample and report what is wrong, one line each.

The checks are :func:`h5batch.tools.verify.verify_file` (imported when the command runs:
it needs h5py); this module only prints its report. Exit code 0 when the file is sound, 1
when a problem is found, 2 (a :class:`~h5batch.errors.VerifyError`) when it cannot be
verified at all.
"""

from __future__ import annotations

import json
import sys

NAME = "verify"
HELP = "re-read every sample: checksums, structure, every input accounted for"
DESCRIPTION = ("Re-read every sample of an h5batch file and compare its crc32 with the stored one; "
               "check offsets, shapes, counts and labels; check every input file is a sample's "
               "source or a reject. Exit code 0 when sound, 1 when a problem is found (each "
               "named by split/field[index] and source file), 2 when the file cannot be verified.")


def add_arguments(p) -> None:
    p.add_argument("path", help="an h5batch output file")
    p.add_argument("--sources", action="store_true",
                   help="also re-decode every sample's source files and compare exactly")
    p.add_argument("--root", help="corpus root for --sources (default: source.root of the stored job)")
    p.add_argument("--max-problems", type=int, default=50, help="how many problems to list (default 50)")
    p.add_argument("--json", action="store_true", help="print the report as JSON on stdout")


def run(args) -> int:
    from ..tools.verify import verify_file

    report = verify_file(args.path, sources=args.sources, root=args.root)
    if args.json:
        print(json.dumps({"path": report.path, "ok": report.ok, "counts": report.counts,
                          "rejects": report.rejects - report.excluded, "excluded": report.excluded,
                          "inputs": report.inputs,
                          "bytes_checked": report.bytes_checked, "sources_compared": report.sources_compared,
                          "problems": [vars(p) for p in report.problems]}))
    if report.ok:
        print(f"h5batch verify: {args.path}: OK: {report.summary()}", file=sys.stderr)
        return 0
    print(f"h5batch verify: {args.path}: {len(report.problems)} problems", file=sys.stderr)
    for p in report.problems[: args.max_problems]:
        print(f"  {p}", file=sys.stderr)
    if len(report.problems) > args.max_problems:
        print(f"  ... and {len(report.problems) - args.max_problems} more (--max-problems)", file=sys.stderr)
    print(f"checked: {report.summary()}", file=sys.stderr)
    return 1
