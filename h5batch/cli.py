"""Command line: argument parsing only. The one place that reads the environment."""

from __future__ import annotations

import argparse
import json
import os
import shlex
import sys

from .config import load_job
from .errors import ConfigError


def _add_convert(sub) -> None:
    p = sub.add_parser(
        "convert", help="convert a corpus to HDF5 as a job file says",
        description="Discover the corpus of JOB, decode it on Dask workers and write one HDF5 file. "
                    "A matching partial output from an interrupted run is resumed.")
    p.add_argument("job", help="job file (YAML), e.g. jobs/demo.yaml")
    p.add_argument("--workers", type=int, help="number of local worker processes (cluster.workers)")
    p.add_argument("--output", help="output path (output.path)")
    p.add_argument("--set", dest="overrides", action="append", default=[], metavar="KEY=VALUE",
                   help="override a job key, e.g. --set output.codec=gzip (repeatable)")
    p.add_argument("--scheduler", help="address of an existing Dask scheduler (tcp://host:port); "
                                       "default from DASK_SCHEDULER_ADDRESS")
    p.add_argument("--scheduler-file", help="Dask scheduler file of an existing cluster")
    p.add_argument("--overwrite", action="store_true", help="replace an existing output file")
    p.add_argument("--resume", action="store_true", default=True,
                   help="continue a matching partial output (the default)")
    p.add_argument("--restart", action="store_true", help="discard any partial output and start over")
    p.add_argument("--progress", choices=["auto", "bar", "log", "none"], default="auto",
                   help="progress display (default: bar on a terminal, log lines otherwise)")
    p.add_argument("--json", action="store_true", help="print the summary as JSON on stdout")


def _job_overrides(args) -> list[str]:
    over = list(args.overrides)
    if args.workers is not None:
        over.append(f"cluster.workers={args.workers}")
    if args.output:
        over.append(f"output.path={args.output}")
    scheduler = args.scheduler
    if scheduler is None and not args.scheduler_file and os.environ.get("DASK_SCHEDULER_ADDRESS"):
        # Dask's standard variable picks the scheduler for jobs that would start a LocalCluster;
        # it must not silently override a job that asks for SLURM or a scheduler of its own.
        kind = load_job(args.job, over, check_paths=False).cluster.kind
        if kind == "local":
            scheduler = os.environ["DASK_SCHEDULER_ADDRESS"]
    if scheduler:
        over += ["cluster.kind=address", f"cluster.address={scheduler}"]
    if args.scheduler_file:
        over += ["cluster.kind=scheduler_file", f"cluster.scheduler_file={args.scheduler_file}"]
    return over


def _faults(text: str) -> tuple[tuple[str, str], ...]:
    """``H5BATCH_FAULTS="crash_on=a.wav,kill_once=3:/tmp/m"`` (fault-injection tests only)."""
    return tuple(tuple(p.split("=", 1)) for p in text.split(",") if "=" in p)  # type: ignore[misc]


def cmd_convert(args) -> int:
    from .convert.driver import ConvertOptions, convert
    from .errors import ConvertError

    job = load_job(args.job, _job_overrides(args))
    progress = {"auto": None, "bar": True, "log": True, "none": False}[args.progress]
    opts = ConvertOptions(resume=not args.restart, restart=args.restart, overwrite=args.overwrite,
                          progress=progress, fault_pause=os.environ.get("H5BATCH_FAULT_PAUSE"),
                          faults=_faults(os.environ.get("H5BATCH_FAULTS", "")))
    try:
        s = convert(job, opts)
    except ConvertError as e:
        print(f"h5batch convert: {e}", file=sys.stderr)
        return e.exit_code
    rate = s.samples / s.seconds if s.seconds else 0
    counts = ", ".join(f"{k} {v}" for k, v in s.counts.items())
    print(f"wrote {s.path}: {s.samples} samples ({counts}), {s.rejects} rejects "
          f"(listed in {s.rejects_file}) in {s.seconds:.1f}s = {rate:.0f} samples/s, "
          f"{s.bytes_decoded / 1e6 / max(s.seconds, 1e-9):.1f} MB/s decoded; "
          f"{s.output_bytes / 1e6:.1f} MB on disk"
          + (f"; resumed after {s.resumed_from} batches" if s.resumed_from else ""), file=sys.stderr)
    if args.json:
        print(json.dumps({"path": s.path, "counts": s.counts, "rejects": s.rejects, "seconds": s.seconds,
                          "bytes_decoded": s.bytes_decoded, "output_bytes": s.output_bytes,
                          "resumed_from": s.resumed_from}))
    else:
        rel = os.path.relpath(s.path)  # short when the output is under the current folder
        shown = s.path if rel.startswith(os.pardir) else rel
        print(f"inspect it with: h5batch inspect {shlex.quote(shown)}", file=sys.stderr)
    return 0


def cmd_inspect(args) -> int:
    from .tools.inspect import describe, render

    if not os.path.exists(args.path):
        print(f"h5batch inspect: {args.path}: no such file", file=sys.stderr)
        return 2
    d = describe(args.path)
    print(json.dumps(d, indent=1) if args.json else render(d, args.rejects))
    return 0


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="h5batch",
        description="Turn a corpus of media files (audio, images) into fast HDF5 training data.")
    from . import __version__

    parser.add_argument("--version", action="version", version=f"h5batch {__version__}")
    sub = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")
    _add_convert(sub)
    p = sub.add_parser("inspect", help="show splits, fields, shapes, codec, counts and rejects of an output",
                       description="Describe an h5batch HDF5 file: splits, fields, shapes, dtypes, chunk "
                                   "shape, codec, sample counts, rejects, bytes on disk, compression ratio "
                                   "and the job that made it.")
    p.add_argument("path", help="an h5batch output file")
    p.add_argument("--json", action="store_true", help="machine-readable output")
    p.add_argument("--rejects", type=int, default=20, help="how many rejects to list (default 20)")
    for extra in _EXTRA_COMMANDS:
        extra(sub)
    return parser


_EXTRA_COMMANDS: list = []


def _add_verify(sub) -> None:
    """``h5batch verify`` (h5batch.tools.verify, imported only when run: it needs h5py)."""
    p = sub.add_parser(
        "verify", help="re-read every sample: checksums, structure, every input accounted for",
        description="Re-read every sample of an h5batch file and compare its crc32 with the stored one; "
                    "check offsets, shapes, counts and labels; check every input file is a sample's "
                    "source or a reject. Exit code 0 when sound, 1 when a problem is found (each "
                    "named by split/field[index] and source file), 2 when the file cannot be verified.")
    p.add_argument("path", help="an h5batch output file")
    p.add_argument("--sources", action="store_true",
                   help="also re-decode every sample's source files and compare exactly")
    p.add_argument("--root", help="corpus root for --sources (default: source.root of the stored job)")
    p.add_argument("--max-problems", type=int, default=50, help="how many problems to list (default 50)")
    p.add_argument("--json", action="store_true", help="print the report as JSON on stdout")

    def handler(args) -> int:
        from .tools.verify import cmd_verify

        return cmd_verify(args)

    p.set_defaults(handler=handler)


_EXTRA_COMMANDS.append(_add_verify)


def _add_cluster_script(sub) -> None:
    """``h5batch cluster-script`` (h5batch.convert.cluster; needs dask-jobqueue, no batch system)."""
    p = sub.add_parser(
        "cluster-script", help="print the batch script of one worker job (slurm, pbs, sge, lsf)",
        description="Print the job script dask-jobqueue would submit for each worker job of JOB "
                    "(cluster.kind slurm, pbs, sge or lsf; resources from cluster.jobqueue). Nothing "
                    "is submitted and no scheduler is started: the scheduler address is a placeholder.")
    p.add_argument("job", help="job file (YAML), e.g. jobs/fsdd_slurm.yaml")
    p.add_argument("--set", dest="overrides", action="append", default=[], metavar="KEY=VALUE",
                   help="override a job key, e.g. --set cluster.jobqueue.queue=gpu (repeatable)")

    def handler(args) -> int:
        from .convert.cluster import job_script
        from .errors import ConvertError

        job = load_job(args.job, args.overrides, check_paths=False)
        try:
            print(job_script(job.cluster, job.file).rstrip("\n"))
        except ConvertError as e:
            print(f"h5batch cluster-script: {e}", file=sys.stderr)
            return e.exit_code
        return 0

    p.set_defaults(handler=handler)


_EXTRA_COMMANDS.append(_add_cluster_script)


def _add_bench(sub) -> None:
    """``h5batch bench`` (h5batch.bench; its heavy imports happen only when it runs)."""
    from .bench.cli import add_bench

    add_bench(sub)


_EXTRA_COMMANDS.append(_add_bench)


def main(argv: list[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    handler = {"convert": cmd_convert, "inspect": cmd_inspect}.get(args.command) or args.handler
    try:
        return handler(args)
    except ConfigError as e:
        print(f"h5batch: config error: {e}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        print("h5batch: interrupted", file=sys.stderr)
        return 130


if __name__ == "__main__":
    sys.exit(main())
