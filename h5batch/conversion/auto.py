"""Settings chosen from a trial of the corpus's samples: ``codec: auto`` and
``batch_size: auto`` (both the defaults).

The trial (:mod:`.trial`) decodes 32 items spread evenly over the manifest (at most 4 MB per
field) on a worker of the run; spread, because a corpus sorted by class starts with one kind
of file. Batch size and ratio depend only on those samples and the manifest, never on the
worker count or timing; the codec also on this machine's RAM and the output's file system. A
resumed run keeps the codecs of the run it resumes (the commit record), so one file never
mixes codecs.

Codec
-----
Decoded media compresses little (ratios in ``docs/benchmarks.md``). Where reads come from
decides whether a codec pays: an output that fits in the page cache is read at memory speed
every epoch after the first, where a memory copy beats any decode; a larger one, or one on a
network file system, is read from storage every epoch, assumed at most
:data:`STORAGE_GBPS` (a local NVMe disk; networks and object storage are slower), which
Blosc2-LZ4 outdecodes on one core, so reading ``1/r`` of the bytes saves time once ``r`` is
worth it. Per field, with ``r`` the trial's Blosc2-LZ4 ratio:

* ``r`` under :data:`MIN_RATIO`: ``none``;
* ``output.prefer: speed`` (default): Blosc2-LZ4 when ``r >= STORAGE_RATIO`` and the
  reads come from storage: the estimated output (trial bytes per item x items) is larger
  than half this machine's RAM, or its folder is on a network file system
  (:func:`network_fs`); else ``none``;
* ``output.prefer: size``: Blosc2-LZ4 wherever ``r`` reaches :data:`MIN_RATIO`.

No timing enters the rule, so a rerun on the same machine chooses the same. The reasoning,
with its assumption, is stored as each dataset's ``codec_choice`` attribute
(:meth:`CodecChoice.why`). ``output.codec`` forces a codec (``gzip`` for tools without
hdf5plugin).

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

import dataclasses
import math
import os
from dataclasses import dataclass, field

import numpy as np

from ..codecs import AUTO_CODEC, CodecSpec, get
from ..config import JobConfig
from ..errors import ConfigError
from ..fields import (
    fixed_sample_shape,
    rows_per_chunk,
)
from ..fields.audio import rate_unknown, with_true_lengths
from ..manifest import Manifest
from .trial import TRIAL_BYTES, Trial, TrialRunner, run_here

MIN_RATIO = 1.15  # keep compression when it saves at least ~13 % of the bytes
STORAGE_RATIO = 1.5  # from here compression pays on reads from storage (module docstring)
STORAGE_GBPS = 2.0  # assumed read speed of storage: a local NVMe disk (networks are slower)
NETWORK_FS = {"nfs", "nfs4", "cifs", "smb3", "smbfs", "lustre", "gpfs", "beegfs", "ceph", "glusterfs", "9p",
              "afs", "davfs"}
TARGET_BATCH_BYTES = 16 << 20  # decoded bytes per batch of the local engine
TARGET_TASK_BYTES = 32 << 20  # decoded bytes per Dask task (each costs the scheduler too)
MIN_BATCH, MAX_BATCH = 4, 1024  # items per batch
MIN_BATCHES = 8


@dataclass(frozen=True)
class Reads:
    """Where an output's reads will come from, as :func:`choose` judges it."""

    output_bytes: int  # estimated (trial bytes per item x items)
    ram_bytes: int
    network: str | None = None  # the file system type, where the output's folder is on a network one

    @property
    def from_storage(self) -> bool:
        return self.network is not None or self.output_bytes > self.ram_bytes // 2

    def words(self) -> str:
        if self.network:
            return f"the output's folder is on a network file system ({self.network})"
        # Not the RAM's size: the stored text must not differ between two machines that decide alike.
        size = f"the output (~{_human(self.output_bytes)} estimated)"
        return f"{size} is larger than half this machine's RAM" if self.from_storage else f"{size} fits in half the RAM"


def _human(n: float) -> str:
    for unit in ("B", "KB", "MB", "GB"):
        if n < 1000:
            return f"{n:.0f} {unit}"
        n /= 1000
    return f"{n:.1f} TB"


@dataclass(frozen=True)
class CodecChoice:
    """The codec of one field, and for ``auto`` what the trial found."""

    field: str
    codec: CodecSpec
    ratio: float | None = None  # trial compression ratio (auto only)
    samples: int = 0  # samples in the trial
    prefer: str = "speed"
    reads: Reads | None = None  # None: the ratio alone decided

    def why(self) -> str:
        """For ``auto``: why this codec (stored as the field's ``codec_choice`` attribute)."""
        if self.ratio is None:
            return ""
        shrank = f"{AUTO_CODEC} shrank {self.samples} trial samples spread over the corpus {self.ratio:.2f}x"
        if self.reads is None:  # below MIN_RATIO, or output.prefer: size (the wording of earlier files)
            return f"auto: {shrank}; threshold {MIN_RATIO:.2f}x"
        if self.ratio < STORAGE_RATIO:
            return (f"auto: none; {shrank}, under the {STORAGE_RATIO:.2f}x from which reading fewer bytes pays; "
                    "output.prefer: size compresses it")
        if self.reads.from_storage:
            return (f"auto: {self.codec.name}; {shrank}, and {self.reads.words()}: reads come from storage, "
                    f"assumed at most {STORAGE_GBPS:g} GB/s, where decoding costs less than reading the bytes "
                    "it saves")
        return (f"auto: none; {shrank}, but {self.reads.words()}: reads come from the page cache, where a "
                "memory copy beats a decode; output.prefer: size compresses it")

    def describe(self) -> str:
        """One line for the run's log: ``field: codec (why; the RAM it was judged against)``."""
        why = self.why() + (f"; RAM here: {_human(self.reads.ram_bytes)}" if self.reads else "")
        return f"{self.field}: {self.codec.label()}" + (f" ({why})" if why else "")


def network_fs(path: str) -> str | None:
    """The type of the network file system holding ``path``'s folder (the longest mount point
    above it, the last one mounted there), or None (a local one)."""
    import psutil

    folder = os.path.dirname(os.path.abspath(path))
    above = [p for p in psutil.disk_partitions(all=True)
             if folder == p.mountpoint or folder.startswith(p.mountpoint.rstrip("/") + "/")]
    kind = max(reversed(above), key=lambda p: len(p.mountpoint)).fstype if above else None
    return kind if kind and (kind in NETWORK_FS or kind.startswith("fuse.")) else None


def lz4_ratio(flat: np.ndarray, level: int | None, shuffle: bool) -> float:
    """Blosc2-LZ4's ratio on ``flat`` as the output would store it: written through HDF5's own
    Blosc2 filter into a file in memory, in chunks of the default 1 MiB."""
    import h5py

    kwargs = get(AUTO_CODEC).dataset_kwargs(5 if level is None else level, shuffle, flat.dtype.itemsize)
    with h5py.File("trial", "w", driver="core", backing_store=False) as f:
        ds = f.create_dataset("x", data=flat.reshape(-1), chunks=(min(flat.size, max(1, (1 << 20) // flat.itemsize)),),
                              **kwargs)
        stored = sum(ds.id.get_chunk_info(i).size for i in range(ds.id.get_num_chunks()))
    return flat.nbytes / max(1, stored)


def choose(ratio: float, reads: Reads | None, prefer: str) -> str:
    """The codec ``auto`` stores a field with (the rule in the module docstring): ``none`` or
    :data:`AUTO_CODEC`."""
    if ratio < MIN_RATIO:
        return "none"
    if prefer == "size":
        return AUTO_CODEC
    return AUTO_CODEC if ratio >= STORAGE_RATIO and reads is not None and reads.from_storage else "none"


def _flat(arrays: list[np.ndarray]) -> np.ndarray:
    """``arrays`` concatenated for the ratio, each with its first :data:`TRIAL_BYTES` at most:
    a long recording must not be copied whole in the driver (memory is bounded by the largest
    sample, not a multiple of it)."""
    return np.concatenate([a.reshape(-1)[: max(1, TRIAL_BYTES // a.itemsize)] for a in arrays])


@dataclass(frozen=True)
class AutoSettings:
    """What the job runs with once ``auto`` values are resolved."""

    codecs: dict[str, CodecChoice]
    batch_size: int
    item_bytes: int  # estimated decoded bytes of one item (all fields)
    field_bytes: dict[str, int] = field(default_factory=dict)  # the same per field (0: not estimated)
    rates: dict[str, int] = field(default_factory=dict)  # audio fields without sample_rate: the corpus's

    def run_job(self, job: JobConfig) -> JobConfig:
        """``job`` as the decoders and the writer run it: each audio field without a
        ``sample_rate`` has the corpus's (so the output says it and a file at another rate is
        a reject naming both), and each padded one is followed by its true lengths
        (:class:`~h5batch.fields.audio.TrueLength`). Its hash and the job stored in the
        output stay the user's."""
        fields = {n: dataclasses.replace(fc, sample_rate=self.rates[n]) if n in self.rates else fc
                  for n, fc in job.fields.items()}
        return dataclasses.replace(job, fields=with_true_lengths(fields))

    def describe(self, job: JobConfig) -> list[str]:
        lines = []
        if job.output.codec == "auto":
            lines.append("codec auto: " + "; ".join(c.describe() for c in self.codecs.values()))
        if job.cluster.batch_size == "auto":
            lines.append(f"batch_size auto: {self.batch_size} items per task "
                         f"(~{self.batch_size * self.item_bytes / 2**20:.1f} MB decoded)")
        return lines


def resolve(job: JobConfig, manifest: Manifest, keep: dict[str, CodecSpec] | None = None,
            run_trial: TrialRunner | None = None, known_rates: dict[str, int] | None = None) -> AutoSettings:
    """The codec of every field, the items per batch (``auto`` or as configured) and the
    sample rate of audio fields that set none (:meth:`AutoSettings.run_job`); ``keep``:
    fields whose codec is fixed already (a sync appends to existing datasets), which get no
    codec trial; ``known_rates``: the rates such a file stores; ``run_trial``: runs
    :meth:`.trial.Trial.run` with the given arguments where the run's decoders are (default:
    here). Trial files that differ in rate refuse the job (:class:`ConfigError` naming
    ``sample_rate``): one array of several rates would lose every clip's own."""
    o = job.output
    keep = keep or {}
    known_rates = {n: r for n, r in (known_rates or {}).items() if r}
    unknown = [n for n, fc in job.fields.items() if rate_unknown(fc) and n not in known_rates]
    fixed = {name: fixed_sample_shape(fc) for name, fc in job.fields.items()}
    need = []
    if o.codec == "auto":
        need = [name for name in job.fields if name not in keep]
    # Variable fields always: the trial's bytes per sample size a batch (batch_size auto) and
    # the chunks of a small split (writer/store.py), so the file's layout never depends on
    # whether a codec or a batch size was given.
    need += [name for name, f in fixed.items() if f is None and name not in need and name not in keep]
    need += [name for name in unknown if name not in need]
    trial = (run_trial or run_here)(job, os.path.abspath(manifest.root), Trial.items(manifest), need) \
        if need else Trial({})

    field_bytes = _field_bytes(job, fixed, trial.arrays)
    item_bytes = max(1, sum(field_bytes.values()))  # all fields (at least 1: it divides)
    rates = dict(known_rates)
    for name in unknown:
        seen = sorted(set(trial.rates.get(name, ())))
        if len(seen) > 1:
            raise ConfigError(job.file, f"fields.{name}.sample_rate",
                              f"is not set and the corpus's files differ in sample rate ({', '.join(f'{r} Hz' for r in seen)} "
                              f"among {len(trial.rates[name])} trial files): set it, with resample: true, to store "
                              f"them at one rate (e.g. --set fields.{name}.sample_rate={seen[-1]} "
                              f"--set fields.{name}.resample=true)")
        if seen:
            rates[name] = seen[0]

    if o.codec != "auto":
        codecs = {name: CodecChoice(name, CodecSpec(o.codec, o.level, o.shuffle)) for name in job.fields}
    else:
        import psutil

        reads = Reads(item_bytes * len(manifest.items), psutil.virtual_memory().total, network_fs(o.path))
        codecs = {}
        for name in job.fields:
            if name in keep:
                codecs[name] = CodecChoice(name, keep[name])
                continue
            arrays = trial.arrays.get(name) or []
            ratio = lz4_ratio(_flat(arrays), o.level, o.shuffle) if arrays else 1.0
            chosen = choose(ratio, reads, o.prefer)
            weighed = reads if ratio >= MIN_RATIO and o.prefer == "speed" else None
            codecs[name] = CodecChoice(name, CodecSpec(chosen, o.level if chosen != "none" else None, o.shuffle),
                                       round(ratio, 3), len(arrays), o.prefer, weighed)

    return AutoSettings(codecs, _batch_size(job, manifest, item_bytes, fixed), item_bytes, field_bytes, rates)


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
