"""Codec ``blosc2-zstd``: the Blosc2 plugin filter (32026) with Zstd and byte shuffle.

Smaller files than ``blosc2-lz4`` at some write cost. Levels are Blosc2's 0..9 (Blosc2 maps
them onto Zstd's own levels); the plugin refuses anything above 9. Readable by tools that
load the HDF5 plugin (``import hdf5plugin``).
"""

from __future__ import annotations

from ._blosc2 import Blosc2Codec
from .base import register


class Blosc2ZstdCodec(Blosc2Codec):
    name = "blosc2-zstd"
    cname = "zstd"
    default_level = 3


register(Blosc2ZstdCodec())
