"""Codecs: the HDF5 filter pipeline of each codec, and the same encoding done in Python.

HDF5 runs filters in one thread under its global lock (h5py#591), so a writer that lets
HDF5 compress is bound to one core. For the codecs below we produce *exactly the bytes the
filter pipeline would store* with GIL-releasing libraries (zlib, zstandard, blosc2) in a
thread pool and store them with ``write_direct_chunk``. Every encoder is checked once per
process against HDF5 itself (:func:`self_check`): a codec whose check fails falls back to
HDF5's own pipeline, so a library upgrade can slow us down but never corrupt a file.

Portability (who can read the file):

=============  =========================================  ==================================
codec          filters                                    readable by
=============  =========================================  ==================================
none           -                                          any HDF5 tool
gzip           shuffle + deflate (filter 2, 1)            any HDF5 tool (h5py, MATLAB, h5dump)
lzf            lzf (32000)                                h5py only (built in)
zstd           shuffle + Zstd plugin (32015)              ``import hdf5plugin`` / HDF5_PLUGIN_PATH
blosc2-lz4     Blosc2 plugin (32026), LZ4 + byte shuffle  ``import hdf5plugin`` / HDF5_PLUGIN_PATH
blosc2-zstd    Blosc2 plugin (32026), Zstd + byte shuffle ``import hdf5plugin`` / HDF5_PLUGIN_PATH
=============  =========================================  ==================================
"""

from __future__ import annotations

import zlib
from collections.abc import Callable
from dataclasses import dataclass
from functools import cache
from typing import Any

import numpy as np

DEFAULT_LEVELS = {"gzip": 4, "zstd": 3, "blosc2-lz4": 5, "blosc2-zstd": 3, "lzf": None, "none": None}

Encoder = Callable[[np.ndarray], bytes]


@dataclass(frozen=True)
class CodecSpec:
    """A codec with its level and shuffle setting."""

    name: str
    level: int | None = None
    shuffle: bool = True

    @property
    def effective_level(self) -> int | None:
        return DEFAULT_LEVELS[self.name] if self.level is None else self.level

    def dataset_kwargs(self, itemsize: int) -> dict[str, Any]:
        """Keyword arguments for ``h5py.Group.create_dataset`` (filter pipeline)."""
        lvl = self.effective_level
        shuffle = self.shuffle and itemsize > 1
        if self.name == "none":
            return {}
        if self.name == "gzip":
            return {"compression": "gzip", "compression_opts": lvl, "shuffle": shuffle}
        if self.name == "lzf":
            return {"compression": "lzf", "shuffle": shuffle}
        import hdf5plugin

        if self.name == "zstd":
            return {"shuffle": shuffle, **hdf5plugin.Zstd(clevel=lvl)}
        b2_filter = hdf5plugin.Blosc2.SHUFFLE if shuffle else hdf5plugin.Blosc2.NOFILTER
        cname = "lz4" if self.name == "blosc2-lz4" else "zstd"
        return dict(hdf5plugin.Blosc2(cname=cname, clevel=lvl, filters=b2_filter))

    def label(self) -> str:
        lvl = self.effective_level
        return self.name + (f"-{lvl}" if lvl is not None else "") + ("+shuffle" if self.shuffle and self.name not in ("none",) else "")


def _shuffle(a: np.ndarray) -> np.ndarray:
    """HDF5's shuffle filter: byte k of every element together (a byte transpose)."""
    if a.itemsize == 1:
        return a.reshape(-1).view(np.uint8)
    return np.ascontiguousarray(a.reshape(-1).view(np.uint8).reshape(-1, a.itemsize).T)


def make_encoder(spec: CodecSpec, dtype: np.dtype) -> Encoder | None:
    """A function ``chunk array -> stored chunk bytes``, or None when only HDF5 can encode."""
    lvl = spec.effective_level
    shuffle = spec.shuffle and dtype.itemsize > 1
    if spec.name == "none":
        return lambda a: a.tobytes()
    if spec.name == "gzip":
        if shuffle:
            return lambda a: zlib.compress(_shuffle(a), lvl)
        return lambda a: zlib.compress(a, lvl)
    if spec.name == "zstd":
        import zstandard

        # zstandard's compressor objects are not thread-safe: one per call is cheap enough.
        if shuffle:
            return lambda a: zstandard.ZstdCompressor(level=lvl).compress(_shuffle(a))
        return lambda a: zstandard.ZstdCompressor(level=lvl).compress(a)
    if spec.name in ("blosc2-lz4", "blosc2-zstd"):
        import blosc2

        codec = blosc2.Codec.LZ4 if spec.name == "blosc2-lz4" else blosc2.Codec.ZSTD
        filt = blosc2.Filter.SHUFFLE if shuffle else blosc2.Filter.NOFILTER
        itemsize = dtype.itemsize

        def enc(a: np.ndarray) -> bytes:
            # The Blosc2 HDF5 filter stores each chunk as a Blosc2 super-chunk frame.
            cparams = {"typesize": itemsize, "clevel": lvl, "codec": codec, "filters": [filt], "nthreads": 1}
            return blosc2.SChunk(chunksize=a.nbytes, data=a, cparams=cparams).to_cframe()

        return enc
    return None


@cache
def self_check(spec: CodecSpec, dtype_str: str) -> bool:
    """Encode a test chunk in Python, store it with ``write_direct_chunk`` in an in-memory
    HDF5 file, read it back through HDF5's filter pipeline and compare."""
    import h5py

    dtype = np.dtype(dtype_str)
    enc = make_encoder(spec, dtype)
    if enc is None:
        return False
    rng = np.random.default_rng(0)
    test = (rng.integers(0, 50, size=(4, 1000)).cumsum(axis=1) % 251).astype(dtype)
    try:
        with h5py.File(f"selfcheck-{id(spec)}.h5", "w", driver="core", backing_store=False) as f:
            ds = f.create_dataset("x", shape=test.shape, chunks=test.shape, dtype=dtype,
                                  **spec.dataset_kwargs(dtype.itemsize))
            ds.id.write_direct_chunk((0, 0), enc(test))
            return bool(np.array_equal(ds[...], test))
    except Exception:
        return False
