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

import h5py
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


def _deflater(level: int) -> Callable[[Any], bytes]:
    """A zlib-stream compressor. ISA-L (``isal``) when installed: 10-15x faster than zlib at
    a slightly better ratio, and its streams are plain deflate that HDF5's gzip filter (and
    every HDF5 tool) reads. Levels 1-3 / 4-6 / 7-9 map to ISA-L's 1 / 2 / 3; 0 stores."""
    if level > 0:
        try:
            from isal import isal_zlib
        except ImportError:
            pass
        else:
            isal_level = 1 if level <= 3 else 2 if level <= 6 else 3
            return lambda data: isal_zlib.compress(data, isal_level)
    return lambda data: zlib.compress(data, level)


def make_encoder(spec: CodecSpec, dtype: np.dtype) -> Encoder | None:
    """A function ``chunk array -> stored chunk bytes``, or None when only HDF5 can encode."""
    lvl = spec.effective_level
    shuffle = spec.shuffle and dtype.itemsize > 1
    if spec.name == "none":
        return lambda a: a.tobytes()
    if spec.name == "gzip":
        deflate = _deflater(lvl)
        if shuffle:
            return lambda a: deflate(_shuffle(a))
        return lambda a: deflate(a)
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
    # A varied but compressible pattern; no numpy.random, whose import would cost every
    # freshly forked writer ~10 ms.
    test = ((np.arange(4000).reshape(4, 1000) * 7919 % 50).cumsum(axis=1) % 251).astype(dtype)
    try:
        with h5py.File(f"selfcheck-{id(spec)}.h5", "w", driver="core", backing_store=False) as f:
            ds = f.create_dataset("x", shape=test.shape, chunks=test.shape, dtype=dtype,
                                  **spec.dataset_kwargs(dtype.itemsize))
            ds.id.write_direct_chunk((0, 0), enc(test))
            return bool(np.array_equal(ds[...], test))
    except Exception:
        return False


# ---------------------------------------------------------------------------
# Decoding stored chunks in Python (reader fast path, writer fallback)
# ---------------------------------------------------------------------------

# HDF5 filter ids (h5py.h5z constants and the registered plugin ids).
FILTER_DEFLATE = 1
FILTER_SHUFFLE = 2
FILTER_ZSTD = 32015
FILTER_BLOSC2 = 32026

Step = Callable[[Any, int], Any]  # (bytes-like, uncompressed size) -> bytes-like


def _inflate(raw: Any, nbytes: int) -> Any:
    try:
        from isal import isal_zlib  # about twice zlib's speed
    except ImportError:
        return zlib.decompress(raw, bufsize=max(nbytes, 1))
    return isal_zlib.decompress(raw, bufsize=max(nbytes, 1))


def _unzstd(raw: Any, nbytes: int) -> Any:
    import zstandard

    # The plugin's frames may lack the content size: give the decompressor the bound.
    return zstandard.ZstdDecompressor().decompress(raw, max_output_size=max(nbytes, 1))


def _unblosc2(raw: Any, nbytes: int) -> tuple[Any, str]:
    import blosc2

    s = blosc2.schunk_from_cframe(raw, copy=False)
    if "b2nd" in s.meta.keys():
        # Written by HDF5's own Blosc2 filter: an n-d array frame whose blocks are padded,
        # so the raw chunk bytes are not in C order. Let blosc2 assemble the array.
        return np.ascontiguousarray(blosc2.ndarray_from_cframe(raw)[...]), "blosc2-b2nd"
    if s.nchunks == 1:
        return s.decompress_chunk(0), "blosc2"
    return b"".join(s.decompress_chunk(i) for i in range(s.nchunks)), "blosc2"


def _unblosc2_into(raw: Any, out: np.ndarray) -> bool:
    """Decompress a one-chunk Blosc2 super-chunk frame into ``out``; False if not that."""
    import blosc2

    s = blosc2.schunk_from_cframe(raw, copy=False)
    if s.nchunks != 1 or s.nbytes != out.nbytes or "b2nd" in s.meta.keys():
        return False
    s.decompress_chunk(0, dst=out.reshape(-1).view(np.uint8))
    return True


class ChunkDecoder:
    """Python mirror of one dataset's HDF5 filter pipeline (decode direction only).

    Use :meth:`for_dataset`, which returns ``None`` when some filter has no Python decoder.
    """

    def __init__(self, filters: list[int], itemsize: int):
        self.filters = filters
        self.itemsize = itemsize

    @classmethod
    def for_dataset(cls, ds: h5py.Dataset) -> ChunkDecoder | None:
        dcpl = ds.id.get_create_plist()
        filters = [dcpl.get_filter(i)[0] for i in range(dcpl.get_nfilters())]
        known = {FILTER_DEFLATE, FILTER_SHUFFLE, FILTER_ZSTD, FILTER_BLOSC2}
        if any(f not in known for f in filters):
            return None
        if any(f == FILTER_ZSTD for f in filters):
            try:
                import zstandard  # noqa: F401
            except ImportError:
                return None
        if any(f == FILTER_BLOSC2 for f in filters):
            try:
                import blosc2  # noqa: F401
            except ImportError:
                return None
        return cls(filters, ds.dtype.itemsize)

    def decode(self, raw: Any, filter_mask: int, out: np.ndarray) -> str:
        """Decode stored chunk bytes ``raw`` into ``out`` (a C-contiguous chunk buffer).

        Filters run in reverse pipeline order; bit ``i`` of ``filter_mask`` set means filter
        ``i`` was skipped when the chunk was written. Returns the kind of encoding met (so the
        caller can check each kind against HDF5 once). Raises ``ValueError`` when the result
        does not have the chunk's size.
        """
        nbytes = out.nbytes
        data: Any = raw
        kind = f"mask{filter_mask}"
        unshuffle = False
        active = [f for i, f in enumerate(self.filters) if not filter_mask & (1 << i)]
        if active == [FILTER_BLOSC2] and _unblosc2_into(raw, out):
            return kind + "-blosc2"  # the common case: decompressed straight into the buffer
        for pos in range(len(active) - 1, -1, -1):
            f = active[pos]
            if f == FILTER_SHUFFLE:
                if pos != 0:  # shuffle must be the first filter written (the last undone)
                    raise ValueError("shuffle filter in an unexpected pipeline position")
                unshuffle = self.itemsize > 1
            elif f == FILTER_DEFLATE:
                data = _inflate(data, nbytes)
            elif f == FILTER_ZSTD:
                data = _unzstd(data, nbytes)
            else:
                data, sub = _unblosc2(data, nbytes)
                kind += "-" + sub
        src = np.frombuffer(data, dtype=np.uint8)
        if src.size != nbytes:
            raise ValueError(f"decoded chunk has {src.size} bytes, expected {nbytes}")
        dst = out.reshape(-1).view(np.uint8)
        if unshuffle:
            # HDF5's shuffle stores byte k of every element together: undo the byte transpose.
            n = nbytes // self.itemsize
            dst.reshape(n, self.itemsize)[...] = src.reshape(self.itemsize, n).T
        else:
            dst[...] = src
        return kind
