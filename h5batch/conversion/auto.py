"""Settings chosen from a trial of the corpus's samples: ``codec: auto`` and
``batch_size: auto`` (both the defaults).

The trial decodes :data:`TRIAL_ITEMS` items spread evenly over the manifest (at most
:data:`TRIAL_BYTES` per field) in the driver. Spread, not the first ones: a corpus sorted by
speaker or class starts with one kind of file, whose ratio need not be the corpus'. Both choices depend only on those samples
and on the manifest, never on the number of workers or on timing, so reruns, resumes and any
cluster choose the same and produce the same file.

Codec
-----
Decoded media compresses far less than people expect (the ratios per corpus are in
``docs/benchmarks.md``, "Figures behind design choices").
Compressing costs the writer (or the workers) CPU on every chunk and the reader a decode
on every chunk it touches; a field that shrinks by a few percent gains nothing for it. So
``auto`` keeps Blosc2-LZ4 for a field when it shrinks the trial at least :data:`MIN_RATIO`
times; otherwise the field is stored uncompressed (chunks written straight from shared
memory, read straight into the batch). Set ``output.codec`` to a codec name to force it
(``gzip`` for tools without hdf5plugin).

Batch size
----------
Each Dask task costs the driver and scheduler a fixed amount of CPU whatever its size,
and each batch a round trip through the writer, while a short clip decodes far faster than
that. So a task should carry megabytes: ``auto`` puts about :data:`TARGET_BATCH_BYTES` of
decoded samples in a batch, but cuts a small corpus into at least :data:`MIN_BATCHES`
batches so the workers and the writer overlap.
"""

from __future__ import annotations

import math
import os
import queue
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import numpy as np

from .. import faults
from ..codecs import AUTO_CODEC, CodecSpec
from ..config import JobConfig
from ..errors import DecodeError
from ..fields import decode_field, file_fields, fixed_sample_shape, value_array, value_fields
from ..manifest import Manifest
from .decoder_warnings import silenced

MIN_RATIO = 1.15  # keep compression when it saves at least ~13 % of the bytes
TRIAL_ITEMS = 32  # items decoded at most, spread over the manifest
TRIAL_BYTES = 4 << 20  # decoded bytes per field at most
TRIAL_WAVE = 4  # trial files decoded at once (at most the driver's cores)
TARGET_BATCH_BYTES = 16 << 20
MIN_BATCH, MAX_BATCH = 4, 1024  # items per batch
MIN_BATCHES = 8


@dataclass(frozen=True)
class CodecChoice:
    """The codec of one field, and for ``auto`` what the trial measured."""

    field: str
    codec: CodecSpec
    ratio: float | None = None  # trial compression ratio (auto only)
    samples: int = 0  # samples in the trial

    def why(self) -> str:
        """For ``auto``: why this codec (stored as the field's ``codec_choice`` attribute)."""
        if self.ratio is None:
            return ""
        return (f"auto: {AUTO_CODEC} shrank {self.samples} trial samples spread over the corpus "
                f"{self.ratio:.2f}x; threshold {MIN_RATIO:.2f}x")

    def describe(self) -> str:
        """One line for the run's log: ``field: codec (why)``."""
        why = self.why()
        return f"{self.field}: {self.codec.label()}" + (f" ({why})" if why else "")


@dataclass
class Trial:
    """Decoded trial samples per field (only fields that needed decoding)."""

    arrays: dict[str, list[np.ndarray]]

    @classmethod
    def run(cls, job: JobConfig, manifest: Manifest, fields: list[str]) -> Trial:
        """Decode the trial items of ``fields``. A file that fails, or takes longer than
        ``policy.decode_timeout`` (its thread is abandoned), is left out: the job itself
        rejects it later with its reason."""
        root = os.path.abspath(manifest.root)
        guard = _Deadline(job.policy.decode_timeout)
        out: dict[str, list[np.ndarray]] = {}
        n = len(manifest.items)
        picks = sorted({i * n // TRIAL_ITEMS for i in range(TRIAL_ITEMS)}) if n else []
        # Decoded a few at a time, in parallel: the workers wait for this trial, and a photo
        # takes long enough that a serial trial would show in a small conversion's time.
        # The arrays kept are exactly those a serial loop would keep; a wave may decode a
        # few items past TRIAL_BYTES, which are dropped.
        wave = max(1, min(TRIAL_WAVE, os.cpu_count() or 1))
        files, vals = file_fields(job.fields), value_fields(job.fields)
        for name in fields:
            fc = job.fields[name]
            if name in vals:  # annotation values: nothing to decode (discovery checked them)
                j = vals.index(name)
                out[name] = [value_array(manifest.items[i].values[j], fc) for i in picks]
                continue
            k = files.index(name)
            paths = [os.path.join(root, manifest.items[i].paths[k]) for i in picks]
            arrays: list[np.ndarray] = []
            nbytes = 0
            for start in range(0, len(paths), wave):
                if nbytes >= TRIAL_BYTES:
                    break
                for a in guard.decode_all(paths[start:start + wave], fc):
                    if a is None or nbytes >= TRIAL_BYTES:
                        continue
                    arrays.append(a)
                    nbytes += a.nbytes
            out[name] = arrays
        return cls(out)


class _TrialThreads:
    """Daemon threads that decode trial files, kept for the life of the process.

    Daemon threads, not an executor: one stuck on a stalled mount or a decoder in a loop is
    abandoned (and replaced) and must not keep the process from exiting. Kept, not started
    per file: a thread start waits for the new thread to get the GIL, up to the GIL's switch
    interval while Dask's event loop is busy, and the trial decodes up to 64 files.
    """

    def __init__(self) -> None:
        self.pid: int | None = None
        self.lock = threading.Lock()

    def run(self, jobs: list[Callable[[], None]], timeout: float) -> None:
        """Run ``jobs`` on up to :data:`TRIAL_WAVE` threads; return once all are done or
        ``timeout`` seconds have passed (the late ones are abandoned)."""
        with self.lock:
            if self.pid != os.getpid():  # threads do not survive a fork
                self.pid, self.queue, self.alive = os.getpid(), queue.SimpleQueue(), 0
            while self.alive < min(len(jobs), TRIAL_WAVE):
                threading.Thread(target=self._serve, args=(self.queue,), name="h5batch-trial", daemon=True).start()
                self.alive += 1
            q = self.queue
        events = []
        for job in jobs:
            ev = threading.Event()
            q.put((job, ev))
            events.append(ev)
        deadline = time.monotonic() + timeout
        late = sum(not ev.wait(max(0.0, deadline - time.monotonic())) for ev in events)
        if late:
            with self.lock:  # their threads may be stuck for good: start others next time
                self.alive = max(0, self.alive - late)

    @staticmethod
    def _serve(q: queue.SimpleQueue) -> None:
        while True:
            job, ev = q.get()
            try:
                job()
            except BaseException:  # noqa: S110  (a failed file is simply left out of the trial)
                pass
            finally:
                ev.set()


_THREADS = _TrialThreads()


class _Deadline:
    """Decodes trial files on :class:`_TrialThreads` and gives up on a file after
    ``timeout`` seconds: a stalled network mount or a decoder stuck in a loop must not hang
    the job here, before the workers' own watchdog is in play."""

    def __init__(self, timeout: float):
        self.timeout = timeout

    def decode_all(self, paths: list[str], fc: Any) -> list[np.ndarray | None]:
        """Decode ``paths`` in parallel; None for a file that failed or ran out of time
        (each has ``timeout`` seconds from the start of the call)."""
        boxes: list[list[Any]] = [[] for _ in paths]

        def work(path: str, box: list[Any]) -> None:
            try:
                faults.before_decode(path)
                box.append(decode_field(path, fc))
            except DecodeError:
                box.append(None)

        _THREADS.run([lambda p=p, b=b: work(p, b) for p, b in zip(paths, boxes)], self.timeout)
        return [b[0] if b else None for b in boxes]


def trial_ratio(arrays: list[np.ndarray], level: int | None, shuffle: bool) -> float:
    """Blosc2-LZ4 compression ratio of ``arrays`` concatenated, in 1 MiB pieces."""
    import blosc2

    flat = np.concatenate([a.reshape(-1) for a in arrays])
    itemsize = flat.dtype.itemsize
    raw = flat.view(np.uint8)
    filt = blosc2.Filter.SHUFFLE if shuffle and itemsize > 1 else blosc2.Filter.NOFILTER
    packed = 0
    step = 1 << 20
    for pos in range(0, raw.size, step):
        piece = raw[pos: pos + step]
        packed += len(blosc2.compress2(piece, typesize=itemsize, clevel=5 if level is None else level,
                                       codec=blosc2.Codec.LZ4, filters=[filt], nthreads=1))
    return raw.size / max(1, packed)


@dataclass(frozen=True)
class AutoSettings:
    """What the job runs with once ``auto`` values are resolved."""

    codecs: dict[str, CodecChoice]
    batch_size: int
    item_bytes: int  # estimated decoded bytes of one item (all fields)

    def describe(self, job: JobConfig) -> list[str]:
        lines = []
        if job.output.codec == "auto":
            lines.append("codec auto: " + "; ".join(c.describe() for c in self.codecs.values()))
        if job.cluster.batch_size == "auto":
            lines.append(f"batch_size auto: {self.batch_size} items per task "
                         f"(~{self.batch_size * self.item_bytes / 2**20:.1f} MB decoded)")
        return lines


def resolve(job: JobConfig, manifest: Manifest) -> AutoSettings:
    """The codec of every field and the items per batch (``auto`` or as configured)."""
    o = job.output
    fixed = {name: fixed_sample_shape(fc) for name, fc in job.fields.items()}
    need = []
    if o.codec == "auto":
        need = list(job.fields)
    elif job.cluster.batch_size == "auto":
        need = [name for name, f in fixed.items() if f is None]
    with silenced():  # the workers decode these files again and log their warnings
        trial = Trial.run(job, manifest, need)

    item_bytes = 0
    for name in job.fields:
        f = fixed[name]
        if f is not None:
            item_bytes += int(np.prod(f[0], dtype=np.int64)) * f[1].itemsize
        elif trial.arrays.get(name):
            item_bytes += int(np.mean([a.nbytes for a in trial.arrays[name]]))
    item_bytes = max(1, item_bytes)

    if o.codec != "auto":
        codecs = {name: CodecChoice(name, CodecSpec(o.codec, o.level, o.shuffle)) for name in job.fields}
    else:
        codecs = {}
        for name in job.fields:
            arrays = trial.arrays.get(name) or []
            ratio = trial_ratio(arrays, o.level, o.shuffle) if arrays else 1.0
            chosen = AUTO_CODEC if ratio >= MIN_RATIO else "none"
            codecs[name] = CodecChoice(name, CodecSpec(chosen, o.level if chosen != "none" else None, o.shuffle),
                                       round(ratio, 3), len(arrays))

    bs = job.cluster.batch_size
    if bs == "auto":
        bs = min(MAX_BATCH, max(MIN_BATCH, round(TARGET_BATCH_BYTES / item_bytes)))
        bs = max(1, min(bs, math.ceil(len(manifest.items) / MIN_BATCHES)))
    return AutoSettings(codecs, int(bs), item_bytes)
