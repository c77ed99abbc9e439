"""What runs on the Dask workers: decode a batch of items, pack the arrays for the writer.

:func:`decode_batch` turns a :class:`~h5batch.batches.BatchTask` into a
:class:`~h5batch.batches.BatchResult`: files that fail become rejects, never exceptions; a
file that hangs past ``policy.decode_timeout`` is abandoned with its thread; the long
recordings of a field are decoded straight into shared memory (:class:`_StreamRows`).
Nothing here touches HDF5. On a LocalCluster this module is also each worker's Dask preload
(:func:`dask_setup`).
"""

from __future__ import annotations

import logging
import os
import signal
import threading
import time
from typing import Any

import numpy as np

try:  # ISA-L's crc32: the same checksum as zlib's, faster
    from isal.isal_zlib import crc32
except ImportError:  # pragma: no cover
    from zlib import crc32

from .. import faults
from ..batches import BatchResult, BatchTask
from ..errors import DecodeError
from ..fields import decode_field, kind_of, reads_files, value_array
from ..fields.audio import TrueLength
from ..fields.blocks import streams
from ..manifest import Reject
from ..transport.packing import Packed, fill, layout, pack
from ..transport.segments import FREE, abandon_segment, grow_segment, hostname, take_segment
from . import decoder_warnings, readahead

# A batch with a file at least this big (on disk) decodes its streamable field straight
# into shared memory (_StreamRows); smaller ones decode into arrays and are packed after.
STREAM_FILE_BYTES = 8 << 20


class _HeartbeatAtShutdown(logging.Filter):
    def filter(self, record: logging.LogRecord) -> bool:
        return "Failed to communicate with scheduler during heartbeat" not in record.getMessage()


def dask_setup(worker) -> None:  # the name Dask calls in a preload module
    """Set-up of each Dask worker process of a LocalCluster.

    A terminal's Ctrl-C reaches every process of the group, the workers too. The driver is
    the one that decides what happens (commit, then close the cluster, which stops the
    workers); a worker that raised KeyboardInterrupt itself would only print a traceback from
    its event loop onto the user's console. So the workers ignore SIGINT. For the same reason
    their Dask log shows errors only, as the driver's does (``silence_logs``): a SIGTERM sent
    to the whole group makes a worker close its connections, which Dask reports with a
    traceback at INFO level although nothing is wrong. One ERROR is noise too: when the
    driver closes the cluster, a worker whose heartbeat was on its way logs "Failed to
    communicate with scheduler during heartbeat" with a traceback; a scheduler lost during a
    run is reported by the driver itself, so that record is dropped."""
    logging.getLogger("distributed").setLevel(logging.ERROR)
    logging.getLogger("distributed.worker").addFilter(_HeartbeatAtShutdown())
    if threading.current_thread() is threading.main_thread():
        signal.signal(signal.SIGINT, signal.SIG_IGN)


def choose_mode(transport: str, writer_host: str) -> str:
    """``auto`` -> shared memory when this process runs on the writer's host."""
    if transport == "auto":
        return "shm" if writer_host in ("", hostname()) and os.path.isdir("/dev/shm") else "network"
    return transport


class _Watched:
    """Decodes items ``start..`` of a task in a background thread while the caller watches
    the clock. A file that hangs past its budget is abandoned with its thread (which may
    keep running: the result says so and the driver restarts the worker); the caller goes
    on with the next item in a fresh thread. The caller wakes only on completion or once
    per poll interval, so the watch costs nothing per item.

    Each decoded item's checksums (crc32 per field, :attr:`sums`) are taken right after its
    decode, while its bytes are in the core's cache. Reason: taken over the whole batch
    afterwards, they read every byte back from memory, which nearly doubles their CPU."""

    def __init__(self, task: BatchTask, start: int, stream: _StreamRows | None = None):
        self.task, self.stream = task, stream
        self.plan = _ItemPlan(task)
        self.outcomes: dict[int, Any] = {}  # item index -> list of arrays, or the exception
        self.sums: dict[int, list[int]] = {}  # item index -> crc32 per field (decoded items)
        self.current: tuple[int, float] | None = None  # (item index, start time)
        self.done = threading.Event()
        self.abandoned = False
        threading.Thread(target=self._run, args=(start,), name="h5batch-decode", daemon=True).start()

    def _run(self, start: int) -> None:
        for i in range(start, len(self.task.items)):
            self.current = (i, time.monotonic())
            try:
                out: Any = _decode_item(self.task, self.task.items[i], self.stream, self.plan)
                sums = [crc32(a.reshape(-1).view(np.uint8)) for a in out]  # while cached (see the class)
                if self.stream is not None:
                    self.stream.commit(out)
            except (DecodeError, MemoryError) as e:
                out = e
            except Exception as e:  # a decoder's bug: the item's reject, not a silent dead thread
                out = DecodeError(self.task.items[i][0][0], f"decoding failed: {type(e).__name__}: {e}")
            if isinstance(out, list):
                self.sums[i] = sums
            if self.abandoned:
                return
            self.outcomes[i] = out
        self.current = None
        self.done.set()


class _ItemPlan:
    """What decoding an item of a batch needs per field, worked out once per batch (not
    per file: the lookups are the same for every item): whether the field reads files,
    and whether faults are injected."""

    def __init__(self, task: BatchTask):
        self.files = [reads_files(fc) for _, fc in task.fields]
        # A padded audio field's true lengths (TrueLength): index of the field -> its audio field's.
        names = [n for n, _ in task.fields]
        self.length_of = {k: names.index(fc.of) for k, (_, fc) in enumerate(task.fields) if isinstance(fc, TrueLength)}
        self.counted = set(self.length_of.values())
        self.inject = bool(faults.active())


def _decode_item(task: BatchTask, item: tuple, stream: _StreamRows | None, plan: _ItemPlan) -> list[np.ndarray]:
    """The item's array per field; with ``stream``, its field decoded into the stream's
    segment. A field of files decodes its next path, a field of annotation values its
    next value (``item`` is ``(paths, label, values)``)."""
    paths, values = item[0], item[2]
    out = []
    files, vals = iter(paths), iter(values)
    lengths: dict[int, int] = {}
    for k, (name, fc) in enumerate(task.fields):
        if k in plan.length_of:
            out.append(np.asarray(lengths[plan.length_of[k]], dtype=np.int64))
            continue
        if not plan.files[k]:
            try:
                out.append(value_array(next(vals), fc))
            except DecodeError as e:
                raise DecodeError(paths[0], f"field {name!r}: {e.reason}") from None
            continue
        rel = next(files)
        if plan.inject:
            faults.before_decode(rel)
        path = os.path.join(task.root, rel)
        try:
            with decoder_warnings.watch(rel):  # its warnings go to the log, not the console
                facts: dict | None = {} if k in plan.counted else None
                if stream is not None and k == stream.k:
                    out.append(stream.decode(path, fc, facts))
                elif facts is not None:
                    out.append(kind_of(fc).decode_to(path, fc, facts=facts))
                else:
                    out.append(decode_field(path, fc))
                if facts is not None:
                    lengths[k] = facts["length"]
        except DecodeError as e:
            raise DecodeError(rel, e.reason) from None
    return out


class _StreamRows:
    """A batch whose long recordings decode straight into shared memory.

    One streamable field (:func:`h5batch.fields.blocks.streams`: the first) is decoded
    block by block into a segment that grows as it fills: each file's sample is
    allocated at the end of the samples kept so far, so they lie back to back as
    a packed block wants them, and an item rejected later (another field failed)
    is simply overwritten by the next. The other fields decode into arrays and are packed
    after it. Reason: a 2-hour recording costs its size once, not once decoded and once
    packed. Used only when a file of the batch is big (:data:`STREAM_FILE_BYTES`); a file
    the decoder cannot stream (lossy formats) is copied in."""

    def __init__(self, task: BatchTask, k: int):
        self.task, self.k = task, k
        self.name = task.fields[k][0]
        self.seg = take_segment(task.run_id, 1 << 20)
        self.pos = 0  # end of the samples kept
        self.slot: np.ndarray | None = None  # the sample being decoded, at ``pos``

    @classmethod
    def maybe(cls, task: BatchTask, mode: str) -> _StreamRows | None:
        if mode != "shm" or not task.items:
            return None
        files = [k for k, (_, fc) in enumerate(task.fields) if reads_files(fc)]
        k = next((k for k in files if streams(task.fields[k][1])), None)
        if k is None:
            return None
        j = files.index(k)
        if len(task.largest) == len(files):  # the sizes discovery saw (plan.largest_files)
            return cls(task, k) if task.largest[j] >= STREAM_FILE_BYTES else None
        big = 0
        for item in task.items:
            try:
                big = max(big, os.stat(os.path.join(task.root, item[0][j])).st_size)
            except OSError:
                continue  # the decode names what is wrong with it
        return cls(task, k) if big >= STREAM_FILE_BYTES else None

    def _alloc(self, shape: tuple[int, ...], dtype: np.dtype) -> np.ndarray:
        nbytes = int(np.prod(shape, dtype=np.int64)) * np.dtype(dtype).itemsize
        self.seg = grow_segment(self.seg, self.pos + nbytes)
        self.slot = self.seg.data[self.pos: self.pos + nbytes].view(dtype).reshape(shape)
        return self.slot

    def decode(self, path: str, fc: Any, facts: dict | None = None) -> np.ndarray:
        """The file's sample, lying in the segment at the end of the kept ones."""
        self.slot = None
        a = kind_of(fc).decode_to(path, fc, self._alloc, facts)
        placed = self.slot is not None and a.size and a.ctypes.data == self.slot.ctypes.data
        if not placed:
            self._alloc(a.shape, a.dtype)[...] = a  # not streamed (or empty): copied in
            a = self.slot
        return a

    def commit(self, out: list[np.ndarray]) -> None:
        """The item decoded: keep its sample."""
        self.pos += out[self.k].nbytes

    def packed(self, arrays: dict[str, list[np.ndarray]]) -> Packed:
        """The batch packed: the streamed field's samples where they lie, the others after."""
        rest = {name: samples for name, samples in arrays.items() if name != self.name}
        blocks, end = layout({self.name: arrays[self.name], **rest})  # the first block is [0, pos)
        self.seg = grow_segment(self.seg, end)
        fill(self.seg.data, rest, blocks[1:])
        self.seg.drop_pages(end)  # handed to the writer: its mapping is the one that counts
        return Packed(blocks, end, shm_name=self.seg.name)

    def free(self) -> None:
        self.seg.mark(FREE)


def _worker_address() -> str:
    try:
        from distributed import get_worker

        return get_worker().address
    except (ImportError, ValueError):
        return ""


def decode_batch(task: BatchTask) -> BatchResult:
    """Decode every item of ``task``; failures become rejects, never exceptions."""
    faults.before_batch(task.index)
    names = [n for n, _ in task.fields]
    outcomes: dict[int, Any] = {}
    mode = choose_mode(task.transport, task.writer_host)
    readahead.hint(task)
    stream = _StreamRows.maybe(task, mode)
    try:
        with decoder_warnings.batch():
            item_sums: dict[int, list[int]] = {}
            stuck = _decode_all(task, stream, outcomes, item_sums)
            warned = decoder_warnings.take(p for item in task.items for p in item[0])
        arrays, labels, sources, sums, rejects = _collect(task, outcomes, names, item_sums)
        if stream is not None and not stuck:
            packed = stream.packed(arrays)
        else:
            packed = pack(arrays, mode, task.run_id)
    except BaseException:
        if stream is not None:
            stream.free()
        raise
    return BatchResult(
        index=task.index, split=task.split, start=task.start,
        packed=packed,
        labels=np.asarray(labels, dtype=np.int64),
        sources=sources,
        checksums=np.asarray(sums, dtype=np.uint32).reshape(len(sums), len(names)),
        rejects=rejects,
        stuck=stuck,
        worker_address=_worker_address() if stuck else "",
        warnings=warned,
    )


def _decode_all(task: BatchTask, stream: _StreamRows | None,
                outcomes: dict[int, Any], sums: dict[int, list[int]]) -> bool:
    """Decode every item into ``outcomes`` (its arrays, or the exception) and ``sums`` (the
    checksums of each decoded one, :class:`_Watched`). Returns True when a decode hung past
    its budget: its thread may still write at the stream's end, so the samples decoded so
    far are copied out of ``stream``'s segment, the segment is let go and the rest decodes
    into arrays."""
    stuck = False
    i = 0
    while i < len(task.items):
        run = _Watched(task, i, stream)
        while not run.done.wait(timeout=min(1.0, task.timeout / 4)):
            cur = run.current
            if cur and time.monotonic() - cur[1] > task.timeout * len(task.items[cur[0]][0]):
                run.abandoned = True  # it hangs on an item: its outcomes are not taken
                break
        if run.done.is_set():
            outcomes.update(run.outcomes)
            sums.update(run.sums)
            break
        hung = run.current[0]  # type: ignore[index]
        outcomes.update({k: v for k, v in run.outcomes.items() if k < hung})
        sums.update({k: v for k, v in run.sums.items() if k < hung})
        outcomes[hung] = TimeoutError()
        stuck = True
        i = hung + 1
        if stream is not None:
            outcomes.update({k: [a.copy() for a in v] for k, v in outcomes.items() if isinstance(v, list)})
            abandon_segment(stream.seg)
            stream = None
    return stuck


def _collect(task: BatchTask, outcomes: dict[int, Any], names: list[str], item_sums: dict[int, list[int]]):
    """Sort outcomes into per-field sample lists, labels, sources, checksums (taken from
    ``item_sums``) and rejects."""
    arrays: dict[str, list[np.ndarray]] = {n: [] for n in names}
    labels: list[int] = []
    sources: list[tuple[str, ...]] = []
    sums: list[list[int]] = []
    rejects: list[Reject] = []
    for k, (paths, label, _values) in enumerate(task.items):
        out = outcomes[k]
        # A paired sample with one bad file rejects every file of the pair.
        if isinstance(out, TimeoutError):
            why = f"decoding took longer than {task.timeout * len(paths):g} s (policy.decode_timeout)"
            rejects += [Reject(rel, "timeout", why) for rel in paths]
            continue
        if isinstance(out, DecodeError):
            rejects += [Reject(rel, "decode", out.reason if rel == out.path else
                               f"paired file {out.path} was rejected: {out.reason}") for rel in paths]
            continue
        if isinstance(out, MemoryError):
            rejects += [Reject(rel, "decode", "out of memory while decoding") for rel in paths]
            continue
        for name, a in zip(names, out):
            arrays[name].append(a)
        labels.append(label)
        sources.append(paths)
        sums.append(item_sums[k])
    return arrays, labels, sources, sums, rejects
