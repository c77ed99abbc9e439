"""``FieldInfo``: what the reader knows about one field of a split, read once from the file's
layout (dataset shapes, chunking, the field's kind's reader hooks), never from sample data."""

from __future__ import annotations

from dataclasses import dataclass

import h5py
import numpy as np

from .. import format as fmt
from ..fields import reader_hooks


@dataclass(frozen=True)
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
