"""Decoders that write whole chunks into the output themselves.

Rule: in a run whose decoders work on the writer's host (in process, its forked decoders;
on a Dask cluster, its workers there) of a new output whose every field has a fixed shape
and is stored uncompressed, the writer places every chunk of the planned rows when it
creates the datasets (HDF5 alloc time ``EARLY``, fill time ``NEVER``: addresses, no bytes
written) and sends their file offsets to the driver
(:class:`~h5batch.writer.messages.Layout`). The driver gives a batch the offsets of its
chunks when the batch starts on a chunk boundary and holds whole chunks of every field, at
the row it will land on if no earlier batch loses a sample (:class:`ChunkPlacer`). The
decoder decodes such a batch a group of whole chunks at a time into a small private buffer
and writes each group with ``pwrite`` (:class:`ChunkSink`); it sends the writer the
per-sample metadata, and the writer just counts the rows (``ChunkAppender.skip``). From the
first item that fails or hangs on, the rest of the batch goes through shared memory as
before (the groups already written stay). Rows placed on the wrong row (an earlier batch
lost samples) are read back by the writer, all of them first, and appended the ordinary way
into the chunks already placed (``write_direct_chunk`` keeps a placed chunk's address):
they land at or before where they were written, never on a later batch's chunks.

Reason: on two cores the run is CPU-bound, and the bytes' path through shared memory cost
more than the copy itself: the decoder wrote each batch (16 MB) into a segment in memory,
the writer read it back to copy it into the page cache, and every fresh segment page cost
a fault and a zeroing. A buffer of a group (~1 MiB a field) stays in the core's cache. The
4,096-pair bench corpus (``python -m h5batch.bench.convert_ab``, 9 alternating rounds):
0.61 CPU-s and 2.06x the best peer writer's speed, against 0.69 CPU-s and 1.83x before
(docs/benchmarks.md, twenty-fourth round). Moving only the copy (decoders ``pwrite`` from
their shared-memory rows) gained nothing (nineteenth round).

Safety: a decode thread abandoned by ``policy.decode_timeout`` may keep running; it writes
a group only under its watch's lock and while the watch has not given it up, which the
watch does under that lock, so it never writes once its batch went on without it. The
chunks a batch writes lie past every committed row (a batch is placed at or after the rows
of every batch before it), so data covered by a commit is never rewritten; a crash leaves
placed chunks past the committed rows, which a resume cuts back like any other, and a
resumed or synced output is written the ordinary way (:func:`planned_rows`). A copy of a
batch that runs late (Dask may run a task twice; a cluster's worker outlives a killed
driver) could write over rows the writer has since moved there after a reject: a decoder
writes a group only while the batch is open in the run's fence, which the driver closes
before the writer stores the batch (:mod:`.fence`). A write that fails (a full disk) sends
the group and the rest to the writer.
"""

from __future__ import annotations

import dataclasses
import math
import os
from typing import TYPE_CHECKING, Any

import numpy as np

from ..batches import BatchTask
from ..fields import fixed_sample_shape
from ..transport.packing import Packed, pack
from . import fence

if TYPE_CHECKING:
    from ..config import JobConfig

__all__ = ["planned_rows", "likely", "ChunkPlacer", "ChunkSink"]


# Where decoders may run on the writer's host: in process, and the Dask kinds other than
# the batch systems' (whose workers run on other nodes, and would only ever ship rows).
HOST_KINDS = ("inprocess", "local", "address", "scheduler_file")


def planned_rows(job: JobConfig, kind: str | None, codecs: dict[str, Any], tasks: Any,
                 new_file: bool, resuming: bool, decoders: int) -> dict[str, int]:
    """Rows to allocate per split for decoders that write chunks (see the module); empty
    where the run does not qualify. ``decoders``: the forked decoders an in-process run
    will have (``spares.count``); with none, the driver's one thread decodes, and the copy
    into the page cache is better left to the writer on the other core (``cluster.workers:
    1``, 6 alternating runs: 0.553 s with the thread writing, 0.528 s without). A Dask
    worker writes only where it runs on the writer's host (``ChunkSink.maybe``: shared
    memory is its transport); one elsewhere ships its rows, which the writer stores into
    the placed chunks as usual."""
    if kind not in HOST_KINDS or not new_file or resuming or not likely(job):
        return {}
    if kind != "inprocess" and job.cluster.transport == "network":
        return {}  # (the workers ship every row)
    if kind == "inprocess" and decoders < 1:
        return {}
    if any(codecs[name].name != "none" for name in job.fields):
        return {}
    rows: dict[str, int] = {}
    for t in tasks:
        rows[t.split] = rows.get(t.split, 0) + len(t.items)
    return rows


def likely(job: JobConfig) -> bool:
    """Whether an in-process run of ``job`` may write chunks from its decoders, as far as
    the job file says before the codec trial: every field has a fixed shape, and the codec
    is ``none`` or ``auto`` (which keeps uncompressed data that does not shrink)."""
    return bool(job.fields) and job.output.codec in ("none", "auto") and all(
        fixed_sample_shape(fc) is not None for fc in job.fields.values())


class ChunkPlacer:
    """The driver's side: predicts where each batch of a split lands, and gives a batch
    that starts and ends on chunk boundaries its chunks' offsets."""

    def __init__(self, path: str, written: dict[str, int]):
        self.path = path
        self.next_row = dict(written)  # where the next batch of each split lands, if none loses a sample
        self.offsets: dict[str, dict[str, np.ndarray]] = {}  # split -> field -> chunk offsets
        self.k: dict[str, int] = {}

    def layout(self, offsets: dict[str, dict[str, np.ndarray]], k: dict[str, int]) -> None:
        self.offsets, self.k = offsets, k

    def place(self, task: BatchTask) -> BatchTask:
        """``task`` with its chunks' offsets where it qualifies; every task passes here, in
        order, so the prediction follows the batches submitted before."""
        row = self.next_row.get(task.split, 0)
        n = len(task.items)
        self.next_row[task.split] = row + n
        fields = self.offsets.get(task.split)
        if not fields or not n:
            return task
        direct = []
        for name, offs in fields.items():
            k = self.k[name]
            if row % k or n % k or (row + n) // k > len(offs):
                return task
            direct.append((name, row, k, tuple(int(o) for o in offs[row // k:(row + n) // k])))
        return dataclasses.replace(task, direct=tuple(direct), direct_path=self.path)

    def correct(self, task: BatchTask, written: int) -> None:
        """A batch is stored: its rejects shift every later batch of its split. (Batches
        placed after that no longer start on a chunk boundary, so the rest of the split goes
        the ordinary way: a reject is rare, and realigning is not worth its complexity yet.)"""
        self.next_row[task.split] -= len(task.items) - written


class ChunkSink:
    """A placed batch's rows on their way into the output's chunks (see the module): each
    group of ``G`` items (``G``: the least common multiple of the fields' rows per chunk, so
    a group is whole chunks of every field) is decoded into a small buffer private to this
    process, then written with ``pwrite`` while it is still in the core's cache.

    The decode thread (``worker._Watched``) writes a group once its last item decoded, and
    only while holding its watch's lock with the watch not given up on it; the watch gives
    up a thread under the same lock (``_Watched.give_up``). So a thread abandoned by
    ``policy.decode_timeout`` (it may keep running) never writes the file once its batch
    went on without it. The first item
    that fails (or hangs) stops the sink: the groups written so far stay (:attr:`written`
    rows, every item kept), and the decoded items of the unfinished group and the rest of
    the batch (decoded into arrays) travel through shared memory as usual.

    Reason: one buffer of ~1 MiB per field stays in the cache, so the copy into the page
    cache reads no memory; a batch's rows through a 16 MB shared-memory segment were written
    to memory by the decoder and read back by the writer, and each fresh segment page cost a
    fault and a zeroing (docs/benchmarks.md, twenty-fourth round)."""

    _spare: dict[tuple, list[np.ndarray]] = {}  # buffers of finished batches, per layout

    def __init__(self, task: BatchTask, layouts: list[tuple[tuple[int, ...], np.dtype]]):
        self.task = task
        ks = [k for _, _, k, _ in task.direct]
        self.G = math.lcm(*ks)
        self.key = (self.G, tuple((tuple(shape), np.dtype(dt).str) for shape, dt in layouts))
        self.bufs = self._spare.pop(self.key, None) or [np.empty((self.G, *shape), dt) for shape, dt in layouts]
        self.active = True
        self.written = 0  # leading items of the batch whose rows are in the output
        self.fd = -1
        self.fence = fence.path_for(task.direct_path)
        self.reusable = True

    @classmethod
    def maybe(cls, task: BatchTask, mode: str) -> ChunkSink | None:
        if not task.direct or mode != "shm" or task.align or not task.items:
            return None
        layouts = [fixed_sample_shape(fc) for _, fc in task.fields]
        if any(lay is None for lay in layouts) or len(task.direct) != len(task.fields):
            return None
        return cls(task, layouts)  # type: ignore[arg-type]

    def rows(self, i: int) -> list[np.ndarray] | None:
        """Where item ``i`` decodes: its group's buffer rows, or None (arrays) once stopped."""
        if not self.active:
            return None
        j = i % self.G
        return [b[j] for b in self.bufs]

    def after(self, i: int, ok: bool, watch: Any) -> None:
        """Item ``i`` decoded (``ok``) or failed, in ``watch``'s thread."""
        if not self.active or watch.abandoned:
            return
        if not ok:
            self.stop()
            return
        if (i + 1) % self.G:
            return
        with watch.lock, fence.hold(self.fence, self.task.index) as open_:
            if watch.abandoned:
                return  # the batch went on without this thread: never write
            if not open_:  # the driver closed the batch (a late copy of it: fence.py)
                self.stop()
                return
            try:
                self._write_group(i // self.G)
            except OSError:
                # The file cannot take it here (a full disk, a path this process cannot
                # open): this group and the rest go to the writer, which says what is wrong.
                self.stop()
                return
            self.written = i + 1

    def stop(self) -> None:
        """Items from here on decode into arrays. Those decoded into the unfinished group
        stay where they are, views of the buffer: nothing writes their rows again before
        :meth:`packed` has copied them into shared memory."""
        self.active = False

    def abandon(self) -> None:
        """A decode thread hangs on an item of this batch (the watch gave it up): stop, and
        never reuse the buffer, as that thread may still write into its item's row."""
        self.reusable = False
        self.stop()

    def _write_group(self, g: int) -> None:
        if self.fd < 0:
            self.fd = os.open(self.task.direct_path, os.O_WRONLY | getattr(os, "O_CLOEXEC", 0))
        for (_name, _row, k, offsets), buf in zip(self.task.direct, self.bufs):
            per = self.G // k
            size = k * buf[0].nbytes
            flat = memoryview(buf.reshape(-1).view(np.uint8))
            for c in range(per):
                block, off, done = flat[c * size:(c + 1) * size], offsets[g * per + c], 0
                while done < size:
                    done += os.pwrite(self.fd, block[done:], off + done)

    def packed(self, arrays: dict[str, list[np.ndarray]], mode: str) -> Packed:
        """The batch's descriptor (``arrays``: every kept sample per field, in order): its
        first :attr:`written` samples are in the output already; the rest (after a reject)
        travel as usual."""
        w = self.written
        rest = {name: samples[w:] for name, samples in arrays.items()}
        out = pack(rest, mode, self.task.run_id) if any(rest.values()) else Packed((), 0)
        self.close()
        if w:
            out.direct = tuple((name, row) for name, row, _, _ in self.task.direct)
            # (counted from the rows, not the writes: a group that failed halfway is not in)
            out.direct_rows, out.direct_bytes = w, w * sum(b[0].nbytes for b in self.bufs)
        return out

    def close(self) -> None:
        """The batch is done with the buffer (kept for the next batch unless given up)."""
        if self.fd >= 0:
            os.close(self.fd)
            self.fd = -1
        if self.reusable:
            self._spare[self.key] = self.bufs
