"""Codec ``zstd``: HDF5's shuffle + the Zstd plugin filter (32015).

Readable by tools that load the HDF5 plugin (``import hdf5plugin`` or ``HDF5_PLUGIN_PATH``).
Encoded and decoded in Python with ``zstandard``, which releases the GIL.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from .base import FILTER_SHUFFLE, Codec, DecodeStep, Encoder, register, shuffle_bytes, uses_shuffle

FILTER_ZSTD = 32015  # registered HDF5 filter id of Zstandard


class UnzstdStep(DecodeStep):
    filter_id = FILTER_ZSTD

    library = "zstandard"

    def decode(self, raw: Any, nbytes: int) -> tuple[Any, str]:
        import zstandard

        # The plugin's frames may lack the content size: give the decompressor the bound.
        return zstandard.ZstdDecompressor().decompress(raw, max_output_size=max(nbytes, 1)), ""


class ZstdCodec(Codec):
    name = "zstd"
    default_level = 3
    levels = range(1, 23)
    filter_ids = (FILTER_SHUFFLE, FILTER_ZSTD)
    steps = (UnzstdStep(),)

    def dataset_kwargs(self, level: int | None, shuffle: bool, itemsize: int) -> dict[str, Any]:
        import hdf5plugin

        return {"shuffle": uses_shuffle(shuffle, itemsize), **hdf5plugin.Zstd(clevel=level)}

    def encoder(self, level: int | None, shuffle: bool, dtype: np.dtype) -> Encoder | None:
        import zstandard

        # zstandard's compressor objects are not thread-safe: one per call is cheap enough.
        if uses_shuffle(shuffle, dtype.itemsize):
            return lambda a: zstandard.ZstdCompressor(level=level).compress(shuffle_bytes(a))
        return lambda a: zstandard.ZstdCompressor(level=level).compress(a)


register(ZstdCodec())
