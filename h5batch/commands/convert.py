"""``h5batch convert JOB|DIR``: run the conversion a job file describes (or the job a folder
implies, :mod:`h5batch.folder_job`), print its summary.

Command-line flags become job overrides (``--workers`` is ``cluster.workers``, ``--output``
is ``output.path``, ``--scheduler`` picks ``cluster.kind: address``), so the output records
the job that made it whatever way the settings were given.
"""

from __future__ import annotations

import json
import os
import shlex
import sys

NAME = "convert"
HELP = "convert a corpus (a folder, or as a job file says) to HDF5"
DESCRIPTION = ("Discover the corpus of JOB, decode it in parallel (decoder processes, or Dask workers) and write one HDF5 file. "
               "JOB is a job file (its keys: docs/jobs.md) or a folder of audio or image files: then the job is "
               "inferred from the folder (h5batch init DIR prints it) and the output is ./<folder name>.h5. "
               "A matching partial output from an interrupted run is resumed.")


def add_job_arguments(p, job_help: str = "job file (YAML, e.g. jobs/demo.yaml) or a corpus folder") -> None:
    """The job and the flags that stand for job keys (:func:`job_overrides`), plus
    ``--progress`` and ``--json``: shared by every command that runs a job (convert, sync)."""
    p.add_argument("job", help=job_help)
    p.add_argument("--workers", type=int, help="number of decoder or local worker processes (cluster.workers)")
    p.add_argument("--output", help="output path (output.path)")
    p.add_argument("--set", dest="overrides", action="append", default=[], metavar="KEY=VALUE",
                   help="override a job key, e.g. --set output.codec=gzip (repeatable)")
    p.add_argument("--scheduler", help="address of an existing Dask scheduler (tcp://host:port); "
                                       "default from DASK_SCHEDULER_ADDRESS")
    p.add_argument("--scheduler-file", help="Dask scheduler file of an existing cluster")
    p.add_argument("--progress", choices=["auto", "bar", "log", "none"], default="auto",
                   help="progress display (default: bar on a terminal, log lines otherwise)")
    p.add_argument("--json", action="store_true", help="print the summary as JSON on stdout")
    p.add_argument("-v", "--verbose", action="store_true",
                   help="also say the internals: pre-flight, why each codec, batch size")
    p.add_argument("--dry-run", "-n", action="store_true",
                   help="say what the command would do (with --json: as JSON) and write nothing")


def add_arguments(p) -> None:
    add_job_arguments(p)
    p.add_argument("--limit", type=int, metavar="N",
                   help="a trial: N samples spread over the splits and classes, the rest excluded (source.limit)")
    p.add_argument("--overwrite", action="store_true", help="replace an existing output file")
    p.add_argument("--restart", action="store_true", help="discard any partial output and start over")


def job_overrides(args) -> list[str]:
    """The ``--set`` list plus the overrides the other flags stand for."""
    over = list(args.overrides)
    if getattr(args, "limit", None) is not None:
        over.append(f"source.limit={args.limit}")
    if args.workers is not None:
        over.append(f"cluster.workers={args.workers}")
    if args.output:
        over.append(f"output.path={args.output}")
    scheduler = args.scheduler
    if scheduler is None and not args.scheduler_file and os.environ.get("DASK_SCHEDULER_ADDRESS"):
        # Dask's standard variable picks the scheduler for jobs that would start a LocalCluster;
        # it must not silently override a job that asks for SLURM or a scheduler of its own.
        kind = load(args, over, check_paths=False, quiet=True).cluster.kind
        if kind in ("local", "processes"):
            scheduler = os.environ["DASK_SCHEDULER_ADDRESS"]
    if scheduler:
        over += ["cluster.kind=address", f"cluster.address={scheduler}"]
    if args.scheduler_file:
        over += ["cluster.kind=scheduler_file", f"cluster.scheduler_file={args.scheduler_file}"]
    return over


def load(args, overrides: list[str], check_paths: bool = True, quiet: bool = False):
    """The job of ``args.job``: a job file, or the job a folder implies (said on stderr, as a
    job file to save and edit)."""
    from ..config import load_job, with_overrides

    if not os.path.isdir(args.job):
        return load_job(args.job, overrides, check_paths=check_paths)
    from ..folder_job import commented_yaml, infer

    data, notes = infer(args.job)
    if not quiet:
        print(commented_yaml(data, notes), file=sys.stderr)
    return with_overrides(data, overrides, args.job, check_paths)


def top_reasons(rejects_file: str, top: int = 5) -> list[tuple[str, int]]:
    """The most frequent reasons of a run's rejects (not the excluded files), from its
    rejects list."""
    from collections import Counter

    from ..format import STAGE_EXCLUDED

    if not rejects_file or not os.path.exists(rejects_file):
        return []
    with open(rejects_file) as fh:
        rows = [json.loads(line) for line in fh if line.strip()]
    return Counter(r["reason"] for r in rows if r.get("stage") != STAGE_EXCLUDED).most_common(top)


def run(args) -> int:
    from ..conversion.options import ConvertOptions
    from ..conversion.pipeline import convert
    from ..format import rejects_words

    job = load(args, job_overrides(args))
    if args.dry_run:
        from ..conversion.dry_run import describe, dry_run

        report = dry_run(job, lambda line: print(line, file=sys.stderr))
        print("\n".join(describe(report)), file=sys.stderr)
        if args.json:
            print(json.dumps(report))
        return 0
    opts = ConvertOptions(resume=not args.restart, restart=args.restart, overwrite=args.overwrite,
                          progress=args.progress, verbose=args.verbose)
    s = convert(job, opts)
    rate = s.samples / s.seconds if s.seconds else 0
    counts = ", ".join(f"{k} {v}" for k, v in s.counts.items())
    rejected = rejects_words(s.rejects - s.excluded, s.excluded)
    listed = f" (listed in {s.rejects_file})" if s.rejects_file else ""
    if s.extra.get("already_complete"):  # nothing was converted: no rate to give
        print(f"{s.path}: {s.samples} samples ({counts}), {rejected}{listed}; "
              f"{s.output_bytes / 1e6:.1f} MB on disk", file=sys.stderr)
    else:
        print(f"wrote {s.path}: {s.samples} samples ({counts}), {rejected}{listed} "
              f"in {s.seconds:.1f}s = {rate:.0f} samples/s, "
              f"{s.bytes_decoded / 1e6 / max(s.seconds, 1e-9):.1f} MB/s decoded; "
              f"{s.output_bytes / 1e6:.1f} MB on disk"
              + (f"; resumed after {s.resumed_from} batches" if s.resumed_from else ""), file=sys.stderr)
    for reason, n in top_reasons(s.rejects_file):
        print(f"  {n} x {reason}", file=sys.stderr)
    if args.json:
        print(json.dumps({"path": s.path, "counts": s.counts, "rejects": s.rejects - s.excluded,
                          "excluded": s.excluded, "seconds": s.seconds,
                          "bytes_decoded": s.bytes_decoded, "output_bytes": s.output_bytes,
                          "resumed_from": s.resumed_from, "already_complete": bool(s.extra.get("already_complete"))}))
    else:
        rel = os.path.relpath(s.path)  # short when the output is under the current folder
        shown = s.path if rel.startswith(os.pardir) else rel
        print(f"inspect it with: h5batch inspect {shlex.quote(shown)}", file=sys.stderr)
    return 0
