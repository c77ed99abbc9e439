"""The direct paths of decoding: which fields a batch reads without a decoder library.

A field kind may offer a ``direct_reader`` (a whole file read into a row of shared memory
in one call: a fixed-length field) and a ``direct_loader`` (a whole file read into a new
array in one call: a field whose samples vary in size); :mod:`h5batch.fields.wav_direct`
gives both for a plain mono 16-bit WAV. Each declines a file it cannot take exactly, and
the ordinary decode (:func:`h5batch.fields.decode_field`) runs instead. The worker asks
for them once per batch (:class:`~.worker._ItemPlan`); :func:`sample_decoders` wraps them
for the codec trial (:class:`~.trial.Trial`), whose samples are the batches' own.
"""

from __future__ import annotations

from functools import partial

import numpy as np

from ..fields import decode_field, fixed_sample_shape, kind_of, reads_files

__all__ = ["direct_readers", "direct_loaders", "sample_decoders"]


def direct_readers(fields: tuple) -> list | None:
    """Per field of ``fields`` (``(name, config)`` pairs) the kind's ``direct_reader``
    (a read of the whole file into a row in one call, e.g. :mod:`h5batch.fields.wav_direct`),
    or None; None when no field has one."""
    out = []
    for _, fc in fields:
        hook = getattr(kind_of(fc), "direct_reader", None) if reads_files(fc) else None
        out.append(hook(fc) if hook is not None else None)
    return out if any(r is not None for r in out) else None


def direct_loaders(fields: tuple) -> list | None:
    """Per field of ``fields`` the kind's ``direct_loader`` (a read of the whole file into
    a new array in one call, for a field whose samples vary in size, e.g.
    :func:`h5batch.fields.wav_direct.load`), or None; None when no field has one."""
    out = []
    for _, fc in fields:
        hook = getattr(kind_of(fc), "direct_loader", None) if reads_files(fc) else None
        out.append(hook(fc) if hook is not None else None)
    return out if any(r is not None for r in out) else None


def sample_decoders(fields: tuple) -> list:
    """Per field of ``fields`` (fields of files), a call ``decode(path)`` that decodes one
    file the way this job's batches do (the field's direct reader, its direct loader, the
    ordinary decode where they decline or there are none), each returning the sample in an
    array of its own. For the codec trial (:class:`~.trial.Trial`)."""
    readers = direct_readers(fields) or [None] * len(fields)
    loaders = direct_loaders(fields) or [None] * len(fields)
    out = []
    for (_, fc), read, load in zip(fields, readers, loaders):
        if read is not None:
            shape, dtype = fixed_sample_shape(fc)
            out.append(partial(_into_row, fc=fc, read=read, shape=shape, dtype=dtype))
        elif load is not None:
            out.append(partial(_loaded, fc=fc, load=load))
        else:
            out.append(partial(_decoded, fc=fc))
    return out


def _into_row(path: str, fc, read, shape, dtype) -> np.ndarray:
    row = np.empty(shape, dtype)
    return row if read(path, row) else decode_field(path, fc)


def _loaded(path: str, fc, load) -> np.ndarray:
    a = load(path)
    return a if a is not None else decode_field(path, fc)


def _decoded(path: str, fc) -> np.ndarray:
    return decode_field(path, fc)
