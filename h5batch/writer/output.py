"""The output file, as the writer process sees it: create or resume, append, commit, finalize.

:class:`OutputWriter` is the only code that opens the output for writing. Samples go through
the appenders of :mod:`.store` / :mod:`.append`, with a tuned chunk cache; commits follow
:mod:`.commit`.
"""

from __future__ import annotations

import contextlib
import os
import socket
from concurrent.futures import ThreadPoolExecutor
from datetime import UTC, datetime

import h5py
import numpy as np

from .. import faults, inventory
from .. import format as fmt
from ..batches import BatchResult
from ..fields import format_version
from ..manifest import Reject
from ..transport.packing import Attached
from .append import SmallAppender, small_dataset
from .commit import (
    CommitRecord,
    SplitProgress,
    load_tails,
    remove_commit_files,
    remove_tail_files,
    save_tails,
)
from .journal import fsync_path
from .messages import Done, WriterSpec
from .store import STR, FieldStore, SplitStore


class OutputWriter:
    """Owns the partial output file: create or resume, append batches, commit, finalize."""

    def __init__(self, spec: WriterSpec):
        self.spec = spec
        self.pool = ThreadPoolExecutor(max_workers=max(1, spec.threads), thread_name_prefix="h5batch-encode")
        smallest = 4096 * 8
        cache = fmt.cache_settings(spec.chunk_bytes, smallest, spec.cache_bytes)
        self.commits = 0
        self.next_batch = 0
        self.bytes_written = 0
        tails = self._open(cache)
        self.splits: dict[str, SplitStore] = {}
        for s in spec.splits:
            if s in self.f:
                self.splits[s] = SplitStore(self.f, s, spec, self.pool, tails)
        self.rej_ds = {k: SmallAppender(small_dataset(self.f.require_group(fmt.REJECTS), k, (), STR, 256))
                       for k in ("path", "stage", "reason")}

    def _open(self, cache: dict) -> dict[str, np.ndarray]:
        """Open (create or resume) the partial file as ``self.f``; the tail rows to resume with."""
        if self.spec.resume is not None:
            self.f = h5py.File(self.spec.partial_path, "r+", **cache)
            return self._resume(self.spec.resume)
        # fs_strategy "none": space freed by a rewritten chunk is never reused, so data
        # covered by an earlier commit is never overwritten by later writes.
        self.f = h5py.File(self.spec.partial_path, "w", libver=("earliest", "v110"), fs_strategy="none", **cache)
        self._init_root()
        return {}

    def _init_root(self) -> None:
        a = self.f.attrs
        a[fmt.ATTR_FORMAT] = format_version(fc for _, fc in self.spec.fields)  # 2 with an encoded field
        a[fmt.ATTR_JOB] = self.spec.job_json
        a[fmt.ATTR_JOB_HASH] = self.spec.job_hash
        a[fmt.ATTR_MANIFEST_HASH] = self.spec.manifest_hash
        a[fmt.ATTR_VERSIONS] = fmt.dumps(self.spec.versions)
        a[fmt.ATTR_CREATED] = datetime.now(UTC).isoformat(timespec="seconds")
        a[fmt.ATTR_SPLITS] = fmt.dumps(list(self.spec.splits))
        a[fmt.ATTR_FIELDS] = fmt.dumps([n for n, _ in self.spec.fields])
        a[fmt.ATTR_COMPLETE] = False
        a[fmt.ATTR_INPUTS] = self.spec.num_inputs
        if self.spec.annotations:
            a[fmt.ATTR_ANNOTATIONS] = fmt.dumps(list(self.spec.annotations))
        if self.spec.shard is not None:
            a[fmt.ATTR_SHARD] = fmt.dumps({"host": socket.gethostname(), **self.spec.shard})
        if self.spec.labelled:
            self.f.create_dataset(fmt.CLASS_NAMES, data=np.array(self.spec.class_names, dtype=object), dtype=STR)

    def _resume(self, record: CommitRecord) -> dict[str, np.ndarray]:
        """Cut every dataset back to the committed counts of ``record``; return the
        commit's partial-chunk rows."""
        for split, progress in record.splits.items():
            g = self.f[split]
            n = progress.samples
            for name in (fmt.SOURCE, fmt.CHECKSUM, fmt.LABEL):
                if name in g:
                    g[name].resize(n, axis=0)
            for fname, rows in progress.rows_in_file.items():
                if fname in g:
                    FieldStore.truncate(g[fname], n, rows)
        rej = self.f.require_group(fmt.REJECTS)
        for k in ("path", "stage", "reason"):
            if k in rej:
                rej[k].resize(record.rejects, axis=0)
        self.next_batch = record.next_batch
        self.bytes_written = record.bytes
        self.commits = record.number
        return load_tails(self.spec.partial_path, record)

    def write_batch(self, r: BatchResult) -> tuple[int, list[Reject]]:
        """Append one decoded batch. Returns (samples written, write-stage rejects)."""
        store = self.splits.get(r.split)
        if store is None:
            store = self.splits[r.split] = SplitStore(self.f, r.split, self.spec, self.pool)
        att = Attached(r.packed)
        try:
            per_field = {b.name: (b, att.samples(b)) for b in r.packed.blocks}
            keep = list(range(r.n_samples))
            late: list[Reject] = []
            for name, (_block, samples) in per_field.items():
                for i in list(keep):
                    why = store.fields[name].check(samples[i])
                    if why:
                        keep.remove(i)
                        late.extend(Reject(p, "write", f"field {name}: {why}") for p in r.sources[i])
            all_kept = len(keep) == r.n_samples
            for name, (block, samples) in per_field.items():
                flat = att.field_bytes(block) if all_kept else None
                store.fields[name].append([samples[i] for i in keep], flat)
            srcs = r.sources if all_kept else [r.sources[i] for i in keep]
            store.source.append(np.array([s if len(s) > 1 else s[0] for s in srcs], dtype=object)
                                if srcs else [])
            store.checksum.append(r.checksums if all_kept else r.checksums[keep])
            if store.label is not None:
                store.label.append(r.labels if all_kept else r.labels[keep])
            store.n += len(keep)
            self.bytes_written += r.packed.nbytes
        finally:
            att.release()
        self.add_rejects(r.rejects + late)
        if r.final_part:  # a batch split into parts counts as done with its last part
            self.next_batch = r.index + 1
        return len(keep), late

    def add_rejects(self, rejects: list[Reject]) -> None:
        if not rejects:
            return
        self.rej_ds["path"].append(np.array([r.path for r in rejects], dtype=object))
        self.rej_ds["stage"].append(np.array([r.stage for r in rejects], dtype=object))
        self.rej_ds["reason"].append(np.array([r.reason for r in rejects], dtype=object))

    def commit(self) -> CommitRecord:
        """Make everything written so far durable and record it (the order of the steps
        is the protocol of :mod:`.commit`)."""
        points = {name: s.checkpoint() for name, s in self.splits.items()}
        self.f.flush()
        fsync_path(self.spec.partial_path)
        self.commits += 1
        tails = {f"{split}/{fname}": t for split, p in points.items() for fname, (_, t) in p.items() if t is not None}
        tail_file = save_tails(self.spec.partial_path, self.commits, tails)
        record = CommitRecord(
            job_hash=self.spec.job_hash, manifest_hash=self.spec.manifest_hash, next_batch=self.next_batch,
            batch_size=self.spec.batch_size, codecs=dict(self.spec.codecs), codec_notes=dict(self.spec.codec_notes),
            rejects=self.rej_ds["path"].n, bytes=self.bytes_written,
            splits={name: SplitProgress(s.n, {fn: fs.end for fn, fs in s.fields.items() if not fs.fixed},
                                        {fn: rows for fn, (rows, _) in points[name].items()})
                    for name, s in self.splits.items()},
            tail_file=tail_file, number=self.commits)
        record.write(self.spec.partial_path)
        remove_tail_files(self.spec.partial_path, keep=tail_file)
        return record

    def finalize(self, max_reject_fraction: float = 1.0) -> Done:
        """Write the tail chunks, discovery rejects and final attributes; close; rename to
        the final path unless more than ``max_reject_fraction`` of the inputs were rejected
        (then the file stays partial and resumable)."""
        rejects, rename = self.last_rejects(max_reject_fraction)
        for s in self.splits.values():
            s.finish()
        self.store_inventory()
        self.f.attrs[fmt.ATTR_COMPLETE] = bool(rename)
        self.f.flush()
        faults.pause("finalize", self.spec.partial_path)
        self.close()
        fmt.write_rejects(fmt.rejects_file(self.spec.final_path), rejects)
        if rename:
            # Renaming over an existing file makes ext4 write the new file's data out
            # first (auto_da_alloc); removing the old output (the job said overwrite)
            # keeps the rename as cheap as for a fresh output.
            with contextlib.suppress(FileNotFoundError):
                os.unlink(self.spec.final_path)
            os.replace(self.spec.partial_path, self.spec.final_path)
            remove_commit_files(self.spec.partial_path)
            inventory.remove_sidecar(self.spec.partial_path)
        return self.summary(self.spec.final_path if rename else self.spec.partial_path, rejects, rename)

    def last_rejects(self, max_reject_fraction: float) -> tuple[list[Reject], bool]:
        """Finalize's first step: every split of the job present and discovery's rejects
        added. Returns all the rejects, and whether the failed ones are at most
        ``max_reject_fraction`` of the inputs. Files set aside by ``source.exclude`` (or an
        unlisted ``exclude`` table) are listed with the rejects but are not failures: the
        bound counts the others."""
        for s in self.spec.splits:
            if s not in self.splits:
                self.splits[s] = SplitStore(self.f, s, self.spec, self.pool)
        self.add_rejects(self.spec.discovery_rejects)
        rejects = read_rejects(self.f)
        excluded = sum(1 for r in rejects if r.stage == fmt.STAGE_EXCLUDED)
        return rejects, len(rejects) - excluded <= max_reject_fraction * max(1, self.spec.num_inputs - excluded)

    def summary(self, path: str, rejects: list[Reject], ok: bool) -> Done:
        return Done(path=path, counts={name: s.n for name, s in self.splits.items()}, rejects=len(rejects),
                            bytes_decoded=self.bytes_written, rejects_file=fmt.rejects_file(self.spec.final_path),
                            ok=ok)

    def store_inventory(self) -> None:
        """``/inventory`` from the driver's sidecar (h5batch.inventory), when it wrote one."""
        if self.spec.inventory and os.path.exists(self.spec.inventory):
            inventory.store_sidecar(self.f, self.spec.inventory)

    def abort(self) -> None:
        """Stop early (Ctrl-C, the driver gone): commit what is stored, close."""
        self.commit()
        self.close()

    def close(self) -> None:
        self.pool.shutdown(wait=True)
        if self.f.id.valid:
            self.f.close()


def read_rejects(f: h5py.File) -> list[Reject]:
    """The rejects table of an output (empty when it has none)."""
    g = f.get(fmt.REJECTS, {})
    cols = [g[k].asstr()[...] if k in g and g[k].shape[0] else [] for k in ("path", "stage", "reason")]
    return [Reject(str(p), str(s), str(r)) for p, s, r in zip(*cols)]
