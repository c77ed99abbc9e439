"""The direct-write bound: what a lean conversion, its decoders writing the chunks, could reach.

``python -m h5batch.bench.direct_write [--pairs N] [--rounds R] [--cache DIR]`` converts the
bench's paired-audio corpus (``bench.corpus.paired_audio``) two ways, alternating, and
prints each one's median wall and CPU time and their ratio taken round by round:

``h5batch``  ``convert`` with ``cluster.kind: auto``, what ``h5batch convert`` does
             (decoders fill shared memory, the writer process copies it into the file);
``direct``   :func:`direct_convert`: h5batch's discovery, then the writer's part done up
             front (every chunk of the file allocated at once, HDF5's
             ``H5D_ALLOC_TIME_EARLY`` with fill time ``NEVER``, each chunk's byte offset
             read from the chunk index), then N forked processes that each read a
             chunk's rows with h5batch's own decoder
             (:func:`h5batch.fields.wav_direct.read_into`) into one reused chunk-sized
             buffer and ``pwrite`` it at that chunk's offset.

Reason for the module: on 2 cores ``kind: auto`` is CPU-bound (docs/benchmarks.md,
eighteenth and nineteenth rounds): ~0.64 CPU-s for 4,096 pairs, where reading the wav
files and writing the file cost ~0.28 (``bench.physics``). The rest is the pipeline: fresh
shared memory for every batch, the writer copying every byte alone, processes, Python per
batch. This design has none of that: the bytes go from the page cache into a buffer that
stays in the CPU's cache, and from there into the file, on every core. The figure is a
bound for the next round, not a converter: no checksums, inventory, rejects, journal or
resume, and every field must be a fixed-length plain 16-bit WAV (:func:`direct_convert`
refuses anything else, naming the field). Its lead is the pipeline it does not run, not
where the copy runs: ``convert`` with the decoders writing the chunks themselves took the
same time as with the writer copying (0.36 s, 0.59 against 0.61 CPU-s; nineteenth round).
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import time
from typing import Any

import h5py
import numpy as np

from .. import format as fmt
from ..config import JobConfig
from ..fields import file_fields, fixed_sample_shape, rows_per_chunk, wav_direct
from ..layouts import discover


def _cpu() -> float:
    """CPU seconds of this process and its reaped children."""
    t = os.times()
    return t.user + t.system + t.children_user + t.children_system


def _readers(job: JobConfig) -> dict[str, tuple[Any, tuple[int, ...], np.dtype]]:
    """Per field: h5batch's direct WAV reader, the sample shape and dtype."""
    out = {}
    for name in file_fields(job.fields):
        fc = job.fields[name]
        read, fixed = wav_direct.reader(fc), fixed_sample_shape(fc)
        if read is None or fixed is None:
            raise ValueError(f"field {name!r}: the direct-write bound needs a fixed-length plain 16-bit WAV field "
                             f"(dtype int16, a length, nothing run after decoding)")
        out[name] = (read, *fixed)
    if not out:
        raise ValueError("the job has no field of files")
    return out


def _allocated(group: h5py.Group, name: str, n: int, shape: tuple[int, ...], dtype: np.dtype, k: int) -> list[int]:
    """A dataset of ``n`` rows whose chunks (``k`` rows) are all allocated now and never
    filled by HDF5; the byte offset of each chunk, in row order."""
    space = h5py.h5s.create_simple((n, *shape), (h5py.h5s.UNLIMITED, *shape))
    dcpl = h5py.h5p.create(h5py.h5p.DATASET_CREATE)
    dcpl.set_chunk((k, *shape))
    dcpl.set_alloc_time(h5py.h5d.ALLOC_TIME_EARLY)
    dcpl.set_fill_time(h5py.h5d.FILL_TIME_NEVER)
    dsid = h5py.h5d.create(group.id, name.encode(), h5py.h5t.py_create(np.dtype(dtype)), space, dcpl=dcpl)
    offsets, _, _ = fmt.chunk_table(dsid, k, n)  # the reader's listing of the index
    if (offsets < 0).any():
        raise RuntimeError(f"{name}: HDF5 allocated {int((offsets >= 0).sum())} chunks for {n} rows of {k}")
    return [int(o) for o in offsets]


def _copy(out: str, jobs: list[tuple[int, list[str], Any]], row_shape: dict, dtype: dict, k: int) -> int:
    """One process's share: each ``(offset, paths, (field, reader))`` chunk read into a reused
    buffer and written at ``offset``; 0 when every file was read, else 1."""
    fd = os.open(out, os.O_WRONLY)
    bufs = {name: np.zeros((k, *row_shape[name]), dtype[name]) for name in row_shape}
    try:
        for offset, paths, (name, read) in jobs:
            buf = bufs[name]
            for r, p in enumerate(paths):
                if not read(p, buf[r]):
                    print(f"direct_write: {p} is not a plain 16-bit WAV of the field's rate", file=sys.stderr)
                    return 1
            buf[len(paths):] = 0  # the last chunk: zero padding past the extent, as the writer stores it
            os.pwrite(fd, memoryview(buf).cast("B"), offset)
        return 0
    finally:
        os.close(fd)


def direct_convert(job: JobConfig, processes: int = 2) -> dict[str, Any]:
    """Convert ``job``'s corpus the direct-write way (see the module) into ``job.output.path``;
    its samples and the decoded bytes written."""
    readers = _readers(job)
    manifest = discover(job)
    out = job.output.path
    split_items: dict[str, list] = {}
    for it in manifest.items:
        split_items.setdefault(it.split, []).append(it)
    chunk_bytes = job.output.chunk_bytes
    row_shape = {name: shape for name, (_, shape, _) in readers.items()}
    dtypes = {name: dt for name, (_, _, dt) in readers.items()}
    ks = {name: rows_per_chunk(shape, dt, chunk_bytes) for name, (_, shape, dt) in readers.items()}
    if len(set(ks.values())) != 1:
        raise ValueError(f"fields with different rows per chunk ({ks}): not in this bound")
    k = next(iter(ks.values()))
    fields = file_fields(job.fields)
    jobs: list[tuple[int, list[str], Any]] = []
    with h5py.File(out, "w", libver="latest") as f:
        for split, items in split_items.items():
            g = f.create_group(split)
            for fi, name in enumerate(fields):
                read, shape, dt = readers[name]
                offsets = _allocated(g, name, len(items), shape, dt, k)
                jobs += [(off, [os.path.join(manifest.root, it.paths[fi]) for it in items[c * k:(c + 1) * k]], (name, read))
                         for c, off in enumerate(offsets)]
        f.flush()
        # Chunks in file order, dealt round-robin: each process writes every N-th chunk.
        jobs.sort(key=lambda j: j[0])
        pids = []
        for i in range(processes):
            pid = os.fork()
            if pid == 0:  # pragma: no cover - the child's exit code is what the parent checks
                code = 1
                try:
                    code = _copy(out, jobs[i::processes], row_shape, dtypes, k)
                finally:
                    os._exit(code)
            pids.append(pid)
        failed = [pid for pid in pids if os.waitstatus_to_exitcode(os.waitpid(pid, 0)[1]) != 0]
        if failed:
            raise RuntimeError(f"direct_write: {len(failed)} of {processes} copying processes failed (see above)")
    return {"samples": len(manifest.items),
            "bytes_decoded": len(manifest.items) * sum(int(np.prod(s)) * np.dtype(dtypes[n]).itemsize
                                                       for n, s in row_shape.items())}


def timed(fn: Any, *args: Any) -> dict[str, Any]:
    """``fn(*args)``'s result with its ``seconds`` and ``cpu`` (this process and the children
    it reaped) added."""
    t0, c0 = time.perf_counter(), _cpu()
    r = fn(*args)
    return {**r, "seconds": time.perf_counter() - t0, "cpu": _cpu() - c0}


def main(argv: list[str] | None = None) -> int:
    from . import corpus
    from .convert_child import h5batch_convert, remove_output

    p = argparse.ArgumentParser(prog="python -m h5batch.bench.direct_write", description=__doc__.split("\n\n")[0])
    p.add_argument("--pairs", type=int, default=4096)
    p.add_argument("--rounds", type=int, default=6)
    p.add_argument("--processes", type=int, default=2, help="copying processes of the direct way")
    p.add_argument("--cache", default=os.path.join("data", "bench"), help="generated corpora (made once)")
    p.add_argument("--work", default=os.path.join("bench", "results"), help="scratch folder for the outputs")
    a = p.parse_args(argv)
    if a.pairs < 1 or a.rounds < 1 or a.processes < 1:
        p.error("--pairs, --rounds and --processes must be >= 1")
    cp = corpus.paired_audio(a.cache, a.pairs)
    os.makedirs(a.work, exist_ok=True)
    outs = {"h5batch": os.path.join(a.work, "direct-h5batch.h5"), "direct": os.path.join(a.work, "direct-bound.h5")}
    ways = {  # h5batch: convert as `h5batch convert` runs it (cluster.kind auto), in this process
        "h5batch": lambda: timed(h5batch_convert, cp.job(outs["h5batch"], "none", {"kind": "auto"})),
        "direct": lambda: timed(direct_convert, cp.job(outs["direct"], "none"), a.processes),
    }
    runs: dict[str, list[dict]] = {w: [] for w in ways}
    try:
        for r in range(a.rounds + 1):  # round 0 is untimed: the corpus's and the outputs' first writes
            order = list(ways) if r % 2 else list(reversed(ways))
            for w in order:
                remove_output(outs[w])
                os.sync()
                res = ways[w]()
                if r:
                    runs[w].append(res)
            if r:
                print(f"round {r}/{a.rounds}: " + ", ".join(f"{w} {runs[w][-1]['seconds']:.3f} s "
                                                            f"({runs[w][-1]['cpu']:.2f} CPU-s)" for w in order), flush=True)
    finally:
        for o in outs.values():
            remove_output(o)
            remove_output(fmt.rejects_file(o))  # convert's list beside its output
    for w, rs in runs.items():
        print(f"{w:8s} {statistics.median(x['seconds'] for x in rs):.3f} s, "
              f"{statistics.median(x['cpu'] for x in rs):.2f} CPU-s, {rs[0]['samples']:,} samples (median of {len(rs)})")
    ratio = [h["seconds"] / d["seconds"] for h, d in zip(runs["h5batch"], runs["direct"])]
    print(f"h5batch / direct-write bound, wall: {statistics.median(ratio):.2f}x "
          f"({min(ratio):.2f}-{max(ratio):.2f}x, round by round)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
