#!/usr/bin/env python
"""Is one writer the bottleneck? Time the stages of a conversion separately.

    .venv/bin/python tests/cluster/measure_writer.py [--job jobs/fsdd.yaml] [--workers 2]
        [--set output.codec=gzip ...] [--json]

1. decode only      :func:`decode_only` on a LocalCluster (cluster start-up excluded)
2. decode + pack    ``tasks.decode_batch``: decode and put each batch in /dev/shm (the
                    workers' whole share of a conversion); results kept for step 3
3. writer alone     this process appends those batches with ``writer.OutputWriter`` exactly
                    as the writer process does (compression threads included), then
                    finalizes -- with the machine to itself
4. full convert     ``h5batch.conversion.driver.convert`` of the same job (LocalCluster start-up included)

Prints one line per stage (seconds, samples/s, MB/s of decoded bytes) and the ratio
writer rate / decode rate: how many such decode workers one writer can keep up with.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
import time

from h5batch import ConvertOptions, convert
from h5batch.config import ClusterConfig, load_job
from h5batch.conversion.auto import AutoSettings, resolve
from h5batch.conversion.cluster import connect
from h5batch.conversion.plan import make_tasks, versions
from h5batch.conversion.worker import decode_batch
from h5batch.errors import DecodeError
from h5batch.fields import decode_field, reads_files
from h5batch.layouts import discover
from h5batch.transport.segments import hostname, new_run_id, remove_segments
from h5batch.writer.messages import WriterSpec
from h5batch.writer.output import OutputWriter


def decode_only(task) -> tuple[int, int]:
    """Decode every item of a batch task, without packing, shared memory or writing:
    ``(samples decoded, bytes decoded)``; a file that does not decode is skipped, as the
    conversion would reject it."""
    n = nbytes = 0
    files = [fc for _, fc in task.fields if reads_files(fc)]  # annotation values cost nothing
    for paths, _label, _values in task.items:
        try:
            for fc, rel in zip(files, paths):
                nbytes += decode_field(os.path.join(task.root, rel), fc).nbytes
            n += 1
        except DecodeError:
            pass
    return n, nbytes


def writer_spec(job, manifest, auto: AutoSettings, partial: str, final: str) -> WriterSpec:
    """The spec :class:`h5batch.conversion.driver.Converter` gives its writer process (``auto`` resolved)."""
    num_inputs = sum(len(it.paths) for it in manifest.items) + len(manifest.rejects)
    return WriterSpec(
        partial_path=partial, final_path=final, job_json=json.dumps(job.public_dict(), sort_keys=True),
        job_hash=job.hash(), manifest_hash=manifest.hash, splits=manifest.splits,
        fields=tuple(job.fields.items()), class_names=manifest.class_names, labelled=job.labelled,
        codecs={name: c.codec for name, c in auto.codecs.items()},
        codec_notes={name: c.why() for name, c in auto.codecs.items()},
        chunk_bytes=job.output.chunk_bytes, cache_bytes=job.output.cache_bytes,
        discovery_rejects=manifest.rejects, num_inputs=num_inputs, commit_every=job.policy.commit_every,
        threads=2, versions=versions(), batch_size=auto.batch_size,
    )


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--job", default="jobs/fsdd.yaml")
    ap.add_argument("--workers", type=int, default=2)
    ap.add_argument("--set", dest="overrides", action="append", default=[])
    ap.add_argument("--json", action="store_true")
    args = ap.parse_args(argv)

    tmp = tempfile.mkdtemp(prefix="h5batch-measure-")
    job = load_job(args.job, [*args.overrides, f"output.path={tmp}/full.h5", f"cluster.workers={args.workers}"])
    manifest = discover(job)
    n = len(manifest.items)
    run_id = new_run_id()
    auto = resolve(job, manifest)  # codec: auto and batch_size: auto, as the converter does
    tasks = make_tasks(job, manifest, run_id, hostname(), batch_size=auto.batch_size)
    rows: dict[str, dict[str, float]] = {}

    def row(name: str, seconds: float, nbytes: int) -> None:
        rows[name] = {"seconds": seconds, "samples_per_s": n / seconds, "mb_per_s": nbytes / 1e6 / seconds}

    try:
        with connect(ClusterConfig(kind="local", workers=args.workers, dashboard=False)) as conn:
            client = conn.client
            client.gather(client.map(decode_only, tasks[: args.workers], pure=False))  # warm imports + cache
            t0 = time.perf_counter()
            counts = client.gather(client.map(decode_only, tasks, pure=False))
            row("decode only", time.perf_counter() - t0, sum(b for _, b in counts))
            t0 = time.perf_counter()
            results = client.gather(client.map(decode_batch, tasks, pure=False))
            nbytes = sum(r.packed.nbytes for r in results)
            row("decode + pack to shm", time.perf_counter() - t0, nbytes)

        spec = writer_spec(job, manifest, auto, f"{tmp}/alone.h5.partial", f"{tmp}/alone.h5")
        t0 = time.perf_counter()
        w = OutputWriter(spec)
        for r in sorted(results, key=lambda r: r.index):
            w.write_batch(r)
        # No commit: a conversion commits (flush + fsync) every policy.commit_every seconds,
        # i.e. not at all in one this short; finalize flushes without fsync.
        w.finalize()
        row("writer alone", time.perf_counter() - t0, nbytes)
    finally:
        remove_segments(run_id)

    s = convert(job, ConvertOptions(progress=False, overwrite=True, log=open(os.devnull, "w")))
    row("full convert (incl. LocalCluster start)", s.seconds, s.bytes_decoded)

    ratio = rows["writer alone"]["samples_per_s"] / rows["decode + pack to shm"]["samples_per_s"]
    codec = "; ".join(f"{name} {c.codec.name}" for name, c in auto.codecs.items())
    if args.json:
        print(json.dumps({"job": args.job, "samples": n, "workers": args.workers, "codec": codec, "batch_size": auto.batch_size,
                          "stages": rows, "writer_over_decode": ratio}, indent=1))
    else:
        print(f"{args.job}: {n} samples, {args.workers} decode workers, codec {job.output.codec} ({codec}), "
              f"{auto.batch_size} items per batch, {os.cpu_count()} cores")
        for name, r in rows.items():
            print(f"  {name:42s} {r['seconds']:7.2f} s {r['samples_per_s']:9.0f} samples/s {r['mb_per_s']:8.1f} MB/s")
        print(f"  writer alone / decode+pack ({args.workers} workers) = {ratio:.1f}x: one writer keeps up with "
              f"~{ratio * args.workers:.0f} such decode workers")
    return 0


if __name__ == "__main__":
    sys.exit(main())
