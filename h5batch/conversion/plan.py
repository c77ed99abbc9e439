"""Planning a conversion: everything decided between discovery and the first task.

:func:`make_plan` settles the codec of every field and the items per batch (``auto``, or
what the interrupted run used, when resuming: its datasets already have their filters and
its progress is counted in batches), cuts the manifest into :class:`TaskList` batches, and
fills the writer's :class:`~h5batch.writer.messages.WriterSpec`, with the versions of what
shapes the output's bytes.
"""

from __future__ import annotations

import contextlib
import json
import os
import sys
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from functools import cache

import numpy as np

from ..batches import BatchTask
from ..codecs import CodecSpec
from ..config import JobConfig
from ..manifest import Manifest
from ..transport.segments import hostname
from ..writer.commit import CommitRecord
from ..writer.messages import WriterSpec
from ..writer.process import current_umask
from .auto import resolve
from .cluster import default_workers
from .options import detail
from .trial import TrialRunner


@dataclass
class Plan:
    """What the driver runs: the tasks, where to start, and what the writer is told."""

    tasks: TaskList
    spec: WriterSpec
    start: int  # first batch to submit (batches before it are committed)
    batch_bytes: int  # decoded bytes of one batch, about
    num_inputs: int  # input files, rejects included


def make_plan(job: JobConfig, manifest: Manifest, record: CommitRecord | None, final: str, partial: str,
              run_id: str, say: Callable[[str], None], keep_codecs: dict[str, CodecSpec] | None = None,
              new_file: bool = True, run_trial: TrialRunner | None = None,
              known_rates: dict[str, int] | None = None) -> Plan:
    """``keep_codecs``: fields whose datasets exist already (a sync) keep these codecs;
    ``new_file`` False: the writer extends a finished file (a sync), which keeps the
    versions it was made with, so none are read; ``run_trial``: where the ``auto`` trial
    decodes; ``known_rates``: the sample rates the file stores already (:func:`.auto.resolve`)."""
    auto = resolve(job, manifest, keep_codecs, run_trial, known_rates)
    for line in auto.describe(job):
        detail(say, line)
    run = auto.run_job(job)
    # The fields the run adds (true lengths) are small integers: stored as they are.
    codecs = {name: auto.codecs[name].codec if name in auto.codecs else CodecSpec("none") for name in run.fields}
    codec_notes = {name: auto.codecs[name].why() if name in auto.codecs else "" for name in run.fields}
    for name, codec in (keep_codecs or {}).items():
        codecs[name], codec_notes[name] = codec, ""
    batch_size = auto.batch_size
    if record is not None:
        # The partial file's datasets already have their filters: keep writing those
        # (and describe fields created from now on the way the first run did).
        if record.codecs != codecs:
            say("resuming with the interrupted run's codecs: "
                + ", ".join(f"{n} {c.label()}" for n, c in record.codecs.items()))
        codecs, codec_notes = {**codecs, **record.codecs}, {**codec_notes, **record.codec_notes}
        if record.batch_size and record.batch_size != batch_size:
            # Progress is recorded in batches: the rest must be cut the same way.
            say(f"resuming with the interrupted run's batch size ({record.batch_size} items, not {batch_size})")
            batch_size = record.batch_size
    num_inputs = manifest.items.num_paths() + len(manifest.rejects)
    n_workers = job.cluster.workers or default_workers()
    spec = WriterSpec(
        partial_path=partial, final_path=final,
        job_json=json.dumps(job.public_dict(), sort_keys=True), job_hash=job.hash(),
        manifest_hash=manifest.hash, splits=manifest.splits, fields=tuple(run.fields.items()),
        class_names=manifest.class_names, labelled=job.labelled, codecs=codecs,
        chunk_bytes=job.output.chunk_bytes, cache_bytes=job.output.cache_bytes,
        discovery_rejects=manifest.rejects, num_inputs=num_inputs,
        commit_every=job.policy.commit_every, threads=max(2, min(4, n_workers)),
        # a sync keeps the file's own versions
        resume=record, versions=versions() if new_file else {}, batch_size=batch_size,
        codec_notes=codec_notes, split_rows=manifest.items.split_counts(),
        field_bytes=dict(auto.field_bytes), cwd=os.getcwd(), umask=current_umask(), annotations=manifest.annotations,
    )
    tasks = make_tasks(run, manifest, run_id, hostname(), batch_size)
    return Plan(tasks, spec, record.next_batch if record else 0, batch_size * auto.item_bytes, num_inputs)


@cache
def _versions() -> dict[str, str]:
    from importlib.metadata import PackageNotFoundError
    from importlib.metadata import version as installed

    import h5py  # the HDF5 library's version is known only to h5py's extension

    from .. import __version__

    out = {"h5batch": __version__, "h5py": h5py.__version__, "hdf5": h5py.version.hdf5_version,
           "numpy": np.__version__}
    for key, dist in (("hdf5plugin", "hdf5plugin"), ("soundfile", "soundfile"), ("pillow", "pillow"),
                      ("dask", "dask")):
        out[key] = installed(dist)
    out["python"] = sys.version.split()[0]
    with contextlib.suppress(PackageNotFoundError):
        out["blosc2"] = installed("blosc2")
    return out


def versions() -> dict[str, str]:
    """Versions of what shapes the bytes of an output file (its ``versions`` attribute):
    h5batch, h5py, HDF5, numpy, hdf5plugin, soundfile, pillow, dask, Python, and blosc2 where
    installed (a copy: callers may change it).

    Rule: read once per process, from the installed distributions' metadata, not by
    importing the packages. Reason: importing dask and blosc2 is slow, and a small local
    conversion needs neither. The strings are the same as the packages' ``__version__``."""
    return dict(_versions())


class TaskList(Sequence):
    """The batches of a job, built on demand: only the batch boundaries are kept, so the
    driver holds no per-file state beyond the manifest itself."""

    def __init__(self, job: JobConfig, manifest: Manifest, run_id: str, writer_host: str, batch_size: int):
        self.job, self.manifest, self.run_id, self.writer_host = job, manifest, run_id, writer_host
        self.fields = tuple(job.fields.items())
        self.root = os.path.abspath(manifest.root)
        self.batch_size = bs = batch_size
        starts = []
        items = manifest.items
        i = 0
        while i < len(items):  # batches of batch_size items, never across splits
            starts.append(i)
            split = items.split_of(i)
            j = min(i + bs, len(items))
            while items.split_of(j - 1) != split:
                j -= 1
            i = j
        self.starts = np.asarray(starts + [len(items)], dtype=np.int64)

    def __len__(self) -> int:
        return len(self.starts) - 1

    def __getitem__(self, index):
        if isinstance(index, slice):
            return [self[k] for k in range(*index.indices(len(self)))]
        if index < 0:
            index += len(self)
        if not 0 <= index < len(self):
            raise IndexError(index)
        lo, hi = int(self.starts[index]), int(self.starts[index + 1])
        m = self.manifest
        items = m.items[lo:hi]
        chunk = tuple((it.paths, m.label_index(it.label), it.values) for it in items)
        return BatchTask(index, m.items[lo].split, lo, chunk, self.root, self.fields, self.run_id,
                         self.job.cluster.transport, self.writer_host, self.job.policy.decode_timeout,
                         largest=largest_files(items))


def largest_files(items: list) -> tuple[int, ...]:
    """The largest file of each path position of ``items`` (bytes, from discovery's
    stats of them), or () where a file has no stats. Reason: a worker decides from it whether a
    batch streams a long recording (``worker._StreamRows``) without a ``stat`` of every
    file of every batch, a noticeable share of decoding short clips."""
    if not items:
        return ()
    out = []
    for j in range(len(items[0].paths)):
        sizes = [it.stats[j] for it in items]
        if None in sizes:
            return ()
        out.append(max(s[0] for s in sizes))
    return tuple(out)


def make_tasks(job: JobConfig, manifest: Manifest, run_id: str, writer_host: str,
               batch_size: int | None = None) -> TaskList:
    """Cut the manifest into batches of ``batch_size`` items (default: ``cluster.batch_size``,
    or :func:`h5batch.conversion.auto.resolve`'s choice), never across splits."""
    if batch_size is None:
        batch_size = resolve(job, manifest).batch_size  # the job's integer, or auto's choice
    return TaskList(job, manifest, run_id, writer_host, batch_size)

