"""The single writer: the only code that opens the output for writing.

It runs in its own process (:func:`writer_main`), receives decoded batches as shared-memory
descriptors in manifest order, and appends them to resizable chunked datasets:

* big per-sample data goes through :class:`ChunkAppender`, which assembles whole chunks,
  compresses them in a thread pool (the codecs release the GIL) and stores the bytes with
  ``write_direct_chunk`` -- HDF5's single-threaded filter pipeline never runs;
* small per-sample metadata (label, checksum, source, offsets) goes through plain h5py
  writes with a tuned chunk cache.

Progress is committed periodically: flush, fsync, then an atomically replaced
``<partial>.commit.json`` records how many batches and samples are durable. A later run
with the same job and manifest resumes from it (see :mod:`h5batch.writer.resume`).
"""

from __future__ import annotations

import errno
import json
import os
import queue
import signal
import sys
import time
import traceback
from collections import Counter, deque
from collections.abc import Callable
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Any

import h5py
import numpy as np

from .. import format as fmt
from ..codecs import ChunkDecoder, CodecSpec, make_encoder, self_check
from ..config import AudioField, FieldConfig, ImageField
from ..convert.worker import BatchResult
from ..decode import is_fixed_shape, rows_per_chunk
from ..discover import Reject
from ..transport.packing import Attached

STR = h5py.string_dtype("utf-8")


@dataclass
class WriterSpec:
    """Everything the writer process needs (picklable, no open handles)."""

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
    resume: dict[str, Any] | None = None  # a commit record to continue from
    versions: dict[str, str] = field(default_factory=dict)
    # Fault injection for the kill tests: "commit:N" pauses after the N-th commit,
    # "finalize" just before the final rename; a marker file <partial>.paused appears.
    pause_at: str | None = None
    # The driver's working directory and umask: a writer forked from a fork server would
    # otherwise have the server's (relative paths, output file permissions).
    cwd: str = ""
    umask: int | None = None


def commit_path(partial_path: str) -> str:
    return partial_path + ".commit.json"


def _write_npz_atomic(path: str, arrays: dict[str, np.ndarray]) -> None:
    tmp = path + ".tmp"
    with open(tmp, "wb") as fh:
        np.savez(fh, **arrays)
        fh.flush()
        os.fsync(fh.fileno())
    os.replace(tmp, path)


def load_tails(partial_path: str, record: dict[str, Any]) -> dict[str, np.ndarray]:
    """The partial-chunk rows saved with a commit (``{"split/field": rows}``)."""
    path = os.path.join(os.path.dirname(partial_path), record["tail_file"])
    with np.load(path) as z:
        return {k: z[k] for k in z.files}


def remove_tail_files(partial_path: str, keep: str | None = None) -> None:
    """Delete tail files of older commits (or all of them)."""
    folder, base = os.path.split(partial_path)
    for name in os.listdir(folder or "."):
        if name.startswith(base + ".tail-") and name != keep:
            try:
                os.unlink(os.path.join(folder, name))
            except FileNotFoundError:
                pass


def _write_json_atomic(path: str, obj: Any) -> None:
    tmp = path + ".tmp"
    with open(tmp, "w") as fh:
        json.dump(obj, fh, sort_keys=True, indent=1)
        fh.flush()
        os.fsync(fh.fileno())
    os.replace(tmp, path)
    dfd = os.open(os.path.dirname(os.path.abspath(path)), os.O_RDONLY)
    try:
        os.fsync(dfd)
    finally:
        os.close(dfd)


# ---------------------------------------------------------------------------
# Appenders
# ---------------------------------------------------------------------------


class ChunkAppender:
    """Appends rows to a chunked dataset one whole chunk at a time.

    ``ds`` has shape ``(n, *row)`` and chunks ``(k, *row)``. Rows are copied into a chunk
    buffer; each full chunk is encoded on the pool and written with ``write_direct_chunk``
    in chunk order, exactly once: the file only ever grows, so data covered by a commit is
    never rewritten. The rows of the partial last chunk live in the buffer; a commit saves
    them beside the file (:meth:`checkpoint`), and :meth:`finish` stores them as the
    zero-padded last chunk (HDF5 ignores elements beyond the extent).

    ``tail`` (resume) holds the committed rows that follow the dataset's full chunks.
    """

    def __init__(self, ds: h5py.Dataset, encoder, pool: ThreadPoolExecutor, max_pending: int = 8,
                 tail: np.ndarray | None = None, raw: bool = False):
        self.ds = ds
        # Uncompressed: a chunk's stored bytes are its rows, so whole chunks are written
        # straight from the caller's array (shared memory) without a copy or the pool.
        self.raw = raw
        self.k = ds.chunks[0]
        self.row_shape = ds.shape[1:]
        self.encoder = encoder
        self.pool = pool
        self.max_pending = max_pending
        self.next_chunk = ds.shape[0] // self.k
        self.buf = np.zeros((self.k, *self.row_shape), dtype=ds.dtype)
        self.fill = 0
        if encoder is not None and ds.shape[0] % self.k:
            # A file written by finish() ends in a padded chunk: take its rows back.
            self.fill = ds.shape[0] - self.next_chunk * self.k
            self.buf[: self.fill] = ds[self.next_chunk * self.k:]
            ds.resize(self.next_chunk * self.k, axis=0)
        if tail is not None and len(tail):
            self.buf[self.fill: self.fill + len(tail)] = tail
            self.fill += len(tail)
        self.n = ds.shape[0] + self.fill
        # The dataset's extent, tracked here: asking h5py for ``ds.shape`` and resizing once
        # per chunk cost the writer ~6 % of its time. It grows once per append, to cover the
        # chunks that append completes; a commit drains them all first, so the extent a
        # commit records is always exact.
        self.extent = ds.shape[0]
        self.pending: deque[tuple[int, Future]] = deque()
        self.zero_index = (0,) * len(self.row_shape)

    def append(self, rows: np.ndarray) -> None:
        """Append ``rows`` of shape ``(m, *row)``."""
        m = rows.shape[0]
        if self.encoder is None:  # codec only HDF5 can encode (lzf): let it
            self.ds.resize(self.n + m, axis=0)
            self.ds[self.n: self.n + m] = rows
            self.n += m
            self.extent = self.n
            return
        self._grow((self.next_chunk + (self.fill + m) // self.k) * self.k)
        pos = 0
        while pos < m:
            if self.raw and self.fill == 0 and m - pos >= self.k:
                self._emit(rows[pos: pos + self.k])  # whole chunk: straight from the caller's rows
                self.next_chunk += 1
                pos += self.k
                continue
            take = min(self.k - self.fill, m - pos)
            self.buf[self.fill: self.fill + take] = rows[pos: pos + take]
            self.fill += take
            pos += take
            if self.fill == self.k:
                self._emit(self.buf)
                if not self.raw:  # the pool still reads the old buffer; a raw one is stored
                    self.buf = np.zeros((self.k, *self.row_shape), dtype=self.ds.dtype)
                self.fill = 0
                self.next_chunk += 1
        self.n += m

    def store_encoded(self, data) -> None:
        """Store one whole chunk encoded elsewhere (a worker); the buffer must be empty."""
        if self.fill:
            raise RuntimeError("store_encoded called with a partial chunk in progress")
        self._store(self.next_chunk, data)
        self.next_chunk += 1
        self.n += self.k

    def _emit(self, chunk: np.ndarray) -> None:
        if self.raw:
            self._drain()
            self._store(self.next_chunk, chunk)
            return
        self.pending.append((self.next_chunk, self.pool.submit(self.encoder, chunk)))
        if len(self.pending) > self.max_pending:
            self._drain(keep=self.max_pending // 2)

    def _drain(self, keep: int = 0) -> None:
        while len(self.pending) > keep:
            idx, fut = self.pending.popleft()
            self._store(idx, fut.result())

    def _grow(self, end: int) -> None:
        if self.extent < end:
            self.ds.resize(end, axis=0)
            self.extent = end

    def _store(self, idx: int, data: bytes) -> None:
        self._grow((idx + 1) * self.k)
        self.ds.id.write_direct_chunk((idx * self.k, *self.zero_index), data)

    def checkpoint(self) -> np.ndarray | None:
        """Store every full chunk; return the rows of the partial last chunk (to be saved
        beside the file), or None when there are none."""
        if self.encoder is None:
            return None
        self._drain()
        written = self.next_chunk * self.k
        if self.extent > written:  # grown for chunks a failed append never stored
            self.ds.resize(written, axis=0)
            self.extent = written
        return self.buf[: self.fill].copy() if self.fill else None

    def finish(self) -> None:
        """Store everything, the partial last chunk zero-padded; extent becomes ``n``."""
        if self.encoder is None:
            return
        self._drain()
        if self.fill:
            # Grow the extent first: shrinking over a written chunk would make HDF5 rewrite
            # it through its own filter.
            self.ds.resize(self.n, axis=0)
            self.extent = self.n
            self.buf[self.fill:] = 0  # a reused buffer holds old rows: keep the padding zero
            self.ds.id.write_direct_chunk((self.next_chunk * self.k, *self.zero_index), self.encoder(self.buf))


class SmallAppender:
    """Appends rows to a small dataset with ordinary h5py writes (goes through the cache)."""

    def __init__(self, ds: h5py.Dataset):
        self.ds = ds
        self.n = ds.shape[0]

    def append(self, rows: Any) -> None:
        m = len(rows)
        if m == 0:
            return
        self.ds.resize(self.n + m, axis=0)
        self.ds[self.n: self.n + m] = rows
        self.n += m

    def flush(self) -> None:
        pass


def _small(group: h5py.Group, name: str, shape: tuple[int, ...], dtype, chunk_rows: int) -> h5py.Dataset:
    if name in group:
        return group[name]
    return group.create_dataset(name, shape=(0, *shape), maxshape=(None, *shape), dtype=dtype,
                                chunks=(chunk_rows, *shape))


def _field_attrs(fc: FieldConfig, codec: CodecSpec) -> dict[str, Any]:
    attrs: dict[str, Any] = {"codec": codec.label(), "config": fmt.dumps(vars(fc))}
    if isinstance(fc, AudioField):
        attrs.update(modality="audio", dtype=fc.dtype, channels=fc.channels,
                     sample_rate=fc.sample_rate or 0,
                     length_rule="keep start; crop or zero-pad the end" if fc.length else "variable")
        attrs["axes"] = "time,channel" if fc.channels == "keep" else "time"
    elif isinstance(fc, ImageField):
        attrs.update(modality="image", mode=fc.mode, axes="height,width,channel",
                     resize="shorter side to fit, centre crop" if fc.size else "native size")
    return attrs


# The writer process's counters (chunks stored as workers made them / redone here).
_STATS: Counter = Counter()


class FieldStore:
    """Storage of one field in one split: fixed ``(N, *shape)`` or variable
    (``values`` flat + ``offsets`` (N+1,) + ``shapes`` (N, ndim))."""

    def __init__(self, group: h5py.Group, name: str, fc: FieldConfig, spec: WriterSpec, pool: ThreadPoolExecutor,
                 tail: np.ndarray | None = None):
        self.group, self.name, self.fc, self.spec, self.pool = group, name, fc, spec, pool
        self.fixed = is_fixed_shape(fc)
        self.data: ChunkAppender | None = None
        self.offsets: SmallAppender | None = None
        self.shapes: SmallAppender | None = None
        self.shape: tuple[int, ...] | None = None
        self.dtype: np.dtype | None = None
        self.end = 0  # variable: element offset after the last sample
        self.stats = _STATS
        if name in group:
            self._open_existing(tail)

    @property
    def codec(self) -> CodecSpec:
        return self.spec.codecs[self.name]

    @property
    def _raw(self) -> bool:
        return self.codec.name == "none"

    def _encoder(self, dtype: np.dtype):
        return make_encoder(self.codec, dtype) if self_check(self.codec, dtype.str) else None

    def _open_existing(self, tail: np.ndarray | None = None) -> None:
        node = self.group[self.name]
        if self.fixed:
            self.shape, self.dtype = node.shape[1:], node.dtype
            self.data = ChunkAppender(node, self._encoder(node.dtype), self.pool, tail=tail, raw=self._raw)
        else:
            values = node[fmt.VALUES]
            self.dtype = values.dtype
            self.data = ChunkAppender(values, self._encoder(values.dtype), self.pool, tail=tail, raw=self._raw)
            self.offsets = SmallAppender(node[fmt.OFFSETS])
            self.shapes = SmallAppender(node[fmt.SHAPES])
            self.end = int(node[fmt.OFFSETS][-1])

    def _create(self, dtype: np.dtype, shape: tuple[int, ...]) -> None:
        self.dtype = np.dtype(dtype)
        kw = self.codec.dataset_kwargs(self.dtype.itemsize)
        attrs = _field_attrs(self.fc, self.codec)
        if self.spec.codec_notes.get(self.name):
            attrs["codec_choice"] = self.spec.codec_notes[self.name]
        if self.fixed:
            self.shape = shape
            k = rows_per_chunk(shape, self.dtype, self.spec.chunk_bytes)
            ds = self.group.create_dataset(self.name, shape=(0, *shape), maxshape=(None, *shape),
                                           dtype=self.dtype, chunks=(k, *shape), **kw)
            ds.attrs["kind"] = fmt.KIND_FIXED
            ds.attrs.update(attrs)
            self.data = ChunkAppender(ds, self._encoder(self.dtype), self.pool, raw=self._raw)
        else:
            g = self.group.create_group(self.name)
            g.attrs["kind"] = fmt.KIND_VARIABLE
            g.attrs["ndim"] = len(shape)
            g.attrs.update(attrs)
            k = max(1024, self.spec.chunk_bytes // self.dtype.itemsize)
            values = g.create_dataset(fmt.VALUES, shape=(0,), maxshape=(None,), dtype=self.dtype, chunks=(k,), **kw)
            offs = _small(g, fmt.OFFSETS, (), np.int64, 8192)
            offs.resize(1, axis=0)
            offs[0] = 0
            self.data = ChunkAppender(values, self._encoder(self.dtype), self.pool, raw=self._raw)
            self.offsets = SmallAppender(offs)
            self.shapes = SmallAppender(_small(g, fmt.SHAPES, (len(shape),), np.int64, 4096))

    def check(self, sample: np.ndarray) -> str | None:
        """Why ``sample`` cannot be stored in this field (None when it can)."""
        if self.dtype is not None and sample.dtype != self.dtype:
            return f"dtype {sample.dtype} differs from the field's {self.dtype}"
        if self.fixed and self.shape is not None and tuple(sample.shape) != tuple(self.shape):
            return f"shape {tuple(sample.shape)} differs from the field's {tuple(self.shape)}"
        return None

    def append(self, samples: list[np.ndarray], flat: np.ndarray | None) -> None:
        """Append samples (all passed :meth:`check`). ``flat`` is their bytes back to back
        when every sample is kept (saves a concatenation)."""
        if not samples:
            return
        if self.data is None:
            self._create(samples[0].dtype, tuple(samples[0].shape))
        assert self.data is not None and self.dtype is not None
        if self.fixed:
            rows = flat.view(self.dtype).reshape(len(samples), *self.shape) if flat is not None else np.stack(samples)
            self.data.append(rows)
            return
        values = flat.view(self.dtype) if flat is not None else np.concatenate([s.reshape(-1) for s in samples])
        sizes = np.fromiter((s.size for s in samples), dtype=np.int64, count=len(samples))
        self.data.append(values)
        self.offsets.append(self.end + np.cumsum(sizes))
        self.end += int(sizes.sum())
        self.shapes.append(np.asarray([s.shape for s in samples], dtype=np.int64))

    def append_chunked(self, raw: list[np.ndarray], cs, encoded: list[np.ndarray],
                       keep: list[int] | None) -> None:
        """Append a batch whose middle rows arrive as chunks compressed by the worker.

        When the worker's guess of where the batch starts holds (the usual case), the
        head rows complete the chunk in progress, the chunks are stored as they are, and the
        tail rows start the next one. Otherwise (an earlier batch had rejects, or some rows
        of this one were dropped) the chunks are decoded and the rows appended."""
        if self.data is None:
            self._create(np.dtype(cs.dtype), tuple(cs.row_shape))
        app = self.data
        assert app is not None
        head, tail = raw[: cs.head], raw[cs.head:]
        if keep is None and app.encoder is not None and app.n == cs.pred:
            app._grow((app.next_chunk + (app.fill + len(raw) + len(encoded) * cs.k) // cs.k) * cs.k)
            if head:
                app.append(np.stack(head))
            for data in encoded:
                app.store_encoded(data)
            if tail:
                app.append(np.stack(tail))
            self.stats["worker_chunks_stored"] += len(encoded)
            return
        self.stats["worker_chunks_redone"] += len(encoded)
        decoder = ChunkDecoder.for_dataset(app.ds)
        rows = np.empty((cs.n_chunks * cs.k, *cs.row_shape), dtype=np.dtype(cs.dtype))
        for i, data in enumerate(encoded):
            decoder.decode(data.tobytes(), 0, rows[i * cs.k:(i + 1) * cs.k])
        samples = head + list(rows) + tail
        if keep is not None:
            samples = [samples[i] for i in keep]
        if samples:
            app.append(np.stack(samples))

    def checkpoint(self) -> tuple[int, np.ndarray | None]:
        """(rows of the data dataset in the file, rows held back in the tail)."""
        if self.data is None:
            return 0, None
        tail = self.data.checkpoint()
        return self.data.ds.shape[0], tail

    def finish(self) -> None:
        if self.data is not None:
            self.data.finish()

    @staticmethod
    def truncate(node: h5py.Dataset | h5py.Group, n: int, rows_in_file: int) -> None:
        """Cut a field back to its first ``n`` samples, keeping ``rows_in_file`` data rows
        (the rest of the last committed chunk comes from the commit's tail file)."""
        if isinstance(node, h5py.Dataset):
            node.resize(rows_in_file, axis=0)
        else:
            node[fmt.OFFSETS].resize(n + 1, axis=0)
            node[fmt.SHAPES].resize(n, axis=0)
            node[fmt.VALUES].resize(rows_in_file, axis=0)


class SplitStore:
    """All datasets of one split."""

    def __init__(self, f: h5py.File, split: str, spec: WriterSpec, pool: ThreadPoolExecutor,
                 tails: dict[str, np.ndarray] | None = None):
        self.group = f.require_group(split)
        self.names = [n for n, _ in spec.fields]
        tails = tails or {}
        self.fields = {n: FieldStore(self.group, n, fc, spec, pool, tails.get(f"{split}/{n}"))
                       for n, fc in spec.fields}
        nf = len(spec.fields)
        self.source = SmallAppender(_small(self.group, fmt.SOURCE, (nf,) if nf > 1 else (), STR, 1024))
        self.checksum = SmallAppender(_small(self.group, fmt.CHECKSUM, (nf,), np.uint32, 8192))
        self.source.ds.attrs["fields"] = fmt.dumps(self.names)
        self.checksum.ds.attrs["fields"] = fmt.dumps(self.names)
        self.checksum.ds.attrs["algorithm"] = "crc32"
        self.label = SmallAppender(_small(self.group, fmt.LABEL, (), np.int64, 8192)) if spec.labelled else None
        self.n = self.source.n

    def checkpoint(self) -> dict[str, tuple[int, np.ndarray | None]]:
        self.group.attrs[fmt.ATTR_NUM_SAMPLES] = self.n
        return {name: fs.checkpoint() for name, fs in self.fields.items()}

    def finish(self) -> None:
        for fs in self.fields.values():
            fs.finish()
        self.group.attrs[fmt.ATTR_NUM_SAMPLES] = self.n


# ---------------------------------------------------------------------------
# The output file
# ---------------------------------------------------------------------------


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
        tails: dict[str, np.ndarray] = {}
        if spec.resume is not None:
            self.f = h5py.File(spec.partial_path, "r+", **cache)
            tails = self._resume(spec.resume)
        else:
            # fs_strategy "none": space freed by a rewritten chunk is never reused, so data
            # covered by an earlier commit is never overwritten by later writes.
            self.f = h5py.File(spec.partial_path, "w", libver=("earliest", "v110"), fs_strategy="none", **cache)
            self._init_root()
        self.splits: dict[str, SplitStore] = {}
        for s in spec.splits:
            if s in self.f:
                self.splits[s] = SplitStore(self.f, s, spec, self.pool, tails)
        self.rej_ds = {k: SmallAppender(_small(self.f.require_group(fmt.REJECTS), k, (), STR, 256))
                       for k in ("path", "stage", "reason")}

    def _init_root(self) -> None:
        a = self.f.attrs
        a[fmt.ATTR_FORMAT] = fmt.FORMAT_VERSION
        a[fmt.ATTR_JOB] = self.spec.job_json
        a[fmt.ATTR_JOB_HASH] = self.spec.job_hash
        a[fmt.ATTR_MANIFEST_HASH] = self.spec.manifest_hash
        a[fmt.ATTR_VERSIONS] = fmt.dumps(self.spec.versions)
        a[fmt.ATTR_CREATED] = datetime.now(UTC).isoformat(timespec="seconds")
        a[fmt.ATTR_SPLITS] = fmt.dumps(list(self.spec.splits))
        a[fmt.ATTR_FIELDS] = fmt.dumps([n for n, _ in self.spec.fields])
        a[fmt.ATTR_COMPLETE] = False
        a[fmt.ATTR_INPUTS] = self.spec.num_inputs
        if self.spec.labelled:
            self.f.create_dataset(fmt.CLASS_NAMES, data=np.array(self.spec.class_names, dtype=object), dtype=STR)

    def _resume(self, record: dict[str, Any]) -> dict[str, np.ndarray]:
        """Cut every dataset back to the committed counts of ``record``; return the
        commit's partial-chunk rows."""
        for split, info in record["splits"].items():
            g = self.f[split]
            n = info["samples"]
            for name in (fmt.SOURCE, fmt.CHECKSUM, fmt.LABEL):
                if name in g:
                    g[name].resize(n, axis=0)
            for fname, rows in info["rows_in_file"].items():
                if fname in g:
                    FieldStore.truncate(g[fname], n, rows)
        rej = self.f.require_group(fmt.REJECTS)
        for k in ("path", "stage", "reason"):
            if k in rej:
                rej[k].resize(record["rejects"], axis=0)
        self.next_batch = record["next_batch"]
        self.bytes_written = record.get("bytes", 0)
        self.commits = int(record["tail_file"].rsplit("-", 1)[1].split(".")[0])
        return load_tails(self.spec.partial_path, record)

    def write_batch(self, r: BatchResult) -> tuple[int, list[Reject]]:
        """Append one decoded batch. Returns (samples written, write-stage rejects)."""
        store = self.splits.get(r.split)
        if store is None:
            store = self.splits[r.split] = SplitStore(self.f, r.split, self.spec, self.pool)
        att = Attached(r.packed)
        try:
            per_field = {b.name: (b, att.samples(b)) for b in r.packed.blocks}
            chunked = {c.name: (c, per_field.pop(c.block)[1]) for c in r.packed.chunks}
            keep = list(range(r.n_samples))
            late: list[Reject] = []
            for name, (_, samples) in per_field.items():
                if name in chunked:
                    continue  # the worker checked these rows' shape and dtype
                fs = store.fields[name]
                for i in list(keep):
                    why = fs.check(samples[i])
                    if why:
                        keep.remove(i)
                        late.extend(Reject(p, "write", f"field {name}: {why}") for p in r.sources[i])
            all_kept = len(keep) == r.n_samples
            for name, (block, samples) in per_field.items():
                if name in chunked:
                    cs, encoded = chunked[name]
                    store.fields[name].append_chunked(samples, cs, encoded, keep if not all_kept else None)
                    continue
                flat = att.field_bytes(block) if all_kept else None
                store.fields[name].append([samples[i] for i in keep], flat)
            srcs = [r.sources[i] for i in keep]
            store.source.append(np.array([s if len(s) > 1 else s[0] for s in srcs], dtype=object)
                                if srcs else [])
            store.checksum.append(r.checksums[keep])
            if store.label is not None:
                store.label.append(r.labels[keep])
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

    def commit(self) -> dict[str, Any]:
        """Make everything written so far durable and record it.

        Order matters for a crash at any moment: the HDF5 file is flushed and fsync'ed, the
        partial-chunk rows go to a new tail file (fsync'ed), and only then the commit record
        naming that tail file atomically replaces the previous one.
        """
        points = {name: s.checkpoint() for name, s in self.splits.items()}
        self.f.flush()
        fd = os.open(self.spec.partial_path, os.O_RDONLY)
        try:
            os.fsync(fd)
        finally:
            os.close(fd)
        self.commits += 1
        tails = {f"{split}/{fname}": t for split, p in points.items() for fname, (_, t) in p.items() if t is not None}
        tail_file = f"{os.path.basename(self.spec.partial_path)}.tail-{self.commits}.npz"
        _write_npz_atomic(os.path.join(os.path.dirname(self.spec.partial_path), tail_file), tails)
        record = {
            "job_hash": self.spec.job_hash,
            "manifest_hash": self.spec.manifest_hash,
            "next_batch": self.next_batch,
            "batch_size": self.spec.batch_size,
            "codecs": {n: [c.name, c.level, c.shuffle] for n, c in self.spec.codecs.items()},
            "codec_notes": self.spec.codec_notes,
            "rejects": self.rej_ds["path"].n,
            "bytes": self.bytes_written,
            "splits": {
                name: {"samples": s.n,
                       "elements": {fn: fs.end for fn, fs in s.fields.items() if not fs.fixed},
                       "rows_in_file": {fn: rows for fn, (rows, _) in points[name].items()}}
                for name, s in self.splits.items()
            },
            "tail_file": tail_file,
            "time": time.time(),
        }
        _write_json_atomic(commit_path(self.spec.partial_path), record)
        remove_tail_files(self.spec.partial_path, keep=tail_file)
        return record

    def finalize(self, max_reject_fraction: float = 1.0) -> dict[str, Any]:
        """Write the tail chunks, discovery rejects and final attributes; close; rename to
        the final path unless more than ``max_reject_fraction`` of the inputs were rejected
        (then the file stays partial and resumable)."""
        for s in self.spec.splits:
            if s not in self.splits:
                self.splits[s] = SplitStore(self.f, s, self.spec, self.pool)
        self.add_rejects(self.spec.discovery_rejects)
        rename = self.rej_ds["path"].n <= max_reject_fraction * max(1, self.spec.num_inputs)
        for s in self.splits.values():
            s.finish()
        counts = {name: s.n for name, s in self.splits.items()}
        self.f.attrs[fmt.ATTR_COMPLETE] = bool(rename)
        self.f.flush()
        _pause_point(self.spec, "finalize")
        rejects = self.read_rejects()
        self.close()
        summary = {"counts": counts, "rejects": len(rejects), "bytes_decoded": self.bytes_written,
                   "stats": dict(_STATS),
                   "path": self.spec.final_path if rename else self.spec.partial_path, "ok": rename}
        rej_path = self.spec.final_path.rsplit(".", 1)[0] + ".rejects.jsonl"
        with open(rej_path, "w") as fh:
            for r in rejects:
                fh.write(json.dumps({"path": r.path, "stage": r.stage, "reason": r.reason}) + "\n")
        summary["rejects_file"] = rej_path
        if rename:
            # Renaming over an existing file makes ext4 write the new file's data out
            # first (auto_da_alloc: 0.15 s per 256 MB here); removing the old output (the
            # job said overwrite) keeps the rename as cheap as for a fresh output.
            try:
                os.unlink(self.spec.final_path)
            except FileNotFoundError:
                pass
            os.replace(self.spec.partial_path, self.spec.final_path)
            try:
                os.unlink(commit_path(self.spec.partial_path))
            except FileNotFoundError:
                pass
            remove_tail_files(self.spec.partial_path)
        return summary

    def read_rejects(self) -> list[Reject]:
        g = self.f[fmt.REJECTS]
        cols = [g[k].asstr()[...] if g[k].shape[0] else [] for k in ("path", "stage", "reason")]
        return [Reject(str(p), str(s), str(r)) for p, s, r in zip(*cols)]

    def close(self) -> None:
        self.pool.shutdown(wait=True)
        if self.f.id.valid:
            self.f.close()


# ---------------------------------------------------------------------------
# Process entry point
# ---------------------------------------------------------------------------


def _error_text(e: BaseException, spec: WriterSpec) -> str:
    """One clear line for storage errors (disk full, read-only, I/O error), else the
    traceback. HDF5 buries the OS error in its message ("errno = 28")."""
    import re

    if isinstance(e, OSError):
        m = re.search(r"errno = (\d+)", str(e))
        code = e.errno or (int(m.group(1)) if m else None)
        if code in (errno.ENOSPC, errno.EDQUOT, errno.EROFS, errno.EIO, errno.EACCES, errno.EFBIG):
            return (f"cannot write {spec.partial_path}: {os.strerror(code)}. The last commit is kept; "
                    f"fix the cause and run the same command again to resume.")
    return traceback.format_exc()


def _pause_point(spec: WriterSpec, point: str) -> None:
    if spec.pause_at == point:
        with open(spec.partial_path + ".paused", "w") as fh:
            fh.write(point)
        time.sleep(3600)


def _wait_for_spec(inbox, driver_gone: Callable[[], bool]) -> WriterSpec | None:
    """The job, sent once the driver has discovered the corpus (None: not needed after all)."""
    while True:
        try:
            msg = inbox.get(timeout=1.0)
        except queue.Empty:
            if driver_gone():
                return None
            continue
        except (EOFError, OSError):
            return None
        if msg[0] == "spec":
            return msg[1]
        if msg[0] in ("quit", "abort"):
            return None


def writer_main(inbox, outbox, lifeline) -> None:
    """Writer process loop. First message in: ``("spec", WriterSpec)`` (or ``("quit",)``),
    then ``("batch", BatchResult)``, ``("commit",)``,
    ``("finish", max_reject_fraction)``, ``("abort",)``. Messages out: ``("ready", next_batch, samples per split)``,
    ``("ack", index, samples, bytes)``, ``("committed", record)``, ``("done", summary)``,
    ``("error", text)``.

    Ctrl-C reaches the whole process group; the writer ignores it and lets the driver
    decide (it sends ``abort``). If the driver dies (``kill -9``), the writer commits what
    it has and exits, so the next run resumes from there.

    ``lifeline`` is the read end of a pipe whose only write end the driver holds and never
    writes to: it turns readable (EOF) exactly when the driver is gone. The parent pid does
    not tell, as the writer's parent is the fork server, and the fork server itself lives
    as long as anyone (this writer too) holds its own liveness pipe.
    """
    signal.signal(signal.SIGINT, signal.SIG_IGN)

    def driver_gone() -> bool:
        return lifeline.poll()

    spec = _wait_for_spec(inbox, driver_gone)
    if spec is None:
        return
    if spec.cwd:
        os.chdir(spec.cwd)
    if spec.umask is not None:
        os.umask(spec.umask)
    w = None
    commits = 0
    try:
        w = OutputWriter(spec)
        outbox.put(("ready", w.next_batch, {name: st.n for name, st in w.splits.items()}))
        last_commit = time.monotonic()
        while True:
            try:
                msg = inbox.get(timeout=1.0)
            except queue.Empty:
                if driver_gone():
                    w.commit()
                    w.close()
                    return
                continue
            kind = msg[0]
            if kind == "batch":
                r: BatchResult = msg[1]
                n, _ = w.write_batch(r)
                outbox.put(("ack", r.index, n, r.packed.nbytes))
                if r.final_part and time.monotonic() - last_commit >= spec.commit_every:
                    outbox.put(("committed", w.commit()))
                    commits += 1
                    last_commit = time.monotonic()
                    _pause_point(spec, f"commit:{commits}")
            elif kind == "commit":
                outbox.put(("committed", w.commit()))
                last_commit = time.monotonic()
            elif kind == "finish":
                outbox.put(("done", w.finalize(max_reject_fraction=msg[1])))
                # Everything is closed and renamed: skip the interpreter's teardown (~40 ms
                # with h5py loaded) that the driver would otherwise wait for in join().
                sys.stdout.flush()
                sys.stderr.flush()
                os._exit(0)
            elif kind == "abort":
                outbox.put(("committed", w.commit()))
                w.close()
                outbox.put(("aborted", None))
                return
    except BaseException as e:
        outbox.put(("error", _error_text(e, spec)))
        if w is not None:
            try:
                w.close()
            except Exception:
                pass
