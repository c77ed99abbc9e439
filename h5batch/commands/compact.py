"""``h5batch compact OUT.h5``: give back the space that syncs left unused in an output
(:mod:`h5batch.tools.compact`, imported when the command runs: it needs h5py)."""

from __future__ import annotations

import json
import sys

NAME = "compact"
HELP = "give back the dead space syncs leave in an output (a checked copy renamed over it)"
DESCRIPTION = ("Copy every object of an h5batch output into a new file (chunks as stored, nothing "
               "decoded), check it (structure, and every sample's checksum unless --no-verify) and "
               "rename it over the output. Each sync leaves the inventory and tables it replaces as "
               "unused space; compact gives it back. Rows keep their numbers (tombstoned rows stay). "
               "Needs the output's size in free space; a crash leaves the output as it was.")


def add_arguments(p) -> None:
    p.add_argument("path", help="an h5batch output file")
    p.add_argument("--no-verify", action="store_true",
                   help="skip re-reading every sample of the copy (the structure is still compared)")
    p.add_argument("--json", action="store_true", help="print the sizes as JSON on stdout")


def run(args) -> int:
    from ..tools.compact import compact

    r = compact(args.path, verify=not args.no_verify, say=lambda text: print(text, file=sys.stderr))
    if args.json:
        print(json.dumps({"path": r.path, "before": r.before, "after": r.after, "freed": r.freed,
                          "verified": r.verified}))
    checked = "checked and verified" if r.verified else "checked (not verified)"
    print(f"compacted {r.path}: {r.before / 1e6:,.1f} MB -> {r.after / 1e6:,.1f} MB "
          f"({r.freed / 1e6:,.1f} MB given back; copy {checked})", file=sys.stderr)
    return 0
