"""Settings chosen from a trial of the corpus's samples: ``codec: auto`` and
``batch_size: auto`` (both the defaults).

The trial (:mod:`.trial`) decodes 32 items spread evenly over the manifest (at most 4 MB per
field) on a worker of the run; spread, because a corpus sorted by class starts with one kind
of file. Batch size and ratio depend only on those samples and the manifest, never on the
worker count or timing. The codec also depends on two speeds measured here, so a rerun on a
busy machine may choose otherwise when the rule is close. A resumed run keeps the codecs of
the run it resumes (the commit record), so one file never mixes codecs.

Codec
-----
Decoded media compresses little (ratios in ``docs/benchmarks.md``) and training reads the
same file from the page cache every epoch, where an uncompressed chunk costs a memory copy
and a compressed one a decode. Per field, with ``r`` the trial's Blosc2-LZ4 ratio:

* ``r`` under :data:`MIN_RATIO`: ``none`` (no timing done);
* ``output.prefer: speed`` (default): Blosc2-LZ4 only when
  ``1 / decode_speed < (1 - 1/r) / copy_speed``, both speeds measured on the trial's samples
  (:func:`h5batch.codecs.lz4_trial.speeds`, one core, best of ``TIMING_ROUNDS`` interleaved
  rounds). Audio and photos usually end up ``none`` (chunks mapped in place);
* ``output.prefer: size``: Blosc2-LZ4 wherever ``r`` reaches :data:`MIN_RATIO` (for corpora
  larger than RAM or slow network storage, where the cache is cold).

:meth:`CodecChoice.why` (stored as each dataset's ``codec_choice`` attribute) gives only
figures the samples fix; the measured speeds go to the log only, since a rerun must write the
same file. ``output.codec`` forces a codec (``gzip`` for tools without hdf5plugin).

Batch size
----------
A Dask task costs driver, scheduler and worker several ms of CPU, a local-engine batch one
pipe round trip, and a short clip decodes much faster; so ``auto`` puts about
:data:`TARGET_BATCH_BYTES` of decoded samples in a local batch (``cluster.kind: processes``)
and :data:`TARGET_TASK_BYTES` in a Dask task, but makes at least :data:`MIN_BATCHES` batches
so workers and writer overlap. The count is rounded down to whole chunks of every fixed-shape
field (:func:`whole_chunks`).
"""

from __future__ import annotations

import math
import os
from dataclasses import dataclass, field

import numpy as np

from ..codecs import AUTO_CODEC, CodecSpec, lz4_trial
from ..config import JobConfig
from ..fields import (
    fixed_sample_shape,
    rows_per_chunk,
)
from ..manifest import Manifest
from .trial import TRIAL_BYTES, Trial, TrialRunner, run_here

MIN_RATIO = 1.15  # keep compression when it saves at least ~13 % of the bytes
TARGET_BATCH_BYTES = 16 << 20  # decoded bytes per batch of the local engine
TARGET_TASK_BYTES = 32 << 20  # decoded bytes per Dask task (each costs the scheduler too)
MIN_BATCH, MAX_BATCH = 4, 1024  # items per batch
MIN_BATCHES = 8


@dataclass(frozen=True)
class CodecChoice:
    """The codec of one field, and for ``auto`` what the trial measured."""

    field: str
    codec: CodecSpec
    ratio: float | None = None  # trial compression ratio (auto only)
    samples: int = 0  # samples in the trial
    decode_gbps: float | None = None  # AUTO_CODEC's decode speed per core on the trial, GB/s
    copy_gbps: float | None = None  # memory copy speed on the trial, GB/s
    prefer: str = "speed"

    def why(self) -> str:
        """For ``auto``: why this codec (stored as the field's ``codec_choice`` attribute).

        Only figures the samples fix (the ratio, and the break-even ``1 / (1 - 1/ratio)``): measured
        speeds vary between runs and a rerun must write the same file; they go to the log
        (:meth:`describe`).
        """
        if self.ratio is None:
            return ""
        shrank = f"{AUTO_CODEC} shrank {self.samples} trial samples spread over the corpus {self.ratio:.2f}x"
        if (self.ratio < MIN_RATIO or self.prefer == "size" or self.decode_gbps is None
                or self.copy_gbps is None):
            # The ratio alone decided (the rule before output.prefer): the wording of those files.
            return f"auto: {shrank}; threshold {MIN_RATIO:.2f}x"
        pays = (f"it pays where decoding runs at least {break_even(self.ratio):.2f}x as fast as a memory copy, "
                "page cache hot")
        if self.codec.name == "none":
            return (f"auto: none; {shrank}, but decoding it costs more than reading the bytes it saves "
                    f"({pays}); output.prefer: size keeps it")
        return f"auto: {self.codec.name}; {shrank}, and decoding it costs less than reading the bytes it saves ({pays})"

    def measured(self) -> str:
        """The speeds the decision used, for the log ("" when none were measured)."""
        if self.ratio is None or self.decode_gbps is None or self.copy_gbps is None:
            return ""
        return (f"{AUTO_CODEC} decodes at {self.decode_gbps:.2f} GB/s per core "
                f"({decode_cost(self.decode_gbps):.3g} s/GB) against a {read_saving(self.ratio, self.copy_gbps):.3g} "
                f"s/GB saving in reading (memory copy {self.copy_gbps:.1f} GB/s)")

    def describe(self) -> str:
        """One line for the run's log: ``field: codec (why; measured)``."""
        why = "; measured here: ".join(t for t in (self.why(), self.measured()) if t)
        return f"{self.field}: {self.codec.label()}" + (f" ({why})" if why else "")


def break_even(ratio: float) -> float:
    """How many times faster than a memory copy decoding must run for a codec that shrinks the
    samples ``ratio`` times to pay: ``1 / (1 - 1/ratio)`` (infinite at 1x)."""
    return math.inf if ratio <= 1.0 else 1.0 / (1.0 - 1.0 / ratio)


def decode_cost(decode_gbps: float) -> float:
    """Seconds per GB of samples spent decoding them."""
    return 1.0 / max(decode_gbps, 1e-9)


def read_saving(ratio: float, copy_gbps: float) -> float:
    """Seconds per GB of samples that reading ``1/ratio`` of the bytes saves, when reading is a
    memory copy (page cache hot)."""
    return (1.0 - 1.0 / max(ratio, 1.0)) / max(copy_gbps, 1e-9)


def choose(ratio: float, decode_gbps: float | None, copy_gbps: float | None, prefer: str) -> str:
    """The codec ``auto`` stores a field with, from the trial's figures (the rule in the module
    docstring): ``none`` or :data:`AUTO_CODEC`. Speeds of None (not measured) count as a
    decode too slow to pay."""
    if ratio < MIN_RATIO:
        return "none"
    if prefer == "size":
        return AUTO_CODEC
    if decode_gbps is None or copy_gbps is None:
        return "none"
    return AUTO_CODEC if decode_cost(decode_gbps) < read_saving(ratio, copy_gbps) else "none"


def _flat(arrays: list[np.ndarray]) -> np.ndarray:
    """``arrays`` concatenated for the ratio, each with its first :data:`TRIAL_BYTES` at most:
    a long recording must not be copied whole in the driver (memory is bounded by the largest
    sample, not a multiple of it)."""
    return np.concatenate([a.reshape(-1)[: max(1, TRIAL_BYTES // a.itemsize)] for a in arrays])


def measure(arrays: dict[str, list[np.ndarray]], level: int | None, shuffle: bool) -> dict[str, lz4_trial.Figures]:
    """Ratio and speeds per field that has trial samples (:func:`lz4_trial.measure`)."""
    fields = {name: (_flat(a), a) for name, a in arrays.items() if a}
    return lz4_trial.measure(fields, level, shuffle, MIN_RATIO) if fields else {}


@dataclass(frozen=True)
class AutoSettings:
    """What the job runs with once ``auto`` values are resolved."""

    codecs: dict[str, CodecChoice]
    batch_size: int
    item_bytes: int  # estimated decoded bytes of one item (all fields)
    field_bytes: dict[str, int] = field(default_factory=dict)  # the same per field (0: not estimated)

    def describe(self, job: JobConfig) -> list[str]:
        lines = []
        if job.output.codec == "auto":
            lines.append("codec auto: " + "; ".join(c.describe() for c in self.codecs.values()))
        if job.cluster.batch_size == "auto":
            lines.append(f"batch_size auto: {self.batch_size} items per task "
                         f"(~{self.batch_size * self.item_bytes / 2**20:.1f} MB decoded)")
        return lines


def resolve(job: JobConfig, manifest: Manifest, keep: dict[str, CodecSpec] | None = None,
            run_trial: TrialRunner | None = None) -> AutoSettings:
    """The codec of every field and the items per batch (``auto`` or as configured);
    ``keep``: fields whose codec is fixed already (a sync appends to existing datasets),
    which get no codec trial; ``run_trial``: runs :meth:`.trial.Trial.run` with the given
    arguments where the run's decoders are (default: here)."""
    o = job.output
    keep = keep or {}
    fixed = {name: fixed_sample_shape(fc) for name, fc in job.fields.items()}
    need = []
    if o.codec == "auto":
        need = [name for name in job.fields if name not in keep]
    if job.cluster.batch_size == "auto":  # variable lengths: the trial estimates a batch's bytes
        need += [name for name, f in fixed.items() if f is None and name not in need]
    trial = (run_trial or run_here)(job, os.path.abspath(manifest.root), Trial.items(manifest), need) \
        if need else Trial({})

    field_bytes = _field_bytes(job, fixed, trial.arrays)
    item_bytes = _item_bytes(field_bytes)

    if o.codec != "auto":
        codecs = {name: CodecChoice(name, CodecSpec(o.codec, o.level, o.shuffle)) for name in job.fields}
    else:
        codecs = {}
        figures = measure({n: a for n, a in trial.arrays.items() if n not in keep}, o.level, o.shuffle)
        for name in job.fields:
            if name in keep:
                codecs[name] = CodecChoice(name, keep[name])
                continue
            ratio, *speeds = figures.get(name, (1.0, None, None))
            chosen = choose(ratio, *speeds, o.prefer)
            codecs[name] = CodecChoice(name, CodecSpec(chosen, o.level if chosen != "none" else None, o.shuffle),
                                       round(ratio, 3), len(trial.arrays.get(name) or []), *speeds, o.prefer)

    return AutoSettings(codecs, _batch_size(job, manifest, item_bytes, fixed), item_bytes, field_bytes)


def _field_bytes(job: JobConfig, fixed: dict, trial: dict[str, list[np.ndarray]]) -> dict[str, int]:
    """Decoded bytes of one item, per field: the fixed shapes', the trial's mean for the
    others (0 for a variable-length field the trial did not decode)."""
    out = {}
    for name in job.fields:
        f = fixed[name]
        if f is not None:
            out[name] = int(np.prod(f[0], dtype=np.int64)) * f[1].itemsize
        else:
            out[name] = int(np.mean([a.nbytes for a in trial[name]])) if trial.get(name) else 0
    return out


def _item_bytes(field_bytes: dict[str, int]) -> int:
    """Decoded bytes of one item, all fields (at least 1: it divides)."""
    return max(1, sum(field_bytes.values()))


def _batch_size(job: JobConfig, manifest: Manifest, item_bytes: int, fixed: dict) -> int:
    bs = job.cluster.batch_size
    if bs == "auto":
        target = TARGET_BATCH_BYTES if job.cluster.kind == "processes" else TARGET_TASK_BYTES
        bs = min(MAX_BATCH, max(MIN_BATCH, round(target / item_bytes)))
        bs = max(1, min(bs, math.ceil(len(manifest.items) / MIN_BATCHES)))
        bs = whole_chunks(bs, job, fixed)
    return int(bs)


def whole_chunks(bs: int, job: JobConfig, fixed: dict) -> int:
    """``bs`` rounded down to a multiple of the LCM of every fixed-shape field's rows per chunk,
    where it is at least that. Reason: a batch of whole chunks is stored straight from shared
    memory; a partial chunk is copied into the writer's chunk buffer.
    """
    ks = [rows_per_chunk(f[0], f[1], job.output.chunk_bytes) for f in fixed.values() if f is not None]
    step = math.lcm(*ks) if ks else 1
    return bs - bs % step if bs >= step else bs
