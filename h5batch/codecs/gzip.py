"""Codec ``gzip``: HDF5's shuffle (filter 2) + deflate (filter 1), the portable choice.

Every HDF5 tool reads it (h5py without hdf5plugin, h5dump, MATLAB, netCDF-4). The Python
encoder uses ISA-L (``isal``) when installed: its streams are plain deflate, which HDF5's
gzip filter reads, and it is much faster than zlib at a similar ratio. Without ``isal`` it
falls back to zlib, whose output is also what HDF5 itself would write.
"""

from __future__ import annotations

import zlib
from collections.abc import Callable
from typing import Any

import numpy as np

from .base import FILTER_SHUFFLE, Codec, DecodeStep, Encoder, register, shuffle_bytes, uses_shuffle

FILTER_DEFLATE = 1  # h5py.h5z.FILTER_DEFLATE


def deflater(level: int) -> Callable[[Any], bytes]:
    """A zlib-stream compressor: ISA-L when installed, else zlib. ISA-L has three levels:
    1-3 / 4-6 / 7-9 map to its 1 / 2 / 3; level 0 (stored blocks) always goes to zlib."""
    if level > 0:
        try:
            from isal import isal_zlib
        except ImportError:
            pass
        else:
            isal_level = 1 if level <= 3 else 2 if level <= 6 else 3
            return lambda data: isal_zlib.compress(data, isal_level)
    return lambda data: zlib.compress(data, level)


class InflateStep(DecodeStep):
    filter_id = FILTER_DEFLATE

    def decode(self, raw: Any, nbytes: int) -> tuple[Any, str]:
        try:
            from isal import isal_zlib  # faster than zlib at inflating too
        except ImportError:
            return zlib.decompress(raw, bufsize=max(nbytes, 1)), ""
        return isal_zlib.decompress(raw, bufsize=max(nbytes, 1)), ""


class GzipCodec(Codec):
    name = "gzip"
    default_level = 4
    levels = range(0, 10)
    filter_ids = (FILTER_SHUFFLE, FILTER_DEFLATE)
    steps = (InflateStep(),)

    def dataset_kwargs(self, level: int | None, shuffle: bool, itemsize: int) -> dict[str, Any]:
        return {"compression": "gzip", "compression_opts": level, "shuffle": uses_shuffle(shuffle, itemsize)}

    def encoder(self, level: int | None, shuffle: bool, dtype: np.dtype) -> Encoder | None:
        deflate = deflater(level)
        if uses_shuffle(shuffle, dtype.itemsize):
            return lambda a: deflate(shuffle_bytes(a))
        return lambda a: deflate(a)


register(GzipCodec())
