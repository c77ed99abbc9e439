"""Codec ``lzf``: h5py's built-in LZF filter (32000), with HDF5's shuffle in front.

Only h5py reads it (the filter ships inside h5py, not with HDF5). There is no Python LZF
encoder here, so HDF5 compresses these chunks itself in the writer (single-threaded), and no
decode step, so readers go through HDF5's filter pipeline: lzf is kept for files that must
open in plain h5py without hdf5plugin, not for speed.
"""

from __future__ import annotations

from typing import Any

from .base import FILTER_SHUFFLE, Codec, register, uses_shuffle

FILTER_LZF = 32000  # h5py.h5z.FILTER_LZF


class LzfCodec(Codec):
    name = "lzf"
    filter_ids = (FILTER_SHUFFLE, FILTER_LZF)

    def dataset_kwargs(self, level: int | None, shuffle: bool, itemsize: int) -> dict[str, Any]:
        return {"compression": "lzf", "shuffle": uses_shuffle(shuffle, itemsize)}


register(LzfCodec())
