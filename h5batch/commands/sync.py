"""``h5batch sync JOB|DIR``: bring the finished output of JOB up to date with its corpus,
converting only the files that are new or changed (docs/sync.md).

Takes the same job-override flags as ``convert`` (``--output``, ``--set``, ``--workers``,
``--scheduler``), so a job is synced the way it was converted.
"""

from __future__ import annotations

import json
import sys

from . import convert as _convert

NAME = "sync"
HELP = "update a finished output with the corpus's new, changed and removed files"
DESCRIPTION = ("Discover the corpus of JOB again and compare it with the output's inventory: new files are "
               "decoded and appended, changed files reconverted, removed files stop being yielded by the "
               "reader. All or nothing: an interrupted sync is undone and the same command does it again.")


def add_arguments(p) -> None:
    _convert.add_job_arguments(p, job_help="job file (YAML) that made the output, or the corpus folder it was converted from")


def run(args) -> int:
    from ..conversion.options import ConvertOptions
    from ..conversion.sync import sync

    job = _convert.load(args, _convert.job_overrides(args), quiet=True)
    if "://" in job.output.path:  # s3://: a file changed in place cannot be an object
        print(f"h5batch sync: {job.output.path}: cannot change an object in place; sync a local output "
              "and convert it to the object again (--overwrite)", file=sys.stderr)
        return 2

    s = sync(job, ConvertOptions(progress=args.progress, verbose=args.verbose), dry_run=args.dry_run)
    counts = ", ".join(f"{k} {v}" for k, v in s.counts.items())
    if s.dry_run and not s.up_to_date:
        print(f"{s.path}: a sync would bring in {s.new} new and {s.changed} changed files and remove "
              f"{s.removed}, {s.unchanged} unchanged; then {counts} (dry run: nothing written, "
              f"{s.discover_seconds:.1f}s)", file=sys.stderr)
    elif s.up_to_date:
        print(f"{s.path} is up to date with its corpus ({counts}); nothing to do "
              f"({s.seconds:.1f}s)", file=sys.stderr)
    else:
        how = "" if s.in_place else " (on a copy: a reader had it open)"
        print(f"synced {s.path}{how}: {s.new} new, {s.changed} changed, {s.removed} removed, "
              f"{s.unchanged} unchanged; now {counts}, {s.rejects} rejects; {s.seconds:.1f}s "
              f"(discovery {s.discover_seconds:.1f}s)", file=sys.stderr)
    if args.json:
        keys = ("path", "new", "changed", "removed", "unchanged", "counts", "rejects", "seconds", "discover_seconds",
                "convert_seconds", "in_place", "up_to_date", "dry_run", *(("paths",) if s.dry_run else ()))
        print(json.dumps({k: getattr(s, k) for k in keys}))
    return 0
