"""Codec ``blosc2-lz4``: the Blosc2 plugin filter (32026) with LZ4 and byte shuffle.

The training-input default (what ``auto`` picks when a trial shows compression pays): fast
to write and to read. Readable by tools that load the HDF5 plugin (``import hdf5plugin``).
"""

from __future__ import annotations

from ._blosc2 import Blosc2Codec
from .base import register


class Blosc2Lz4Codec(Blosc2Codec):
    name = "blosc2-lz4"
    cname = "lz4"
    default_level = 5


register(Blosc2Lz4Codec())
