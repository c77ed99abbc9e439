"""``h5batch view add|list|remove OUT.h5 ...``: named row subsets kept inside an output.

The work is :mod:`h5batch.tools.views` (imported when the command runs: it needs h5py);
this module parses and prints. A view is written into a copy of the file that is renamed
over it, so a crash never leaves a damaged output (the module docstring there says how).
"""

from __future__ import annotations

import json
import sys

NAME = "view"
HELP = "add, list or remove named row subsets (folds, classes, filters) of a split"
DESCRIPTION = ("Views are named lists of rows of a split, stored in the output as "
               "/<split>/views/<name> (no sample is rewritten); H5Dataset(path, split, view=name) "
               "reads only those rows. 'add' selects rows with --where EXPR (over index, label, "
               "numeric scalar fields and <variable field>.length, e.g. 'index % 5 == 0' or "
               "'label == \"cat\"') or --rows FILE (row numbers, text or .npy).")


def add_arguments(p) -> None:
    sub = p.add_subparsers(dest="action", required=True, metavar="ACTION")
    a = sub.add_parser("add", help="store a view", description=DESCRIPTION)
    a.add_argument("path", help="an h5batch output file")
    a.add_argument("name", help="view name (letters, digits, _ . -)")
    a.add_argument("--split", default="train", help="split the rows belong to (default train)")
    how = a.add_mutually_exclusive_group(required=True)
    how.add_argument("--where", metavar="EXPR", help="rows where EXPR is true")
    how.add_argument("--rows", metavar="FILE", help="row numbers: a text file (whitespace/comma separated) or .npy")
    a.add_argument("--overwrite", action="store_true", help="replace a view of that name")
    ls = sub.add_parser("list", help="list the views of every split")
    ls.add_argument("path", help="an h5batch output file")
    ls.add_argument("--json", action="store_true", help="print {split: {view: rows}} as JSON")
    rm = sub.add_parser("remove", help="delete a view")
    rm.add_argument("path", help="an h5batch output file")
    rm.add_argument("name", help="view name")
    rm.add_argument("--split", default="train", help="split of the view (default train)")


def run(args) -> int:
    from ..tools import views

    if args.action == "add":
        rows = views.rows_from_file(args.rows) if args.rows else None
        n = views.add_view(args.path, args.name, args.split, where=args.where, rows=rows,
                           overwrite=args.overwrite)
        print(f"h5batch view: {args.path}: {args.split}/{args.name}: {n} rows", file=sys.stderr)
        return 0
    if args.action == "remove":
        views.remove_view(args.path, args.name, args.split)
        print(f"h5batch view: {args.path}: removed {args.split}/{args.name}", file=sys.stderr)
        return 0
    found = views.list_views(args.path)
    if args.json:
        print(json.dumps(found))
    else:
        for split, vs in found.items():
            for v, n in vs.items():
                print(f"{split}/{v}\t{n}")
    return 0
