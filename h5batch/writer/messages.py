"""The messages between the driver and the writer process, one dataclass each.

Both directions travel through a :class:`~h5batch.writer.process.PipeQueue` (pickled), so
every message is small: decoded samples stay in shared memory and only their descriptor
(:class:`~h5batch.batches.BatchResult`) crosses. Each side dispatches on the message's
type through a handler table (``writer.process.HANDLERS``, the driver's
``Driver._on_writer``), so a new message is a new class here plus one handler.

Driver -> writer, in this order: one :class:`Start` (or :class:`Abort` when no job came of it), then :class:`Store` for every batch part in manifest order, and :class:`Finish` or
:class:`Abort` last. The writer commits on its own, every ``policy.commit_every`` seconds.

Writer -> driver: :class:`Stored` per batch part, then :class:`Done`, :class:`Aborted` or
:class:`Failed`.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING

if TYPE_CHECKING:  # annotations only: the writer's imports stay what its work needs
    from ..batches import BatchResult
    from ..codecs import CodecSpec
    from ..fields import FieldConfig
    from ..manifest import Reject
    from .commit import CommitRecord


@dataclass
class WriterSpec:
    """Everything the writer process needs to create or resume the output (picklable, no
    open handles)."""

    partial_path: str
    final_path: str
    job_json: str
    job_hash: str
    manifest_hash: str
    splits: tuple[str, ...]
    fields: tuple[tuple[str, FieldConfig], ...]
    class_names: tuple[str, ...]
    labelled: bool
    codecs: dict[str, CodecSpec]  # per field (``auto`` already resolved)
    chunk_bytes: int
    cache_bytes: int | None
    discovery_rejects: list[Reject]
    num_inputs: int
    commit_every: float = 10.0
    threads: int = 2
    batch_size: int = 0  # items per batch; recorded so a resume cuts the same batches
    codec_notes: dict[str, str] = field(default_factory=dict)  # why auto chose each codec
    # Samples each split will hold (the manifest's) and the trial's decoded bytes per sample
    # of each field: chunks are sized to the data (store.py), never a 1 MB chunk for 200 rows.
    split_rows: dict[str, int] = field(default_factory=dict)
    field_bytes: dict[str, int] = field(default_factory=dict)
    annotations: tuple[str, ...] = ()  # annotation files read by discovery (root-relative)
    resume: CommitRecord | None = None  # a commit record to continue from
    versions: dict[str, str] = field(default_factory=dict)  # root attribute of a new file (conversion/plan.py)
    # The driver's working directory and umask: a writer forked from a fork server would
    # otherwise have the server's (relative paths, output file permissions).
    cwd: str = ""
    umask: int | None = None
    inventory: str = ""  # the driver's inventory sidecar (h5batch.inventory), stored at finalize
    sync: SyncSpec | None = None  # set for `h5batch sync`: the finished output is extended
    # This file is a shard (h5batch/shards.py): its root attribute ``shard`` (index, of,
    # manifest items), to which the writer adds its host.
    shard: dict | None = None


@dataclass
class SyncSpec:
    """What a sync does to a finished output besides appending the new samples (the writer
    side of :mod:`h5batch.conversion.sync`)."""

    in_place: bool  # True: write the output itself through the undo journal; False: a copy at partial_path
    tombstones: dict[str, list[int]]  # split -> rows that stop being samples (added to the old ones)
    kept_rejects: list[Reject]  # rejects of unchanged files, carried over (the discovery ones are redone)


# -- driver -> writer ---------------------------------------------------------------------


@dataclass(frozen=True)
class Start:
    """The job: create (or resume) the partial output."""

    spec: WriterSpec


@dataclass(frozen=True)
class Store:
    """Append one decoded batch part (its samples are in shared memory)."""

    result: BatchResult


@dataclass(frozen=True)
class Finish:
    """Write the last chunks and the rejects, then rename the partial to the final path
    unless more than ``max_reject_fraction`` of the inputs were rejected."""

    max_reject_fraction: float


@dataclass(frozen=True)
class Abort:
    """Commit what is stored and stop (the partial stays, to be resumed); before
    :class:`Start`, stop without a job (the driver found nothing to write)."""


# -- writer -> driver ---------------------------------------------------------------------


@dataclass(frozen=True)
class Stored:
    """Batch part of batch ``index`` is appended: ``samples`` of it kept."""

    index: int
    samples: int


@dataclass(frozen=True)
class Done:
    """What :class:`Finish` produced. ``ok`` False: too many rejects, the file stays partial
    (``path`` is then the partial's)."""

    path: str
    counts: dict[str, int]
    rejects: int
    bytes_decoded: int
    rejects_file: str
    ok: bool


@dataclass(frozen=True)
class Aborted:
    """The writer committed and stopped after :class:`Abort`."""


@dataclass(frozen=True)
class Failed:
    """The writer hit an error; ``text`` is one clear line for storage errors, else the
    traceback."""

    text: str


@dataclass(frozen=True)
class WriterDied:
    """Not sent by the writer: the driver's pipe reader reports a writer process that is
    gone without a word (killed, or crashed in native code)."""

    exit_code: int | None
    name: str = "writer"  # the writer, or the shard it wrote (several writers)


#: Messages after which the writer sends nothing more.
LAST = (Done, Aborted, Failed)
