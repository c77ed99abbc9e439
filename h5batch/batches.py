"""The unit of work: a batch of manifest items going to a worker, and what comes back.

A :class:`BatchTask` is small (paths and settings), and so is its :class:`BatchResult`:
the decoded samples stay in shared memory and only their :class:`~h5batch.transport.packing.Packed`
descriptor travels, with per-sample metadata, from the worker through the driver to the
writer. Nothing here touches HDF5: h5py objects never enter a task (they cannot be
pickled, dask#6522).
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

import numpy as np

from .manifest import Reject
from .transport.packing import Packed

if TYPE_CHECKING:
    from .fields import FieldConfig


@dataclass(frozen=True)
class BatchTask:
    """Items ``[start, stop)`` of the manifest, all of one split.

    ``items`` holds ``(paths, label index, values)`` per item (a path per field of files,
    a value per field of annotation values: :func:`h5batch.fields.reads_files`); ``transport`` is ``shm``,
    ``network`` or ``auto`` (shm when the worker runs on ``writer_host``).
    """

    index: int
    split: str
    start: int
    items: tuple[tuple[tuple[str, ...], int, tuple], ...]
    root: str
    fields: tuple[tuple[str, FieldConfig], ...]
    run_id: str
    transport: str = "auto"
    writer_host: str = ""
    timeout: float = 120.0  # seconds one file may take to decode
    # The largest file of each field of files (bytes, as discovery saw them), in the items'
    # path order; () where not known, and the worker stats the files to learn it.
    largest: tuple[int, ...] = ()

    def sub(self, lo: int, hi: int) -> BatchTask:
        """The task for items ``[lo, hi)`` of this one (used to isolate a crashing file)."""
        return dataclasses.replace(self, start=self.start + lo, items=self.items[lo:hi])


@dataclass
class BatchResult:
    """What a worker returns: the packed samples that decoded, in item order, and the rest
    as rejects."""

    index: int
    split: str
    start: int
    packed: Packed
    labels: np.ndarray  # (n,) int64
    sources: list[tuple[str, ...]]
    checksums: np.ndarray  # (n, fields) uint32, crc32 of each sample's stored bytes
    rejects: list[Reject] = field(default_factory=list)
    final_part: bool = True  # False for all but the last part of a split batch
    stuck: bool = False  # a decode timed out; its thread is still busy in this worker
    worker_address: str = ""
    # (path, messages) per file whose decoder warned (conversion/decoder_warnings.py)
    warnings: list[tuple[str, str]] = field(default_factory=list)

    @property
    def n_samples(self) -> int:
        return len(self.sources)
