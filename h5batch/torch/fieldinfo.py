"""What the reader knows about each field of a split: its layout (:class:`FieldInfo`, read
once from the file's layout: dataset shapes, chunking, the field's kind's reader hooks, never
from sample data), and for ``store: encoded`` how a batch column of stored bytes becomes the
column decoded storage would have given (:class:`EncodedColumn`), decoded per sample in the
process that reads (each DataLoader worker, or the main process with ``num_workers=0``).

Rule: :class:`H5Dataset` reads an encoded field like any variable-length uint8 field (as
stored: no ``as_float``, no axes moved), then :meth:`EncodedColumn.column` replaces its column.
The decoded column follows the same rules as a stored one: a fixed shape (an image field
with ``size``, audio with ``length``) gives a ``(B, *shape)`` tensor, anything else a
zero-padded :class:`~h5batch.torch.batch.Ragged`; ``as_float`` and ``channels_first`` are
the field's kind's answers for the *decoded* dtype and rank. Reason: a training script
must not care how a field was stored. Decoding is the kind's own decoder with the field's
recorded settings (:func:`h5batch.fields.stored_decoder`), so the arrays are the ones
``store: decoded`` would have stored.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence
from typing import Any

import h5py
import numpy as np
import torch

from .. import format as fmt
from ..errors import CorruptFileError, DecodeError
from ..fields import reader_hooks, stored_decoder
from .batch import Ragged, empty_columns, float_copy


@dataclasses.dataclass(frozen=True)
class FieldInfo:
    """What the reader needs to know about one field (read once, at construction).

    ``shape`` is the per-sample shape of a fixed field (``()`` for a variable one);
    ``chunk_len`` is rows per chunk (fixed) or elements per ``values`` chunk (variable);
    ``chunk_nbytes`` the uncompressed size of one chunk. ``float_scale`` and
    ``channels_first_axes`` are the field's kind's answers (:func:`h5batch.fields.reader_hooks`).
    """

    name: str
    kind: str
    modality: str
    dtype: np.dtype
    shape: tuple[int, ...]
    ndim: int
    chunk_len: int
    chunk_nbytes: int
    num_values: int = 0
    float_scale: float | None = None
    channels_first_axes: tuple[int, ...] | None = None

    @property
    def fixed(self) -> bool:
        return self.kind == fmt.KIND_FIXED


def field_info(g: h5py.Group, name: str) -> FieldInfo:
    """The :class:`FieldInfo` of field ``name`` of split group ``g``."""
    obj = g[name]
    kind = obj.attrs.get("kind", fmt.KIND_VARIABLE if isinstance(obj, h5py.Group) else fmt.KIND_FIXED)
    modality = str(obj.attrs.get("modality", ""))
    if kind == fmt.KIND_FIXED:
        chunk = obj.chunks or obj.shape
        nbytes = int(np.prod(chunk, dtype=np.int64)) * obj.dtype.itemsize
        return FieldInfo(name, kind, modality, obj.dtype, tuple(obj.shape[1:]), obj.ndim - 1,
                         int(chunk[0]), nbytes, 0, *reader_hooks(modality, obj.dtype, obj.ndim - 1))
    values = obj[fmt.VALUES]
    chunk = values.chunks or values.shape
    ndim = int(obj.attrs.get("ndim", obj[fmt.SHAPES].shape[1]))
    return FieldInfo(name, kind, modality, values.dtype, (), ndim,
                     int(max(chunk[0], 1)), int(max(chunk[0], 1)) * values.dtype.itemsize,
                     int(values.shape[0]), *reader_hooks(modality, values.dtype, ndim))


@dataclasses.dataclass(frozen=True)
class EncodedColumn:
    """How one encoded field's bytes become its column (picklable)."""

    path: str
    where: str
    decode: Any  # h5batch.fields.encoded.StoredDecoder
    ndim: int

    def _samples(self, raw: Ragged, idx: np.ndarray) -> list[np.ndarray]:
        out = []
        for j in range(len(raw)):
            data = np.ascontiguousarray(raw.item(j).numpy())
            try:
                out.append(self.decode(data))
            except DecodeError as e:
                raise CorruptFileError(self.path, self.where, f"the stored encoded sample does not decode "
                                                              f"({e.reason})", row=int(idx[j])) from None
        return out

    def column(self, raw: Ragged, idx: np.ndarray, as_float: bool, channels_first: bool, shared: bool,
               pool: Any) -> torch.Tensor | Ragged:
        samples = self._samples(raw, idx)
        fixed = self.decode.fixed
        dtype = np.dtype(fixed[1] if fixed else samples[0].dtype if samples else np.uint8)
        kind = self.decode.kind
        scale = kind.float_scale(dtype) if as_float else None
        cf = kind.channels_first_axes(self.ndim) if channels_first else None
        perm = list(cf) if cf is not None else list(range(self.ndim))
        inverse = [int(a) for a in np.argsort(perm)]
        shapes = np.asarray([a.shape for a in samples], dtype=np.int64).reshape(len(samples), self.ndim)
        biggest = np.asarray(fixed[0]) if fixed else (shapes.max(axis=0) if len(samples) else np.zeros(self.ndim, int))
        out_dtype = np.dtype(np.float32) if scale else dtype
        out = empty_columns([((len(samples), *(int(n) for n in biggest[perm])), out_dtype)], shared, pool)[0]
        view = out.numpy()
        if not fixed:
            view.fill(0)
        copy = float_copy(scale) if scale else np.copyto
        for j, a in enumerate(samples):
            if a.dtype != dtype or a.ndim != self.ndim:
                raise CorruptFileError(self.path, self.where, f"decoded to {a.dtype} {a.shape}, other samples "
                                                              f"to {dtype} of rank {self.ndim}", row=int(idx[j]))
            dst = view[(j, *(slice(0, int(n)) for n in np.asarray(a.shape)[perm]))].transpose(inverse)
            copy(dst, a)
        return out if fixed else Ragged(out, shapes[:, perm])


def encoded_fields(g: Any, fields: Sequence[FieldInfo],
                   path: str) -> tuple[tuple[FieldInfo, ...], dict[str, EncodedColumn]]:
    """``(fields, decoders)`` for a split group ``g``: every encoded field's ``FieldInfo``
    set to read its bytes as stored, and its :class:`EncodedColumn` by name (empty for a
    file without encoded fields)."""
    out, decoders = [], {}
    for fi in fields:
        node = g[fi.name]
        dec = None if fi.fixed else stored_decoder(fi.modality, node.attrs)
        if dec is None:
            out.append(fi)
            continue
        out.append(dataclasses.replace(fi, float_scale=None, channels_first_axes=None))
        ndim = len(dec.fixed[0]) if dec.fixed else len(str(node.attrs.get("axes", "x")).split(","))
        decoders[fi.name] = EncodedColumn(path, node.name, dec, ndim)
    return tuple(out), decoders
