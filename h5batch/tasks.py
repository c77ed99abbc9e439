"""The work unit that runs on Dask workers: decode a batch of items, pack the arrays.

A :class:`BatchTask` is small (paths and settings); its :class:`BatchResult` carries only
a :class:`~h5batch.transport.Packed` descriptor plus per-sample metadata. Nothing here
touches HDF5: h5py objects never enter a task (they cannot be pickled, dask#6522).
"""

from __future__ import annotations

import os
import time
import zlib
from dataclasses import dataclass, field

import numpy as np

from .config import FieldConfig
from .decode import DecodeError, decode_field
from .discover import Reject
from .transport import Packed, hostname, pack


@dataclass(frozen=True)
class BatchTask:
    """Items ``[start, stop)`` of the manifest, all of one split.

    ``items`` holds ``(paths, label index)`` per item; ``transport`` is ``shm``,
    ``network`` or ``auto`` (shm when the worker runs on ``writer_host``).
    """

    index: int
    split: str
    start: int
    items: tuple[tuple[tuple[str, ...], int], ...]
    root: str
    fields: tuple[tuple[str, FieldConfig], ...]
    run_id: str
    transport: str = "auto"
    writer_host: str = ""

    def sub(self, lo: int, hi: int) -> BatchTask:
        """The task for items ``[lo, hi)`` of this one (used to isolate a crashing file)."""
        return BatchTask(self.index, self.split, self.start + lo, self.items[lo:hi], self.root,
                         self.fields, self.run_id, self.transport, self.writer_host)


@dataclass
class BatchResult:
    """What a worker returns: the packed samples that decoded, in item order, and the rest
    as rejects. ``item_ok[i]`` says whether item ``i`` of the task became a sample."""

    index: int
    split: str
    start: int
    packed: Packed
    labels: np.ndarray  # (n,) int64
    sources: list[tuple[str, ...]]
    checksums: np.ndarray  # (n, fields) uint32, crc32 of each sample's stored bytes
    rejects: list[Reject] = field(default_factory=list)
    n_items: int = 0
    decode_seconds: float = 0.0
    worker: str = ""
    final_part: bool = True  # False for all but the last part of a split batch

    @property
    def n_samples(self) -> int:
        return len(self.sources)


def choose_mode(transport: str, writer_host: str) -> str:
    """``auto`` -> shared memory when this process runs on the writer's host."""
    if transport == "auto":
        return "shm" if writer_host in ("", hostname()) and os.path.isdir("/dev/shm") else "network"
    return transport


def decode_batch(task: BatchTask) -> BatchResult:
    """Decode every item of ``task``; failures become rejects, never exceptions."""
    t0 = time.perf_counter()
    names = [n for n, _ in task.fields]
    arrays: dict[str, list[np.ndarray]] = {n: [] for n in names}
    labels: list[int] = []
    sources: list[tuple[str, ...]] = []
    sums: list[list[int]] = []
    rejects: list[Reject] = []
    for paths, label in task.items:
        decoded = []
        try:
            for (name, fc), rel in zip(task.fields, paths):
                try:
                    decoded.append(decode_field(os.path.join(task.root, rel), fc))
                except DecodeError as e:
                    raise DecodeError(rel, e.reason) from None
        except DecodeError as e:
            # A paired sample with one bad file rejects every file of the pair.
            for rel in paths:
                reason = e.reason if rel == e.path else f"paired file {e.path} was rejected: {e.reason}"
                rejects.append(Reject(rel, "decode", reason))
            continue
        except MemoryError:
            for rel in paths:
                rejects.append(Reject(rel, "decode", "out of memory while decoding"))
            continue
        for name, a in zip(names, decoded):
            arrays[name].append(a)
        labels.append(label)
        sources.append(paths)
        sums.append([zlib.crc32(a.reshape(-1).view(np.uint8)) for a in decoded])
    packed = pack(arrays, choose_mode(task.transport, task.writer_host), task.run_id)
    return BatchResult(
        index=task.index,
        split=task.split,
        start=task.start,
        packed=packed,
        labels=np.asarray(labels, dtype=np.int64),
        sources=sources,
        checksums=np.asarray(sums, dtype=np.uint32).reshape(len(sums), len(names)),
        rejects=rejects,
        n_items=len(task.items),
        decode_seconds=time.perf_counter() - t0,
        worker=hostname(),
    )


def decode_only(task: BatchTask) -> tuple[int, int]:
    """Decode without packing or writing (the benchmark's decode-only floor).

    Returns ``(samples decoded, bytes decoded)``.
    """
    n = nbytes = 0
    for paths, _ in task.items:
        try:
            for (_, fc), rel in zip(task.fields, paths):
                nbytes += decode_field(os.path.join(task.root, rel), fc).nbytes
            n += 1
        except DecodeError:
            pass
    return n, nbytes
