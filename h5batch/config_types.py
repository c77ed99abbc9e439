"""The job's settings as frozen dataclasses: what :mod:`h5batch.config` builds from a job
file and every later stage receives.

Rule: this module imports no layout and no loader; :mod:`h5batch.config` (YAML -> these
classes, with the type checks) and :mod:`h5batch.config_checks` import it, and so do the
layouts (:mod:`h5batch.layouts`), which read ``source`` and the annotation settings.
Reason: config checks ``source.layout`` against the layouts' registry, so the classes the
layouts take must live below both: no import cycle, not even for type checking.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import re
from dataclasses import dataclass, field
from typing import Any, Literal

from .fields import FieldConfig, content_settings
from .fields.base import late, settings

# ---------------------------------------------------------------------------
# Sections
# ---------------------------------------------------------------------------


class LayoutName(str):
    """Type of ``source.layout``: the name of a registered layout (h5batch/layouts/, one
    module each). Checked against the registry (:func:`h5batch.layouts.names`, which lists
    them in registration order) each time a job is loaded, as :class:`CodecName` is."""


class CodecName(str):
    """Type of ``output.codec``: ``auto`` or the name of a registered codec. Checked against
    the registry (:func:`h5batch.codecs.choices`) each time a job is loaded, not frozen into a
    ``Literal`` here, so a codec module added later (or registered by a test) is accepted with
    no edit to this file."""


@dataclass(frozen=True)
class SplitRule:
    """How samples get their split, when the layout's own rule (a split folder, the
    ``pattern`` layout's regex group) is not the one (h5batch/layouts/splits.py).

    ``group`` names a regex group of the ``pattern`` layout. Without ``ranges`` its text
    *is* the split name; with ``ranges`` it must hold an integer and the split is the
    first range (inclusive ``[lo, hi]``) containing it, else ``default``.

    At most one of these replaces the layout's split: ``lists`` (split -> a list file of
    root-relative paths, one per line, as Speech Commands ships them; unlisted samples get
    ``default``), ``column`` (an annotation column; ``values`` maps its values to split
    names) or ``hash`` (split -> fraction, by a hash of ``hash_key``: the sample key or an
    annotation column such as a speaker, so a file keeps its split when the corpus grows).
    """

    group: str = "split"
    ranges: dict[str, list[int]] = field(default_factory=dict)
    default: str = "train"
    lists: dict[str, str] = late(factory=dict)
    column: str | None = late()
    values: dict[str, str] = late(factory=dict)
    hash: dict[str, float] = late(factory=dict)
    hash_key: str | None = late()


@dataclass(frozen=True)
class TableSpec:
    """An annotation table joined to the samples (h5batch/layouts/annotate.py): its
    columns feed value/text/multilabel fields, ``source.label_column`` and split rules.

    ``path`` is root-relative: a file, a glob (``**/*.trans.txt``) or a list of them; each
    row also has the column ``_table``, the stem of its file (``train`` for train.tsv).
    ``key`` is the column matched against each sample's root-relative path, file name,
    stem or key (default: the first column). ``format`` ``auto`` goes by suffix (.csv
    comma, .tsv tab, .jsonl, .txt white space); ``transcript`` reads ``<id> <text>``
    lines (columns ``id``, ``text``). ``skip`` lines come before the header; without a
    header, ``columns`` names the columns. ``unlisted``: what happens to a sample the
    table has no row for (a reject, or excluded: listed with stage ``excluded``, which
    ``policy.max_reject_fraction`` does not count).
    """

    path: str | list[str]
    key: str | None = None
    format: Literal["auto", "csv", "tsv", "whitespace", "jsonl", "transcript"] = "auto"
    header: bool = True
    skip: int = 0
    columns: list[str] = field(default_factory=list)
    unlisted: Literal["reject", "exclude"] = "reject"


@dataclass(frozen=True)
class SourceConfig:
    """Where the corpus is and how its files map to samples (see docs/jobs.md)."""

    root: str
    layout: LayoutName = "class_folders"
    splits: list[str] | None = None
    pattern: str | None = None
    label_group: str = "label"
    split: SplitRule = field(default_factory=SplitRule)
    manifest: str | None = None
    generate: str | None = None  # a corpus of h5batch.generate.CORPORA to make when root is missing
    tables: list[TableSpec] = late(factory=list)  # annotation tables joined by key
    label_column: str | None = late()  # the class label from an annotation column
    exclude: list[str] = late(factory=list)  # root-relative globs: not part of the corpus
    # class_folders: False reads root/<class>/<file> (one split, ``split.default``, unless a
    # split rule says otherwise); nested accepts files at varying depths below their class.
    split_folders: bool = late(True)
    nested: bool = late(False)
    limit: int | None = late()  # convert --limit N: a trial of N samples (layouts/exclude.py)


@dataclass(frozen=True)
class OutputConfig:
    """The HDF5 file. ``chunk_bytes`` is the target uncompressed chunk size (bytes);
    ``cache_bytes`` the per-dataset chunk cache (``rdcc_nbytes``), default 4 chunks."""

    path: str
    codec: CodecName = "auto"  # blosc2-lz4 where a trial shows it pays, else none (auto.py)
    # What ``codec: auto`` weighs: read speed (compress only where decoding costs less than
    # reading the bytes it saves) or size (compress wherever the trial shrinks >= 1.15x).
    prefer: Literal["speed", "size"] = late("speed")
    level: int | None = None
    shuffle: bool = True
    chunk_bytes: int = 1 << 20
    cache_bytes: int | None = None
    overwrite: bool = False
    staging: str | None = None  # s3:// outputs: the local folder they are built in (remote/upload.py)
    # Writer processes, each writing one shard file of a contiguous range of the manifest,
    # joined into the output (h5batch/shards.py). Part of the job: a sharded file is another
    # layout, and a resume with another number is refused.
    writers: int = late(1)


@dataclass(frozen=True)
class ClusterConfig:
    """Where decoding runs, one engine per setting: ``processes`` (the default) runs
    ``workers`` decoder processes on this machine, without Dask
    (:mod:`h5batch.conversion.pool`); ``local`` starts a Dask LocalCluster on 127.0.0.1;
    ``address`` / ``scheduler_file`` join an existing Dask scheduler; slurm/pbs/sge/lsf
    start workers through dask-jobqueue. ``auto`` and ``inprocess`` (older job files) mean
    ``processes`` (:data:`h5batch.config.KIND_ALIASES`)."""

    kind: Literal["processes", "local", "address", "scheduler_file", "slurm", "pbs", "sge", "lsf"] = "processes"
    workers: int | None = None
    address: str | None = None
    scheduler_file: str | None = None
    batch_size: int | Literal["auto"] = "auto"  # items per task; auto: ~16 MB decoded (processes), 32 MB (Dask)
    max_in_flight: int | None = None
    transport: Literal["auto", "shm", "network"] = "auto"
    # Kept so that older job files stay valid: chunks are always compressed in the writer's
    # thread pool, whatever the value (``workers`` is ignored, with a warning).
    compress_on: Literal["auto", "writer", "workers"] = "auto"
    dashboard: bool = True
    # dask-jobqueue keyword arguments (cores, memory, walltime, queue, jobs, ...)
    jobqueue: dict[str, Any] = field(default_factory=dict)
    security: dict[str, Any] = field(default_factory=dict)


@dataclass(frozen=True)
class PolicyConfig:
    """What to do with bad inputs and failures."""

    max_reject_fraction: float = 0.05
    decode_timeout: float = 120.0  # seconds per file
    commit_every: float = 10.0  # seconds between durable commits
    retries: int = 2  # extra attempts for a batch whose worker died
    no_worker_timeout: float = 60.0  # seconds a run's own LocalCluster may have no worker at all
    frozen_worker_timeout: float = 60.0  # seconds a decoder process or a worker of the run's own LocalCluster may go without a heartbeat


@dataclass(frozen=True)
class JobConfig:
    """A whole job. ``fields`` keeps the order of the job file."""

    name: str
    source: SourceConfig
    fields: dict[str, FieldConfig]
    output: OutputConfig
    cluster: ClusterConfig = field(default_factory=ClusterConfig)
    policy: PolicyConfig = field(default_factory=PolicyConfig)
    file: str = "<job>"

    def to_dict(self) -> dict[str, Any]:
        """Plain dict (JSON/YAML-able) of the job, without the file name."""
        d = dataclasses.asdict(self)
        d.pop("file")
        return d

    def public_dict(self) -> dict[str, Any]:
        """Like :meth:`to_dict` with credentials removed (stored in the output, logged)."""
        d = self.to_dict()
        if d["cluster"]["security"]:
            d["cluster"]["security"] = {k: "<redacted>" for k in d["cluster"]["security"]}
        return d

    def hash(self) -> str:
        """sha256 of what decides the output's content (not where or how fast it runs).
        Late settings at their default are left out (:data:`h5batch.fields.base.LATE`)."""
        d = settings(self)
        d["fields"] = {name: content_settings(fc) for name, fc in self.fields.items()}  # transform: + its source
        d.pop("file")
        d.pop("cluster")
        d["output"] = {k: v for k, v in d["output"].items() if k not in ("path", "overwrite", "cache_bytes", "staging")}
        d.pop("policy")
        return hashlib.sha256(json.dumps(d, sort_keys=True).encode()).hexdigest()

    @property
    def labelled(self) -> bool:
        """True when samples carry a class label."""
        if self.source.layout == "class_folders":
            return True
        if self.source.label_column:
            return True
        if self.source.layout == "pattern":
            return self.source.label_group in re.compile(self.source.pattern or "").groupindex
        return self.source.layout == "manifest"


