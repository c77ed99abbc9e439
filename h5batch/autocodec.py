"""The ``auto`` codec (the default): compress a field only where compression pays.

Decoded media compresses far less than people expect. Measured with Blosc2-LZ4 + byte
shuffle on the first samples of each corpus (``docs/benchmarks.md``):

==========================================  ============  =========
field                                       LZ4+shuffle   gzip-4
==========================================  ============  =========
FSDD speech, int16 (silence around digits)  1.23x         1.28x
hymenoptera photos, 224x224 RGB uint8       1.08x         1.27x
generated 2 s noisy/clean clips, int16      1.00x         1.04x
==========================================  ============  =========

Compressing costs the writer (or the workers) CPU on every chunk and the reader a decode
on every chunk it touches; a field that shrinks by a few percent gains nothing for it. So
``auto`` compresses a trial of each field's first samples with Blosc2-LZ4 + shuffle and
keeps that codec when it shrinks the trial at least :data:`MIN_RATIO` times; otherwise
the field is stored uncompressed (chunks written straight from shared memory, read
straight into the batch). The choice depends only on the first samples in manifest
order, so reruns, resumes and any number of workers choose the same. Set
``output.codec`` to a codec name to force it (``gzip`` for tools without hdf5plugin).
"""

from __future__ import annotations

import os
from dataclasses import dataclass

import numpy as np

from .codecs import CodecSpec
from .config import JobConfig
from .decode import DecodeError, decode_field
from .discover import Manifest

AUTO_CODEC = "blosc2-lz4"
MIN_RATIO = 1.15  # keep compression when it saves at least ~13 % of the bytes
TRIAL_ITEMS = 16  # samples decoded per field at most
TRIAL_BYTES = 4 << 20  # decoded bytes per field at most


@dataclass(frozen=True)
class CodecChoice:
    """The codec of one field, and for ``auto`` what the trial measured."""

    field: str
    codec: CodecSpec
    ratio: float | None = None  # trial compression ratio (auto only)
    samples: int = 0  # samples in the trial

    def describe(self) -> str:
        if self.ratio is None:
            return f"{self.field}: {self.codec.label()}"
        verdict = "compressed" if self.codec.name != "none" else "stored uncompressed"
        return (f"{self.field}: {self.codec.label()} ({AUTO_CODEC} shrinks its first {self.samples} "
                f"samples {self.ratio:.2f}x; {verdict}, threshold {MIN_RATIO:.2f}x)")


def trial_ratio(arrays: list[np.ndarray], level: int | None, shuffle: bool) -> float:
    """Blosc2-LZ4 compression ratio of ``arrays`` concatenated, in chunk-sized pieces."""
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


def choose_codecs(job: JobConfig, manifest: Manifest) -> dict[str, CodecChoice]:
    """The codec of every field (``output.codec`` unless it is ``auto``)."""
    o = job.output
    if o.codec != "auto":
        return {name: CodecChoice(name, CodecSpec(o.codec, o.level, o.shuffle)) for name in job.fields}
    out = {}
    root = os.path.abspath(manifest.root)
    for k, (name, fc) in enumerate(job.fields.items()):
        arrays: list[np.ndarray] = []
        nbytes = 0
        for item in manifest.items:
            if len(arrays) >= TRIAL_ITEMS or nbytes >= TRIAL_BYTES:
                break
            try:
                a = decode_field(os.path.join(root, item.paths[k]), fc)
            except DecodeError:
                continue  # the job rejects it later, with its reason
            arrays.append(a)
            nbytes += a.nbytes
        ratio = trial_ratio(arrays, o.level, o.shuffle) if arrays else 1.0
        name_ = AUTO_CODEC if ratio >= MIN_RATIO else "none"
        out[name] = CodecChoice(name, CodecSpec(name_, o.level if name_ != "none" else None, o.shuffle),
                                round(ratio, 3), len(arrays))
    return out
